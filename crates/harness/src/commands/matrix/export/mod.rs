//! The whole-file renderings of a matrix record, one file per format, rewritten after
//! every cell (so an interrupted night still leaves a readable directory): `matrix.json`,
//! `matrix.csv`, `summary.md`, `junit.xml`, `report.html`.

pub mod csv;
pub mod html;
pub mod json;
pub mod junit;
pub mod markdown;

use std::path::Path;

use anyhow::Context;

use super::record::MatrixRecord;
use crate::results::write_atomic;

/// One whole-file rendering of a matrix record.
pub trait MatrixExporter {
    /// File name inside the matrix directory.
    fn file_name(&self) -> &'static str;
    fn render(&self, record: &MatrixRecord) -> anyhow::Result<String>;
    /// Render with access to the matrix directory (the HTML report reads the cells'
    /// sessions and metrics from it).
    fn render_in(&self, record: &MatrixRecord, _dir: &Path) -> anyhow::Result<String> {
        self.render(record)
    }
}

pub fn exporters() -> Vec<Box<dyn MatrixExporter>> {
    vec![
        Box::new(json::MatrixJson),
        Box::new(csv::MatrixCsv),
        Box::new(markdown::MatrixSummary),
        Box::new(junit::JunitXml),
        Box::new(html::MatrixHtml),
    ]
}

/// Rewrite every export of `record` in `dir`, each atomically.
pub fn write_all(dir: &Path, record: &MatrixRecord) -> anyhow::Result<()> {
    for exporter in exporters() {
        let text = exporter.render_in(record, dir)?;
        write_atomic(&dir.join(exporter.file_name()), text.as_bytes())?;
    }
    Ok(())
}

/// Read `DIR/matrix.json`.
pub fn read_matrix(dir: &Path) -> anyhow::Result<MatrixRecord> {
    let path = dir.join(json::FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}
