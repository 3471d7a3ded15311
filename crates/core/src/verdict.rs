//! The verdict of a two-arm run (docs/design.md 3.7): from the pooled observations of the `on`
//! and `off` arms, the comparison (Fisher exact p, Newcombe difference interval), the
//! confounds (blocking ones that void the comparison, recorded ones that qualify it) and
//! the decision implicated / cleared / inconclusive with its reasons and a one-line summary.
//!
//! Field names of the serialised types are the `run.json` contract (docs/design.md 3.6).
//! Pure: no I/O, the statistics come from [`crate::stats`].

use serde::{Deserialize, Serialize};

use crate::confounds::{confounds, load_shortfalls};
use crate::deaths;
use crate::evidence::{ArmObservation, Confound, Policy, Severity, CONFIDENCE};
use crate::format::{self, percent_digits};
use crate::mechanism;
use crate::reason::Reason;
use crate::session::SessionClass;
use crate::stats;
use crate::workload::WorkloadParams;

/// `comparison` in run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Always `fisher_exact_two_sided`.
    pub test: String,
    pub p_value: f64,
    /// Corruption rate of `on` minus that of `off`.
    pub rate_diff: f64,
    /// Newcombe (method 10) 95% interval for `rate_diff`.
    pub diff_ci95: [f64; 2],
    pub min_effect: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Implicated,
    Cleared,
    Inconclusive,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Implicated => "implicated",
            Status::Cleared => "cleared",
            Status::Inconclusive => "inconclusive",
        }
    }
}

/// `verdict` in run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub status: Status,
    /// For `implicated`: which value corrupts, e.g. `on (=1) corrupts: 14/80 vs 0/80`.
    pub direction: Option<String>,
    /// Every reason for the status in words; warnings are listed too.
    pub reasons: Vec<Reason>,
    /// One line for a chat message.
    pub summary: String,
}

/// Decides one flag's A/B run (docs/design.md 3.7) from the pooled arms `on` and `off`.
/// `blocks`: every block of both arms, each on its own, where the arms pooled blocks
/// (repeats, adaptive blocks); the checks that hold per engine start (read-back,
/// effective value, load) are made on each of them, because a pooled arm can hide one
/// bad block behind good ones. Empty: the arms are judged as they are. `flag` only names
/// the flag in the summary.
pub fn decide(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
    flag: &str,
) -> (Comparison, Vec<Confound>, Verdict) {
    let comparison = compare(on, off, policy);
    let confounds = confounds(on, off, blocks, policy);
    let shortfalls = load_shortfalls(on, off, blocks, policy);
    let verdict = judge(
        (on, off),
        policy,
        flag,
        &comparison,
        &confounds,
        &shortfalls,
    );
    let blocked = confounds.iter().any(|c| c.severity == Severity::Blocking);
    let verdict = with_deaths(verdict, (on, off), blocks, policy, flag, blocked);
    let verdict = with_poisoning(verdict, (on, off), flag);
    let verdict = with_mechanism(verdict, (on, off), flag);
    (comparison, confounds, verdict)
}

/// The verdict with the flag's mechanism judged in (core::mechanism, docs/design.md 3.7
/// "No verdict clears a mechanism that never ran"): `cleared` needs the path the flag
/// controls to have run in the arms whose value enables it, else it is `inconclusive`
/// with the counts and the flag's fix first among its reasons; could-not-tell does the
/// same. Every other status keeps its data and says whether the mechanism ran.
pub fn with_mechanism(
    mut verdict: Verdict,
    (on, off): (&ArmObservation, &ArmObservation),
    flag: &str,
) -> Verdict {
    let (on_name, off_name) = (on.label.as_str(), off.label.as_str());
    let Some(coverage) = mechanism::coverage(&[
        (on_name, &on.stats.mechanisms),
        (off_name, &off.stats.mechanisms),
    ]) else {
        return verdict;
    };
    match (verdict.status, coverage.refusal()) {
        (Status::Cleared, Some(refusal)) => {
            verdict.status = Status::Inconclusive;
            verdict.summary = format!("inconclusive: {flag}: {refusal}");
            verdict.reasons.insert(0, Reason::finding(refusal));
        }
        // Inconclusive for its own reasons too: the path that never ran leads, since
        // no number of sessions at this workload would settle it.
        (Status::Inconclusive, Some(refusal)) => {
            let rest = verdict
                .summary
                .strip_prefix("inconclusive: ")
                .unwrap_or(&verdict.summary)
                .to_string();
            verdict.summary = format!("inconclusive: {flag}: {refusal}; {rest}");
            verdict.reasons.insert(0, Reason::finding(refusal));
        }
        // The data implicate the flag whatever its witnesses counted; the record says
        // what they counted (a path that ran only in the corrupting arm is the usual
        // story: a bigger page that overflows a pool).
        (Status::Implicated, Some(_)) => verdict
            .reasons
            .push(Reason::finding(format!("witnessed: {}", coverage.counts()))),
        // An implicated flag needs no witness: its data stand.
        (Status::Implicated, None) if matches!(coverage, mechanism::Coverage::Unwatched(_)) => {}
        (_, None) => match coverage {
            mechanism::Coverage::Unwatched(_) => {
                verdict.reasons.push(Reason::warning(&coverage.words()))
            }
            _ => verdict.reasons.push(Reason::finding(coverage.words())),
        },
    }
    verdict
}

