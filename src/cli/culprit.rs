//! `bisect culprit --flags A,B,C [--budget SESSIONS]`: clap arguments and their
//! conversion into a [`CulpritPlan`].

use clap::Args;

use super::{command_line, run_id, usage, ExperimentArgs, METRICS_PERIOD};
use bisect_harness::commands::culprit::{self, CulpritPlan};

#[derive(Debug, Args)]
pub struct CulpritArgs {
    /// Flags to search, comma-separated catalog names (at least two), each flipped alone.
    #[arg(long, value_delimiter = ',', required = true)]
    flags: Vec<String>,
    /// Total sessions (both arms, all flags): half screens every flag, the rest goes to
    /// the most promising undecided ones.
    #[arg(long, default_value_t = culprit::DEFAULT_BUDGET)]
    budget: u64,
    // The search goes to RESULTS/<id>/, each A/B pair to RESULTS/<id>/flags/<FLAG>/.
    #[command(flatten)]
    pub common: ExperimentArgs,
}

impl CulpritArgs {
    /// Validate the arguments into a plan; the embedded engine's launch scripts are
    /// the only thing written.
    pub fn plan(&self) -> anyhow::Result<CulpritPlan> {
        let common = &self.common;
        let catalog = common.target.catalog()?;
        let flags = self
            .flags
            .iter()
            .filter(|name| !name.trim().is_empty())
            .map(|name| catalog.get(name).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        culprit::check_request(&flags, self.budget)?;
        if common.load.sessions.is_some() {
            return Err(usage(
                "--sessions does not apply to `bisect culprit`: each pair's size comes from --budget",
                "drop --sessions and set --budget SESSIONS (both arms, all flags)",
            ));
        }
        let workload = common.load.load()?;
        let policy = common.decision.policy()?;
        let id = run_id("culprit", common.tag.as_deref());
        let dir = common.output.results.join(&id);
        let (target, api_key) = common.target.resolve(&dir)?;
        let plan = CulpritPlan {
            id,
            command: command_line(),
            flags,
            api_key,
            target,
            workload,
            budget: self.budget,
            policy,
            dir,
            journal_dir: common.output.journal_dir(),
            state_root: None,
            allow_partial: common.allow_partial,
            metrics_period: METRICS_PERIOD,
        };
        plan.validate()?;
        Ok(plan)
    }
}
