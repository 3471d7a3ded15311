//! The confounds of a two-arm run (docs/design.md 3.7): every reason the comparison of
//! `on` and `off` might not measure the flag. Blocking ones void the comparison
//! (read-back or effective value not the arm's, a degraded arm, differing workloads);
//! recorded ones qualify it (load, wall time, throughput, replies truncated at
//! `max_tokens`, error+timeout rates that differ, roles whose load was never measured,
//! roles whose engine does not report the flag's value, an arm whose rate moves with its
//! request index: `crate::trend`); [`load_shortfalls`] says when
//! the engine never ran the target concurrency, which only `cleared` needs.
//!
//! The checks that hold per engine start (read-back, effective value, load) are made on
//! every block of an arm that pooled several ([`checked`]): pooling keeps a block's
//! differing value and the highest peak, so only the block itself can say it failed.
//!
//! Pure: split from [`crate::verdict`], which decides from what is found here.
//! This module holds the blocking confounds; `recorded` the ones that qualify, and
//! `shortfall` the load shortfalls.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::effective;
use crate::evidence::{ArmObservation, Confound, Policy, Severity};
use crate::format::percent_digits;
use crate::session::SessionClass;

mod recorded;
mod replica;
mod shortfall;
pub mod trend;

use recorded::{
    differing_rates, engine_count_confound, metrics_confounds, recorded_confounds,
    transport_confounds, truncated_confound, unverified_confounds,
};
pub(crate) use shortfall::load_shortfalls;
pub use shortfall::{engine_load_shortfall, load_shortfall};

/// Every confound, blocking ones first, in a fixed order. `blocks`: as
/// [`crate::verdict::decide`] takes them.
pub fn confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
) -> Vec<Confound> {
    let checked = checked(on, off, blocks);
    let mut found = Vec::new();
    found.extend(readback_confounds(on, off, &checked));
    found.extend(effective_confounds(on, off, &checked));
    found.extend(replaced_confound(on, off));
    found.extend(degraded_confound(on, off, &checked, policy));
    found.extend(workload_confounds(on, off));
    found.extend(recorded_confounds(on, off, policy));
    found.extend(truncated_confound(on, off, policy));
    found.extend(metrics_confounds(on, off));
    found.extend(unverified_confounds(on, off, &checked));
    found.extend(transport_confounds(on, off));
    found.extend(engine_count_confound(on, off));
    found.extend(trend::trend_confound(on, off, policy));
    found.extend(replica::replica_confound(blocks, policy));
    // Blocking ones first, each group in the order above (a replica confound is
    // blocking only when the arms ran unevenly on the replicas).
    found.sort_by_key(|c| c.severity != Severity::Blocking);
    found
}

/// What the per-engine-start checks look at: each block where the arms pooled blocks,
/// else the two arms.
pub(super) fn checked<'a>(
    on: &ArmObservation<'a>,
    off: &ArmObservation<'a>,
    blocks: &[ArmObservation<'a>],
) -> Vec<ArmObservation<'a>> {
    if blocks.is_empty() {
        vec![*on, *off]
    } else {
        blocks.to_vec()
    }
}

/// An engine that was another process at the end of a block than after its restart
/// (`ArmStats::engine_replaced`): part of the arm ran on an engine bisect did not
/// restart for it, cold and at a lower load, so the arm is not the configuration it
/// names. Blocking.
fn replaced_confound(on: &ArmObservation, off: &ArmObservation) -> Option<Confound> {
    let (r_on, r_off) = (&on.stats.engine_replaced, &off.stats.engine_replaced);
    if r_on.is_empty() && r_off.is_empty() {
        return None;
    }
    let lines: Vec<String> = [(on, r_on), (off, r_off)]
        .into_iter()
        .flat_map(|(arm, lines)| {
            lines
                .iter()
                .map(move |l| format!("arm {}: {l}", arm.name()))
        })
        .collect();
    Some(Confound {
        name: "engine_replaced".to_string(),
        on: json!(r_on),
        off: json!(r_off),
        severity: Severity::Blocking,
        note: format!(
            "an engine changed during an arm: {}\n  fix: find why it restarted (its logs, \
             `journalctl -u`, `kubectl describe pod`) and run again",
            lines.join("; ")
        ),
    })
}

