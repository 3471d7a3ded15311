//! The verdict of a stopped adaptive run (docs/sequential.md, "bisect run --adaptive"):
//! the sequential decision, voided by every blocking check of a fixed run and by any
//! block pair that failed its own, and the texts (reasons, summary) that say why.

use serde_json::Value;

use super::AdaptiveRecord;
use crate::confounds::{confounds, load_shortfalls};
use crate::evidence::{ArmObservation, Confound, Policy, Severity};
use crate::format::{self, percent_digits};
use crate::reason::Reason;
use crate::sequential::{Decision, Direction};
use crate::verdict::{decide, Comparison, Status, Verdict};

/// `1.2e4` for large e-values, `3.4` for small ones.
pub fn e_value_text(e: f64) -> String {
    if !e.is_finite() {
        return format::quantity(e);
    }
    if e >= 1000.0 {
        format!("{e:.1e}")
    } else if e >= 10.0 {
        format!("{e:.0}")
    } else {
        format!("{e:.2}")
    }
}

/// The always-valid interval in points: `-2.1 to +9.8`.
fn interval_text([lo, hi]: [f64; 2]) -> String {
    format!("{} to {}", percent_digits(lo), percent_digits(hi))
}

/// The arm the decision says corrupts, then the other; `on` first unless `off` was
/// implicated.
fn corrupting_first<'b, 'a>(
    record: &AdaptiveRecord,
    on: &'b ArmObservation<'a>,
    off: &'b ArmObservation<'a>,
) -> (&'b ArmObservation<'a>, &'b ArmObservation<'a>) {
    match record.decision {
        Some(Decision::Implicated {
            direction: Direction::Off,
        }) => (off, on),
        _ => (on, off),
    }
}

/// The verdict of an adaptive run: the sequential decision, voided by any blocking check
/// of a fixed run (read-back, effective config, degraded arm, workload) over the pooled
/// blocks and over each block (`blocks`, as [`decide`] takes them), by any block pair
/// whose own check failed (`record.checks`), and `cleared` also by a block whose engine
/// load fell short of the target. The pooled Fisher p and Newcombe interval are kept in
/// `comparison` for reference only: they do not hold under optional stopping, and the
/// verdict never rests on them.
pub fn verdict(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
    flag: &str,
    record: &AdaptiveRecord,
) -> (Comparison, Vec<Confound>, Verdict) {
    let (comparison, _, _) = decide(on, off, blocks, policy, flag);
    let found = adaptive_confounds(on, off, blocks, policy, record);
    let blocking: Vec<&Confound> = found
        .iter()
        .filter(|c| c.severity == Severity::Blocking)
        .collect();
    let warnings: Vec<&Confound> = found
        .iter()
        .filter(|c| c.severity == Severity::Warning)
        .collect();
    let shortfalls = adaptive_shortfalls(on, off, blocks, policy, record);
    let mut reasons: Vec<Reason> = blocking
        .iter()
        .map(|c| Reason::finding(c.note.clone()))
        .collect();
    let contradiction = drained_contradiction(record, &comparison, policy);
    let status = decided_status(
        &Decided {
            on,
            off,
            record,
            path: sequential_path(record),
            contradiction,
            shortfalls,
            blocked: !blocking.is_empty(),
        },
        &mut reasons,
    );
    reasons.push(Reason::reference(format!(
        "for reference only (not valid under optional stopping): pooled Fisher p = {}, \
         Newcombe 95% interval {} points",
        format::p_value(comparison.p_value),
        interval_text(comparison.diff_ci95)
    )));
    reasons.extend(warnings.iter().map(|c| Reason::warning(&c.note)));

    let (corrupting, clean) = corrupting_first(record, on, off);
    let direction = (status == Status::Implicated).then(|| {
        format!(
            "{} corrupts: {}/{} vs {}/{}",
            corrupting.name(),
            corrupting.stats.counts.corrupted(),
            corrupting.stats.sessions(),
            clean.stats.counts.corrupted(),
            clean.stats.sessions()
        )
    });
    let mut summary = summary_line(status, on, off, flag, record, &reasons);
    if !warnings.is_empty() {
        let names: Vec<&str> = warnings.iter().map(|c| c.name.as_str()).collect();
        summary.push_str(&format!(" (warnings: {})", names.join(", ")));
    }
    let verdict = crate::verdict::with_mechanism(
        Verdict {
            status,
            direction,
            reasons,
            summary,
        },
        (on, off),
        flag,
    );
    (comparison, found, verdict)
}

