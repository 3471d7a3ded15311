//! A diff printed: a terminal table (comfy-table), markdown for a PR or an incident
//! channel, or the [`Diff`] itself as JSON. Numbers go through [`crate::core::format`].

use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};

use super::{Diff, Format, Kind, Rate, Row, Side};
use crate::core::format;
use crate::results::markdown::table_header;
use crate::results::table::compact;

const ROW_HEADER: [&str; 5] = [
    "arm/cell",
    "A corrupted [95% CI]",
    "B corrupted [95% CI]",
    "B - A [95% CI]",
    "Fisher p",
];
const CONFOUND_HEADER: [&str; 6] = ["scope", "confound", "A", "B", "severity", "note"];

pub fn render(d: &Diff, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Table => render_table(d),
        Format::Markdown => render_markdown(d),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(d)?;
            s.push('\n');
            s
        }
    })
}

fn rate_text(r: &Option<Rate>) -> String {
    match r {
        Some(r) => format::rate_interval(r.corrupted, r.sessions, r.ci95),
        None => "-".to_string(),
    }
}

fn delta_text(row: &Row) -> String {
    match (row.delta, row.delta_ci95) {
        (Some(d), Some([lo, hi])) => format!(
            "{} [{}, {}]",
            format::signed_percent(d),
            format::signed_percent(lo),
            format::signed_percent(hi)
        ),
        _ => "-".to_string(),
    }
}

fn p_text(row: &Row) -> String {
    row.p_value
        .map(format::p_value)
        .unwrap_or_else(|| "-".to_string())
}

/// The cells of one rate row, in ROW_HEADER order.
fn row_cells(r: &Row) -> [String; 5] {
    [
        r.key.clone(),
        rate_text(&r.a),
        rate_text(&r.b),
        delta_text(r),
        p_text(r),
    ]
}

/// The cells of one confound row, in CONFOUND_HEADER order.
fn confound_cells(d: &Diff) -> impl Iterator<Item = [String; 6]> + '_ {
    d.confounds.iter().map(|c| {
        [
            c.scope.clone(),
            c.name.clone(),
            compact(&c.a),
            compact(&c.b),
            c.severity.as_str().to_string(),
            c.note.clone(),
        ]
    })
}

fn side_text(name: &str, s: &Side) -> String {
    format!(
        "{name}: {} (id {}{})",
        s.path,
        s.id,
        s.verdict
            .as_ref()
            .map(|v| format!(", {v}"))
            .unwrap_or_default()
    )
}

fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::Run => "runs",
        Kind::Matrix => "matrices",
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
pub fn render_table(d: &Diff) -> String {
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

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn md_row(cells: &[String]) -> String {
    let cells: Vec<String> = cells.iter().map(|c| md_cell(c)).collect();
    format!("| {} |\n", cells.join(" | "))
}

/// Markdown for a PR or an incident channel.
pub fn render_markdown(d: &Diff) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::tests::run;
    use super::super::{diff_records, Record};
    use super::*;
    use std::path::Path;

    fn diff() -> Diff {
        diff_records(
            Path::new("a"),
            &Record::Run(Box::new(run(14, 80, 80))),
            Path::new("b"),
            &Record::Run(Box::new(run(0, 64, 80))),
        )
    }

    #[test]
    fn markdown_rows_and_confounds() {
        let md = render_markdown(&diff());
        assert!(md.starts_with("# bisect diff of two runs\n\n- A: a (id r, finished)\n"));
        assert!(
            md.contains(
                "| on | 14/80 = 17.5% [10.7%, 27.3%] | 0/64 = 0.0% [0.0%, 5.7%] | -17.5% ["
            ),
            "{md}"
        );
        assert!(
            md.contains("| run | workload sessions | 80 | 64 | blocking |"),
            "{md}"
        );
    }

    #[test]
    fn table_and_json() {
        let d = diff();
        let t = render(&d, Format::Table).unwrap();
        assert!(
            t.contains("B - A [95% CI]") && t.contains("workload sessions"),
            "{t}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(&d, Format::Json).unwrap()).unwrap();
        assert_eq!(v["kind"], "run");
        assert_eq!(v["confounds"][0]["severity"], "blocking");
        assert_eq!(v["rows"][0]["a"]["counts"]["leak"], 14);
    }
}
