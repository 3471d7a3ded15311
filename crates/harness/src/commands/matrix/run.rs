//! Driving a matrix (or one shard of it) against the engines, with the same care as
//! `bisect run` (docs/design.md 3.3, 3.6): half-applied flags are refused before any edit,
//! launch configs are journaled, each restart group's flag values are written into every
//! role and read back, the engines restart once per group, the group's cells run back
//! to back, and the originals are restored byte for byte on every path (finished,
//! failed, interrupted). Each cell streams its sessions and metrics into
//! `cells/<cell-id>/`; the matrix files are rewritten after every cell block.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::cells::Cell;
use super::export;
use super::job::cell_dir;
use super::job::MatrixJob;
use super::record::{CellRecord, MatrixRecord, PlanInfo, SCHEMA};
use crate::arm::{
    lifecycle, settle, BlockDrive, BlockName, Progress, Readback, Testbed, NO_EFFECTIVE_WARNING,
};
use crate::config::FlagSpec;
use crate::config::Pin;
use crate::control::EngineControl;
use crate::core::arm_stats::{ArmStats, RecordStatus};
use crate::core::classify::Classifier;
use crate::results::run_record::TargetInfo;
use crate::results::ResultsDir;

/// Run the job's cells. Launch configs are restored before this returns, on every path;
/// the record (also on disk) says how far it got.
pub async fn run_matrix(
    job: &MatrixJob,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<MatrixRecord> {
    std::fs::create_dir_all(job.dir.join("cells"))
        .with_context(|| format!("creating {}", job.dir.join("cells").display()))?;
    let mut record = initial_record(job);
    export::write_all(&job.dir, &record)?;

    let mut flags: Vec<&FlagSpec> = job.plan.pins.iter().map(|p| &p.flag).collect();
    for cell in &job.plan.cells {
        let ab = cell.load.iter().flat_map(|l| &l.flag);
        for f in cell.flags.iter().map(|p| &p.flag).chain(ab) {
            if !flags.iter().any(|g| g.name == f.name) {
                flags.push(f);
            }
        }
    }
    let spec = job.testbed.spec(&job.target, job.api_key.clone(), flags);
    let started = std::time::Instant::now();
    let bed = Testbed::open(spec, control, progress, cancel)?;
    lifecycle(
        bed,
        &mut record,
        async |bed, record| run_groups(job, bed, record).await,
        |record, outcome, ending| {
            record.cost = Some(ending.cost(started.elapsed().as_secs_f64()));
            ending.keep_rates(&job.testbed.state_dir(), &job.target.name);
            (record.header.status, record.error) = settle(outcome);
            record.header.finished_at = Some(super::record::now());
            export::write_all(&job.dir, record)
        },
    )
    .await?;
    Ok(record)
}

pub(super) fn initial_record(job: &MatrixJob) -> MatrixRecord {
    let workload_hash = job.plan.workload_hash();
    MatrixRecord {
        header: crate::results::RecordHeader::running(
            SCHEMA,
            &job.id,
            &job.command,
            super::record::now(),
            TargetInfo::of(&job.target),
        ),
        plan: PlanInfo::of(&job.plan),
        shard: job.shard,
        merged_from: Vec::new(),
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
        cost: None,
        error: None,
        night: job.night.clone(),
    }
}

async fn run_groups(
    job: &MatrixJob,
    bed: &mut Testbed<'_>,
    record: &mut MatrixRecord,
) -> anyhow::Result<()> {
    let pinned = bed.pin(&job.plan.pins)?;
    let classifier = Arc::new(job.target.classifier(&job.plan.workload)?);
    let cells = job.cells();
    let mut groups: Vec<Vec<(usize, &Cell)>> = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g[0].1.group == cell.group => g.push((i, cell)),
            _ => groups.push(vec![(i, cell)]),
        }
    }
    for group in groups {
        bed.check_cancelled()?;
        let (i, first) = group[0];
        let result = if first.load.is_some() {
            // A load cell is a group of its own: its sweep restarts for every block.
            super::load_cell::run(job, bed, record, i, first, &pinned).await
        } else {
            run_group(job, bed, &classifier, record, &group, &pinned).await
        };
        if let Err(e) = result {
            for (i, _) in &group {
                if !record.cells[*i].is_finished() {
                    record.cells[*i].status = RecordStatus::Failed;
                }
            }
            return Err(e);
        }
        bed.stop().await?;
    }
    Ok(())
}

