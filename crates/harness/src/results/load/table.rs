//! The terminal table of a load sweep and its verdict.

use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};

use super::LoadRecord;
use super::{columns, facts, rows};
use crate::results::Exporter;

pub struct LoadTable;

impl Exporter<LoadRecord> for LoadTable {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, record: &LoadRecord) -> anyhow::Result<String> {
        Ok(render_table(record))
    }
}

/// The terminal table and the verdict.
pub(super) fn render_table(record: &LoadRecord) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(columns(record));
    for row in rows(record) {
        table.add_row(
            row.into_iter()
                .map(|c| Cell::new(c).set_alignment(CellAlignment::Left)),
        );
    }
    let mut out = format!("{table}\n");
    for line in facts(record) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&format!("verdict: {}\n", record.verdict()));
    out
}
