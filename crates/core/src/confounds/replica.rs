//! The replica x arm confound (docs/design.md 3.7, "Replicas"): when the arms of a run
//! ran at the same time on several replica sets, a replica that corrupts more whatever
//! the flag (another build, a bad GPU, a warmer cache) is a difference between the arms
//! unless every arm ran equally on every replica.
//!
//! Blocks cross over (replica a runs `on` while b runs `off`, then the other way), so a
//! replica's own rate enters both arms equally and cancels in their difference, as a
//! period effect cancels in a two-period crossover trial (Jones & Kenward, *Design and
//! Analysis of Cross-Over Trials*, 3rd ed., 2014, ch. 2). The test of the replicas is
//! Fisher's exact test of each replica's corruption, pooled over both arms, against the
//! other replicas' (Bonferroni over the replicas where there are more than two):
//! - replicas that differ, the arms balanced over them: a warning (the difference is
//!   reported, and cancels);
//! - replicas that differ, an arm that ran more of its blocks on one of them (an odd
//!   number of pairs, a block lost to a cancel): blocking, since the comparison of the
//!   arms could be the comparison of the replicas;
//! - replicas that do not differ: recorded (info), with each replica's rate per arm.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::arm_stats::ArmLabel;
use crate::evidence::{ArmObservation, Confound, Policy, Severity};
use crate::format::{p_value, percent_digits};
use crate::stats::{fisher_exact_two_sided, rate};

/// One replica's blocks: corrupted and judged sessions, and blocks, per arm.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    corrupted: [u64; 2],
    judged: [u64; 2],
    blocks: [u64; 2],
}

impl Tally {
    fn corrupted(&self) -> u64 {
        self.corrupted.iter().sum()
    }
    fn judged(&self) -> u64 {
        self.judged.iter().sum()
    }
    fn arm(&self, i: usize) -> String {
        format!("{}/{}", self.corrupted[i], self.judged[i])
    }
}

/// Which of the two arms a block is; `None` for a probe (no arm).
fn arm_index(label: ArmLabel) -> Option<usize> {
    match label {
        ArmLabel::On => Some(0),
        ArmLabel::Off => Some(1),
        ArmLabel::Probe => None,
    }
}