/// The verdict with poisoned engines said (core::poison): an arm whose engine, after
/// its first failure, corrupted a session alone that it had served clean before, has a
/// rate that is a poisoned engine's, not one of load. `implicated` of that arm stands
/// (the flag's arm made the engine fail, the other never did) but says it in those
/// words first; any other status becomes `inconclusive`, never `cleared`: an arm whose
/// engine was poisoned compares nothing at one rate.
fn with_poisoning(
    mut verdict: Verdict,
    (on, off): (&ArmObservation, &ArmObservation),
    flag: &str,
) -> Verdict {
    let poisoned = |arm: &ArmObservation| -> Option<String> {
        let canaries: Vec<_> = arm.stats.canaries.iter().filter(|c| c.poisoned()).collect();
        let first = canaries.first()?;
        let of = arm.stats.canaries.len();
        Some(format!(
            "{}: poisoned after the first failure in {} of {of} engine li{} that failed: {}",
            arm.name(),
            canaries.len(),
            if of == 1 { "fe" } else { "ves" },
            first.describe()
        ))
    };
    let found: Vec<(bool, String)> = [(true, on), (false, off)]
        .into_iter()
        .filter_map(|(is_on, arm)| poisoned(arm).map(|words| (is_on, words)))
        .collect();
    if found.is_empty() {
        return verdict;
    }
    let implicated_arm_poisoned = verdict.status == Status::Implicated
        && found.len() == 1
        && verdict
            .direction
            .as_deref()
            .is_some_and(|d| d.starts_with(&if found[0].0 { on.name() } else { off.name() }));
    for (_, words) in found.iter().rev() {
        verdict.reasons.insert(
            0,
            Reason::finding(format!(
                "{words}: its rate is a poisoned engine's, not a load-dependent rate"
            )),
        );
    }
    if implicated_arm_poisoned {
        verdict.summary = format!("implicated: {flag} {}", found[0].1);
    } else {
        verdict.status = Status::Inconclusive;
        verdict.direction = None;
        verdict.summary = format!(
            "inconclusive: {flag}: {}",
            found
                .iter()
                .map(|(_, w)| w.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    verdict
}

/// One arm's engine lives, from its pooled stats and its blocks (an arm of one block
/// is its own block).
fn exposure<'a>(
    arm: &'a ArmObservation,
    blocks: &[ArmObservation],
    name: &'a str,
) -> deaths::Exposure<'a> {
    let own: Vec<&ArmObservation> = blocks.iter().filter(|b| b.label == arm.label).collect();
    let (n, died) = if own.is_empty() {
        (1, u64::from(!arm.stats.deaths.is_empty()))
    } else {
        (
            own.len() as u64,
            own.iter().filter(|b| !b.stats.deaths.is_empty()).count() as u64,
        )
    };
    deaths::Exposure {
        label: name,
        deaths: &arm.stats.deaths,
        blocks: n,
        blocks_died: died,
        served: arm.stats.served,
        restarts: arm.stats.restarts.len() as u64,
    }
}

/// The verdict with the engines' deaths judged in (core::deaths): an arm whose engine
/// dies while the other's never does is implicated by its deaths when the conditional
/// test says so (and no blocking confound voids the run); deaths in both arms, or too
/// few to tell, leave the run inconclusive and never cleared, with the deaths in words.
fn with_deaths(
    mut verdict: Verdict,
    (on, off): (&ArmObservation, &ArmObservation),
    blocks: &[ArmObservation],
    policy: &Policy,
    flag: &str,
    blocked: bool,
) -> Verdict {
    let (on_name, off_name) = (on.name(), off.name());
    let finding = deaths::judge(
        &exposure(on, blocks, &on_name),
        &exposure(off, blocks, &off_name),
    );
    match finding {
        deaths::DeathFinding::None => verdict,
        deaths::DeathFinding::OneArm { p, text, .. } => {
            let decisive = p < policy.alpha;
            if decisive && !blocked {
                verdict.status = Status::Implicated;
                verdict.direction = Some(text.clone());
                verdict.reasons.insert(
                    0,
                    Reason::finding(format!("{text} < alpha {}", policy.alpha)),
                );
                verdict.summary = format!("implicated: {flag} {text}");
            } else {
                if verdict.status == Status::Cleared {
                    verdict.status = Status::Inconclusive;
                    verdict.summary = format!("inconclusive: {flag}: an engine died: {text}");
                }
                let why = if decisive {
                    "but the blocking confounds above void the comparison"
                } else {
                    "too few deaths to tell them from chance"
                };
                verdict
                    .reasons
                    .insert(0, Reason::finding(format!("{text}: {why}")));
            }
            verdict
        }
        deaths::DeathFinding::BothArms { text } => {
            // Both arms' sessions were cut short by deaths: neither arm is whole.
            verdict.status = Status::Inconclusive;
            verdict.direction = None;
            verdict.summary = format!("inconclusive: {flag}: {text}");
            verdict.reasons.insert(0, Reason::finding(text));
            verdict
        }
    }
}

fn compare(on: &ArmObservation, off: &ArmObservation, policy: &Policy) -> Comparison {
    let (k_on, n_on) = (on.corrupted().min(on.judged()), on.judged());
    let (k_off, n_off) = (off.corrupted().min(off.judged()), off.judged());
    let p_value = stats::fisher_exact_two_sided(k_on, n_on - k_on, k_off, n_off - k_off);
    let (rate_diff, lo, hi) = stats::newcombe_diff(k_on, n_on, k_off, n_off, CONFIDENCE);
    Comparison {
        test: "fisher_exact_two_sided".to_string(),
        p_value,
        rate_diff,
        diff_ci95: [lo, hi],
        min_effect: policy.min_effect,
    }
}

fn judge(
    (on, off): (&ArmObservation, &ArmObservation),
    policy: &Policy,
    flag: &str,
    comparison: &Comparison,
    confounds: &[Confound],
    shortfalls: &[String],
) -> Verdict {
    let p = comparison.p_value;
    let [lo, hi] = comparison.diff_ci95;
    let m = policy.min_effect;
    let significant = p < policy.alpha;
    let inside_min_effect = lo > -m && hi < m;
    let (blocking, warnings) = blocking_and_warnings(confounds);

    let (corrupting, clean) = if comparison.rate_diff >= 0.0 {
        (on, off)
    } else {
        (off, on)
    };
    let interval_text = format!(
        "difference interval {} to {} points",
        percent_digits(lo),
        percent_digits(hi)
    );
    let p_text = format!("Fisher p = {}", format::p_value(p));

    let load_shortfall = (!shortfalls.is_empty()).then(|| shortfalls.join("; "));
    let status = status_of(
        !blocking.is_empty(),
        significant,
        inside_min_effect,
        load_shortfall.is_some(),
    );

    let mut findings: Vec<String> = blocking.iter().map(|c| c.note.clone()).collect();
    if status == Status::Inconclusive && blocking.is_empty() && !significant && inside_min_effect {
        findings.extend(shortfall_reason(
            load_shortfall.as_deref(),
            &interval_text,
            m,
        ));
    }
    match status {
        Status::Implicated => findings.push(format!(
            "{p_text} < alpha {}: {} corrupts more",
            policy.alpha,
            corrupting.name()
        )),
        Status::Cleared => findings.push(format!(
            "{interval_text} lies inside +-{} points and {p_text}",
            percent_digits(m)
        )),
        Status::Inconclusive => findings.extend(undecided_reasons(
            (on, off),
            corrupting,
            policy,
            p,
            (significant, inside_min_effect, !blocking.is_empty()),
            (&p_text, &interval_text),
        )),
    }
    let reasons: Vec<Reason> = findings
        .into_iter()
        .map(Reason::finding)
        .chain(warnings.iter().map(|c| Reason::warning(&c.note)))
        .collect();

    let direction = (status == Status::Implicated).then(|| direction_words(corrupting, clean));

    let summary = summary_line(
        status,
        flag,
        (on, off),
        (corrupting, clean),
        comparison,
        &p_text,
        &reasons,
        &warnings,
        m,
    );

    Verdict {
        status,
        direction,
        reasons,
        summary,
    }
}

/// The confounds that void the comparison, and those it only warns of.
fn blocking_and_warnings(confounds: &[Confound]) -> (Vec<&Confound>, Vec<&Confound>) {
    let blocking = confounds
        .iter()
        .filter(|c| c.severity == Severity::Blocking)
        .collect();
    let warnings = confounds
        .iter()
        .filter(|c| c.severity == Severity::Warning)
        .collect();
    (blocking, warnings)
}

/// The status the numbers support: a blocking confound voids the comparison, and a
/// difference inside the minimum effect clears only at the planned load.
fn status_of(
    blocked: bool,
    significant: bool,
    inside_min_effect: bool,
    short_of_load: bool,
) -> Status {
    if blocked {
        Status::Inconclusive
    } else if significant {
        Status::Implicated
    } else if inside_min_effect && !short_of_load {
        Status::Cleared
    } else {
        Status::Inconclusive
    }
}

/// Why an interval inside the minimum effect did not clear: the load fell short.
fn shortfall_reason(load_shortfall: Option<&str>, interval_text: &str, m: f64) -> Option<String> {
    load_shortfall.map(|shortfall| {
        format!(
            "{interval_text} lies inside +-{} points, but {shortfall}: a bug that needs load \
             is not ruled out at a lower one",
            percent_digits(m)
        )
    })
}

/// Which arm corrupts, with both arms' counts.
fn direction_words(corrupting: &ArmObservation, clean: &ArmObservation) -> String {
    format!(
        "{} corrupts: {}/{} vs {}/{}",
        corrupting.name(),
        corrupting.corrupted(),
        corrupting.judged(),
        clean.corrupted(),
        clean.judged()
    )
}

/// Why a run that is neither implicated nor cleared is not, in words.
fn undecided_reasons(
    (on, off): (&ArmObservation, &ArmObservation),
    corrupting: &ArmObservation,
    policy: &Policy,
    p: f64,
    (significant, inside_min_effect, blocked): (bool, bool, bool),
    (p_text, interval_text): (&str, &str),
) -> Vec<String> {
    let m = policy.min_effect;
    if significant {
        vec![format!(
            "{p_text} < alpha {} would implicate {}, but the blocking confounds above \
             void the comparison",
            policy.alpha,
            corrupting.name()
        )]
    } else if inside_min_effect {
        // Blocked, or short of the target load (said above); nothing else to add.
        if blocked {
            vec![format!(
                "{interval_text} lies inside +-{} points, but the blocking confounds \
                 above void the comparison",
                percent_digits(m)
            )]
        } else {
            Vec::new()
        }
    } else {
        vec![
            format!(
                "not significant (p = {} >= alpha {})",
                format::p_value(p),
                policy.alpha
            ),
            format!(
                "{interval_text} is not inside +-{} points",
                percent_digits(m)
            ),
            power_reason(on, off, policy),
        ]
    }
}

/// The one-line summary of a verdict, for a chat message.
#[allow(clippy::too_many_arguments)]
fn summary_line(
    status: Status,
    flag: &str,
    (on, off): (&ArmObservation, &ArmObservation),
    (corrupting, clean): (&ArmObservation, &ArmObservation),
    comparison: &Comparison,
    p_text: &str,
    reasons: &[Reason],
    warnings: &[&Confound],
    m: f64,
) -> String {
    let [lo, hi] = comparison.diff_ci95;
    let subject = if flag.is_empty() {
        String::new()
    } else {
        format!("{flag} ")
    };
    let mut summary = match status {
        Status::Implicated => format!(
            "implicated: {subject}{} corrupts {} vs {} {}, {p_text}",
            corrupting.name(),
            corrupting.rate_text(true),
            clean.name(),
            clean.rate_text(false)
        ),
        Status::Cleared => format!(
            "cleared: {subject}{} {} vs {} {}, difference {} points (95% CI {} to {}) \
             inside +-{}, {p_text}{}",
            on.name(),
            on.rate_text(true),
            off.name(),
            off.rate_text(false),
            percent_digits(comparison.rate_diff),
            percent_digits(lo),
            percent_digits(hi),
            percent_digits(m),
            // A chosen load is part of what was cleared: say it, so "cleared at 8 in
            // flight" is never read as "cleared".
            WorkloadParams::read(on.workload)
                .concurrency
                .map_or(String::new(), |c| format!(", at {c} sessions in flight"))
        ),
        Status::Inconclusive => {
            format!(
                "inconclusive: {subject}{} {} vs {} {}, {p_text}: {}",
                on.name(),
                on.rate_text(true),
                off.name(),
                off.rate_text(false),
                crate::reason::findings(reasons)
            )
        }
    };
    if !warnings.is_empty() {
        let names: Vec<&str> = warnings.iter().map(|c| c.name.as_str()).collect();
        summary.push_str(&format!(" (warnings: {})", names.join(", ")));
    }

    summary
}

/// The "underpowered" reason: how many sessions per arm would resolve `min_effect` at the
/// pooled corruption rate, or, where the run already had that many, that the observed
/// difference sits too close to `min_effect` to call.
fn power_reason(on: &ArmObservation, off: &ArmObservation, policy: &Policy) -> String {
    let pooled = stats::rate(on.corrupted() + off.corrupted(), on.judged() + off.judged());
    let needed = stats::sessions_per_arm(pooled, policy.min_effect, policy.alpha, policy.power);
    let smaller_arm = on.judged().min(off.judged());
    if needed == u64::MAX {
        format!(
            "underpowered: no number of sessions resolves a difference of {}",
            policy.min_effect
        )
    } else if needed > smaller_arm {
        format!(
            "underpowered: about {needed} sessions per arm would resolve a difference of {} \
             (this run had {} and {}{})",
            policy.min_effect,
            on.judged(),
            off.judged(),
            unjudged_text(on, off)
        )
    } else {
        format!(
            "borderline: the observed difference lies close to min_effect {}; more than the \
             {smaller_arm} sessions per arm of this run are needed to call it",
            policy.min_effect
        )
    }
}

/// `` that could show corruption; on: 16 truncated at max_tokens ...``: why the judged
/// sessions are fewer than the sessions run, or nothing when they are not.
fn unjudged_text(on: &ArmObservation, off: &ArmObservation) -> String {
    let why = |arm: &ArmObservation| {
        let c = &arm.stats.counts;
        let mut parts = Vec::new();
        if c[SessionClass::Truncated] > 0 {
            parts.push(format!(
                "{} truncated at max_tokens",
                c[SessionClass::Truncated]
            ));
        }
        if c.failed() > 0 {
            parts.push(format!("{} errored or timed out", c.failed()));
        }
        (!parts.is_empty()).then(|| format!("{}: {}", arm.label, parts.join(", ")))
    };
    let excluded: Vec<String> = [on, off].into_iter().filter_map(why).collect();
    if excluded.is_empty() {
        String::new()
    } else {
        format!(
            " sessions that could show corruption; not counted, as they never got a whole \
             reply in: {}",
            excluded.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arm_stats::{ArmLabel, ArmStats};
    use crate::session::Counts;
    use serde_json::json;
    use serde_json::Value;
    use std::collections::BTreeMap;

    /// An arm's owned data, as a record holds it; [`TestArm::obs`] borrows it.
    struct TestArm {
        label: ArmLabel,
        value: String,
        stats: ArmStats,
        readback: BTreeMap<String, String>,
        effective: BTreeMap<String, String>,
        workload: Value,
    }

    impl TestArm {
        fn obs(&self) -> ArmObservation<'_> {
            ArmObservation {
                label: self.label,
                value: &self.value,
                block: None,
                replica: None,
                stats: &self.stats,
                readback: &self.readback,
                effective: &self.effective,
                workload: &self.workload,
            }
        }
    }

    /// An arm with `corrupted` leak sessions, `timeouts` timeouts and the rest done, at
    /// matching readback and engine-reported value, equal load and speed, and the
    /// default workload parameters.
    fn arm(label: &str, value: &str, corrupted: u64, timeouts: u64, sessions: u64) -> TestArm {
        let counts = Counts::from([
            (SessionClass::Done, sessions - corrupted - timeouts),
            (SessionClass::Leak, corrupted),
            (SessionClass::Timeout, timeouts),
        ]);
        let mut stats = ArmStats {
            counts,
            peak_running: [("client", 40), ("decode", 40), ("prefill", 12)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            wall_s: 300.0,
            ..ArmStats::default()
        };
        stats.finish();
        stats.tokens_per_s = 900.0;
        let readback: BTreeMap<String, String> = [("prefill", value), ("decode", value)]
            .into_iter()
            .map(|(r, v)| (r.to_string(), v.to_string()))
            .collect();
        TestArm {
            label: ArmLabel::parse(label).unwrap(),
            value: value.to_string(),
            stats,
            effective: readback.clone(),
            readback,
            workload: json!({"name": "agentic", "sessions": sessions, "concurrency": 40, "rounds": 4, "ctx": 2000}),
        }
    }

    /// A canary on `arm`'s engine after its first failure, corrupted alone or not.
    fn canary(poisoned: bool) -> crate::poison::Canary {
        use crate::poison::{Canary, FirstFailure, Tally};
        Canary {
            life: 0,
            first_failure: FirstFailure {
                index: 3,
                at_s: 1.0,
                request_seq: 9,
                class: SessionClass::Leak,
            },
            index: 0,
            chosen: crate::poison::Chosen::CleanBefore,
            class: if poisoned {
                SessionClass::Leak
            } else {
                SessionClass::Done
            },
            evidence: String::new(),
            fresh: Some(SessionClass::Done),
            before: Tally {
                judged: 20,
                corrupted: 1,
            },
            after: Tally {
                judged: 58,
                corrupted: 58,
            },
        }
    }

    #[test]
    fn a_poisoned_engine_is_named_and_never_read_as_a_load_dependent_rate() {
        let mut on = arm("on", "1", 59, 0, 80);
        on.stats.canaries = vec![canary(true)];
        let off = arm("off", "0", 0, 0, 80);
        let (_, _, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Implicated);
        assert!(
            verdict
                .summary
                .starts_with("implicated: BF16_INDEX_K on (=1): poisoned after the first failure"),
            "{}",
            verdict.summary
        );
        assert!(verdict.reasons[0].contains("not a load-dependent rate"));
        assert!(verdict.reasons[0].contains("after it 58 of 58"));
        // A canary that came back clean alone changes nothing.
        on.stats.canaries = vec![canary(false)];
        let (_, _, plain) = decide_default(&on, &off);
        assert_eq!(plain.status, Status::Implicated);
        assert!(!plain.summary.contains("poisoned"), "{}", plain.summary);
        // Poisoned in the arm that is not implicated, or in both: never one rate.
        let mut off_poisoned = arm("off", "0", 2, 0, 80);
        off_poisoned.stats.canaries = vec![canary(true)];
        let clean_on = arm("on", "1", 1, 0, 80);
        let (_, _, v) = decide_default(&clean_on, &off_poisoned);
        assert_eq!(v.status, Status::Inconclusive);
        assert!(v.summary.contains("off (=0): poisoned"), "{}", v.summary);
    }

    fn decide_default(on: &TestArm, off: &TestArm) -> (Comparison, Vec<Confound>, Verdict) {
        decide(
            &on.obs(),
            &off.obs(),
            &[],
            &Policy::default(),
            "BF16_INDEX_K",
        )
    }

    fn blocking_names(confounds: &[Confound]) -> Vec<&str> {
        confounds
            .iter()
            .filter(|c| c.severity == Severity::Blocking)
            .map(|c| c.name.as_str())
            .collect()
    }

    #[test]
    fn on_corrupting_is_implicated() {
        let (comparison, confounds, verdict) =
            decide_default(&arm("on", "1", 14, 0, 80), &arm("off", "0", 0, 0, 80));
        assert_eq!(verdict.status, Status::Implicated);
        assert_eq!(
            verdict.direction.as_deref(),
            Some("on (=1) corrupts: 14/80 vs 0/80")
        );
        assert!((comparison.p_value - 6.553361437755207e-05).abs() < 1e-12);
        assert!((comparison.rate_diff - 0.175).abs() < 1e-12);
        assert!(comparison.diff_ci95[0] > 0.09 && comparison.diff_ci95[1] < 0.28);
        assert!(blocking_names(&confounds).is_empty());
        assert_eq!(
            verdict.summary,
            "implicated: BF16_INDEX_K on (=1) corrupts 14/80 (17.5%, 95% CI 10.7-27.3%) \
             vs off (=0) 0/80 (0.0%, 0.0-4.6%), Fisher p = 6.6e-5"
        );
    }

    #[test]
    fn off_corrupting_is_implicated_the_other_way() {
        let (comparison, _, verdict) =
            decide_default(&arm("on", "1", 0, 0, 80), &arm("off", "0", 14, 0, 80));
        assert_eq!(verdict.status, Status::Implicated);
        assert_eq!(
            verdict.direction.as_deref(),
            Some("off (=0) corrupts: 14/80 vs 0/80")
        );
        assert!((comparison.rate_diff + 0.175).abs() < 1e-12);
        assert!(verdict
            .summary
            .starts_with("implicated: BF16_INDEX_K off (=0) corrupts 14/80"));
    }

    #[test]
    fn two_of_sixty_is_underpowered() {
        let (comparison, confounds, verdict) =
            decide_default(&arm("on", "1", 2, 0, 60), &arm("off", "0", 0, 0, 60));
        assert!((comparison.p_value - 0.4957983193277311).abs() < 1e-12);
        assert!(blocking_names(&confounds).is_empty());
        assert_eq!(verdict.status, Status::Inconclusive);
        assert_eq!(verdict.direction, None);
        assert!(verdict
            .reasons
            .contains(&Reason::finding("not significant (p = 0.50 >= alpha 0.01)")));
        // Pooled rate 2/120, min_effect 0.05, alpha 0.01, power 0.8 -> 411 (stats tests).
        assert!(
            verdict.reasons.iter().any(|r| r.starts_with(
                "underpowered: about 411 sessions per arm would resolve a difference of 0.05"
            )),
            "{:?}",
            verdict.reasons
        );
        assert!(verdict
            .summary
            .starts_with("inconclusive: BF16_INDEX_K on (=1) 2/60"));
        assert!(verdict
            .summary
            .contains("not significant (p = 0.50 >= alpha 0.01)"));
    }

    #[test]
    fn sessions_that_could_not_show_corruption_never_clear_a_flag() {
        // 400 sessions per arm, 380 of them cut off at max_tokens: counted as clean they
        // would give 0/400 vs 1/400 and "cleared" (the test above), on 20 judged ones.
        let truncating = |label, value, corrupted| {
            let mut a = arm(label, value, corrupted, 0, 400);
            a.stats.counts[SessionClass::Done] -= 380;
            a.stats.counts[SessionClass::Truncated] = 380;
            a.stats.finish();
            a
        };
        let (on, off) = (truncating("on", "1", 0), truncating("off", "0", 1));
        assert_eq!((on.obs().judged(), on.obs().classified()), (20, 400));
        let (comparison, _, verdict) = decide_default(&on, &off);
        assert_eq!(
            verdict.status,
            Status::Inconclusive,
            "{:?}",
            verdict.reasons
        );
        // The interval is the one of 0/20 vs 1/20, far wider than +-5 points.
        assert!(comparison.diff_ci95[0] < -0.2, "{comparison:?}");
        assert!(verdict.summary.contains("0/20"), "{}", verdict.summary);
        assert!(
            verdict.reasons.iter().any(|r| r.contains(
                "this run had 20 and 20 sessions that \
                could show corruption"
            ) && r
                .contains("on: 380 truncated at max_tokens; off: 380 truncated")),
            "{:?}",
            verdict.reasons
        );
        // Timeouts within the degraded limit are left out too: 2/360 judged, not 2/400.
        let with_timeouts = arm("on", "1", 2, 40, 400);
        assert_eq!(with_timeouts.obs().judged(), 360);
        assert!((with_timeouts.stats.corruption_rate - 2.0 / 360.0).abs() < 1e-12);
    }

    /// docs/design.md 3.7: no verdict clears a mechanism that never ran. The same clean
    /// data are cleared where the witness counted the path in the arm that enables it,
    /// inconclusive with the fix where it counted nothing; implicated stands either way
    /// and says what the witness counted.
    #[test]
    fn cleared_needs_the_flag_s_mechanism_to_have_run() {
        let record = |value: &str, needed: bool, count: u64| crate::mechanism::MechanismRecord {
            fix: "raise --ctx".into(),
            ..crate::testing::witnessed(
                ("DEFRAG", "defrag"),
                (value, needed),
                "log /requesting defrag/",
                count,
            )
        };
        let with = |corrupted: u64, value: &str, label: &str, needed: bool, count: u64| {
            let mut a = arm(label, value, corrupted, 0, 400);
            a.stats.mechanisms = vec![record(value, needed, count)];
            a
        };
        let (_, _, ran) =
            decide_default(&with(0, "1", "on", true, 9), &with(1, "0", "off", false, 0));
        assert_eq!(ran.status, Status::Cleared, "{:?}", ran.reasons);
        assert!(ran.reasons.iter().any(
            |r| r.contains("the mechanism ran: defrag (log /requesting defrag/): on 9, off 0")
        ));

        let (_, _, never) =
            decide_default(&with(0, "1", "on", true, 0), &with(1, "0", "off", false, 0));
        assert_eq!(never.status, Status::Inconclusive);
        assert_eq!(
            never.summary,
            "inconclusive: BF16_INDEX_K: the mechanism never ran: defrag (log /requesting defrag/): \
             on 0, off 0; it runs only in on; to reach it: raise --ctx"
        );
        assert!(never.reasons[0].starts_with("the mechanism never ran"));

        // Too few sessions to decide anyway: the path that never ran still leads.
        let few = |a: TestArm| {
            let mut a = a;
            a.stats.counts[SessionClass::Done] = 10;
            a.stats.finish();
            a
        };
        let (_, _, underpowered) = decide_default(
            &few(with(0, "1", "on", true, 0)),
            &few(with(0, "0", "off", false, 0)),
        );
        assert_eq!(underpowered.status, Status::Inconclusive);
        assert!(
            underpowered
                .summary
                .starts_with("inconclusive: BF16_INDEX_K: the mechanism never ran: defrag"),
            "{}",
            underpowered.summary
        );
        assert!(
            underpowered.summary.contains("; BF16_INDEX_K on (=1) 0/10"),
            "{}",
            underpowered.summary
        );

        let (_, _, implicated) = decide_default(
            &with(40, "1", "on", true, 0),
            &with(0, "0", "off", false, 0),
        );
        assert_eq!(implicated.status, Status::Implicated);
        assert!(implicated
            .reasons
            .iter()
            .any(|r| r.starts_with("witnessed: defrag (log /requesting defrag/): on 0, off 0")));
    }

    #[test]
    fn no_difference_on_many_sessions_is_cleared() {
        let (comparison, _, verdict) =
            decide_default(&arm("on", "1", 0, 0, 400), &arm("off", "0", 1, 0, 400));
        assert_eq!(verdict.status, Status::Cleared);
        assert_eq!(verdict.direction, None);
        // Newcombe for 0/400 - 1/400: -0.0140 to 0.0072 (stats reference values).
        assert!((comparison.diff_ci95[0] + 0.01402328507582339).abs() < 1e-9);
        assert!((comparison.diff_ci95[1] - 0.0072324909821049055).abs() < 1e-9);
        assert_eq!(
            verdict.summary,
            "cleared: BF16_INDEX_K on (=1) 0/400 (0.0%, 95% CI 0.0-1.0%) vs off (=0) 1/400 \
             (0.2%, 0.0-1.4%), difference -0.2 points (95% CI -1.4 to 0.7) inside +-5.0, \
             Fisher p = 1.00, at 40 sessions in flight"
        );
    }

    #[test]
    fn degraded_arm_blocks_even_a_tiny_p() {
        // MMA off: 70 of 80 sessions time out, the 10 that finish are clean. The
        // comparison is 60/80 vs 0/10 judged (timeouts are not clean sessions).
        let (comparison, confounds, verdict) =
            decide_default(&arm("on", "1", 60, 0, 80), &arm("off", "0", 0, 70, 80));
        assert!(comparison.p_value < 0.001, "{comparison:?}");
        assert_eq!(blocking_names(&confounds), vec!["error_timeout"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert_eq!(verdict.direction, None);
        let degraded = &verdict.reasons[0];
        assert!(
            degraded.starts_with("degraded: not a same-speed toggle"),
            "{degraded}"
        );
        assert!(
            degraded.contains("arm off (=0) had 0 error and 70 timeout sessions of 80"),
            "{degraded}"
        );
        assert!(!degraded.contains("arm on"), "{degraded}");
        assert!(verdict
            .summary
            .contains("degraded: not a same-speed toggle"));
    }

    #[test]
    fn both_arms_degraded_blames_the_setup_not_the_flag() {
        let (_, confounds, verdict) =
            decide_default(&arm("on", "1", 0, 40, 80), &arm("off", "0", 0, 50, 80));
        assert_eq!(blocking_names(&confounds), vec!["error_timeout"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        let degraded = &verdict.reasons[0];
        assert!(degraded.starts_with("degraded: both arms"), "{degraded}");
        assert!(degraded.contains("not the flag"), "{degraded}");
        assert!(!degraded.contains("same-speed"), "{degraded}");
    }

    #[test]
    fn truncation_is_not_corruption_and_differing_rates_are_warned() {
        let mut on = arm("on", "1", 0, 0, 80);
        on.stats.counts[SessionClass::Done] = 60;
        on.stats.counts[SessionClass::Truncated] = 20;
        on.stats.finish();
        let off = arm("off", "0", 0, 0, 80);
        let (comparison, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(on.stats.corrupted, 0, "truncated is not corrupted");
        assert_eq!(comparison.rate_diff, 0.0);
        let t = confounds.iter().find(|c| c.name == "truncated").unwrap();
        assert_eq!(t.severity, Severity::Warning);
        assert_eq!((t.on.clone(), t.off.clone()), (json!(20), json!(0)));
        // 20/80 vs 0/80: Fisher two-sided p = 2.3e-7 (R: fisher.test(matrix(c(20,60,0,80),2))).
        assert!(
            t.note.contains("on 20/80 (25.0%), off 0/80 (0.0%)"),
            "{}",
            t.note
        );
        assert!(verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("warning: replies truncated")));

        // One truncated reply per arm is recorded, not warned.
        let mut on = arm("on", "1", 0, 0, 80);
        on.stats.counts[SessionClass::Done] = 79;
        on.stats.counts[SessionClass::Truncated] = 1;
        let mut off = arm("off", "0", 0, 0, 80);
        off.stats.counts[SessionClass::Done] = 79;
        off.stats.counts[SessionClass::Truncated] = 1;
        let (_, confounds, _) = decide_default(&on, &off);
        let t = confounds.iter().find(|c| c.name == "truncated").unwrap();
        assert_eq!(t.severity, Severity::Info);
        let (_, confounds, _) = decide_default(&arm("on", "1", 0, 0, 8), &arm("off", "0", 0, 0, 8));
        assert!(!confounds.iter().any(|c| c.name == "truncated"));
    }

    #[test]
    fn a_role_whose_scrapes_all_failed_is_a_warning() {
        let mut on = arm("on", "1", 0, 0, 80);
        on.stats.metrics_failed.insert(
            "decode".into(),
            "all 12 scrapes failed, last: http://h/metrics: HTTP 401".into(),
        );
        let off = arm("off", "0", 0, 0, 80);
        let (_, confounds, verdict) = decide_default(&on, &off);
        let m = confounds
            .iter()
            .find(|c| c.name == "metrics.decode")
            .unwrap();
        assert_eq!(m.severity, Severity::Warning);
        assert!(m.note.contains("HTTP 401"), "{}", m.note);
        assert_eq!(m.off, Value::Null);
        assert!(verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("warning: no load measured for role decode")));
    }

    #[test]
    fn failures_within_the_limit_are_recorded_not_blocking() {
        let (_, confounds, verdict) =
            decide_default(&arm("on", "1", 14, 8, 80), &arm("off", "0", 0, 2, 80));
        let failures = confounds
            .iter()
            .find(|c| c.name == "error_timeout")
            .unwrap();
        assert_eq!(failures.severity, Severity::Info);
        assert_eq!(
            failures.on,
            json!({"error": 0, "timeout": 8, "sessions": 80})
        );
        assert_eq!(verdict.status, Status::Implicated);
    }

    #[test]
    fn readback_mismatch_blocks_and_names_the_role() {
        let on = arm("on", "1", 14, 0, 80);
        let mut off = arm("off", "0", 0, 0, 80);
        // The flag was flipped in decode's launch script but not prefill's.
        off.readback.insert("prefill".to_string(), "1".to_string());
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(blocking_names(&confounds), vec!["readback.prefill"]);
        let mismatch = &confounds[0];
        assert_eq!(
            (mismatch.on.clone(), mismatch.off.clone()),
            (json!("1"), json!("1"))
        );
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons[0].contains(
                "readback mismatch in role prefill: arm off set 0 but prefill read back \"1\""
            ),
            "{:?}",
            verdict.reasons
        );
        assert!(verdict.reasons[1].contains("would implicate on (=1)"));
    }

    #[test]
    fn an_engine_running_another_value_than_its_launch_file_blocks() {
        // The launch script reads back 0 in both roles, but a dead conditional left the
        // prefill engine running with 1: the `off` arm never ran off.
        let mut on = arm("on", "1", 14, 0, 80);
        let mut off = arm("off", "0", 0, 0, 80);
        on.effective.insert("prefill".into(), "1".into());
        off.effective.insert("prefill".into(), "1".into());
        off.effective.insert("decode".into(), "false".into());
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(blocking_names(&confounds), vec!["effective.prefill"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons[0]
                .contains("arm off set 0 but the prefill engine reports it runs with \"1\""),
            "{:?}",
            verdict.reasons
        );
        // Agreeing reports (numbers or booleans for 0/1) pass.
        off.effective.insert("prefill".into(), "0".into());
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert!(blocking_names(&confounds).is_empty());
        assert_eq!(verdict.status, Status::Implicated);
    }

    impl TestArm {
        /// This arm as block `repeat` of several.
        fn block(&self, repeat: u32) -> ArmObservation<'_> {
            ArmObservation {
                block: Some(repeat),
                replica: None,
                ..self.obs()
            }
        }
    }

    /// A switch set "on" in two blocks; the engine reports booleans. Block r0's engine
    /// reports `true` (agrees), block r1's did not pick up the config and reports
    /// `false`: the pooled arm keeps the `false`, and the block is named.
    #[test]
    fn a_block_whose_engine_ran_another_value_blocks_the_pooled_arm() {
        let agrees = crate::effective::agrees;
        let mut r0 = arm("on", "on", 0, 0, 200);
        r0.effective.insert("prefill".into(), "true".into());
        let mut r1 = arm("on", "on", 0, 0, 200);
        r1.effective.insert("prefill".into(), "false".into());
        let mut on = arm("on", "on", 0, 0, 400);
        on.effective =
            crate::arm_stats::pool_readback("on", [&r0.effective, &r1.effective], agrees);
        let off = arm("off", "off", 1, 0, 400);
        // Pooled alone: the disagreeing report survives pooling.
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(blocking_names(&confounds), vec!["effective.prefill"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        // With the blocks: the reason names the block that ran another value.
        let blocks = [r0.block(0), r1.block(1), off.obs()];
        let (_, confounds, verdict) = decide(
            &on.obs(),
            &off.obs(),
            &blocks,
            &Policy::default(),
            "HICACHE",
        );
        assert_eq!(blocking_names(&confounds), vec!["effective.prefill"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons[0].contains(
                "block on-r1 set on but the prefill engine reports it runs with \"false\""
            ) && !verdict.reasons[0].contains("on-r0"),
            "{:?}",
            verdict.reasons
        );
    }

    /// Pooled peaks are the best block's: a block that never reached the load must stop
    /// `cleared` on its own.
    #[test]
    fn a_block_short_of_the_load_stops_cleared_though_the_pooled_peak_reached_it() {
        let at = |peak: u64, sessions: u64| {
            let mut a = arm("on", "1", 0, 0, sessions);
            a.workload["concurrency"] = json!(80);
            a.stats.peak_running.insert("decode".into(), peak);
            a
        };
        let (r0, r1) = (at(80, 200), at(20, 200));
        let mut on = at(0, 400);
        on.stats = ArmStats::pool([&r0.stats, &r1.stats]);
        assert_eq!(on.stats.peak_running["decode"], 80);
        let mut off = arm("off", "0", 1, 0, 400);
        off.workload["concurrency"] = json!(80);
        off.stats.peak_running.insert("decode".into(), 80);
        // Without the blocks the pooled peak (80) hides the short block.
        let (_, _, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Cleared, "{:?}", verdict.reasons);
        let blocks = [r0.block(0), r1.block(1), off.obs()];
        let (_, _, verdict) = decide(&on.obs(), &off.obs(), &blocks, &Policy::default(), "F");
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons[0].contains(
                "block on-r1 reached at most 20 running requests (decode), below 72 \
                 (90% of the target concurrency 80)"
            ) && verdict.reasons[0].contains("a bug that needs load"),
            "{:?}",
            verdict.reasons
        );
    }

    /// One block of two failed 15 of its 100 sessions, the other none: 7.5% pooled, under
    /// the 10% limit, but that block's engine was degraded, so the arm is not a same-speed
    /// toggle there, and the reason names the block.
    #[test]
    fn a_degraded_block_blocks_though_the_pooled_arm_is_under_the_limit() {
        let (r0, r1) = (arm("on", "1", 0, 0, 100), arm("on", "1", 0, 15, 100));
        let mut on = arm("on", "1", 0, 0, 200);
        on.stats = ArmStats::pool([&r0.stats, &r1.stats]);
        let off = arm("off", "0", 0, 0, 200);
        let (_, confounds, _) = decide_default(&on, &off);
        assert!(blocking_names(&confounds).is_empty(), "{confounds:?}");
        let blocks = [r0.block(0), r1.block(1), off.obs()];
        let (_, confounds, verdict) =
            decide(&on.obs(), &off.obs(), &blocks, &Policy::default(), "F");
        assert_eq!(blocking_names(&confounds), vec!["error_timeout"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons[0]
                .contains("block on-r1 (=1) had 0 error and 15 timeout sessions of 100"),
            "{:?}",
            verdict.reasons
        );
    }

    /// Corruption that surfaces as failures (HTTP 500s from a tool-call parser) is left
    /// out of the rates: 9/100 failed on vs 0/100 off is below the degraded limit, but
    /// must qualify `cleared`, as differing truncation does.
    #[test]
    fn differing_error_rates_below_the_degraded_limit_are_warned() {
        let mut on = arm("on", "1", 0, 0, 100);
        on.stats.counts[SessionClass::Done] = 91;
        on.stats.counts[SessionClass::Error] = 9;
        let off = arm("off", "0", 0, 0, 100);
        let (_, confounds, verdict) = decide_default(&on, &off);
        let failures = confounds
            .iter()
            .find(|c| c.name == "error_timeout")
            .unwrap();
        assert_eq!(failures.severity, Severity::Warning);
        // 9/100 vs 0/100: Fisher two-sided p = 2 C(100,9) / C(200,9) = 0.0032.
        assert!(
            failures
                .note
                .contains("on 9/100 (9.0%), off 0/100 (0.0%), Fisher p = 0.0032"),
            "{}",
            failures.note
        );
        assert_eq!(verdict.status, Status::Cleared);
        assert!(verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("warning: error+timeout sessions differ between arms")));
        assert!(
            verdict.summary.ends_with("(warnings: error_timeout)"),
            "{}",
            verdict.summary
        );
        // Two failures against none: recorded, not warned.
        let mut on = arm("on", "1", 0, 0, 100);
        on.stats.counts[SessionClass::Done] = 98;
        on.stats.counts[SessionClass::Error] = 2;
        let (_, confounds, _) = decide_default(&on, &off);
        let failures = confounds
            .iter()
            .find(|c| c.name == "error_timeout")
            .unwrap();
        assert_eq!(failures.severity, Severity::Info);
    }

    /// An engine that does not report the flag (SGLang and environment variables): the
    /// verdict stands on the read-back alone, and says so in its reasons and summary.
    #[test]
    fn a_flag_value_no_engine_reports_is_a_warning_in_the_verdict() {
        let mut on = arm("on", "1", 0, 0, 400);
        let mut off = arm("off", "0", 1, 0, 400);
        on.effective.clear();
        off.effective.clear();
        let (_, confounds, verdict) = decide_default(&on, &off);
        let unverified: Vec<&Confound> = confounds
            .iter()
            .filter(|c| c.name.starts_with("unverified."))
            .collect();
        assert_eq!(unverified.len(), 2, "{confounds:?}");
        assert!(unverified.iter().all(|c| c.severity == Severity::Warning));
        assert_eq!(verdict.status, Status::Cleared);
        assert!(
            verdict.reasons.iter().any(|r| r.starts_with(
                "warning: the decode engine did not report the flag's value: only the \
                 launch-file read-back"
            )),
            "{:?}",
            verdict.reasons
        );
        assert!(
            verdict
                .summary
                .ends_with("(warnings: unverified.decode, unverified.prefill)"),
            "{}",
            verdict.summary
        );
        // One block whose engine was silent is named.
        let r0 = arm("on", "1", 0, 0, 200);
        let mut r1 = arm("on", "1", 0, 0, 200);
        r1.effective.remove("decode");
        let on = arm("on", "1", 0, 0, 400);
        let off = arm("off", "0", 1, 0, 400);
        let blocks = [r0.block(0), r1.block(1), off.obs()];
        let (_, confounds, _) = decide(&on.obs(), &off.obs(), &blocks, &Policy::default(), "F");
        let decode = confounds
            .iter()
            .find(|c| c.name == "unverified.decode")
            .unwrap();
        assert!(
            decode
                .note
                .contains("did not report the flag's value in block on-r1:"),
            "{}",
            decode.note
        );
        // The pooled arms' reports, as for `effective.<role>`.
        assert_eq!(
            (decode.on.clone(), decode.off.clone()),
            (json!("1"), json!("0"))
        );
        assert!(!confounds.iter().any(|c| c.name == "unverified.prefill"));
    }

    #[test]
    fn an_engine_replaced_during_an_arm_blocks_even_a_clear_result() {
        // 400+400 clean sessions would clear, but decode crashed and was restarted by
        // its supervisor halfway through `off`: that arm is not one engine's.
        let on = arm("on", "1", 0, 0, 400);
        let mut off = arm("off", "0", 1, 0, 400);
        off.stats.engine_replaced.push(
            "role decode is another process at the end of the block than after its restart \
             (pid 10 then, pid 11 now)"
                .into(),
        );
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(blocking_names(&confounds), vec!["engine_replaced"]);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons[0].contains("arm off (=0): role decode is another process")
                && verdict.reasons[0].contains("fix:"),
            "{:?}",
            verdict.reasons
        );
        // Pooling keeps a block's finding.
        let pooled = ArmStats::pool([&on.stats, &off.stats]);
        assert_eq!(pooled.engine_replaced.len(), 1);
    }

    #[test]
    fn cleared_needs_the_target_load_on_the_engine() {
        // No difference on 400+400 sessions, but the engine never ran more than 20 of the
        // 40 requests the experiment was meant to hold in flight.
        let mut on = arm("on", "1", 0, 0, 400);
        let off = arm("off", "0", 1, 0, 400);
        on.stats.peak_running.insert("decode".into(), 20);
        let (_, _, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(
            verdict.reasons.iter().any(|r| r.contains(
                "arm on reached at most 20 running requests (decode), below 36 (90% of the target concurrency 40)"
            )),
            "{:?}",
            verdict.reasons
        );
        // No engine-side measurement at all: cleared is not supported either.
        let mut on = arm("on", "1", 0, 0, 400);
        on.stats.peak_running.retain(|role, _| role == "client");
        let (_, _, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(verdict.reasons[0].contains("no engine-side load measurement"));
        // A shortfall does not stop an implication: corruption seen at a lower load is seen.
        let mut on = arm("on", "1", 14, 0, 80);
        on.stats.peak_running.insert("decode".into(), 20);
        let (_, _, verdict) = decide_default(&on, &arm("off", "0", 0, 0, 80));
        assert_eq!(verdict.status, Status::Implicated);
    }

    #[test]
    fn a_shortfall_says_where_the_gap_is_and_what_the_transport_did() {
        use crate::transport::{LoadGap, TransportStats};
        let mut on = arm("on", "1", 0, 0, 400);
        let off = arm("off", "0", 1, 0, 400);
        on.stats.peak_running.insert("decode".into(), 20);
        on.stats.load_gap = Some(LoadGap {
            samples: 12,
            role: "decode".into(),
            client_in_flight: 40.0,
            engine_running: 18.0,
            engine_queued: Some(2.0),
            connecting: 15.0,
            waiting: Vec::new(),
            unaccounted: 5.0,
        });
        on.stats.transport = Some(TransportStats {
            connects: 40,
            stalled_connects: 9,
            pacing_gap_ms_max: 4.0,
            ..TransportStats::default()
        });
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Inconclusive);
        let reason = verdict
            .reasons
            .iter()
            .find(|r| r.contains("arm on reached at most 20 running requests"))
            .unwrap();
        assert!(
            reason.contains("where the gap is: with 40.0 requests in flight at the client, decode ran 18.0 on average (12 samples): 15.0 still connecting, 2.0 queued in the engine, 5.0 sent but not seen by the engine"),
            "{reason}"
        );
        assert!(reason.contains("9 connects stalled"), "{reason}");
        let transport = confounds.iter().find(|c| c.name == "transport").unwrap();
        assert_eq!(transport.severity, Severity::Warning);
        assert!(transport.note.starts_with("arm on: 9 connects stalled"));
        let gap = confounds.iter().find(|c| c.name == "load_gap").unwrap();
        assert_eq!(gap.severity, Severity::Info);
        assert_eq!(gap.off, Value::Null);
        // A clean transport and no gap add nothing.
        let (_, confounds, _) = decide_default(&arm("on", "1", 0, 0, 400), &off);
        assert!(!confounds
            .iter()
            .any(|c| c.name == "transport" || c.name == "load_gap"));
    }

    /// The engine's own counts are recorded beside bisect's classes and decide nothing.
    #[test]
    fn the_engines_own_counts_are_recorded_beside_the_classes_not_deciding() {
        use crate::engine_counts::{EngineCount, EngineCounter};
        let count = |counter, count| EngineCount {
            role: "server".into(),
            counter,
            count,
        };
        let mut on = arm("on", "1", 0, 0, 400);
        let off = arm("off", "0", 1, 0, 400);
        let (_, _, before) = decide_default(&on, &off);
        on.stats.engine_counts = vec![
            count(EngineCounter::Preemptions, 3),
            count(EngineCounter::ParsedCall, 1190),
            count(EngineCounter::ParsedNoCall, 10),
        ];
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(verdict, before);
        let counted = confounds
            .iter()
            .find(|c| c.name == "engine_counts")
            .unwrap();
        assert_eq!(counted.severity, Severity::Info);
        assert_eq!(
            counted.note,
            "the engine counted: arm on: server: 3 preemptions; its tool-call parser: 1190 \
             replies with a tool call, 10 replies without one (bisect: 0 sessions no_tool)"
        );
        assert_eq!(counted.off, json!([]));
        let (_, confounds, _) = decide_default(&arm("on", "1", 0, 0, 400), &off);
        assert!(!confounds.iter().any(|c| c.name == "engine_counts"));
    }

    #[test]
    fn cleared_names_the_load_it_was_cleared_at() {
        let on = arm("on", "1", 0, 0, 400);
        let off = arm("off", "0", 1, 0, 400);
        let (_, _, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Cleared);
        assert!(
            verdict.summary.ends_with(", at 40 sessions in flight"),
            "{}",
            verdict.summary
        );
    }

    #[test]
    fn missing_readback_for_a_role_blocks() {
        let on = arm("on", "1", 0, 0, 400);
        let mut off = arm("off", "0", 0, 0, 400);
        off.readback.remove("decode");
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(blocking_names(&confounds), vec!["readback.decode"]);
        assert_eq!(confounds[0].off, Value::Null);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(verdict.reasons[0].contains("decode read back nothing"));
    }

    #[test]
    fn differing_rounds_block() {
        let on = arm("on", "1", 14, 0, 80);
        let mut off = arm("off", "0", 0, 0, 80);
        off.workload["rounds"] = json!(6);
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(blocking_names(&confounds), vec!["workload.rounds"]);
        let rounds = confounds
            .iter()
            .find(|c| c.name == "workload.rounds")
            .unwrap();
        assert_eq!(
            (rounds.on.clone(), rounds.off.clone()),
            (json!(4), json!(6))
        );
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(verdict.reasons[0]
            .contains("workload parameter rounds differs between arms (on 4, off 6)"));
    }

    #[test]
    fn unequal_load_warns_but_still_implicates() {
        let mut on = arm("on", "1", 14, 0, 80);
        let mut off = arm("off", "0", 0, 0, 80);
        on.stats.peak_running.insert("client".to_string(), 60);
        off.stats.peak_running.insert("client".to_string(), 20);
        on.stats.wall_s = 330.0; // 9% apart: recorded as info only.
        off.stats.wall_s = 300.0;
        let (_, confounds, verdict) = decide_default(&on, &off);
        assert_eq!(verdict.status, Status::Implicated);
        let client = confounds
            .iter()
            .find(|c| c.name == "peak_running.client")
            .unwrap();
        assert_eq!(client.severity, Severity::Warning);
        assert_eq!(
            (client.on.clone(), client.off.clone()),
            (json!(60), json!(20))
        );
        assert!(
            client.note.contains("differs by 66.7% (on 60, off 20)"),
            "{}",
            client.note
        );
        let wall = confounds.iter().find(|c| c.name == "wall_s").unwrap();
        assert_eq!(wall.severity, Severity::Info);
        for name in [
            "peak_running.decode",
            "peak_running.prefill",
            "tokens_per_s",
        ] {
            let c = confounds.iter().find(|c| c.name == name).unwrap();
            assert_eq!(c.severity, Severity::Info, "{name}");
        }
        assert!(verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("warning: peak client in-flight")));
        assert!(verdict.summary.ends_with("(warnings: peak_running.client)"));
    }

    #[test]
    fn a_small_peak_gap_past_the_ratio_is_never_called_within_it() {
        // A real vLLM at 4 in flight: a 17-block KV cache admitted 2 at once, the other
        // arm 4. Fewer than 8 apart is not warned, but the note once said "within 25%".
        let mut on = arm("on", "1", 0, 0, 8);
        let mut off = arm("off", "0", 0, 0, 8);
        on.stats.peak_running.insert("server".to_string(), 2);
        off.stats.peak_running.insert("server".to_string(), 4);
        let (_, confounds, _) = decide_default(&on, &off);
        let server = confounds
            .iter()
            .find(|c| c.name == "peak_running.server")
            .unwrap();
        assert_eq!(server.severity, Severity::Info);
        assert!(!server.note.contains("within"), "{}", server.note);
        assert!(
            server
                .note
                .contains("differs by 50.0% (on 2, off 4) but by fewer than 8"),
            "{}",
            server.note
        );
    }

    #[test]
    fn empty_arm_is_inconclusive() {
        let on = arm("on", "1", 0, 0, 0);
        let off = arm("off", "0", 3, 0, 80);
        let (comparison, _, verdict) = decide_default(&on, &off);
        assert_eq!(comparison.p_value, 1.0);
        assert_eq!(comparison.diff_ci95, [-1.0, 1.0]);
        assert_eq!(verdict.status, Status::Inconclusive);
        assert!(verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("underpowered")));
    }

    #[test]
    fn serialises_with_the_run_json_names() {
        let (comparison, confounds, verdict) =
            decide_default(&arm("on", "1", 14, 0, 80), &arm("off", "0", 0, 0, 80));
        let comparison = serde_json::to_value(&comparison).unwrap();
        for key in ["test", "p_value", "rate_diff", "diff_ci95", "min_effect"] {
            assert!(comparison.get(key).is_some(), "{key}");
        }
        assert_eq!(comparison["test"], "fisher_exact_two_sided");
        let verdict_json = serde_json::to_value(&verdict).unwrap();
        assert_eq!(verdict_json["status"], "implicated");
        assert!(verdict_json["reasons"].is_array());
        let confound = serde_json::to_value(&confounds[0]).unwrap();
        assert_eq!(confound["severity"], "info");
        let back: Verdict = serde_json::from_value(verdict_json).unwrap();
        assert_eq!(back, verdict);
        let policy: Policy = serde_json::from_value(json!({"alpha": 0.05})).unwrap();
        assert_eq!(
            policy,
            Policy {
                alpha: 0.05,
                ..Policy::default()
            }
        );
    }
}
