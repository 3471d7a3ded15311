//! The whole-file renderings of a matrix record, one file per format, rewritten after
//! every cell (so an interrupted night still leaves a readable directory): `matrix.json`,
//! `matrix.csv`, `summary.md`, `junit.xml`, `report.html`.

pub mod csv;
pub mod html;
pub mod junit;
pub mod markdown;

use std::path::Path;

use anyhow::Context;

use super::record::MatrixRecord;
use crate::results::export::{self, Exporter};

/// The record's file in a matrix's directory (the contract other tools read).
pub const FILE: &str = "matrix.json";

/// Every whole-file format of a matrix record.
pub(crate) fn exporters() -> [&'static dyn Exporter<MatrixRecord>; 5] {
    [
        &crate::results::json::JsonFile(FILE),
        &csv::MatrixCsv,
        &markdown::MatrixSummary,
        &junit::JunitXml,
        &html::MatrixHtml,
    ]
}

/// Rewrite every export of `record` in `dir`, each atomically.
pub fn write_all(dir: &Path, record: &MatrixRecord) -> anyhow::Result<()> {
    export::write_all(dir, record, &exporters())
}

/// Read `DIR/matrix.json`.
pub fn read_matrix(dir: &Path) -> anyhow::Result<MatrixRecord> {
    let path = dir.join(FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}
