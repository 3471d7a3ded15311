//! `bisect run --adaptive` against the fake engine, whose race hits the same sessions
//! (by task) in every block: exact counts, so the sequential path is deterministic.

use std::sync::atomic::Ordering;

use bisect_harness::commands::adaptive::run_adaptive;
use bisect_harness::commands::run::AdaptiveOptions;
use bisect_harness::commands::run::{Quiet, RunPlan};
use bisect_harness::core::adaptive::CapSource;
use bisect_harness::core::sequential::{Decision, Direction};
use bisect_harness::core::verdict::Status;
use bisect_harness::results::run_record::RunRecord;
use tokio_util::sync::CancellationToken;

use crate::common::{fake_race_victims, FakeTarget};
use crate::fake::FakeControl;
use bisect_harness::core::session::SessionClass;

/// A run of `flag` with blocks of `load` sessions, all in flight at once.
fn plan_at_load(t: &FakeTarget, flag: &str, load: u32) -> RunPlan {
    let mut plan = t.plan(flag, load, 2);
    plan.workload.concurrency = Some(load);
    plan
}

/// The adaptive run of `plan` against the fake, its cap `max_sessions` per arm (planned
/// where `None`); it must finish.
async fn adaptive(
    plan: &RunPlan,
    control: &mut FakeControl,
    max_sessions: Option<u64>,
) -> RunRecord {
    run_adaptive(
        plan,
        &AdaptiveOptions { max_sessions },
        control,
        &Quiet,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racy_flag_is_implicated_early_at_the_load() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = plan_at_load(&t, "FAKE_BF16", 40);
    let victims = fake_race_victims(&plan.workload, 40);
    assert!(victims >= 6, "too few race victims ({victims})");
    let mut control = t.engine.control();
    // The cap is planned (power 0.8 at 5 points from 1%, blocks of 40), then re-planned
    // from the measured cost after the first pair if that pair does not decide.
    let record = adaptive(&plan, &mut control, None).await;
    let seq = record.adaptive.as_ref().unwrap();
    assert_eq!(
        seq.decision,
        Some(Decision::Implicated {
            direction: Direction::On
        })
    );
    assert_ne!(seq.design.cap_source, CapSource::MaxSessions);
    assert_eq!(seq.design.concurrency, 40);
    // Every block ran the whole block at the load, blocks pair up ABBA.
    assert!(seq.blocks.iter().all(|b| b.sessions == 40));
    let labels: Vec<&str> = seq.blocks.iter().map(|b| b.label.as_str()).collect();
    assert_eq!(&labels[..2], ["on", "off"]);
    assert!(seq.blocks.len() <= 4, "stopped early: {labels:?}");
    let pairs = seq.blocks.len() as u64 / 2;
    let on = record
        .arm(bisect_harness::core::arm_stats::ArmLabel::On)
        .unwrap();
    assert_eq!(on.stats.counts[SessionClass::Leak], victims * pairs);
    assert_eq!(record.runs.len(), seq.blocks.len());
    assert_eq!(
        control.restarts.load(Ordering::Relaxed),
        seq.blocks.len() as u64
    );
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Implicated, "{verdict:?}");
    assert!(
        verdict.summary.contains("sequential e-value"),
        "{verdict:?}"
    );
    assert_eq!(t.launch_bytes(), before, "launch configs restored");

    // run.json: the design, every look, the phases; summary.md shows the path.
    let dir = &plan.run_dir;
    let json: serde_json::Value =
        serde_json::from_str(&crate::common::read(&dir.join("run.json"))).unwrap();
    let looks = json["adaptive"]["looks"].as_array().unwrap();
    assert_eq!(looks.len(), seq.looks.len());
    let last = looks.last().unwrap();
    for key in [
        "pair",
        "sub_block",
        "look",
        "on",
        "off",
        "e_value",
        "threshold",
    ] {
        assert!(!last[key].is_null(), "look lacks {key}: {last}");
    }
    assert_eq!(last["decision"]["status"], "implicated");
    assert_eq!(json["adaptive"]["design"]["alpha"], 0.01);
    assert!(json["adaptive"]["design"]["max_per_arm"].as_u64().unwrap() >= 480);
    assert_eq!(json["phases"]["restarts"], seq.blocks.len() as u64);
    assert!(json["phases"]["drive_s"].as_f64().unwrap() > 0.0);
    let summary = crate::common::read(&dir.join("summary.md"));
    assert!(summary.contains("Sequential looks"), "{summary}");
    assert!(summary.contains("Where the time went"), "{summary}");
    let html = crate::common::read(&dir.join("report.html"));
    assert!(html.contains("Sequential looks"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_arms_at_zero_clear_at_the_load() {
    let t = FakeTarget::new().await;
    let mut plan = plan_at_load(&t, "FAKE_NOISE", 20);
    t.pin(&mut plan, "FAKE_BF16", "0");
    // Long enough requests for the 50 ms metrics poller to see the 20 in flight.
    t.engine.hold_requests(150);
    let mut control = t.engine.control();
    let record = adaptive(&plan, &mut control, Some(400)).await;
    let seq = record.adaptive.as_ref().unwrap();
    assert_eq!(seq.decision, Some(Decision::Cleared));
    // docs/sequential.md: 0 vs 0 clears after 140 sessions per arm.
    assert_eq!(seq.sessions_per_arm(), (140, 140));
    assert_eq!(seq.checks.len(), 7);
    assert!(seq.checks.iter().all(|c| c.pooled_blocking.is_empty()));
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Cleared, "{verdict:?}");
    assert!(
        verdict.summary.contains("at 20 sessions in flight"),
        "{verdict:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_corrupting_arms_reach_the_cap_underpowered() {
    let t = FakeTarget::new().await;
    // The race corrupts both arms alike (FAKE_NOISE only changes speed).
    let plan = plan_at_load(&t, "FAKE_NOISE", 20);
    let mut control = t.engine.control();
    let record = adaptive(&plan, &mut control, Some(40)).await;
    let seq = record.adaptive.as_ref().unwrap();
    assert!(
        matches!(seq.decision, Some(Decision::Underpowered { .. })),
        "{:?}",
        seq.decision
    );
    assert_eq!(seq.sessions_per_arm(), (40, 40));
    assert_eq!(seq.design.cap_source, CapSource::MaxSessions);
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Inconclusive);
    assert!(
        verdict
            .summary
            .contains("underpowered: the cap of 40 sessions per arm"),
        "{verdict:?}"
    );
}

/// An engine that keeps the first arm's value: the adaptive run stops at the first off
/// block, after its restart and before its sessions, as a fixed run does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_ignores_its_config_stops_the_adaptive_run() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    t.engine.ignore_restarts();
    let plan = plan_at_load(&t, "FAKE_BF16", 20);
    let mut control = t.engine.control();
    let err = run_adaptive(
        &plan,
        &AdaptiveOptions {
            max_sessions: Some(200),
        },
        &mut control,
        &Quiet,
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("the engine ran the same FAKE_BF16 in both arms"),
        "{msg}"
    );
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        bisect_harness::exit::COULD_NOT_RUN
    );
    assert_eq!(t.launch_bytes(), before);
}

/// Blocks classify with the target profile's markup families, as a fixed run does: the
/// fake's race leaks DSML, which a hermes-only profile does not count as a leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_blocks_classify_with_the_profiles_markup() {
    use bisect_harness::core::arm_stats::ArmLabel;
    use bisect_harness::core::classify::MarkupFamily;
    let t = FakeTarget::new().await;
    let mut plan = plan_at_load(&t, "FAKE_BF16", 40);
    assert!(fake_race_victims(&plan.workload, 40) >= 6);
    plan.target.markup = vec![MarkupFamily::Hermes];
    let mut control = t.engine.control();
    let record = adaptive(&plan, &mut control, Some(40)).await;
    let on = record.arm(ArmLabel::On).unwrap();
    assert_eq!(on.stats.sessions(), 40);
    assert_eq!(
        on.stats.counts[SessionClass::Leak],
        0,
        "DSML is not a family this profile counts: {:?}",
        on.stats.counts
    );
}
