//! The adaptive schedule, stopping loop and verdict, driven by scripted block
//! outcomes.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::arm_stats::ArmStats;
use crate::evidence::{ArmObservation, Policy, Severity};
use crate::sequential::Direction;
use crate::session::SessionClass;
use crate::verdict::Status;

fn spec(concurrency: u64, max_sessions: Option<u64>) -> AdaptiveSpec {
    AdaptiveSpec {
        goal: DesignGoal::default(),
        concurrency,
        max_sessions,
    }
}

/// `corrupted` of `n` sessions corrupt: the first ones by index.
fn block(n: u64, corrupted: u64) -> BlockOutcome {
    BlockOutcome {
        sessions: (0..n).map(|i| Some(i < corrupted)).collect(),
        restart_s: 1.0,
        drive_s: 0.05 * n as f64,
    }
}

/// Runs the schedule with a per-arm scripted outcome until it ends.
fn run(schedule: &mut Schedule, outcome: impl Fn(ArmLabel, u64) -> BlockOutcome) {
    while let Some(next) = schedule.next_block() {
        schedule
            .block_done(outcome(next.label, next.sessions))
            .unwrap();
    }
}

#[test]
fn blocks_alternate_abba_at_the_load_and_the_cap_ends_underpowered() {
    let mut s = Schedule::new(spec(10, Some(25))).unwrap();
    // The cap is rounded up to whole blocks of the concurrency.
    assert_eq!(s.record().design.max_per_arm, 30);
    assert_eq!(s.record().design.cap_source, CapSource::MaxSessions);
    // Equal rates: never implicated, never inside +-5 points within 30 per arm.
    run(&mut s, |_, n| block(n, n / 5));
    let r = s.record();
    let order: Vec<(&str, u64)> = r
        .blocks
        .iter()
        .map(|b| (b.label.as_str(), b.sessions))
        .collect();
    assert_eq!(
        order,
        [
            ("on", 10),
            ("off", 10),
            ("off", 10),
            ("on", 10),
            ("on", 10),
            ("off", 10)
        ]
    );
    assert_eq!(r.sessions_per_arm(), (30, 30));
    let Some(Decision::Underpowered { interval }) = r.decision else {
        panic!("{:?}", r.decision);
    };
    let last = r.looks.last().unwrap();
    assert_eq!(last.record.decision, r.decision.unwrap());
    assert_eq!(last.record.diff_interval, interval);
    assert!(interval[0] < -0.05 && interval[1] > 0.05, "{interval:?}");
    // Blocks of 10 are one sub-block each: one look per pair.
    assert_eq!(r.looks.len(), 3);
    assert_eq!((last.pair, last.sub_block), (3, 1));
    assert!(s.next_block().is_none());
    assert_eq!(s.block_done(block(10, 0)), Err(AdaptiveError::Finished));
}

