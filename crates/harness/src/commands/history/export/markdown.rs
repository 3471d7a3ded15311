//! `history.md`: the history as people paste it into a channel, and as `bisect history`
//! prints it: the rule, the nights (label, status, build), one row per cell with its
//! newest night's state, rate, evidence and reasons, then the regressions with their last
//! good and first bad nights, the search between their builds (the prepared command in a
//! code block) and its answer once landed, and the records that were skipped. The words
//! for a regression's parts are here, and the dashboard and the JUnit file use them too.

use crate::commands::history::record::{
    CellHistory, CellKind, CellPoint, HistoryRecord, LandedSearch, NightEntry, NightRef,
    NightStatus, RegressionEntry, SearchPlan,
};
use crate::commands::history::Outcome;
use crate::core::adaptive::e_value_text;
use crate::core::format;
use crate::core::history::{Ending, RegressionEvent, State};
use crate::results::markup::table_header;
use crate::results::Exporter;

/// Characters of a commit sha shown (a build that is all hex and longer is cut to this).
const SHA_CHARS: usize = 10;

pub struct HistorySummary;

impl Exporter<HistoryRecord> for HistorySummary {
    fn file_name(&self) -> &'static str {
        "history.md"
    }

    fn render(&self, r: &HistoryRecord) -> anyhow::Result<String> {
        let mut s = String::new();
        header(&mut s, r);
        nights_table(&mut s, r);
        cells_table(&mut s, r);
        regressions(&mut s, r);
        if !r.skipped.is_empty() {
            s.push_str("\n## Skipped records\n\n");
            for why in &r.skipped {
                s.push_str(&format!("- {why}\n"));
            }
        }
        Ok(s)
    }
}

/// Title, nights, rule, command and the one-line outcome.
fn header(s: &mut String, r: &HistoryRecord) {
    s.push_str(&format!(
        "# bisect history `{}`: {}\n\n",
        r.plan,
        nights_words(&r.nights)
    ));
    s.push_str(&format!("- rule: {}\n", rule_words(r)));
    s.push_str(&format!("- generated: {}\n", r.generated_at));
    s.push_str(&format!("- command: `{}`\n\n", r.command));
    s.push_str(&format!(
        "**{}.**\n",
        Outcome::of(r).words(|id| format!("`{id}`"))
    ));
}

fn nights_table(s: &mut String, r: &HistoryRecord) {
    s.push_str("\n## Nights\n\n");
    s.push_str(&table_header(&["night", "status", "build", "directory"]));
    for n in &r.nights {
        let mut status = status_name(n.status).to_string();
        if !n.replaced.is_empty() {
            status.push_str(&format!(" (rerun, replaced {})", n.replaced.len()));
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            table_text(&n.label),
            status,
            n.build_words().map_or("-".to_string(), |b| format!(
                "`{}`",
                table_text(short_build(b))
            )),
            n.dir.as_deref().map_or("-".to_string(), table_text),
        ));
    }
}

/// One row per cell: its newest night.
fn cells_table(s: &mut String, r: &HistoryRecord) {
    s.push_str("\n## Cells (newest night)\n\n");
    s.push_str(&table_header(&[
        "cell",
        "state",
        "rate [95% CI]",
        "e-value",
        "reasons",
    ]));
    for c in &r.cells {
        let Some(p) = c.latest() else {
            s.push_str(&format!(
                "| `{}` | - | - | - | no nights |\n",
                table_text(&c.id)
            ));
            continue;
        };
        let state = match p.state() {
            State::Regression => "**regression**".to_string(),
            other => other.name().to_string(),
        };
        s.push_str(&format!(
            "| `{}` | {state} | {} | {} | {} |\n",
            table_text(&c.id),
            table_text(&measure_words(c, p)),
            p.assessment.e_rise.map_or("-".to_string(), e_value_text),
            match p.assessment.reasons.as_slice() {
                [] => "-".to_string(),
                reasons => table_text(&reasons.join("; ")),
            },
        ));
    }
}

fn regressions(s: &mut String, r: &HistoryRecord) {
    s.push_str("\n## Regressions\n\n");
    if r.regressions.is_empty() {
        s.push_str("None found.\n");
        return;
    }
    for g in &r.regressions {
        s.push_str(&format!("- {}\n", regression_line(r, g)));
        match &g.search {
            SearchPlan::Prepared { command, dir, .. } => {
                s.push_str(&format!(
                    "  search between the builds (into `{dir}`):\n\n  ```sh\n  {command}\n  ```\n\n"
                ));
            }
            SearchPlan::Unavailable { why } => s.push_str(&format!("  no search: {why}\n")),
        }
        if let Some(l) = &g.landed {
            s.push_str(&format!(
                "  answer: {} ({}/report.html)\n",
                landed_words(l),
                l.dir
            ));
        }
    }
}

