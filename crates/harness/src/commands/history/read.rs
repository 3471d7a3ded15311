//! Reading a history's nights: every `*/matrix.json` directly under the history's
//! directory, of one plan, ordered by night; nights a date sequence skips are absent;
//! each cell's night turned into what the core assesses ([`CellNight`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::NaiveDate;

use super::record::{CellKind, NightEntry, NightStatus};
use crate::commands::matrix::baseline::{mechanism_reason, night_condition};
use crate::commands::matrix::record::{read_matrix, CellRecord, MatrixRecord, FILE};
use crate::core::arm_stats::RecordStatus;
use crate::core::history::{CellNight, Observation, Tally};
use crate::exit::Failure;

/// A night with its record (`None`: absent).
pub struct Night {
    pub entry: NightEntry,
    pub record: Option<MatrixRecord>,
}

/// The nights of one plan under `dir`, oldest first, and the records skipped (why).
pub(crate) struct Nights {
    pub plan: String,
    pub nights: Vec<Night>,
    pub skipped: Vec<String>,
}

/// Read every night of `plan` (or of the only plan there) under `dir`. With `gaps`,
/// dates missing between the first and the last night are absent nights.
pub(crate) fn read_nights(dir: &Path, plan: Option<&str>, gaps: bool) -> anyhow::Result<Nights> {
    let mut found: Vec<(PathBuf, MatrixRecord)> = Vec::new();
    let mut skipped = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Failure::bad_input(
            format!("cannot list {}: {e}", dir.display()),
            "pass the results directory the nightly matrices are written to (--results)",
        )
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join(FILE).is_file())
        .collect();
    paths.sort();
    for path in paths {
        let name = relative(dir, &path);
        match read_matrix(&path) {
            Ok(r) if r.shard.is_some() => skipped.push(format!(
                "{name}: a shard (merge the night's shards with `bisect merge`)"
            )),
            Ok(r) => found.push((path, r)),
            Err(e) => skipped.push(format!("{name}: {e:#}")),
        }
    }
    let names: std::collections::BTreeSet<&str> =
        found.iter().map(|(_, r)| r.plan.name.as_str()).collect();
    let plan = match plan {
        Some(p) => p.to_string(),
        None if names.len() == 1 => names.iter().next().unwrap().to_string(),
        None if names.is_empty() => {
            return Err(Failure::bad_input(
                format!("{} holds no matrix (no */{FILE})", dir.display()),
                "run `bisect matrix PLAN --results DIR` nightly, then `bisect history DIR`",
            )
            .into())
        }
        None => {
            return Err(Failure::bad_input(
                format!(
                    "{} holds matrices of several plans: {}",
                    dir.display(),
                    names.into_iter().collect::<Vec<_>>().join(", ")
                ),
                "pass --plan NAME",
            )
            .into())
        }
    };
    let mut by_label: BTreeMap<String, Vec<(PathBuf, MatrixRecord)>> = BTreeMap::new();
    for (path, r) in found {
        if r.plan.name != plan {
            skipped.push(format!(
                "{}: plan {:?}, not {plan:?}",
                relative(dir, &path),
                r.plan.name
            ));
            continue;
        }
        by_label.entry(label_of(&r)).or_default().push((path, r));
    }
    if by_label.is_empty() {
        return Err(Failure::bad_input(
            format!("{} holds no night of plan {plan:?}", dir.display()),
            "pass the plan's name as its matrix.json says (`plan.name`)",
        )
        .into());
    }
    let mut nights: Vec<Night> = by_label
        .into_values()
        .map(|mut records| {
            // A rerun of a night replaces it: the newest finished one, else the newest.
            records.sort_by(|a, b| {
                let rank = |r: &MatrixRecord| (r.is_complete(), r.header.started_at.clone());
                rank(&a.1).cmp(&rank(&b.1))
            });
            let (path, record) = records.pop().expect("a label has a record");
            let replaced = records.iter().map(|(p, _)| relative(dir, p)).collect();
            night_of(dir, &path, record, replaced)
        })
        .collect();
    nights.sort_by(|a, b| {
        (date(&a.entry.label), &a.entry.started_at, &a.entry.label).cmp(&(
            date(&b.entry.label),
            &b.entry.started_at,
            &b.entry.label,
        ))
    });
    if gaps {
        nights = with_absent_dates(nights);
    }
    Ok(Nights {
        plan,
        nights,
        skipped,
    })
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `--night`, else the UTC date the matrix started.
fn label_of(r: &MatrixRecord) -> String {
    r.night
        .label
        .clone()
        .unwrap_or_else(|| r.header.started_at.chars().take(10).collect())
}

fn date(label: &str) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(label, "%Y-%m-%d").ok()
}

