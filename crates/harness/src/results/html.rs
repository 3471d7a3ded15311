//! `report.html` of a run, and the parts every bisect page is built from. One
//! self-contained page per results directory that a person opens in a browser or attaches
//! to a ticket. No network: styles are inline, there is no script, and the charts are
//! inline SVG from [`super::charts`].
//!
//! A run's page shows the verdict with its reasons and confounds, corruption rate per arm
//! with Wilson whiskers, the round at which corruption first appears, the concurrency
//! timeline of every arm block (metrics.csv), and the worst sessions' evidence with their
//! transcripts collapsed in `<details>`. The matrix page
//! (`commands::matrix::export::html`) is assembled from the same sections. Everything
//! that came from the engine (evidence, transcripts, engine info) is HTML-escaped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::cells::{arm_cells, compact, comparison_sentence, header, legend, Shown};
use super::charts::{self, RateBar, RoundCounts};
use super::markup::{escape, facts_list, figure, list, page, verdict_box};
use super::run_record::{ArmRecord, RunRecord, TargetInfo};
use super::Exporter;
use crate::core::arm_stats::ArmStats;
use crate::core::session::SessionResult;

/// Sessions shown with evidence and transcript: enough to see the pattern, few enough that
/// the page stays small.
pub const WORST_SESSIONS: usize = 12;
/// Characters of one transcript message shown before it is cut (ctx filler is long).
pub(crate) const MESSAGE_MAX_CHARS: usize = 2000;
/// Arm blocks or cells drawn as timelines.
const MAX_TIMELINES: usize = 24;

/// The exporter registered with [`super::REPORTS`]: rewritten after each arm block.
pub(crate) struct HtmlReport;

impl Exporter<RunRecord> for HtmlReport {
    fn file_name(&self) -> &'static str {
        "report.html"
    }

    fn render(&self, record: &RunRecord) -> anyhow::Result<String> {
        Ok(render_run_html(record, None))
    }

    fn render_in(&self, record: &RunRecord, dir: &Path) -> anyhow::Result<String> {
        Ok(render_run_html(record, Some(dir)))
    }
}

/// The page of one `bisect run` directory. `dir` supplies sessions.jsonl and metrics.csv;
/// without it (or without those files) the page shows the record alone.
pub(crate) fn render_run_html(record: &RunRecord, dir: Option<&Path>) -> String {
    let mut body = run_header(record);
    body.push_str(&run_verdict(record));
    let bars: Vec<RateBar> = record
        .arms
        .iter()
        .map(|a| {
            rate_bar(
                &format!("{} ({}={})", a.label, record.flag.name, a.value),
                &a.stats,
            )
        })
        .collect();
    body.push_str("<h2>Corruption rate per arm</h2>\n");
    body.push_str(&figure(charts::rate_bars(
        "corrupted sessions per arm, pooled over repeats",
        &bars,
    )));
    let shown = Shown::of(record);
    body.push_str(&arms_table(&record.flag.name, &record.arms, false, shown));
    let _ = writeln!(body, "<p class=\"meta\">{}</p>", escape(&legend(shown)));
    if record.runs.len() > record.arms.len() {
        body.push_str("<h3>Arm blocks in execution order</h3>\n");
        body.push_str(&arms_table(&record.flag.name, &record.runs, true, shown));
    }
    if let Some(c) = &record.comparison {
        let _ = writeln!(body, "<p>{}</p>", escape(&comparison_sentence(c)));
    }
    body.push_str(&run_confounds(record));
    body.push_str(&run_mechanism(record));
    body.push_str(&run_deaths(record));
    body.push_str(&run_lives(record));
    body.push_str(&super::sequential_view::html(record));
    let rounds: Vec<RoundCounts> = record
        .arms
        .iter()
        .map(|a| RoundCounts {
            label: a.label.to_string(),
            per_round: a.stats.first_bad_round.clone(),
        })
        .collect();
    body.push_str(&first_bad_round_section(&rounds));
    body.push_str(&trend_section(&record.flag.name, &record.arms));
    let (sessions, metrics) = match dir {
        Some(d) => (
            read_sessions_lenient(&d.join("sessions.jsonl")),
            charts::read_metrics(&d.join("metrics.csv")),
        ),
        None => (Vec::new(), Vec::new()),
    };
    body.push_str(&timelines_section(&metrics));
    body.push_str(&sessions_section(&sessions));
    body.push_str(&engine_info_section(&record.engine_info));
    page(
        &format!("bisect run {}: {}", record.flag.name, record.header.id),
        &body,
    )
}

