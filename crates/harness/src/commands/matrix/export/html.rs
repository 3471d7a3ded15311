//! `report.html`: the matrix as a self-contained page, rendered from the typed
//! [`MatrixRecord`]: the plan, target, workload and baseline, the regressed cells with
//! their reasons, corruption rate per cell with Wilson whiskers, the first bad round per
//! cell, the load sweeps' thresholds, and the concurrency timelines and worst sessions
//! read from the cells' directories. The sections and the page frame are those of the run page
//! ([`crate::results::html`]).

use std::fmt::Write as _;
use std::path::Path;

use crate::commands::matrix::baseline::load as load_cell;
use crate::commands::matrix::record::{CellRecord, CellStatus, MatrixRecord};
use crate::core::format;
use crate::core::session::SessionClass;
use crate::core::session::SessionResult;
use crate::results::cells::{compact, peaks};
use crate::results::charts::{self, RateBar, RoundCounts};
use crate::results::html::{
    find_files, first_bad_histogram, first_bad_round_section, rate_bar, read_sessions_lenient,
    sessions_section, target_fact, timelines_section,
};
use crate::results::markup::{escape, facts_list, figure, list, page, verdict_box};
use crate::results::Exporter;

/// How deep below the matrix directory sessions.jsonl and metrics.csv are looked for
/// (`cells/<id>/sessions.jsonl`, with a level to spare).
const CELL_FILES_DEPTH: usize = 3;

pub struct MatrixHtml;

impl Exporter<MatrixRecord> for MatrixHtml {
    fn file_name(&self) -> &'static str {
        "report.html"
    }

    fn render(&self, record: &MatrixRecord) -> anyhow::Result<String> {
        Ok(render_matrix_html(record, None))
    }

    fn render_in(&self, record: &MatrixRecord, dir: &Path) -> anyhow::Result<String> {
        Ok(render_matrix_html(record, Some(dir)))
    }
}

