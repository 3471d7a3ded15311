//! Both arms at once on replica sets (docs/design.md 3.1, "Replicas"): `bisect run` on
//! a target that lists several (`[[replica]]`) opens one testbed per set and runs each
//! pair of arm blocks at the same time, `on` on one set and `off` on the other, then the
//! next pair the other way round (crossover). Time drift between the arms (the
//! machine's load, the engines' uptime) then falls on both alike, a replica's own
//! difference enters both arms alike and cancels (`core::confounds::replica` tests and
//! reports it), and a pair costs one restart's wall time instead of two.
//!
//! Each block is the same lifecycle as on one replica (`run::run_block`: write and read
//! back, snapshot, restart, identity and effective values, the tool-call probe, the
//! death watch, drive and check its own load, stop) on its own set's engines; every
//! set's configs are restored byte for byte when the command ends. Sets beyond an even
//! number sit idle (said at the start).

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::arm::{lifecycle_lanes, open_lanes, BlockName, Progress, Testbed};
use crate::control::EngineControl;
use crate::core::arm_stats::{ArmLabel, ArmStats};
use crate::core::phases::Phases;
use crate::core::session::SessionResult;
use crate::results::run_record::RunRecord;
use crate::results::ResultsDir;

use super::run::{
    end_record_on, finish_verdict, initial_record, planned_cost, pooled_arms, push_warning,
    run_block, sized_workload, testbed_spec_on, write_timed, BlockRun, BlockSpec, RunPlan,
};
use crate::core::classify::Classifier;

/// Which arm and repeat each lane runs, round by round: repeat `r` goes to the lane
/// pair `r % pairs` in round `r / pairs`; in even rounds the pair's first lane runs
/// `on`, in odd ones `off` (crossover). `lanes` sets, `pairs = lanes / 2` pairs.
pub(crate) fn lane_order(repeats: u32, lanes: usize) -> Vec<Vec<Option<(ArmLabel, u32)>>> {
    let pairs = (lanes / 2).max(1) as u32;
    let rounds = repeats.max(1).div_ceil(pairs);
    (0..rounds)
        .map(|round| {
            let mut row = vec![None; lanes];
            for k in 0..pairs {
                let repeat = round * pairs + k;
                if repeat >= repeats.max(1) {
                    break;
                }
                let (first, second) = if round % 2 == 0 {
                    (ArmLabel::On, ArmLabel::Off)
                } else {
                    (ArmLabel::Off, ArmLabel::On)
                };
                row[2 * k as usize] = Some((first, repeat));
                row[2 * k as usize + 1] = Some((second, repeat));
            }
            row
        })
        .collect()
}

/// The replica sets a command opens testbeds on, with each one's progress: what the
/// testbeds borrow, so it outlives them.
pub(crate) struct ReplicaSets<'p> {
    sets: Vec<crate::config::TargetProfile>,
    progress: Vec<Box<dyn Progress + 'p>>,
}

impl<'p> ReplicaSets<'p> {
    /// The first `lanes` replica sets of the plan's target (the target itself on a
    /// single replica); with several, each set's notes name it.
    pub(crate) fn new(plan: &RunPlan, lanes: usize, progress: &'p dyn Progress) -> Self {
        let sets: Vec<_> = plan.target.replica_sets().into_iter().take(lanes).collect();
        let progress = lane_progress(&sets, progress);
        ReplicaSets { sets, progress }
    }

    /// One testbed per set, over `controls` in the same order ([`open_lanes`]).
    pub(crate) async fn open<'a, 'c: 'a>(
        &'a self,
        plan: &'a RunPlan,
        controls: Vec<&'a mut (dyn EngineControl + 'c)>,
        cancel: CancellationToken,
    ) -> anyhow::Result<Vec<Testbed<'a>>> {
        anyhow::ensure!(
            controls.len() == self.sets.len(),
            "{} engine controls for {} replica sets",
            controls.len(),
            self.sets.len()
        );
        let specs = self
            .sets
            .iter()
            .map(|set| testbed_spec_on(plan, set))
            .collect();
        // Each control reborrowed for the testbeds' (shorter) life.
        let controls = controls
            .into_iter()
            .map(|c| -> &mut dyn EngineControl { c })
            .collect();
        open_lanes(specs, controls, &self.progress, cancel).await
    }
}

