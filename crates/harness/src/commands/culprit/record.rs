//! What `bisect culprit` writes and prints: `culprit.json` (the record below; field names
//! are a contract, extend, never rename), `summary.md`, `report.html` and the terminal
//! summary. The step log (`steps.jsonl`) is [`super::steplog`]'s.

use std::path::Path;

use comfy_table::{presets, Cell, ContentArrangement, Table};
use serde::{Deserialize, Serialize};

use crate::core::arm_stats::RecordStatus;
use crate::core::culprit::{FlagValues, Outcome, StepRecord};
use crate::results::html::{escape, facts_list, page, verdict_box};
use crate::results::markdown::table_header;
use crate::results::run_record::TargetInfo;
use crate::results::write_atomic;

pub const SCHEMA: &str = "bisect.culprit/2";

/// `culprit.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CulpritRecord {
    pub schema: String,
    pub id: String,
    pub command: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: RecordStatus,
    pub target: TargetInfo,
    /// The base workload; block b runs it with seed + b, `block_sessions` sessions at
    /// `concurrency` in flight.
    pub workload: serde_json::Value,
    pub concurrency: u32,
    pub block_sessions: u64,
    pub look_sessions: u64,
    pub budget: u64,
    pub alpha: f64,
    pub navigate_alpha: f64,
    pub min_effect: f64,
    /// Pinned for every block (`--set NAME=VALUE`).
    pub pinned: Vec<String>,
    /// The markup families whose tool-call syntax in a reply counts as a leak (the target
    /// profile's `markup`, as `bisect run` classifies).
    #[serde(default)]
    pub markup: Vec<crate::core::classify::MarkupFamily>,
    /// The listed flags with their failing (as found) and passing (flipped) values.
    pub flags: Vec<FlagValues>,
    /// `culprit`, `no_culprit`, `could_not_reproduce`, `inconclusive`; None while running.
    pub answer: Option<String>,
    /// The verdict in words.
    pub verdict: Option<String>,
    /// The minimal failure-inducing set: catalog names with their failing values.
    pub culprit: Vec<FlagValue>,
    pub untestable: Vec<UntestableFlag>,
    /// Steps that failed with another class mix than the reference failure.
    pub other_failures: Vec<StepRecord>,
    /// What the blocks could not check, one sentence each (a listed or pinned flag that
    /// no engine reports: only the launch-file read-back stands for it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub steps: Vec<StepRecord>,
    pub blocks: Vec<BlockSummary>,
    pub sessions_spent: u64,
    pub restarts: u64,
    /// Blocks answered from the step log of an earlier run (`--resume`).
    pub replayed_blocks: u64,
    pub wall_s: f64,
    pub error: Option<String>,
}

/// A flag at a value, as the catalog names it and as the launch config spells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlagValue {
    pub flag: String,
    pub value: String,
    /// `SGLANG_DSV4_BF16_INDEX_K=1`, `--enable-hierarchical-cache`, `--cuda-graph-max-bs 32`.
    pub setting: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UntestableFlag {
    pub flag: String,
    /// The value it is held at (its failing value).
    pub value: String,
    pub setting: String,
    pub reason: String,
}

/// One block, without its sessions (those are in `blocks/bNNN/sessions.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockSummary {
    pub block: u64,
    pub failing: Vec<String>,
    pub sessions: u64,
    pub corrupted: u64,
    pub error_timeout: u64,
    pub peak_engine: Option<u64>,
    pub seed: u64,
    pub wall_s: f64,
    pub dir: String,
}

impl CulpritRecord {
    /// Rewrite culprit.json, summary.md and report.html atomically.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        write_atomic(
            &dir.join("culprit.json"),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )?;
        write_atomic(&dir.join("summary.md"), render_markdown(self).as_bytes())?;
        write_atomic(&dir.join("report.html"), render_html(self).as_bytes())
    }
}

fn outcome_word(o: Outcome) -> &'static str {
    match o {
        Outcome::Fails => "fails",
        Outcome::Passes => "passes",
        Outcome::OtherFailure => "other failure",
        Outcome::Degraded => "degraded",
        Outcome::Unresolved => "unresolved",
    }
}

fn failing_words(record: &CulpritRecord, step: &StepRecord) -> String {
    if step.failing.len() == record.flags.len() {
        "all (as found)".into()
    } else if step.failing.is_empty() {
        "none (all flipped)".into()
    } else {
        step.failing.join(", ")
    }
}

fn head(record: &CulpritRecord) -> Vec<String> {
    let mut lines = vec![format!(
        "{} sessions in {} blocks of {} at {} in flight ({} restarts, {:.0} s), budget {}",
        record.sessions_spent,
        record.blocks.len(),
        record.block_sessions,
        record.concurrency,
        record.restarts,
        record.wall_s,
        record.budget
    )];
    if !record.pinned.is_empty() {
        lines.push(format!("pinned: {}", record.pinned.join(", ")));
    }
    if record.replayed_blocks > 0 {
        lines.push(format!(
            "{} blocks replayed from the step log of the earlier run",
            record.replayed_blocks
        ));
    }
    for u in &record.untestable {
        lines.push(format!(
            "untestable: {} ({}): {}",
            u.flag, u.setting, u.reason
        ));
    }
    for w in &record.warnings {
        lines.push(format!("warning: {w}"));
    }
    for o in &record.other_failures {
        lines.push(format!(
            "another failure mode with failing values {}: {}",
            o.failing.join(", "),
            o.reason
        ));
    }
    if let Some(e) = &record.error {
        lines.push(format!("error: {e}"));
    }
    lines
}