/// The page of one `bisect matrix` directory. `dir` supplies the cells' sessions.jsonl and
/// metrics.csv; without it the page shows the record alone.
pub(crate) fn render_matrix_html(record: &MatrixRecord, dir: Option<&Path>) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>bisect matrix <code>{}</code></h1>\n<p class=\"meta\">{} &middot; status <b>{}</b> &middot; started {} &middot; finished {}</p>",
        escape(&record.plan.name),
        escape(&record.header.id),
        record.header.status,
        escape(&record.header.started_at),
        escape(record.header.finished_at.as_deref().unwrap_or("-"))
    );
    body.push_str(&facts_list(&facts(record)));
    body.push_str(&regressions_section(record));

    // A load cell has no one rate: its thresholds are their own section.
    let bars: Vec<RateBar> = record
        .cells
        .iter()
        .filter(|c| c.load.is_none())
        .map(|c| rate_bar(&c.id, &c.stats))
        .collect();
    body.push_str("<h2>Corruption rate per cell</h2>\n");
    body.push_str(&figure(charts::rate_bars(
        "corrupted sessions per cell, pooled over repeats",
        &bars,
    )));
    body.push_str(&cells_table(&record.cells));
    body.push_str(&load_sweeps(&record.cells));

    let (sessions, metrics) = match dir {
        Some(d) => (
            find_files(d, "sessions.jsonl", CELL_FILES_DEPTH)
                .iter()
                .flat_map(|p| read_sessions_lenient(p))
                .collect(),
            find_files(d, "metrics.csv", CELL_FILES_DEPTH)
                .iter()
                .flat_map(|p| charts::read_metrics(p))
                .collect(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    body.push_str(&first_bad_round_section(&first_bad_rounds(
        &record.cells,
        &sessions,
    )));
    body.push_str(&timelines_section(&metrics));
    body.push_str(&sessions_section(&sessions));
    page(
        &format!("bisect matrix {}: {}", record.plan.name, record.header.id),
        &body,
    )
}

/// Plan, shard, target, workload, pinned flags, baseline, error: each escaped.
fn facts(r: &MatrixRecord) -> Vec<String> {
    let mut facts = vec![format!(
        "plan <code>{}</code> (hash <code>{}</code>): {} of its {} cells here, repeats {}",
        escape(&r.plan.path),
        escape(&r.plan.hash),
        r.cells.len(),
        r.plan.cells.len(),
        r.plan.repeats
    )];
    if let Some(shard) = &r.shard {
        facts.push(format!(
            "shard {shard}: a partial matrix; join the shards with <code>bisect merge</code>"
        ));
    }
    if !r.merged_from.is_empty() {
        facts.push(format!("merged from {} shards", r.merged_from.len()));
    }
    facts.push(target_fact(&r.header.target));
    facts.push(format!(
        "workload <code>{}</code> (hash <code>{}</code>)",
        escape(&compact(&r.workload)),
        escape(&r.workload_hash)
    ));
    if !r.plan.set.is_empty() {
        let sets: Vec<String> = r.plan.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        facts.push(format!(
            "pinned in every cell: <code>{}</code>",
            escape(&sets.join(", "))
        ));
    }
    facts.push(match &r.baseline {
        Some(b) => format!(
            "baseline <code>{}</code> ({}, started {}): {} compared ({}, {}-corrected, alpha {}, min effect {}){}, {} not comparable, {} new, {} missing here",
            escape(&b.id),
            escape(&b.chosen),
            escape(&b.started_at),
            b.compared,
            escape(&b.test),
            escape(&b.correction),
            r.plan.policy.alpha,
            format::percent(r.plan.policy.min_effect),
            super::markdown::inconclusive_words(b.inconclusive),
            b.not_comparable,
            b.new,
            b.missing.len()
        ),
        None => "baseline: none compared".to_string(),
    });
    for c in r.cells.iter().filter(|c| c.is_blocked()) {
        facts.push(format!(
            "<b>blocked</b> (not driven, never compared) <code>{}</code>: {}",
            escape(&c.id),
            escape(&c.blocked.join("; "))
        ));
    }
    let mut warnings: Vec<&String> = r.cells.iter().flat_map(|c| &c.warnings).collect();
    warnings.sort();
    warnings.dedup();
    for w in warnings {
        facts.push(format!("warning: {}", escape(w)));
    }
    if let Some(e) = &r.error {
        facts.push(format!("error <code>{}</code>", escape(e)));
    }
    facts
}

/// The regressed cells with their reasons, else the inconclusive ones (no pass either);
/// nothing without a baseline, where there is nothing to regress from.
fn regressions_section(r: &MatrixRecord) -> String {
    if r.baseline.is_none() {
        return String::new();
    }
    let reasons: Vec<String> = r
        .regressions
        .iter()
        .map(|id| {
            let why = r
                .cells
                .iter()
                .find(|c| &c.id == id)
                .and_then(|c| c.comparison.as_ref())
                .map(|x| x.reasons.join("; "))
                .unwrap_or_default();
            format!("{id}: {why}")
        })
        .collect();
    let inconclusive: Vec<String> = r
        .cells
        .iter()
        .filter(|c| c.verdict() == Some(CellStatus::Inconclusive))
        .map(|c| {
            let why = c.comparison.as_ref().map(|x| x.reasons.join("; "));
            format!("{}: {}", c.id, why.unwrap_or_default())
        })
        .collect();
    if reasons.is_empty() && !inconclusive.is_empty() {
        return verdict_box(
            "inconclusive",
            &format!(
                "0 regressed cell(s), {} inconclusive (not shown ok)",
                inconclusive.len()
            ),
            &list(&inconclusive),
        );
    }
    let class = if reasons.is_empty() {
        "cleared"
    } else {
        "implicated"
    };
    verdict_box(
        class,
        &format!("{} regressed cell(s)", reasons.len()),
        &list(&reasons),
    )
}

fn cells_table(cells: &[CellRecord]) -> String {
    let mut s = String::from("<table><tr><th>cell</th><th>sessions</th><th>corrupted</th><th>error/timeout</th><th>peak running</th><th>tok/s</th><th>wall</th><th>status</th></tr>\n");
    for c in cells {
        let status = match c.verdict() {
            Some(v) => format!("{}, {}", c.status, v.name()),
            None => c.status.to_string(),
        };
        if let Some(load) = &c.load {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td class=\"num\">{}</td><td>threshold {}</td><td>-</td><td>-</td><td>-</td><td class=\"num\">{:.1}s</td><td>{}</td></tr>",
                escape(&c.id),
                load.sessions_spent,
                escape(&load.threshold),
                c.stats.wall_s,
                escape(&status),
            );
            continue;
        }
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}/{}</td><td>{}</td><td class=\"num\">{:.0}</td><td class=\"num\">{:.1}s</td><td>{}</td></tr>",
            escape(&c.id),
            c.stats.sessions(),
            format::rate_interval(c.stats.corrupted, c.stats.judged(), c.stats.ci95),
            c.stats.counts[SessionClass::Error],
            c.stats.counts[SessionClass::Timeout],
            escape(&peaks(&c.stats.peak_running)),
            c.stats.tokens_per_s,
            c.stats.wall_s,
            escape(&status),
        );
    }
    s.push_str("</table>\n");
    s
}

