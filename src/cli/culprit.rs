//! `bisect culprit --flags A,B,C [--budget SESSIONS] [--set NAME=VALUE]... [--resume DIR]`:
//! clap arguments and their conversion into a [`CulpritPlan`].

use std::path::PathBuf;

use clap::Args;

use super::{command_line, parse_pins, run_id, usage, ExperimentArgs, OracleArgs};
use bisect_harness::commands::culprit::{self, CulpritPlan};

#[derive(Debug, Args)]
pub(crate) struct CulpritArgs {
    /// Flags to search, comma-separated catalog names (at least two). Their values in
    /// the launch configs as they are make the failing configuration; the search finds
    /// the minimal set of those values that still fails (docs/culprit.md).
    #[arg(long, value_delimiter = ',', required = true)]
    flags: Vec<String>,
    /// Most sessions the search may spend, all blocks together.
    #[arg(long, default_value_t = culprit::DEFAULT_BUDGET)]
    budget: u64,
    /// Pin another flag for every block: NAME=VALUE (repeatable).
    #[arg(long = "set")]
    set: Vec<String>,
    /// Carry on a search that stopped: replay DIR/steps.jsonl (nothing it ran is run
    /// again) and continue in DIR. Pass the same flags and options.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    #[command(flatten)]
    oracle: OracleArgs,
    #[command(flatten)]
    pub(crate) cost: super::CostArgs,
    // The search goes to RESULTS/<id>/, each block to RESULTS/<id>/blocks/bNNN/.
    #[command(flatten)]
    pub(crate) common: ExperimentArgs,
}

impl CulpritArgs {
    /// Validate the arguments into a plan (nothing is written; what needs the launch
    /// configs is checked when the search starts, [`CulpritPlan::validate`]).
    pub(crate) fn plan(&self) -> anyhow::Result<CulpritPlan> {
        let common = &self.common;
        let catalog = common.target.catalog()?;
        let flags = self
            .flags
            .iter()
            .filter(|name| !name.trim().is_empty())
            .map(|name| catalog.get(name).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        let mut workload = common.load.load_sized(false)?;
        // A block is max(--concurrency, 80) sessions whatever the workload's sample (the
        // runner sizes each): a workload of fewer sessions than --concurrency must not
        // lower the load to them.
        if let Some(c) = workload.concurrency {
            workload.sessions = workload.sessions.max(c);
        }
        let oracle = self.oracle.solo(&mut workload)?;
        culprit::check_request(&flags, self.budget, &workload)?;
        if common.load.sessions.is_some() {
            return Err(usage(
                "--sessions does not apply to `bisect culprit`: every block runs max(--concurrency, 80) sessions at the load, and the search decides how many blocks",
                "drop --sessions; set the load with --concurrency and the most sessions with --budget",
            ));
        }
        let pins = parse_pins(&catalog, &self.set, None)?;
        let policy = common.decision.policy()?;
        let (id, dir) = match &self.resume {
            Some(dir) => {
                let id = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_else(|| "culprit".into());
                (id, dir.clone())
            }
            None => {
                let id = run_id("culprit", common.tag.as_deref());
                let dir = common.output.results.join(&id);
                (id, dir)
            }
        };
        let (target, api_key) = common.target.resolve(&dir)?;
        Ok(CulpritPlan {
            id,
            command: command_line(),
            flags,
            pins,
            api_key,
            target,
            workload,
            budget: self.budget,
            policy,
            dir,
            testbed: common.testbed(),
            resume: self.resume.is_some(),
            oracle,
        })
    }
}