/// The replica x arm confound of `blocks` (each block of a run, with the replica it ran
/// on), `None` unless they ran on two replicas or more.
pub(crate) fn replica_confound(blocks: &[ArmObservation], policy: &Policy) -> Option<Confound> {
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    for block in blocks {
        let (Some(replica), Some(i)) = (block.replica, arm_index(block.label)) else {
            continue;
        };
        let t = tallies.entry(replica).or_default();
        t.corrupted[i] += block.corrupted();
        t.judged[i] += block.judged();
        t.blocks[i] += 1;
    }
    if tallies.len() < 2 {
        return None;
    }
    let (corrupted, judged): (u64, u64) = tallies
        .values()
        .fold((0, 0), |(c, n), t| (c + t.corrupted(), n + t.judged()));
    // Each replica against the others pooled; Bonferroni where there are more than two
    // (with two, both tests are the same table).
    let tests = if tallies.len() == 2 { 1 } else { tallies.len() };
    // The replica named is the one least like the rest, the higher rate on a tie (two
    // replicas give one table).
    let (worst, p, _) = tallies
        .iter()
        .map(|(name, t)| {
            let (k, n) = (t.corrupted(), t.judged());
            let p = fisher_exact_two_sided(k, n - k, corrupted - k, (judged - n) - (corrupted - k));
            (*name, (p * tests as f64).min(1.0), rate(k, n))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1).then(b.2.total_cmp(&a.2)))?;
    let differ = p < policy.alpha;
    let balanced = tallies.values().all(|t| t.blocks[0] == t.blocks[1]);
    let rates: Vec<String> = tallies
        .iter()
        .map(|(name, t)| {
            format!(
                "replica {name} {}/{} ({}%)",
                t.corrupted(),
                t.judged(),
                percent_digits(rate(t.corrupted(), t.judged()))
            )
        })
        .collect();
    let blocks_words: Vec<String> = tallies
        .iter()
        .map(|(name, t)| format!("{name}: on {}, off {}", t.blocks[0], t.blocks[1]))
        .collect();
    let (severity, note) = match (differ, balanced) {
        (false, _) => (
            Severity::Info,
            format!(
                "the replicas corrupted alike over both arms ({}; Fisher p = {})",
                rates.join(", "),
                p_value(p)
            ),
        ),
        (true, true) => (
            Severity::Warning,
            format!(
                "replica {worst} differs from the others whatever the flag ({}; Fisher p = {}); \
                 every arm ran as many blocks on each replica ({}), so the difference enters \
                 both arms alike and cancels in their comparison; check replica {worst} \
                 (its build, device, configuration)",
                rates.join(", "),
                p_value(p),
                blocks_words.join("; ")
            ),
        ),
        (true, false) => (
            Severity::Blocking,
            format!(
                "replica {worst} differs from the others whatever the flag ({}; Fisher p = {}) \
                 and the arms ran unevenly on the replicas (blocks {}): the comparison of the \
                 arms could be the comparison of the replicas; run an even number of pairs \
                 (--repeats 2) so every arm runs as much on each replica",
                rates.join(", "),
                p_value(p),
                blocks_words.join("; ")
            ),
        ),
    };
    let per_arm = |i: usize| -> Value {
        Value::Object(
            tallies
                .iter()
                .map(|(name, t)| (name.to_string(), json!(t.arm(i))))
                .collect(),
        )
    };
    Some(Confound {
        name: "replica".into(),
        on: per_arm(0),
        off: per_arm(1),
        severity,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arm_stats::ArmStats;
    use crate::session::SessionClass;

    fn stats(corrupted: u64, clean: u64) -> ArmStats {
        let mut s = ArmStats::default();
        for _ in 0..corrupted {
            s.counts.add(SessionClass::BadArgs);
        }
        for _ in 0..clean {
            s.counts.add(SessionClass::Done);
        }
        s
    }

    fn block<'a>(
        label: ArmLabel,
        replica: &'a str,
        stats: &'a ArmStats,
        empty: &'a BTreeMap<String, String>,
    ) -> ArmObservation<'a> {
        ArmObservation {
            label,
            value: if label == ArmLabel::On { "1" } else { "0" },
            block: Some(0),
            replica: Some(replica),
            stats,
            readback: empty,
            effective: empty,
            workload: &Value::Null,
        }
    }

    /// A replica that corrupts 16/40 whatever the flag against one at 0/40: caught
    /// (Fisher p = 1.3e-5 on 16/80 vs 0/80), a warning when each arm ran one block on
    /// each, blocking when an arm ran only on the bad one.
    #[test]
    fn a_bad_replica_is_a_warning_under_crossover_and_blocking_without() {
        let empty = BTreeMap::new();
        let (bad, good) = (stats(8, 32), stats(0, 40));
        let policy = Policy::default();
        let crossed = [
            block(ArmLabel::On, "a", &good, &empty),
            block(ArmLabel::Off, "b", &bad, &empty),
            block(ArmLabel::Off, "a", &good, &empty),
            block(ArmLabel::On, "b", &bad, &empty),
        ];
        let c = replica_confound(&crossed, &policy).unwrap();
        assert_eq!(c.severity, Severity::Warning, "{}", c.note);
        assert_eq!(c.on, json!({"a": "0/40", "b": "8/40"}));
        assert_eq!(c.off, json!({"a": "0/40", "b": "8/40"}));
        assert!(
            c.note.starts_with(
                "replica b differs from the others whatever the flag (replica a 0/80 (0.0%), \
                 replica b 16/80 (20.0%); Fisher p = 1.3e-5); every arm ran as many blocks"
            ),
            "{}",
            c.note
        );
        assert!(c.note.contains("cancels"), "{}", c.note);
        let p = fisher_exact_two_sided(0, 80, 16, 64);
        assert!(p < 1e-4 && p > 1e-6, "{p}");

        let uneven = [
            block(ArmLabel::On, "b", &bad, &empty),
            block(ArmLabel::Off, "a", &good, &empty),
        ];
        let c = replica_confound(&uneven, &policy).unwrap();
        assert_eq!(c.severity, Severity::Blocking, "{}", c.note);
        assert!(c.note.contains("--repeats 2"), "{}", c.note);
    }

    /// Replicas alike are recorded as such; one replica (or none named) is no confound.
    #[test]
    fn alike_replicas_are_info_and_a_single_replica_is_nothing() {
        let empty = BTreeMap::new();
        let (a, b) = (stats(3, 37), stats(4, 36));
        let policy = Policy::default();
        let crossed = [
            block(ArmLabel::On, "a", &a, &empty),
            block(ArmLabel::Off, "b", &b, &empty),
        ];
        let c = replica_confound(&crossed, &policy).unwrap();
        assert_eq!(c.severity, Severity::Info, "{}", c.note);
        let one = [
            block(ArmLabel::On, "a", &a, &empty),
            block(ArmLabel::Off, "a", &b, &empty),
        ];
        assert!(replica_confound(&one, &policy).is_none());
        let unnamed = [ArmObservation {
            replica: None,
            ..block(ArmLabel::On, "a", &a, &empty)
        }];
        assert!(replica_confound(&unnamed, &policy).is_none());
    }

    /// With three replicas each is tested against the rest, Bonferroni over three: a
    /// p just under alpha alone is not enough.
    #[test]
    fn three_replicas_are_each_tested_against_the_rest_with_bonferroni() {
        let empty = BTreeMap::new();
        let (good, bad) = (stats(1, 59), stats(9, 51));
        let policy = Policy::default();
        let blocks = [
            block(ArmLabel::On, "a", &good, &empty),
            block(ArmLabel::Off, "b", &good, &empty),
            block(ArmLabel::On, "c", &bad, &empty),
            block(ArmLabel::Off, "c", &bad, &empty),
        ];
        let c = replica_confound(&blocks, &policy).unwrap();
        let raw = fisher_exact_two_sided(18, 102, 2, 118);
        assert!(
            c.note
                .contains(&format!("Fisher p = {}", p_value((raw * 3.0).min(1.0)))),
            "{} (raw {raw})",
            c.note
        );
        assert!(c.note.contains("replica c differs"), "{}", c.note);
    }
}
