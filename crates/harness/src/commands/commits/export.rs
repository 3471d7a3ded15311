//! The renderings of a commits record, one exporter per format: `commits.json`,
//! `summary.md` ([`super::record`]'s markdown), `report.html` ([`super::report`]'s page
//! with the posterior heat map), rewritten after every step, and the terminal line.

use super::record::{render_markdown, CommitsRecord};
use super::report::render_html;
use crate::results::json::JsonFile;
use crate::results::Exporter;

pub(crate) struct CommitsSummary;
pub(crate) struct CommitsHtml;
/// The answer and the verdict in words, as printed after the search.
pub struct CommitsLine;

impl Exporter<CommitsRecord> for CommitsSummary {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }
    fn render(&self, record: &CommitsRecord) -> anyhow::Result<String> {
        Ok(render_markdown(record))
    }
}

impl Exporter<CommitsRecord> for CommitsHtml {
    fn file_name(&self) -> &'static str {
        "report.html"
    }
    fn render(&self, record: &CommitsRecord) -> anyhow::Result<String> {
        Ok(render_html(record))
    }
}

impl Exporter<CommitsRecord> for CommitsLine {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, record: &CommitsRecord) -> anyhow::Result<String> {
        Ok(format!(
            "{}: {}\n",
            record.answer.map_or("-", |a| a.name()),
            record.verdict.as_deref().unwrap_or("-")
        ))
    }
}

/// The whole-file formats, rewritten after every step.
pub fn files() -> [&'static dyn Exporter<CommitsRecord>; 3] {
    [&JsonFile("commits.json"), &CommitsSummary, &CommitsHtml]
}

/// Rewrite commits.json, summary.md and report.html in `dir`, each atomically: the record does not write itself.
pub fn write(dir: &std::path::Path, record: &CommitsRecord) -> anyhow::Result<()> {
    crate::results::export::write_all(dir, record, &files())
}
