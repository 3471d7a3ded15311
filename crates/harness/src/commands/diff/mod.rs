//! `bisect diff A B`: two results directories side by side, both runs (`run.json`) or both
//! matrices (`matrix.json`), read into the typed records ([`RunRecord`],
//! [`MatrixRecord`]). Arms are matched by label and cells by id; each matched pair gets
//! its counts, rates with Wilson 95% intervals, the change B - A with a Newcombe
//! (method 10) 95% interval, and a two-sided Fisher exact p (methods and references in
//! [`crate::core::stats`]). Around the rates: the confounds that differ between the two
//! directories (workload parameters, peak concurrency, tokens/s, wall time, flag
//! readbacks, engine info, the launch configs as applied), because a change in rate means
//! little when the load or the deployment changed.
//!
//! Older records load too: `run.json` keeps keys it does not know in
//! [`RunRecord::extra`], and unknown keys of `matrix.json` are ignored.
//!
//! Layout: [`rows`] pairs arms and cells and computes the rates, [`confounds`] lists
//! what differs in the records, [`launch`] compares the `launch/` snapshots, [`export`]
//! prints a table, markdown or JSON.

mod confounds;
pub mod export;
mod launch;
mod rows;

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use crate::commands::matrix::record::MatrixRecord;
use crate::core::evidence::Severity;
use crate::core::session::Counts;
use crate::exit::{Failure, Problem};
use crate::results::run_record::RunRecord;

pub use export::render;

/// Relative change above which a recorded quantity is flagged (docs/design.md 3.7's 25%).
pub(crate) const WARN_RATIO: f64 = 0.25;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Run,
    Matrix,
}

impl Kind {
    fn file(self) -> &'static str {
        match self {
            Kind::Run => "run.json",
            Kind::Matrix => "matrix.json",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Matrix => "matrix",
        }
    }
}

/// How `bisect diff` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Markdown,
    Json,
}

/// One results directory's record, typed.
#[derive(Debug, Clone)]
pub enum Record {
    Run(Box<RunRecord>),
    Matrix(Box<MatrixRecord>),
}

impl Record {
    pub fn kind(&self) -> Kind {
        match self {
            Record::Run(_) => Kind::Run,
            Record::Matrix(_) => Kind::Matrix,
        }
    }
}

/// One side's identity.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub path: String,
    pub id: String,
    /// Run verdict status (else the run's status); for a matrix compared with a baseline,
    /// its number of regressed cells (else its status).
    pub verdict: Option<String>,
}

/// One arm's or cell's corruption on one side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rate {
    pub sessions: u64,
    pub corrupted: u64,
    pub rate: f64,
    pub ci95: [f64; 2],
    pub counts: Counts,
}

/// One matched arm or cell; a side is `None` when only the other directory has it.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub key: String,
    pub a: Option<Rate>,
    pub b: Option<Rate>,
    /// B's rate minus A's.
    pub delta: Option<f64>,
    pub(crate) delta_ci95: Option<[f64; 2]>,
    pub p_value: Option<f64>,
}

/// Something that differs between A and B besides the rates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfoundDiff {
    /// `run`, `matrix`, `engine`, `launch`, or the arm label / cell id it belongs to.
    pub scope: String,
    pub name: String,
    pub a: Value,
    pub b: Value,
    /// blocking (rates not comparable), warning (differs by more than 25%, or a setting
    /// differs), info (recorded, within bounds).
    pub severity: Severity,
    pub note: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub kind: Kind,
    pub a: Side,
    pub b: Side,
    pub rows: Vec<Row>,
    pub confounds: Vec<ConfoundDiff>,
}

/// Which kind of results directory `dir` is, by the record file it holds. A directory
/// with neither file is bad input naming the run.json it expected.
pub(crate) fn kind_of(dir: &Path) -> anyhow::Result<Kind> {
    [Kind::Run, Kind::Matrix]
        .into_iter()
        .find(|k| dir.join(k.file()).is_file())
        .ok_or_else(|| {
            Failure::bad_input(
                format!(
                    "{}: no such file (and no matrix.json beside it)",
                    dir.join("run.json").display()
                ),
                "pass results directories written by `bisect run` or `bisect matrix`",
            )
            .into()
        })
}

