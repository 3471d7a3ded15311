//! The block schedule, stopping loop and verdict of `bisect run --adaptive`
//! (docs/sequential.md, "bisect run --adaptive"): which arm block runs next and how many
//! sessions it holds, how a pair of finished blocks feeds the e-process of
//! [`crate::sequential`], when the run stops, and the verdict of a stopped run with
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
use thiserror::Error;

use crate::arm_stats::ArmLabel;
use crate::sequential::{
    CostModel, Decision, DesignError, DesignGoal, LookError, LookRecord, SequentialDesign,
    SequentialState,
};

/// Most sessions per arm in one factor of the e-process.
pub(crate) const GRANULARITY: u64 = 20;

/// Block lengths, in multiples of the concurrency, that the cost model chooses from.
pub(crate) const BLOCK_MULTIPLES: [u64; 3] = [1, 2, 4];

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
    pub(crate) after_pair: u64,
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
    pub(crate) fed: u64,
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
    #[error("block {block} was handed back out of order: block {due} is due")]
    OutOfOrder { block: u64, due: u64 },
}

/// Plans the block length and cap: for power alone before anything was measured, for
/// power and expected wall time once a cost model is known. Caps are rounded up to whole
/// blocks of C.
pub fn plan(
    goal: DesignGoal,
    concurrency: u64,
    cost: Option<CostModel>,
) -> Result<(u64, u64), DesignError> {
    // A plan is a pure function of its inputs and costs a simulation (0.2-0.8 s on two
    // cores): kept for the life of the process, so a schedule that re-plans to the same
    // cost ratio as an earlier one (every experiment of a simulation does) plans once.
    type Key = [u64; 9];
    static PLANS: std::sync::Mutex<Vec<(Key, (u64, u64))>> = std::sync::Mutex::new(Vec::new());
    let key: Key = [
        goal.alpha.to_bits(),
        goal.power.to_bits(),
        goal.min_effect.to_bits(),
        goal.baseline.to_bits(),
        goal.clear_alpha.to_bits(),
        goal.block_per_arm,
        concurrency,
        cost.map_or(u64::MAX, |c| c.session_s.to_bits()),
        cost.map_or(u64::MAX, |c| c.restart_s.to_bits()),
    ];
    let known =
        |plans: &Vec<(Key, (u64, u64))>| plans.iter().find(|(k, _)| *k == key).map(|(_, p)| *p);
    if let Some(p) = known(&PLANS.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(p);
    }
    let planned = plan_uncached(goal, concurrency, cost)?;
    PLANS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((key, planned));
    Ok(planned)
}

fn plan_uncached(
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
    #[cfg(test)]
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
        self.take_block(&plan, outcome)
    }

    /// The next `lanes` pairs, for replica sets that run one whole pair each at the same
    /// time (docs/sequential.md, "On replicas"): each as [`Schedule::next_block`] would
    /// give its two blocks if the pairs before it continued, at the current block length
    /// and within the cap. Empty once the run has ended, or in the middle of a pair.
    pub fn next_pairs(&self, lanes: u64) -> Vec<[BlockPlan; 2]> {
        if self.finished() || self.first.is_some() {
            return Vec::new();
        }
        let d = &self.record.design;
        let n = self.record.blocks.len() as u64;
        let mut done = self.record.sessions_per_arm().0;
        let mut pairs = Vec::new();
        for i in 0..lanes {
            let sessions = d.block_per_arm.min(d.max_per_arm.saturating_sub(done));
            if sessions == 0 {
                break;
            }
            done += sessions;
            let index = n / 2 + i;
            let (first, second) = if index % 2 == 0 {
                (ArmLabel::On, ArmLabel::Off)
            } else {
                (ArmLabel::Off, ArmLabel::On)
            };
            let block = |k: u64, label| BlockPlan {
                block: n + 2 * i + k,
                pair: index + 1,
                label,
                sessions,
            };
            pairs.push([block(0, first), block(1, second)]);
        }
        pairs
    }

    /// Takes a pair that ran from [`Schedule::next_pairs`], with its two blocks' outcomes
    /// (first, second), fed as [`Schedule::block_done`] feeds them but against the
    /// length the pair ran with (a re-plan after an earlier pair of the same round may
    /// have changed the block length since). The pairs of a round are taken in order;
    /// once one decides, the run has ended and the later ones are refused (`Finished`:
    /// their sessions are counted in the pooled arms, never in the e-process).
    pub fn pair_done(
        &mut self,
        pair: &[BlockPlan; 2],
        outcomes: [BlockOutcome; 2],
    ) -> Result<Decision, AdaptiveError> {
        if self.finished() {
            return Err(AdaptiveError::Finished);
        }
        let due = self.next_block().ok_or(AdaptiveError::Finished)?;
        if self.first.is_some() || due.block != pair[0].block || due.label != pair[0].label {
            return Err(AdaptiveError::OutOfOrder {
                block: pair[0].block,
                due: due.block,
            });
        }
        let [first, second] = outcomes;
        self.take_block(&pair[0], first)?;
        Ok(self
            .take_block(&pair[1], second)?
            .expect("the second block of a pair looks"))
    }

    /// Records the block `plan` names with its outcome; after the second block of a
    /// pair, looks and returns the decision.
    fn take_block(
        &mut self,
        plan: &BlockPlan,
        outcome: BlockOutcome,
    ) -> Result<Option<Decision>, AdaptiveError> {
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

mod verdict;

pub use verdict::{e_value_text, verdict};

#[cfg(test)]
mod tests;
