//! The terminal summary of a culprit search: the steps table, then the facts and the
//! verdict.

use comfy_table::{presets, Cell, ContentArrangement, Table};

use super::super::record::{failing_words, head, outcome_word, CulpritRecord, STEP_COLUMNS};
use crate::results::Exporter;

/// Printed after the search (and by `bisect report`-style reads of culprit.json).
pub struct CulpritTable;

impl Exporter<CulpritRecord> for CulpritTable {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, record: &CulpritRecord) -> anyhow::Result<String> {
        Ok(render_table(record))
    }
}

/// The terminal summary: verdict, then the steps.
fn render_table(record: &CulpritRecord) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(&STEP_COLUMNS[..6]);
    for s in &record.steps {
        table.add_row(vec![
            Cell::new(s.step),
            Cell::new(format!("{:?}", s.kind).to_lowercase()),
            Cell::new(failing_words(record, s)),
            Cell::new(outcome_word(s.outcome)),
            Cell::new(format!("{}/{}", s.corrupted, s.classified)),
            Cell::new(
                s.blocks
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]);
    }
    let mut out = format!("{table}\n");
    for line in head(record) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&format!(
        "verdict: {}\n",
        record.verdict.as_deref().unwrap_or("(not finished)")
    ));
    out
}