/// The record of results directory `dir`. A record that does not parse is bad input
/// naming the file.
pub fn load(dir: &Path) -> anyhow::Result<Record> {
    let kind = kind_of(dir)?;
    let path = dir.join(kind.file());
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let bad = |e: serde_json::Error| {
        Failure::BadInput(Problem::message_only(format!(
            "{}: not a {} record bisect can read: {e}",
            path.display(),
            kind.noun()
        )))
    };
    Ok(match kind {
        Kind::Run => Record::Run(serde_json::from_str(&text).map_err(bad)?),
        Kind::Matrix => Record::Matrix(serde_json::from_str(&text).map_err(bad)?),
    })
}

/// Diff two results directories: the records, and the launch configs each one applied.
pub fn diff_dirs(a: &Path, b: &Path) -> anyhow::Result<Diff> {
    // Kinds first: a run against a matrix is refused before either record is parsed.
    let (kind_a, kind_b) = (kind_of(a)?, kind_of(b)?);
    if kind_a != kind_b {
        let describe =
            |k: Kind, p: &Path| format!("{} is a {} ({})", p.display(), k.noun(), k.file());
        return Err(Failure::bad_input(
            format!(
                "cannot diff a run against a matrix: {}, {}",
                describe(kind_a, a),
                describe(kind_b, b)
            ),
            "diff two runs or two matrices",
        )
        .into());
    }
    let mut diff = diff_records(a, &load(a)?, b, &load(b)?);
    diff.confounds.extend(launch::launch_confounds(a, b));
    Ok(diff)
}

/// Diff two records already loaded, of the same kind (`path_*` only name the sides).
/// A run against a matrix has nothing to pair: no rows, no confounds.
pub(crate) fn diff_records(path_a: &Path, a: &Record, path_b: &Path, b: &Record) -> Diff {
    let (rows, confounds) = match (a, b) {
        (Record::Run(x), Record::Run(y)) => (rows::run_rows(x, y), confounds::run_confounds(x, y)),
        (Record::Matrix(x), Record::Matrix(y)) => {
            (rows::matrix_rows(x, y), confounds::matrix_confounds(x, y))
        }
        _ => (Vec::new(), Vec::new()),
    };
    Diff {
        kind: a.kind(),
        a: side(path_a, a),
        b: side(path_b, b),
        rows,
        confounds,
    }
}

