//! `bisect diff --format md`: markdown for a PR or an incident channel.

use super::{
    confound_cells, kind_word, row_cells, side_text, Diff, Exporter, CONFOUND_HEADER, ROW_HEADER,
};
use crate::results::markup::table_header;

pub(crate) struct DiffMarkdown;

impl Exporter<Diff> for DiffMarkdown {
    fn file_name(&self) -> &'static str {
        "diff.md"
    }
    fn render(&self, d: &Diff) -> anyhow::Result<String> {
        Ok(render_markdown(d))
    }
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn md_row(cells: &[String]) -> String {
    let cells: Vec<String> = cells.iter().map(|c| md_cell(c)).collect();
    format!("| {} |\n", cells.join(" | "))
}

/// Markdown for a PR or an incident channel.
pub(super) fn render_markdown(d: &Diff) -> String {
    let mut s = format!("# bisect diff of two {}\n\n", kind_word(d.kind));
    s.push_str(&format!(
        "- {}\n- {}\n\n",
        md_cell(&side_text("A", &d.a)),
        md_cell(&side_text("B", &d.b))
    ));
    s.push_str(&table_header(&ROW_HEADER));
    for r in &d.rows {
        s.push_str(&md_row(&row_cells(r)));
    }
    if d.confounds.is_empty() {
        s.push_str("\nNo confound differs.\n");
    } else {
        s.push_str("\n## Confounds\n\n");
        s.push_str(&table_header(&CONFOUND_HEADER));
        for cells in confound_cells(d) {
            s.push_str(&md_row(&cells));
        }
    }
    s
}
