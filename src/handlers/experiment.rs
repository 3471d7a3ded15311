//! `bisect run`, `bisect probe` and `bisect culprit`: restore what a dead run left, turn
//! the arguments into a plan, start the engines and run it, print the record.

use std::process::ExitCode;

use super::{engines, print_record, progress, recover_journal};
use crate::cli::{CulpritArgs, LoadArgs, ProbeArgs, RunArgs};
use crate::progress::Lines;
use bisect_harness::commands::adaptive;
use bisect_harness::commands::culprit;
use bisect_harness::commands::load;
use bisect_harness::commands::probe::{self, Outcome};
use bisect_harness::commands::run as experiment;
use bisect_harness::exit::{self, Failure};
use bisect_harness::results::{table, Exporter};

pub(crate) async fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let output = &args.common.output;
    recover_journal(&output.journal_dir())?;
    let plan = args.plan()?;
    let (mut control, cancel) = engines(&plan.target, &plan.run_dir, plan.api_key.as_deref())?;
    let progress = progress(output.json);
    stderr_line!("results: {}", plan.run_dir.display());
    let record = match args.adaptive() {
        Some(options) => {
            adaptive::run_adaptive(&plan, &options, &mut control, progress.as_ref(), cancel).await?
        }
        None => experiment::run_experiment(&plan, &mut control, progress.as_ref(), cancel).await?,
    };
    print_record(
        output.json,
        || serde_json::to_string_pretty(&record),
        || table::RunTable.render(&record),
        &plan.run_dir,
    )?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn culprit(args: &CulpritArgs) -> anyhow::Result<ExitCode> {
    let output = &args.common.output;
    recover_journal(&output.journal_dir())?;
    let plan = args.plan()?;
    let (mut control, cancel) = engines(&plan.target, &plan.dir, plan.api_key.as_deref())?;
    let progress = progress(output.json);
    stderr_line!("results: {}", plan.dir.display());
    let record = culprit::run(&plan, &mut control, progress.as_ref(), cancel).await?;
    print_record(
        output.json,
        || serde_json::to_string_pretty(&record),
        || culprit::export::table::CulpritTable.render(&record),
        &plan.dir,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `bisect load`: exit codes as `run` (0 finished whatever the answer).
pub(crate) async fn load(args: &LoadArgs) -> anyhow::Result<ExitCode> {
    let output = &args.common.output;
    recover_journal(&output.journal_dir())?;
    let plan = args.plan()?;
    let (mut control, cancel) = engines(&plan.target, &plan.dir, plan.api_key.as_deref())?;
    let progress = progress(output.json);
    stderr_line!("results: {}", plan.dir.display());
    let record = load::run(&plan, &mut control, progress.as_ref(), cancel).await?;
    print_record(
        output.json,
        || serde_json::to_string_pretty(&record),
        || bisect_harness::results::load::table::LoadTable.render(&record),
        &plan.dir,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Exit 0 clean, 1 corrupted, 125 could not tell (also when the probe could not run:
/// `git bisect` skips such a commit), 255 another bisect holds the target (`git bisect
/// run` stops), 130 interrupted.
pub(crate) async fn probe(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    recover_journal(&args.output.journal_dir())?;
    let plan = args.plan()?;
    let (mut control, cancel) = engines(&plan.target, &plan.run_dir, plan.api_key.as_deref())?;
    let progress = Lines::new(!args.output.json);
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
        || serde_json::to_string_pretty(&record),
        || Ok(format!("probe: {outcome:?}: {}\n", record.reason)),
        &plan.run_dir,
    )?;
    Ok(ExitCode::from(outcome.exit_code()))
}
