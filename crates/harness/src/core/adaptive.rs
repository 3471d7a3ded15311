//! The block schedule, stopping loop and verdict of `bisect run --adaptive`
//! (docs/sequential.md, "bisect run --adaptive"): which arm block runs next and how many
//! sessions it holds, how a pair of finished blocks feeds the e-process of
//! [`crate::core::sequential`], when the run stops, and the verdict of a stopped run with
//! every blocking check of a fixed run on top. Pure: the command layer
//! (`commands/adaptive.rs`) runs each block through the arm lifecycle and hands its
//! outcome in, so the loop is tested with scripted outcomes and no processes.
//!
//! Why it is shaped this way:
//! - Load is the experiment's condition: every block holds at least C sessions (the
//!   target concurrency) and runs them with C in flight, so no block tests a lower load.
//!   Blocks are one arm each (a restart with the flag flipped); pairs alternate on/off,
//!   off/on (ABBA), so a drift of the machine over the run hits both arms alike.
//! - Blocks run to completion: sessions in flight when the data decide are drained and
//!   counted, nothing is selected by the order in which sessions finished. The decision
//!   is only acted on between pairs of blocks.
//! - The e-process sees a pair in sub-blocks of at most [`GRANULARITY`] sessions per arm,
//!   split by session index before the block runs (not by completion), `on` sub-block j
//!   against `off` sub-block j (the same positions in their blocks, so a drift inside a
//!   block also hits both). Each sub-block is one factor of the e-process with rates
//!   estimated from the earlier sub-blocks only, so the product stays a supermartingale
//!   under the null and Ville's inequality holds at every sub-look (Turner, Ly and
//!   Grunwald 2021; see the `sequential` module). Why not whole blocks: the first
//!   factor has no earlier data, its plug-in rates are equal and it is exactly 1, so a
//!   first pair of 80 + 80 would be spent learning; in sub-blocks only the first 20 + 20
//!   are. The first sub-look that decides ends the e-process; the rest of that pair is
//!   still counted in the pooled arms (the table, and every blocking check), and must not
//!   contradict the decision: a `cleared` whose pooled arms differ significantly, or an
//!   `implicated` whose pooled difference points the other way, is `inconclusive`.
//! - The cap (sessions per arm) is the smallest that gives the goal's power with looks at
//!   block boundaries ([`SequentialDesign::plan`] at blocks of C; conservative for the
//!   finer sub-block feeding: docs/sequential.md's table gives 560 per arm at blocks of
//!   80 against 480 at 20). After each pair it is re-planned with
//!   [`SequentialDesign::plan_for_cost`] over blocks of C, 2C and 4C, from the session and
//!   restart seconds measured so far in the run, which also sets the next blocks' length.
//!   `--max-sessions` replaces the cap (blocks then stay at C). The cap never changes the
//!   error control (Ville's inequality holds at any stopping time); it only bounds cost.
//!   Reaching it undecided is `underpowered`, with the always-valid interval reached.
//! - Failed sessions (error, timeout) are left out of the e-process's counts (as the
//!   `sequential` module says); an arm with many is `degraded` by the fixed checks.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::core::arm_stats::ArmLabel;
use crate::core::confounds::{confounds, load_shortfalls};
use crate::core::format::{self, percent_digits};
use crate::core::sequential::{
    CostModel, Decision, DesignError, DesignGoal, Direction, LookError, LookRecord,
    SequentialDesign, SequentialState,
};
use crate::core::stats;
use crate::core::verdict::{
    decide, ArmObservation, Comparison, Confound, Policy, Severity, Status, Verdict,
};

/// Most sessions per arm in one factor of the e-process.
pub const GRANULARITY: u64 = 20;

/// Block lengths, in multiples of the concurrency, that the cost model chooses from.
pub const BLOCK_MULTIPLES: [u64; 3] = [1, 2, 4];

/// Relative change of the measured restart/session cost ratio that triggers a re-plan.
const REPLAN_RATIO_CHANGE: f64 = 0.25;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSpec {
    /// alpha, power, min_effect, baseline, clear_alpha (its block size is ignored: blocks
    /// follow from the concurrency).
    pub goal: DesignGoal,
    /// Sessions in flight in every block (C).
    pub concurrency: u64,
    /// `--max-sessions`: the cap per arm, instead of the planned one.
    pub max_sessions: Option<u64>,
}

/// Where the cap came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapSource {
    /// Planned for power before anything was measured (blocks of C).
    Planned,
    /// Re-planned for power and expected wall time from the measured cost model.
    PlannedForCost,
    /// `--max-sessions`.
    MaxSessions,
}

impl CapSource {
    /// In words, for summaries and progress.
    pub fn describe(self) -> &'static str {
        match self {
            CapSource::Planned => "planned for power",
            CapSource::PlannedForCost => "planned for power and the measured cost",
            CapSource::MaxSessions => "--max-sessions",
        }
    }
}

/// One (re)planning of the cap and block length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapPlan {
    /// Block pairs finished when this plan was made (0: before the first block).
    pub after_pair: u64,
    pub block_per_arm: u64,
    pub max_per_arm: u64,
    pub source: CapSource,
    /// The measured costs it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostModel>,
}

