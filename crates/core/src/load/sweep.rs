//! The order of a load sweep's blocks and when it stops. Fixed allocation runs every
//! level (each arm of it) once, lowest load first. Adaptive allocation runs steps: a
//! step is one block of the level's arm and one as long of its baseline (the lowest
//! level, or the `off` arm at the level), alternating which goes first (a baseline
//! shared by every level skips its block when it already holds enough sessions that
//! this level's e-process has not taken in), at the open level next to
//! the threshold ([`resolve`]); it stops when no level is open (every level decided,
//! capped or implied by its neighbours under the monotone model). Every block's
//! engine-side peak is checked against its level (`run`'s load rule): a level whose
//! block fell short is marked so, left out of the fit and the tests, and given no more
//! blocks; a baseline that fell short stops an adaptive sweep (nothing can be compared).

use std::collections::BTreeMap;

use super::fit::{fit_rates, monotone_band, Count};
use super::report::{
    verdict_words, Answer, Arm, ArmCount, BlockRecord, LevelReport, LoadReport, Reach,
};
use super::threshold::{
    fixed_rule, resolve, sequential_status, EProcess, Resolution, Status, CLEAR_ALPHA,
};
use super::{Allocation, LoadParams};
use crate::confounds::engine_load_shortfall;
use crate::culprit::BlockOutcome;
use crate::machine::{Machine, Port};
use crate::mechanism::Ran;
use crate::stats;

/// One block the sweep asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelBlock {
    /// 1-based, in the order asked.
    pub block: u64,
    pub level: u32,
    /// Sessions in flight: the level itself, or a pressure sweep's fixed load.
    pub in_flight: u32,
    /// A pressure sweep's share of the KV cache for this level's filler.
    pub pressure: Option<f64>,
    pub arm: Arm,
    pub sessions: u64,
    pub seed: u64,
}

/// The sweep as a sans-IO state machine ([`crate::machine`]): ask `next_block`,
/// run it, `observe` what it gave. Its events are the report as it stands after each
/// block (to rewrite load.json); it ends with the final report.
pub type LoadSweep = Machine<LevelBlock, BlockOutcome, LoadReport, LoadReport>;

/// The sweep of `params`. `flag` names the flag of an A/B sweep (for the words).
pub fn sweep(params: LoadParams, flag: Option<String>) -> LoadSweep {
    LoadSweep::new(|port| async move { run_sweep(&params, flag.as_deref(), port).await })
}

/// Run the sweep to its answer.
async fn run_sweep(
    params: &LoadParams,
    flag: Option<&str>,
    port: Port<LevelBlock, BlockOutcome, LoadReport>,
) -> LoadReport {
    let mut state = State::new(params, flag, port);
    match params.allocation {
        Allocation::Fixed { .. } => {
            for block in fixed_order(params) {
                state.ask(block).await;
            }
            state.stopped = "every level ran its planned sessions".into();
        }
        Allocation::Adaptive { max_sessions } => loop {
            if state.baseline_short() {
                state.stopped = "the baseline level's engine-side load fell short".into();
                break;
            }
            let Some(i) = state.analyse().next else {
                state.stopped = "no level is left undecided".into();
                break;
            };
            let steps = state.report.levels[i].arm.blocks;
            // The baseline's block as long as the level's: a balanced pair. Without a
            // flag the lowest level is every level's baseline: when it already holds as
            // many sessions that this level's e-process has not taken in (run for other
            // levels), those are the pair's baseline half and no block is run for it.
            let sessions = params.block_sessions(params.levels[i]);
            let mut order = vec![(i, state.arm_of())];
            if params.ab || state.unseen_baseline(i) < sessions {
                order.push((state.baseline_of(i), state.baseline_arm()));
            }
            if steps % 2 == 0 {
                order.reverse();
            }
            for (j, arm) in order {
                state.run(j, arm, sessions).await;
            }
            state.update_e_process(i);
            if state.report.levels[i].arm.sessions >= max_sessions {
                state.capped[i] = true;
            }
        },
    }
    state.analyse();
    let mut report = state.report;
    report.stopped = state.stopped;
    report
}

