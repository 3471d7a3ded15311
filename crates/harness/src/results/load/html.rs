//! `report.html` of a load sweep: the verdict, the chart of rate against load with its
//! band and the engine-side load, the facts and the table of levels.

use super::LoadRecord;
use super::{chart, columns, facts, rows};
use crate::results::html::target_fact;
use crate::results::markup::{escape, facts_list, page, verdict_box};
use crate::results::Exporter;

pub(crate) struct LoadHtml;

impl Exporter<LoadRecord> for LoadHtml {
    fn file_name(&self) -> &'static str {
        "report.html"
    }
    fn render(&self, record: &LoadRecord) -> anyhow::Result<String> {
        Ok(render_html(record))
    }
}

pub(super) fn render_html(record: &LoadRecord) -> String {
    let mut body = format!(
        "<h1>bisect load {}</h1>\n<p class=\"meta\"><code>{}</code></p>\n",
        escape(&record.header.id),
        escape(&record.header.command)
    );
    body.push_str(&verdict_box(
        "load",
        "verdict",
        &format!("<p>{}</p>", escape(record.verdict())),
    ));
    if let Some(report) = &record.report {
        body.push_str(&chart::svg(report, record.flag.is_some()));
    }
    let mut items = vec![target_fact(&record.header.target)];
    items.extend(facts(record).iter().map(|f| escape(f)));
    body.push_str(&facts_list(&items));
    body.push_str("<table><thead><tr>");
    for c in columns(record) {
        body.push_str(&format!("<th>{}</th>", escape(c)));
    }
    body.push_str("</tr></thead><tbody>\n");
    for row in rows(record) {
        body.push_str("<tr>");
        for c in row {
            body.push_str(&format!("<td>{}</td>", escape(&c)));
        }
        body.push_str("</tr>\n");
    }
    body.push_str("</tbody></table>\n");
    page(&format!("bisect load {}", record.header.id), &body)
}
