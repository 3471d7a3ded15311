//! `summary.md` of a culprit search: the verdict, the facts, the steps table.

use super::super::record::{failing_words, head, outcome_word, CulpritRecord, STEP_COLUMNS};
use crate::results::markup::table_header;
use crate::results::Exporter;

pub struct CulpritSummary;

impl Exporter<CulpritRecord> for CulpritSummary {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }
    fn render(&self, record: &CulpritRecord) -> anyhow::Result<String> {
        Ok(render_markdown(record))
    }
}

fn render_markdown(record: &CulpritRecord) -> String {
    let mut s = format!(
        "# bisect culprit {}\n\n`{}`\n\n",
        record.header.id, record.header.command
    );
    s.push_str(&format!(
        "**{}**\n\n",
        record.verdict.as_deref().unwrap_or("(not finished)")
    ));
    for line in head(record) {
        s.push_str(&format!("- {line}\n"));
    }
    s.push('\n');
    s.push_str(&table_header(&STEP_COLUMNS));
    for st in &record.steps {
        s.push_str(&format!(
            "| {} | {:?} | {} | {} | {}/{} | {} | {} |\n",
            st.step,
            st.kind,
            failing_words(record, st),
            outcome_word(st.outcome),
            st.corrupted,
            st.classified,
            st.blocks
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            st.reason.replace('|', "\\|")
        ));
    }
    s
}