/// The blocks a fixed sweep asks for, in its order: every level once, lowest load first,
/// each arm of it (an A/B level's `on` first at even levels, `off` first at odd ones, so
/// neither arm always runs on a freshly warmed engine). Fixed in advance (no block depends
/// on another's outcome), so blocks on replica sets can run before they are asked for;
/// empty for an adaptive sweep.
pub fn fixed_order(params: &LoadParams) -> Vec<LevelBlock> {
    if !matches!(params.allocation, Allocation::Fixed { .. }) {
        return Vec::new();
    }
    let mut blocks = Vec::new();
    for (i, &level) in params.levels.iter().enumerate() {
        let sessions = params.block_sessions(level);
        let arms = match (params.ab, i % 2 == 1) {
            (false, _) => vec![Arm::Level],
            (true, false) => vec![Arm::On, Arm::Off],
            (true, true) => vec![Arm::Off, Arm::On],
        };
        for arm in arms {
            blocks.push(level_block(params, blocks.len(), i, arm, sessions));
        }
    }
    blocks
}

/// The sweep's block number `asked + 1`: `sessions` of level `i`'s `arm`, its seed the
/// sweep's plus the blocks asked before it.
fn level_block(params: &LoadParams, asked: usize, i: usize, arm: Arm, sessions: u64) -> LevelBlock {
    let level = params.levels[i];
    LevelBlock {
        block: asked as u64 + 1,
        level,
        in_flight: params.axis.in_flight(level),
        pressure: params.axis.pressure(level),
        arm,
        sessions,
        seed: params.seed.wrapping_add(asked as u64),
    }
}

struct State<'p> {
    port: Port<LevelBlock, BlockOutcome, LoadReport>,
    params: &'p LoadParams,
    flag: Option<&'p str>,
    report: LoadReport,
    e: Vec<EProcess>,
    capped: Vec<bool>,
    stopped: String,
    /// The flag's mechanism's name, once a block's record has named it.
    mechanism_name: Option<String>,
}

impl<'p> State<'p> {
    fn new(
        params: &'p LoadParams,
        flag: Option<&'p str>,
        port: Port<LevelBlock, BlockOutcome, LoadReport>,
    ) -> Self {
        let levels = params
            .levels
            .iter()
            .map(|&level| LevelReport {
                level,
                arm: ArmCount::default(),
                off: params.ab.then(ArmCount::default),
                short: None,
                status: None,
                implied: None,
                p: None,
                holm_p: None,
                e_value: None,
                diff_upper: None,
                wilson: [0.0, 1.0],
                fit: None,
                band: None,
                mechanism: None,
            })
            .collect();
        let n = params.levels.len();
        State {
            port,
            params,
            flag,
            report: LoadReport {
                levels,
                blocks: Vec::new(),
                answer: Answer::NoThreshold {
                    flat_through: None,
                    all_flat: false,
                },
                verdict: String::new(),
                stopped: String::new(),
                sessions_spent: 0,
                restarts: 0,
                band_confidence: 1.0 - CLEAR_ALPHA,
                contradicts_monotone: false,
                warnings: Vec::new(),
                axis: params.axis,
                mechanism: None,
            },
            e: vec![EProcess::default(); n],
            capped: vec![false; n],
            stopped: String::new(),
            mechanism_name: None,
        }
    }

    fn arm_of(&self) -> Arm {
        if self.params.ab {
            Arm::On
        } else {
            Arm::Level
        }
    }

    fn baseline_arm(&self) -> Arm {
        if self.params.ab {
            Arm::Off
        } else {
            Arm::Level
        }
    }