/// One confound per role some checked arm or block read back, where `check` finds one,
/// in role order.
pub(super) fn per_readback_role<'a>(
    checked: &'a [ArmObservation],
    check: impl FnMut(&'a String) -> Option<Confound>,
) -> Vec<Confound> {
    let roles: BTreeSet<&String> = checked.iter().flat_map(|c| c.readback.keys()).collect();
    roles.into_iter().filter_map(check).collect()
}

/// A role whose launch config does not read back the value its arm set, in any arm or
/// block checked: it did not run the configuration it is labelled with (or prefill and
/// decode disagreed). `on` and `off` show the pooled arms' read-backs, which keep a
/// block's differing one.
fn readback_confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    checked: &[ArmObservation],
) -> Vec<Confound> {
    per_readback_role(checked, |role| {
        let mismatched: Vec<String> = checked
            .iter()
            .map(|c| (c, c.readback.get(role)))
            .filter(|(c, read)| read.map(String::as_str) != Some(c.value))
            .map(|(c, read)| {
                format!(
                    "{} set {} but {} read back {}",
                    c.subject(),
                    c.value,
                    role,
                    read.map_or_else(|| "nothing".to_string(), |v| format!("{v:?}"))
                )
            })
            .collect();
        if mismatched.is_empty() {
            return None;
        }
        let read = |arm: &ArmObservation| arm.readback.get(role).map_or(Value::Null, |v| json!(v));
        Some(Confound {
            name: format!("readback.{role}"),
            on: read(on),
            off: read(off),
            severity: Severity::Blocking,
            note: format!(
                "readback mismatch in role {role}: {}",
                mismatched.join("; ")
            ),
        })
    })
}

/// A role whose running engine reports a value other than its arm's, in any arm or
/// block checked (docs/design.md 3.7): the launch file said one thing and the engine ran
/// another (a dead conditional, an ignored variable, an engine that was not restarted).
/// Roles whose engine reports nothing are [`unverified_confounds`].
fn effective_confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    checked: &[ArmObservation],
) -> Vec<Confound> {
    let found: Vec<(&ArmObservation, effective::Disagreement)> = checked
        .iter()
        .flat_map(|c| {
            effective::disagreements(c.value, c.effective)
                .into_iter()
                .map(move |d| (c, d))
        })
        .collect();
    let roles: BTreeSet<&str> = found.iter().map(|(_, d)| d.role.as_str()).collect();
    roles
        .into_iter()
        .map(|role| {
            let mismatched: Vec<String> = found
                .iter()
                .filter(|(_, d)| d.role == role)
                .map(|(c, d)| {
                    format!(
                        "{} set {} but the {role} engine reports it runs with {:?}",
                        c.subject(),
                        d.expected,
                        d.reported
                    )
                })
                .collect();
            let ran =
                |arm: &ArmObservation| arm.effective.get(role).map_or(Value::Null, |v| json!(v));
            Confound {
                name: format!("effective.{role}"),
                on: ran(on),
                off: ran(off),
                severity: Severity::Blocking,
                note: format!(
                    "effective configuration differs from the launch config in role {role}: {}",
                    mismatched.join("; ")
                ),
            }
        })
        .collect()
}

