//! `bisect matrix PLAN.toml` and `bisect merge DIR...`: clap arguments and their
//! conversion into a [`MatrixJob`].

use std::path::PathBuf;

use clap::Args;

use super::{command_line, resolve_target, run_id, usage, OutputArgs, METRICS_PERIOD};
use bisect_harness::commands::matrix::job::MatrixJob;
use bisect_harness::commands::matrix::{Plan, Shard};

/// Which night to compare with.
#[derive(Debug, Args)]
pub(crate) struct BaselineArgs {
    /// Compare with this matrix directory instead of the newest earlier one of the plan.
    #[arg(long, conflicts_with = "no_baseline")]
    pub(crate) baseline: Option<PathBuf>,
    /// Compare with nothing (a first night, or a run that must not fail on regressions).
    #[arg(long = "no-baseline")]
    pub(crate) no_baseline: bool,
}

#[derive(Debug, Args)]
pub(crate) struct MatrixArgs {
    /// The plan (TOML): target, workload, axes or cells, repeats, thresholds.
    plan: PathBuf,
    #[command(flatten)]
    pub(crate) baseline: BaselineArgs,
    /// Run only shard I of N (0 <= I < N): whole restart groups, group g in shard g mod N.
    /// Shards are compared with the baseline when merged (`bisect merge`).
    #[arg(long)]
    shard: Option<Shard>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
    /// Allow a flag whose setting also appears in a role it does not list.
    #[arg(long = "allow-partial")]
    allow_partial: bool,
    #[command(flatten)]
    oracle: super::OracleArgs,
    #[command(flatten)]
    pub(crate) cost: super::CostArgs,
    /// The night this matrix is, for `bisect history` (the nightly's scheduled date,
    /// e.g. 2026-12-05). Default: the UTC date it starts.
    #[arg(long, value_name = "LABEL")]
    night: Option<String>,
    /// The engine build this night runs (a commit id, a release): what `bisect history
    /// --auto-bisect` searches between when a cell regresses.
    #[arg(long, value_name = "ID")]
    build: Option<String>,
}

impl MatrixArgs {
    /// Load the plan and resolve its target into a job (nothing is written).
    pub(crate) fn job(&self) -> anyhow::Result<MatrixJob> {
        let mut plan = Plan::load(&self.plan)?;
        let oracle = self.oracle.solo(&mut plan.workload)?;
        if self.shard.is_some() && self.baseline.baseline.is_some() {
            return Err(usage(
                "--baseline with --shard: the regression rule is Holm-corrected across the whole matrix",
                "run the shards without --baseline and pass it to `bisect merge`",
            ));
        }
        let mut id = matrix_id(&plan.name);
        if let Some(s) = &self.shard {
            id.push_str(&format!("-shard{}of{}", s.index, s.count));
        }
        let dir = self.output.results.join(&id);
        let (target, api_key) = resolve_target(plan.target.as_deref(), &dir)?;
        Ok(MatrixJob {
            id,
            command: command_line(),
            plan,
            target,
            shard: self.shard,
            dir,
            testbed: bisect_harness::arm::TestbedOptions {
                journal_dir: self.output.journal_dir(),
                state_root: None,
                allow_partial: self.allow_partial,
                metrics_period: METRICS_PERIOD,
                reference_cache: Some(self.output.reference_cache()),
            },
            api_key,
            oracle,
            night: bisect_harness::commands::matrix::record::NightInfo::now(
                self.night.clone(),
                self.build.clone(),
            ),
        })
    }
}

#[derive(Debug, Args)]
pub(crate) struct MergeArgs {
    /// Shard directories written by `bisect matrix --shard I/N`, one per shard.
    #[arg(required = true)]
    pub(crate) dirs: Vec<PathBuf>,
    /// The merged matrix directory (default: RESULTS/<matrix-id>/).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) baseline: BaselineArgs,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// `<UTC stamp>-matrix-<plan name>`: a matrix directory's name.
pub(crate) fn matrix_id(plan: &str) -> String {
    run_id(&format!("matrix-{plan}"), None)
}