    /// The level whose arm is level `i`'s baseline: itself (its `off` arm) or the lowest.
    fn baseline_of(&self, i: usize) -> usize {
        if self.params.ab {
            i
        } else {
            0
        }
    }

    /// The levels that are tested (all with a flag; all but the lowest without).
    fn tested(&self) -> std::ops::Range<usize> {
        let first = usize::from(!self.params.ab);
        first..self.params.levels.len()
    }

    fn baseline_short(&self) -> bool {
        !self.params.ab && self.report.levels[0].short.is_some()
    }

    fn count(&self, i: usize, arm: Arm) -> &ArmCount {
        let level = &self.report.levels[i];
        match arm {
            Arm::Off => level.off.as_ref().expect("off arm of an A/B sweep"),
            _ => &level.arm,
        }
    }

    /// The (level, baseline) tallies of tested level `i`.
    fn pair(&self, i: usize) -> (&ArmCount, &ArmCount) {
        (
            &self.report.levels[i].arm,
            self.count(self.baseline_of(i), self.baseline_arm()),
        )
    }

    /// Judged baseline sessions that level `i`'s e-process has not taken in yet.
    fn unseen_baseline(&self, i: usize) -> u64 {
        let (_, baseline) = self.pair(i);
        baseline.judged - self.e[i].seen_baseline.sessions
    }

    fn update_e_process(&mut self, i: usize) {
        let (level, baseline) = self.pair(i);
        let (level, baseline) = (level.tally(), baseline.tally());
        self.e[i].update(level, baseline);
    }

    async fn run(&mut self, i: usize, arm: Arm, sessions: u64) {
        let block = level_block(self.params, self.report.blocks.len(), i, arm, sessions);
        self.ask(block).await
    }

    /// Ask for `block` and take in what it gave.
    async fn ask(&mut self, block: LevelBlock) {
        let i = self
            .params
            .levels
            .iter()
            .position(|&l| l == block.level)
            .expect("a block at one of the sweep's levels");
        let (level, in_flight, arm) = (block.level, block.in_flight, block.arm);
        let outcome = self.port.ask(block.clone()).await;
        let peaks: BTreeMap<String, u64> = outcome
            .peak_engine
            .map(|p| ("busiest engine role".to_string(), p))
            .into_iter()
            .collect();
        // One session in flight has no lower load to fall to (an engine that answered
        // ran it), and its requests come one at a time between the poller's samples,
        // which then mostly see none running: not load-checked, as in the matrix.
        let short = (in_flight > 1)
            .then(|| {
                engine_load_shortfall(&peaks, u64::from(in_flight), self.params.min_load_fraction)
            })
            .flatten();
        // An engine that dies is evidence, never a flat level (core::deaths): a block
        // whose engine died and showed no corruption does not count as run at its load.
        let short = short.or_else(|| {
            crate::deaths::crashed_without_corruption(&outcome.classes).map(|crashed| {
                format!(
                    "saw the engine die ({crashed} session{} cut short, none corrupted): an engine that dies is never flat",
                    if crashed == 1 { "" } else { "s" }
                )
            })
        });
        // A level at which the flag's path never ran is never flat (core::mechanism).
        let short = short.or_else(|| {
            let corrupted = outcome.classes.iter().any(|c| c.is_corrupted());
            let coverage = crate::mechanism::coverage(&[(arm.as_str(), &outcome.mechanisms)]);
            coverage
                .and_then(|c| c.refusal())
                .filter(|_| !corrupted)
                .map(|refusal| format!("{refusal}: a level whose path never ran is never flat"))
        });
        let mut count = ArmCount::default();
        count.add(&outcome.classes, outcome.peak_engine);
        self.note_degraded(&block, &count);
        for warning in &outcome.warnings {
            if !self.report.warnings.contains(warning) {
                self.report.warnings.push(warning.clone());
            }
        }
        let ran = self.ran(&outcome.mechanisms);
        let entry = &mut self.report.levels[i];
        if let Some(ran) = ran {
            entry.mechanism = Some(entry.mechanism.map_or(ran, |r| r.or(ran)));
        }
        if let (Some(why), None) = (&short, &entry.short) {
            entry.short = Some(format!("block {} ({}) {why}", block.block, arm.as_str()));
        }
        match arm {
            Arm::Off => entry.off.get_or_insert_with(ArmCount::default),
            _ => &mut entry.arm,
        }
        .add(&outcome.classes, outcome.peak_engine);
        self.report.blocks.push(BlockRecord {
            block: block.block,
            level,
            arm,
            sessions: count.sessions,
            judged: count.judged,
            corrupted: count.corrupted,
            failed: count.failed,
            peak_engine: outcome.peak_engine,
            seed: block.seed,
            wall_s: outcome.wall_s,
            short,
        });
        self.report.sessions_spent += count.sessions;
        self.report.restarts += 1;
        self.analyse();
        self.port.emit(self.report.clone());
    }