/// The columns of the step tables: the terminal's leaves out the reason.
const STEP_COLUMNS: [&str; 7] = [
    "step",
    "kind",
    "failing values",
    "outcome",
    "corrupted",
    "blocks",
    "reason",
];

/// The terminal summary: verdict, then the steps.
pub fn render_table(record: &CulpritRecord) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(&STEP_COLUMNS[..6]);
    for s in &record.steps {
        table.add_row(vec![
            Cell::new(s.step),
            Cell::new(format!("{:?}", s.kind).to_lowercase()),
            Cell::new(failing_words(record, s)),
            Cell::new(outcome_word(s.outcome)),
            Cell::new(format!("{}/{}", s.corrupted, s.classified)),
            Cell::new(
                s.blocks
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]);
    }
    let mut out = format!("{table}\n");
    for line in head(record) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&format!(
        "verdict: {}\n",
        record.verdict.as_deref().unwrap_or("(not finished)")
    ));
    out
}

pub fn render_markdown(record: &CulpritRecord) -> String {
    let mut s = format!("# bisect culprit {}\n\n`{}`\n\n", record.id, record.command);
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

pub fn render_html(record: &CulpritRecord) -> String {
    let class = match record.answer.as_deref() {
        Some("culprit") => "implicated",
        Some("no_culprit") | Some("could_not_reproduce") => "cleared",
        _ => "inconclusive",
    };
    let heading = match record.answer.as_deref() {
        Some("culprit") => "culprit found",
        Some("no_culprit") => "no culprit among the listed flags",
        Some("could_not_reproduce") => "could not reproduce",
        Some(_) => "inconclusive",
        None => "running",
    };
    let mut body = format!(
        "<h1>bisect culprit {}</h1>\n<p class=\"meta\"><code>{}</code></p>\n",
        escape(&record.id),
        escape(&record.command)
    );
    let culprit: Vec<String> = record
        .culprit
        .iter()
        .map(|c| format!("<code>{}</code> ({})", escape(&c.setting), escape(&c.flag)))
        .collect();
    let mut inner = format!(
        "<p>{}</p>",
        escape(record.verdict.as_deref().unwrap_or("(not finished)"))
    );
    if !culprit.is_empty() {
        inner.push_str(&format!(
            "<p>minimal failure-inducing set: {}</p>",
            culprit.join(", ")
        ));
    }
    body.push_str(&verdict_box(class, heading, &inner));
    body.push_str(&facts_list(
        &head(record).iter().map(|l| escape(l)).collect::<Vec<_>>(),
    ));
    body.push_str("<h2>Flags</h2>\n<table><tr><th>flag</th><th>failing (as found)</th><th>passing (flipped)</th></tr>");
    for f in &record.flags {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&f.name),
            escape(&f.failing),
            escape(&f.passing)
        ));
    }
    body.push_str("</table>\n<h2>Steps</h2>\n<table><tr><th>step</th><th>kind</th><th>failing values</th><th>outcome</th><th>corrupted</th><th>error+timeout</th><th>blocks</th><th>reason</th></tr>");
    for st in &record.steps {
        let links: Vec<String> = st
            .blocks
            .iter()
            .map(|b| format!("<a href=\"blocks/b{b:03}/\">{b}</a>"))
            .collect();
        body.push_str(&format!(
            "<tr><td>{}</td><td>{:?}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            st.step,
            st.kind,
            escape(&failing_words(record, st)),
            outcome_word(st.outcome),
            st.corrupted,
            st.classified,
            st.error_timeout,
            links.join(", "),
            escape(&st.reason)
        ));
    }
    body.push_str("</table>\n<h2>Blocks</h2>\n<table><tr><th>block</th><th>failing values</th><th>sessions</th><th>corrupted</th><th>error+timeout</th><th>engine peak running</th><th>seed</th><th>wall s</th></tr>");
    for b in &record.blocks {
        body.push_str(&format!(
            "<tr><td><a href=\"{}/\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td></tr>",
            escape(&b.dir),
            b.block,
            escape(&b.failing.join(", ")),
            b.sessions,
            b.corrupted,
            b.error_timeout,
            b.peak_engine.map_or("-".into(), |p| p.to_string()),
            b.seed,
            b.wall_s
        ));
    }
    body.push_str("</table>\n<p class=\"meta\">Every step is a sequential A/B (anytime-valid e-process) against the verified ends; the step log is <code>steps.jsonl</code>. Method: docs/culprit.md.</p>\n");
    page(&format!("bisect culprit {}", record.id), &body)
}