fn night_of(root: &Path, path: &Path, record: MatrixRecord, replaced: Vec<String>) -> Night {
    let builds: std::collections::BTreeSet<String> = record
        .engine_info
        .values()
        .filter_map(crate::core::effective::build_identity)
        .collect();
    let entry = NightEntry {
        label: label_of(&record),
        status: if record.header.status == RecordStatus::Finished {
            NightStatus::Finished
        } else {
            NightStatus::Unfinished
        },
        dir: Some(relative(root, path)),
        id: Some(record.header.id.clone()),
        started_at: Some(record.header.started_at.clone()),
        build: record.night.build.clone(),
        engine_build: (!builds.is_empty())
            .then(|| builds.into_iter().collect::<Vec<_>>().join("; ")),
        bisect_version: record.night.bisect_version.clone(),
        plan_hash: Some(record.plan.hash.clone()),
        replaced,
    };
    Night {
        entry,
        record: Some(record),
    }
}

/// Where every night is labelled by a date: an absent night for each date between the
/// first and the last that has none (a nightly that did not run is data missing).
fn with_absent_dates(nights: Vec<Night>) -> Vec<Night> {
    let dates: Option<Vec<NaiveDate>> = nights.iter().map(|n| date(&n.entry.label)).collect();
    let Some(dates) = dates else { return nights };
    let mut out = Vec::new();
    let mut iter = nights.into_iter().zip(dates).peekable();
    while let Some((night, d)) = iter.next() {
        out.push(night);
        if let Some((_, next)) = iter.peek() {
            let mut gap = d.succ_opt();
            while let Some(g) = gap.filter(|g| g < next) {
                out.push(Night {
                    entry: NightEntry {
                        label: g.format("%Y-%m-%d").to_string(),
                        status: NightStatus::Absent,
                        dir: None,
                        id: None,
                        started_at: None,
                        build: None,
                        engine_build: None,
                        bisect_version: None,
                        plan_hash: None,
                        replaced: Vec::new(),
                    },
                    record: None,
                });
                gap = g.succ_opt();
            }
        }
    }
    out
}

/// The plan's cells across the nights: the newest night's plan order, then cells only
/// older nights had.
pub(crate) fn cell_ids(nights: &[Night]) -> Vec<(String, CellKind)> {
    let mut ids: Vec<(String, CellKind)> = Vec::new();
    for night in nights.iter().rev() {
        let Some(r) = &night.record else { continue };
        for c in &r.cells {
            if !ids.iter().any(|(id, _)| *id == c.id) {
                let kind = if c.load.is_some() {
                    CellKind::Load
                } else {
                    CellKind::Rate
                };
                ids.push((c.id.clone(), kind));
            }
        }
    }
    ids
}

/// What keeps two nights of a cell comparable: its configuration and workload, the
/// engine and model, bisect's version (a new classifier judges differently).
fn chain_key(record: &MatrixRecord, cell: &CellRecord) -> String {
    let target = &record.header.target;
    format!(
        "config {} | workload {} | engine {} | model {} | bisect {}",
        cell.config_hash,
        cell.workload_hash,
        target.engine.as_deref().unwrap_or(&target.name),
        target.model,
        record.night.bisect_version.as_deref().unwrap_or("unknown")
    )
}

/// One cell's night as the core assesses it. `earlier_judged`: the judged sessions of
/// the cell's earlier measured nights (the under-sampling rule's reference).
pub(crate) fn observe(night: &Night, id: &str, earlier_judged: &[u64]) -> CellNight {
    let Some(record) = &night.record else {
        return CellNight::missing("no record of this night (the nightly did not run)");
    };
    let Some(cell) = record.cells.iter().find(|c| c.id == id) else {
        return CellNight::missing("not in this night's plan");
    };
    if cell.is_blocked() {
        return CellNight::missing(format!("blocked: {}", cell.blocked.join("; ")));
    }
    if !cell.is_finished() {
        return CellNight::missing(format!(
            "did not finish (status {:?}{})",
            cell.status,
            record
                .error
                .as_deref()
                .map(|e| format!("; the night's error: {e}"))
                .unwrap_or_default()
        ));
    }
    let tally = Tally::new(cell.stats.corrupted, cell.stats.judged());
    let chain = chain_key(record, cell);
    let unfit = night_condition(cell, &record.workload);
    if !unfit.is_empty() {
        return CellNight {
            chain,
            observation: Observation::Unfit { tally, why: unfit },
        };
    }
    let short = under_sampled(
        tally.judged,
        u64::from(cell.sessions) * u64::from(record.plan.repeats),
        earlier_judged,
    );
    let insufficient = match (short, mechanism_reason(cell)) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    CellNight {
        chain,
        observation: Observation::Measured {
            tally,
            insufficient,
        },
    }
}

