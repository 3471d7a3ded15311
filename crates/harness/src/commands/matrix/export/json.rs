//! `matrix.json`: the record itself, pretty-printed (the contract other tools read).

use crate::commands::matrix::record::MatrixRecord;
use crate::results::Exporter;

pub const FILE: &str = "matrix.json";

pub(crate) struct MatrixJson;

impl Exporter<MatrixRecord> for MatrixJson {
    fn file_name(&self) -> &'static str {
        FILE
    }

    fn render(&self, record: &MatrixRecord) -> anyhow::Result<String> {
        let mut text = serde_json::to_string_pretty(record)?;
        text.push('\n');
        Ok(text)
    }
}