/// The load cells: sweep, threshold, the baseline's and the move, the verdict, and a link
/// to the cell's own report (its chart).
fn load_sweeps(cells: &[CellRecord]) -> String {
    let sweeps: Vec<&CellRecord> = cells.iter().filter(|c| c.load.is_some()).collect();
    if sweeps.is_empty() {
        return String::new();
    }
    let mut s = String::from("<h2>Load sweeps</h2>\n<table><tr><th>cell</th><th>sweep</th><th>threshold</th><th>baseline</th><th>change</th><th>verdict</th></tr>\n");
    for c in sweeps {
        let load = c.load.as_ref().expect("filtered");
        let _ = writeln!(
            s,
            "<tr><td><a href=\"{}/report.html\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.dir),
            escape(&c.id),
            escape(&load.sweep_words()),
            escape(&load.threshold),
            escape(&load_cell::baseline_words(c)),
            escape(&load_cell::change_words(c)),
            escape(&load.verdict),
        );
    }
    s.push_str("</table>\n");
    s
}

/// Per cell with any corruption: sessions per first bad round, as recorded, or counted
/// from the cell's sessions (labelled with the cell id) for a record that lacks it.
fn first_bad_rounds(cells: &[CellRecord], sessions: &[SessionResult]) -> Vec<RoundCounts> {
    cells
        .iter()
        .filter_map(|c| {
            let per_round = if c.stats.first_bad_round.is_empty() {
                first_bad_histogram(sessions.iter().filter(|s| s.label == c.id))
            } else {
                c.stats.first_bad_round.clone()
            };
            per_round.iter().any(|n| *n > 0).then(|| RoundCounts {
                label: c.id.clone(),
                per_round,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::commands::matrix::plan::RegressionPolicy;
    use crate::commands::matrix::record::{BaselineInfo, CellComparison, CellStatus, PlanInfo};
    use crate::core::arm_stats::{ArmStats, RecordStatus};
    use crate::core::session::{ChatMessage, Counts, SessionClass};
    use crate::results::run_record::TargetInfo;

    fn cell(id: &str, leak: u64, done: u64, first_bad_round: Vec<u64>) -> CellRecord {
        let mut stats = ArmStats {
            counts: Counts::from([(SessionClass::Leak, leak), (SessionClass::Done, done)]),
            first_bad_round,
            wall_s: 4.0,
            ..ArmStats::default()
        };
        stats.peak_running.insert("client".into(), leak + done);
        stats.finish();
        finished_cell(id, (leak + done) as u32, "c", stats)
    }

    /// A finished cell `id` of `sessions` sessions in group 0 with these `stats`, no
    /// comparison: also the cell of diff's tests.
    pub(crate) fn finished_cell(
        id: &str,
        sessions: u32,
        config_hash: &str,
        stats: ArmStats,
    ) -> CellRecord {
        CellRecord {
            id: id.into(),
            group: 0,
            flags: Default::default(),
            sessions,
            rounds: 4,
            config_hash: config_hash.into(),
            workload_hash: "w".into(),
            status: RecordStatus::Finished,
            readback: Default::default(),
            effective: Default::default(),
            blocked: Vec::new(),
            warnings: Vec::new(),
            stats,
            dir: format!("cells/{id}"),
            comparison: None,
            load: None,
        }
    }

    /// A finished matrix of `cells`, no baseline: also the record of diff's tests.
    pub(crate) fn matrix(cells: Vec<CellRecord>) -> MatrixRecord {
        MatrixRecord {
            header: crate::results::RecordHeader {
                schema: crate::commands::matrix::record::SCHEMA.into(),
                id: "m1".into(),
                command: "bisect matrix plan.toml".into(),
                started_at: "2025-01-01T00:00:00.000Z".into(),
                finished_at: None,
                status: RecordStatus::Finished,
                target: TargetInfo::bare("fake", "http://127.0.0.1:1/v1"),
            },
            plan: PlanInfo {
                name: "nightly".into(),
                path: "plan.toml".into(),
                hash: "h".into(),
                repeats: 1,
                policy: RegressionPolicy::default(),
                set: Default::default(),
                cells: cells.iter().map(|c| c.id.clone()).collect(),
            },
            shard: None,
            merged_from: Vec::new(),
            workload: serde_json::json!({"name": "smoke"}),
            workload_hash: "w".into(),
            cells,
            baseline: None,
            regressions: Vec::new(),
            engine_info: Default::default(),
            cost: None,
            error: None,
            night: Default::default(),
        }
    }

    #[test]
    fn cells_rates_rounds_and_sessions_from_the_typed_record() {
        let dir = tempfile::tempdir().unwrap();
        let cell_dir = dir.path().join("cells/BF16=1,s16");
        std::fs::create_dir_all(&cell_dir).unwrap();
        let mut leak = SessionResult {
            label: "BF16=1,s16".into(),
            repeat: 0,
            index: 3,
            class: SessionClass::Leak,
            rounds_used: 2,
            first_bad_round: Some(2),
            evidence: "<｜DSML｜parameter>".into(),
            transcript: vec![ChatMessage::new("assistant", "<script>")],
            rounds: Vec::new(),
            latency_ms: Vec::new(),
            completion_tokens: 0,
            error: None,
            oracle: None,
            timing: None,
        };
        let line = serde_json::to_string(&leak).unwrap();
        leak.index = 4;
        let line2 = serde_json::to_string(&leak).unwrap();
        std::fs::write(
            cell_dir.join("sessions.jsonl"),
            format!("{line}\n{line2}\n{{half"),
        )
        .unwrap();
        let record = matrix(vec![
            cell("BF16=1,s16", 3, 13, vec![0, 3]),
            // No first_bad_round kept: counted from the cell's sessions.
            cell("BF16=0 <x>,s16", 0, 16, Vec::new()),
        ]);
        let html = render_matrix_html(&record, Some(dir.path()));
        assert!(!html.contains("<script"), "engine text must be escaped");
        assert!(html.contains("&lt;｜DSML｜parameter&gt;"));
        assert!(html.contains("BF16=0 &lt;x&gt;,s16"));
        assert!(html.contains("3/16 = 18.8%"), "{html}");
        assert!(html.contains("0/16 = 0.0% [0.0%, 19.4%]"), "{html}");
        assert_eq!(
            html.matches("<details class=\"session corrupted\">")
                .count(),
            2
        );
        assert_eq!(
            html.matches("<svg").count(),
            2,
            "rate bars + first bad round"
        );
        assert!(html.contains("No metrics.csv"));
        assert!(
            !html.contains("regressed cell(s)"),
            "no baseline, no verdict"
        );
    }

    #[test]
    fn regressed_cells_are_listed_with_their_reasons() {
        let mut regressed = cell("a", 9, 7, vec![9]);
        regressed.comparison = Some(CellComparison {
            status: CellStatus::Regressed,
            baseline_sessions: 16,
            baseline_corrupted: 0,
            baseline_rate: 0.0,
            baseline_ci95: [0.0, 0.19],
            rate_diff: 9.0 / 16.0,
            p_value: Some(1e-4),
            p_adjusted: Some(2e-4),
            baseline_tokens_per_s: 0.0,
            tokens_per_s_ratio: None,
            reasons: vec!["corruption rose".into()],
            threshold: None,
        });
        let mut record = matrix(vec![regressed, cell("b", 0, 16, Vec::new())]);
        record.regressions = vec!["a".into()];
        record.baseline = Some(BaselineInfo {
            dir: "old".into(),
            id: "m0".into(),
            started_at: "2024-12-31T00:00:00.000Z".into(),
            chosen: "explicit".into(),
            test: "fisher".into(),
            correction: "holm".into(),
            compared: 2,
            regressed: 1,
            not_comparable: 0,
            new: 0,
            blocked: 0,
            inconclusive: 0,
            missing: Vec::new(),
        });
        let html = render_matrix_html(&record, None);
        assert!(html.contains("<section class=\"verdict implicated\"><h2>1 regressed cell(s)</h2>"));
        assert!(html.contains("<li>a: corruption rose</li>"), "{html}");
        assert!(html.contains("finished, regressed"));
        assert!(html.contains("No sessions.jsonl"));

        // No regression, but a cell that cannot be shown ok: never the green box.
        let cmp = record.cells[0].comparison.as_mut().unwrap();
        cmp.status = CellStatus::Inconclusive;
        cmp.reasons = vec!["this night's cell judged only 0 of 16 sessions".into()];
        record.regressions.clear();
        let b = record.baseline.as_mut().unwrap();
        (b.regressed, b.inconclusive) = (0, 1);
        let html = render_matrix_html(&record, None);
        assert!(
            html.contains("<section class=\"verdict inconclusive\"><h2>0 regressed cell(s), 1 inconclusive (not shown ok)</h2>"),
            "{html}"
        );
        assert!(
            html.contains("<li>a: this night&#39;s cell judged only 0 of 16"),
            "{html}"
        );
        assert!(html.contains("1 of them inconclusive"), "{html}");
        assert!(html.contains("finished, inconclusive"));
    }
}
