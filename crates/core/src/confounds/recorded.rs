//! The recorded confounds (docs/design.md 3.7): the ones that qualify a comparison
//! without voiding it: load, wall time and throughput that differ, truncated replies,
//! differing error and timeout rates, roles whose load or flag value was never measured,
//! and what the transport did to the load.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::engine_counts::EngineCounter;
use crate::evidence::{ArmObservation, Confound, Policy, Severity};
use crate::format::{p_value, percent_digits, quantity};
use crate::session::SessionClass;
use crate::stats;

/// What the transport did to the load (docs/design.md 3.4, "Reaching the load"): a
/// warning where connects came back slow, refused or reset, or the server shed
/// requests (the load shape was not the one asked); information where the engine ran
/// clearly fewer requests than the client had in flight, saying where the rest were.
pub(super) fn transport_confounds(on: &ArmObservation, off: &ArmObservation) -> Vec<Confound> {
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

/// What the engines counted themselves (core::engine_counts): recorded beside bisect's
/// own classes, never deciding. Preemptions say the arm ran the engine's recompute path
/// (a KV-cache shortage); a parser that found no call in more replies than bisect
/// classed `no_tool` sessions is a reply lost or changed between the two.
pub(super) fn engine_count_confound(on: &ArmObservation, off: &ArmObservation) -> Option<Confound> {
    use crate::engine_counts::describe;
    let said = |arm: &ArmObservation| {
        describe(&arm.stats.engine_counts).map(|words| {
            format!(
                "{words} (bisect: {} sessions no_tool)",
                arm.stats.counts[SessionClass::NoTool]
            )
        })
    };
    let (on_said, off_said) = (said(on), said(off));
    if on_said.is_none() && off_said.is_none() {
        return None;
    }
    let note = [(on, &on_said), (off, &off_said)]
        .iter()
        .filter_map(|(arm, said)| Some(format!("{}: {}", arm.subject(), said.as_ref()?)))
        .collect::<Vec<_>>()
        .join("; ");
    let value = |arm: &ArmObservation| json!(arm.stats.engine_counts);
    Some(Confound {
        name: "engine_counts".to_string(),
        on: value(on),
        off: value(off),
        severity: Severity::Info,
        note: format!("the engine counted: {note}"),
    })
}

/// Significance below which truncation or error+timeout rates are said to differ: a
/// screening level, not the verdict's alpha, because this only warns.
const SCREENING_ALPHA: f64 = 0.05;

/// `on 9/100 (9.0%), off 0/100 (0.0%), Fisher p = 0.0032` for `k` of `n` sessions per
/// arm, and whether the rates differ: by at least `min_effect`, and Fisher's exact test
/// says the difference is real (p < [`SCREENING_ALPHA`]).
pub(super) fn differing_rates(
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
pub(super) fn truncated_confound(
    on: &ArmObservation,
    off: &ArmObservation,
    policy: &Policy,
) -> Option<Confound> {
    let (t_on, t_off) = (
        on.stats.counts[SessionClass::Truncated],
        off.stats.counts[SessionClass::Truncated],
    );
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
pub(super) fn metrics_confounds(on: &ArmObservation, off: &ArmObservation) -> Vec<Confound> {
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

/// A role of the flag (one that read back a value) whose engine did not report the
/// flag's value, in some arm or block checked: only the launch-file read-back says that
/// role ran the arm's value, and an engine that ignores the setting would run both arms
/// alike (a `cleared` that cleared nothing). A warning, not blocking: nothing in the run
/// can fix an engine that does not report, but the verdict must say it rests on the
/// read-back alone (docs/design.md 3.7, "unverified").
pub(super) fn unverified_confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    checked: &[ArmObservation],
) -> Vec<Confound> {
    super::per_readback_role(checked, |role| {
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
}

/// Achieved load and speed: recorded always, warned when they differ by more than
/// `warn_ratio` (the faster arm finishes sooner, reaches lower concurrency and can look
/// cleaner for that reason alone). An engine role's peak is a sampled gauge: compared
/// only where it can show the role's load ([`brief_role`]).
pub(super) fn recorded_confounds(
    on: &ArmObservation,
    off: &ArmObservation,
    policy: &Policy,
) -> Vec<Confound> {
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
            let brief = (key != "client")
                .then(|| brief_role(key, on, off))
                .flatten();
            // A peak of 0 vs 2 polled requests is sampling noise, not a load confound.
            let mut confound = brief.unwrap_or_else(|| {
                measured(
                    format!("peak_running.{key}"),
                    &what,
                    value(on),
                    value(off),
                    policy,
                    MIN_PEAK_DIFFERENCE,
                )
            });
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
pub(crate) const MIN_PEAK_DIFFERENCE: f64 = 8.0;

/// The share of an arm an engine role's running gauge must have read above zero (by
/// the engine's own count, [`EngineCounter::BusyMs`]), in at least one arm, for the
/// role's sampled peak to be compared: half. The poller samples the gauge once a
/// metrics period (250 ms) and a role's peak is its largest sample; the share is the
/// chance that a sample sees the role busy at all. A role that holds requests (decode:
/// a session's request spends nearly all its life there) reads above zero nearly all the
/// arm, and nearly every sample sees its load; a role requests pass through (prefill:
/// one forward of milliseconds per round) is above zero in bursts shorter than the
/// period, a few of which a sample lands in, and its sampled peak is the size of the
/// burst it landed in, which differs between arms by chance. Measured on the README's
/// main job (2026-12-05, 2 cores, 6 runs): decode above zero 98-99% of every arm,
/// prefill 4-12%; before this rule prefill's gauge was seen busy in 0 to 2 of 9 to 15
/// samples an arm, its sampled peaks 0 vs 23, 26 vs 9, 29 vs 2 between arms whose client
/// and decode peaks were all 80 (2 runs of 6 warned). At half, most samples see the role
/// busy, so its peak is a level it held rather than one a sample caught; and the outcome
/// does not hang on the exact number: prefill sits 4x below it, decode 2x above.
const MIN_BUSY_SHARE: f64 = 0.5;

/// The share of the arm's wall time its engine counted `role`'s running gauge above
/// zero ([`EngineCounter::BusyMs`]), at most 1; None where the role does not count it (then
/// its peak is compared as any other).
fn busy_share(arm: &ArmObservation, role: &str) -> Option<Busy> {
    let counted = arm
        .stats
        .engine_counts
        .iter()
        .find(|c| c.role == role && c.counter == EngineCounter::BusyMs);
    if let Some(counted) = counted {
        return (arm.stats.wall_s > 0.0).then(|| Busy {
            share: (counted.count as f64 / 1000.0 / arm.stats.wall_s).min(1.0),
            sampled: None,
        });
    }
    // An engine that counts no busy time: the share of the poller's samples that found
    // the role busy, where there are enough of them to say so.
    let [busy, samples] = *arm.stats.busy_samples.get(role)?;
    (samples >= MIN_BUSY_SAMPLES).then(|| Busy {
        share: busy as f64 / samples as f64,
        sampled: Some([busy, samples]),
    })
}

/// Samples an arm needs before the share of them that found a role busy stands in for
/// a busy time the engine does not count: fewer, and one sample decides.
const MIN_BUSY_SAMPLES: u64 = 8;

/// How much of an arm a role was busy, and, when the poller's samples say it rather than
/// the engine's own count, how many of them found it busy.
#[derive(Debug, Clone, Copy)]
struct Busy {
    share: f64,
    sampled: Option<[u64; 2]>,
}

impl Busy {
    fn words(self) -> String {
        match self.sampled {
            None => format!("{}%", percent_digits(self.share)),
            Some([busy, samples]) => format!("{busy} of {samples} samples"),
        }
    }
}

/// The peak of an engine role busy under [`MIN_BUSY_SHARE`] of both arms: recorded, with
/// why it is not compared, as information; None where it is compared (the role was busy
/// for long enough in either arm, it does not count its busy time, or its peak is
/// missing in an arm). A role busy long enough in one arm only is compared: the arms
/// then differ in where requests spent their time, itself a load difference. The
/// client's peak never comes here: it is counted, not sampled.
fn brief_role(role: &str, on: &ArmObservation, off: &ArmObservation) -> Option<Confound> {
    let (busy_on, busy_off) = (busy_share(on, role)?, busy_share(off, role)?);
    let (share_on, share_off) = (busy_on.share, busy_off.share);
    let (peak_on, peak_off) = (
        *on.stats.peak_running.get(role)?,
        *off.stats.peak_running.get(role)?,
    );
    if share_on >= MIN_BUSY_SHARE || share_off >= MIN_BUSY_SHARE {
        return None;
    }
    Some(Confound {
        name: format!("peak_running.{role}"),
        on: json!(peak_on),
        off: json!(peak_off),
        severity: Severity::Info,
        note: format!(
            "peak running requests reported by {role} not compared (on {peak_on}, off \
             {peak_off}): {role} was busy {} of the on arm and {} of the off arm by {}, \
             under the {}% a sampled peak needs; its requests pass through in \
             bursts shorter than the metrics period, so its sampled peak is the burst a \
             sample happened to land in, not its load",
            busy_on.words(),
            busy_off.words(),
            if busy_on.sampled.is_some() || busy_off.sampled.is_some() {
                "the poller's samples"
            } else {
                "its own count"
            },
            percent_digits(MIN_BUSY_SHARE)
        ),
    })
}

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
            } else if difference > policy.warn_ratio {
                // Not warned, but not "within" either: say what was seen and why it
                // stays an info (seen on a real vLLM: peaks 2 vs 4, reported "within").
                (
                    Severity::Info,
                    format!(
                        "{what} differs by {}% (on {}, off {}) but by fewer than {}: not \
                         warned, a peak being one polled sample",
                        percent_digits(difference),
                        quantity(a),
                        quantity(b),
                        quantity(min_abs_difference)
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

/// |a - b| relative to the larger magnitude; 0 when both are 0.
fn relative_difference(a: f64, b: f64) -> f64 {
    let larger = a.abs().max(b.abs());
    if larger == 0.0 {
        0.0
    } else {
        (a - b).abs() / larger
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arm_stats::{ArmLabel, ArmStats};
    use crate::engine_counts::EngineCount;
    use crate::session::Counts;
    use crate::verdict::{decide, Status};
    use std::collections::BTreeMap;

    /// One arm's record: `corrupted` leaks of 80 sessions over 4 s, these peaks, and each
    /// engine role busy for this share of the arm by its own count (`None`: it counts
    /// no busy time, as engines other than the embedded one).
    struct Arm {
        label: ArmLabel,
        stats: ArmStats,
        values: BTreeMap<String, String>,
        workload: Value,
    }

    impl Arm {
        fn new(
            label: ArmLabel,
            corrupted: u64,
            peaks: &[(&str, u64)],
            busy: &[(&str, Option<f64>)],
        ) -> Arm {
            let wall_s = 4.0;
            let mut stats = ArmStats {
                counts: Counts::from([
                    (SessionClass::Done, 80 - corrupted),
                    (SessionClass::Leak, corrupted),
                ]),
                peak_running: peaks.iter().map(|&(r, p)| (r.to_string(), p)).collect(),
                wall_s,
                completion_tokens: 20_000,
                engine_counts: busy
                    .iter()
                    .filter_map(|&(role, share)| {
                        Some(EngineCount {
                            role: role.to_string(),
                            counter: EngineCounter::BusyMs,
                            count: (share? * wall_s * 1000.0).round() as u64,
                        })
                    })
                    .collect(),
                ..ArmStats::default()
            };
            stats.finish();
            let value = if label == ArmLabel::On { "1" } else { "0" };
            Arm {
                label,
                stats,
                values: [("prefill", value), ("decode", value)]
                    .into_iter()
                    .map(|(r, v)| (r.to_string(), v.to_string()))
                    .collect(),
                workload: json!({"name": "agentic", "sessions": 80, "rounds": 4, "ctx": 300}),
            }
        }

        fn obs(&self) -> ArmObservation<'_> {
            ArmObservation {
                label: self.label,
                value: if self.label == ArmLabel::On { "1" } else { "0" },
                block: None,
                replica: None,
                stats: &self.stats,
                readback: &self.values,
                effective: &self.values,
                workload: &self.workload,
            }
        }
    }

    fn decided(on: &Arm, off: &Arm) -> (Vec<Confound>, crate::verdict::Verdict) {
        let (_, confounds, verdict) = decide(
            &on.obs(),
            &off.obs(),
            &[],
            &Policy::default(),
            "BF16_INDEX_K",
        );
        (confounds, verdict)
    }

    fn named<'a>(confounds: &'a [Confound], name: &str) -> &'a Confound {
        confounds.iter().find(|c| c.name == name).unwrap()
    }

    /// The README's main job as measured before this rule (2026-12-05): client and decode
    /// at 80 in both arms, decode busy 99% of each, prefill busy 4-12% and its sampled
    /// peak 0 in one arm and 23 in the other, which was warned as a load difference.
    #[test]
    fn a_roles_peak_caught_in_passing_is_recorded_not_warned() {
        let busy = [("decode", Some(0.99)), ("prefill", Some(0.05))];
        let on = Arm::new(
            ArmLabel::On,
            18,
            &[("client", 80), ("decode", 80), ("prefill", 0)],
            &busy,
        );
        let off = Arm::new(
            ArmLabel::Off,
            0,
            &[("client", 80), ("decode", 80), ("prefill", 23)],
            &[("decode", Some(0.98)), ("prefill", Some(0.04))],
        );
        let (confounds, verdict) = decided(&on, &off);
        assert_eq!(verdict.status, Status::Implicated);
        assert!(!verdict.summary.contains("warnings"), "{}", verdict.summary);
        let prefill = named(&confounds, "peak_running.prefill");
        assert_eq!(prefill.severity, Severity::Info);
        assert_eq!(
            (prefill.on.clone(), prefill.off.clone()),
            (json!(0), json!(23))
        );
        assert_eq!(
            prefill.note,
            "peak running requests reported by prefill not compared (on 0, off 23): prefill \
             was busy 5.0% of the on arm and 4.0% of the off arm by its own count, under the \
             50.0% a sampled peak needs; its requests pass through in bursts shorter than \
             the metrics period, so its sampled peak is the burst a sample happened to land \
             in, not its load"
        );
        assert_eq!(
            named(&confounds, "peak_running.decode").note,
            "peak running requests reported by decode within 25.0% (on 80, off 80)"
        );
    }

    /// A role that holds requests in both arms, or in one of them, is compared, in the
    /// words it always had.
    #[test]
    fn a_busy_roles_real_difference_is_warned() {
        let peaks = |decode, prefill| [("client", 80), ("decode", decode), ("prefill", prefill)];
        let on = Arm::new(
            ArmLabel::On,
            18,
            &peaks(80, 40),
            &[("decode", Some(0.99)), ("prefill", Some(0.6))],
        );
        // Decode busy in both arms, at half the peak in one.
        let off = Arm::new(
            ArmLabel::Off,
            0,
            &peaks(40, 38),
            &[("decode", Some(0.9)), ("prefill", Some(0.7))],
        );
        let (confounds, verdict) = decided(&on, &off);
        let decode = named(&confounds, "peak_running.decode");
        assert_eq!(decode.severity, Severity::Warning);
        assert_eq!(
            decode.note,
            "peak running requests reported by decode differs by 50.0% (on 80, off 40), more \
             than 25.0%: the arms ran at different load or speed"
        );
        assert!(
            verdict.summary.ends_with("(warnings: peak_running.decode)"),
            "{}",
            verdict.summary
        );
        // Prefill busy in one arm only, with peaks far apart: where requests spent their
        // time differs, and the peak is compared (warned).
        let off = Arm::new(
            ArmLabel::Off,
            0,
            &peaks(80, 3),
            &[("decode", Some(0.99)), ("prefill", Some(0.05))],
        );
        let (confounds, verdict) = decided(&on, &off);
        assert_eq!(
            named(&confounds, "peak_running.prefill").severity,
            Severity::Warning
        );
        assert!(
            verdict
                .summary
                .ends_with("(warnings: peak_running.prefill)"),
            "{}",
            verdict.summary
        );
        // A role that does not count its busy time (every engine but the embedded one)
        // is compared as before.
        let busy_unknown = [("decode", None), ("prefill", None)];
        let on = Arm::new(ArmLabel::On, 18, &peaks(80, 0), &busy_unknown);
        let off = Arm::new(ArmLabel::Off, 0, &peaks(80, 23), &busy_unknown);
        let (confounds, _) = decided(&on, &off);
        assert_eq!(
            named(&confounds, "peak_running.prefill").note,
            "peak running requests reported by prefill differs by 100.0% (on 0, off 23), \
             more than 25.0%: the arms ran at different load or speed"
        );
    }

    /// An engine that counts no busy time of its own (SGLang, vLLM, llama.cpp): the
    /// poller's samples say how often the role was busy, and a role they rarely found
    /// busy in either arm is not compared; one they found busy is, as before.
    #[test]
    fn the_pollers_samples_stand_in_for_a_busy_time_the_engine_does_not_count() {
        let peaks = |decode, prefill| [("client", 80), ("decode", decode), ("prefill", prefill)];
        let busy_unknown = [("decode", None), ("prefill", None)];
        let mut on = Arm::new(ArmLabel::On, 18, &peaks(80, 0), &busy_unknown);
        let mut off = Arm::new(ArmLabel::Off, 0, &peaks(80, 23), &busy_unknown);
        for (arm, prefill) in [(&mut on, [0, 14]), (&mut off, [2, 16])] {
            arm.stats.busy_samples = [
                ("decode".to_string(), [14, 14]),
                ("prefill".to_string(), prefill),
            ]
            .into_iter()
            .collect();
        }
        let (confounds, _) = decided(&on, &off);
        let prefill = named(&confounds, "peak_running.prefill");
        assert_eq!(prefill.severity, Severity::Info);
        assert!(
            prefill.note.contains(
                "prefill was busy 0 of 14 samples of the on arm and 2 of 16 samples of the off arm by the poller's samples"
            ),
            "{}",
            prefill.note
        );
        // Found busy in most samples of an arm: its peak is a level, and compared.
        off.stats.busy_samples.insert("prefill".into(), [12, 16]);
        let (confounds, _) = decided(&on, &off);
        assert_eq!(
            named(&confounds, "peak_running.prefill").severity,
            Severity::Warning
        );
        // Too few samples to say: compared as before.
        on.stats.busy_samples.insert("prefill".into(), [0, 3]);
        off.stats.busy_samples.insert("prefill".into(), [0, 3]);
        let (confounds, _) = decided(&on, &off);
        assert_eq!(
            named(&confounds, "peak_running.prefill").severity,
            Severity::Warning
        );
    }

    /// The client's in-flight peak is exact (counted, not sampled): always compared,
    /// whatever the roles' busy time.
    #[test]
    fn the_clients_difference_is_warned() {
        let busy = [("decode", Some(0.99)), ("prefill", Some(0.05))];
        let on = Arm::new(
            ArmLabel::On,
            18,
            &[("client", 80), ("decode", 80), ("prefill", 0)],
            &busy,
        );
        let off = Arm::new(
            ArmLabel::Off,
            0,
            &[("client", 40), ("decode", 80), ("prefill", 23)],
            &busy,
        );
        let (confounds, verdict) = decided(&on, &off);
        let client = named(&confounds, "peak_running.client");
        assert_eq!(client.severity, Severity::Warning);
        assert_eq!(
            client.note,
            "peak client in-flight requests differs by 50.0% (on 80, off 40), more than \
             25.0%: the arms ran at different load or speed"
        );
        assert!(
            verdict.summary.ends_with("(warnings: peak_running.client)"),
            "{}",
            verdict.summary
        );
    }
}
