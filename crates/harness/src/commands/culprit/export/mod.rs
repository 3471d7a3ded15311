//! The renderings of a culprit record, one file per format: `culprit.json`,
//! `summary.md`, `report.html` (rewritten after every block) and the terminal table.

pub mod html;
pub mod markdown;
pub mod table;

use super::record::CulpritRecord;
use crate::results::Exporter;

/// The whole-file formats, rewritten after every block.
pub fn files() -> [&'static dyn Exporter<CulpritRecord>; 3] {
    [
        &crate::results::json::JsonFile("culprit.json"),
        &markdown::CulpritSummary,
        &html::CulpritHtml,
    ]
}

/// Rewrite culprit.json, summary.md and report.html in `dir`, each atomically: the record does not write itself.
pub fn write(dir: &std::path::Path, record: &CulpritRecord) -> anyhow::Result<()> {
    crate::results::export::write_all(dir, record, &files())
}
