//! `bisect run --adaptive` (docs/sequential.md, "bisect run --adaptive"): the sequential
//! A/B. The same protocol as a fixed run (refuse a half-applied flag, journal, write and
//! read back, restart, drive, restore) through the one arm lifecycle, with the order and
//! length of the blocks and the moment to stop taken from [`Schedule`]. After every pair
//! of blocks the blocking checks of a fixed run are computed over that pair and over all
//! blocks pooled; one that fails stops the run (more blocks would not make it valid).
//! The verdict is the sequential decision with every blocking check on top
//! ([`crate::core::adaptive::verdict`]). The record is rewritten after every block.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::arm::{lifecycle_lanes, Progress, Testbed};
use crate::commands::replicas::blocks_at_once;
use crate::commands::run::{
    end_record_on, initial_record, pooled_arms, write_timed, BlockSpec, RunPlan,
};
use crate::config::Workload;
use crate::control::EngineControl;
use crate::core::adaptive::{
    self, e_value_text, AdaptiveError, AdaptiveSpec, BlockOutcome, PairCheck, Schedule,
};
use crate::core::arm_stats::ArmLabel;
use crate::core::confounds::{confounds, load_shortfall};
use crate::core::evidence::{ArmObservation, Severity};
use crate::core::format::percent_digits;
use crate::core::phases::Phases;
use crate::core::sequential::{Decision, DesignGoal};
use crate::exit::Failure;
use crate::launch::state_root;
use crate::results::run_record::{ArmRecord, RunRecord};
use crate::results::ResultsDir;

use super::run::AdaptiveOptions;

/// The workload every block runs: the plan's, held at its target concurrency C. Its
/// `sessions` is set per block; the record shows C as both.
pub(crate) fn block_workload(plan: &RunPlan) -> Workload {
    let c = plan.workload.target_concurrency();
    let mut workload = plan.workload.clone();
    workload.sessions = c;
    workload.concurrency = Some(c);
    workload
}