    /// Whether a block ran the sweep's flag's mechanism, when its value enables it.
    fn ran(&mut self, records: &[crate::mechanism::MechanismRecord]) -> Option<Ran> {
        let flag = self.flag?;
        let record = records.iter().find(|r| r.flag == flag && r.needed)?;
        if self.mechanism_name.is_none() {
            self.mechanism_name = Some(record.label());
        }
        Some(record.ran())
    }

    /// Where the mechanism ran over the levels read so far.
    fn reach(&self) -> Option<Reach> {
        let name = self.mechanism_name.clone()?;
        let read = |want: Ran| {
            self.report
                .levels
                .iter()
                .filter(move |l| l.mechanism == Some(want))
                .map(|l| l.level)
        };
        Some(Reach {
            name,
            from: read(Ran::Yes).next(),
            never: read(Ran::No).collect(),
        })
    }

    /// More than the degraded fraction of a block's sessions failed: a warning.
    fn note_degraded(&mut self, block: &LevelBlock, count: &ArmCount) {
        let share = stats::rate(count.failed, count.sessions);
        if share > self.params.degraded_fraction {
            self.report.warnings.push(format!(
                "block {} (level {}, {}): {} of {} sessions failed (error/timeout); the rate counts the sessions that finished",
                block.block,
                block.level,
                block.arm.as_str(),
                count.failed,
                count.sessions
            ));
        }
    }

    /// Recompute every level's status, the fit and the answer from the counts.
    fn analyse(&mut self) -> Resolution {
        let tested: Vec<usize> = self.tested().collect();
        let statuses: Vec<Status> = match self.params.allocation {
            Allocation::Fixed { .. } => self.fixed_statuses(&tested),
            Allocation::Adaptive { .. } => self.sequential_statuses(&tested),
        };
        let resolution = resolve(&statuses);
        let highest_flat = statuses.iter().rposition(|s| *s == Status::Flat);
        for (t, (&i, status)) in tested.iter().zip(&statuses).enumerate() {
            let level = &mut self.report.levels[i];
            level.status = Some(*status);
            level.implied = match (status, resolution.threshold, highest_flat) {
                (Status::Open, Some(r), _) if t > r => Some(Status::Rises),
                (Status::Open, _, Some(f)) if t < f => Some(Status::Flat),
                _ => None,
            };
        }
        self.fit();
        let at = |t: Option<usize>| t.map(|t| self.params.levels[tested[t]]);
        self.report.answer = if self.baseline_short() {
            Answer::NoBaseline
        } else if let Some(t) = resolution.threshold {
            let first_usable = statuses.iter().position(|s| *s != Status::Short);
            Answer::Threshold {
                level: at(Some(t)).expect("a level"),
                above: at(resolution.flat_below),
                at_lowest: first_usable == Some(t),
            }
        } else {
            let top_flat =
                statuses.iter().rev().find(|s| **s != Status::Short) == Some(&Status::Flat);
            Answer::NoThreshold {
                flat_through: at(resolution.flat_below),
                all_flat: top_flat,
            }
        };
        self.report.mechanism = self.reach();
        self.report.verdict = verdict_words(
            &self.report.answer,
            &self.report.levels,
            self.flag,
            self.params.min_effect,
            self.params.axis,
            self.report.mechanism.as_ref(),
        );
        Resolution {
            threshold: resolution.threshold.map(|t| tested[t]),
            flat_below: resolution.flat_below.map(|t| tested[t]),
            next: resolution.next.map(|t| tested[t]),
        }
    }

