//! The `trend` confound (docs/design.md 3.7, "Corruption against time"): an arm whose
//! corruption rate moves with its request index, by the Cochran-Armitage test over its
//! bins ([`crate::trend`], which owns the statistic and the bins; the words and the
//! confound live here, beside the other confounds, so the statistic stays below the
//! decision's vocabulary).

use serde_json::{json, Value};

use crate::evidence::{ArmObservation, Confound, Policy, Severity};
use crate::format::p_value;
use crate::trend::{test, TrendBin, TrendTest};

/// `eighth` for 8 bins: what one bin is of the arm.
fn share(bins: usize) -> String {
    match bins {
        2 => "half".into(),
        3 => "third".into(),
        4 => "quarter".into(),
        5 => "fifth".into(),
        6 => "sixth".into(),
        7 => "seventh".into(),
        8 => "eighth".into(),
        n => format!("1/{n}"),
    }
}

/// `requests 0-9, uptime 0.4 s` of one bin.
fn place(bin: &TrendBin) -> String {
    let requests = if bin.first_seq == bin.last_seq {
        format!("request {}", bin.first_seq)
    } else {
        format!("requests {}-{}", bin.first_seq, bin.last_seq)
    };
    format!("{requests}, uptime {:.1} s", bin.uptime_s)
}

/// The words of one arm's significant trend.
fn describe(arm: &ArmObservation, test: TrendTest) -> String {
    let bins = &arm.stats.trend;
    let filled: Vec<&TrendBin> = bins.iter().filter(|b| b.sessions > 0).collect();
    let (first, last) = (filled[0], filled[filled.len() - 1]);
    let (moves, why) = if test.z > 0.0 {
        (
            "rises",
            "a rate that grows over the arm is not one rate at one load (engine state \
             accumulating, or an engine poisoned after a first failure)",
        )
    } else {
        (
            "falls",
            "a rate that falls over the arm is not one rate at one load (a cold engine: \
             warm-up, caches filling, the first wave's burst)",
        )
    };
    format!(
        "arm {}: corruption {moves} with request index (Cochran-Armitage z = {:.1}, p = {}): \
         {}/{} in the first {} ({}), {}/{} in the last ({}); {why}",
        arm.name(),
        test.z,
        p_value(test.p),
        first.corrupted,
        first.sessions,
        share(bins.len()),
        place(first),
        last.corrupted,
        last.sessions,
        place(last),
    )
}

/// The `trend` confound: a warning when the corruption rate of an arm moves with its
/// request index, Cochran-Armitage p < `policy.alpha` (the verdict's own level, per
/// arm), over the arm's pooled bins; `None` when neither arm's does (or neither has
/// bins: records without timings). A warning, not blocking: both arms still ran the same
/// workload the same way, so the comparison stands, but each arm's rate is an average
/// over a rate that changed, which the verdict's reasons must carry.
pub fn trend_confound(
    on: &ArmObservation,
    off: &ArmObservation,
    policy: &Policy,
) -> Option<Confound> {
    let tested = |arm: &ArmObservation| test(&arm.stats.trend);
    let significant =
        |arm: &ArmObservation| tested(arm).filter(|t| t.p < policy.alpha && t.z != 0.0);
    let notes: Vec<String> = [on, off]
        .into_iter()
        .filter_map(|arm| Some(describe(arm, significant(arm)?)))
        .collect();
    if notes.is_empty() {
        return None;
    }
    let value = |arm: &ArmObservation| {
        tested(arm).map_or(
            Value::Null,
            |t| json!({"z": t.z, "p": t.p, "bins": arm.stats.trend.len()}),
        )
    };
    Some(Confound {
        name: "trend".to_string(),
        on: value(on),
        off: value(off),
        severity: Severity::Warning,
        note: format!(
            "{}; see report.html, \"Corruption against time\"",
            notes.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arm_stats::{ArmLabel, ArmStats};
    use crate::testing::trend_timeline as timeline;
    use crate::trend::bin;
    use std::collections::BTreeMap;

    fn observation<'a>(
        label: ArmLabel,
        stats: &'a ArmStats,
        empty: &'a BTreeMap<String, String>,
        workload: &'a Value,
    ) -> ArmObservation<'a> {
        ArmObservation {
            label,
            value: if label == ArmLabel::On { "1" } else { "0" },
            block: None,
            replica: None,
            stats,
            readback: empty,
            effective: empty,
            workload,
        }
    }

    #[test]
    fn a_rising_arm_is_a_warning_in_words_and_a_flat_one_is_nothing() {
        let (empty, workload) = (BTreeMap::new(), Value::Null);
        let rising = ArmStats {
            trend: bin(&timeline(80, |i| i >= 70 || i == 35)),
            ..ArmStats::default()
        };
        let flat = ArmStats {
            trend: bin(&timeline(80, |i| i % 5 == 0)),
            ..ArmStats::default()
        };
        let on = observation(ArmLabel::On, &rising, &empty, &workload);
        let off = observation(ArmLabel::Off, &flat, &empty, &workload);
        let policy = Policy::default();
        let c = trend_confound(&on, &off, &policy).expect("the rising arm fires");
        assert_eq!((c.name.as_str(), c.severity), ("trend", Severity::Warning));
        assert!(
            c.note.starts_with(
                "arm on (=1): corruption rises with request index (Cochran-Armitage z = "
            ),
            "{}",
            c.note
        );
        assert!(
            c.note.contains(
                "0/10 in the first eighth (requests 0-9, uptime 0.6 s), \
                 10/10 in the last (requests 70-79, uptime 9.3 s); a rate that grows"
            ),
            "{}",
            c.note
        );
        assert!(!c.note.contains("arm off"), "{}", c.note);
        assert_eq!(c.on["bins"], 8);
        assert!(c.off["p"].as_f64().unwrap() > 0.5);
        // Neither arm moving, or no timings at all (older records): nothing.
        let none = ArmStats::default();
        let quiet = observation(ArmLabel::On, &flat, &empty, &workload);
        assert_eq!(trend_confound(&quiet, &off, &policy), None);
        let old = observation(ArmLabel::On, &none, &empty, &workload);
        let old_off = observation(ArmLabel::Off, &none, &empty, &workload);
        assert_eq!(trend_confound(&old, &old_off, &policy), None);
    }

    #[test]
    fn a_falling_arm_says_so() {
        let (empty, workload) = (BTreeMap::new(), Value::Null);
        let falling = ArmStats {
            trend: bin(&timeline(30, |i| i < 6)),
            ..ArmStats::default()
        };
        let flat = ArmStats::default();
        let on = observation(ArmLabel::On, &flat, &empty, &workload);
        let off = observation(ArmLabel::Off, &falling, &empty, &workload);
        let c = trend_confound(&on, &off, &Policy::default()).unwrap();
        assert!(
            c.note.starts_with("arm off (=0): corruption falls"),
            "{}",
            c.note
        );
        assert!(c.note.contains("in the first sixth"), "{}", c.note);
        assert_eq!(c.on, Value::Null);
    }
}
