//! `run.json`: the machine-readable record (docs/design.md 3.6).

use super::run_record::RunRecord;
use super::Exporter;

pub(crate) struct RunJson;

impl Exporter<RunRecord> for RunJson {
    fn file_name(&self) -> &'static str {
        "run.json"
    }
    fn render(&self, record: &RunRecord) -> anyhow::Result<String> {
        let mut s = serde_json::to_string_pretty(record)?;
        s.push('\n');
        Ok(s)
    }
}