    fn fixed_statuses(&mut self, tested: &[usize]) -> Vec<Status> {
        let pairs: Vec<_> = tested
            .iter()
            .map(|&i| {
                let (level, baseline) = self.pair(i);
                let usable = self.report.levels[i].short.is_none() && level.judged > 0;
                usable.then_some((
                    (level.corrupted, level.judged),
                    (baseline.corrupted, baseline.judged),
                ))
            })
            .collect();
        let ruled = fixed_rule(&pairs, self.params.alpha, self.params.min_effect);
        let mut statuses = Vec::new();
        for (&i, (status, test)) in tested.iter().zip(ruled) {
            let entry = &mut self.report.levels[i];
            entry.p = test.map(|t| t.p);
            entry.holm_p = test.map(|t| t.holm_p);
            entry.diff_upper = test.map(|t| t.diff_upper);
            // A level not yet run (or with nothing judged) is open, not short.
            let status = if status == Status::Short && entry.short.is_none() {
                Status::Open
            } else {
                status
            };
            statuses.push(status);
        }
        statuses
    }

    fn sequential_statuses(&mut self, tested: &[usize]) -> Vec<Status> {
        let k = tested
            .iter()
            .filter(|&&i| self.report.levels[i].short.is_none())
            .count();
        let mut statuses = Vec::new();
        for &i in tested {
            let (level, baseline) = self.pair(i);
            let (level, baseline) = (level.tally(), baseline.tally());
            let (mut status, diff_upper) = sequential_status(
                &self.e[i],
                level,
                baseline,
                k,
                self.params.alpha,
                self.params.min_effect,
            );
            if self.report.levels[i].short.is_some() {
                status = Status::Short;
            } else if status == Status::Open && self.capped[i] {
                status = Status::Capped;
            }
            let entry = &mut self.report.levels[i];
            entry.e_value = Some(self.e[i].e_value());
            entry.diff_upper = Some(diff_upper);
            statuses.push(status);
        }
        statuses
    }

    /// Wilson intervals per level; the isotonic fit and band over the levels that were
    /// run at their load.
    fn fit(&mut self) {
        let levels = &mut self.report.levels;
        for l in levels.iter_mut() {
            let (lo, hi) = stats::wilson(l.arm.corrupted, l.arm.judged, 0.95);
            l.wilson = [lo, hi];
            l.fit = None;
            l.band = None;
        }
        let usable: Vec<usize> = (0..levels.len())
            .filter(|&i| levels[i].short.is_none() && levels[i].arm.judged > 0)
            .collect();
        let counts: Vec<Count> = usable
            .iter()
            .map(|&i| Count {
                corrupted: levels[i].arm.corrupted,
                judged: levels[i].arm.judged,
            })
            .collect();
        let fit = fit_rates(&counts);
        let band = monotone_band(&counts, self.report.band_confidence);
        for (j, &i) in usable.iter().enumerate() {
            levels[i].fit = Some(fit[j]);
            levels[i].band = Some([band.lower[j], band.upper[j]]);
        }
        self.report.contradicts_monotone = band.contradicts_monotone();
    }
}

#[cfg(test)]
mod tests {
    use super::super::simulate::scripted_block;
    use super::*;
    use crate::evidence::Policy;
    use crate::load::Axis;

