//! `summary.md` of a load sweep: verdict, facts, the table of levels.

use super::LoadRecord;
use super::{columns, facts, rows};
use crate::results::markup::table_header;
use crate::results::Exporter;

pub(crate) struct LoadSummary;

impl Exporter<LoadRecord> for LoadSummary {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }
    fn render(&self, record: &LoadRecord) -> anyhow::Result<String> {
        Ok(render_markdown(record))
    }
}

pub(super) fn render_markdown(record: &LoadRecord) -> String {
    let mut s = format!(
        "# bisect load {}\n\n`{}`\n\n",
        record.header.id, record.header.command
    );
    s.push_str(&format!("**{}**\n\n", record.verdict()));
    for line in facts(record) {
        s.push_str(&format!("- {line}\n"));
    }
    s.push('\n');
    s.push_str(&table_header(&columns(record)));
    for row in rows(record) {
        s.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    s
}