/// Pairs taken two at a time (two replica sets, one pair each) give the schedule the
/// same blocks, looks and decision as one pair after another; a pair after the
/// deciding one is refused, and one handed back out of order too.
#[test]
fn pairs_run_at_once_on_lanes_decide_as_pairs_one_after_another() {
    let outcome = |label: ArmLabel, n: u64| block(n, if label == ArmLabel::On { 8 } else { 0 });
    let mut serial = Schedule::new(spec(20, Some(400))).unwrap();
    run(&mut serial, outcome);
    let mut lanes = Schedule::new(spec(20, Some(400))).unwrap();
    let mut refused = 0;
    loop {
        let pairs = lanes.next_pairs(2);
        if pairs.is_empty() {
            break;
        }
        assert_eq!(pairs.len(), 2);
        // Crossover: the lanes' pairs lead with opposite arms.
        assert_eq!(
            (pairs[0][0].label, pairs[1][0].label),
            (ArmLabel::On, ArmLabel::Off)
        );
        for pair in &pairs {
            let outcomes = (*pair).map(|b| outcome(b.label, b.sessions));
            match lanes.pair_done(pair, outcomes) {
                Ok(_) => {}
                Err(AdaptiveError::Finished) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert_eq!(lanes.record().blocks, serial.record().blocks);
    assert_eq!(lanes.record().decision, serial.record().decision);
    assert_eq!(lanes.record().looks.len(), serial.record().looks.len());
    // Decided at pair 2 (the second of the first round): nothing left over.
    assert_eq!(refused, 0);

    // Capped at 30 per arm in blocks of 10: a round of two pairs, then one.
    let mut capped = Schedule::new(spec(10, Some(30))).unwrap();
    assert_eq!(capped.next_pairs(2).len(), 2);
    let first = capped.next_pairs(2);
    let second = first[1];
    assert_eq!(
        capped.pair_done(&second, second.map(|b| block(b.sessions, 0))),
        Err(AdaptiveError::OutOfOrder { block: 2, due: 0 })
    );
    for pair in &first {
        capped
            .pair_done(pair, (*pair).map(|b| block(b.sessions, 1)))
            .unwrap();
    }
    assert_eq!(capped.next_pairs(2).len(), 1);
}

#[test]
fn a_strong_effect_is_implicated_at_the_second_pair_of_whole_blocks() {
    // Blocks of 20 = one e-process factor per pair. The first factor is exactly 1 (no
    // earlier data); the second, 8/20 vs 0/20 with plug-ins from the first pair
    // (0.40 and 0.0088, Beta(0.18, 0.18) posterior means), is
    // exp(8 ln(.4019/.2054) + 12 ln(.5981/.7946) + 20 ln(.9912/.7946)) = 590 >= 100.
    let mut s = Schedule::new(spec(20, Some(400))).unwrap();
    run(&mut s, |label, n| {
        block(n, if label == ArmLabel::On { 8 } else { 0 })
    });
    let r = s.record();
    assert_eq!(
        r.decision,
        Some(Decision::Implicated {
            direction: Direction::On
        })
    );
    assert_eq!(r.looks.len(), 2);
    assert_eq!(r.looks[0].record.e_value, 1.0);
    let e = r.looks[1].record.e_value;
    assert!((e / 590.0 - 1.0).abs() < 0.01, "e-value {e}");
    assert_eq!(r.sessions_per_arm(), (40, 40));
    assert!(r.blocks.iter().all(|b| b.fed == 20));
}

#[test]
fn large_blocks_feed_the_e_process_in_index_sub_blocks_and_drain_the_rest() {
    // Blocks of 80: four factors of 20 per pair, so the first pair can decide. The
    // sessions after the deciding sub-look still ran and count in the pooled arms, but
    // not in the e-process.
    let mut s = Schedule::new(spec(80, Some(800))).unwrap();
    run(&mut s, |label, n| BlockOutcome {
        // on: every second session corrupt; off: none.
        sessions: (0..n)
            .map(|i| Some(label == ArmLabel::On && i % 2 == 0))
            .collect(),
        restart_s: 1.0,
        drive_s: 4.0,
    });
    let r = s.record();
    assert!(matches!(r.decision, Some(Decision::Implicated { .. })));
    assert_eq!(r.blocks.len(), 2, "decided within the first pair");
    let last = r.looks.last().unwrap();
    assert_eq!(last.pair, 1);
    assert!(last.sub_block < 4, "decided before the last sub-block");
    assert_eq!(r.blocks[0].fed, 20 * last.sub_block);
    assert_eq!(r.blocks[0].sessions, 80);
    assert_eq!(r.blocks[0].corrupted, 40);
    assert_eq!(last.record.on.sessions, 20 * last.sub_block);
}

#[test]
fn clean_arms_clear_after_140_sessions_per_arm() {
    // docs/sequential.md: A/A at 0% clears after 140 sessions per arm (looks of 20):
    // the Jeffreys-mixture upper bound at 0/140 with 2.5% per arm is below 5 points.
    let mut s = Schedule::new(spec(20, Some(1000))).unwrap();
    run(&mut s, |_, n| block(n, 0));
    let r = s.record();
    assert_eq!(r.decision, Some(Decision::Cleared));
    assert_eq!(r.sessions_per_arm(), (140, 140));
    let [lo, hi] = r.looks.last().unwrap().record.diff_interval;
    assert!(lo > -0.05 && hi < 0.05);
    let before = r.looks[r.looks.len() - 2].record.diff_interval;
    assert!(
        before[1] >= 0.05,
        "not cleared one look earlier: {before:?}"
    );
}

#[test]
fn failed_sessions_are_left_out_of_the_counts() {
    let mut s = Schedule::new(spec(4, Some(8))).unwrap();
    let outcome = BlockOutcome {
        sessions: vec![Some(true), None, Some(false), None],
        restart_s: 0.5,
        drive_s: 1.0,
    };
    assert_eq!(s.block_done(outcome.clone()), Ok(None));
    assert!(s.block_done(outcome).unwrap().is_some());
    let b = &s.record().blocks[0];
    assert_eq!((b.sessions, b.classified, b.corrupted), (4, 2, 1));
    let look = s.record().looks[0].record;
    assert_eq!((look.on.corrupted, look.on.sessions), (1, 2));
    // A block that comes back with the wrong number of sessions is refused.
    assert_eq!(
        s.block_done(block(3, 0)),
        Err(AdaptiveError::Outcomes {
            block: 2,
            planned: 4,
            got: 3
        })
    );
}

#[test]
fn a_stop_ends_the_run_and_a_cap_below_the_load_is_refused() {
    let mut s = Schedule::new(spec(4, Some(40))).unwrap();
    s.block_done(block(4, 0)).unwrap();
    s.block_done(block(4, 0)).unwrap();
    s.stop("readback failed".into());
    assert!(s.finished() && s.next_block().is_none());
    assert_eq!(s.record().stopped.as_deref(), Some("readback failed"));
    assert_eq!(
        Schedule::new(spec(10, Some(5))).unwrap_err(),
        AdaptiveError::CapBelowLoad {
            given: 5,
            concurrency: 10
        }
    );
    assert_eq!(
        Schedule::new(spec(0, None)).unwrap_err(),
        AdaptiveError::NoLoad
    );
}

#[test]
fn the_cap_is_planned_for_power_then_for_the_measured_cost() {
    // docs/sequential.md "Block size": blocks of 80 per arm need a cap of 560.
    let mut s = Schedule::new(spec(80, None)).unwrap();
    let d = &s.record().design;
    assert_eq!((d.block_per_arm, d.max_per_arm), (80, 560));
    assert_eq!(d.cap_source, CapSource::Planned);
    // Restarts that cost as much as 400 sessions (a large model): longer blocks.
    let slow_restart = |n: u64| BlockOutcome {
        sessions: vec![Some(false); n as usize],
        restart_s: 600.0,
        drive_s: 1.5 * n as f64,
    };
    s.block_done(slow_restart(80)).unwrap();
    assert_eq!(s.block_done(slow_restart(80)), Ok(Some(Decision::Continue)));
    let d = &s.record().design;
    assert_eq!(d.cap_source, CapSource::PlannedForCost);
    assert_eq!(d.plans.len(), 2);
    assert!(d.block_per_arm > 80, "{d:?}");
    assert_eq!(d.max_per_arm % 80, 0);
    let cost = d.cost_model.unwrap();
    assert_eq!((cost.session_s, cost.restart_s), (1.5, 600.0));
    assert_eq!(s.next_block().unwrap().sessions, d.block_per_arm);
}

fn arm_stats(corrupted: u64, n: u64, peak: u64) -> ArmStats {
    let mut stats = ArmStats::default();
    for i in 0..n {
        stats.counts.add(if i < corrupted {
            SessionClass::Leak
        } else {
            SessionClass::Done
        });
    }
    stats.peak_running = BTreeMap::from([("decode".to_string(), peak)]);
    stats.wall_s = 1.0;
    stats.finish();
    stats
}

#[test]
fn the_verdict_follows_the_sequential_decision_and_every_blocking_check() {
    let mut s = Schedule::new(spec(20, Some(400))).unwrap();
    run(&mut s, |label, n| {
        block(n, if label == ArmLabel::On { 8 } else { 0 })
    });
    let workload = json!({"sessions": 20, "concurrency": 20});
    let (on_stats, off_stats) = (arm_stats(16, 40, 20), arm_stats(0, 40, 20));
    let good_on = BTreeMap::from([("decode".to_string(), "1".to_string())]);
    let good_off = BTreeMap::from([("decode".to_string(), "0".to_string())]);
    let observe = |label, value, stats, readback| ArmObservation {
        label,
        value,
        block: None,
        replica: None,
        stats,
        readback,
        effective: Box::leak(Box::default()),
        workload: &workload,
    };
    let on = observe(ArmLabel::On, "1", &on_stats, &good_on);
    let off = observe(ArmLabel::Off, "0", &off_stats, &good_off);
    let policy = Policy::default();
    let (_, _, v) = verdict(&on, &off, &[], &policy, "F", s.record());
    assert_eq!(v.status, Status::Implicated, "{v:?}");
    assert!(v
        .summary
        .starts_with("implicated: F on (=1) corrupts 16/40"));
    assert!(
        v.summary.contains(" >= 100 after 40 + 40 sessions"),
        "{v:?}"
    );
    assert!(v.summary.contains("sequential e-value 5"), "{v:?}");
    assert!(v
        .reasons
        .iter()
        .any(|r| r.starts_with("for reference only")));

    // The same data with decode reading back the wrong value: blocked.
    let bad_off = BTreeMap::from([("decode".to_string(), "1".to_string())]);
    let off = observe(ArmLabel::Off, "0", &off_stats, &bad_off);
    let (_, _, v) = verdict(&on, &off, &[], &policy, "F", s.record());
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert!(v.reasons[0].contains("read back"), "{v:?}");

    // Cleared, but an engine that never saw the load: inconclusive, with the load.
    let mut c = Schedule::new(spec(20, Some(1000))).unwrap();
    run(&mut c, |_, n| block(n, 0));
    let (low_on, low_off) = (arm_stats(0, 140, 5), arm_stats(0, 140, 5));
    let on = observe(ArmLabel::On, "1", &low_on, &good_on);
    let off = observe(ArmLabel::Off, "0", &low_off, &good_off);
    let (_, _, v) = verdict(&on, &off, &[], &policy, "F", c.record());
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert!(v.summary.contains("a bug that needs load"), "{v:?}");
    let (full_on, full_off) = (arm_stats(0, 140, 20), arm_stats(0, 140, 20));
    let on = observe(ArmLabel::On, "1", &full_on, &good_on);
    let off = observe(ArmLabel::Off, "0", &full_off, &good_off);
    let (_, _, v) = verdict(&on, &off, &[], &policy, "F", c.record());
    assert_eq!(v.status, Status::Cleared, "{v:?}");
    assert!(v.summary.contains("at 20 sessions in flight"), "{v:?}");

    // The same, but one block pair failed a blocking check on its own (hidden in
    // the pooled arms): the check blocks the verdict, it is not only recorded.
    let mut failed_pair = c.clone();
    failed_pair.add_check(PairCheck {
        pair: 2,
        pair_blocking: vec![
            "degraded: not a same-speed toggle: arm on (=1) had 0 error \
                                 and 4 timeout sessions of 20 (20.0% > 10.0%)"
                .into(),
        ],
        pooled_blocking: Vec::new(),
        load_shortfall: Vec::new(),
    });
    let (_, confounds, v) = verdict(&on, &off, &[], &policy, "F", failed_pair.record());
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert_eq!(confounds[0].name, "block_pair.2");
    assert_eq!(confounds[0].severity, Severity::Blocking);
    assert!(
        v.reasons[0].starts_with("block pair 2 on its own failed a blocking check: degraded"),
        "{v:?}"
    );

    // Cleared by the e-process, but the pooled arms (with the sessions drained after
    // the decision) differ significantly: not cleared.
    // Blocks of 80: cleared at 140 per arm, in the second pair's third sub-block, so
    // 20 sessions per arm ran after the decision.
    let mut big = Schedule::new(spec(80, Some(800))).unwrap();
    run(&mut big, |_, n| block(n, 0));
    assert_eq!(big.record().decision, Some(Decision::Cleared));
    assert_eq!(big.record().sessions_per_arm(), (160, 160));
    assert_eq!(big.record().blocks[3].fed, 60);
    let (hot_on, cold_off) = (arm_stats(20, 160, 80), arm_stats(0, 160, 80));
    let on = observe(ArmLabel::On, "1", &hot_on, &good_on);
    let off = observe(ArmLabel::Off, "0", &cold_off, &good_off);
    let (_, _, v) = verdict(&on, &off, &[], &policy, "F", big.record());
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert!(
        v.summary.contains("says cleared, but the pooled arms"),
        "{v:?}"
    );

    // The cap: underpowered, with the interval reached.
    let mut u = Schedule::new(spec(10, Some(20))).unwrap();
    run(&mut u, |_, n| block(n, n / 5));
    let (_, _, v) = verdict(&on, &off, &[], &policy, "F", u.record());
    assert_eq!(v.status, Status::Inconclusive);
    assert!(
        v.summary
            .contains("underpowered: the cap of 20 sessions per arm"),
        "{v:?}"
    );
}