    /// Exactly `corrupt(level, arm)` of every 20 sessions corrupted; the engine reaches
    /// `peak(level)`.
    struct Scripted {
        corrupt: fn(u32, Arm) -> u64,
        peak: fn(u32) -> Option<u64>,
        asked: Vec<(u32, Arm, u64)>,
    }

    impl Scripted {
        fn run_block(&mut self, b: &LevelBlock) -> BlockOutcome {
            self.asked.push((b.level, b.arm, b.sessions));
            let per_20 = (self.corrupt)(b.level, b.arm);
            scripted_block(b.sessions, (self.peak)(b.level), |i| i % 20 < per_20)
        }
    }

    fn params(levels: &[u32], ab: bool, allocation: Allocation) -> LoadParams {
        LoadParams::new(levels.to_vec(), ab, allocation, &Policy::default(), 1)
    }

    fn run(p: &LoadParams, runner: &mut Scripted) -> LoadReport {
        let flag = p.ab.then(|| "X".to_string());
        sweep(p.clone(), flag).run(|b| runner.run_block(b), drop)
    }

    /// The order a fixed sweep promises in advance is the order it asks in, block for
    /// block (number, level, arm, sessions, seed), whatever the blocks give; an adaptive
    /// sweep promises none.
    #[test]
    fn a_fixed_sweep_asks_for_exactly_its_order_given_in_advance() {
        for ab in [true, false] {
            let p = params(&[1, 8, 16, 32], ab, Allocation::Fixed { sessions: 40 });
            let order = fixed_order(&p);
            assert_eq!(order.len(), if ab { 8 } else { 4 });
            let mut asked = Vec::new();
            sweep(p.clone(), ab.then(|| "X".to_string())).run(
                |b| {
                    asked.push(b.clone());
                    // Corrupt and fall short here and there: the order may not care.
                    let peak = Some(u64::from(b.level / (1 + b.block as u32 % 2)));
                    scripted_block(b.sessions, peak, |i| i % (2 + b.block) == 0)
                },
                drop,
            );
            assert_eq!(asked, order, "ab {ab}");
        }
        let adaptive = params(&[1, 8], true, Allocation::Adaptive { max_sessions: 200 });
        assert!(fixed_order(&adaptive).is_empty());
    }

    #[test]
    fn a_level_whose_engine_fell_short_is_reported_as_that_never_as_the_level() {
        let p = params(&[1, 32, 64, 80], false, Allocation::Fixed { sessions: 80 });
        let mut runner = Scripted {
            // 0% at 1 and 32, 20% from 64 on.
            corrupt: |level, _| if level >= 64 { 4 } else { 0 },
            // The engine never ran more than 40 at once.
            peak: |level| Some(u64::from(level.min(40))),
            asked: Vec::new(),
        };
        let report = run(&p, &mut runner);
        let at = |level| report.levels.iter().find(|l| l.level == level).unwrap();
        for level in [64, 80] {
            let l = at(level);
            assert_eq!(l.status, Some(Status::Short), "{l:?}");
            assert!(l.fit.is_none() && l.band.is_none());
            assert!(l
                .short
                .as_ref()
                .unwrap()
                .contains("reached at most 40 running requests"));
        }
        // The one level left: 0/80 vs 0/80, Newcombe's upper bound at 1 - 2 * 0.05 / 1
        // is Wilson's 0/80 bound at 90%, about 3.3%: flat.
        assert_eq!(at(32).status, Some(Status::Flat));
        assert!((at(32).diff_upper.unwrap() - crate::stats::wilson(0, 80, 0.9).1).abs() < 1e-12);
        // 16/80 at 64 would rise, but 64 was not run at 64: no threshold is claimed.
        assert!(
            matches!(report.answer, Answer::NoThreshold { .. }),
            "{:?}",
            report.answer
        );
        assert!(
            report.verdict.contains("level 64 is not reported as 64"),
            "{}",
            report.verdict
        );
        assert!(report.verdict.contains("level 80 is not reported as 80"));
    }

