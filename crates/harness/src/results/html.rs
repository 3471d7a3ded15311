//! `report.html`: one self-contained page per results directory (run or matrix) that a
//! person opens in a browser or attaches to a ticket. No network: styles are inline, there
//! is no script, and the charts are inline SVG from [`super::charts`].
//!
//! It shows the verdict with its reasons and confounds, corruption rate per arm or cell
//! with Wilson whiskers, the round at which corruption first appears, the concurrency
//! timeline of every arm block (metrics.csv), and the worst sessions' evidence with their
//! transcripts collapsed in `<details>`. Everything that came from the engine (evidence,
//! transcripts, engine info) is HTML-escaped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::charts::{self, RateBar, RoundCounts};
use super::run_record::{ArmRecord, RunRecord};
use super::table::{arm_cells, compact, fmt_p, pct, signed_pct, HEADER};
use super::Exporter;
use crate::core::session::SessionResult;

/// Sessions shown with evidence and transcript: enough to see the pattern, few enough that
/// the page stays small.
pub const WORST_SESSIONS: usize = 12;
/// Characters of one transcript message shown before it is cut (ctx filler is long).
pub const MESSAGE_MAX_CHARS: usize = 2000;
/// Arm blocks or cells drawn as timelines.
const MAX_TIMELINES: usize = 24;

/// The exporter registered with [`super::exporters`]: rewritten after each arm block.
pub struct HtmlReport;