/// Title, identity and the facts of the run (flag, target, workload, command).
fn run_header(record: &RunRecord) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<h1>bisect run <code>{}</code></h1>\n<p class=\"meta\">{} &middot; status <b>{}</b> &middot; started {} &middot; finished {}</p>",
        escape(&record.flag.name),
        escape(&record.header.id),
        escape(record.header.status.as_str()),
        escape(&record.header.started_at),
        escape(record.header.finished_at.as_deref().unwrap_or("-"))
    );
    let flag = &record.flag;
    let setting = flag
        .env
        .as_ref()
        .map(|v| format!("env {v}"))
        .or_else(|| flag.arg.as_ref().map(|v| format!("arg {v}")))
        .or_else(|| flag.switch.as_ref().map(|v| format!("switch {v}")))
        .unwrap_or_default();
    let facts = [
        format!(
            "flag <code>{}</code> ({}) in roles {}; on = <code>{}</code>, off = <code>{}</code>",
            escape(&flag.name),
            escape(&setting),
            escape(&flag.roles.join(", ")),
            escape(&flag.on),
            escape(&flag.off),
        ),
        target_fact(&record.header.target),
        format!(
            "workload <code>{}</code>",
            escape(&compact(&record.workload))
        ),
        format!("command <code>{}</code>", escape(&record.header.command)),
    ];
    s.push_str(&facts_list(&facts));
    s
}

/// The verdict box, or why there is none.
fn run_verdict(record: &RunRecord) -> String {
    if let Some(v) = &record.verdict {
        let direction = v
            .direction
            .as_ref()
            .map(|d| format!("<p>Direction: {}</p>", escape(d)))
            .unwrap_or_default();
        verdict_box(
            v.status.as_str(),
            &format!("Verdict: {}", v.status.as_str()),
            &format!(
                "<p>{}</p>{direction}{}",
                escape(&v.summary),
                list(&v.reasons)
            ),
        )
    } else if let Some(e) = &record.error {
        verdict_box(
            "inconclusive",
            &format!("No verdict ({})", record.header.status.as_str()),
            &format!("<pre>{}</pre>", escape(e)),
        )
    } else {
        String::new()
    }
}

/// Whether the flag's path ran, by its witnesses, per arm.
fn run_mechanism(record: &RunRecord) -> String {
    let lines = record.mechanism_lines();
    if lines.is_empty() {
        return String::new();
    }
    let mut s = String::from("<h2>Mechanism</h2>\n<ul>\n");
    for line in &lines {
        s.push_str(&format!("<li>{}</li>\n", escape(line)));
    }
    s.push_str("</ul>\n");
    s
}

/// The blocks' engine lives: restarts after deaths, the death budget, canaries.
fn run_lives(record: &RunRecord) -> String {
    let lines = record.life_lines();
    if lines.is_empty() {
        return String::new();
    }
    let mut s = String::from("<h2>Engine lives</h2>\n<ul>\n");
    for line in &lines {
        s.push_str(&format!("<li>{}</li>\n", escape(line)));
    }
    s.push_str("</ul>\n");
    s
}

/// The engine deaths, each with the log lines before it, collapsed.
fn run_deaths(record: &RunRecord) -> String {
    let deaths = record.death_lines();
    if deaths.is_empty() {
        return String::new();
    }
    let mut s = String::from("<h2>Engine deaths</h2>\n<ul>\n");
    for (line, log) in &deaths {
        s.push_str(&format!("<li>{}", escape(line)));
        if !log.is_empty() {
            s.push_str(&format!(
                "<details><summary>the log before it</summary><pre>{}</pre></details>",
                escape(&log.join("\n"))
            ));
        }
        s.push_str("</li>\n");
    }
    s.push_str("</ul>\n");
    s
}