fn side(path: &Path, record: &Record) -> Side {
    let (id, verdict) = match record {
        Record::Run(r) => (
            r.header.id.clone(),
            r.verdict
                .as_ref()
                .map(|v| v.status.as_str())
                .unwrap_or(r.header.status.as_str())
                .to_string(),
        ),
        Record::Matrix(m) => (
            m.header.id.clone(),
            match m.baseline {
                Some(_) => format!("{} regressed cell(s)", m.regressions.len()),
                None => m.header.status.to_string(),
            },
        ),
    };
    Side {
        path: path.display().to_string(),
        id,
        verdict: Some(verdict),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::commands::matrix::record::CellRecord;
    use crate::core::arm_stats::{ArmLabel, ArmStats, RecordStatus};
    use crate::core::session::SessionClass;
    use crate::results::run_record::{ArmRecord, FlagInfo, TargetInfo};
    use serde_json::json;

    pub fn stats(corrupted: u64, sessions: u64, peak: u64, tokens_per_s: f64) -> ArmStats {
        let mut s = ArmStats {
            wall_s: 10.0,
            ..ArmStats::default()
        };
        s.counts[SessionClass::Done] = sessions - corrupted;
        s.counts[SessionClass::Leak] = corrupted;
        s.peak_running.insert("client".into(), peak);
        s.finish();
        s.tokens_per_s = tokens_per_s;
        s
    }

    fn arm(label: ArmLabel, corrupted: u64, sessions: u64, peak: u64) -> ArmRecord {
        let mut a = ArmRecord::new(label, "1", None);
        a.readback = [("prefill", "1"), ("decode", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        a.stats = stats(corrupted, sessions, peak, 1000.0);
        a.sessions = sessions;
        a
    }

    pub fn run(on: u64, sessions: u64, peak: u64) -> RunRecord {
        RunRecord {
            header: crate::results::RecordHeader {
                schema: crate::results::run_record::SCHEMA.into(),
                id: "r".into(),
                command: "bisect run".into(),
                started_at: "2025-01-01T00:00:00Z".into(),
                finished_at: None,
                status: RecordStatus::Finished,
                target: TargetInfo::bare("t", "http://x/v1"),
            },
            flag: FlagInfo {
                name: "BF16_INDEX_K".into(),
                env: Some("SGLANG_BF16".into()),
                arg: None,
                switch: None,
                roles: vec!["prefill".into(), "decode".into()],
                on: "1".into(),
                off: "0".into(),
            },
            workload: json!({"name": "agentic", "sessions": sessions, "rounds": 4}),
            sets: Default::default(),
            arms: vec![
                arm(ArmLabel::On, on, sessions, peak),
                arm(ArmLabel::Off, 0, sessions, peak),
            ],
            runs: Vec::new(),
            comparison: None,
            confounds: Vec::new(),
            verdict: None,
            engine_info: [(
                "on-r0/prefill".to_string(),
                json!({"env": {"X": "1"}, "pid": 1}),
            )]
            .into(),
            error: None,
            adaptive: None,
            phases: None,
            cost: None,
            pressure: None,
            extra: Default::default(),
        }
    }

    pub fn cell(id: &str, corrupted: u64, sessions: u64) -> CellRecord {
        crate::commands::matrix::export::html::tests::finished_cell(
            id,
            sessions as u32,
            &format!("hash-{id}"),
            stats(corrupted, sessions, sessions, 900.0),
        )
    }

    /// A finished matrix with these cells (the page test's record, reused).
    pub fn matrix(cells: Vec<CellRecord>) -> MatrixRecord {
        crate::commands::matrix::export::html::tests::matrix(cells)
    }

    fn runs(a: RunRecord, b: RunRecord) -> Diff {
        diff_records(
            Path::new("a"),
            &Record::Run(Box::new(a)),
            Path::new("b"),
            &Record::Run(Box::new(b)),
        )
    }

    #[test]
    fn sides_name_the_verdict_or_the_status() {
        let d = runs(run(14, 80, 80), run(0, 80, 80));
        assert_eq!(d.kind, Kind::Run);
        assert_eq!(d.a.id, "r");
        assert_eq!(d.a.verdict.as_deref(), Some("finished"));
    }

    #[test]
    fn run_against_matrix_and_missing_record_are_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let (run_dir, matrix_dir, empty) = (
            dir.path().join("r"),
            dir.path().join("m"),
            dir.path().join("e"),
        );
        for d in [&run_dir, &matrix_dir, &empty] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(
            run_dir.join("run.json"),
            serde_json::to_string(&run(1, 10, 5)).unwrap(),
        )
        .unwrap();
        // Not even a full record: the kinds are compared before anything is parsed.
        std::fs::write(matrix_dir.join("matrix.json"), r#"{"cells": []}"#).unwrap();
        let err = diff_dirs(&run_dir, &matrix_dir).unwrap_err();
        assert_eq!(
            crate::commands::code_for_error(&err),
            crate::exit::BAD_INPUT
        );
        assert!(
            format!("{err}").contains("cannot diff a run against a matrix"),
            "{err}"
        );
        let err = diff_dirs(&run_dir, &empty).unwrap_err();
        assert_eq!(
            crate::commands::code_for_error(&err),
            crate::exit::BAD_INPUT
        );
        assert!(
            format!("{err}").contains(&empty.join("run.json").display().to_string()),
            "{err}"
        );
        let err = diff_dirs(&matrix_dir, &matrix_dir).unwrap_err();
        assert_eq!(
            crate::commands::code_for_error(&err),
            crate::exit::BAD_INPUT
        );
        assert!(format!("{err}").contains("not a matrix record"), "{err}");
    }

    #[test]
    fn a_run_json_with_unknown_keys_still_diffs() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = serde_json::to_value(run(3, 10, 5)).unwrap();
        v["written_by_a_future_bisect"] = json!({"x": 1});
        for side in ["a", "b"] {
            std::fs::create_dir_all(dir.path().join(side)).unwrap();
            std::fs::write(dir.path().join(side).join("run.json"), v.to_string()).unwrap();
        }
        let d = diff_dirs(&dir.path().join("a"), &dir.path().join("b")).unwrap();
        assert_eq!(d.rows.len(), 2);
        assert!(d.confounds.iter().all(|c| c.severity == Severity::Info));
    }
}