impl Exporter for HtmlReport {
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

/// Escape text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// The page of one `bisect run` directory. `dir` supplies sessions.jsonl and metrics.csv;
/// without it (or without those files) the page shows the record alone.
pub fn render_run_html(record: &RunRecord, dir: Option<&Path>) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>bisect run <code>{}</code></h1>\n<p class=\"meta\">{} &middot; status <b>{}</b> &middot; started {} &middot; finished {}</p>",
        escape(&record.flag.name),
        escape(&record.id),
        escape(record.status.as_str()),
        escape(&record.started_at),
        escape(record.finished_at.as_deref().unwrap_or("-"))
    );
    let setting = record
        .flag
        .env
        .as_ref()
        .map(|v| format!("env {v}"))
        .or_else(|| record.flag.arg.as_ref().map(|v| format!("arg {v}")))
        .or_else(|| record.flag.switch.as_ref().map(|v| format!("switch {v}")))
        .unwrap_or_default();
    let _ = writeln!(
        body,
        "<ul class=\"facts\"><li>flag <code>{}</code> ({}) in roles {}; on = <code>{}</code>, off = <code>{}</code></li><li>target {} (<code>{}</code>, model <code>{}</code>)</li><li>workload <code>{}</code></li><li>command <code>{}</code></li></ul>",
        escape(&record.flag.name),
        escape(&setting),
        escape(&record.flag.roles.join(", ")),
        escape(&record.flag.on),
        escape(&record.flag.off),
        escape(&record.target.name),
        escape(&record.target.api),
        escape(&record.target.model),
        escape(&compact(&record.workload)),
        escape(&record.command),
    );
    if let Some(v) = &record.verdict {
        let status = v.status.as_str();
        let _ = write!(
            body,
            "<section class=\"verdict {status}\"><h2>Verdict: {status}</h2><p>{}</p>",
            escape(&v.summary)
        );
        if let Some(d) = &v.direction {
            let _ = write!(body, "<p>Direction: {}</p>", escape(d));
        }
        body.push_str(&list(&v.reasons));
        body.push_str("</section>\n");
    } else if let Some(e) = &record.error {
        let _ = writeln!(
            body,
            "<section class=\"verdict inconclusive\"><h2>No verdict ({})</h2><pre>{}</pre></section>",
            escape(record.status.as_str()),
            escape(e)
        );
    }

    let bars: Vec<RateBar> = record
        .arms
        .iter()
        .map(|a| {
            arm_bar(
                &format!("{} ({}={})", a.label, record.flag.name, a.value),
                a,
            )
        })
        .collect();
    body.push_str("<h2>Corruption rate per arm</h2>\n");
    body.push_str(&figure(charts::rate_bars(
        "corrupted sessions per arm, pooled over repeats",
        &bars,
    )));
    body.push_str(&arms_table(&record.flag.name, &record.arms, false));
    if record.runs.len() > record.arms.len() {
        body.push_str("<h3>Arm blocks in execution order</h3>\n");
        body.push_str(&arms_table(&record.flag.name, &record.runs, true));
    }
    if let Some(c) = &record.comparison {
        let _ = writeln!(
            body,
            "<p>Difference on &minus; off: <b>{}</b> (95% Newcombe interval {} to {}); Fisher exact two-sided p = <b>{}</b>; min effect {}.</p>",
            signed_pct(c.rate_diff),
            signed_pct(c.diff_ci95[0]),
            signed_pct(c.diff_ci95[1]),
            fmt_p(c.p_value),
            c.min_effect
        );
    }
    if !record.confounds.is_empty() {
        body.push_str("<h2>Confounds</h2>\n<table><tr><th>confound</th><th>on</th><th>off</th><th>severity</th><th>note</th></tr>\n");
        for c in &record.confounds {
            let severity = serde_json::to_value(c.severity)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            let _ = writeln!(
                body,
                "<tr class=\"{sev}\"><td>{}</td><td>{}</td><td>{}</td><td>{sev}</td><td>{}</td></tr>",
                escape(&c.name),
                escape(&compact(&c.on)),
                escape(&compact(&c.off)),
                escape(&c.note),
                sev = escape(&severity),
            );
        }
        body.push_str("</table>\n");
    }

    let rounds: Vec<RoundCounts> = record
        .arms
        .iter()
        .map(|a| RoundCounts {
            label: a.label.to_string(),
            per_round: a.stats.first_bad_round.clone(),
        })
        .collect();
    body.push_str(&first_bad_round_section(&rounds));

    let (sessions, metrics) = match dir {
        Some(d) => (
            read_sessions_lenient(&d.join("sessions.jsonl")),
            charts::read_metrics(&d.join("metrics.csv")),
        ),
        None => (Vec::new(), Vec::new()),
    };
    body.push_str(&timelines_section(&metrics));
    body.push_str(&sessions_section(&sessions));
    if !record.engine_info.is_empty() {
        let info = serde_json::to_string_pretty(&record.engine_info).unwrap_or_default();
        let _ = writeln!(
            body,
            "<h2>Engine info</h2>\n<details><summary>/server_info per arm block and role</summary><pre>{}</pre></details>",
            escape(&info)
        );
    }
    page(
        &format!("bisect run {}: {}", record.flag.name, record.id),
        &body,
    )
}

