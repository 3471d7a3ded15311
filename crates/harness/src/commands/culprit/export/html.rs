//! `report.html` of a culprit search: the verdict box, the facts, the flags, every step
//! with links to its blocks, every block.

use super::super::record::{failing_words, head, outcome_word, CulpritRecord};
use crate::results::markup::{escape, facts_list, page, verdict_box};
use crate::results::Exporter;

pub(crate) struct CulpritHtml;

impl Exporter<CulpritRecord> for CulpritHtml {
    fn file_name(&self) -> &'static str {
        "report.html"
    }
    fn render(&self, record: &CulpritRecord) -> anyhow::Result<String> {
        Ok(render_html(record))
    }
}

fn render_html(record: &CulpritRecord) -> String {
    use crate::commands::answer::SearchAnswer;
    let class = match record.answer {
        Some(SearchAnswer::Culprit) => "implicated",
        Some(a) if a.clears() => "cleared",
        _ => "inconclusive",
    };
    let heading = match record.answer {
        Some(SearchAnswer::Culprit) => "culprit found",
        Some(SearchAnswer::NoCulprit) => "no culprit among the listed flags",
        Some(SearchAnswer::CouldNotReproduce) => "could not reproduce",
        Some(_) => "inconclusive",
        None => "running",
    };
    let mut body = format!(
        "<h1>bisect culprit {}</h1>\n<p class=\"meta\"><code>{}</code></p>\n",
        escape(&record.header.id),
        escape(&record.header.command)
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
    page(&format!("bisect culprit {}", record.header.id), &body)
}
