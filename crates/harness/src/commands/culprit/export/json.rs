//! `culprit.json`: the record itself (field names are a contract: extend, never rename).

use super::super::record::CulpritRecord;
use crate::results::Exporter;

pub(crate) struct CulpritJson;

impl Exporter<CulpritRecord> for CulpritJson {
    fn file_name(&self) -> &'static str {
        "culprit.json"
    }
    fn render(&self, record: &CulpritRecord) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(record)?)
    }
}
