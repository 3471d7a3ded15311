//! `bisect matrix PLAN.toml` and `bisect merge DIR...`: clap arguments and the glue that
//! turns them into a [`MatrixJob`], runs it, compares with the baseline and maps the
//! outcome to the exit code (1 on any regressed cell, 0 otherwise).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{progress, runtime, spawn_signal_handler, usage};
use bisect_harness::commands::matrix::baseline::{self, Baseline};
use bisect_harness::commands::matrix::export;
use bisect_harness::commands::matrix::merge;
use bisect_harness::commands::matrix::record::MatrixRecord;
use bisect_harness::commands::matrix::run::{self as matrix_run, MatrixJob};
use bisect_harness::commands::matrix::{Plan, Shard};
use bisect_harness::config::TargetProfile;
use bisect_harness::exit;

#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// The plan (TOML): target, workload, axes or cells, repeats, thresholds.
    plan: PathBuf,
    /// Compare with this matrix directory instead of the newest earlier one of the plan.
    #[arg(long, conflicts_with = "no_baseline")]
    baseline: Option<PathBuf>,
    /// Compare with nothing (a first night, or a run that must not fail on regressions).
    #[arg(long = "no-baseline")]
    no_baseline: bool,
    /// Run only shard I of N (0 <= I < N): whole restart groups, group g in shard g mod N.
    /// Shards are compared with the baseline when merged (`bisect merge`).
    #[arg(long)]
    shard: Option<Shard>,
    /// Results root; the matrix goes to DIR/<matrix-id>/.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Print matrix.json instead of the summary.
    #[arg(long)]
    json: bool,
    /// Allow a flag whose setting also appears in a role it does not list.
    #[arg(long = "allow-partial")]
    allow_partial: bool,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Shard directories written by `bisect matrix --shard I/N`, one per shard.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// The merged matrix directory (default: RESULTS/<matrix-id>/).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Results root for the default --out and the baseline search.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Compare with this matrix directory instead of the newest earlier one of the plan.
    #[arg(long, conflicts_with = "no_baseline")]
    baseline: Option<PathBuf>,
    #[arg(long = "no-baseline")]
    no_baseline: bool,
    /// Print matrix.json instead of the summary.
    #[arg(long)]
    json: bool,
}

pub fn matrix(args: MatrixArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(matrix_cmd(args))
}

async fn matrix_cmd(args: MatrixArgs) -> anyhow::Result<ExitCode> {
    // A journal left by a run that died (kill -9) is replayed before anything else.
    for p in bisect_harness::launch::recover(&args.results.join(".bisect-journal"))? {
        eprintln!(
            "restored {} left edited by an earlier run that did not finish",
            p.display()
        );
    }
    let plan = Plan::load(&args.plan)?;
    if args.shard.is_some() && args.baseline.is_some() {
        return Err(usage(
            "--baseline with --shard: the regression rule is Holm-corrected across the whole matrix",
            "run the shards without --baseline and pass it to `bisect merge`",
        ));
    }
    let mut id = matrix_id(&plan.name);
    if let Some(s) = &args.shard {
        id.push_str(&format!("-shard{}of{}", s.index, s.count));
    }
    let dir = args.results.join(&id);
    let target = match &plan.target {
        Some(path) => TargetProfile::load(path)?,
        None => {
            let exe = std::env::current_exe().context("locating the bisect executable")?;
            bisect_harness::config::embedded::prepare(&dir.join("launch"), &exe)?
        }
    };
    let api_key = match &target.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            usage(
                format!("the target's api_key_env names ${var}, which is not set"),
                format!("export {var}=... before running, or remove api_key_env from the profile"),
            )
        })?),
        None => None,
    };
    let job = MatrixJob {
        id,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        plan,
        target,
        shard: args.shard,
        dir: dir.clone(),
        journal_dir: args.results.join(".bisect-journal"),
        api_key,
        metrics_period: Duration::from_millis(250),
        allow_partial: args.allow_partial,
    };
    let cancel = CancellationToken::new();
    spawn_signal_handler(cancel.clone());
    let mut control = bisect_harness::control::ProcessControl::new(&job.target, &dir.join("logs"))?;
    eprintln!(
        "matrix {}: {} cells, results: {}",
        job.plan.name,
        job.cells().len(),
        dir.display()
    );
    let progress = progress::Lines::new(false);
    let mut record = matrix_run::run_matrix(&job, &mut control, &progress, cancel).await?;
    if job.shard.is_none() && !args.no_baseline {
        let found = match &args.baseline {
            Some(b) => Some(baseline::load_explicit(b, &job.plan.name)?),
            None => baseline::find_newest(&args.results, &job.plan.name, &record.started_at, &dir)?,
        };
        if let Some(b) = found {
            baseline::compare(&mut record, &b, &job.plan.policy);
            export::write_all(&dir, &record)?;
        }
    }
    finish(&record, &dir, args.json)
}

pub fn merge(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let first = export::read_matrix(&args.dirs[0]).map_err(|e| {
        bisect_harness::exit::Failure::BadInput(format!(
            "{e:#}\n  fix: pass directories written by `bisect matrix --shard I/N`"
        ))
    })?;
    let out = match &args.out {
        Some(o) => o.clone(),
        None => args.results.join(matrix_id(&first.plan.name)),
    };
    let id = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| matrix_id(&first.plan.name));
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let merged = merge::join(&args.dirs, &id, &command)?;
    merge::write(&merged, &out)?;
    let mut record = merged.record;
    if !args.no_baseline {
        let root = out.parent().unwrap_or(Path::new("."));
        let found: Option<Baseline> = match &args.baseline {
            Some(b) => Some(baseline::load_explicit(b, &record.plan.name)?),
            None => baseline::find_newest(root, &record.plan.name, &record.started_at, &out)?,
        };
        if let Some(b) = found {
            let policy = record.plan.policy;
            baseline::compare(&mut record, &b, &policy);
            export::write_all(&out, &record)?;
        }
    }
    finish(&record, &out, args.json)
}

fn finish(record: &MatrixRecord, dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(record)?);
    } else {
        print!("{}", std::fs::read_to_string(dir.join("summary.md"))?);
        println!("\nresults: {}", dir.display());
    }
    Ok(ExitCode::from(if record.regressions.is_empty() {
        exit::OK
    } else {
        exit::REGRESSION
    }))
}

fn matrix_id(plan: &str) -> String {
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S%.3f");
    format!("{stamp}-matrix-{plan}")
}
