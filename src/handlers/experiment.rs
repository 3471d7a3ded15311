//! `bisect run`, `bisect probe`, `bisect culprit` and `bisect load`: restore what a dead
//! run left, turn the arguments into a plan, start the engines and run it, print the
//! record.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::{print_record, recover_journal, start};
use crate::cli::{CulpritArgs, LoadArgs, OutputArgs, ProbeArgs, RunArgs};
use bisect_harness::commands::adaptive;
use bisect_harness::commands::culprit;
use bisect_harness::commands::load;
use bisect_harness::commands::probe::{self, Outcome, ProbeRecord};
use bisect_harness::commands::run;
use bisect_harness::commands::run::Progress;
use bisect_harness::commands::EnginePlan;
use bisect_harness::control::ProcessControl;
use bisect_harness::exit::{self, Failure};
use bisect_harness::results::run_record::RunRecord;
use bisect_harness::results::{self, table, Exporter};

/// A command that runs experiments on the target's engines and writes one record: the
/// steps every such command shares live in [`drive`], the differences here (its plan
/// says whose engines and where, through [`EnginePlan`]).
pub(crate) trait Experiment {
    type Plan: EnginePlan;
    type Record: serde::Serialize + 'static;
    fn output(&self) -> &OutputArgs;
    fn plan(&self) -> anyhow::Result<Self::Plan>;
    async fn execute(
        &self,
        plan: &Self::Plan,
        control: &mut ProcessControl,
        progress: &dyn Progress,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self::Record>;
    fn table() -> &'static dyn Exporter<Self::Record>;
}

/// Restore what a dead run left, plan, start the engines, run, print the record; exit 0
/// when it finished, whatever its answer.
pub(crate) async fn drive<E: Experiment>(args: &E) -> anyhow::Result<ExitCode> {
    let output = args.output();
    recover_journal(&output.journal_dir())?;
    let plan = args.plan()?;
    let dir = plan.engines().results;
    let mut started = start(output.json, plan.engines())?;
    let progress = started.progress.as_ref();
    let record = args
        .execute(&plan, &mut started.control, progress, started.cancel)
        .await?;
    print_record(output.json, &record, E::table(), dir)?;
    Ok(ExitCode::SUCCESS)
}

impl Experiment for RunArgs {
    type Plan = run::RunPlan;
    type Record = RunRecord;
    fn output(&self) -> &OutputArgs {
        &self.common.output
    }
    fn plan(&self) -> anyhow::Result<Self::Plan> {
        RunArgs::plan(self)
    }
    async fn execute(
        &self,
        plan: &Self::Plan,
        control: &mut ProcessControl,
        progress: &dyn Progress,
        cancel: CancellationToken,
    ) -> anyhow::Result<RunRecord> {
        match self.adaptive() {
            Some(options) => {
                adaptive::run_adaptive(plan, &options, control, progress, cancel).await
            }
            None => run::run_experiment(plan, control, progress, cancel).await,
        }
    }
    fn table() -> &'static dyn Exporter<RunRecord> {
        &table::RunTable
    }
}

impl Experiment for CulpritArgs {
    type Plan = culprit::CulpritPlan;
    type Record = culprit::record::CulpritRecord;
    fn output(&self) -> &OutputArgs {
        &self.common.output
    }
    fn plan(&self) -> anyhow::Result<Self::Plan> {
        CulpritArgs::plan(self)
    }
    async fn execute(
        &self,
        plan: &Self::Plan,
        control: &mut ProcessControl,
        progress: &dyn Progress,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self::Record> {
        culprit::run(plan, control, progress, cancel).await
    }
    fn table() -> &'static dyn Exporter<Self::Record> {
        &culprit::export::table::CulpritTable
    }
}

impl Experiment for LoadArgs {
    type Plan = load::LoadPlan;
    type Record = results::load::LoadRecord;
    fn output(&self) -> &OutputArgs {
        &self.common.output
    }
    fn plan(&self) -> anyhow::Result<Self::Plan> {
        LoadArgs::plan(self)
    }
    async fn execute(
        &self,
        plan: &Self::Plan,
        control: &mut ProcessControl,
        progress: &dyn Progress,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self::Record> {
        load::run(plan, control, progress, cancel).await
    }
    fn table() -> &'static dyn Exporter<Self::Record> {
        &results::load::table::LoadTable
    }
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
