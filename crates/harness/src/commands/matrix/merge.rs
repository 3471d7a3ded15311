//! `bisect merge DIR...`: join the shard directories of one night into one matrix
//! directory whose cells are those an unsharded run would have written (same order,
//! same fields; only timing fields differ). A blocked cell (docs/matrix.md) is settled
//! like a finished one and merged as its shard recorded it. Refused, with the directories named: shards
//! of different plans (name or plan hash differ), a cell present in two shards, and
//! cells of the plan that no shard finished.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::export;
use super::record::{read_matrix, MatrixRecord, MergedShard, FILE, SCHEMA};
use crate::core::arm_stats::RecordStatus;
use crate::exit::Failure;

/// A joined matrix and, per cell id, the shard directory whose cell it took.
pub struct Merged {
    pub record: MatrixRecord,
    pub sources: BTreeMap<String, PathBuf>,
}

/// Read the shard directories and join them (nothing is written).
pub fn join(dirs: &[PathBuf], id: &str, command: &str) -> anyhow::Result<Merged> {
    if dirs.is_empty() {
        return Err(Failure::bad_input(
            "no directories to merge",
            "pass the shard directories, e.g. bisect merge results/night/*",
        )
        .into());
    }
    let shards = read_shards(dirs)?;
    let owner = cell_owners(&shards)?;
    check_all_settled(&shards, &owner)?;
    let sources = owner
        .iter()
        .map(|(id, (s, _))| (id.to_string(), shards[*s].0.clone()))
        .collect();
    let record = joined_record(&shards, &owner, id, command);
    Ok(Merged { record, sources })
}

/// Cell id -> (shard, cell) of the shard that settled it; a cell settled in two shards
/// is refused.
fn cell_owners(
    shards: &[(PathBuf, MatrixRecord)],
) -> anyhow::Result<BTreeMap<&str, (usize, usize)>> {
    let mut owner: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (s, (dir, r)) in shards.iter().enumerate() {
        for (c, cell) in r.cells.iter().enumerate() {
            if !cell.is_settled() {
                continue;
            }
            if let Some((other, _)) = owner.insert(cell.id.as_str(), (s, c)) {
                return Err(Failure::bad_input(
                    format!(
                        "overlapping shards: cell {} is in both {} and {}",
                        cell.id,
                        shards[other].0.display(),
                        dir.display()
                    ),
                    "merge one directory per shard (I/N with the same N, each I once)",
                )
                .into());
            }
        }
    }
    Ok(owner)
}

/// Refuse a join with a cell of the plan that no shard settled, naming every shard
/// given and how it ended.
fn check_all_settled(
    shards: &[(PathBuf, MatrixRecord)],
    owner: &BTreeMap<&str, (usize, usize)>,
) -> anyhow::Result<()> {
    let first = &shards[0].1;
    let missing: Vec<&str> = first
        .plan
        .cells
        .iter()
        .map(String::as_str)
        .filter(|id| !owner.contains_key(id))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let given: Vec<String> = shards
        .iter()
        .map(|(d, r)| {
            format!(
                "{} ({}, {})",
                d.display(),
                r.shard
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "whole".into()),
                r.header.status
            )
        })
        .collect();
    Err(Failure::bad_input(
        format!(
            "{} of {} cells are in no finished shard: {}\n  shards given: {}",
            missing.len(),
            first.plan.cells.len(),
            missing.join(", "),
            given.join("; ")
        ),
        "run the missing shards (or rerun the failed ones) and merge again",
    )
    .into())
}