/// The page of one `bisect matrix` directory, from its matrix.json (read as loose JSON:
/// `cells` with `configuration`, counts, `corrupted`, `corruption_rate`, `ci95`,
/// `peak_running`, `tokens_per_s`, `wall_s`) and any sessions.jsonl / metrics.csv found in
/// `dir` or its cell subdirectories.
pub fn render_matrix_html(matrix_json: &Value, dir: &Path) -> String {
    let cells: Vec<&Value> = match matrix_json.get("cells").or(Some(matrix_json)) {
        Some(Value::Array(a)) => a.iter().collect(),
        _ => Vec::new(),
    };
    let id = matrix_json.get("id").map(compact).unwrap_or_else(|| {
        dir.file_name()
            .map(|n| n.to_string_lossy().into())
            .unwrap_or_default()
    });
    let mut body = String::new();
    let _ = writeln!(body, "<h1>bisect matrix <code>{}</code></h1>", escape(&id));
    let mut facts = Vec::new();
    for key in [
        "plan",
        "target",
        "workload",
        "started_at",
        "finished_at",
        "status",
        "baseline",
        "shard",
    ] {
        if let Some(v) = matrix_json.get(key).filter(|v| !v.is_null()) {
            facts.push(format!("{key} <code>{}</code>", escape(&compact(v))));
        }
    }
    if !facts.is_empty() {
        let _ = writeln!(
            body,
            "<ul class=\"facts\"><li>{}</li></ul>",
            facts.join("</li><li>")
        );
    }
    if let Some(regressions) = matrix_json.get("regressions").and_then(Value::as_array) {
        let class = if regressions.is_empty() {
            "cleared"
        } else {
            "implicated"
        };
        let _ = write!(
            body,
            "<section class=\"verdict {class}\"><h2>{} regressed cell(s)</h2>",
            regressions.len()
        );
        let items: Vec<String> = regressions.iter().map(compact).collect();
        body.push_str(&list(&items));
        body.push_str("</section>\n");
    }

    let labels: Vec<String> = cells.iter().map(|c| cell_label(c)).collect();
    let bars: Vec<RateBar> = cells
        .iter()
        .zip(&labels)
        .map(|(c, l)| cell_bar(l, c))
        .collect();
    body.push_str("<h2>Corruption rate per cell</h2>\n");
    body.push_str(&figure(charts::rate_bars(
        "corrupted sessions per cell",
        &bars,
    )));
    body.push_str("<table><tr><th>cell</th><th>sessions</th><th>corrupted</th><th>error/timeout</th><th>peak running</th><th>tok/s</th><th>wall</th><th>status</th></tr>\n");
    for ((c, label), bar) in cells.iter().zip(&labels).zip(&bars) {
        let counts = c.get("counts");
        let failed = ["error", "timeout"]
            .iter()
            .map(|k| {
                counts
                    .and_then(|o| o.get(*k))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join("/");
        let peaks = c
            .get("peak_running")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k} {}", compact(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let status = c
            .get("regression")
            .or_else(|| c.get("status"))
            .or_else(|| c.get("verdict"))
            .map(compact)
            .unwrap_or_default();
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}/{} = {} [{}, {}]</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{:.0}</td><td class=\"num\">{:.1}s</td><td>{}</td></tr>",
            escape(label),
            bar.sessions,
            bar.corrupted,
            bar.sessions,
            pct(bar.rate),
            pct(bar.ci95[0]),
            pct(bar.ci95[1]),
            failed,
            escape(&peaks),
            c.get("tokens_per_s").and_then(Value::as_f64).unwrap_or(0.0),
            c.get("wall_s").and_then(Value::as_f64).unwrap_or(0.0),
            escape(&status),
        );
    }
    body.push_str("</table>\n");

    let sessions: Vec<SessionResult> = find_files(dir, "sessions.jsonl", 3)
        .iter()
        .flat_map(|p| read_sessions_lenient(p))
        .collect();
    let rounds: Vec<RoundCounts> = cells
        .iter()
        .zip(&labels)
        .filter_map(|(c, label)| {
            let recorded: Option<Vec<u64>> = c
                .get("first_bad_round")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|v| v.as_u64().unwrap_or(0)).collect());
            let per_round = recorded.unwrap_or_else(|| {
                let cell_label = c.get("label").and_then(Value::as_str).unwrap_or(label);
                first_bad_histogram(sessions.iter().filter(|s| s.label == cell_label))
            });
            per_round.iter().any(|n| *n > 0).then(|| RoundCounts {
                label: label.clone(),
                per_round,
            })
        })
        .collect();
    body.push_str(&first_bad_round_section(&rounds));
    let metrics: Vec<(String, Vec<charts::MetricsPoint>)> = find_files(dir, "metrics.csv", 3)
        .iter()
        .flat_map(|p| charts::read_metrics(p))
        .collect();
    body.push_str(&timelines_section(&metrics));
    body.push_str(&sessions_section(&sessions));
    page(&format!("bisect matrix {id}"), &body)
}

/// A cell's display name: its `label` or `id`, else its configuration as `K=V, ...`.
pub fn cell_label(cell: &Value) -> String {
    if let Some(l) = cell
        .get("label")
        .or_else(|| cell.get("id"))
        .and_then(Value::as_str)
    {
        return l.to_string();
    }
    match cell.get("configuration") {
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", compact(v)))
            .collect::<Vec<_>>()
            .join(", "),
        Some(other) => compact(other),
        None => "cell".into(),
    }
}

