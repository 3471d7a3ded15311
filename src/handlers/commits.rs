//! `bisect commits`: the simulation benchmark (`--simulate`), or the search on a
//! repository: engine controls made per commit's target, the record printed, the exit
//! code from the answer (0 culprit found and verified, 1 no culprit, 3 inconclusive).

use std::process::ExitCode;

use super::{print_record, progress, runtime};
use crate::cli::CommitsArgs;
use crate::signals;
use bisect_harness::commands::commits::{self, block::ControlFactory};
use bisect_harness::control::{EngineControl, ProcessControl};
use bisect_harness::core::commits::simulate;

/// The seed of `--simulate`: the figures in docs/commits.md come from it.
const SIMULATE_SEED: u64 = 20;

pub(crate) fn commits(args: &CommitsArgs) -> anyhow::Result<ExitCode> {
    if args.simulate {
        let table = match args.parallel() {
            1 => simulate::benchmark_markdown(args.searches, &args.sizes, SIMULATE_SEED),
            k => simulate::parallel_markdown(args.searches, &args.sizes, &[1, k], SIMULATE_SEED),
        };
        print!("{table}");
        return Ok(ExitCode::SUCCESS);
    }
    let plan = args.plan()?;
    let output = &args.common.output;
    if matches!(plan.rounds, commits::slurm::Rounds::Replicas) {
        stderr_line!(
            "replicas {}: each round's {} commits at once, one per set; the ends and the verifying A/B on set {}",
            plan.target.replica_names(),
            plan.parallel,
            plan.target.replica_name()
        );
    } else if let Some(note) = bisect_harness::commands::first_set_note(&plan.target) {
        stderr_line!("{note}");
    }
    if let Some(round) = &args.round_task {
        let controls = controls(&plan);
        let progress = progress(output.json);
        return array_task(&plan, round, controls.as_ref(), progress.as_ref());
    }
    stderr_line!("results: {}", plan.dir.display());
    let record = search(&plan, output.json)?;
    print_record(
        output.json,
        &record,
        &commits::export::CommitsLine,
        &plan.dir,
    )?;
    Ok(ExitCode::from(commits::exit_code(&record)))
}

/// Engine controls made per commit's target, with the plan's API key.
fn controls(plan: &commits::CommitsPlan) -> Box<ControlFactory<'static>> {
    let api_key = plan.api_key.clone();
    Box::new(move |target, logs| {
        let control = ProcessControl::new(target, logs, api_key.clone())?;
        Ok(Box::new(control) as Box<dyn EngineControl>)
    })
}

/// The search of `plan` in this process, Ctrl-C wired, progress on stderr: what
/// `bisect commits` runs, and `bisect history --auto-bisect` for each regression.
pub(super) fn search(
    plan: &commits::CommitsPlan,
    json: bool,
) -> anyhow::Result<bisect_harness::commands::commits::record::CommitsRecord> {
    let controls = controls(plan);
    let progress = progress(json);
    runtime()?.block_on(async {
        let cancel = signals::cancel_on_signal();
        commits::run(plan, controls.as_ref(), progress.as_ref(), cancel).await
    })
}

/// One array task of a `--parallel` round: its step, written beside the round's plan.
fn array_task(
    plan: &commits::CommitsPlan,
    round: &std::path::Path,
    controls: &ControlFactory<'_>,
    progress: &dyn bisect_harness::arm::Progress,
) -> anyhow::Result<ExitCode> {
    let index: usize = std::env::var("SLURM_ARRAY_TASK_ID")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--round-task {}: SLURM_ARRAY_TASK_ID is not set: this runs as a task of the round's Slurm job array",
                round.display()
            )
        })?;
    runtime()?.block_on(async {
        let cancel = signals::cancel_on_signal();
        commits::task::run_task(plan, round, index, controls, progress, cancel).await
    })?;
    Ok(ExitCode::SUCCESS)
}
