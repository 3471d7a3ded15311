//! What `bisect load` writes and prints: `load.json` (the record below; field names are
//! a contract, extend, never rename), `summary.md`, `report.html` (with the chart of
//! [`chart`]) and the terminal table.

pub mod chart;
pub mod html;
pub mod markdown;
pub mod table;

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::core::format::percent_digits;
use crate::core::load::report::{e_words, p_words, rate_words, ArmCount, LevelReport};
use crate::core::load::{LoadParams, LoadReport};
use crate::results::json::JsonFile;

/// The record's file in a load sweep's directory.
const JSON: &str = "load.json";
use crate::results::export::{self, Exporter};

/// The whole-file formats, rewritten after every block.
pub fn files() -> [&'static dyn Exporter<LoadRecord>; 3] {
    [&JsonFile(JSON), &markdown::LoadSummary, &html::LoadHtml]
}

pub(crate) const SCHEMA: &str = "bisect.load/1";

/// `bisect report DIR` of a load directory: summary.md and report.html rendered again
/// from its load.json, which is left as it was written (a record read back and written
/// again would lose the keys a later version added).
pub fn rerender(dir: &Path) -> anyhow::Result<LoadRecord> {
    let record = LoadRecord::read(dir)?;
    export::write_all(dir, &record, &[&markdown::LoadSummary, &html::LoadHtml])?;
    Ok(record)
}

/// `load.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadRecord {
    /// schema, id, command, times, status, target: the header every record opens with.
    #[serde(flatten)]
    pub header: crate::results::RecordHeader,
    /// The flag each level is an A/B of (`on` vs `off`); `None`: the configuration as it is.
    pub flag: Option<String>,
    /// Pinned for every block (`--set NAME=VALUE`).
    pub pinned: Vec<String>,
    /// The base workload; block b runs it with seed + b - 1 at its level.
    pub workload: serde_json::Value,
    pub params: LoadParams,
    /// What the sweep found so far (rewritten after every block).
    pub report: Option<LoadReport>,
    /// A pressure sweep: each level's filler sized to its share of the KV cache
    /// (core::pressure), in the order of the levels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pressure: Vec<crate::core::pressure::Sizing>,
    pub wall_s: f64,
    /// On replica sets: the set each block ran on, by block number (a level's arms on
    /// one set); empty on one set.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub replicas: std::collections::BTreeMap<u64, String>,
    /// What the sweep cost: restarts, driving, engine-hours, wall (core::cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::core::cost::Cost>,
    pub error: Option<String>,
}

/// Rewrite load.json, summary.md and report.html in `dir`, each atomically: the record
/// does not write itself.
pub fn write(dir: &Path, record: &LoadRecord) -> anyhow::Result<()> {
    export::write_all(dir, record, &files())
}

impl LoadRecord {
    /// Read `DIR/load.json`.
    pub fn read(dir: &Path) -> anyhow::Result<LoadRecord> {
        let path = dir.join(JSON);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub(super) fn verdict(&self) -> &str {
        self.report
            .as_ref()
            .map_or("(no block finished)", |r| r.verdict.as_str())
    }
}

/// The table's columns; the first names the sweep's axis.
pub(super) fn columns(record: &LoadRecord) -> [&'static str; 8] {
    [
        record.params.axis.unit(),
        COLUMNS[1],
        COLUMNS[2],
        COLUMNS[3],
        COLUMNS[4],
        COLUMNS[5],
        COLUMNS[6],
        COLUMNS[7],
    ]
}

const COLUMNS: [&str; 8] = [
    "in flight",
    "arm",
    "corrupted",
    "95% CI",
    "fit [band]",
    "engine peak",
    "test",
    "status",
];

fn arm_cells(l: &LevelReport, arm: &ArmCount, name: &str, first: bool) -> Vec<String> {
    let ci = crate::core::stats::wilson(arm.corrupted, arm.judged, 0.95);
    let fit = match (first, l.fit, l.band) {
        (true, Some(f), Some([lo, hi])) => format!(
            "{}% [{}, {}]",
            percent_digits(f),
            percent_digits(lo),
            percent_digits(hi)
        ),
        _ => String::new(),
    };
    let test = match (first, l.holm_p, l.e_value) {
        (true, Some(p), _) => format!("Holm p {}", p_words(p)),
        (true, _, Some(e)) => format!("e {}", e_words(e)),
        _ => String::new(),
    };
    let status = match (first, &l.short, l.status, l.implied) {
        (true, Some(_), _, _) => "not reported (short)".to_string(),
        (true, None, _, Some(implied)) => format!("{} (implied)", implied.word()),
        (true, None, Some(s), None) => s.word(),
        (true, None, None, _) => "baseline".to_string(),
        _ => String::new(),
    };
    if arm.sessions == 0 {
        let level = if first {
            l.level.to_string()
        } else {
            String::new()
        };
        return vec![
            level,
            name.into(),
            "not run".into(),
            String::new(),
            String::new(),
            "-".into(),
            String::new(),
            status,
        ];
    }
    vec![
        if first {
            l.level.to_string()
        } else {
            String::new()
        },
        name.to_string(),
        rate_words(arm),
        format!("{}-{}%", percent_digits(ci.0), percent_digits(ci.1)),
        fit,
        arm.peak_engine.map_or("-".into(), |p| p.to_string()),
        test,
        status,
    ]
}

/// One row per arm of every level.
pub(super) fn rows(record: &LoadRecord) -> Vec<Vec<String>> {
    let Some(report) = &record.report else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for l in &report.levels {
        let name = if l.off.is_some() { "on" } else { "level" };
        rows.push(arm_cells(l, &l.arm, name, true));
        if let Some(off) = &l.off {
            rows.push(arm_cells(l, off, "off", false));
        }
    }
    rows
}

/// Sessions, restarts, why it stopped, warnings, the error.
pub(super) fn facts(record: &LoadRecord) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(r) = &record.report {
        lines.push(format!(
            "{} sessions in {} blocks ({} restarts), {:.1} s; stopped: {}",
            r.sessions_spent,
            r.blocks.len(),
            r.restarts,
            record.wall_s,
            if r.stopped.is_empty() {
                "still running"
            } else {
                &r.stopped
            }
        ));
        if let Some(cost) = &record.cost {
            lines.push(cost.line());
        }
        if let Some(line) = replicas_line(record) {
            lines.push(line);
        }
        for sizing in &record.pressure {
            lines.push(sizing.words());
        }
        if r.contradicts_monotone {
            lines.push(
                "the counts contradict a rate that never falls with load (the band is empty somewhere): the fit and the threshold assume it does".into(),
            );
        }
        for w in &r.warnings {
            lines.push(format!("warning: {w}"));
        }
    }
    if let Some(e) = &record.error {
        lines.push(format!("error: {e}"));
    }
    lines
}

