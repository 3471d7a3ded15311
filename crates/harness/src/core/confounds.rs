//! The confounds of a two-arm run (docs/design.md 3.7): every reason the comparison of
//! `on` and `off` might not measure the flag. Blocking ones void the comparison
//! (read-back or effective value not the arm's, a degraded arm, differing workloads);
//! recorded ones qualify it (load, wall time, throughput, replies truncated at
//! `max_tokens`, error+timeout rates that differ, roles whose load was never measured,
//! roles whose engine does not report the flag's value); [`load_shortfalls`] says when
//! the engine never ran the target concurrency, which only `cleared` needs.
//!
//! The checks that hold per engine start (read-back, effective value, load) are made on
//! every block of an arm that pooled several ([`checked`]): pooling keeps a block's
//! differing value and the highest peak, so only the block itself can say it failed.
//!
//! Pure: split from [`crate::core::verdict`], which decides from what is found here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::core::effective;
use crate::core::format::{p_value, percent_digits, quantity};
use crate::core::stats;
use crate::core::verdict::{ArmObservation, Confound, Policy, Severity};

/// Every confound, blocking ones first, in a fixed order. `blocks`: as
/// [`crate::core::verdict::decide`] takes them.
pub(crate) fn confounds(
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
    found
}

/// What the transport did to the load (docs/design.md 3.4, "Reaching the load"): a
/// warning where connects came back slow, refused or reset, or the server shed
/// requests (the load shape was not the one asked); information where the engine ran
/// clearly fewer requests than the client had in flight, saying where the rest were.
fn transport_confounds(on: &ArmObservation, off: &ArmObservation) -> Vec<Confound> {
    let mut found = Vec::new();
    let problems = |arm: &ArmObservation| {
        arm.stats
            .transport
            .as_ref()
            .map(|t| t.problems())
            .unwrap_or_default()
    };
    let (on_problems, off_problems) = (problems(on), problems(off));
    if !on_problems.is_empty() || !off_problems.is_empty() {
        let note = [(on, &on_problems), (off, &off_problems)]
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(arm, p)| format!("{}: {}", arm.subject(), p.join("; ")))
            .collect::<Vec<_>>()
            .join("; ");
        let value = |p: &Vec<String>| if p.is_empty() { Value::Null } else { json!(p) };
        found.push(Confound {
            name: "transport".to_string(),
            on: value(&on_problems),
            off: value(&off_problems),
            severity: Severity::Warning,
            note,
        });
    }
    let gap = |arm: &ArmObservation| arm.stats.load_gap.as_ref().map(|g| g.describe());
    if on.stats.load_gap.is_some() || off.stats.load_gap.is_some() {
        let note = [on, off]
            .iter()
            .filter_map(|arm| Some(format!("{}: {}", arm.subject(), gap(arm)?)))
            .collect::<Vec<_>>()
            .join("; ");
        found.push(Confound {
            name: "load_gap".to_string(),
            on: gap(on).map_or(Value::Null, |g| json!(g)),
            off: gap(off).map_or(Value::Null, |g| json!(g)),
            severity: Severity::Info,
            note,
        });
    }
    found
}

/// What the per-engine-start checks look at: each block where the arms pooled blocks,
/// else the two arms.
fn checked<'a>(
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

/// Significance below which truncation or error+timeout rates are said to differ: a
/// screening level, not the verdict's alpha, because this only warns.
const SCREENING_ALPHA: f64 = 0.05;

/// `on 9/100 (9.0%), off 0/100 (0.0%), Fisher p = 0.0032` for `k` of `n` sessions per
/// arm, and whether the rates differ: by at least `min_effect`, and Fisher's exact test
/// says the difference is real (p < [`SCREENING_ALPHA`]).
fn differing_rates(
    (k_on, n_on): (u64, u64),
    (k_off, n_off): (u64, u64),
    policy: &Policy,
) -> (String, bool) {
    let (r_on, r_off) = (stats::rate(k_on, n_on), stats::rate(k_off, n_off));
    let p = stats::fisher_exact_two_sided(k_on, n_on - k_on, k_off, n_off - k_off);
    let text = format!(
        "on {k_on}/{n_on} ({}%), off {k_off}/{n_off} ({}%), Fisher p = {}",
        percent_digits(r_on),
        percent_digits(r_off),
        p_value(p)
    );
    (
        text,
        (r_on - r_off).abs() >= policy.min_effect && p < SCREENING_ALPHA,
    )
}

/// Replies cut off at `max_tokens`: not corruption, but a truncated session cannot show
/// corruption either, so an arm that truncates more can look cleaner for that alone
/// (a flag that makes the model wordier). Warned when the rates differ
/// ([`differing_rates`]).
fn truncated_confound(
    on: &ArmObservation,
    off: &ArmObservation,
    policy: &Policy,
) -> Option<Confound> {
    let (t_on, t_off) = (on.stats.counts.truncated, off.stats.counts.truncated);
    if t_on == 0 && t_off == 0 {
        return None;
    }
    let (rates, differ) =
        differing_rates((t_on, on.classified()), (t_off, off.classified()), policy);
    let (severity, note) = if differ {
        (
            Severity::Warning,
            format!(
                "replies truncated at max_tokens differ between arms ({rates}): truncated \
                 sessions cannot show corruption, so the arm that truncates more can look \
                 cleaner; raise --max-tokens"
            ),
        )
    } else {
        (
            Severity::Info,
            format!("replies truncated at max_tokens, not counted as corruption: {rates}"),
        )
    };
    Some(Confound {
        name: "truncated".to_string(),
        on: json!(t_on),
        off: json!(t_off),
        severity,
        note,
    })
}

