//! A matrix on replica sets (docs/matrix.md, "Replicas"): on a target that lists
//! several sets (`[[replica]]`) and no `--shard`, the restart groups are dealt to the
//! sets as shards are to machines (group g on set g mod N, [`Shard`]), every set runs
//! its shard at the same time on its own engines through the one matrix lifecycle
//! ([`run_matrix`]: its own journal, read-back, restart, identity and effective values,
//! probe, death watch, restore), each into `replicas/NAME/` under the matrix directory,
//! and the shards are merged into the matrix directory as `bisect merge` joins them.
//!
//! A cell's two sides are never split: every cell is one configuration, compared with
//! the same cell of a baseline night; the deal is fixed by the plan's groups and the
//! number of sets, so a nightly on the same target runs each cell on the same set every
//! night (a set that differs shows as a regression of its cells only when it changes,
//! as a build would). Wall time falls by the sets; engine-hours are every set's.

use std::path::PathBuf;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::cells::Shard;
use super::job::MatrixJob;
use super::merge;
use super::record::MatrixRecord;
use super::run::run_matrix;
use crate::arm::Progress;
use crate::commands::replicas::{first_failure, LaneProgress};
use crate::control::EngineControl;

/// A night whose set failed still has a matrix.json in the matrix directory (`bisect
/// history` reads that level only): the cells the sets settled, the others pending, the
/// sets' costs together, the failure as its status and error.
fn write_failed(
    job: &MatrixJob,
    lanes: &[MatrixJob],
    failed: &anyhow::Result<MatrixRecord>,
) -> anyhow::Result<()> {
    let mut record = super::run::initial_record(job);
    let mut costs = Vec::new();
    for lane in lanes {
        let Ok(shard) = super::record::read_matrix(&lane.dir) else {
            continue;
        };
        for cell in shard.cells.into_iter().filter(|c| c.is_settled()) {
            if let Some(slot) = record.cells.iter_mut().find(|c| c.id == cell.id) {
                *slot = cell;
            }
        }
        costs.extend(shard.cost);
    }
    record.cost = Some(crate::core::cost::Cost::together(&costs)).filter(|c| c.replicas > 0);
    (record.header.status, record.error) = crate::arm::settle(failed);
    record.header.finished_at = Some(super::record::now());
    super::export::write_all(&job.dir, &record)
}

/// Where set `name`'s shard of the matrix in `dir` runs.
pub fn lane_dir(dir: &std::path::Path, name: &str) -> PathBuf {
    dir.join("replicas").join(name)
}

/// Run `job` (no shard of its own) on every replica set of its target at once, one
/// control per set in the target's order, and merge the sets' shards into `job.dir`.
/// Every set's launch configs are restored whatever happened; a set whose shard failed
/// fails the matrix, its record (how far it got) kept in its folder.
pub async fn run_on_replicas(
    job: &MatrixJob,
    controls: Vec<&mut dyn EngineControl>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<MatrixRecord> {
    let sets = job.target.replica_sets();
    anyhow::ensure!(
        job.shard.is_none() && controls.len() == sets.len(),
        "a matrix on replicas: {} engine controls for {} sets, shard {:?}",
        controls.len(),
        sets.len(),
        job.shard
    );
    let count = sets.len() as u32;
    let jobs: Vec<MatrixJob> = sets
        .into_iter()
        .enumerate()
        .map(|(i, set)| {
            let name = set.replica_name().to_string();
            MatrixJob {
                id: format!("{}-{name}", job.id),
                dir: lane_dir(&job.dir, &name),
                shard: Some(Shard {
                    index: i as u32,
                    count,
                }),
                target: set,
                ..job.clone()
            }
        })
        .collect();
    let lanes: Vec<LaneProgress<'_>> = jobs
        .iter()
        .map(|j| LaneProgress::new(progress, Some(j.target.replica_name().to_string())))
        .collect();
    // A set that fails stops the others (their blocks could never be merged into this
    // night); Ctrl-C stops them all.
    let stop = cancel.child_token();
    let ran = futures::future::join_all(jobs.iter().zip(controls).zip(&lanes).map(
        |((lane, control), lane_progress)| {
            let stop = stop.clone();
            async move {
                let outcome = run_matrix(lane, control, lane_progress, stop.clone()).await;
                if outcome.is_err() {
                    stop.cancel();
                }
                outcome
            }
        },
    ))
    .await;
    let mut failures = Vec::new();
    for (lane, outcome) in jobs.iter().zip(ran) {
        if let Err(e) = outcome {
            // Every set's configs were restored by its own lifecycle whatever happened.
            failures.push(e.context(format!(
                "replica set {} (its record: {})",
                lane.target.replica_name(),
                lane.dir.display()
            )));
        }
    }
    if !failures.is_empty() {
        let failed: anyhow::Result<MatrixRecord> = Err(first_failure(failures, &cancel));
        write_failed(job, &jobs, &failed)?;
        return failed;
    }
    let dirs: Vec<PathBuf> = jobs.iter().map(|j| j.dir.clone()).collect();
    let merged = merge::join(&dirs, &job.id, &job.command).with_context(|| {
        format!(
            "merging the replica sets' shards into {}",
            job.dir.display()
        )
    })?;
    merge::write(&merged, &job.dir)?;
    Ok(merged.record)
}
