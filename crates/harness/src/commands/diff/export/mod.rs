//! A diff printed, one exporter per format: a terminal table (comfy-table), markdown
//! for a PR or an incident channel, or the [`Diff`] itself as JSON. This module holds
//! the cells the table and markdown share; numbers go through [`crate::core::format`].

pub mod markdown;
pub mod table;

use super::{Diff, Format, Kind, Rate, Row, Side};
use crate::core::format;
use crate::results::cells::compact;
use crate::results::Exporter;

pub(super) const ROW_HEADER: [&str; 5] = [
    "arm/cell",
    "A corrupted [95% CI]",
    "B corrupted [95% CI]",
    "B - A [95% CI]",
    "Fisher p",
];
pub(super) const CONFOUND_HEADER: [&str; 6] = ["scope", "confound", "A", "B", "severity", "note"];

/// The diff in `format`, through that format's exporter.
pub fn render(d: &Diff, format: Format) -> anyhow::Result<String> {
    exporter(format).render(d)
}

/// The one exporter of each format.
pub fn exporter(format: Format) -> &'static dyn Exporter<Diff> {
    match format {
        Format::Table => &table::DiffTable,
        Format::Markdown => &markdown::DiffMarkdown,
        Format::Json => &crate::results::json::JsonFile("diff.json"),
    }
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
pub(super) fn row_cells(r: &Row) -> [String; 5] {
    [
        r.key.clone(),
        rate_text(&r.a),
        rate_text(&r.b),
        delta_text(r),
        p_text(r),
    ]
}

/// The cells of one confound row, in CONFOUND_HEADER order.
pub(super) fn confound_cells(d: &Diff) -> impl Iterator<Item = [String; 6]> + '_ {
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

pub(super) fn side_text(name: &str, s: &Side) -> String {
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

pub(super) fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::Run => "runs",
        Kind::Matrix => "matrices",
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::run;
    use super::super::{diff_records, Record};
    use super::markdown::render_markdown;
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