/// `` `CELL` regressed: last good N1 (`sha`), first bad N2 (`sha`), flagged N2; e = 240 >= 200; 0/16 (0.0%) -> 8/16 (50.0%); open ``
pub(super) fn regression_line(r: &HistoryRecord, g: &RegressionEntry) -> String {
    format!(
        "**`{}`** regressed: last good {}, first bad {}, flagged {}; {}; {}; {}",
        g.cell,
        night_ref_words(&g.last_good),
        night_ref_words(&g.first_bad),
        g.flagged.label,
        evidence_words(&g.event),
        rates_words(&g.event),
        ended_words(r, &g.event)
    )
}

/// `12 nights (2025-01-01..2025-01-12)`.
pub(super) fn nights_words(nights: &[NightEntry]) -> String {
    match (nights.first(), nights.last()) {
        (Some(first), Some(last)) => format!(
            "{} night{} ({}..{})",
            nights.len(),
            if nights.len() == 1 { "" } else { "s" },
            first.label,
            last.label
        ),
        _ => "no nights".to_string(),
    }
}

/// The history's rule, from its policy and family.
pub(super) fn rule_words(r: &HistoryRecord) -> String {
    format!(
        "a regression where e-BH at alpha {} over the {} rate cell{} rejects; suspicious at evidence e >= {} not rejected, or a night alone above its chain at one-sided Fisher p < {}",
        r.policy.alpha,
        r.family,
        if r.family == 1 { "" } else { "s" },
        e_value_text(r.policy.suspicious_e),
        r.policy.suspicious_p
    )
}

/// The outcome's words ([`Outcome`], the exit code's rule).
pub(super) trait OutcomeWords {
    fn words(&self, quote: impl Fn(&str) -> String) -> String;
}

impl OutcomeWords for Outcome<'_> {
    /// One line; `quote` writes a cell id (backticks here, nothing on the page).
    fn words(&self, quote: impl Fn(&str) -> String) -> String {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let n = self.regressed.len();
        if n > 0 {
            let ids: Vec<String> = self.regressed.iter().map(|id| quote(id)).collect();
            format!(
                "Open regression{} on the newest night in {n} cell{}: {}",
                plural(n),
                plural(n),
                ids.join(", ")
            )
        } else if self.unshown > 0 {
            format!(
                "No open regression, but {} cell{} missing or insufficient on the newest night: not a pass",
                self.unshown,
                plural(self.unshown)
            )
        } else if self.suspicious > 0 {
            format!(
                "No open regression; {} cell{} suspicious on the newest night (worth a look, not a failure)",
                self.suspicious,
                plural(self.suspicious)
            )
        } else {
            "No open regression".to_string()
        }
    }
}

pub(super) fn status_name(status: NightStatus) -> &'static str {
    match status {
        NightStatus::Finished => "finished",
        NightStatus::Unfinished => "unfinished",
        NightStatus::Absent => "absent",
    }
}

/// A build as shown: a commit sha (all hex, longer than [`SHA_CHARS`]) cut to its first
/// characters, anything else whole.
pub(super) fn short_build(build: &str) -> &str {
    if build.len() > SHA_CHARS && build.chars().all(|c| c.is_ascii_hexdigit()) {
        &build[..SHA_CHARS]
    } else {
        build
    }
}

/// `2025-01-02 (build `0123456789`)`, or the label alone without a build.
pub(super) fn night_ref_words(n: &NightRef) -> String {
    match &n.build {
        Some(b) => format!("{} (build `{}`)", n.label, short_build(b)),
        None => format!("{} (no build)", n.label),
    }
}

/// A night's label by index, or `night N` (1-based) past the record's nights.
pub(super) fn night_label(r: &HistoryRecord, night: usize) -> String {
    r.nights
        .get(night)
        .map_or_else(|| format!("night {}", night + 1), |n| n.label.clone())
}

/// `e = 240 >= 200`: the evidence when flagged and the e-BH threshold it met.
pub(super) fn evidence_words(e: &RegressionEvent) -> String {
    format!(
        "e = {} >= {}",
        e_value_text(e.e_value),
        e_value_text(e.threshold)
    )
}

/// `0/16 (0.0%) -> 8/16 (50.0%)`: the chain before and after the change point.
pub(super) fn rates_words(e: &RegressionEvent) -> String {
    format!(
        "{} -> {}",
        format::rate(e.before.0, e.before.1),
        format::rate(e.after.0, e.after.1)
    )
}

/// `open`, or how and on which night it ended.
pub(super) fn ended_words(r: &HistoryRecord, e: &RegressionEvent) -> String {
    match e.ended {
        None => "open".to_string(),
        Some((night, how)) => {
            let how = match how {
                Ending::Mended => "mended",
                Ending::Superseded => "superseded",
                Ending::Reset => "reset",
            };
            format!("{how} on {}", night_label(r, night))
        }
    }
}

/// `culprit 0badc0ffee (kv: reuse blocks early): WORDS`: a landed search's answer.
pub(super) fn landed_words(l: &LandedSearch) -> String {
    format!("{}{}", answer_name(l), landed_detail(l))
}