/// A fixed run's confounds over the pooled arms and blocks, with a blocking one first
/// for every block pair that on its own failed a blocking check.
fn adaptive_confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
    record: &AdaptiveRecord,
) -> Vec<Confound> {
    let mut found = confounds(on, off, blocks, policy);
    let failed_pairs = record.checks.iter().filter(|c| !c.pair_blocking.is_empty());
    found.splice(
        0..0,
        failed_pairs.map(|c| Confound {
            name: format!("block_pair.{}", c.pair),
            on: Value::Null,
            off: Value::Null,
            severity: Severity::Blocking,
            note: format!(
                "block pair {} on its own failed a blocking check: {}",
                c.pair,
                c.pair_blocking.join("; ")
            ),
        }),
    );
    found
}

/// How the sequential test got where it stopped: sessions, pairs, looks, the last
/// e-value and always-valid interval.
fn sequential_path(record: &AdaptiveRecord) -> String {
    let (on_run, off_run) = record.sessions_per_arm();
    match record.looks.last() {
        Some(l) => format!(
            "after {on_run} + {off_run} sessions in {} block pair(s) at {} in flight ({} looks): \
             e-value {} (implicates at {}), always-valid {:.0}% interval for the difference {} points",
            record.pairs(),
            record.design.concurrency,
            record.looks.len(),
            e_value_text(l.record.e_value),
            e_value_text(l.record.threshold),
            100.0 * (1.0 - record.design.clear_alpha),
            interval_text(l.record.diff_interval)
        ),
        None => "before any look".to_string(),
    }
}

/// Why the load does not support `cleared`. Every block's own load (the pooled peak is
/// the best block's); without the blocks, the pairs' recorded shortfalls and the pooled
/// arms'.
fn adaptive_shortfalls(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
    record: &AdaptiveRecord,
) -> Vec<String> {
    let mut shortfalls = load_shortfalls(on, off, blocks, policy);
    if blocks.is_empty() {
        shortfalls.extend(
            record
                .checks
                .iter()
                .flat_map(|c| c.load_shortfall.iter().cloned()),
        );
    }
    shortfalls
}

/// Where the pooled arms contradict the sequential decision. Sessions drained after a
/// mid-pair decision were not fed to the e-process; they must not contradict it (the
/// pooled arms hold every session run).
fn drained_contradiction(
    record: &AdaptiveRecord,
    comparison: &Comparison,
    policy: &Policy,
) -> Option<String> {
    let overrun: u64 = record.blocks.iter().map(|b| b.sessions - b.fed).sum();
    match record.decision {
        _ if overrun == 0 => None,
        Some(Decision::Implicated { direction }) => {
            let pooled_on_higher = comparison.rate_diff > 0.0;
            (pooled_on_higher != (direction == Direction::On)).then(|| {
                format!(
                    "the pooled arms, with the {overrun} sessions drained after the decision, \
                     point the other way (difference {} points)",
                    percent_digits(comparison.rate_diff)
                )
            })
        }
        Some(Decision::Cleared) if comparison.p_value < policy.alpha => Some(format!(
            "the pooled arms, with the {overrun} sessions drained after the decision, differ \
             significantly (Fisher p = {} < alpha {})",
            format::p_value(comparison.p_value),
            policy.alpha
        )),
        _ => None,
    }
}

/// What [`decided_status`] weighs.
struct Decided<'a, 'b> {
    on: &'b ArmObservation<'a>,
    off: &'b ArmObservation<'a>,
    record: &'b AdaptiveRecord,
    /// [`sequential_path`].
    path: String,
    /// [`drained_contradiction`].
    contradiction: Option<String>,
    /// [`adaptive_shortfalls`].
    shortfalls: Vec<String>,
    /// Whether any blocking confound voids the comparison.
    blocked: bool,
}

