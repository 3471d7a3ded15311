//! The whole-file renderings of a matrix record, one file per format, rewritten after
//! every cell (so an interrupted night still leaves a readable directory): `matrix.json`,
//! `matrix.csv`, `summary.md`, `junit.xml`, `report.html`.

pub mod csv;
pub mod html;
pub mod junit;
pub mod markdown;

use std::path::Path;

use super::record::{MatrixRecord, FILE};
use crate::results::export::{self, Exporter};

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