/// Which set ran which levels, when the sweep ran on replica sets.
fn replicas_line(record: &LoadRecord) -> Option<String> {
    let report = record.report.as_ref()?;
    let mut by_set: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for b in &report.blocks {
        let Some(set) = record.replicas.get(&b.block) else {
            continue;
        };
        let levels = by_set.entry(set.as_str()).or_default();
        if !levels.contains(&b.level) {
            levels.push(b.level);
        }
    }
    (!by_set.is_empty()).then(|| {
        let sets: Vec<String> = by_set
            .iter()
            .map(|(set, levels)| {
                let levels: Vec<String> = levels.iter().map(u32::to_string).collect();
                format!("set {set}: levels {}", levels.join(", "))
            })
            .collect();
        format!(
            "on replica sets at once, each level's arms on one set: {}",
            sets.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::arm_stats::RecordStatus;
    use crate::core::evidence::Policy;
    use crate::core::load::simulate::{curves, sweep_curve};
    use crate::core::load::{Allocation, DEFAULT_LEVELS};
    use crate::results::load::{html::render_html, markdown::render_markdown, table::render_table};

    fn record(allocation: Allocation) -> LoadRecord {
        let params = LoadParams::new(
            DEFAULT_LEVELS.to_vec(),
            false,
            allocation,
            &Policy::default(),
            3,
        );
        let report = sweep_curve(curves()[0].1, &params, 11);
        LoadRecord {
            header: crate::results::RecordHeader {
                schema: SCHEMA.into(),
                id: "test-load".into(),
                command: "bisect load".into(),
                started_at: "2026-12-02T00:00:00Z".into(),
                finished_at: None,
                status: RecordStatus::Finished,
                target: serde_json::from_value(serde_json::json!({
                    "name": "embedded", "api": "chat", "model": "m", "profile": null, "roles": []
                }))
                .unwrap(),
            },
            flag: None,
            pinned: Vec::new(),
            workload: serde_json::Value::Null,
            params,
            report: Some(report),
            pressure: Vec::new(),
            wall_s: 1.0,
            replicas: Default::default(),
            cost: None,
            error: None,
        }
    }

    #[test]
    fn the_table_names_untested_levels_and_what_the_model_implies() {
        let r = record(Allocation::Adaptive { max_sessions: 480 });
        let table = render_table(&r);
        assert!(
            table.contains("baseline") && table.contains("rises"),
            "{table}"
        );
        assert!(
            table.contains("verdict: lowest reproducing load: 32"),
            "{table}"
        );
        // Levels 8 lies below the level shown flat: implied, never run.
        assert!(
            table.contains("not run") && table.contains("flat (implied)"),
            "{table}"
        );
        let md = render_markdown(&r);
        assert!(md.contains("| in flight | arm |"), "{md}");
    }

    #[test]
    fn the_chart_has_every_level_the_fit_and_the_threshold() {
        let r = record(Allocation::Fixed { sessions: 160 });
        let html = render_html(&r);
        let svg = &html[html.find("<svg").unwrap()..html.find("</svg>").unwrap()];
        // One rate point per level, one engine-side square per level.
        assert_eq!(svg.matches("<circle").count(), 6 + 1, "{svg}");
        assert_eq!(svg.matches("<rect").count(), 6 + 2, "{svg}");
        assert!(svg.contains("<polygon") && svg.contains("<polyline"));
        assert!(svg.contains("threshold 32"));
        assert!(svg.contains("engine-side peak running"));
        assert!(!html.contains("NaN"));
    }
}
