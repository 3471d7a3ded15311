//! `bisect run`, `bisect probe`, `bisect culprit` and `bisect load`: restore what a dead
//! run left, turn the arguments into a plan, start the engines and run it (`run`, a
//! fixed A/B `load` and a culprit search whose blocks split on every replica set),
//! print the record.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::{print_record, recover_journal, start};
use crate::cli::{OutputArgs, ProbeArgs};
use bisect_harness::commands::culprit::{self, record::CulpritRecord, CulpritPlan};
use bisect_harness::commands::load::{self, LoadPlan};
use bisect_harness::commands::probe::{self, Outcome, ProbeRecord};
use bisect_harness::commands::run::{self, Progress, RunPlan};
use bisect_harness::commands::EnginePlan;
use bisect_harness::commands::{adaptive, replicas};
use bisect_harness::control::EngineControl;
use bisect_harness::exit::{self, Failure};
use bisect_harness::results::load::LoadRecord;
use bisect_harness::results::run_record::RunRecord;
use bisect_harness::results::Exporter;

/// Restore what a dead run left, plan, start the engines the plan names, run it with
/// `execute`, print the record with `table`; exit 0 when it finished, whatever its
/// answer. The one path of `run`, `culprit` and `load`: each command's own lifecycle
/// (open the testbed, run its blocks, settle, close, write) is its `execute`.
pub(crate) async fn drive<P: EnginePlan, R: serde::Serialize>(
    output: &OutputArgs,
    plan: impl FnOnce() -> anyhow::Result<P>,
    execute: impl AsyncFnOnce(
        &P,
        &mut dyn EngineControl,
        &dyn Progress,
        CancellationToken,
    ) -> anyhow::Result<R>,
    table: &dyn Exporter<R>,
) -> anyhow::Result<ExitCode> {
    recover_journal(&output.journal_dir())?;
    let plan = plan()?;
    let mut started = start(output.json, plan.engines())?;
    let progress = started.progress.as_ref();
    if let Some(note) = plan.single_lane_note() {
        progress.note(&note);
    }
    let record = execute(&plan, &mut started.control, progress, started.cancel).await?;
    print_record(output.json, &record, table, plan.engines().results)?;
    Ok(ExitCode::SUCCESS)
}

/// `bisect run`: its arm blocks, or with `--adaptive` the sequential design's.
pub(crate) async fn run(
    plan: &RunPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<RunRecord> {
    let mut others = super::other_sets(&plan.target, &plan.run_dir, plan.api_key.clone())?;
    let controls = super::every_set(control, &mut others);
    match &plan.adaptive {
        Some(options) => adaptive::run_adaptive_on(plan, options, controls, progress, cancel).await,
        None if plan.target.replicas.is_empty() => {
            let [control] = <[_; 1]>::try_from(controls).map_err(|_| anyhow::anyhow!("one set"))?;
            run::run_experiment(plan, control, progress, cancel).await
        }
        None => replicas::run_on_replicas(plan, controls, progress, cancel).await,
    }
}

/// `bisect load`: its sweep on the first replica set, or a fixed A/B sweep on every set
/// at once (levels dealt to the sets).
pub(crate) async fn load(
    plan: &LoadPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<LoadRecord> {
    if !plan.uses_replicas() {
        return load::run(plan, control, progress, cancel).await;
    }
    let mut others = super::other_sets(&plan.target, &plan.dir, plan.api_key.clone())?;
    let controls = super::every_set(control, &mut others);
    progress.note(&format!(
        "replicas {}: the levels dealt to the sets (longest first, to the set with the least work), each level's on and off on one set, run at once",
        plan.target.replica_names(),
    ));
    load::run_on_replicas(plan, controls, progress, cancel).await
}

/// `bisect culprit`: on the first replica set, or with every block split over the sets
/// whose shares reach the load.
pub(crate) async fn culprit(
    plan: &CulpritPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<CulpritRecord> {
    if !plan.uses_replicas() {
        return culprit::run(plan, control, progress, cancel).await;
    }
    let mut others = super::other_sets(&plan.target, &plan.dir, plan.api_key.clone())?;
    let controls = super::every_set(control, &mut others);
    culprit::run_on_sets(plan, controls, progress, cancel).await
}

/// The probe's one line: its outcome and why.
struct ProbeLine;

impl Exporter<ProbeRecord> for ProbeLine {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, record: &ProbeRecord) -> anyhow::Result<String> {
        let outcome = record.outcome.unwrap_or(Outcome::Unknown);
        Ok(format!("probe: {outcome:?}: {}\n", record.reason))
    }
}

/// Exit 0 clean, 1 corrupted, 125 could not tell (also when the probe could not run:
/// `git bisect` skips such a commit), 255 another bisect holds the target (`git bisect
/// run` stops), 130 interrupted.
pub(crate) async fn probe(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    recover_journal(&args.output.journal_dir())?;
    let plan = args.plan()?;
    let (mut control, cancel) = super::engines(plan.engines())?;
    let progress = crate::progress::Lines::new(!args.output.json);
    if let Some(note) = plan.single_lane_note() {
        progress.note(&note);
    }
    let record = match probe::run_probe(&plan, &mut control, &progress, cancel).await {
        Ok(r) => r,
        Err(e) if matches!(e.downcast_ref::<Failure>(), Some(Failure::Interrupted)) => {
            return Err(e)
        }
        Err(e)
            if e.chain()
                .any(|c| matches!(c.downcast_ref::<Failure>(), Some(Failure::Busy(_)))) =>
        {
            stderr_line!("probe could not run: {e:#}\n  git bisect run stops here (exit 255): another bisect holds the target");
            return Ok(ExitCode::from(exit::PROBE_ABORT));
        }
        Err(e) => {
            // git bisect treats 125 as "skip this commit": a build that cannot serve.
            stderr_line!("probe could not run: {e:#}");
            return Ok(ExitCode::from(exit::PROBE_UNKNOWN));
        }
    };
    let outcome = record.outcome.unwrap_or(Outcome::Unknown);
    print_record(
        args.output.json,
        &record,
        &ProbeLine,
        plan.engines().results,
    )?;
    Ok(ExitCode::from(outcome.exit_code()))
}
