//! `bisect diff --format json`: the [`Diff`] itself.

use super::{Diff, Exporter};

pub(crate) struct DiffJson;

impl Exporter<Diff> for DiffJson {
    fn file_name(&self) -> &'static str {
        "diff.json"
    }
    fn render(&self, d: &Diff) -> anyhow::Result<String> {
        let mut s = serde_json::to_string_pretty(d)?;
        s.push('\n');
        Ok(s)
    }
}
