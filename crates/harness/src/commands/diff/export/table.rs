//! `bisect diff`'s terminal table (comfy-table): both sides, the rate rows, the
//! confounds that differ.

use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};

use super::{
    confound_cells, kind_word, row_cells, side_text, Diff, Exporter, CONFOUND_HEADER, ROW_HEADER,
};

pub(crate) struct DiffTable;

impl Exporter<Diff> for DiffTable {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, d: &Diff) -> anyhow::Result<String> {
        Ok(render_table(d))
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().map(Cell::new));
    t
}

/// The terminal table (comfy-table).
fn render_table(d: &Diff) -> String {
    let mut rates = table(&ROW_HEADER);
    for r in &d.rows {
        rates.add_row(row_cells(r).into_iter().enumerate().map(|(i, text)| {
            let cell = Cell::new(text);
            if i == 0 {
                cell
            } else {
                cell.set_alignment(CellAlignment::Right)
            }
        }));
    }
    let mut out = format!(
        "bisect diff of two {}\n{}\n{}\n{rates}\n",
        kind_word(d.kind),
        side_text("A", &d.a),
        side_text("B", &d.b)
    );
    if d.confounds.is_empty() {
        out.push_str("no confound differs\n");
    } else {
        let mut t = table(&CONFOUND_HEADER);
        for cells in confound_cells(d) {
            t.add_row(cells);
        }
        out.push_str(&format!("{t}\n"));
    }
    out
}