fn arm_bar(label: &str, a: &ArmRecord) -> RateBar {
    RateBar {
        label: label.to_string(),
        corrupted: a.stats.corrupted,
        sessions: a.sessions,
        rate: a.stats.corruption_rate,
        ci95: a.stats.ci95,
    }
}

fn cell_bar(label: &str, c: &Value) -> RateBar {
    let counts_total = c
        .get("counts")
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_u64).sum::<u64>());
    // A cell's `sessions` is per block; with repeats its counts pool several blocks, so
    // the counts are the denominator whenever they are there.
    let sessions = counts_total
        .filter(|n| *n > 0)
        .or_else(|| c.get("sessions").and_then(Value::as_u64))
        .unwrap_or(0);
    let corrupted = c.get("corrupted").and_then(Value::as_u64).unwrap_or(0);
    let rate = c
        .get("corruption_rate")
        .and_then(Value::as_f64)
        .unwrap_or_else(|| crate::core::stats::rate(corrupted, sessions));
    let ci95 = match c
        .get("ci95")
        .and_then(Value::as_array)
        .map(|a| a.as_slice())
    {
        Some([lo, hi]) => [lo.as_f64().unwrap_or(0.0), hi.as_f64().unwrap_or(1.0)],
        _ => {
            let (lo, hi) = crate::core::stats::wilson(corrupted, sessions, 0.95);
            [lo, hi]
        }
    };
    RateBar {
        label: label.to_string(),
        corrupted,
        sessions,
        rate,
        ci95,
    }
}