    /// A level at which the flag's path never ran is short, never flat: the DEFRAG sweep
    /// at 1 and 4 in flight, defrag logged only at 4 (docs/real-engines.md, 12253).
    #[test]
    fn a_level_whose_mechanism_never_ran_is_never_flat() {
        let p = params(&[1, 4], true, Allocation::Fixed { sessions: 40 });
        let defrags = |level: u32, arm: Arm| {
            crate::testing::witnessed(
                ("X", "defrag"),
                (if arm == Arm::Off { "-1" } else { "0.1" }, arm != Arm::Off),
                "log /requesting defrag/",
                u64::from(level > 1 && arm != Arm::Off) * 5,
            )
        };
        let report = sweep(p.clone(), Some("X".into())).run(
            |b| {
                let mut out = scripted_block(b.sessions, Some(u64::from(b.level)), |_| false);
                out.mechanisms = vec![defrags(b.level, b.arm)];
                out
            },
            drop,
        );
        let short = report.levels[0].short.as_deref().unwrap_or_default();
        assert!(
            short.contains("the mechanism never ran: defrag") && short.contains("never flat"),
            "{:?}",
            report.levels[0]
        );
        assert!(report.levels[1].short.is_none(), "{:?}", report.levels[1]);
        // Where it ran is the answer's too: from 4 in flight, never at 1.
        assert_eq!(report.levels[0].mechanism, Some(Ran::No));
        assert_eq!(report.levels[1].mechanism, Some(Ran::Yes));
        assert_eq!(
            report.mechanism,
            Some(Reach {
                name: "defrag".into(),
                from: Some(4),
                never: vec![1],
            })
        );
        assert!(
            report
                .verdict
                .contains("the mechanism (defrag) ran from 4 in flight (never at 1 in flight)"),
            "{}",
            report.verdict
        );
    }

    /// A pressure sweep: every block at the same sessions in flight, each level a share
    /// of the KV cache; the engine's load is checked against the sessions in flight, not
    /// the level; the mechanism first runs, and corruption first appears, at 50%.
    #[test]
    fn a_pressure_sweep_holds_the_load_and_answers_in_shares_of_the_cache() {
        let mut p = params(&[10, 50, 100], true, Allocation::Fixed { sessions: 40 });
        p.axis = Axis::Pressure { in_flight: 4 };
        let mut asked = Vec::new();
        let report = sweep(p.clone(), Some("X".into())).run(
            |b| {
                asked.push((b.level, b.in_flight, b.pressure, b.sessions));
                let hot = b.level >= 50 && b.arm == Arm::On;
                // The engine reaches the 4 in flight, never the level's number.
                let mut out = scripted_block(b.sessions, Some(4), |i| hot && i % 4 == 0);
                out.mechanisms = vec![crate::testing::witnessed(
                    ("X", "preemption"),
                    (
                        if b.arm == Arm::On { "40" } else { "585" },
                        b.arm == Arm::On,
                    ),
                    "counter vllm:num_preemptions_total",
                    u64::from(hot) * 7,
                )];
                out
            },
            drop,
        );
        assert!(asked
            .iter()
            .all(|&(_, in_flight, _, sessions)| in_flight == 4 && sessions == 40));
        assert_eq!(asked[0].2, Some(0.1));
        assert_eq!(asked.last().unwrap().2, Some(1.0));
        assert!(
            report.levels.iter().skip(1).all(|l| l.short.is_none()),
            "{:?}",
            report.levels
        );
        assert!(
            matches!(report.answer, Answer::Threshold { level: 50, .. }),
            "{:?}: {}",
            report.answer,
            report.verdict
        );
        assert!(
            report
                .verdict
                .starts_with("lowest reproducing pressure: 50% of the KV cache"),
            "{}",
            report.verdict
        );
        assert!(
            report.verdict.contains(
                "the mechanism (preemption) ran from 50% of the KV cache (never at 10% of the KV cache)"
            ),
            "{}",
            report.verdict
        );
        assert_eq!(report.axis, p.axis);
        // A level above the first that ran it and did not: said apart, never as "never".
        let reach = Reach {
            name: "preemption".into(),
            from: Some(50),
            never: vec![10, 100],
        };
        let words = crate::load::report::verdict_words(
            &report.answer,
            &report.levels,
            Some("X"),
            0.05,
            p.axis,
            Some(&reach),
        );
        assert!(
            words.contains(
                "ran from 50% of the KV cache (never at 10% of the KV cache), yet not at 100% of the KV cache"
            ),
            "{words}"
        );
    }