/// Error and timeout sessions: a toggle that makes the engine fail or crawl says nothing
/// about corruption. Blocking when an arm fails more than `degraded_fraction`; below
/// that, warned when the arms' rates differ ([`differing_rates`]): failed sessions are
/// left out of the corruption rates, so the arm that fails more can look cleaner, and a
/// flag whose corruption surfaces as failures (an HTTP 500 from a tool-call parser
/// the target names no rejection pattern for: one it names is `rejected`, corruption)
/// would otherwise hide behind `cleared`.
/// `checked`: the blocks (or the two arms), each held to the degraded limit on its own,
/// since a block whose engine failed a fifth of its sessions is hidden when pooled with
/// a clean one (7.5% of the arm).
fn degraded_confound(
    on: &ArmObservation,
    off: &ArmObservation,
    checked: &[ArmObservation],
    policy: &Policy,
) -> Option<Confound> {
    if on.stats.counts.failed() == 0 && off.stats.counts.failed() == 0 {
        return None;
    }
    let failure_fraction = |arm: &ArmObservation| {
        if arm.classified() == 0 {
            0.0
        } else {
            arm.stats.counts.failed() as f64 / arm.classified() as f64
        }
    };
    let degraded: Vec<String> = checked
        .iter()
        .filter(|arm| failure_fraction(arm) > policy.degraded_fraction)
        .map(|arm| {
            let who = match arm.block {
                Some(_) => format!("{} (={})", arm.subject(), arm.value),
                None => format!("arm {}", arm.name()),
            };
            format!(
                "{who} had {} error and {} timeout sessions of {} ({}% > {}%)",
                arm.stats.counts[SessionClass::Error],
                arm.stats.counts[SessionClass::Timeout],
                arm.classified(),
                percent_digits(failure_fraction(arm)),
                percent_digits(policy.degraded_fraction)
            )
        })
        .collect();
    let describe = |arm: &ArmObservation| {
        json!({
            "error": arm.stats.counts[SessionClass::Error],
            "timeout": arm.stats.counts[SessionClass::Timeout],
            "sessions": arm.classified(),
        })
    };
    let (rates, differ) = differing_rates(
        (on.stats.counts.failed(), on.classified()),
        (off.stats.counts.failed(), off.classified()),
        policy,
    );
    let (severity, note) = if degraded.is_empty() && differ {
        (
            Severity::Warning,
            format!(
                "error+timeout sessions differ between arms ({rates}): failed sessions \
                 cannot show corruption, so the arm that fails more can look cleaner, and \
                 the failures may be the flag's corruption itself; read their errors in \
                 sessions.jsonl"
            ),
        )
    } else if degraded.is_empty() {
        (
            Severity::Info,
            format!(
                "error+timeout within {}% in both arms ({rates})",
                percent_digits(policy.degraded_fraction)
            ),
        )
    } else if degraded.len() == 2 {
        // Both arms failing is the engine, the machine or the workload (a timeout too
        // short for this hardware), not a flag that changed the speed.
        (
            Severity::Blocking,
            format!(
                "degraded: both arms failed too often, so the engine, the machine or the \
                 workload (e.g. timeout_s too short for this hardware) is at fault, not the \
                 flag: {}",
                degraded.join("; ")
            ),
        )
    } else {
        (
            Severity::Blocking,
            format!("degraded: not a same-speed toggle: {}", degraded.join("; ")),
        )
    };
    Some(Confound {
        name: "error_timeout".to_string(),
        on: describe(on),
        off: describe(off),
        severity,
        note,
    })
}

/// Workload parameters (rounds, ctx, sessions, ...) that differ: a different experiment,
/// not a different flag value.
fn workload_confounds(on: &ArmObservation, off: &ArmObservation) -> Vec<Confound> {
    let differing = |name: String, a: &Value, b: &Value| Confound {
        note: format!(
            "workload parameter {name} differs between arms (on {a}, off {b}): \
             not the same experiment"
        ),
        name: format!("workload.{name}"),
        on: a.clone(),
        off: b.clone(),
        severity: Severity::Blocking,
    };
    match (on.workload, off.workload) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .filter_map(|key| {
                    let (va, vb) = (
                        a.get(key).unwrap_or(&Value::Null),
                        b.get(key).unwrap_or(&Value::Null),
                    );
                    (va != vb).then(|| differing(key.clone(), va, vb))
                })
                .collect()
        }
        (a, b) if a != b => vec![Confound {
            name: "workload".to_string(),
            on: a.clone(),
            off: b.clone(),
            severity: Severity::Blocking,
            note: "workload parameters differ between arms: not the same experiment".to_string(),
        }],
        _ => Vec::new(),
    }
}