fn first_bad_histogram<'a>(sessions: impl Iterator<Item = &'a SessionResult>) -> Vec<u64> {
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

fn first_bad_round_section(rounds: &[RoundCounts]) -> String {
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

fn timelines_section(blocks: &[(String, Vec<charts::MetricsPoint>)]) -> String {
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

fn sessions_section(sessions: &[SessionResult]) -> String {
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
        let class = r.class.name();
        let kind = if r.class.is_corrupted() {
            "corrupted"
        } else {
            "failed"
        };
        let _ = write!(
            s,
            "<details class=\"session {kind}\"><summary><b>{}</b> r{} #{} &middot; <span class=\"class\">{class}</span> at round {} &middot; <code>{}</code></summary>",
            escape(&r.label),
            r.repeat,
            r.index,
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
    }
    s
}

fn arms_table(flag: &str, arms: &[ArmRecord], with_repeat: bool) -> String {
    let mut s = String::from("<table><tr>");
    for h in HEADER {
        let _ = write!(s, "<th>{}</th>", escape(h));
    }
    s.push_str("</tr>\n");
    for arm in arms {
        s.push_str("<tr>");
        for (i, cell) in arm_cells(flag, arm, with_repeat).iter().enumerate() {
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

fn list(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let mut s = String::from("<ul>");
    for i in items {
        let _ = write!(s, "<li>{}</li>", escape(i));
    }
    s.push_str("</ul>");
    s
}

fn figure(svg: anyhow::Result<String>) -> String {
    match svg {
        Ok(svg) => format!("<figure>{}</figure>\n", strip_xml_declaration(&svg)),
        Err(e) => format!(
            "<p class=\"error\">chart not drawn: {}</p>\n",
            escape(&format!("{e:#}"))
        ),
    }
}

fn strip_xml_declaration(svg: &str) -> &str {
    match svg.strip_prefix("<?xml") {
        Some(rest) => rest
            .find("?>")
            .map(|i| rest[i + 2..].trim_start())
            .unwrap_or(svg),
        None => svg,
    }
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
fn read_sessions_lenient(path: &Path) -> Vec<SessionResult> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Files called `name` in `dir` and its subdirectories down to `depth`, sorted.
fn find_files(dir: &Path, name: &str, depth: usize) -> Vec<PathBuf> {
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

const STYLE: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1180px; padding: 0 16px; color: #1d1d1f; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.2em; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; margin-top: 0; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: 6px 8px; border-radius: 4px; margin: 4px 0; }
table { border-collapse: collapse; margin: 10px 0; font-size: 13.5px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f3f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.blocking td { background: #ffe3e3; } tr.warning td { background: #fff5d6; }
.verdict { border-left: 6px solid #999; padding: 8px 16px; background: #f7f7f7; border-radius: 4px; }
.verdict h2 { border: none; margin-top: 4px; }
.verdict.implicated { border-color: #d1242f; background: #fff0f0; }
.verdict.cleared { border-color: #1a7f37; background: #effaf1; }
.verdict.inconclusive { border-color: #bf8700; background: #fff8e1; }
figure { margin: 8px 0; } figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 8px; }
details.session { border: 1px solid #d0d7de; border-radius: 4px; margin: 6px 0; padding: 4px 10px; }
details.session.corrupted { border-left: 4px solid #d1242f; } details.session.failed { border-left: 4px solid #bf8700; }
details summary { cursor: pointer; }
.msg { border-top: 1px dashed #ddd; padding: 4px 0; } .msg.assistant > b { color: #0550ae; } .msg.tool > b { color: #1a7f37; }
.reasoning { color: #666; } .call { background: #eef6ff; } .error { color: #d1242f; }
.facts code { word-break: break-all; }
"#;

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}<footer><p class=\"meta\">Written by bisect {}; self-contained: no scripts, no network.</p></footer>\n</body>\n</html>\n",
        escape(title),
        env!("CARGO_PKG_VERSION"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::{ChatMessage, Counts, RoundClass, RoundRecord, SessionClass};

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
            }],
            latency_ms: vec![12],
            completion_tokens: 20,
            error: None,
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
        let dir = tempfile::tempdir().unwrap();
        let hostile = "<script>alert(1)</script><｜DSML｜parameter>";
        let line =
            serde_json::to_string(&session("on", 7, SessionClass::Leak, Some(2), hostile)).unwrap();
        std::fs::write(
            dir.path().join("sessions.jsonl"),
            format!("{line}\n{{half a line"),
        )
        .unwrap();
        let matrix = serde_json::json!({
            "id": "m1",
            "cells": [{
                "configuration": {"BF16_INDEX_K": "1", "sessions": 16},
                "counts": Counts { leak: 3, done: 13, ..Counts::default() },
                "corrupted": 3, "corruption_rate": 0.1875, "ci95": [0.066, 0.43],
                "peak_running": {"client": 16}, "tokens_per_s": 900.0, "wall_s": 4.0,
                "first_bad_round": [0, 3]
            }, {
                "label": "fp8 <x>", "configuration": {"BF16_INDEX_K": "0", "sessions": 16},
                "counts": {"done": 16}, "corrupted": 0
            }]
        });
        let html = render_matrix_html(&matrix, dir.path());
        assert!(!html.contains("<script"), "engine text must be escaped");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;｜DSML｜parameter&gt;"));
        assert!(html.contains("<details class=\"session corrupted\">"));
        assert!(html.contains("BF16_INDEX_K=1, sessions=16"));
        assert!(html.contains("fp8 &lt;x&gt;"));
        assert!(html.contains("3/16 = 18.8%"));
        // The second cell has no ci95 recorded: it gets a computed Wilson interval.
        assert!(html.contains("0/16 = 0.0% [0.0%, 19.4%]"), "{html}");
        assert_eq!(
            html.matches("<svg").count(),
            2,
            "rate bars + first bad round"
        );
        assert!(html.contains("No metrics.csv"));
    }

    #[test]
    fn page_is_self_contained() {
        let html = page("t", "<p>x</p>");
        for forbidden in ["<script", "<link", "@import", "url(", "src="] {
            assert!(!html.contains(forbidden), "{forbidden}");
        }
    }

    #[test]
    fn truncate_counts_what_it_cuts() {
        assert_eq!(truncate("abcdef", 4), "abcd... (2 more characters)");
        assert_eq!(truncate("ab", 4), "ab");
    }
}