    #[test]
    fn one_session_in_flight_is_never_short() {
        // Short requests one at a time: the poller saw none running at level 1.
        let p = params(&[1, 16], false, Allocation::Fixed { sessions: 40 });
        let mut runner = Scripted {
            corrupt: |_, _| 0,
            peak: |level| Some(u64::from(level) * u64::from(level > 1)),
            asked: Vec::new(),
        };
        let report = run(&p, &mut runner);
        assert!(report.levels[0].short.is_none(), "{:?}", report.levels[0]);
        assert_ne!(report.answer, Answer::NoBaseline, "{}", report.verdict);
    }

    #[test]
    fn an_adaptive_sweep_stops_when_its_baseline_falls_short() {
        let p = params(&[4, 80], false, Allocation::Adaptive { max_sessions: 480 });
        let mut runner = Scripted {
            corrupt: |_, _| 0,
            peak: |level| Some(u64::from(level) / 2),
            asked: Vec::new(),
        };
        let report = run(&p, &mut runner);
        assert_eq!(report.answer, Answer::NoBaseline);
        // One step: the level's block and the baseline's, as long as the level's.
        assert_eq!(runner.asked, [(4, Arm::Level, 160), (80, Arm::Level, 160)]);
        assert!(
            report.verdict.starts_with("no answer"),
            "{}",
            report.verdict
        );
    }

    #[test]
    fn an_ab_sweep_compares_on_with_off_at_each_level_and_finds_the_threshold() {
        let p = params(&[8, 32, 64], true, Allocation::Fixed { sessions: 100 });
        let mut runner = Scripted {
            // on corrupts 20% from 32 on, off never.
            corrupt: |level, arm| if arm == Arm::On && level >= 32 { 4 } else { 0 },
            peak: |level| Some(u64::from(level)),
            asked: Vec::new(),
        };
        let report = run(&p, &mut runner);
        // Every level runs on and off, alternating which goes first.
        let order: Vec<(u32, Arm)> = runner.asked.iter().map(|a| (a.0, a.1)).collect();
        assert_eq!(
            order,
            [
                (8, Arm::On),
                (8, Arm::Off),
                (32, Arm::Off),
                (32, Arm::On),
                (64, Arm::On),
                (64, Arm::Off)
            ]
        );
        assert_eq!(
            report.answer,
            Answer::Threshold {
                level: 32,
                above: Some(8),
                at_lowest: false
            }
        );
        // Holm over three levels: 32 and 64 both 20/100 vs 0/100.
        let p32 = super::super::threshold::fisher_greater(20, 100, 0, 100);
        let l32 = &report.levels[1];
        assert!((l32.holm_p.unwrap() - 3.0 * p32).abs() < 1e-15);
        assert_eq!(report.levels[0].status, Some(Status::Flat));
        assert!(
            report.verdict.starts_with(
                "lowest reproducing load: 32 in flight (X on 20/100 = 20.0% vs off 0/100 = 0.0%"
            ),
            "{}",
            report.verdict
        );
    }
}
