//! `report.html`: the matrix as a self-contained page (charts and worst sessions drawn by
//! `report::html`, which reads the cells' sessions and metrics from the directory).

use std::path::Path;

use super::MatrixExporter;
use crate::commands::matrix::record::MatrixRecord;

pub struct MatrixHtml;

impl MatrixExporter for MatrixHtml {
    fn file_name(&self) -> &'static str {
        "report.html"
    }

    fn render(&self, record: &MatrixRecord) -> anyhow::Result<String> {
        Ok(crate::results::html::render_matrix_html(
            &serde_json::to_value(record)?,
            Path::new("."),
        ))
    }

    fn render_in(&self, record: &MatrixRecord, dir: &Path) -> anyhow::Result<String> {
        Ok(crate::results::html::render_matrix_html(
            &serde_json::to_value(record)?,
            dir,
        ))
    }
}
