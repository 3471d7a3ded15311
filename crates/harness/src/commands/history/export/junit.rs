//! `history-junit.xml`: one test case per cell, judged by its newest night, so CI shows
//! the history like a test run. A cell whose newest night is a regression (found that
//! night or still open) is a `<failure>` carrying its reasons and the regression's nights
//! and builds; a missing or insufficient newest night is an `<error>` (no pass without
//! data); a suspicious one passes, its `<system-out>` saying why it is suspicious; an ok
//! one passes. The same rule as `bisect history`'s exit code.

use super::markdown::{
    ended_words, evidence_words, landed_words, measure_words, night_label, nights_words,
    rates_words, short_build,
};
use crate::commands::history::record::{
    CellHistory, CellPoint, HistoryRecord, NightRef, RegressionEntry, SearchPlan,
};
use crate::core::history::State;
use crate::results::markup::{junit_open, junit_properties, xml_escape as esc, JunitCounts};
use crate::results::Exporter;

pub struct HistoryJunit;

enum Outcome {
    Pass,
    Failure {
        message: String,
        details: String,
    },
    /// Missing or insufficient: the state's name, and the message.
    Error(&'static str, String),
}

/// The regression a cell's newest night belongs to: the one its assessment names, else
/// the cell's latest.
fn regression_of<'a>(
    r: &'a HistoryRecord,
    c: &CellHistory,
    p: &CellPoint,
) -> Option<&'a RegressionEntry> {
    p.assessment
        .event
        .and_then(|e| r.regressions.get(e))
        .filter(|g| g.cell == c.id)
        .or_else(|| r.regressions.iter().rev().find(|g| g.cell == c.id))
}

fn outcome(r: &HistoryRecord, c: &CellHistory) -> Outcome {
    let Some(p) = c.latest() else {
        return Outcome::Error("missing", "missing: the cell has no nights".into());
    };
    let reasons = p.assessment.reasons.join("; ");
    match p.state() {
        State::Regression => {
            let (message, details) = match regression_of(r, c, p) {
                Some(g) => (
                    format!(
                        "regression: first bad {}, last good {}: {reasons}",
                        night_words(&g.first_bad),
                        night_words(&g.last_good)
                    ),
                    regression_details(r, g),
                ),
                None => (format!("regression: {reasons}"), reasons.clone()),
            };
            Outcome::Failure { message, details }
        }
        State::Missing | State::Insufficient => {
            Outcome::Error(p.state().name(), format!("{}: {reasons}", p.state().name()))
        }
        State::Suspicious | State::Ok => Outcome::Pass,
    }
}

/// `2025-01-02 (build 0123456789)`.
fn night_words(n: &NightRef) -> String {
    match &n.build {
        Some(b) => format!("{} (build {})", n.label, short_build(b)),
        None => format!("{} (no build)", n.label),
    }
}

/// The regression in lines: its nights and builds, evidence, rates, ending, search and
/// answer.
fn regression_details(r: &HistoryRecord, g: &RegressionEntry) -> String {
    let mut lines = vec![
        format!("last good night: {}", night_words(&g.last_good)),
        format!("first bad night: {}", night_words(&g.first_bad)),
        format!("flagged on: {}", night_words(&g.flagged)),
        format!("evidence: {} (e-BH)", evidence_words(&g.event)),
        format!("rate: {}", rates_words(&g.event)),
        format!("ended: {}", ended_words(r, &g.event)),
    ];
    lines.push(match &g.search {
        SearchPlan::Prepared { command, dir, .. } => format!("search (into {dir}): {command}"),
        SearchPlan::Unavailable { why } => format!("no search: {why}"),
    });
    if let Some(l) = &g.landed {
        lines.push(format!(
            "answer: {} ({}/report.html)",
            landed_words(l),
            l.dir
        ));
    }
    lines.join("\n")
}

/// The newest night in one line: night, state, measure, evidence, reasons.
fn newest_words(r: &HistoryRecord, c: &CellHistory) -> String {
    let Some(p) = c.latest() else {
        return "no nights".to_string();
    };
    let night = c.series.len() - 1;
    let mut s = format!(
        "newest night {}: {}; {}",
        night_label(r, night),
        p.state().name(),
        measure_words(c, p)
    );
    if let Some(e) = p.assessment.e_rise {
        s.push_str(&format!(
            "; evidence of a rise e = {}",
            crate::core::adaptive::e_value_text(e)
        ));
    }
    if !p.assessment.reasons.is_empty() {
        let why = if p.state() == State::Suspicious {
            "suspicious, not a failure: "
        } else {
            ""
        };
        s.push_str(&format!("\n{why}{}", p.assessment.reasons.join("; ")));
    }
    if let Some(dir) = &p.dir {
        s.push_str(&format!("\nreport: {dir}/report.html"));
    }
    s
}