fn run_confounds(record: &RunRecord) -> String {
    if record.confounds.is_empty() {
        return String::new();
    }
    let mut s = String::from("<h2>Confounds</h2>\n<table><tr><th>confound</th><th>on</th><th>off</th><th>severity</th><th>note</th></tr>\n");
    for c in &record.confounds {
        let _ = writeln!(
            s,
            "<tr class=\"{sev}\"><td>{}</td><td>{}</td><td>{}</td><td>{sev}</td><td>{}</td></tr>",
            escape(&c.name),
            escape(&compact(&c.on)),
            escape(&compact(&c.off)),
            escape(&c.note),
            sev = c.severity.as_str(),
        );
    }
    s.push_str("</table>\n");
    s
}

fn arms_table(flag: &str, arms: &[ArmRecord], with_repeat: bool, shown: Shown) -> String {
    let mut s = String::from("<table><tr>");
    for h in header(shown) {
        let _ = write!(s, "<th>{}</th>", escape(&h));
    }
    s.push_str("</tr>\n");
    for arm in arms {
        s.push_str("<tr>");
        for (i, cell) in arm_cells(flag, arm, with_repeat, shown).iter().enumerate() {
            let class = if i == 0 || i == 6 {
                ""
            } else {
                " class=\"num\""
            };
            let _ = write!(s, "<td{class}>{}</td>", escape(cell));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

// The sections and pieces below are shared with the matrix page.

/// One bar of the rate chart from an arm's or a cell's measurements.
pub(crate) fn rate_bar(label: &str, stats: &ArmStats) -> RateBar {
    RateBar {
        label: label.to_string(),
        corrupted: stats.corrupted,
        sessions: stats.sessions(),
        rate: stats.corruption_rate,
        ci95: stats.ci95,
    }
}

/// A bullet list of facts; each item is HTML already escaped.
/// `target NAME (<code>API</code>, model <code>MODEL</code>)`: how every report.html
/// names its target among its facts.
pub(crate) fn target_fact(t: &TargetInfo) -> String {
    format!(
        "target {} (<code>{}</code>, model <code>{}</code>)",
        escape(&t.name),
        escape(&t.api),
        escape(&t.model),
    )
}

/// `/server_info` per block and role, collapsed.
pub(crate) fn engine_info_section(
    info: &std::collections::BTreeMap<String, serde_json::Value>,
) -> String {
    if info.is_empty() {
        return String::new();
    }
    let text = serde_json::to_string_pretty(info).unwrap_or_default();
    format!(
        "<h2>Engine info</h2>\n<details><summary>/server_info per arm block and role</summary><pre>{}</pre></details>\n",
        escape(&text)
    )
}

/// Sessions per first bad round of the corrupted `sessions`: for records that did not
/// keep the histogram.
pub(crate) fn first_bad_histogram<'a>(
    sessions: impl Iterator<Item = &'a SessionResult>,
) -> Vec<u64> {
    let mut per_round = Vec::new();
    for s in sessions.filter(|s| s.class.is_corrupted()) {
        if let Some(r) = s.first_bad_round {
            let i = r.saturating_sub(1) as usize;
            if per_round.len() <= i {
                per_round.resize(i + 1, 0);
            }
            per_round[i] += 1;
        }
    }
    per_round
}

pub(crate) fn first_bad_round_section(rounds: &[RoundCounts]) -> String {
    let mut s = String::from("<h2>Round at which corruption first appears</h2>\n");
    if rounds.iter().all(|r| r.per_round.iter().all(|n| *n == 0)) {
        s.push_str("<p>No session went bad.</p>\n");
    } else {
        s.push_str(&figure(charts::first_bad_rounds(
            "sessions per first non-ok round",
            rounds,
        )));
    }
    s
}

/// The corruption rate against request index per arm (core::trend), with each arm's
/// Cochran-Armitage test and its bins in a table; nothing when no arm has bins (records
/// without session timings, or too few sessions).
fn trend_section(flag: &str, arms: &[ArmRecord]) -> String {
    use crate::core::format::p_value;
    use crate::core::trend;
    if arms.iter().all(|a| a.stats.trend.is_empty()) {
        return String::new();
    }
    let name = |a: &ArmRecord| format!("{} ({flag}={})", a.label, a.value);
    let series: Vec<charts::TrendSeries> = arms
        .iter()
        .filter(|a| !a.stats.trend.is_empty())
        .map(|a| charts::TrendSeries {
            label: name(a),
            bins: a.stats.trend.clone(),
        })
        .collect();
    let mut s = String::from("<h2>Corruption against time</h2>\n");
    s.push_str(&figure(charts::trend(
        "corrupted sessions per bin of request index (hover a point for its uptime)",
        &series,
    )));
    let tests: Vec<String> = arms
        .iter()
        .map(|a| match trend::test(&a.stats.trend) {
            Some(t) => format!(
                "{}: Cochran-Armitage z = {:.2}, p = {} over {} bins by request index",
                name(a),
                t.z,
                p_value(t.p),
                a.stats.trend.len()
            ),
            None => format!("{}: too few sessions with timings to bin", name(a)),
        })
        .collect();
    let _ = writeln!(
        s,
        "<p class=\"meta\">{}; a trend is a confound at p &lt; the verdict's alpha.</p>",
        escape(&tests.join("; "))
    );
    s.push_str("<details><summary>the bins</summary><table><tr><th>arm</th><th>bin</th><th>requests</th><th>mean uptime</th><th>corrupted</th></tr>\n");
    for a in arms {
        for (i, b) in a.stats.trend.iter().enumerate() {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}-{}</td><td class=\"num\">{:.1} s</td><td class=\"num\">{}</td></tr>",
                escape(&name(a)),
                i + 1,
                b.first_seq,
                b.last_seq,
                b.uptime_s,
                escape(&crate::core::format::rate(b.corrupted, b.sessions)),
            );
        }
    }
    s.push_str("</table></details>\n");
    s
}