/// The merged matrix record: the plan's cells in plan order, each from its owner shard
/// with its derived fields recomputed, and the shards' times and engine info combined.
fn joined_record(
    shards: &[(PathBuf, MatrixRecord)],
    owner: &BTreeMap<&str, (usize, usize)>,
    id: &str,
    command: &str,
) -> MatrixRecord {
    let first = &shards[0].1;
    let cells = first
        .plan
        .cells
        .iter()
        .map(|id| {
            let (s, c) = owner[id.as_str()];
            let mut cell = shards[s].1.cells[c].clone();
            cell.comparison = None;
            // A blocked cell never ran: its stats stay as its shard wrote them.
            if cell.is_finished() {
                cell.rederive();
            }
            cell
        })
        .collect();
    let mut engine_info = BTreeMap::new();
    for (_, r) in shards {
        engine_info.extend(r.engine_info.clone());
    }
    MatrixRecord {
        header: crate::results::RecordHeader {
            schema: SCHEMA.into(),
            id: id.to_string(),
            command: command.to_string(),
            started_at: shards
                .iter()
                .map(|(_, r)| r.header.started_at.clone())
                .min()
                .unwrap_or_default(),
            finished_at: shards
                .iter()
                .filter_map(|(_, r)| r.header.finished_at.clone())
                .max(),
            status: RecordStatus::Finished,
            target: first.header.target.clone(),
        },
        plan: first.plan.clone(),
        shard: None,
        merged_from: shards
            .iter()
            .map(|(d, r)| MergedShard {
                dir: d.display().to_string(),
                id: r.header.id.clone(),
                shard: r.shard,
            })
            .collect(),
        workload: first.workload.clone(),
        workload_hash: first.workload_hash.clone(),
        cells,
        baseline: None,
        regressions: Vec::new(),
        engine_info,
        // Shards run side by side, each on engines of its own: a replica set each.
        cost: Some(crate::core::cost::Cost::together(
            &shards
                .iter()
                .filter_map(|(_, r)| r.cost.clone())
                .collect::<Vec<_>>(),
        ))
        .filter(|c| c.replicas > 0),
        error: None,
        night: first.night.clone(),
    }
}

/// Read every shard's matrix.json and check they are shards of one plan.
fn read_shards(dirs: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, MatrixRecord)>> {
    let mut shards = Vec::new();
    for dir in dirs {
        let record = read_matrix(dir).map_err(|e| {
            Failure::bad_input(
                format!("{e:#}"),
                "pass directories written by `bisect matrix --shard I/N`",
            )
        })?;
        shards.push((dir.clone(), record));
    }
    let (first_dir, first) = &shards[0];
    for (dir, r) in &shards[1..] {
        if r.plan.name != first.plan.name || r.plan.hash != first.plan.hash {
            return Err(Failure::bad_input(
                format!(
                    "shards of different plans: {} is plan {:?} (hash {}), {} is plan {:?} (hash {})",
                    first_dir.display(),
                    first.plan.name,
                    first.plan.hash,
                    dir.display(),
                    r.plan.name,
                    r.plan.hash
                ),
                "merge only the shards of one night of one plan",
            ).into());
        }
        // One night ran one build: shards of different --night or --build are two nights.
        if (&r.night.label, &r.night.build) != (&first.night.label, &first.night.build) {
            return Err(Failure::bad_input(
                format!(
                    "shards of different nights: {} is night {:?} build {:?}, {} is night {:?} build {:?}",
                    first_dir.display(),
                    first.night.label,
                    first.night.build,
                    dir.display(),
                    r.night.label,
                    r.night.build
                ),
                "merge only the shards of one night (the same --night and --build)",
            ).into());
        }
    }
    Ok(shards)
}

/// Create `out` (which must not hold a matrix yet), copy each cell's sessions directory
/// from the shard it was taken from, and write the merged record's files.
pub fn write(merged: &Merged, out: &Path) -> anyhow::Result<()> {
    if out.join(FILE).exists() {
        return Err(Failure::bad_input(
            format!("{} already holds a matrix", out.display()),
            "pass a new --out directory",
        )
        .into());
    }
    std::fs::create_dir_all(out.join("cells"))
        .with_context(|| format!("creating {}", out.join("cells").display()))?;
    for cell in &merged.record.cells {
        let src = merged.sources[&cell.id].join(&cell.dir);
        if src.is_dir() {
            copy_dir(&src, &out.join(&cell.dir))?;
        }
    }
    export::write_all(out, &merged.record)
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("listing {}", from.display()))? {
        let entry = entry.with_context(|| format!("listing {}", from.display()))?;
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&path, &dest)?;
        } else {
            std::fs::copy(&path, &dest)
                .with_context(|| format!("copying {} to {}", path.display(), dest.display()))?;
        }
    }
    Ok(())
}
