//! `load.json`: the record itself (field names are a contract: extend, never rename).

use super::LoadRecord;
use crate::results::Exporter;

pub(crate) struct LoadJson;

impl Exporter<LoadRecord> for LoadJson {
    fn file_name(&self) -> &'static str {
        "load.json"
    }
    fn render(&self, record: &LoadRecord) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(record)?)
    }
}