pub(crate) fn timelines_section(blocks: &[(String, Vec<charts::MetricsPoint>)]) -> String {
    let mut s = String::from("<h2>Concurrency over time</h2>\n");
    if blocks.is_empty() {
        s.push_str("<p>No metrics.csv in this directory.</p>\n");
        return s;
    }
    s.push_str("<div class=\"grid\">\n");
    for (label, rows) in blocks.iter().take(MAX_TIMELINES) {
        let series = charts::block_series(rows);
        s.push_str(&figure(charts::timeline(
            &format!("{label}: running requests per role, client in-flight"),
            &series,
        )));
    }
    s.push_str("</div>\n");
    if blocks.len() > MAX_TIMELINES {
        let _ = writeln!(
            s,
            "<p>{} more blocks in metrics.csv are not drawn.</p>",
            blocks.len() - MAX_TIMELINES
        );
    }
    s
}

/// Corrupted sessions first (earliest bad round first), then error/timeout ones.
fn worst_sessions(sessions: &[SessionResult]) -> Vec<&SessionResult> {
    let mut bad: Vec<&SessionResult> = sessions
        .iter()
        .filter(|s| s.class.is_corrupted() || s.class.is_failure())
        .collect();
    bad.sort_by_key(|s| {
        (
            !s.class.is_corrupted(),
            s.first_bad_round.unwrap_or(u32::MAX),
            s.label.clone(),
            s.repeat,
            s.index,
        )
    });
    bad.truncate(WORST_SESSIONS);
    bad
}

pub(crate) fn sessions_section(sessions: &[SessionResult]) -> String {
    let mut s = String::from("<h2>Worst sessions</h2>\n");
    let worst = worst_sessions(sessions);
    if worst.is_empty() {
        s.push_str(if sessions.is_empty() {
            "<p>No sessions.jsonl in this directory.</p>\n"
        } else {
            "<p>Every session finished clean (done or maxrounds).</p>\n"
        });
        return s;
    }
    let bad_total = sessions
        .iter()
        .filter(|s| s.class.is_corrupted() || s.class.is_failure())
        .count();
    let _ = writeln!(
        s,
        "<p>{} of {} non-clean sessions, corrupted ones first; open one for its rounds and transcript.</p>",
        worst.len(),
        bad_total
    );
    for r in worst {
        s.push_str(&session_details(r));
    }
    s
}