/// The answer's name (`culprit`, `no_culprit`, ...), or `no answer`.
pub(super) fn answer_name(l: &LandedSearch) -> &'static str {
    l.answer.map_or("no answer", |a| a.name())
}

/// What follows the answer's name: the culprit, its subject, the answer in words.
pub(super) fn landed_detail(l: &LandedSearch) -> String {
    let mut s = String::new();
    if let Some(sha) = &l.culprit {
        s.push_str(&format!(" {}", short_build(sha)));
    }
    if let Some(subject) = &l.subject {
        s.push_str(&format!(" ({subject})"));
    }
    if !l.words.is_empty() {
        s.push_str(&format!(": {}", l.words));
    }
    s
}

/// A night's measure: the rate with its interval, a load cell's threshold, or why not.
pub(super) fn measure_words(c: &CellHistory, p: &CellPoint) -> String {
    match c.kind {
        CellKind::Load => match &p.threshold {
            Some(t) => format!("threshold {t}"),
            None => "-".to_string(),
        },
        CellKind::Rate => match p.ci95 {
            Some(ci) => format::rate_interval(p.corrupted, p.judged, ci),
            None if p.sessions > 0 => format!("0 of {} sessions judged", p.sessions),
            None => "-".to_string(),
        },
    }
}

/// Text safe inside a Markdown table cell: one line, `|` escaped.
fn table_text(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::history::export::html::tests::sample_record;

    fn render(r: &HistoryRecord) -> String {
        HistorySummary.render(r).unwrap()
    }

    #[test]
    fn the_regression_line_names_its_nights_builds_evidence_and_ending() {
        let md = render(&sample_record());
        assert!(
            md.contains(
                "- **`BF16=1,s16`** regressed: last good 2025-01-01 (build `a1b2c3d4e5`), \
                 first bad 2025-01-02 (build `0123456789`), flagged 2025-01-02; \
                 e = 240 >= 200; 0/16 (0.0%) -> 8/16 (50.0%); open\n"
            ),
            "{md}"
        );
        assert!(
            md.contains("  ```sh\n  bisect commits --good a1b2c3d4e5f6"),
            "the prepared command in a code block: {md}"
        );
        assert!(
            md.contains("  answer: culprit 0badc0ffee (kv: reuse <blocks> early): "),
            "{md}"
        );
        assert!(md.contains("(bisects/BF16_1_s16@2025-01-01..2025-01-02/report.html)"));

        let mut ended = sample_record();
        ended.regressions[0].event.ended = Some((3, Ending::Mended));
        assert!(render(&ended).contains("; mended on 2025-01-04\n"));
    }

    #[test]
    fn nights_and_the_newest_state_of_each_cell() {
        let md = render(&sample_record());
        assert!(md.starts_with("# bisect history `nightly`: 4 nights (2025-01-01..2025-01-04)\n"));
        assert!(md.contains("| 2025-01-03 | absent | - | - |\n"), "{md}");
        assert!(
            md.contains("| 2025-01-02 | finished | `0123456789` | n2 |\n"),
            "{md}"
        );
        assert!(
            md.contains("| 2025-01-04 | unfinished | `v2.1` | n4 |\n"),
            "{md}"
        );
        assert!(
            md.contains("| `BF16=1,s16` | **regression** | 9/16 = 56.2% ["),
            "{md}"
        );
        assert!(
            md.contains("| `BF16=0,s16` | ok | 1/20 = 5.0% [0.9%, 23.6%] | 0.80 | - |\n"),
            "{md}"
        );
        assert!(md.contains("| `load:c16` | insufficient | threshold 8 sessions in flight | - |"));
        assert!(md.contains("**Open regression on the newest night in 1 cell: `BF16=1,s16`.**"));
        assert!(
            md.contains("\n## Skipped records\n\n- weekly/matrix.json: plan weekly, not nightly\n")
        );
    }

    #[test]
    fn a_pipe_in_a_reason_keeps_the_table_whole() {
        let mut r = sample_record();
        r.cells[1].series[3].assessment.reasons = vec!["a | b\nc".into()];
        assert!(render(&r).contains("| a \\| b c |\n"));
    }

    #[test]
    fn unavailable_searches_say_why_and_short_builds_only_cut_shas() {
        let mut r = sample_record();
        r.regressions[0].search = SearchPlan::Unavailable {
            why: "the plan has no [commits] table".into(),
        };
        r.regressions[0].landed = None;
        let md = render(&r);
        assert!(md.contains("  no search: the plan has no [commits] table\n"));
        assert!(!md.contains("```"));
        assert!(!md.contains("answer:"));
        assert_eq!(
            short_build("v1.2.3-rc1-with-a-long-name"),
            "v1.2.3-rc1-with-a-long-name"
        );
        assert_eq!(short_build("0123456789abcdef"), "0123456789");
        assert_eq!(short_build("abc1234"), "abc1234");
    }
}
