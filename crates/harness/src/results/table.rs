//! The terminal table printed at the end of `bisect run` (comfy-table), and the row
//! formatting it shares with the markdown summary.

use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};

use super::cells::{arm_cells, compact, header, legend, Shown};
use super::run_record::RunRecord;
use crate::core::format;

/// The terminal report of a run, printed after it and by `bisect report`.
pub struct RunTable;

impl super::Exporter<RunRecord> for RunTable {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, record: &RunRecord) -> anyhow::Result<String> {
        Ok(render(record))
    }
}

/// The whole terminal report: arms table, comparison, confounds, verdict.
pub fn render(record: &RunRecord) -> String {
    let shown = Shown::of(record);
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header(shown).into_iter().map(Cell::new));
    for arm in &record.arms {
        table.add_row(
            arm_cells(&record.flag.name, arm, false, shown)
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    let cell = Cell::new(s);
                    if (1..=5).contains(&i) || i >= 7 {
                        cell.set_alignment(CellAlignment::Right)
                    } else {
                        cell
                    }
                }),
        );
    }
    let params = crate::core::workload::WorkloadParams::read(&record.workload);
    let number = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
    let mut out = format!(
        "bisect run {}: workload {} ({} sessions x {} rounds, ctx {}), {} arm block(s)\n{table}\n{}\n",
        record.flag.name,
        params.name.as_deref().unwrap_or("?"),
        number(params.sessions),
        number(params.rounds),
        number(params.ctx),
        record.runs.len(),
        legend(shown),
    );
    if let Some(c) = &record.comparison {
        out.push_str(&format!(
            "difference on-off: {} [{}, {}] (Newcombe 95%), Fisher exact two-sided p = {}\n",
            format::signed_percent(c.rate_diff),
            format::signed_percent(c.diff_ci95[0]),
            format::signed_percent(c.diff_ci95[1]),
            format::p_value(c.p_value)
        ));
    }
    for c in &record.confounds {
        out.push_str(&format!(
            "confound [{}] {}: on {} / off {}: {}\n",
            serde_json::to_value(c.severity)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            c.name,
            compact(&c.on),
            compact(&c.off),
            c.note
        ));
    }
    out.push_str(&super::sequential_view::text(record));
    if let Some(v) = &record.verdict {
        out.push_str(&format!("verdict: {}\n", v.summary));
        for r in &v.reasons {
            out.push_str(&format!("  - {r}\n"));
        }
    } else if let Some(e) = &record.error {
        out.push_str(&format!("no verdict ({}): {e}\n", record.header.status));
    }
    out
}