impl Exporter<HistoryRecord> for HistoryJunit {
    fn file_name(&self) -> &'static str {
        "history-junit.xml"
    }

    fn render(&self, r: &HistoryRecord) -> anyhow::Result<String> {
        let outcomes: Vec<Outcome> = r.cells.iter().map(|c| outcome(r, c)).collect();
        let failures = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Failure { .. }))
            .count();
        let errors = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Error(..)))
            .count();
        let suite = format!("bisect history {}", r.plan);
        let classname = format!("history.{}", r.plan);
        let mut x = junit_open(
            &suite,
            &JunitCounts {
                tests: r.cells.len(),
                failures,
                errors,
                skipped: 0,
                time: None,
            },
            &r.generated_at,
        );
        let mut props = vec![
            ("plan", r.plan.clone()),
            ("nights", nights_words(&r.nights)),
            ("alpha", r.policy.alpha.to_string()),
            ("family", r.family.to_string()),
            ("regressions", r.regressions.len().to_string()),
            ("command", r.command.clone()),
        ];
        if let Some(last) = r.nights.last() {
            if let Some(b) = last.build_words() {
                props.push(("newest_build", b.to_string()));
            }
        }
        x.push_str(&junit_properties(&props));
        for (c, o) in r.cells.iter().zip(&outcomes) {
            x.push_str(&format!(
                "    <testcase classname=\"{}\" name=\"{}\">\n",
                esc(&classname),
                esc(&c.id)
            ));
            match o {
                Outcome::Pass => {}
                Outcome::Failure { message, details } => x.push_str(&format!(
                    "      <failure type=\"regression\" message=\"{}\">{}</failure>\n",
                    esc(message),
                    esc(details)
                )),
                Outcome::Error(kind, why) => x.push_str(&format!(
                    "      <error type=\"{kind}\" message=\"{}\"/>\n",
                    esc(why)
                )),
            }
            x.push_str(&format!(
                "      <system-out>{}</system-out>\n",
                esc(&newest_words(r, c))
            ));
            x.push_str("    </testcase>\n");
        }
        x.push_str("  </testsuite>\n</testsuites>\n");
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::history::export::html::tests::sample_record;

    fn render(r: &HistoryRecord) -> String {
        HistoryJunit.render(r).unwrap()
    }

    /// The test case of `cell`, whole.
    fn case<'a>(xml: &'a str, cell: &str) -> &'a str {
        let start = xml
            .find(&format!("name=\"{}\">", esc(cell)))
            .unwrap_or_else(|| panic!("no test case {cell}: {xml}"));
        let end = start + xml[start..].find("</testcase>").unwrap();
        &xml[start..end]
    }

    #[test]
    fn counts_and_outcomes_follow_each_cells_newest_night() {
        let xml = render(&sample_record());
        assert!(xml.contains(
            "  <testsuite name=\"bisect history nightly\" tests=\"3\" failures=\"1\" errors=\"1\" skipped=\"0\" timestamp=\"2025-01-05T06:00:00.000Z\">"
        ), "{xml}");
        assert_eq!(xml.matches("<testsuite ").count(), 1);
        assert!(xml.contains("<testcase classname=\"history.nightly\" name=\"BF16=1,s16\">"));

        let regressed = case(&xml, "BF16=1,s16");
        assert!(regressed.contains(
            "<failure type=\"regression\" message=\"regression: first bad 2025-01-02 (build 0123456789), last good 2025-01-01 (build a1b2c3d4e5): open regression since night 2 (found on night 2)\">"
        ), "{regressed}");
        assert!(regressed.contains("last good night: 2025-01-01 (build a1b2c3d4e5)\nfirst bad night: 2025-01-02 (build 0123456789)"));
        assert!(regressed.contains(
            "evidence: e = 240 &gt;= 200 (e-BH)\nrate: 0/16 (0.0%) -&gt; 8/16 (50.0%)\nended: open"
        ));
        assert!(regressed.contains("answer: culprit 0badc0ffee (kv: reuse &lt;blocks&gt; early)"));
        assert!(regressed.contains("&amp;&amp; echo &quot;done&quot;"));

        let ok = case(&xml, "BF16=0,s16");
        assert!(!ok.contains("<failure") && !ok.contains("<error"), "{ok}");
        assert!(ok.contains("<system-out>newest night 2025-01-04: ok; 1/20 = 5.0% ["));

        let load = case(&xml, "load:c16");
        assert!(load.contains(
            "<error type=\"insufficient\" message=\"insufficient: the sweep stopped short of its top load\"/>"
        ), "{load}");
        assert!(load.contains("threshold 8 sessions in flight"));
    }

    #[test]
    fn suspicious_passes_saying_why_and_missing_is_an_error() {
        let mut r = sample_record();
        r.cells[1].series.swap(1, 3);
        r.cells[0].series[3] = r.cells[0].series[2].clone();
        let xml = render(&r);
        assert!(
            xml.contains("tests=\"3\" failures=\"0\" errors=\"2\""),
            "{xml}"
        );

        let suspicious = case(&xml, "BF16=0,s16");
        assert!(!suspicious.contains("<failure") && !suspicious.contains("<error"));
        assert!(
            suspicious.contains("newest night 2025-01-04: suspicious; 4/20 = 20.0% ["),
            "{suspicious}"
        );
        assert!(suspicious.contains(
            "\nsuspicious, not a failure: this night alone (4/20 (20.0%)) is above its chain&apos;s earlier nights (0/20 (0.0%)): one-sided Fisher p = 0.053 &lt; 0.06"
        ), "{suspicious}");

        let missing = case(&xml, "BF16=1,s16");
        assert!(missing.contains(
            "<error type=\"missing\" message=\"missing: no record of this night (the nightly did not run)\"/>"
        ), "{missing}");
    }

    #[test]
    fn escapes_markup_and_drops_control_characters() {
        assert_eq!(
            esc("<a name=\"x\">&'y'\u{1}\t\n"),
            "&lt;a name=&quot;x&quot;&gt;&amp;&apos;y&apos;\t\n"
        );
        let mut r = sample_record();
        r.plan = "night\"ly<".into();
        let xml = render(&r);
        assert!(xml.contains("<testsuite name=\"bisect history night&quot;ly&lt;\""));
        assert!(xml.contains("classname=\"history.night&quot;ly&lt;\""));
    }
}