/// One session collapsed: summary line, evidence, rounds, transcript.
fn session_details(r: &SessionResult) -> String {
    let mut s = String::new();
    let kind = if r.class.is_corrupted() {
        "corrupted"
    } else {
        "failed"
    };
    let _ = write!(
        s,
        "<details class=\"session {kind}\"><summary><b>{}</b> r{} #{} &middot; <span class=\"class\">{}</span> at round {} &middot; <code>{}</code></summary>",
        escape(&r.label),
        r.repeat,
        r.index,
        r.class.name(),
        r.first_bad_round.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
        escape(&truncate(&r.evidence, 160)),
    );
    let _ = write!(
        s,
        "<p>Evidence:</p><pre class=\"evidence\">{}</pre>",
        escape(&r.evidence)
    );
    if let Some(e) = &r.error {
        let _ = writeln!(s, "<p>Error: <code>{}</code></p>", escape(e));
    }
    s.push_str("<table><tr><th>round</th><th>class</th><th>latency</th><th>tokens</th><th>evidence</th></tr>\n");
    for round in &r.rounds {
        let round_class = serde_json::to_value(round.class)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "<tr><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{} ms</td><td class=\"num\">{}</td><td><code>{}</code></td></tr>",
            round.round,
            escape(&round_class),
            round.latency_ms,
            round.completion_tokens,
            escape(&truncate(&round.evidence, 200)),
        );
    }
    s.push_str("</table>\n<div class=\"transcript\">\n");
    for m in &r.transcript {
        let _ = write!(
            s,
            "<div class=\"msg {}\"><b>{}</b>",
            escape(&m.role),
            escape(&m.role)
        );
        if let Some(name) = &m.name {
            let _ = write!(s, " <code>{}</code>", escape(name));
        }
        if let Some(id) = &m.tool_call_id {
            let _ = write!(s, " <small>{}</small>", escape(id));
        }
        if let Some(r) = &m.reasoning_content {
            let _ = write!(
                s,
                "<pre class=\"reasoning\">{}</pre>",
                escape(&truncate(r, MESSAGE_MAX_CHARS))
            );
        }
        if let Some(c) = &m.content {
            let _ = write!(s, "<pre>{}</pre>", escape(&truncate(c, MESSAGE_MAX_CHARS)));
        }
        for call in m.tool_calls.iter().flatten() {
            let _ = write!(
                s,
                "<pre class=\"call\">{}({})</pre>",
                escape(&call.function.name),
                escape(&truncate(&call.function.arguments, MESSAGE_MAX_CHARS))
            );
        }
        s.push_str("</div>\n");
    }
    s.push_str("</div></details>\n");
    s
}

/// At most `max` characters, saying how many were cut.
fn truncate(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max).collect();
    format!("{head}... ({} more characters)", count - max)
}