/// A role none of whose metrics scrapes worked in an arm: its load is unmeasured, and
/// the peak-running comparison silently lacks it unless this says so.
fn metrics_confounds(on: &ArmObservation, off: &ArmObservation) -> Vec<Confound> {
    let roles: BTreeSet<&String> = on
        .stats
        .metrics_failed
        .keys()
        .chain(off.stats.metrics_failed.keys())
        .collect();
    roles
        .into_iter()
        .map(|role| {
            let why = |arm: &ArmObservation| {
                arm.stats
                    .metrics_failed
                    .get(role)
                    .map_or(Value::Null, |w| json!(w))
            };
            let reason = on
                .stats
                .metrics_failed
                .get(role)
                .or_else(|| off.stats.metrics_failed.get(role))
                .cloned()
                .unwrap_or_default();
            Confound {
                name: format!("metrics.{role}"),
                on: why(on),
                off: why(off),
                severity: Severity::Warning,
                note: format!("no load measured for role {role}: {reason}"),
            }
        })
        .collect()
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
    let roles: BTreeSet<&String> = checked.iter().flat_map(|c| c.readback.keys()).collect();
    roles
        .into_iter()
        .filter_map(|role| {
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
            let read =
                |arm: &ArmObservation| arm.readback.get(role).map_or(Value::Null, |v| json!(v));
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
        .collect()
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

/// A role of the flag (one that read back a value) whose engine did not report the
/// flag's value, in some arm or block checked: only the launch-file read-back says that
/// role ran the arm's value, and an engine that ignores the setting would run both arms
/// alike (a `cleared` that cleared nothing). A warning, not blocking: nothing in the run
/// can fix an engine that does not report, but the verdict must say it rests on the
/// read-back alone (docs/design.md 3.7, "unverified").
fn unverified_confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    checked: &[ArmObservation],
) -> Vec<Confound> {
    let roles: BTreeSet<&String> = checked.iter().flat_map(|c| c.readback.keys()).collect();
    roles
        .into_iter()
        .filter_map(|role| {
            let silent: Vec<&ArmObservation> = checked
                .iter()
                .filter(|c| !c.effective.contains_key(role))
                .collect();
            if silent.is_empty() {
                return None;
            }
            let reported =
                |arm: &ArmObservation| arm.effective.get(role).map_or(Value::Null, |v| json!(v));
            let when = if silent.len() == checked.len() {
                String::new()
            } else {
                let who: Vec<String> = silent.iter().map(|c| c.subject()).collect();
                format!(" in {}", who.join(", "))
            };
            Some(Confound {
                name: format!("unverified.{role}"),
                on: reported(on),
                off: reported(off),
                severity: Severity::Warning,
                note: format!(
                    "the {role} engine did not report the flag's value{when}: only the \
                     launch-file read-back says it ran each arm's value, and an engine that \
                     ignores the setting would run both arms alike (the target profile's \
                     effective_url and effective_pointers say where an engine reports it)"
                ),
            })
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
                arm.stats.counts.error,
                arm.stats.counts.timeout,
                arm.classified(),
                percent_digits(failure_fraction(arm)),
                percent_digits(policy.degraded_fraction)
            )
        })
        .collect();
    let describe = |arm: &ArmObservation| {
        json!({
            "error": arm.stats.counts.error,
            "timeout": arm.stats.counts.timeout,
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

/// Achieved load and speed: recorded always, warned when they differ by more than
/// `warn_ratio` (the faster arm finishes sooner, reaches lower concurrency and can look
/// cleaner for that reason alone).
fn recorded_confounds(on: &ArmObservation, off: &ArmObservation, policy: &Policy) -> Vec<Confound> {
    let keys: BTreeSet<&String> = on
        .stats
        .peak_running
        .keys()
        .chain(off.stats.peak_running.keys())
        .collect();
    let mut recorded: Vec<Confound> = keys
        .into_iter()
        .map(|key| {
            let what = if key == "client" {
                "peak client in-flight requests".to_string()
            } else {
                format!("peak running requests reported by {key}")
            };
            let value = |arm: &ArmObservation| arm.stats.peak_running.get(key).map(|&v| v as f64);
            // A peak of 0 vs 2 polled requests is sampling noise, not a load confound.
            let mut confound = measured(
                format!("peak_running.{key}"),
                &what,
                value(on),
                value(off),
                policy,
                MIN_PEAK_DIFFERENCE,
            );
            // Peaks are request counts: integers in run.json, as in `peak_running`.
            let count = |arm: &ArmObservation| {
                arm.stats
                    .peak_running
                    .get(key)
                    .map_or(Value::Null, |&v| json!(v))
            };
            confound.on = count(on);
            confound.off = count(off);
            confound
        })
        .collect();
    recorded.push(measured(
        "wall_s".to_string(),
        "wall time",
        Some(on.stats.wall_s),
        Some(off.stats.wall_s),
        policy,
        0.0,
    ));
    recorded.push(measured(
        "tokens_per_s".to_string(),
        "throughput (tokens/s)",
        Some(on.stats.tokens_per_s),
        Some(off.stats.tokens_per_s),
        policy,
        0.0,
    ));
    recorded
}

/// Peak running requests must differ by at least this many to be warned about.
pub const MIN_PEAK_DIFFERENCE: f64 = 8.0;

fn measured(
    name: String,
    what: &str,
    on: Option<f64>,
    off: Option<f64>,
    policy: &Policy,
    min_abs_difference: f64,
) -> Confound {
    let to_json = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or(Value::Null, |v| json!(v))
    };
    let (severity, note) = match (on.filter(|v| v.is_finite()), off.filter(|v| v.is_finite())) {
        (Some(a), Some(b)) => {
            let difference = relative_difference(a, b);
            if difference > policy.warn_ratio && (a - b).abs() >= min_abs_difference {
                (
                    Severity::Warning,
                    format!(
                        "{what} differs by {}% (on {}, off {}), more than {}%: \
                         the arms ran at different load or speed",
                        percent_digits(difference),
                        quantity(a),
                        quantity(b),
                        percent_digits(policy.warn_ratio)
                    ),
                )
            } else {
                (
                    Severity::Info,
                    format!(
                        "{what} within {}% (on {}, off {})",
                        percent_digits(policy.warn_ratio),
                        quantity(a),
                        quantity(b)
                    ),
                )
            }
        }
        _ => (Severity::Info, format!("{what} not measured in both arms")),
    };
    Confound {
        name,
        on: to_json(on),
        off: to_json(off),
        severity,
        note,
    }
}

/// The concurrency an arm was meant to run at: the workload's `concurrency`, else its
/// `sessions` (all at once); `None` when the workload says neither.
fn target_concurrency(arm: &ArmObservation) -> Option<u64> {
    arm.workload
        .get("concurrency")
        .and_then(Value::as_u64)
        .or_else(|| arm.workload.get("sessions").and_then(Value::as_u64))
}

/// Why the achieved load does not support `cleared`, for every arm or block checked
/// ([`checked`]: a pooled arm's peak is its best block's) that falls short: the engine
/// side (the busiest role's peak running requests) below `min_load_fraction` of the
/// target, or no engine role reporting its load at all.
pub(crate) fn load_shortfalls(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
) -> Vec<String> {
    checked(on, off, blocks)
        .iter()
        .filter_map(|c| load_shortfall(c, policy))
        .collect()
}

/// Why one arm's (or block's) achieved load does not support `cleared`, if it does not.
pub(crate) fn load_shortfall(arm: &ArmObservation, policy: &Policy) -> Option<String> {
    let target = target_concurrency(arm)?;
    let why = engine_load_shortfall(&arm.stats.peak_running, target, policy.min_load_fraction)?;
    let mut text = format!("{} {why}", arm.subject());
    // Where the load went, so the user knows whether to look at the client, the
    // server's front door or the engine's queue.
    if let Some(gap) = &arm.stats.load_gap {
        text.push_str(&format!("; where the gap is: {}", gap.describe()));
    }
    if let Some(transport) = &arm.stats.transport {
        for problem in transport.problems() {
            text.push_str(&format!("; {problem}"));
        }
    }
    Some(text)
}

/// The load rule itself, worded to follow its subject ("arm on ...", "this night's
/// cell ..."): the busiest engine role's peak running requests (`peak_running` by role;
/// the client's is not the engine's) below `min_load_fraction` of `target` in flight,
/// or no engine role reporting its load at all.
pub(crate) fn engine_load_shortfall(
    peak_running: &BTreeMap<String, u64>,
    target: u64,
    min_load_fraction: f64,
) -> Option<String> {
    let engine_peak = peak_running
        .iter()
        .filter(|(role, _)| role.as_str() != "client")
        .map(|(role, peak)| (*peak, role))
        .max();
    let needed = (min_load_fraction * target as f64).ceil() as u64;
    match engine_peak {
        None => Some(format!(
            "has no engine-side load measurement (no role's metrics reported running \
             requests), so the target concurrency {target} is unconfirmed"
        )),
        Some((peak, role)) if peak < needed => Some(format!(
            "reached at most {peak} running requests ({role}), below {needed} \
             ({}% of the target concurrency {target})",
            (min_load_fraction * 100.0).round()
        )),
        Some(_) => None,
    }
}

/// |a - b| relative to the larger magnitude; 0 when both are 0.
fn relative_difference(a: f64, b: f64) -> f64 {
    let larger = a.abs().max(b.abs());
    if larger == 0.0 {
        0.0
    } else {
        (a - b).abs() / larger
    }
}