/// A night is under-sampled when it judged fewer than half its plan's sessions (cell
/// sessions x repeats), or fewer than half the median of the cell's earlier nights.
pub(crate) fn under_sampled(judged: u64, planned: u64, earlier: &[u64]) -> Option<String> {
    if judged * 2 < planned {
        return Some(format!(
            "under-sampled: judged {judged} of the {planned} sessions its plan runs"
        ));
    }
    let mut sorted = earlier.to_vec();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).copied()?;
    (judged * 2 < median).then(|| {
        format!("under-sampled: judged {judged} sessions, under half the {median} of a usual night (the median of the earlier nights)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::diff::tests::stats;
    use crate::commands::matrix::export::html::tests::{finished_cell, matrix};

    /// A night of plan `plan` labelled `label`, one cell `s16` with `corrupted` of 16.
    fn write_night(root: &Path, dir: &str, plan: &str, label: &str, corrupted: u64) {
        let mut measured = stats(corrupted, 16, 16, 1.0);
        // The engine's own count of the load: the night ran at its target.
        measured.peak_running.insert("decode".into(), 16);
        let mut r = matrix(vec![finished_cell("s16", 16, "c", measured)]);
        r.plan.name = plan.into();
        r.header.started_at = format!("{label}T03:00:00.000Z");
        r.night = crate::commands::matrix::record::NightInfo::now(
            Some(label.into()),
            Some(format!("build-{dir}")),
        );
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(
            root.join(dir).join(FILE),
            serde_json::to_string(&r).unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn nights_by_label_with_reruns_absent_dates_and_strangers_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write_night(root, "a", "nightly", "2026-11-01", 0);
        write_night(root, "b1", "nightly", "2026-11-02", 0);
        write_night(root, "b2", "nightly", "2026-11-02", 3);
        write_night(root, "d", "nightly", "2026-11-04", 1);
        write_night(root, "other", "weekly", "2026-11-03", 0);
        std::fs::create_dir_all(root.join("broken")).unwrap();
        std::fs::write(root.join("broken").join(FILE), "{").unwrap();

        let read = read_nights(root, Some("nightly"), true).unwrap();
        let labels: Vec<(&str, NightStatus)> = read
            .nights
            .iter()
            .map(|n| (n.entry.label.as_str(), n.entry.status))
            .collect();
        assert_eq!(
            labels,
            [
                ("2026-11-01", NightStatus::Finished),
                ("2026-11-02", NightStatus::Finished),
                ("2026-11-03", NightStatus::Absent),
                ("2026-11-04", NightStatus::Finished),
            ]
        );
        // The rerun replaced the first record of its night (same start: the later dir).
        assert_eq!(read.nights[1].entry.dir.as_deref(), Some("b2"));
        assert_eq!(read.nights[1].entry.replaced, ["b1"]);
        assert_eq!(read.nights[1].entry.build.as_deref(), Some("build-b2"));
        assert_eq!(read.skipped.len(), 2, "{:?}", read.skipped);
        assert!(read
            .skipped
            .iter()
            .any(|s| s.starts_with("other: plan \"weekly\"")));
        assert!(read.skipped.iter().any(|s| s.starts_with("broken: ")));

        // The absent night is missing; the others are measured under one chain.
        let absent = observe(&read.nights[2], "s16", &[]);
        assert!(matches!(absent.observation, Observation::Missing { .. }));
        let measured = observe(&read.nights[1], "s16", &[16]);
        assert!(matches!(
            measured.observation,
            Observation::Measured { tally, insufficient: None } if tally == Tally::new(3, 16)
        ));
        assert_eq!(measured.chain, observe(&read.nights[0], "s16", &[]).chain);
        assert!(matches!(
            observe(&read.nights[0], "gone", &[]).observation,
            Observation::Missing { ref why } if why == "not in this night's plan"
        ));

        // Without --no-gaps' opposite, no absent nights; without --plan, two plans refuse.
        assert_eq!(
            read_nights(root, Some("nightly"), false)
                .unwrap()
                .nights
                .len(),
            3
        );
        let err = read_nights(root, None, true).err().unwrap().to_string();
        assert!(err.contains("several plans: nightly, weekly"), "{err}");
    }

    #[test]
    fn under_sampling_is_against_the_plan_and_the_usual_night() {
        assert!(under_sampled(64, 192, &[]).is_some());
        assert!(under_sampled(96, 192, &[]).is_none());
        assert!(under_sampled(64, 64, &[192, 192, 190]).is_some());
        assert!(under_sampled(150, 192, &[192, 192, 190]).is_none());
        assert!(under_sampled(64, 64, &[]).is_none());
    }
}
