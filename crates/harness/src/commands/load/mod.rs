//! `bisect load [--flag NAME] [--levels 1,8,16,32,64,80 | --max C] [--adaptive]`: the
//! corruption rate as a function of sessions in flight, and the lowest load at which
//! the bug appears (docs/load.md). Orchestration only: the sweep is
//! [`crate::core::load`] (pure, behind [`LoadRunner`]); this module opens the
//! [`Testbed`] (journal, pins), runs every block through the culprit search's real block
//! runner (write the flag's value and read it back, restart, check what the engines
//! report against the values and the pins, drive the block's sessions at its level into
//! `blocks/bNNN/`, stop, refuse a replaced engine), writes `load.json`, `summary.md` and
//! `report.html` after every block, and closes the testbed (configs restored byte for
//! byte) on every path.
//!
//! Exit codes as `bisect run`: 0 finished (whatever the answer), 2 bad usage or input,
//! 3 the sweep could not run, 130 interrupted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::arm::{settle, Progress, Testbed, TestbedSpec};
use crate::commands::culprit::runner::TestbedRunner;
use crate::commands::run::now;
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::RecordStatus;
use crate::core::culprit::{BlockOutcome, BlockRequest, StepRunner};
use crate::core::load::{sweep, Arm, LevelBlock, LoadParams, LoadReport, LoadRunner, Watcher};
use crate::results::load::{LoadRecord, SCHEMA};
use crate::results::run_record::TargetInfo;

/// Everything `bisect load` needs, validated.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub id: String,
    pub command: String,
    /// The flag each level is an A/B of; `None`: the configuration as it is.
    pub flag: Option<FlagSpec>,
    /// Pinned for every block.
    pub sets: Vec<(FlagSpec, String)>,
    pub target: TargetProfile,
    /// The base workload (its concurrency and sessions are set per block).
    pub workload: Workload,
    pub params: LoadParams,
    /// `results/<id>/`.
    pub dir: PathBuf,
    pub journal_dir: PathBuf,
    /// Where the target's state lives; `None`: `$XDG_STATE_HOME/bisect`.
    pub state_root: Option<PathBuf>,
    pub allow_partial: bool,
    pub api_key: Option<String>,
    pub metrics_period: Duration,
}

/// The culprit runner behind the sweep's seam: a level's block is a culprit block with
/// the flag (if any) at its arm's value, at the level's concurrency.
struct Blocks<'t, 'a> {
    runner: TestbedRunner<'t, 'a>,
    flag: Option<FlagSpec>,
}

impl LoadRunner for Blocks<'_, '_> {
    async fn run_block(&mut self, block: &LevelBlock) -> anyhow::Result<BlockOutcome> {
        let mut config = BTreeMap::new();
        let mut failing = Vec::new();
        if let Some(flag) = &self.flag {
            let on = block.arm == Arm::On;
            config.insert(flag.name.clone(), flag.value_for(on).to_string());
            if on {
                failing.push(flag.name.clone());
            }
        }
        self.runner.bed.progress().note(&format!(
            "load block {}: {} in flight, {} ({} sessions)",
            block.block,
            block.level,
            block.arm.as_str(),
            block.sessions
        ));
        let request = BlockRequest {
            block: block.block,
            config,
            failing,
            sessions: block.sessions,
            concurrency: block.level,
            seed: block.seed,
        };
        self.runner.run_block(&request).await
    }
}

/// Rewrites the record after every block.
struct Recorder<'r> {
    record: &'r mut LoadRecord,
    dir: PathBuf,
    started: Instant,
}

impl Watcher for Recorder<'_> {
    fn block_done(&mut self, report: &LoadReport) -> anyhow::Result<()> {
        self.record.report = Some(report.clone());
        self.record.wall_s = self.started.elapsed().as_secs_f64();
        self.record.write(&self.dir)
    }
}

/// Run the sweep. Launch configs are restored before this returns, on every path;
/// load.json says how far it got.
pub async fn run(
    plan: &LoadPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<LoadRecord> {
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("creating {}", plan.dir.display()))?;
    let mut record = started_record(plan);
    record.write(&plan.dir)?;
    let written = plan.flag.iter().chain(plan.sets.iter().map(|(f, _)| f));
    let spec = TestbedSpec::read_only(&plan.target, plan.api_key.clone(), plan.metrics_period)
        .editing(
            &plan.journal_dir,
            plan.state_root.as_deref(),
            written.collect(),
            plan.allow_partial,
        );
    let started = Instant::now();
    let mut bed = Testbed::open(spec, control, progress, cancel)?;
    let outcome = async {
        bed.pin(&plan.sets)?;
        let classifier = Arc::new(plan.target.classifier(&plan.workload)?);
        let mut blocks = Blocks {
            runner: TestbedRunner {
                bed: &mut bed,
                flags: plan.flag.iter().cloned().collect(),
                pins: plan.sets.clone(),
                warned: Vec::new(),
                workload: plan.workload.clone(),
                classifier,
                dir: plan.dir.clone(),
            },
            flag: plan.flag.clone(),
        };
        let mut recorder = Recorder {
            record: &mut record,
            dir: plan.dir.clone(),
            started,
        };
        let flag = plan.flag.as_ref().map(|f| f.name.as_str());
        sweep(&plan.params, flag, &mut blocks, &mut recorder).await
    }
    .await;
    let closed = bed.close().await;
    let outcome = closed.combine(outcome);
    if let Ok(report) = &outcome {
        record.report = Some(report.clone());
    }
    record.wall_s = started.elapsed().as_secs_f64();
    record.finished_at = Some(now());
    (record.status, record.error) = settle(&outcome);
    let written = record.write(&plan.dir);
    crate::arm::record_written(outcome, written)?;
    Ok(record)
}

fn started_record(plan: &LoadPlan) -> LoadRecord {
    LoadRecord {
        schema: SCHEMA.into(),
        id: plan.id.clone(),
        command: plan.command.clone(),
        started_at: now(),
        finished_at: None,
        status: RecordStatus::Running,
        target: TargetInfo::of(&plan.target),
        flag: plan.flag.as_ref().map(|f| f.name.clone()),
        pinned: plan
            .sets
            .iter()
            .map(|(f, v)| format!("{}={v}", f.name))
            .collect(),
        workload: plan.workload.params_json(),
        params: plan.params.clone(),
        report: None,
        wall_s: 0.0,
        error: None,
    }
}