/// `adaptive.design` in run.json: the goal, the load, the current cap and block length,
/// and every plan that set them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveDesign {
    pub alpha: f64,
    pub power: f64,
    pub min_effect: f64,
    pub baseline: f64,
    pub clear_alpha: f64,
    /// Sessions in flight in every block.
    pub concurrency: u64,
    /// Most sessions per arm in one e-process factor.
    pub granularity: u64,
    /// Sessions per block (one arm) now.
    pub block_per_arm: u64,
    /// The cap: sessions per arm after which an undecided run is `underpowered`.
    pub max_per_arm: u64,
    pub cap_source: CapSource,
    /// The latest measured cost model, once a pair has run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostModel>,
    pub plans: Vec<CapPlan>,
}

/// One executed block, as the schedule saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRecord {
    /// 0-based, in execution order (also the index into run.json's `runs`).
    pub block: u64,
    /// 1-based pair this block belongs to.
    pub pair: u64,
    pub label: ArmLabel,
    /// Sessions run (all drained and counted).
    pub sessions: u64,
    /// Sessions that ended with a class other than error/timeout.
    pub classified: u64,
    pub corrupted: u64,
    /// Sessions that reached the e-process (the rest of a pair after a decision does not).
    pub fed: u64,
    /// Restart (stop, spawn, health wait) and drive seconds: the cost model's inputs.
    pub restart_s: f64,
    pub drive_s: f64,
}

/// One sub-look: the pair it belongs to and the sequential record.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveLook {
    /// 1-based block pair.
    pub pair: u64,
    /// 1-based sub-block of that pair.
    pub sub_block: u64,
    #[serde(flatten)]
    pub record: LookRecord,
}

/// The blocking checks found after one pair, over the blocks pooled so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairCheck {
    pub pair: u64,
    /// Notes of the blocking confounds of this pair's two blocks alone.
    pub pair_blocking: Vec<String>,
    /// Notes of the blocking confounds of all blocks pooled so far.
    pub pooled_blocking: Vec<String>,
    /// Blocks of this pair whose engine load fell short of the target (cleared needs it).
    pub load_shortfall: Vec<String>,
}

/// `adaptive` in run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveRecord {
    pub design: AdaptiveDesign,
    pub blocks: Vec<BlockRecord>,
    pub looks: Vec<AdaptiveLook>,
    #[serde(default)]
    pub checks: Vec<PairCheck>,
    /// The sequential decision, once final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Why the run stopped without a sequential decision (a blocking check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl AdaptiveRecord {
    /// Sessions run per arm (on, off).
    pub fn sessions_per_arm(&self) -> (u64, u64) {
        let sum = |label| {
            self.blocks
                .iter()
                .filter(|b| b.label == label)
                .map(|b| b.sessions)
                .sum()
        };
        (sum(ArmLabel::On), sum(ArmLabel::Off))
    }

    /// Block pairs finished.
    pub fn pairs(&self) -> u64 {
        self.blocks.len() as u64 / 2
    }
}

/// The next block to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockPlan {
    pub block: u64,
    pub pair: u64,
    pub label: ArmLabel,
    pub sessions: u64,
}