/// Each set's progress: the command's own, its notes prefixed `replica NAME:` where
/// there are several sets.
pub(crate) fn lane_progress<'p>(
    sets: &[crate::config::TargetProfile],
    progress: &'p dyn Progress,
) -> Vec<Box<dyn Progress + 'p>> {
    sets.iter()
        .map(|set| -> Box<dyn Progress + 'p> {
            Box::new(LaneProgress::new(
                progress,
                (sets.len() > 1).then(|| set.replica_name().to_string()),
            ))
        })
        .collect()
}

/// A lane's progress: the command's own, its notes naming the replica set they are
/// about where there are several.
pub(crate) struct LaneProgress<'a> {
    inner: &'a dyn Progress,
    replica: Option<String>,
}

impl<'a> LaneProgress<'a> {
    /// `inner`'s notes, prefixed `replica NAME:` when `replica` names the set.
    pub(crate) fn new(inner: &'a dyn Progress, replica: Option<String>) -> Self {
        LaneProgress { inner, replica }
    }
}

impl Progress for LaneProgress<'_> {
    fn arm_started(&self, block: BlockName<'_>, sessions: u64) {
        self.inner.arm_started(block, sessions)
    }
    fn session_done(&self, result: &SessionResult) {
        self.inner.session_done(result)
    }
    fn arm_finished(&self, block: BlockName<'_>, stats: &ArmStats) {
        self.inner.arm_finished(block, stats)
    }
    fn note(&self, message: &str) {
        match &self.replica {
            Some(name) => self.inner.note(&format!("replica {name}: {message}")),
            None => self.inner.note(message),
        }
    }
}

/// What the lanes' lifecycle carries: the record, the wall-clock phases, and the time
/// every lane spent (the target's rates).
struct Lanes {
    record: RunRecord,
    phases: Phases,
    serial: Phases,
}