/// Run the sequential experiment. Launch configs are restored before this returns, on
/// every path.
pub async fn run_adaptive(
    plan: &RunPlan,
    options: &AdaptiveOptions,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<RunRecord> {
    run_adaptive_on(plan, options, vec![control], progress, cancel).await
}

/// [`run_adaptive`] on the first `controls.len()` replica sets of the plan's target
/// (docs/sequential.md, "On replicas"): each set runs whole pairs, the sets at the same
/// time, the pairs fed to the e-process in order.
pub async fn run_adaptive_on(
    plan: &RunPlan,
    options: &AdaptiveOptions,
    controls: Vec<&mut dyn EngineControl>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<RunRecord> {
    let started = Instant::now();
    let mut phases = Phases::default();
    progress.note(&super::run::planned_cost(plan).words);
    let workload = block_workload(plan);
    let spec = AdaptiveSpec {
        goal: DesignGoal {
            alpha: plan.policy.alpha,
            power: plan.policy.power,
            min_effect: plan.policy.min_effect,
            ..DesignGoal::default()
        },
        concurrency: u64::from(workload.sessions),
        max_sessions: options.max_sessions,
    };
    let planning = Instant::now();
    let cache = PlanCache::new(
        plan.testbed.state_root.clone().unwrap_or_else(state_root),
        spec,
    );
    let known = cache.as_ref().and_then(PlanCache::read);
    let mut schedule = Schedule::with_plan(spec, known).map_err(|e| match e {
        AdaptiveError::CapBelowLoad { .. } | AdaptiveError::NoLoad => Failure::bad_input(
            e.to_string(),
            format!(
                "pass --max-sessions of at least the concurrency ({}), or lower --concurrency",
                spec.concurrency
            ),
        ),
        other => Failure::bad_input(
            other.to_string(),
            "choose --alpha, --min-effect within (0, 1) that a design can reach, or pass \
             --max-sessions",
        ),
    })?;
    if let (Some(cache), None) = (&cache, known) {
        let d = &schedule.record().design;
        cache.write(d.block_per_arm, d.max_per_arm);
    }
    phases.plan_s += planning.elapsed().as_secs_f64();
    let design = &schedule.record().design;
    progress.note(&format!(
        "sequential design: blocks of {} sessions per arm at {} in flight, cap {} per arm ({}), \
         alpha {}, min effect {} points",
        design.block_per_arm,
        design.concurrency,
        design.max_per_arm,
        design.cap_source.describe(),
        design.alpha,
        percent_digits(design.min_effect)
    ));

    let results = ResultsDir::create(&plan.run_dir)?;
    let mut record = initial_record(plan);
    record.workload = workload.params_json();
    record.adaptive = Some(schedule.record().clone());
    write_timed(&results, &record, &mut phases)?;

    let mut run = Run {
        plan,
        workload,
        results: &results,
        record: &mut record,
        phases: &mut phases,
        serial: Phases::default(),
        schedule: &mut schedule,
    };
    let lanes = controls.len();
    let sets = super::replicas::ReplicaSets::new(plan, lanes, progress);
    let beds = sets.open(plan, controls, cancel).await?;
    lifecycle_lanes(
        beds,
        &mut run,
        async |beds, run| run.blocks(beds).await,
        |run, outcome, ending| {
            run.phases.close_s = ending.close_s;
            run.record.adaptive = Some(run.schedule.record().clone());
            if outcome.is_ok() {
                finish_verdict(plan, &run.workload, run.record);
            }
            let several = (lanes > 1).then_some((lanes as u32, &run.serial));
            end_record_on(plan, run.record, run.phases, several, started, outcome);
            results.write_record(run.record)
        },
    )
    .await?;
    Ok(record)
}

struct Run<'a> {
    plan: &'a RunPlan,
    /// Every block's workload, its filler sized once the engines are up with
    /// `--pressure` (run's sizing).
    workload: Workload,
    results: &'a ResultsDir,
    record: &'a mut RunRecord,
    phases: &'a mut Phases,
    /// What every replica set spent (the target's rates), where there are several.
    serial: Phases,
    schedule: &'a mut Schedule,
}

impl Run<'_> {
    /// The pairs of the schedule, one per replica set at a time (one after another on a
    /// single set), each pair's two blocks one after the other on its set, fed to the
    /// e-process in order; a pair that ran after the deciding one is counted in the
    /// pooled arms only.
    async fn blocks(&mut self, beds: &mut [Testbed<'_>]) -> anyhow::Result<()> {
        let editing = Instant::now();
        for bed in beds.iter_mut() {
            bed.pin(&self.plan.pins)?;
        }
        self.phases.edit_s += editing.elapsed().as_secs_f64();
        self.workload = super::run::sized_workload(
            self.plan,
            &self.workload,
            &mut beds[0],
            self.record,
            self.phases,
        )
        .await?;
        let classifier = Arc::new(self.plan.target.classifier(&self.workload)?);
        loop {
            beds[0].check_cancelled()?;
            let pairs = self.schedule.next_pairs(beds.len() as u64);
            if pairs.is_empty() {
                return Ok(());
            }
            let workloads: Vec<Workload> = pairs
                .iter()
                .map(|pair| {
                    let mut w = self.workload.clone();
                    w.sessions = u32::try_from(pair[0].sessions).unwrap_or(u32::MAX);
                    w
                })
                .collect();
            let work = pairs
                .iter()
                .zip(&workloads)
                .map(|(pair, workload)| {
                    pair.iter()
                        .map(|b| BlockSpec {
                            label: b.label,
                            repeat: u32::try_from(b.pair - 1).unwrap_or(u32::MAX),
                            workload,
                        })
                        .collect()
                })
                .collect();
            let ran = blocks_at_once(
                self.plan,
                beds,
                work,
                self.results,
                &classifier,
                self.record,
                (self.phases, &mut self.serial),
            )
            .await;
            let mut failed = None;
            for (pair, lane) in pairs.iter().zip(ran) {
                let whole = lane.ran.len() == 2;
                let mut outcomes = Vec::new();
                for block in lane.ran {
                    outcomes.push(BlockOutcome {
                        sessions: block.outcomes,
                        restart_s: block.restart_s,
                        drive_s: block.drive_s,
                    });
                    self.record.runs.push(block.arm);
                }
                self.record.arms = pooled_arms(self.plan, &self.record.runs);
                if let Some(e) = lane.failed {
                    failed.get_or_insert(e);
                }
                let (true, Ok(outcomes)) = (whole, <[BlockOutcome; 2]>::try_from(outcomes)) else {
                    continue;
                };
                let planning = Instant::now();
                let decided = self.schedule.pair_done(pair, outcomes);
                self.phases.plan_s += planning.elapsed().as_secs_f64();
                match decided {
                    Ok(decision) => self.after_pair(beds[0].progress(), pair[0].pair, decision),
                    Err(AdaptiveError::Finished) => beds[0].progress().note(&format!(
                        "block pair {} ran beside the pair that decided: its sessions count in \
                         the pooled arms, not in the e-process",
                        pair[0].pair
                    )),
                    Err(e) => return Err(e.into()),
                }
            }
            self.record.adaptive = Some(self.schedule.record().clone());
            write_timed(self.results, self.record, self.phases)?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
    }

    /// The blocking checks after a pair, recorded; a failed one, over the pair or over
    /// the pooled blocks, stops the run (it voids the verdict, so more blocks would not
    /// make it valid). Says where the e-process stands.
    fn after_pair(&mut self, progress: &dyn Progress, pair: u64, decision: Decision) {
        let check = pair_check(self.plan, &self.workload, self.record, pair);
        let failed: Vec<&str> = check
            .pair_blocking
            .iter()
            .chain(&check.pooled_blocking)
            .map(String::as_str)
            .collect();
        if !failed.is_empty() {
            self.schedule.stop(format!(
                "a blocking check failed after block pair {pair}: {}",
                failed.join("; ")
            ));
        }
        self.schedule.add_check(check);
        if let Some(look) = self.schedule.record().looks.last() {
            let l = &look.record;
            progress.note(&format!(
                "look {} (block pair {pair}): on {}/{} vs off {}/{}, e-value {} (implicates at {}), \
                 always-valid interval {} to {} points: {}",
                l.look,
                l.on.corrupted,
                l.on.sessions,
                l.off.corrupted,
                l.off.sessions,
                e_value_text(l.e_value),
                e_value_text(l.threshold),
                percent_digits(l.diff_interval[0]),
                percent_digits(l.diff_interval[1]),
                decision_word(&decision)
            ));
        }
    }
}

/// `continue`, `implicated (on)`, `cleared`, `underpowered`.
pub(crate) fn decision_word(decision: &Decision) -> String {
    match decision {
        Decision::Continue => "continue".into(),
        Decision::Implicated { direction } => format!("implicated ({direction:?})").to_lowercase(),
        Decision::Cleared => "cleared".into(),
        Decision::Underpowered { .. } => "underpowered".into(),
    }
}

/// The checks of a fixed run over the pair's two blocks, over all blocks pooled, and the
/// load each block of the pair reached.
fn pair_check(plan: &RunPlan, workload: &Workload, record: &RunRecord, pair: u64) -> PairCheck {
    let params = workload.params_json();
    let pair_blocks = &record.runs[record.runs.len().saturating_sub(2)..];
    let load_shortfall = pair_blocks
        .iter()
        .filter_map(|b| {
            load_shortfall(&b.observe(&params), &plan.policy)
                .map(|s| format!("block pair {pair}: {s}"))
        })
        .collect();
    PairCheck {
        pair,
        pair_blocking: blocking_notes(plan, &params, pair_blocks, &[]),
        pooled_blocking: blocking_notes(
            plan,
            &params,
            &record.arms,
            &record.block_observations(&params),
        ),
        load_shortfall,
    }
}

/// The notes of the blocking confounds between the `on` and `off` records in `arms`,
/// with `blocks` each checked on its own (as the verdict does).
fn blocking_notes(
    plan: &RunPlan,
    params: &serde_json::Value,
    arms: &[ArmRecord],
    blocks: &[ArmObservation],
) -> Vec<String> {
    let find = |label| arms.iter().find(|a| a.label == label);
    let (Some(on), Some(off)) = (find(ArmLabel::On), find(ArmLabel::Off)) else {
        return Vec::new();
    };
    confounds(
        &on.observe(params),
        &off.observe(params),
        blocks,
        &plan.policy,
    )
    .into_iter()
    .filter(|c| c.severity == Severity::Blocking)
    .map(|c| c.note)
    .collect()
}

fn finish_verdict(plan: &RunPlan, workload: &Workload, record: &mut RunRecord) {
    let (Some(on), Some(off), Some(seq)) = (
        record.arm(ArmLabel::On),
        record.arm(ArmLabel::Off),
        record.adaptive.as_ref(),
    ) else {
        return;
    };
    let params = workload.params_json();
    let (comparison, confounds, verdict) = adaptive::verdict(
        &on.observe(&params),
        &off.observe(&params),
        &record.block_observations(&params),
        &plan.policy,
        &plan.flag.name,
        seq,
    );
    record.comparison = Some(comparison);
    record.confounds = confounds;
    record.verdict = Some(verdict);
}

/// Earlier runs' initial plans, in bisect's state directory (`plans.json`): planning
/// simulates the stopping rule (0.2-0.8 s on a 2-core machine, before the first restart)
/// and its result is a pure function of the goal and the concurrency, so a plan is kept
/// and reused, keyed by those and by the running executable's size and modification time
/// (a rebuilt planner never reads an older one's plans). Any failure to read or write it
/// only means planning again.
struct PlanCache {
    path: PathBuf,
    /// The running executable: size and modification time.
    executable: String,
    /// The goal and the concurrency.
    goal: String,
}

/// `plans.json`: one executable's plans, goal -> (block, cap).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct KeptPlans {
    executable: String,
    plans: std::collections::BTreeMap<String, (u64, u64)>,
}

impl PlanCache {
    fn new(root: PathBuf, spec: AdaptiveSpec) -> Option<PlanCache> {
        if spec.max_sessions.is_some() {
            return None;
        }
        let exe = std::fs::metadata(std::env::current_exe().ok()?).ok()?;
        let built = exe
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos();
        let g = spec.goal;
        Some(PlanCache {
            path: root.join("plans.json"),
            executable: format!("{} bytes, modified {built} ns", exe.len()),
            goal: format!(
                "alpha {} power {} min_effect {} baseline {} clear_alpha {}; concurrency {}",
                g.alpha, g.power, g.min_effect, g.baseline, g.clear_alpha, spec.concurrency
            ),
        })
    }

    /// This executable's plans; another's are stale (a rebuilt planner may plan otherwise).
    fn kept(&self) -> KeptPlans {
        std::fs::read(&self.path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<KeptPlans>(&bytes).ok())
            .filter(|kept| kept.executable == self.executable)
            .unwrap_or_else(|| KeptPlans {
                executable: self.executable.clone(),
                plans: Default::default(),
            })
    }

    fn read(&self) -> Option<(u64, u64)> {
        self.kept().plans.get(&self.goal).copied()
    }

    fn write(&self, block: u64, cap: u64) {
        let mut kept = self.kept();
        kept.plans.insert(self.goal.clone(), (block, cap));
        if let (Ok(text), Some(dir)) = (serde_json::to_vec_pretty(&kept), self.path.parent()) {
            let _ = std::fs::create_dir_all(dir);
            let _ = crate::results::write_atomic(&self.path, &text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(concurrency: u64, max_sessions: Option<u64>) -> AdaptiveSpec {
        AdaptiveSpec {
            goal: DesignGoal::default(),
            concurrency,
            max_sessions,
        }
    }

    #[test]
    fn a_plan_is_kept_per_goal_and_reused_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let at = |c| PlanCache::new(dir.path().to_path_buf(), spec(c, None)).unwrap();
        assert_eq!(at(80).read(), None);
        let planned = adaptive::plan(DesignGoal::default(), 80, None).unwrap();
        at(80).write(planned.0, planned.1);
        at(40).write(40, 480);
        assert_eq!(at(80).read(), Some(planned));
        assert_eq!(at(40).read(), Some((40, 480)));
        // The schedule built from the kept plan is the one planning gives.
        let fresh = Schedule::with_plan(spec(80, None), None).unwrap();
        let kept = Schedule::with_plan(spec(80, None), at(80).read()).unwrap();
        assert_eq!(fresh.record().design, kept.record().design);
    }

    #[test]
    fn another_executables_plans_are_dropped_and_a_given_cap_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plans.json");
        std::fs::write(
            &path,
            r#"{"executable": "1 bytes, modified 2 ns", "plans": {"alpha 0.01 ...": [80, 560]}}"#,
        )
        .unwrap();
        let cache = PlanCache::new(dir.path().to_path_buf(), spec(80, None)).unwrap();
        cache.write(80, 480);
        let kept: KeptPlans = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(kept.plans.len(), 1, "{:?}", kept.plans);
        assert_eq!(cache.read(), Some((80, 480)));
        assert!(PlanCache::new(dir.path().to_path_buf(), spec(80, Some(160))).is_none());
        // A broken file only means planning again.
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(cache.read(), None);
    }
}