/// What a finished block hands back: per session index, `Some(corrupted)` for a
/// classified session, `None` for a failed one (error, timeout, never finished).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockOutcome {
    pub sessions: Vec<Option<bool>>,
    pub restart_s: f64,
    pub drive_s: f64,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum AdaptiveError {
    #[error("sequential design: {0}")]
    Design(#[from] DesignError),
    #[error("sequential look: {0}")]
    Look(#[from] LookError),
    #[error("the concurrency must be at least 1")]
    NoLoad,
    #[error("--max-sessions {given} is below the concurrency {concurrency}: not one block at the target load fits")]
    CapBelowLoad { given: u64, concurrency: u64 },
    #[error("block {block} was planned with {planned} sessions but {got} outcomes came back")]
    Outcomes { block: u64, planned: u64, got: u64 },
    #[error("the run already stopped; no block is due")]
    Finished,
}

/// Plans the block length and cap: for power alone before anything was measured, for
/// power and expected wall time once a cost model is known. Caps are rounded up to whole
/// blocks of C.
pub fn plan(
    goal: DesignGoal,
    concurrency: u64,
    cost: Option<CostModel>,
) -> Result<(u64, u64), DesignError> {
    let c = concurrency.max(1);
    let design = match cost {
        None => SequentialDesign::plan(DesignGoal {
            block_per_arm: c,
            ..goal
        })?,
        Some(cost) => {
            let candidates: Vec<u64> = BLOCK_MULTIPLES.iter().map(|m| m * c).collect();
            SequentialDesign::plan_for_cost(goal, cost, &candidates)?
        }
    };
    Ok((design.block_per_arm, design.max_per_arm.div_ceil(c) * c))
}

/// The state of one adaptive run: feed it every block's outcome in order.
#[derive(Debug, Clone)]
pub struct Schedule {
    spec: AdaptiveSpec,
    state: SequentialState,
    record: AdaptiveRecord,
    /// Outcomes of the first block of the pair in progress.
    first: Option<Vec<Option<bool>>>,
}

impl Schedule {
    /// Plans the run (a simulation of the stopping rule, unless `max_sessions` is given).
    pub fn new(spec: AdaptiveSpec) -> Result<Self, AdaptiveError> {
        Self::with_plan(spec, None)
    }

    /// As [`Schedule::new`], with the `(block, cap)` that [`plan`] gives for this goal and
    /// concurrency when the caller already has it (a design is a pure function of its
    /// goal, so a cache of earlier plans is exact); `None` plans here.
    pub fn with_plan(
        spec: AdaptiveSpec,
        planned: Option<(u64, u64)>,
    ) -> Result<Self, AdaptiveError> {
        let c = spec.concurrency;
        if c == 0 {
            return Err(AdaptiveError::NoLoad);
        }
        let (block, cap, source) = match spec.max_sessions {
            Some(given) if given < c => {
                return Err(AdaptiveError::CapBelowLoad {
                    given,
                    concurrency: c,
                })
            }
            Some(given) => (c, given.div_ceil(c) * c, CapSource::MaxSessions),
            None => {
                let (block, cap) = match planned {
                    Some(known) => known,
                    None => plan(spec.goal, c, None)?,
                };
                (block, cap, CapSource::Planned)
            }
        };
        // The schedule owns the cap (it counts sessions run, failed ones included), so the
        // state gets one that never binds; its block size only sizes its own cap.
        let unbounded = SequentialDesign::with_cap(
            DesignGoal {
                block_per_arm: 1,
                ..spec.goal
            },
            u64::MAX,
        )?;
        let g = spec.goal;
        let design = AdaptiveDesign {
            alpha: g.alpha,
            power: g.power,
            min_effect: g.min_effect,
            baseline: g.baseline,
            clear_alpha: g.clear_alpha,
            concurrency: c,
            granularity: GRANULARITY,
            block_per_arm: block,
            max_per_arm: cap,
            cap_source: source,
            cost_model: None,
            plans: vec![CapPlan {
                after_pair: 0,
                block_per_arm: block,
                max_per_arm: cap,
                source,
                cost_model: None,
            }],
        };
        Ok(Schedule {
            spec,
            state: SequentialState::new(unbounded),
            record: AdaptiveRecord {
                design,
                blocks: Vec::new(),
                looks: Vec::new(),
                checks: Vec::new(),
                decision: None,
                stopped: None,
            },
            first: None,
        })
    }

    pub fn record(&self) -> &AdaptiveRecord {
        &self.record
    }

    /// Whether the run has ended (decided, capped, or stopped by a check).
    pub fn finished(&self) -> bool {
        self.record.decision.is_some() || self.record.stopped.is_some()
    }

    /// The block to run next, or `None` once the run has ended.
    pub fn next_block(&self) -> Option<BlockPlan> {
        if self.finished() {
            return None;
        }
        let n = self.record.blocks.len() as u64;
        let pair = n / 2;
        let leads = if pair % 2 == 0 {
            ArmLabel::On
        } else {
            ArmLabel::Off
        };
        let (label, sessions) = if n % 2 == 0 {
            let done = self.record.sessions_per_arm().0;
            let d = &self.record.design;
            (
                leads,
                d.block_per_arm.min(d.max_per_arm.saturating_sub(done)),
            )
        } else {
            let other = if leads == ArmLabel::On {
                ArmLabel::Off
            } else {
                ArmLabel::On
            };
            (other, self.record.blocks[n as usize - 1].sessions)
        };
        Some(BlockPlan {
            block: n,
            pair: pair + 1,
            label,
            sessions,
        })
    }

    /// Takes the outcome of the block [`Schedule::next_block`] named. After the second
    /// block of a pair, looks and returns the decision (`Continue` or final); after the
    /// first, returns `None`.
    pub fn block_done(&mut self, outcome: BlockOutcome) -> Result<Option<Decision>, AdaptiveError> {
        let plan = self.next_block().ok_or(AdaptiveError::Finished)?;
        if outcome.sessions.len() as u64 != plan.sessions {
            return Err(AdaptiveError::Outcomes {
                block: plan.block,
                planned: plan.sessions,
                got: outcome.sessions.len() as u64,
            });
        }
        let classified = outcome.sessions.iter().flatten().count() as u64;
        let corrupted = outcome.sessions.iter().flatten().filter(|c| **c).count() as u64;
        self.record.blocks.push(BlockRecord {
            block: plan.block,
            pair: plan.pair,
            label: plan.label,
            sessions: plan.sessions,
            classified,
            corrupted,
            fed: 0,
            restart_s: outcome.restart_s,
            drive_s: outcome.drive_s,
        });
        let Some(first) = self.first.take() else {
            self.first = Some(outcome.sessions);
            return Ok(None);
        };
        let (on, off) = if plan.label == ArmLabel::Off {
            (first, outcome.sessions)
        } else {
            (outcome.sessions, first)
        };
        let decision = self.look_pair(plan.pair, &on, &off)?;
        Ok(Some(decision))
    }

    /// Ends the run without a sequential decision (a blocking check failed).
    pub fn stop(&mut self, reason: String) {
        if !self.finished() {
            self.record.stopped = Some(reason);
        }
    }

    /// Records the blocking checks found after a pair.
    pub fn add_check(&mut self, check: PairCheck) {
        self.record.checks.push(check);
    }

    fn look_pair(
        &mut self,
        pair: u64,
        on: &[Option<bool>],
        off: &[Option<bool>],
    ) -> Result<Decision, AdaptiveError> {
        let n = on.len() as u64;
        let subs = n.div_ceil(GRANULARITY).max(1);
        let bounds = |j: u64| (j * n / subs) as usize;
        let tally = |part: &[Option<bool>]| {
            (
                part.iter().flatten().filter(|c| **c).count() as u64,
                part.iter().flatten().count() as u64,
            )
        };
        let mut decision = Decision::Continue;
        let mut fed = 0usize;
        for j in 0..subs {
            let (a, b) = (bounds(j), bounds(j + 1));
            decision = self.state.look(tally(&on[a..b]), tally(&off[a..b]))?;
            fed = b;
            let last = *self.state.looks().last().expect("a look was just made");
            self.record.looks.push(AdaptiveLook {
                pair,
                sub_block: j + 1,
                record: last,
            });
            if decision.is_final() {
                break;
            }
        }
        let k = self.record.blocks.len();
        for block in &mut self.record.blocks[k - 2..] {
            block.fed = fed as u64;
        }
        let done = self.record.sessions_per_arm().0;
        if !decision.is_final() && done >= self.record.design.max_per_arm {
            let look = self.record.looks.last_mut().expect("looked");
            decision = Decision::Underpowered {
                interval: look.record.diff_interval,
            };
            look.record.decision = decision;
        }
        if decision.is_final() {
            self.record.decision = Some(decision);
        } else {
            self.replan(pair, done)?;
        }
        Ok(decision)
    }

    /// The cost model from the blocks so far, and the cap and block length it implies.
    fn replan(&mut self, pair: u64, done: u64) -> Result<(), AdaptiveError> {
        let blocks = &self.record.blocks;
        let sessions: u64 = blocks.iter().map(|b| b.sessions).sum();
        let cost = CostModel {
            session_s: blocks.iter().map(|b| b.drive_s).sum::<f64>() / sessions.max(1) as f64,
            restart_s: blocks.iter().map(|b| b.restart_s).sum::<f64>() / blocks.len() as f64,
        };
        let d = &mut self.record.design;
        d.cost_model = Some(cost);
        if self.spec.max_sessions.is_some() {
            return Ok(());
        }
        // The choice depends on the cost model only through restart_s / session_s;
        // re-plan (a simulation) only when that ratio moved by more than a quarter.
        let ratio = |c: &CostModel| c.restart_s / c.session_s.max(1e-9);
        let last = d.plans.iter().rev().find_map(|p| p.cost_model);
        if let Some(last) = last {
            if (ratio(&cost) / ratio(&last).max(1e-12) - 1.0).abs() <= REPLAN_RATIO_CHANGE {
                return Ok(());
            }
        }
        let (block, cap) = plan(self.spec.goal, d.concurrency, Some(cost))?;
        // Never below what already ran plus one block: a re-plan does not end a run.
        let cap = cap.max(done + d.concurrency);
        d.block_per_arm = block;
        d.max_per_arm = cap;
        d.cap_source = CapSource::PlannedForCost;
        d.plans.push(CapPlan {
            after_pair: pair,
            block_per_arm: block,
            max_per_arm: cap,
            source: CapSource::PlannedForCost,
            cost_model: Some(cost),
        });
        Ok(())
    }
}

/// `1.2e4` for large e-values, `3.4` for small ones.
pub fn e_value_text(e: f64) -> String {
    if !e.is_finite() {
        return format::quantity(e);
    }
    if e >= 1000.0 {
        format!("{e:.1e}")
    } else if e >= 10.0 {
        format!("{e:.0}")
    } else {
        format!("{e:.2}")
    }
}

/// The always-valid interval in points: `-2.1 to +9.8`.
fn interval_text([lo, hi]: [f64; 2]) -> String {
    format!("{} to {}", percent_digits(lo), percent_digits(hi))
}

/// `14/160 (8.8%, 95% CI 5.3-14.2%)` of a pooled arm.
fn rate_text(arm: &ArmObservation, words: bool) -> String {
    let (k, n) = (arm.stats.counts.corrupted(), arm.stats.judged());
    let (lo, hi) = stats::wilson(k, n, 0.95);
    format!(
        "{k}/{n} ({}%, {}{}-{}%)",
        percent_digits(stats::rate(k, n)),
        if words { "95% CI " } else { "" },
        percent_digits(lo),
        percent_digits(hi)
    )
}

fn arm_name(arm: &ArmObservation) -> String {
    format!("{} (={})", arm.label, arm.value)
}

/// The verdict of an adaptive run: the sequential decision, voided by any blocking check
/// of a fixed run (read-back, effective config, degraded arm, workload) over the pooled
/// blocks and over each block (`blocks`, as [`decide`] takes them), by any block pair
/// whose own check failed (`record.checks`), and `cleared` also by a block whose engine
/// load fell short of the target. The pooled Fisher p and Newcombe interval are kept in
/// `comparison` for reference only: they do not hold under optional stopping, and the
/// verdict never rests on them.
pub fn verdict(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
    flag: &str,
    record: &AdaptiveRecord,
) -> (Comparison, Vec<Confound>, Verdict) {
    let (comparison, _, _) = decide(on, off, blocks, policy, flag);
    let mut found = confounds(on, off, blocks, policy);
    let failed_pairs = record.checks.iter().filter(|c| !c.pair_blocking.is_empty());
    found.splice(
        0..0,
        failed_pairs.map(|c| Confound {
            name: format!("block_pair.{}", c.pair),
            on: Value::Null,
            off: Value::Null,
            severity: Severity::Blocking,
            note: format!(
                "block pair {} on its own failed a blocking check: {}",
                c.pair,
                c.pair_blocking.join("; ")
            ),
        }),
    );
    let blocking: Vec<&Confound> = found
        .iter()
        .filter(|c| c.severity == Severity::Blocking)
        .collect();
    let warnings: Vec<&Confound> = found
        .iter()
        .filter(|c| c.severity == Severity::Warning)
        .collect();
    let (on_run, off_run) = record.sessions_per_arm();
    let last = record.looks.last();
    let path = match last {
        Some(l) => format!(
            "after {on_run} + {off_run} sessions in {} block pair(s) at {} in flight ({} looks): \
             e-value {} (implicates at {}), always-valid {:.0}% interval for the difference {} points",
            record.pairs(),
            record.design.concurrency,
            record.looks.len(),
            e_value_text(l.record.e_value),
            e_value_text(l.record.threshold),
            100.0 * (1.0 - record.design.clear_alpha),
            interval_text(l.record.diff_interval)
        ),
        None => "before any look".to_string(),
    };
    // Every block's own load (the pooled peak is the best block's); without the blocks,
    // the pairs' recorded shortfalls and the pooled arms'.
    let mut shortfalls = load_shortfalls(on, off, blocks, policy);
    if blocks.is_empty() {
        shortfalls.extend(
            record
                .checks
                .iter()
                .flat_map(|c| c.load_shortfall.iter().cloned()),
        );
    }
    let m = record.design.min_effect;
    let mut reasons: Vec<String> = blocking.iter().map(|c| c.note.clone()).collect();
    // Sessions drained after a mid-pair decision were not fed to the e-process; they
    // must not contradict it (the pooled arms hold every session run).
    let overrun: u64 = record.blocks.iter().map(|b| b.sessions - b.fed).sum();
    let contradiction = match record.decision {
        _ if overrun == 0 => None,
        Some(Decision::Implicated { direction }) => {
            let pooled_on_higher = comparison.rate_diff > 0.0;
            (pooled_on_higher != (direction == Direction::On)).then(|| {
                format!(
                    "the pooled arms, with the {overrun} sessions drained after the decision, \
                     point the other way (difference {} points)",
                    percent_digits(comparison.rate_diff)
                )
            })
        }
        Some(Decision::Cleared) if comparison.p_value < policy.alpha => Some(format!(
            "the pooled arms, with the {overrun} sessions drained after the decision, differ \
             significantly (Fisher p = {} < alpha {})",
            format::p_value(comparison.p_value),
            policy.alpha
        )),
        _ => None,
    };
    let status = match (&record.decision, blocking.is_empty()) {
        (Some(d @ (Decision::Implicated { .. } | Decision::Cleared)), true)
            if contradiction.is_some() =>
        {
            reasons.push(format!(
                "the sequential test {path} says {}, but {}",
                if matches!(d, Decision::Cleared) {
                    "cleared"
                } else {
                    "implicated"
                },
                contradiction.as_deref().unwrap_or_default()
            ));
            Status::Inconclusive
        }
        (_, false) => {
            reasons.push(format!(
                "the sequential test {path}, but the blocking checks above void the comparison"
            ));
            Status::Inconclusive
        }
        (Some(Decision::Implicated { direction }), true) => {
            let arm = if *direction == Direction::On { on } else { off };
            reasons.push(format!(
                "sequential test {path}: the e-value reached 1/alpha = {}, {} corrupts more \
                 (error rate <= alpha {} under this optional stopping)",
                e_value_text(1.0 / record.design.alpha),
                arm_name(arm),
                record.design.alpha
            ));
            Status::Implicated
        }
        (Some(Decision::Cleared), true) if shortfalls.is_empty() => {
            reasons.push(format!(
                "sequential test {path}: the interval lies inside +-{} points",
                percent_digits(m)
            ));
            Status::Cleared
        }
        (Some(Decision::Cleared), true) => {
            reasons.push(format!(
                "sequential test {path}: the interval lies inside +-{} points, but {}: a bug \
                 that needs load is not ruled out at a lower one",
                percent_digits(m),
                shortfalls.join("; ")
            ));
            Status::Inconclusive
        }
        (Some(Decision::Underpowered { interval }), true) => {
            reasons.push(format!(
                "underpowered: the cap of {} sessions per arm was reached undecided, {path}; \
                 the interval {} must lie inside +-{} points to clear, or the e-value reach {} \
                 to implicate (raise --max-sessions, or --min-effect)",
                record.design.max_per_arm,
                interval_text(*interval),
                percent_digits(m),
                e_value_text(1.0 / record.design.alpha)
            ));
            Status::Inconclusive
        }
        (Some(Decision::Continue) | None, true) => {
            reasons.push(format!(
                "stopped before the sequential test decided ({}), {path}",
                record.stopped.as_deref().unwrap_or("the run ended early")
            ));
            Status::Inconclusive
        }
    };
    reasons.push(format!(
        "for reference only (not valid under optional stopping): pooled Fisher p = {}, \
         Newcombe 95% interval {} points",
        format::p_value(comparison.p_value),
        interval_text(comparison.diff_ci95)
    ));
    reasons.extend(warnings.iter().map(|c| format!("warning: {}", c.note)));

    let (corrupting, clean) = match record.decision {
        Some(Decision::Implicated {
            direction: Direction::Off,
        }) => (off, on),
        _ => (on, off),
    };
    let direction = (status == Status::Implicated).then(|| {
        format!(
            "{} corrupts: {}/{} vs {}/{}",
            arm_name(corrupting),
            corrupting.stats.counts.corrupted(),
            corrupting.stats.sessions(),
            clean.stats.counts.corrupted(),
            clean.stats.sessions()
        )
    });
    let subject = if flag.is_empty() {
        String::new()
    } else {
        format!("{flag} ")
    };
    let e_text = last.map_or("1".to_string(), |l| e_value_text(l.record.e_value));
    let mut summary = match status {
        Status::Implicated => format!(
            "implicated: {subject}{} corrupts {} vs {} {}, sequential e-value {e_text} >= {} \
             after {on_run} + {off_run} sessions",
            arm_name(corrupting),
            rate_text(corrupting, true),
            arm_name(clean),
            rate_text(clean, false),
            e_value_text(1.0 / record.design.alpha)
        ),
        Status::Cleared => format!(
            "cleared: {subject}{} {} vs {} {}, always-valid interval {} points inside +-{}, \
             after {on_run} + {off_run} sessions at {} sessions in flight",
            arm_name(on),
            rate_text(on, true),
            arm_name(off),
            rate_text(off, false),
            interval_text(last.map_or([-1.0, 1.0], |l| l.record.diff_interval)),
            percent_digits(m),
            record.design.concurrency
        ),
        Status::Inconclusive => {
            let shown: Vec<&str> = reasons
                .iter()
                .filter(|r| !r.starts_with("warning: ") && !r.starts_with("for reference"))
                .map(String::as_str)
                .collect();
            format!(
                "inconclusive: {subject}{} {} vs {} {}: {}",
                arm_name(on),
                rate_text(on, true),
                arm_name(off),
                rate_text(off, false),
                shown.join("; ")
            )
        }
    };
    if !warnings.is_empty() {
        let names: Vec<&str> = warnings.iter().map(|c| c.name.as_str()).collect();
        summary.push_str(&format!(" (warnings: {})", names.join(", ")));
    }
    (
        comparison,
        found,
        Verdict {
            status,
            direction,
            reasons,
            summary,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::core::arm_stats::ArmStats;
    use crate::core::session::SessionClass;

    fn spec(concurrency: u64, max_sessions: Option<u64>) -> AdaptiveSpec {
        AdaptiveSpec {
            goal: DesignGoal::default(),
            concurrency,
            max_sessions,
        }
    }

    /// `corrupted` of `n` sessions corrupt: the first ones by index.
    fn block(n: u64, corrupted: u64) -> BlockOutcome {
        BlockOutcome {
            sessions: (0..n).map(|i| Some(i < corrupted)).collect(),
            restart_s: 1.0,
            drive_s: 0.05 * n as f64,
        }
    }

    /// Runs the schedule with a per-arm scripted outcome until it ends.
    fn run(schedule: &mut Schedule, outcome: impl Fn(ArmLabel, u64) -> BlockOutcome) {
        while let Some(next) = schedule.next_block() {
            schedule
                .block_done(outcome(next.label, next.sessions))
                .unwrap();
        }
    }

    #[test]
    fn blocks_alternate_abba_at_the_load_and_the_cap_ends_underpowered() {
        let mut s = Schedule::new(spec(10, Some(25))).unwrap();
        // The cap is rounded up to whole blocks of the concurrency.
        assert_eq!(s.record().design.max_per_arm, 30);
        assert_eq!(s.record().design.cap_source, CapSource::MaxSessions);
        // Equal rates: never implicated, never inside +-5 points within 30 per arm.
        run(&mut s, |_, n| block(n, n / 5));
        let r = s.record();
        let order: Vec<(&str, u64)> = r
            .blocks
            .iter()
            .map(|b| (b.label.as_str(), b.sessions))
            .collect();
        assert_eq!(
            order,
            [
                ("on", 10),
                ("off", 10),
                ("off", 10),
                ("on", 10),
                ("on", 10),
                ("off", 10)
            ]
        );
        assert_eq!(r.sessions_per_arm(), (30, 30));
        let Some(Decision::Underpowered { interval }) = r.decision else {
            panic!("{:?}", r.decision);
        };
        let last = r.looks.last().unwrap();
        assert_eq!(last.record.decision, r.decision.unwrap());
        assert_eq!(last.record.diff_interval, interval);
        assert!(interval[0] < -0.05 && interval[1] > 0.05, "{interval:?}");
        // Blocks of 10 are one sub-block each: one look per pair.
        assert_eq!(r.looks.len(), 3);
        assert_eq!((last.pair, last.sub_block), (3, 1));
        assert!(s.next_block().is_none());
        assert_eq!(s.block_done(block(10, 0)), Err(AdaptiveError::Finished));
    }

    #[test]
    fn a_strong_effect_is_implicated_at_the_second_pair_of_whole_blocks() {
        // Blocks of 20 = one e-process factor per pair. The first factor is exactly 1 (no
        // earlier data); the second, 8/20 vs 0/20 with plug-ins from the first pair
        // (0.40 and 0.0088, Beta(0.18, 0.18) posterior means), is
        // exp(8 ln(.4019/.2054) + 12 ln(.5981/.7946) + 20 ln(.9912/.7946)) = 590 >= 100.
        let mut s = Schedule::new(spec(20, Some(400))).unwrap();
        run(&mut s, |label, n| {
            block(n, if label == ArmLabel::On { 8 } else { 0 })
        });
        let r = s.record();
        assert_eq!(
            r.decision,
            Some(Decision::Implicated {
                direction: Direction::On
            })
        );
        assert_eq!(r.looks.len(), 2);
        assert_eq!(r.looks[0].record.e_value, 1.0);
        let e = r.looks[1].record.e_value;
        assert!((e / 590.0 - 1.0).abs() < 0.01, "e-value {e}");
        assert_eq!(r.sessions_per_arm(), (40, 40));
        assert!(r.blocks.iter().all(|b| b.fed == 20));
    }

    #[test]
    fn large_blocks_feed_the_e_process_in_index_sub_blocks_and_drain_the_rest() {
        // Blocks of 80: four factors of 20 per pair, so the first pair can decide. The
        // sessions after the deciding sub-look still ran and count in the pooled arms, but
        // not in the e-process.
        let mut s = Schedule::new(spec(80, Some(800))).unwrap();
        run(&mut s, |label, n| BlockOutcome {
            // on: every second session corrupt; off: none.
            sessions: (0..n)
                .map(|i| Some(label == ArmLabel::On && i % 2 == 0))
                .collect(),
            restart_s: 1.0,
            drive_s: 4.0,
        });
        let r = s.record();
        assert!(matches!(r.decision, Some(Decision::Implicated { .. })));
        assert_eq!(r.blocks.len(), 2, "decided within the first pair");
        let last = r.looks.last().unwrap();
        assert_eq!(last.pair, 1);
        assert!(last.sub_block < 4, "decided before the last sub-block");
        assert_eq!(r.blocks[0].fed, 20 * last.sub_block);
        assert_eq!(r.blocks[0].sessions, 80);
        assert_eq!(r.blocks[0].corrupted, 40);
        assert_eq!(last.record.on.sessions, 20 * last.sub_block);
    }

    #[test]
    fn clean_arms_clear_after_140_sessions_per_arm() {
        // docs/sequential.md: A/A at 0% clears after 140 sessions per arm (looks of 20):
        // the Jeffreys-mixture upper bound at 0/140 with 2.5% per arm is below 5 points.
        let mut s = Schedule::new(spec(20, Some(1000))).unwrap();
        run(&mut s, |_, n| block(n, 0));
        let r = s.record();
        assert_eq!(r.decision, Some(Decision::Cleared));
        assert_eq!(r.sessions_per_arm(), (140, 140));
        let [lo, hi] = r.looks.last().unwrap().record.diff_interval;
        assert!(lo > -0.05 && hi < 0.05);
        let before = r.looks[r.looks.len() - 2].record.diff_interval;
        assert!(
            before[1] >= 0.05,
            "not cleared one look earlier: {before:?}"
        );
    }

    #[test]
    fn failed_sessions_are_left_out_of_the_counts() {
        let mut s = Schedule::new(spec(4, Some(8))).unwrap();
        let outcome = BlockOutcome {
            sessions: vec![Some(true), None, Some(false), None],
            restart_s: 0.5,
            drive_s: 1.0,
        };
        assert_eq!(s.block_done(outcome.clone()), Ok(None));
        assert!(s.block_done(outcome).unwrap().is_some());
        let b = &s.record().blocks[0];
        assert_eq!((b.sessions, b.classified, b.corrupted), (4, 2, 1));
        let look = s.record().looks[0].record;
        assert_eq!((look.on.corrupted, look.on.sessions), (1, 2));
        // A block that comes back with the wrong number of sessions is refused.
        assert_eq!(
            s.block_done(block(3, 0)),
            Err(AdaptiveError::Outcomes {
                block: 2,
                planned: 4,
                got: 3
            })
        );
    }

    #[test]
    fn a_stop_ends_the_run_and_a_cap_below_the_load_is_refused() {
        let mut s = Schedule::new(spec(4, Some(40))).unwrap();
        s.block_done(block(4, 0)).unwrap();
        s.block_done(block(4, 0)).unwrap();
        s.stop("readback failed".into());
        assert!(s.finished() && s.next_block().is_none());
        assert_eq!(s.record().stopped.as_deref(), Some("readback failed"));
        assert_eq!(
            Schedule::new(spec(10, Some(5))).unwrap_err(),
            AdaptiveError::CapBelowLoad {
                given: 5,
                concurrency: 10
            }
        );
        assert_eq!(
            Schedule::new(spec(0, None)).unwrap_err(),
            AdaptiveError::NoLoad
        );
    }

    #[test]
    fn the_cap_is_planned_for_power_then_for_the_measured_cost() {
        // docs/sequential.md "Block size": blocks of 80 per arm need a cap of 560.
        let mut s = Schedule::new(spec(80, None)).unwrap();
        let d = &s.record().design;
        assert_eq!((d.block_per_arm, d.max_per_arm), (80, 560));
        assert_eq!(d.cap_source, CapSource::Planned);
        // Restarts that cost as much as 400 sessions (a large model): longer blocks.
        let slow_restart = |n: u64| BlockOutcome {
            sessions: vec![Some(false); n as usize],
            restart_s: 600.0,
            drive_s: 1.5 * n as f64,
        };
        s.block_done(slow_restart(80)).unwrap();
        assert_eq!(s.block_done(slow_restart(80)), Ok(Some(Decision::Continue)));
        let d = &s.record().design;
        assert_eq!(d.cap_source, CapSource::PlannedForCost);
        assert_eq!(d.plans.len(), 2);
        assert!(d.block_per_arm > 80, "{d:?}");
        assert_eq!(d.max_per_arm % 80, 0);
        let cost = d.cost_model.unwrap();
        assert_eq!((cost.session_s, cost.restart_s), (1.5, 600.0));
        assert_eq!(s.next_block().unwrap().sessions, d.block_per_arm);
    }

    fn arm_stats(corrupted: u64, n: u64, peak: u64) -> ArmStats {
        let mut stats = ArmStats::default();
        for i in 0..n {
            stats.counts.add(if i < corrupted {
                SessionClass::Leak
            } else {
                SessionClass::Done
            });
        }
        stats.peak_running = BTreeMap::from([("decode".to_string(), peak)]);
        stats.wall_s = 1.0;
        stats.finish();
        stats
    }

    #[test]
    fn the_verdict_follows_the_sequential_decision_and_every_blocking_check() {
        let mut s = Schedule::new(spec(20, Some(400))).unwrap();
        run(&mut s, |label, n| {
            block(n, if label == ArmLabel::On { 8 } else { 0 })
        });
        let workload = json!({"sessions": 20, "concurrency": 20});
        let (on_stats, off_stats) = (arm_stats(16, 40, 20), arm_stats(0, 40, 20));
        let good_on = BTreeMap::from([("decode".to_string(), "1".to_string())]);
        let good_off = BTreeMap::from([("decode".to_string(), "0".to_string())]);
        let observe = |label, value, stats, readback| ArmObservation {
            label,
            value,
            block: None,
            stats,
            readback,
            effective: Box::leak(Box::default()),
            workload: &workload,
        };
        let on = observe(ArmLabel::On, "1", &on_stats, &good_on);
        let off = observe(ArmLabel::Off, "0", &off_stats, &good_off);
        let policy = Policy::default();
        let (_, _, v) = verdict(&on, &off, &[], &policy, "F", s.record());
        assert_eq!(v.status, Status::Implicated, "{v:?}");
        assert!(v
            .summary
            .starts_with("implicated: F on (=1) corrupts 16/40"));
        assert!(
            v.summary.contains(" >= 100 after 40 + 40 sessions"),
            "{v:?}"
        );
        assert!(v.summary.contains("sequential e-value 5"), "{v:?}");
        assert!(v
            .reasons
            .iter()
            .any(|r| r.starts_with("for reference only")));

        // The same data with decode reading back the wrong value: blocked.
        let bad_off = BTreeMap::from([("decode".to_string(), "1".to_string())]);
        let off = observe(ArmLabel::Off, "0", &off_stats, &bad_off);
        let (_, _, v) = verdict(&on, &off, &[], &policy, "F", s.record());
        assert_eq!(v.status, Status::Inconclusive, "{v:?}");
        assert!(v.reasons[0].contains("read back"), "{v:?}");

        // Cleared, but an engine that never saw the load: inconclusive, with the load.
        let mut c = Schedule::new(spec(20, Some(1000))).unwrap();
        run(&mut c, |_, n| block(n, 0));
        let (low_on, low_off) = (arm_stats(0, 140, 5), arm_stats(0, 140, 5));
        let on = observe(ArmLabel::On, "1", &low_on, &good_on);
        let off = observe(ArmLabel::Off, "0", &low_off, &good_off);
        let (_, _, v) = verdict(&on, &off, &[], &policy, "F", c.record());
        assert_eq!(v.status, Status::Inconclusive, "{v:?}");
        assert!(v.summary.contains("a bug that needs load"), "{v:?}");
        let (full_on, full_off) = (arm_stats(0, 140, 20), arm_stats(0, 140, 20));
        let on = observe(ArmLabel::On, "1", &full_on, &good_on);
        let off = observe(ArmLabel::Off, "0", &full_off, &good_off);
        let (_, _, v) = verdict(&on, &off, &[], &policy, "F", c.record());
        assert_eq!(v.status, Status::Cleared, "{v:?}");
        assert!(v.summary.contains("at 20 sessions in flight"), "{v:?}");

        // The same, but one block pair failed a blocking check on its own (hidden in
        // the pooled arms): the check blocks the verdict, it is not only recorded.
        let mut failed_pair = c.clone();
        failed_pair.add_check(PairCheck {
            pair: 2,
            pair_blocking: vec![
                "degraded: not a same-speed toggle: arm on (=1) had 0 error \
                                 and 4 timeout sessions of 20 (20.0% > 10.0%)"
                    .into(),
            ],
            pooled_blocking: Vec::new(),
            load_shortfall: Vec::new(),
        });
        let (_, confounds, v) = verdict(&on, &off, &[], &policy, "F", failed_pair.record());
        assert_eq!(v.status, Status::Inconclusive, "{v:?}");
        assert_eq!(confounds[0].name, "block_pair.2");
        assert_eq!(confounds[0].severity, Severity::Blocking);
        assert!(
            v.reasons[0].starts_with("block pair 2 on its own failed a blocking check: degraded"),
            "{v:?}"
        );

        // Cleared by the e-process, but the pooled arms (with the sessions drained after
        // the decision) differ significantly: not cleared.
        // Blocks of 80: cleared at 140 per arm, in the second pair's third sub-block, so
        // 20 sessions per arm ran after the decision.
        let mut big = Schedule::new(spec(80, Some(800))).unwrap();
        run(&mut big, |_, n| block(n, 0));
        assert_eq!(big.record().decision, Some(Decision::Cleared));
        assert_eq!(big.record().sessions_per_arm(), (160, 160));
        assert_eq!(big.record().blocks[3].fed, 60);
        let (hot_on, cold_off) = (arm_stats(20, 160, 80), arm_stats(0, 160, 80));
        let on = observe(ArmLabel::On, "1", &hot_on, &good_on);
        let off = observe(ArmLabel::Off, "0", &cold_off, &good_off);
        let (_, _, v) = verdict(&on, &off, &[], &policy, "F", big.record());
        assert_eq!(v.status, Status::Inconclusive, "{v:?}");
        assert!(
            v.summary.contains("says cleared, but the pooled arms"),
            "{v:?}"
        );

        // The cap: underpowered, with the interval reached.
        let mut u = Schedule::new(spec(10, Some(20))).unwrap();
        run(&mut u, |_, n| block(n, n / 5));
        let (_, _, v) = verdict(&on, &off, &[], &policy, "F", u.record());
        assert_eq!(v.status, Status::Inconclusive);
        assert!(
            v.summary
                .contains("underpowered: the cap of 20 sessions per arm"),
            "{v:?}"
        );
    }
}