/// `bisect run` on the plan's replica sets, one `controls` entry per set
/// ([`crate::config::TargetProfile::replica_sets`], in order). Every set's launch
/// configs are restored before this returns, on every path.
pub async fn run_on_replicas(
    plan: &RunPlan,
    controls: Vec<&mut dyn EngineControl>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<RunRecord> {
    let sets = plan.target.replica_sets();
    anyhow::ensure!(
        controls.len() == sets.len(),
        "{} engine controls for {} replica sets",
        controls.len(),
        sets.len()
    );
    let started = Instant::now();
    let mut phases = Phases::default();
    progress.note(&planned_cost(plan).words);
    let names: Vec<String> = sets.iter().map(|s| s.replica_name().to_string()).collect();
    progress.note(&lanes_words(&names, plan.repeats));
    let results = ResultsDir::create(&plan.run_dir)?;
    let record = initial_record(plan);
    write_timed(&results, &record, &mut phases)?;
    let opened = ReplicaSets::new(plan, sets.len(), progress);
    let beds = opened.open(plan, controls, cancel).await?;
    let mut state = Lanes {
        record,
        phases,
        serial: Phases::default(),
    };
    let lanes = sets.len() as u32;
    lifecycle_lanes(
        beds,
        &mut state,
        async |beds, state| run_rounds(plan, beds, &results, state).await,
        |state, outcome, ending| {
            state.phases.close_s = ending.close_s;
            if outcome.is_ok() {
                finish_verdict(plan, &mut state.record);
            }
            let Lanes {
                record,
                phases,
                serial,
            } = state;
            end_record_on(
                plan,
                record,
                phases,
                Some((lanes, serial)),
                started,
                outcome,
            );
            results.write_record(record)
        },
    )
    .await?;
    Ok(state.record)
}

/// What the run will do on its sets, said as it starts.
fn lanes_words(names: &[String], repeats: u32) -> String {
    let pairs = names.len() / 2;
    let mut words = format!(
        "replicas {}: each pair of arm blocks runs at once, on and off on two sets, crossing \
         over every pair ({repeats} pair{})",
        names.join(", "),
        if repeats == 1 { "" } else { "s" }
    );
    if repeats % 2 == 1 && pairs == 1 {
        words.push_str(
            "; with an odd number of pairs the arms run unevenly on the sets, and a set that \
             differs makes the verdict inconclusive (--repeats 2 crosses over)",
        );
    }
    if names.len() % 2 == 1 {
        words.push_str(&format!(
            "; replica {} sits idle (sets run in pairs)",
            names[names.len() - 1]
        ));
    }
    words
}

/// The pins on every set, the filler sized on the first (`--pressure`), then the rounds
/// of [`lane_order`], each round's blocks at once.
async fn run_rounds(
    plan: &RunPlan,
    beds: &mut [Testbed<'_>],
    results: &ResultsDir,
    state: &mut Lanes,
) -> anyhow::Result<()> {
    let editing = Instant::now();
    for bed in beds.iter_mut() {
        bed.pin(&plan.pins)?;
    }
    state.phases.edit_s += editing.elapsed().as_secs_f64();
    let workload = {
        let (record, phases) = (&mut state.record, &mut state.phases);
        sized_workload(plan, &plan.workload, &mut beds[0], record, phases).await?
    };
    if plan.pressure.is_some() {
        beds[0].progress().note(
            "the filler is sized on this set's engines and used on every set (replica sets \
             are taken to be alike; the replica confound tests it)",
        );
    }
    let classifier = Arc::new(plan.target.classifier(&workload)?);
    for round in lane_order(plan.repeats, beds.len()) {
        beds[0].check_cancelled()?;
        let work = round
            .iter()
            .map(|assigned| {
                assigned
                    .iter()
                    .map(|&(label, repeat)| BlockSpec {
                        label,
                        repeat,
                        workload: &workload,
                    })
                    .collect()
            })
            .collect();
        let ran = blocks_at_once(
            plan,
            beds,
            work,
            results,
            &classifier,
            &mut state.record,
            (&mut state.phases, &mut state.serial),
        )
        .await;
        let mut failed = None;
        for lane in ran {
            state
                .record
                .runs
                .extend(lane.ran.into_iter().map(|b| b.arm));
            if let Some(e) = lane.failed {
                failed.get_or_insert(e);
            }
        }
        state.record.arms = pooled_arms(plan, &state.record.runs);
        write_timed(results, &state.record, &mut state.phases)?;
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(())
}

/// What one lane of [`blocks_at_once`] ran: its blocks in order, and the error that
/// ended it early.
pub(crate) struct LaneRun {
    pub ran: Vec<BlockRun>,
    pub failed: Option<anyhow::Error>,
}

/// Runs `work[i]`'s blocks one after the other on `beds[i]` (the block lifecycle of
/// `run::run_block`), every lane at the same time; a lane with no work sits idle. Each
/// lane keeps a scratch record (its warnings said once, its engines' self-reports) and
/// phases, merged into `record` and `phases` (each phase the longest lane's) and
/// `serial` (every lane's) when all are done. A block's `replica` is its set's name
/// where the target has several.
pub(crate) async fn blocks_at_once(
    plan: &RunPlan,
    beds: &mut [Testbed<'_>],
    work: Vec<Vec<BlockSpec<'_>>>,
    results: &ResultsDir,
    classifier: &Arc<Classifier>,
    record: &mut RunRecord,
    (phases, serial): (&mut Phases, &mut Phases),
) -> Vec<LaneRun> {
    let mut scratch: Vec<(RunRecord, Phases)> = work
        .iter()
        .map(|_| {
            let lane = RunRecord {
                extra: record.extra.clone(),
                ..initial_record(plan)
            };
            (lane, Phases::default())
        })
        .collect();
    let lanes = beds.iter_mut().zip(work).zip(scratch.iter_mut()).map(
        |((bed, blocks), (lane_record, lane_phases))| async move {
            let mut ran = Vec::new();
            for spec in blocks {
                let block = match bed.check_cancelled() {
                    Ok(()) => {
                        run_block(
                            plan,
                            bed,
                            results,
                            lane_record,
                            classifier,
                            spec,
                            lane_phases,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                };
                match block {
                    Ok(mut block) => {
                        block.arm.replica = bed.target().replica.clone();
                        ran.push(block);
                    }
                    Err(e) => {
                        let e = match &bed.target().replica {
                            Some(name) => e.context(format!("replica {name}")),
                            None => e,
                        };
                        return LaneRun {
                            ran,
                            failed: Some(e),
                        };
                    }
                }
            }
            LaneRun { ran, failed: None }
        },
    );
    let ran = futures::future::join_all(lanes).await;
    let lane_phases: Vec<Phases> = scratch.iter().map(|(_, p)| p.clone()).collect();
    phases.add_concurrent(&lane_phases);
    for p in &lane_phases {
        serial.add(p);
    }
    for (lane, _) in scratch {
        record.engine_info.extend(lane.engine_info);
        for (key, value) in lane.extra {
            match (key.as_str(), value) {
                // Every lane's warnings, each once.
                ("warnings", serde_json::Value::Array(warnings)) => {
                    for w in warnings.iter().filter_map(|w| w.as_str()) {
                        push_warning(record, w);
                    }
                }
                (_, value) => {
                    record.extra.insert(key, value);
                }
            }
        }
    }
    ran
}

/// The failure of a command whose lanes ran at once: the set that failed, not the sets
/// it stopped (theirs read "interrupted"), unless the user stopped them all.
pub(crate) fn first_failure(
    mut failures: Vec<anyhow::Error>,
    cancel: &CancellationToken,
) -> anyhow::Error {
    let interrupted = |e: &anyhow::Error| {
        e.chain().any(|c| {
            matches!(
                c.downcast_ref::<crate::exit::Failure>(),
                Some(crate::exit::Failure::Interrupted)
            )
        })
    };
    match failures.iter().position(|e| !interrupted(e)) {
        Some(i) if !cancel.is_cancelled() => failures.swap_remove(i),
        _ => failures.swap_remove(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_that_failed_is_reported_not_the_sets_it_stopped() {
        let stopped =
            anyhow::Error::from(crate::exit::Failure::Interrupted).context("replica set a");
        let failed = anyhow::anyhow!("engine died").context("replica set b");
        let e = first_failure(vec![stopped, failed], &CancellationToken::new());
        assert_eq!(format!("{e:#}"), "replica set b: engine died");
        let cancel = CancellationToken::new();
        cancel.cancel();
        let stopped =
            anyhow::Error::from(crate::exit::Failure::Interrupted).context("replica set a");
        let failed = anyhow::anyhow!("engine died").context("replica set b");
        let e = first_failure(vec![stopped, failed], &cancel);
        assert!(format!("{e:#}").starts_with("replica set a"), "{e:#}");
    }

    fn words(order: &[Vec<Option<(ArmLabel, u32)>>]) -> Vec<String> {
        order
            .iter()
            .map(|row| {
                row.iter()
                    .map(|a| a.map_or("-".to_string(), |(l, r)| format!("{l}{r}")))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    /// Two sets: a pair per round, crossing over every round; four sets: two pairs per
    /// round; an odd set idle.
    #[test]
    fn pairs_cross_over_round_by_round() {
        assert_eq!(
            words(&lane_order(2, 2)),
            ["on0 off0", "off1 on1"],
            "two sets, two pairs"
        );
        assert_eq!(words(&lane_order(1, 2)), ["on0 off0"]);
        assert_eq!(
            words(&lane_order(4, 4)),
            ["on0 off0 on1 off1", "off2 on2 off3 on3"]
        );
        assert_eq!(
            words(&lane_order(3, 3)),
            ["on0 off0 -", "off1 on1 -", "on2 off2 -"]
        );
        // Every arm runs as often on each set after an even number of rounds.
        let order = lane_order(4, 2);
        for lane in 0..2 {
            let on = order
                .iter()
                .filter(|row| matches!(row[lane], Some((ArmLabel::On, _))))
                .count();
            assert_eq!(on, 2);
        }
    }

    #[test]
    fn the_start_says_how_the_sets_run() {
        let names = ["a".to_string(), "b".to_string(), "c".to_string()];
        let w = lanes_words(&names[..2], 1);
        assert!(w.contains("(1 pair); with an odd number of pairs"), "{w}");
        let w = lanes_words(&names, 2);
        assert!(
            w.ends_with("replica c sits idle (sets run in pairs)"),
            "{w}"
        );
    }
}
