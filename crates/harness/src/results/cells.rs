//! The cells of a run's arm table, shared by the terminal table, summary.md and
//! report.html (and the matrix and diff renderings that show arms): the header, the
//! legend, one arm's cells, the comparison sentence, and compact JSON and peak cells.

use std::collections::BTreeMap;

use super::run_record::ArmRecord;
use crate::core::format;
use crate::core::session::{Counts, SessionClass};
use crate::core::verdict::Comparison;

/// Which classes the arm table shows: the solo oracle's two (`diverged`, `drifted`)
/// only in a run it judged, so every other run's table reads as it always did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shown {
    oracle: bool,
}

impl Shown {
    /// The classes `record`'s tables show.
    pub(crate) fn of(record: &super::run_record::RunRecord) -> Self {
        Shown {
            oracle: record.runs.iter().any(|b| b.oracle.is_some()),
        }
    }

    fn shows(self, class: SessionClass) -> bool {
        self.oracle || !class.needs_oracle()
    }
}

/// The arm table's header: the class columns are named from the classes in them.
pub(crate) fn header(shown: Shown) -> [String; 9] {
    let names = |column: ClassColumn| {
        column
            .classes(shown)
            .map(|c| c.short_name())
            .collect::<Vec<_>>()
            .join("/")
    };
    [
        "arm".into(),
        "sessions".into(),
        names(ClassColumn::Finished),
        names(ClassColumn::Corrupted),
        names(ClassColumn::NotJudged),
        "corrupted".into(),
        "peak running".into(),
        "wall".into(),
        "tok/s".into(),
    ]
}

/// The three class columns of the arm table. Sessions an engine death cut short are
/// named after the third, only when there were some.
#[derive(Clone, Copy)]
enum ClassColumn {
    /// Judged and clean: done, maxrounds.
    Finished,
    /// The corruption rate's numerator.
    Corrupted,
    /// Not judged: failures and truncations.
    NotJudged,
}

impl ClassColumn {
    fn classes(self, shown: Shown) -> impl Iterator<Item = SessionClass> {
        SessionClass::iter().filter(move |c| {
            shown.shows(*c)
                && match self {
                    ClassColumn::Finished => c.is_judged() && !c.is_corrupted(),
                    ClassColumn::Corrupted => c.is_corrupted(),
                    ClassColumn::NotJudged => !c.is_judged() && *c != SessionClass::Crashed,
                }
        })
    }
}

/// One class column's cell: the counts of its classes, `/`-separated.
fn slashed(counts: &Counts, column: ClassColumn, shown: Shown) -> String {
    column
        .classes(shown)
        .map(|c| counts[c].to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// What the class columns of [`header`] mean, under the table in summary.md,
/// report.html and the terminal (docs/design.md 3.5).
pub(crate) const LEGEND: &str =
    "Classes: done/max = finished / ran out of rounds. Corrupted = leak \
(tool-call markup in the text) + bad (a call whose arguments do not parse or fit the tool) + \
wrong (another call than the step's) + no_tool (no call where one was due) + rejected (the \
engine refused the model's tool call with an error reply naming a parse failure, e.g. \
llama.cpp's HTTP 500; the body is the evidence). error/timeout/truncated are not judged: the \
rate is corrupted over the other sessions.";

/// The legend's sentence for the solo oracle's classes, in runs it judged.
const ORACLE_LEGEND: &str = " With --oracle solo every session is also compared with the \
same session run alone: diverged (corrupted) = a well-formed reply that parted from its reply \
alone where alone's choice was clear; drifted (not corrupted) = parted at a near-tie.";

/// [`LEGEND`], with the oracle's classes where the table shows them.
pub(crate) fn legend(shown: Shown) -> String {
    match shown.oracle {
        true => format!("{LEGEND}{ORACLE_LEGEND}"),
        false => LEGEND.to_string(),
    }
}

/// The row of one arm; blocks (`repeat` set) are named with their repeat, `on r1`,
/// when `with_repeat` asks for it.
pub(crate) fn arm_cells(
    flag: &str,
    arm: &ArmRecord,
    with_repeat: bool,
    shown: Shown,
) -> [String; 9] {
    let label = match (with_repeat, arm.repeat) {
        (true, Some(r)) => format!("{} r{r}", arm.label),
        _ => arm.label.to_string(),
    };
    let c = &arm.stats.counts;
    [
        format!("{label} ({flag}={})", arm.value),
        arm.sessions.to_string(),
        slashed(c, ClassColumn::Finished, shown),
        // Rejected (the engine refused a call it could not parse) is corruption: it
        // sits with the corrupted classes, not with error.
        slashed(c, ClassColumn::Corrupted, shown),
        // Truncated (cut off at max_tokens) sits beside the failures: neither is in
        // the corruption rate, and both say the run measured less than it meant to.
        // Sessions an engine death cut short, named only when there were some.
        match c[SessionClass::Crashed] {
            0 => slashed(c, ClassColumn::NotJudged, shown),
            n => format!("{} +{n} crashed", slashed(c, ClassColumn::NotJudged, shown)),
        },
        format::rate_interval(arm.stats.corrupted, arm.stats.judged(), arm.stats.ci95),
        peaks(&arm.stats.peak_running),
        format!("{:.1}s", arm.stats.wall_s),
        format!("{:.0}", arm.stats.tokens_per_s),
    ]
}

/// Peak running requests per role and client: `client 80, decode 80, prefill 0`.
pub(crate) fn peaks(peak_running: &BTreeMap<String, u64>) -> String {
    peak_running
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The comparison of a run's arms in one sentence, for summary.md and report.html.
pub(crate) fn comparison_sentence(c: &Comparison) -> String {
    format!(
        "Difference on - off: {} (95% Newcombe interval {} to {}); Fisher exact two-sided p = {}; min effect {}.",
        format::signed_percent(c.rate_diff),
        format::signed_percent(c.diff_ci95[0]),
        format::signed_percent(c.diff_ci95[1]),
        format::p_value(c.p_value),
        c.min_effect
    )
}

/// A JSON value as a short text: strings bare, fractions with two decimals.
pub(crate) fn compact(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() != 0.0 => format!("{f:.2}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}