/// The status the sequential decision earns once the blocking checks, the drained
/// sessions and the load have had their say; pushes the reason onto `reasons`.
fn decided_status(d: &Decided, reasons: &mut Vec<Reason>) -> Status {
    let (record, path) = (d.record, &d.path);
    let m = record.design.min_effect;
    match (&record.decision, !d.blocked) {
        (Some(dec @ (Decision::Implicated { .. } | Decision::Cleared)), true)
            if d.contradiction.is_some() =>
        {
            reasons.push(Reason::finding(format!(
                "the sequential test {path} says {}, but {}",
                if matches!(dec, Decision::Cleared) {
                    "cleared"
                } else {
                    "implicated"
                },
                d.contradiction.as_deref().unwrap_or_default()
            )));
            Status::Inconclusive
        }
        (_, false) => {
            reasons.push(Reason::finding(format!(
                "the sequential test {path}, but the blocking checks above void the comparison"
            )));
            Status::Inconclusive
        }
        (Some(Decision::Implicated { direction }), true) => {
            let arm = if *direction == Direction::On {
                d.on
            } else {
                d.off
            };
            reasons.push(Reason::finding(format!(
                "sequential test {path}: the e-value reached 1/alpha = {}, {} corrupts more \
                 (error rate <= alpha {} under this optional stopping)",
                e_value_text(1.0 / record.design.alpha),
                arm.name(),
                record.design.alpha
            )));
            Status::Implicated
        }
        (Some(Decision::Cleared), true) if d.shortfalls.is_empty() => {
            reasons.push(Reason::finding(format!(
                "sequential test {path}: the interval lies inside +-{} points",
                percent_digits(m)
            )));
            Status::Cleared
        }
        (Some(Decision::Cleared), true) => {
            reasons.push(Reason::finding(format!(
                "sequential test {path}: the interval lies inside +-{} points, but {}: a bug \
                 that needs load is not ruled out at a lower one",
                percent_digits(m),
                d.shortfalls.join("; ")
            )));
            Status::Inconclusive
        }
        (Some(Decision::Underpowered { interval }), true) => {
            reasons.push(Reason::finding(format!(
                "underpowered: the cap of {} sessions per arm was reached undecided, {path}; \
                 the interval {} must lie inside +-{} points to clear, or the e-value reach {} \
                 to implicate (raise --max-sessions, or --min-effect)",
                record.design.max_per_arm,
                interval_text(*interval),
                percent_digits(m),
                e_value_text(1.0 / record.design.alpha)
            )));
            Status::Inconclusive
        }
        (Some(Decision::Continue) | None, true) => {
            reasons.push(Reason::finding(format!(
                "stopped before the sequential test decided ({}), {path}",
                record.stopped.as_deref().unwrap_or("the run ended early")
            )));
            Status::Inconclusive
        }
    }
}

/// The one-line summary of the verdict, before its warnings; an inconclusive one says
/// every reason that is neither a warning nor for reference.
fn summary_line(
    status: Status,
    on: &ArmObservation,
    off: &ArmObservation,
    flag: &str,
    record: &AdaptiveRecord,
    reasons: &[Reason],
) -> String {
    let (corrupting, clean) = corrupting_first(record, on, off);
    let (on_run, off_run) = record.sessions_per_arm();
    let last = record.looks.last();
    let m = record.design.min_effect;
    let subject = if flag.is_empty() {
        String::new()
    } else {
        format!("{flag} ")
    };
    let e_text = last.map_or("1".to_string(), |l| e_value_text(l.record.e_value));
    match status {
        Status::Implicated => format!(
            "implicated: {subject}{} corrupts {} vs {} {}, sequential e-value {e_text} >= {} \
             after {on_run} + {off_run} sessions",
            corrupting.name(),
            corrupting.rate_text(true),
            clean.name(),
            clean.rate_text(false),
            e_value_text(1.0 / record.design.alpha)
        ),
        Status::Cleared => format!(
            "cleared: {subject}{} {} vs {} {}, always-valid interval {} points inside +-{}, \
             after {on_run} + {off_run} sessions at {} sessions in flight",
            on.name(),
            on.rate_text(true),
            off.name(),
            off.rate_text(false),
            interval_text(last.map_or([-1.0, 1.0], |l| l.record.diff_interval)),
            percent_digits(m),
            record.design.concurrency
        ),
        Status::Inconclusive => {
            format!(
                "inconclusive: {subject}{} {} vs {} {}: {}",
                on.name(),
                on.rate_text(true),
                off.name(),
                off.rate_text(false),
                crate::reason::findings(reasons)
            )
        }
    }
}
