//! The culprit search's real step runner: one block on a [`Testbed`]. Every listed flag
//! is written into every role it lists and read back (a value that does not read back
//! stops the search), the engines restart, what they report about themselves is checked
//! against the block's values and the `--set` pins, as `bisect run` checks its arms and
//! pins (a value the engine does not run with stops the search; a flag no engine
//! reports is a warning of the block), the block's sessions are driven at the experiment's
//! concurrency into `blocks/bNNN/` (sessions.jsonl, metrics.csv, the launch configs as
//! applied), and the engines stop. The launch configs are restored by the testbed's
//! close, on every path (docs/design.md 2.2).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::arm::{BlockDrive, BlockName, Restarted, Testbed, NO_EFFECTIVE_WARNING};
use crate::commands::blocks::BlockRunner;
use crate::config::Pin;
use crate::config::{FlagSpec, Workload};
use crate::core::classify::Classifier;
use crate::core::culprit::{BlockOutcome, BlockRequest};
use crate::exit::Failure;
use crate::results::ResultsDir;

pub(crate) struct TestbedRunner<'t, 'a> {
    pub(crate) bed: &'t mut Testbed<'a>,
    pub(crate) flags: Vec<FlagSpec>,
    /// `--set` pins, written once by the testbed: checked after every restart.
    pub(crate) pins: Vec<Pin>,
    /// Warnings already printed (each block still records its own).
    pub(crate) warned: Vec<String>,
    pub(crate) workload: Workload,
    pub(crate) classifier: Arc<Classifier>,
    /// The culprit directory.
    pub(crate) dir: PathBuf,
    /// Say each block's failing values before its restart (culprit); `bisect load`
    /// names its blocks by level and arm itself, and says nothing here.
    pub(crate) announce: bool,
    /// `--oracle solo`: each block's sessions also run alone first, and are judged
    /// against themselves alone.
    pub(crate) oracle: Option<crate::core::solo::SoloOracle>,
    /// The replica set whose share of each block this runner drives, where a block is
    /// split over several (`blocks/bNNN/<set>/`); `None` drives whole blocks.
    pub(crate) share: Option<String>,
}

/// `blocks/b007`, relative to the culprit directory.
pub(crate) fn block_dir(block: u64) -> String {
    format!("blocks/b{block:03}")
}

impl BlockRunner<BlockRequest, BlockOutcome> for TestbedRunner<'_, '_> {
    async fn run_block(&mut self, request: &BlockRequest) -> anyhow::Result<BlockOutcome> {
        self.bed.check_cancelled()?;
        self.write_flags(request)?;
        let label = format!("b{:03}", request.block);
        if self.announce {
            let failing = if request.failing.is_empty() {
                "none".to_string()
            } else {
                request.failing.join(", ")
            };
            self.bed.progress().note(&format!(
                "culprit block {}: failing values: {failing}; restarting",
                request.block
            ));
        }
        let restarted = self.bed.restart(&label).await?;
        restarted.refuse_disagreements(&format!("block {}", request.block))?;
        let warnings = self.unreported_flags(&restarted);
        let results = self.block_results(request.block)?;
        results.snapshot_launch(&label, 0, self.bed.target())?;
        let mut outcome = self.drive_block(request, &label, &results).await?;
        outcome.wall_s += restarted.health_wait_s;
        outcome.warnings = warnings;
        Ok(outcome)
    }
}

impl TestbedRunner<'_, '_> {
    /// Write every listed flag at the block's value; a value that does not read back
    /// stops the search.
    fn write_flags(&mut self, request: &BlockRequest) -> anyhow::Result<()> {
        for flag in &self.flags {
            let value = request.config.get(&flag.name).ok_or_else(|| {
                anyhow::anyhow!("block {} sets no value for {}", request.block, flag.name)
            })?;
            self.bed
                .set_read_back(flag, value, &format!("block {}", request.block))?;
        }
        Ok(())
    }

    /// The listed and pinned flags no engine reports: a warning of the block (only the
    /// launch-file read-back stands for them), printed once per search.
    fn unreported_flags(&mut self, restarted: &Restarted) -> Vec<String> {
        let all = self.flags.iter().chain(self.pins.iter().map(|p| &p.flag));
        let mut warnings = Vec::new();
        for flag in all {
            if restarted
                .effective
                .get(&flag.name)
                .is_none_or(|reported| reported.is_empty())
            {
                let warning = format!("{}: {NO_EFFECTIVE_WARNING}", flag.name);
                if !self.warned.contains(&warning) {
                    self.bed.progress().note(&format!("warning: {warning}"));
                    self.warned.push(warning.clone());
                }
                warnings.push(warning);
            }
        }
        warnings
    }

    /// The block's results directory, `blocks/bNNN/` (a set's share:
    /// `blocks/bNNN/<set>/`), fresh.
    fn block_results(&self, block: u64) -> anyhow::Result<ResultsDir> {
        let mut dir = self.dir.join(block_dir(block));
        if let Some(set) = &self.share {
            dir.push(set);
        }
        if dir.exists() {
            // A block the step log does not hold (the search was killed while it ran):
            // kept aside, never mixed into this block's sessions.
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let aside = (1..)
                .map(|n| dir.with_file_name(format!("{name}.unlogged-{n}")))
                .find(|p| !p.exists())
                .expect("a free name");
            std::fs::rename(&dir, &aside).with_context(|| {
                format!("moving {} aside to {}", dir.display(), aside.display())
            })?;
        }
        ResultsDir::create(&dir)
    }

    /// Drive the block's sessions at its load, stop the engines, and read back the
    /// classes in session-index order with the engine-side peak and the speed.
    async fn drive_block(
        &mut self,
        request: &BlockRequest,
        label: &str,
        results: &ResultsDir,
    ) -> anyhow::Result<BlockOutcome> {
        let mut workload = self.workload.clone();
        workload.sessions = u32::try_from(request.sessions)?;
        workload.concurrency = Some(request.concurrency);
        workload.seed = request.seed;
        let block = BlockName {
            label,
            value: "",
            repeat: 0,
        };
        let (stats, _) = self
            .bed
            .drive_judged(
                BlockDrive {
                    block,
                    workload: &workload,
                    classifier: &self.classifier,
                    results,
                },
                self.oracle,
            )
            .await?;
        self.bed.stop().await?;
        if !stats.engine_replaced.is_empty() {
            // Part of the block ran on an engine that restarted by itself: its sessions
            // are not this configuration's, and the search's steps compare blocks.
            return Err(Failure::could_not_run(
                format!(
                    "block {}: {}",
                    request.block,
                    stats.engine_replaced.join("; ")
                ),
                "find why the engine restarted (its logs) and resume the search with --resume",
            )
            .into());
        }
        let mut sessions = results.read_sessions()?;
        sessions.sort_by_key(|s| s.index);
        let peak_engine = stats
            .peak_running
            .iter()
            .filter(|(role, _)| role.as_str() != "client")
            .map(|(_, peak)| *peak)
            .max();
        Ok(BlockOutcome {
            classes: sessions.iter().map(|s| s.class).collect(),
            peak_engine,
            wall_s: stats.wall_s,
            tokens_per_s: (stats.completion_tokens > 0).then_some(stats.tokens_per_s),
            warnings: Vec::new(),
            mechanisms: stats.mechanisms.clone(),
            sets: Vec::new(),
        })
    }
}
