//! Running a load cell of the matrix (`[[cell]] kind = "load"`, docs/load.md "In the
//! matrix"): the sweep `bisect load` runs ([`crate::commands::load::sweep_on`], the same
//! blocks, tests and record) on the matrix's testbed, with its `load.json`, `summary.md`,
//! `report.html` and `blocks/` in the cell's directory. What `matrix.json` keeps of it is
//! [`super::record::LoadCellRecord`]; its comparison with the baseline night is
//! [`super::baseline::load`].

use std::collections::BTreeMap;
use std::time::Instant;

use super::cells::Cell;
use super::export;
use super::job::{cell_dir, MatrixJob};
use super::record::{LoadCellRecord, MatrixRecord};
use crate::arm::{Readback, Testbed};
use crate::commands::load::{finish, started_record, sweep_on, Sweep};
use crate::core::arm_stats::RecordStatus;

/// Run load cell `i` of `record` on `bed`: the sweep's files go to the cell's directory
/// after every block, the matrix's after the sweep. The sweep's error (the matrix
/// stops, as on a group that cannot run) comes back after both are written.
pub(super) async fn run(
    job: &MatrixJob,
    bed: &mut Testbed<'_>,
    record: &mut MatrixRecord,
    i: usize,
    cell: &Cell,
    pinned: &BTreeMap<String, Readback>,
) -> anyhow::Result<()> {
    let sweep = cell.load.as_ref().expect("a load cell");
    let dir = cell_dir(&job.dir, cell);
    std::fs::create_dir_all(&dir)?;
    let mut workload = job.plan.workload.clone();
    workload.rounds = cell.rounds;
    let params = job.plan.sweep_params(sweep);
    let mut load = started_record(
        cell.id.clone(),
        job.command.clone(),
        bed.target(),
        sweep.flag.as_ref(),
        &job.plan.pins,
        &workload,
        &params,
    );
    crate::results::load::write(&dir, &load)?;
    bed.progress().note(&format!(
        "{}: load sweep, {} levels",
        cell.id,
        sweep.levels.len()
    ));
    record.cells[i].status = RecordStatus::Running;
    let started = Instant::now();
    let on = Sweep {
        flag: sweep.flag.as_ref(),
        fixed: &cell.flags,
        pins: &job.plan.pins,
        workload: &workload,
        params: &params,
        dir: &dir,
        oracle: job.oracle,
    };
    let outcome = sweep_on(bed, &on, &mut load, started).await;
    let written = finish(&mut load, &outcome, started, &dir);
    let finished = crate::arm::record_written(outcome, written).map(|_| ());
    let rec = &mut record.cells[i];
    rec.load = Some(LoadCellRecord::of(sweep, load.report.as_ref()));
    rec.stats.wall_s = load.wall_s;
    rec.readback = pinned.clone();
    for w in load.report.iter().flat_map(|r| &r.warnings) {
        rec.warnings.push(format!("{}: {w}", cell.id));
    }
    if finished.is_ok() {
        rec.status = RecordStatus::Finished;
    }
    export::write_all(&job.dir, record)?;
    finished
}
