//! The renderings of a history record, one file per format: `history.json`,
//! `history.md`, `history.html` (the dashboard) and `history-junit.xml`, written into the
//! history's directory beside the nights.

pub mod html;
pub mod junit;
pub mod markdown;

use std::path::Path;

use super::record::{HistoryRecord, FILE};
use crate::results::export::{self, Exporter};

/// Every whole-file format of a history record.
pub(crate) fn exporters() -> [&'static dyn Exporter<HistoryRecord>; 4] {
    [
        &crate::results::json::JsonFile(FILE),
        &markdown::HistorySummary,
        &junit::HistoryJunit,
        &html::HistoryHtml,
    ]
}

/// Rewrite every export of `record` in `dir`, each atomically.
pub fn write_all(dir: &Path, record: &HistoryRecord) -> anyhow::Result<()> {
    export::write_all(dir, record, &exporters())
}
