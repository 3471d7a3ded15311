//! Driving a matrix (or one shard of it) against the engines, with the same care as
//! `bisect run` (DESIGN.md 3.3, 3.6): half-applied flags are refused before any edit,
//! launch configs are journaled, each restart group's flag values are written into every
//! role and read back, the engines restart once per group, the group's cells run back
//! to back, and the originals are restored byte for byte on every path (finished,
//! failed, interrupted). Each cell streams its sessions and metrics into
//! `cells/<cell-id>/`; the matrix files are rewritten after every cell block.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::cells::{Cell, Shard};
use super::export;
use super::plan::Plan;
use super::record::{CellRecord, MatrixRecord, PlanInfo, SCHEMA};
use crate::commands::run::{
    self as experiment, drive_block, fetch_server_info, BlockSpec, Progress,
};
use crate::config::{FlagSpec, TargetProfile};
use crate::control::EngineControl;
use crate::core::classify::Classifier;
use crate::exit::Failure;
use crate::launch::Editor;
use crate::results::run_record::ArmRecord;
use crate::results::ResultsDir;

/// Everything one `bisect matrix` invocation needs, validated.
#[derive(Debug, Clone)]
pub struct MatrixJob {
    pub id: String,
    pub command: String,
    pub plan: Plan,
    pub target: TargetProfile,
    pub shard: Option<Shard>,
    /// The matrix directory (`results/<id>/`).
    pub dir: PathBuf,
    pub journal_dir: PathBuf,
    pub api_key: Option<String>,
    pub metrics_period: Duration,
    pub allow_partial: bool,
}

impl MatrixJob {
    /// The cells this invocation runs: the shard's, or all.
    pub fn cells(&self) -> Vec<&Cell> {
        match &self.shard {
            Some(s) => s.select(&self.plan.cells),
            None => self.plan.cells.iter().collect(),
        }
    }
}

