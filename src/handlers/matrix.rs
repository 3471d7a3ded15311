//! `bisect matrix PLAN.toml` and `bisect merge DIR...`: run (or join) a matrix, compare
//! it with its baseline night, print the summary and map regressions to exit code 1
//! (blocked or inconclusive cells of a whole matrix to 3).

use std::path::Path;
use std::process::ExitCode;

use super::{engines, recover_journal};
use crate::cli::matrix::{matrix_id, BaselineArgs};
use crate::cli::{command_line, MatrixArgs, MergeArgs};
use crate::progress::Lines;
use bisect_harness::commands::matrix::record::{CellRecord, CellStatus, MatrixRecord};
use bisect_harness::commands::matrix::{
    baseline, export, lanes, merge as shards, record, run as matrix_run,
};
use bisect_harness::commands::EnginePlan;
use bisect_harness::exit::{self, Failure, Problem};
use bisect_harness::results::Exporter;

pub(crate) async fn matrix(args: &MatrixArgs) -> anyhow::Result<ExitCode> {
    recover_journal(&args.output.journal_dir())?;
    let job = args.job()?;
    let (mut control, cancel) = engines(job.engines())?;
    if let Some(note) = job.single_lane_note() {
        stderr_line!("{note}");
    }
    stderr_line!(
        "matrix {}: {} cells, results: {}",
        job.plan.name,
        job.cells().len(),
        job.dir.display()
    );
    let progress = Lines::new(false);
    let mut record = if job.uses_replicas() && !job.target.replicas.is_empty() {
        let mut others = super::other_sets(&job.target, &job.dir, job.api_key.clone())?;
        let controls = super::every_set(&mut control, &mut others);
        stderr_line!(
            "replicas {}: the restart groups dealt to the sets (group g on set g mod {}), run at once, merged",
            job.target.replica_names(),
            job.target.replicas.len() + 1
        );
        lanes::run_on_replicas(&job, controls, &progress, cancel).await?
    } else {
        matrix_run::run_matrix(&job, &mut control, &progress, cancel).await?
    };
    // A shard is compared when the shards are merged: the rule is matrix-wide.
    if job.shard.is_none() {
        compare_with_baseline(&mut record, &args.baseline, &args.output.results, &job.dir)?;
    }
    finish(&record, &job.dir, args.output.json)
}

pub(crate) fn merge(args: &MergeArgs) -> anyhow::Result<ExitCode> {
    let first = record::read_matrix(&args.dirs[0]).map_err(|e| {
        Failure::bad_input(
            format!("{e:#}"),
            "pass directories written by `bisect matrix --shard I/N`",
        )
    })?;
    let out = match &args.out {
        Some(o) => o.clone(),
        None => args.output.results.join(matrix_id(&first.plan.name)),
    };
    let id = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| matrix_id(&first.plan.name));
    let merged = shards::join(&args.dirs, &id, &command_line())?;
    shards::write(&merged, &out)?;
    let mut record = merged.record;
    let root = out.parent().unwrap_or(Path::new("."));
    compare_with_baseline(&mut record, &args.baseline, root, &out)?;
    finish(&record, &out, args.output.json)
}

/// Unless `--no-baseline`: compare with `--baseline DIR`, else the newest earlier night
/// of the plan under `root`; rewrite `dir`'s files when there was one.
fn compare_with_baseline(
    record: &mut MatrixRecord,
    args: &BaselineArgs,
    root: &Path,
    dir: &Path,
) -> anyhow::Result<()> {
    if args.no_baseline {
        return Ok(());
    }
    let found = match &args.baseline {
        Some(b) => Some(baseline::load_explicit(b, &record.plan.name)?),
        None => baseline::find_newest(root, &record.plan.name, &record.header.started_at, dir)?,
    };
    if let Some(b) = found {
        let policy = record.plan.policy;
        baseline::compare(record, &b, &policy);
        export::write_all(dir, record)?;
    }
    Ok(())
}

fn finish(record: &MatrixRecord, dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(record)?);
    } else {
        // The summary.md written beside it, rendered from the record in hand (not read
        // back from disk, where a concurrent writer or a full disk could differ).
        let summary = export::markdown::MatrixSummary;
        print!("{}", summary.render_in(record, dir)?);
        println!("\nresults: {}", dir.display());
    }
    Ok(ExitCode::from(exit_code(record)))
}

/// 1 on a regression; else 3 when a whole matrix holds blocked cells or compared cells
/// that are inconclusive (cells that could not be checked, or whose measurement cannot
/// show them ok, are no pass); else 0. A shard leaves the night's result to the merge,
/// so a scheduler still runs the merge job after it.
fn exit_code(record: &MatrixRecord) -> u8 {
    let ids = |keep: &dyn Fn(&CellRecord) -> bool| -> Vec<&str> {
        record
            .cells
            .iter()
            .filter(|c| keep(c))
            .map(|c| c.id.as_str())
            .collect()
    };
    let blocked = ids(&|c| c.is_blocked());
    let inconclusive = ids(&|c| c.verdict() == Some(CellStatus::Inconclusive));
    if !record.regressions.is_empty() {
        return exit::REGRESSION;
    }
    if record.shard.is_some() || (blocked.is_empty() && inconclusive.is_empty()) {
        return exit::OK;
    }
    if !blocked.is_empty() {
        let problem = Problem::new(
            format!(
                "{} cell(s) blocked: the engine did not run the cell's configuration ({}); reasons in summary.md",
                blocked.len(),
                blocked.join(", ")
            ),
            "make the launch configs apply the flags (see the reasons), then run the matrix again",
        );
        stderr_line!("{problem}");
    }
    if !inconclusive.is_empty() {
        let problem = Problem::new(
            format!(
                "{} cell(s) inconclusive: no regression found, but the measurement cannot show the cell ok ({}); reasons in summary.md",
                inconclusive.len(),
                inconclusive.join(", ")
            ),
            "see each reason (raise max_tokens, restore the engine's load or its metrics), then run the matrix again",
        );
        stderr_line!("{problem}");
    }
    exit::COULD_NOT_RUN
}
