//! `junit.xml`: one test case per cell, so CI systems show the night like a test run.
//! A regressed cell is a `<failure>` carrying its reasons; a cell that cannot be
//! compared (configuration or workload changed) is `<skipped>`; a cell that did not
//! finish, was blocked because its engine ran another configuration, or was compared
//! but is inconclusive (its measurement cannot show it ok), is an `<error>`; every
//! other cell passes.

use crate::commands::matrix::record::{CellRecord, CellStatus, MatrixRecord};
use crate::core::format;
use crate::core::session::{Counts, SessionClass};
use crate::results::markup::{junit_open, junit_properties, xml_escape as esc, JunitCounts};
use crate::results::Exporter;

pub struct JunitXml;

enum Outcome {
    Pass,
    Failure(String),
    Skipped(String),
    Error(String),
}

fn outcome(c: &CellRecord) -> Outcome {
    let reasons = || {
        c.comparison
            .as_ref()
            .map(|x| x.reasons.join("; "))
            .unwrap_or_default()
    };
    if c.is_blocked() {
        return Outcome::Error(format!("blocked: {}", c.blocked.join("; ")));
    }
    if !c.is_finished() {
        return Outcome::Error(format!("cell did not finish ({})", c.status));
    }
    match c.verdict() {
        Some(CellStatus::Regressed) => Outcome::Failure(reasons()),
        Some(CellStatus::NotComparable) => {
            Outcome::Skipped(format!("not comparable: {}", reasons()))
        }
        Some(CellStatus::Inconclusive) => Outcome::Error(format!("inconclusive: {}", reasons())),
        _ => Outcome::Pass,
    }
}

impl Exporter<MatrixRecord> for JunitXml {
    fn file_name(&self) -> &'static str {
        "junit.xml"
    }

    fn render(&self, r: &MatrixRecord) -> anyhow::Result<String> {
        let outcomes: Vec<Outcome> = r.cells.iter().map(outcome).collect();
        let failures = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Failure(_)))
            .count();
        let skipped = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Skipped(_)))
            .count();
        let errors = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Error(_)))
            .count();
        let time: f64 = r.cells.iter().map(|c| c.stats.wall_s).sum();
        let suite = format!("bisect.matrix.{}", r.plan.name);
        let mut x = junit_open(
            &suite,
            &JunitCounts {
                tests: r.cells.len(),
                failures,
                errors,
                skipped,
                time: Some(time),
            },
            &r.header.started_at,
        );
        let mut props = vec![
            ("matrix_id", r.header.id.clone()),
            ("plan_hash", r.plan.hash.clone()),
            ("workload_hash", r.workload_hash.clone()),
            ("status", r.header.status.to_string()),
        ];
        if let Some(s) = &r.shard {
            props.push(("shard", s.to_string()));
        }
        if let Some(b) = &r.baseline {
            props.push(("baseline", b.id.clone()));
        }
        x.push_str(&junit_properties(&props));
        for (c, o) in r.cells.iter().zip(&outcomes) {
            x.push_str(&format!(
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">\n",
                esc(&suite),
                esc(&c.id),
                c.stats.wall_s
            ));
            match o {
                Outcome::Pass => {}
                Outcome::Failure(reasons) => x.push_str(&format!(
                    "      <failure type=\"regression\" message=\"{}\">{}</failure>\n",
                    esc(&format!("regressed: {reasons}")),
                    esc(reasons)
                )),
                Outcome::Skipped(why) => {
                    x.push_str(&format!("      <skipped message=\"{}\"/>\n", esc(why)))
                }
                Outcome::Error(why) => x.push_str(&format!(
                    "      <error type=\"not_run\" message=\"{}\"/>\n",
                    esc(why)
                )),
            }
            x.push_str(&format!(
                "      <system-out>{}</system-out>\n",
                esc(&format!(
                    "corrupted {}; {} {}{}; sessions in {}",
                    format::rate_interval(c.stats.corrupted, c.stats.judged(), c.stats.ci95),
                    named_counts(&c.stats.counts, SessionClass::corrupted()),
                    named_counts(
                        &c.stats.counts,
                        SessionClass::iter().filter(|k| k.is_failure())
                    ),
                    // Named only when it happened, like run.json's count.
                    match c.stats.counts[SessionClass::Crashed] {
                        0 => String::new(),
                        n => format!(" crashed {n}"),
                    },
                    c.dir
                ))
            ));
            x.push_str("    </testcase>\n");
        }
        x.push_str("  </testsuite>\n</testsuites>\n");
        Ok(x)
    }
}

/// `leak 0 bad_args 2 ...`: each class with its count; a class that records only when
/// it happened (run.json's rule) is named only then.
fn named_counts(counts: &Counts, classes: impl Iterator<Item = SessionClass>) -> String {
    classes
        .filter(|k| !(k.recorded_when_nonzero() && counts[*k] == 0))
        .map(|k| format!("{} {}", k.name(), counts[k]))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::esc;

    #[test]
    fn escapes_markup_and_drops_control_characters() {
        assert_eq!(
            esc("<｜DSML｜parameter name=\"a\">x & 'y'\u{1}</"),
            "&lt;｜DSML｜parameter name=&quot;a&quot;&gt;x &amp; &apos;y&apos;&lt;/"
        );
    }
}