/// sessions.jsonl lines that parse; a half-written last line must not stop the report.
pub(crate) fn read_sessions_lenient(path: &Path) -> Vec<SessionResult> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Files called `name` in `dir` and its subdirectories down to `depth`, sorted.
pub(crate) fn find_files(dir: &Path, name: &str, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let here = dir.join(name);
    if here.is_file() {
        found.push(here);
    }
    if depth > 0 {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut subdirs: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            subdirs.sort();
            for sub in subdirs {
                found.extend(find_files(&sub, name, depth - 1));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::{ChatMessage, RoundClass, RoundRecord, SessionClass};

    fn session(
        label: &str,
        index: u32,
        class: SessionClass,
        bad: Option<u32>,
        evidence: &str,
    ) -> SessionResult {
        SessionResult {
            label: label.into(),
            repeat: 0,
            index,
            class,
            rounds_used: bad.unwrap_or(2),
            first_bad_round: bad,
            evidence: evidence.into(),
            transcript: vec![
                ChatMessage::new("user", "1. read_file(path=\"/a\")"),
                ChatMessage::new("assistant", evidence),
            ],
            rounds: vec![RoundRecord {
                round: 1,
                class: RoundClass::Ok,
                latency_ms: 12,
                completion_tokens: 20,
                evidence: "read_file(path=\"/a\")".into(),
                finish_reason: None,
                http: None,
                logprobs: None,
            }],
            latency_ms: vec![12],
            completion_tokens: 20,
            error: None,
            oracle: None,
            timing: None,
        }
    }

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape("<｜DSML｜x name=\"a\">&'"),
            "&lt;｜DSML｜x name=&quot;a&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn worst_sessions_put_corrupted_and_early_first() {
        let all = vec![
            session("off", 0, SessionClass::Done, None, "DONE"),
            session("on", 1, SessionClass::Timeout, Some(1), "timeout"),
            session("on", 2, SessionClass::Leak, Some(3), "late"),
            session("on", 3, SessionClass::BadArgs, Some(2), "early"),
        ];
        let order: Vec<u32> = worst_sessions(&all).iter().map(|s| s.index).collect();
        assert_eq!(order, [3, 2, 1]);
    }

    #[test]
    fn engine_text_is_escaped_and_transcripts_collapsed() {
        let hostile = "<script>alert(1)</script><｜DSML｜parameter>";
        let html = sessions_section(&[session("on", 7, SessionClass::Leak, Some(2), hostile)]);
        assert!(!html.contains("<script"), "engine text must be escaped");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;｜DSML｜parameter&gt;"));
        assert!(html.contains("<details class=\"session corrupted\">"));
    }

    #[test]
    fn half_written_sessions_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let line =
            serde_json::to_string(&session("on", 7, SessionClass::Leak, Some(2), "x")).unwrap();
        let path = dir.path().join("sessions.jsonl");
        std::fs::write(&path, format!("{line}\n{{half a line")).unwrap();
        assert_eq!(read_sessions_lenient(&path).len(), 1);
    }

    #[test]
    fn first_bad_histogram_counts_corrupted_sessions_only() {
        let all = [
            session("on", 0, SessionClass::Leak, Some(2), ""),
            session("on", 1, SessionClass::BadArgs, Some(2), ""),
            session("on", 2, SessionClass::Timeout, Some(1), ""),
        ];
        assert_eq!(first_bad_histogram(all.iter()), vec![0, 2]);
    }

    #[test]
    fn page_is_self_contained() {
        let html = page("t", "<p>x</p>");
        for forbidden in ["<script", "<link", "@import", "url(", "src="] {
            assert!(!html.contains(forbidden), "{forbidden}");
        }
    }

    #[test]
    fn the_trend_chart_appears_when_an_arm_has_bins_and_not_in_older_records() {
        use crate::core::trend::bin;
        let mut record = crate::commands::diff::tests::run(10, 80, 80);
        let older = render_run_html(&record, None);
        assert!(!older.contains("Corruption against time"));
        let timeline = crate::core::testing::trend_timeline(80, |i| i >= 70);
        record.arms[0].stats.trend = bin(&timeline);
        let html = render_run_html(&record, None);
        assert!(html.contains("<h2>Corruption against time</h2>"), "{html}");
        // One tooltip per bin of the arm that has bins; the other arm says why it has none.
        assert_eq!(html.matches("</title></circle>").count(), 8, "{html}");
        assert!(html.contains("bin 8 of 8, requests 70-79 (mean 74.5), uptime 9.3 s"));
        assert!(html.contains("on (BF16_INDEX_K=1): Cochran-Armitage z = "));
        assert!(html.contains("off (BF16_INDEX_K=1): too few sessions with timings to bin"));
        assert!(html.contains("<td class=\"num\">70-79</td><td class=\"num\">9.3 s</td><td class=\"num\">10/10 (100.0%)</td>"), "{html}");
    }

    #[test]
    fn truncate_counts_what_it_cuts() {
        assert_eq!(truncate("abcdef", 4), "abcd... (2 more characters)");
        assert_eq!(truncate("ab", 4), "ab");
    }
}
