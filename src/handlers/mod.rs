//! Running a parsed command line: each handler takes its command's validated plan
//! (built by `cli`), drives the harness or the embedded engine, and prints the result.
//! Returns the exit code of a finished command; errors are mapped by `main`.
//!
//! - [`experiment`]: `run`, `probe`, `culprit` and `load`, which start engines and edit their
//!   launch configs.
//! - [`matrix`]: `matrix` and `merge`, and the comparison with a baseline night.
//! - [`history`]: `history`, the nights read as a history, and its automatic searches.
//! - [`results`]: `report`, `diff` and `reclassify`, which read results directories.
//! - [`tools`]: `flags`, `kernels`, `restore` and `engine`.

mod commits;
mod experiment;
mod history;
mod matrix;
mod results;
mod tools;

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, Command};
use crate::{progress, signals};
use bisect_harness::commands::run::Progress;
use bisect_harness::commands::{culprit, Engines};
use bisect_harness::control::{EngineControl, ProcessControl};
use bisect_harness::results::load as load_record;
use bisect_harness::results::{table, Exporter};

/// Run a parsed command line to its exit code.
pub(crate) fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // A bad --restart-cost or --session-cost is refused whether or not --dry-run reads it.
    if let Some(cost) = cli.command.cost_args() {
        cost.units()?;
    }
    match cli.command {
        Command::Engine(args) => tools::engine(args),
        Command::MockEngine(args) => {
            crate::cli::engine::run_mock(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Flags(args) => tools::flags(&args),
        Command::Check(args) => runtime()?.block_on(tools::check(&args)),
        Command::Kernels => tools::kernels(),
        Command::Restore(args) => tools::restore(&args),
        Command::Report(args) => results::report(&args.dir, args.json),
        Command::Diff(args) => results::diff(&args),
        Command::Reclassify(args) => results::reclassify(&args),
        Command::Merge(args) => matrix::merge(&args),
        Command::History(args) => history::history(&args),
        Command::Matrix(args) if args.cost.dry_run => {
            dry_run(&args.job()?.planned_cost(args.cost.units()?))
        }
        Command::Matrix(args) => runtime()?.block_on(matrix::matrix(&args)),
        Command::Run(args) if args.cost.dry_run => {
            let plan = args.plan()?;
            dry_run(&bisect_harness::commands::run::planned_cost(&plan))
        }
        Command::Culprit(args) if args.cost.dry_run => {
            dry_run(&args.plan()?.planned_cost(args.cost.units()?))
        }
        Command::Load(args) if args.cost.dry_run => {
            dry_run(&args.plan()?.planned_cost(args.cost.units()?))
        }
        Command::Commits(args) if args.cost.dry_run => {
            dry_run(&args.plan()?.planned_cost(args.cost.units()?))
        }

        Command::Run(args) => runtime()?.block_on(experiment::drive(
            &args.common.output,
            || args.plan(),
            experiment::run,
            &table::RunTable,
        )),
        Command::Probe(args) => runtime()?.block_on(experiment::probe(&args)),
        Command::Culprit(args) => runtime()?.block_on(experiment::drive(
            &args.common.output,
            || args.plan(),
            experiment::culprit,
            &culprit::export::table::CulpritTable,
        )),
        Command::Load(args) => runtime()?.block_on(experiment::drive(
            &args.common.output,
            || args.plan(),
            experiment::load,
            &load_record::table::LoadTable,
        )),
        Command::Commits(args) => commits::commits(&args),
    }
}

/// `--dry-run`: the planned cost, and nothing touched.
fn dry_run(planned: &bisect_harness::core::cost::Planned) -> anyhow::Result<ExitCode> {
    println!("{}", planned.words);
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Restore the launch configs a run that died (kill -9) left edited: every command that
/// edits them replays its journal before anything else.
fn recover_journal(journal_dir: &Path) -> anyhow::Result<()> {
    let recovery = bisect_harness::launch::recover(journal_dir)?;
    for p in &recovery.restored {
        stderr_line!(
            "restored {} left edited by an earlier run that did not finish",
            p.display()
        );
    }
    for kept in &recovery.kept {
        stderr_line!("warning: {kept}");
    }
    for gone in &recovery.gone {
        stderr_line!("{}", bisect_harness::launch::gone_words(gone));
    }
    Ok(())
}

/// Control of the target's engines (their logs under `dir/logs`, their self-reports read
/// with `api_key`) and the cancellation Ctrl-C or SIGTERM triggers, which stops them and
/// restores the launch configs. The target's own launch scripts (the embedded
/// engine's) are written here first: the command line's parser writes nothing.
fn engines(engines: Engines<'_>) -> anyhow::Result<(ProcessControl, CancellationToken)> {
    let Engines {
        target,
        results,
        api_key,
    } = engines;
    target.write_launch_scripts()?;
    let cancel = signals::cancel_on_signal();
    let control = ProcessControl::new(target, &results.join("logs"), api_key.map(String::from))?;
    Ok((control, cancel))
}

/// Control of every replica set of `target` but the first (whose control [`engines`]
/// makes, the one every command starts): none on a single replica; each set's engine
/// logs in `results/logs/replica-NAME/`.
fn other_sets(
    target: &bisect_harness::config::TargetProfile,
    results: &Path,
    api_key: Option<String>,
) -> anyhow::Result<Vec<ProcessControl>> {
    let logs = results.join("logs");
    target
        .replica_sets()
        .iter()
        .skip(1)
        .map(|set| {
            ProcessControl::new(
                set,
                &logs.join(format!("replica-{}", set.replica_name())),
                api_key.clone(),
            )
        })
        .collect()
}

/// The first set's control followed by every other set's (`others`, from
/// [`other_sets`]), in the target's order: what a command on every replica set drives.
fn every_set<'c>(
    first: &'c mut dyn EngineControl,
    others: &'c mut [ProcessControl],
) -> Vec<&'c mut dyn EngineControl> {
    let mut controls: Vec<&'c mut dyn EngineControl> = vec![first];
    controls.extend(others.iter_mut().map(|c| c as &mut dyn EngineControl));
    controls
}

/// Progress on stderr: plain lines with `--json` or without a terminal (per session
/// unless `--json`), a bar on a terminal.
fn progress(json: bool) -> Box<dyn Progress> {
    if json {
        Box::new(progress::Lines::new(false))
    } else if std::io::stderr().is_terminal() {
        Box::new(progress::Bar::new())
    } else {
        Box::new(progress::Lines::new(true))
    }
}

/// The engines of a command that runs experiments, with Ctrl-C wired and progress shown.
struct Started {
    control: ProcessControl,
    cancel: CancellationToken,
    progress: Box<dyn Progress>,
}

/// Start what an experiment command needs: its engines' control ([`engines`]) and
/// progress, and say where its results go.
fn start(json: bool, plan: Engines<'_>) -> anyhow::Result<Started> {
    let (control, cancel) = engines(plan)?;
    let progress = progress(json);
    stderr_line!("results: {}", plan.results.display());
    Ok(Started {
        control,
        cancel,
        progress,
    })
}

/// The finished record: as JSON with `--json`, else its table and where it is kept.
fn print_record<R: serde::Serialize>(
    json: bool,
    record: &R,
    table: &dyn Exporter<R>,
    dir: &Path,
) -> anyhow::Result<()> {
    use bisect_harness::redact::scrub;
    if json {
        println!("{}", scrub(&serde_json::to_string_pretty(record)?));
    } else {
        print!("{}", scrub(&table.render(record)?));
        println!("results: {}", dir.display());
    }
    Ok(())
}