/// Write the group's flag values (read back), restart once, and run its cells.
async fn run_group(
    job: &MatrixJob,
    bed: &mut Testbed<'_>,
    classifier: &Arc<Classifier>,
    record: &mut MatrixRecord,
    group: &[(usize, &Cell)],
    pinned: &BTreeMap<String, Readback>,
) -> anyhow::Result<()> {
    let first = group[0].1;
    let mut readback = pinned.clone();
    for Pin { flag, value } in &first.flags {
        readback.insert(flag.name.clone(), bed.set(flag, value)?);
    }
    let label = &format!("group{}", first.group);
    bed.progress().note(&format!(
        "{label} ({}): configs written and read back, restarting",
        first
            .flags
            .iter()
            .map(Pin::words)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let restarted = bed.restart(label).await?;
    let check = check_effective(&job.plan.pins, &first.flags, &restarted.effective);
    for warning in &check.warnings {
        if !record.cells.iter().any(|c| c.warnings.contains(warning)) {
            bed.progress().note(&format!("warning: {warning}"));
        }
    }
    for (role, info) in restarted.engine_info {
        record.engine_info.insert(format!("{label}/{role}"), info);
    }
    for (i, _) in group {
        let rec = &mut record.cells[*i];
        rec.readback = readback.clone();
        rec.effective = check.effective.clone();
        rec.warnings = check.warnings.clone();
    }
    if !check.blocked.is_empty() {
        bed.progress().note(&format!(
            "{label}: cells blocked, not driven: {}",
            check.blocked.join("; ")
        ));
        for (i, _) in group {
            let rec = &mut record.cells[*i];
            rec.status = RecordStatus::Blocked;
            rec.blocked = check.blocked.clone();
        }
        export::write_all(&job.dir, record)?;
        return Ok(());
    }
    drive_cells(job, bed, classifier, record, group, restarted.health_wait_s).await
}

/// Drive every cell of a restarted group, `repeats` blocks each, pooling each cell's
/// blocks and rewriting the matrix files after every block.
async fn drive_cells(
    job: &MatrixJob,
    bed: &mut Testbed<'_>,
    classifier: &Arc<Classifier>,
    record: &mut MatrixRecord,
    group: &[(usize, &Cell)],
    health_wait_s: f64,
) -> anyhow::Result<()> {
    let mut blocks: Vec<Vec<ArmStats>> = vec![Vec::new(); group.len()];
    // A cell's repeats run back to back, cells in ascending load: a cell then never
    // starts on a pool that a heavier cell of its group just filled (its sessions would
    // be evicted and loaded back because of the cell before, not because of its own load).
    let mut order: Vec<(usize, &(usize, &Cell))> = group.iter().enumerate().collect();
    order.sort_by_key(|(_, (_, cell))| (cell.sessions, cell.rounds));
    let repeats = job.plan.repeats.max(1);
    for (slot, (i, cell)) in order {
        for repeat in 0..repeats {
            bed.check_cancelled()?;
            let results = ResultsDir::create(&cell_dir(&job.dir, cell))?;
            results.snapshot_launch("cell", repeat, &job.target)?;
            let mut workload = job.plan.workload.clone();
            workload.sessions = cell.sessions;
            workload.rounds = cell.rounds;
            record.cells[*i].status = RecordStatus::Running;
            let block = BlockName {
                label: &cell.id,
                value: "",
                repeat,
            };
            let (mut stats, _) = bed
                .drive_judged(
                    BlockDrive {
                        block,
                        workload: &workload,
                        classifier,
                        results: &results,
                    },
                    job.oracle,
                )
                .await?;
            // The restart's health wait belongs to the whole group; the first block of
            // each cell records it.
            stats.health_wait_s = if repeat == 0 { health_wait_s } else { 0.0 };
            blocks[slot].push(stats);
            let rec = &mut record.cells[*i];
            rec.stats = ArmStats::pool(&blocks[slot]);
            if repeat + 1 == repeats {
                settle_cell(rec, &cell.id);
            }
            export::write_all(&job.dir, record)?;
        }
    }
    Ok(())
}

/// A cell after its last block: warned of the roles whose load went unmeasured, and
/// finished, or blocked when an engine restarted by itself during it.
fn settle_cell(rec: &mut CellRecord, id: &str) {
    // A role whose metrics never answered: its load is unmeasured, which the
    // cell says (the baseline comparison judges the load from the others).
    for (role, why) in &rec.stats.metrics_failed {
        let warning = format!("{id}: no load measured for role {role}: {why}");
        if !rec.warnings.contains(&warning) {
            rec.warnings.push(warning);
        }
    }
    // An engine that restarted by itself during the cell (`engine_replaced`)
    // ran part of it cold: the cell is measured but not compared.
    if rec.stats.engine_replaced.is_empty() {
        rec.status = RecordStatus::Finished;
    } else {
        rec.status = RecordStatus::Blocked;
        rec.blocked = rec.stats.engine_replaced.clone();
    }
}

/// What the engines of a restart group report about the group's configuration.
#[derive(Debug, Default)]
struct EffectiveCheck {
    /// Flag -> role -> the reported value, for the roles that report it.
    effective: BTreeMap<String, BTreeMap<String, String>>,
    /// One sentence per role whose reported value is not the configuration's.
    blocked: Vec<String>,
    /// One sentence per flag no engine reports.
    warnings: Vec<String>,
}

/// Compare every pinned and cell flag value with what the engines report after the
/// restart (`effective`, flag -> role -> the value its engine reports).
fn check_effective(
    pinned: &[Pin],
    cell: &[Pin],
    effective: &BTreeMap<String, Readback>,
) -> EffectiveCheck {
    let mut check = EffectiveCheck::default();
    let all = pinned
        .iter()
        .map(|Pin { flag: f, value: v }| (f, v, "pinned "))
        .chain(cell.iter().map(|Pin { flag: f, value: v }| (f, v, "")));
    for (flag, value, kind) in all {
        let reported = effective.get(&flag.name).cloned().unwrap_or_default();
        if reported.is_empty() {
            check
                .warnings
                .push(format!("{}: {NO_EFFECTIVE_WARNING}", flag.name));
            continue;
        }
        for d in crate::core::effective::disagreements(value, &reported) {
            let (role, ran) = (d.role, d.reported);
            check.blocked.push(format!(
                "{kind}{}={value} was written and read back, but the {role} engine reports \
                 it runs with {ran:?}: the cell's configuration did not take effect \
                 (check how role {role}'s launch config sets {}: a conditional, an \
                 overriding later line, an ignored variable)",
                flag.name,
                flag.setting.key()
            ));
        }
        check.effective.insert(flag.name.clone(), reported);
    }
    check
}