/// Run the job's cells. Launch configs are restored before this returns, on every path;
/// the record (also on disk) says how far it got.
pub async fn run(
    job: &MatrixJob,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<MatrixRecord> {
    std::fs::create_dir_all(job.dir.join("cells"))
        .with_context(|| format!("creating {}", job.dir.join("cells").display()))?;
    let mut record = initial_record(job);
    export::write_all(&job.dir, &record)?;

    if !job.allow_partial {
        let mut flags: Vec<&FlagSpec> = job.plan.sets.iter().map(|(f, _)| f).collect();
        for cell in &job.plan.cells {
            for (f, _) in &cell.flags {
                if !flags.iter().any(|g| g.name == f.name) {
                    flags.push(f);
                }
            }
        }
        experiment::refuse_half_applied(&job.target, &flags)?;
    }

    let files: Vec<PathBuf> = job.target.roles.iter().map(|r| r.launch.clone()).collect();
    let mut editor = Editor::begin(&job.journal_dir, &files)
        .with_context(|| format!("journaling launch configs in {}", job.journal_dir.display()))?;

    let outcome = run_groups(job, control, progress, &cancel, &mut editor, &mut record).await;
    let stopped = control.stop().await;
    let restored = editor.restore();

    match &outcome {
        Ok(()) => record.status = "finished".into(),
        Err(e) => {
            record.status = if matches!(e.downcast_ref::<Failure>(), Some(Failure::Interrupted)) {
                "interrupted".into()
            } else {
                "failed".into()
            };
            record.error = Some(format!("{e:#}"));
        }
    }
    record.finished_at = Some(super::record::now());
    export::write_all(&job.dir, &record)?;
    restored.context("restoring the original launch configs")?;
    outcome?;
    stopped.context("stopping the engines")?;
    Ok(record)
}

fn initial_record(job: &MatrixJob) -> MatrixRecord {
    let workload_hash = job.plan.workload_hash();
    MatrixRecord {
        schema: SCHEMA.into(),
        id: job.id.clone(),
        command: job.command.clone(),
        plan: PlanInfo::of(&job.plan),
        shard: job.shard,
        merged_from: Vec::new(),
        started_at: super::record::now(),
        finished_at: None,
        status: "running".into(),
        target: experiment::target_info(&job.target),
        workload: job.plan.workload.params_json(),
        workload_hash: workload_hash.clone(),
        cells: job
            .cells()
            .into_iter()
            .map(|c| CellRecord::pending(c, &workload_hash))
            .collect(),
        baseline: None,
        regressions: Vec::new(),
        engine_info: BTreeMap::new(),
        error: None,
    }
}

async fn run_groups(
    job: &MatrixJob,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: &CancellationToken,
    editor: &mut Editor,
    record: &mut MatrixRecord,
) -> anyhow::Result<()> {
    let roles = &job.target.roles;
    let mut pinned: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (flag, value) in &job.plan.sets {
        let readback = editor.apply(flag, value, roles)?;
        progress.note(&format!(
            "pinned {}={value} (read back: {})",
            flag.name,
            fmt_map(&readback)
        ));
        pinned.insert(flag.name.clone(), readback);
    }
    let classifier = Arc::new(Classifier::with_defaults(&job.plan.workload.tools)?);
    let cells = job.cells();
    let mut groups: Vec<Vec<(usize, &Cell)>> = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g[0].1.group == cell.group => g.push((i, cell)),
            _ => groups.push(vec![(i, cell)]),
        }
    }
    for group in groups {
        if cancel.is_cancelled() {
            return Err(Failure::Interrupted.into());
        }
        let first = group[0].1;
        let mut readback = pinned.clone();
        for (flag, value) in &first.flags {
            readback.insert(flag.name.clone(), editor.apply(flag, value, roles)?);
        }
        let label = format!("group{}", first.group);
        progress.note(&format!(
            "{label} ({}): configs written and read back, restarting",
            first
                .flags
                .iter()
                .map(|(f, v)| format!("{}={v}", f.name))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let result = run_group(
            job,
            control,
            progress,
            cancel,
            &classifier,
            record,
            &group,
            &readback,
            &label,
        )
        .await;
        if let Err(e) = result {
            for (i, _) in &group {
                if !record.cells[*i].is_finished() {
                    record.cells[*i].status = "failed".into();
                }
            }
            return Err(e);
        }
        control.stop().await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_group(
    job: &MatrixJob,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: &CancellationToken,
    classifier: &Arc<Classifier>,
    record: &mut MatrixRecord,
    group: &[(usize, &Cell)],
    readback: &BTreeMap<String, BTreeMap<String, String>>,
    label: &str,
) -> anyhow::Result<()> {
    let waits = control.restart(label, cancel).await?;
    let health_wait_s: f64 = waits.values().sum();
    for role in &job.target.roles {
        if let Some(info) = fetch_server_info(&role.health).await {
            record
                .engine_info
                .insert(format!("{label}/{}", role.name), info);
        }
    }
    let mut blocks: Vec<Vec<ArmRecord>> = vec![Vec::new(); group.len()];
    // A cell's repeats run back to back, cells in ascending load: a cell then never
    // starts on a pool that a heavier cell of its group just filled (its sessions would
    // be evicted and loaded back because of the cell before, not because of its own load).
    let mut order: Vec<(usize, &(usize, &Cell))> = group.iter().enumerate().collect();
    order.sort_by_key(|(_, (_, cell))| (cell.sessions, cell.rounds));
    for (slot, (i, cell)) in order {
        for repeat in 0..job.plan.repeats.max(1) {
            if cancel.is_cancelled() {
                return Err(Failure::Interrupted.into());
            }
            let results = ResultsDir::create(&cell_dir(&job.dir, cell))?;
            results.snapshot_launch("cell", repeat, &job.target)?;
            let mut workload = job.plan.workload.clone();
            workload.sessions = cell.sessions;
            workload.rounds = cell.rounds;
            let spec = BlockSpec {
                target: &job.target,
                workload: &workload,
                api_key: job.api_key.clone(),
                metrics_period: job.metrics_period,
            };
            let mut arm = ArmRecord::new(&cell.id, "", Some(repeat));
            // The restart's health wait belongs to the whole group; each cell records it.
            arm.health_wait_s = if repeat == 0 { health_wait_s } else { 0.0 };
            record.cells[*i].status = "running".into();
            progress.arm_started(&cell.id, "", repeat, cell.sessions as u64);
            drive_block(
                &spec, classifier, progress, cancel, &results, &mut arm, repeat,
            )
            .await?;
            arm.finish();
            progress.arm_finished(&arm);
            blocks[slot].push(arm);
            let pooled = ArmRecord::pool(&cell.id, "", &blocks[slot].iter().collect::<Vec<_>>());
            let rec = &mut record.cells[*i];
            rec.absorb(&pooled);
            rec.readback = readback.clone();
            if repeat + 1 == job.plan.repeats.max(1) {
                rec.status = "finished".into();
            }
            export::write_all(&job.dir, record)?;
        }
    }
    Ok(())
}

/// `cells/<cell-id>/` under a matrix directory.
pub fn cell_dir(matrix_dir: &Path, cell: &Cell) -> PathBuf {
    matrix_dir.join("cells").join(&cell.id)
}

fn fmt_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
