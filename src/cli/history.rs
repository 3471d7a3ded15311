//! `bisect history DIR`: clap arguments and their conversion into a [`HistoryJob`].

use std::path::PathBuf;

use clap::Args;

use super::{command_line, usage, METRICS_PERIOD};
use bisect_harness::commands::history::HistoryJob;
use bisect_harness::core::history::HistoryPolicy;

#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// The results directory the nightly matrices are written to (`bisect matrix
    /// --results DIR`): every DIR/*/matrix.json of the plan is a night.
    pub(crate) dir: PathBuf,
    /// The plan's name, when DIR holds matrices of several plans.
    #[arg(long)]
    plan: Option<String>,
    /// e-BH level across the cells: the false discovery rate of regressions.
    #[arg(long, default_value_t = 0.01)]
    alpha: f64,
    /// Evidence of a rise at or above this, short of a regression: suspicious.
    #[arg(long = "suspicious-e", default_value_t = 10.0)]
    suspicious_e: f64,
    /// Do not count dates missing between the first and the last night as absent
    /// nights (a nightly that does not run every day).
    #[arg(long = "no-gaps")]
    no_gaps: bool,
    /// Search the builds between each regression's last good and first bad night with
    /// `bisect commits` (the plan's [commits] table), once per regression; the answer
    /// lands in the history.
    #[arg(long = "auto-bisect")]
    pub(crate) auto_bisect: bool,
    /// Print history.json instead of the summary.
    #[arg(long)]
    pub(crate) json: bool,
}

impl HistoryArgs {
    pub(crate) fn job(&self) -> anyhow::Result<HistoryJob> {
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(usage(
                format!("--alpha {} is not a probability", self.alpha),
                "pass a level between 0 and 1, e.g. --alpha 0.01",
            ));
        }
        if self.suspicious_e < 1.0 {
            return Err(usage(
                format!(
                    "--suspicious-e {} is below 1 (no evidence at all)",
                    self.suspicious_e
                ),
                "pass 10 (strong evidence on Jeffreys' scale) or more",
            ));
        }
        Ok(HistoryJob {
            dir: self.dir.clone(),
            plan: self.plan.clone(),
            policy: HistoryPolicy {
                alpha: self.alpha,
                suspicious_e: self.suspicious_e,
                ..HistoryPolicy::default()
            },
            gaps: !self.no_gaps,
            command: command_line(),
        })
    }

    /// How an automatic search's blocks journal and poll, under the history's folder.
    pub(crate) fn testbed(&self) -> bisect_harness::arm::TestbedOptions {
        bisect_harness::arm::TestbedOptions {
            journal_dir: self.dir.join(".bisect-journal"),
            state_root: None,
            allow_partial: false,
            metrics_period: METRICS_PERIOD,
            reference_cache: None,
        }
    }
}
