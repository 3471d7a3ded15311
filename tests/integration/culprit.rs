//! `bisect culprit` against the fake engine, whose bugs are known exactly: the racy flag
//! is found with exact counts, a speed-only flag is not, a slow flag is set aside as
//! degraded, the budget holds, and bad requests are refused with exit 2 before any edit.

use crate::common::bisect;
use std::time::Duration;

use bisect_harness::commands::culprit::{self, CulpritPlan};
use bisect_harness::commands::run::Quiet;
use bisect_harness::config::Workload;
use bisect_harness::core::arm_stats::RecordStatus;
use bisect_harness::core::verdict::{Policy, Status};
use tokio_util::sync::CancellationToken;

use crate::common::{fake_race_victims, FakeTarget};

fn culprit_plan(t: &FakeTarget, flags: &[&str], budget: u64, rounds: u32) -> CulpritPlan {
    let mut workload = Workload::load("smoke").unwrap();
    workload.rounds = rounds;
    workload.timeout_s = 5.0;
    let results = t.dir.path().join("results");
    CulpritPlan {
        id: "test-culprit".into(),
        command: format!("bisect culprit --flags {}", flags.join(",")),
        flags: flags
            .iter()
            .map(|f| t.catalog.get(f).unwrap().clone())
            .collect(),
        target: t.target.clone(),
        workload,
        budget,
        policy: Policy::default(),
        dir: results.join("test-culprit"),
        journal_dir: results.join(".bisect-journal"),
        state_root: Some(t.dir.path().join("state")),
        allow_partial: false,
        api_key: None,
        metrics_period: Duration::from_millis(50),
    }
}

/// The race victims among `sessions` sessions of look `look` (seed + look - 1).
fn victims(workload: &Workload, look: u32, sessions: u64) -> u64 {
    let mut w = workload.clone();
    w.seed += u64::from(look - 1);
    fake_race_victims(&w, sessions as u32)
}

fn flag<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing from {json}"))
}

fn arm(flag: &serde_json::Value, label: &str) -> serde_json::Value {
    flag["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["label"] == label)
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racy_flag_is_the_culprit_within_budget() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = culprit_plan(&t, &["FAKE_BF16", "FAKE_NOISE"], 400, 4);
    let n0 = 50;
    assert_eq!(culprit::allocate::screening_sessions_per_arm(400, 2), n0);
    let bf16_victims = victims(&plan.workload, 1, n0);
    assert!(
        bf16_victims >= 8,
        "too few race victims ({bf16_victims}) for a decisive test"
    );
    let mut control = t.engine.control();
    let record = culprit::run(&plan, &mut control, &Quiet, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(
        t.launch_bytes(),
        before,
        "launch configs restored byte for byte"
    );
    assert_eq!(record.status, RecordStatus::Finished);
    let names: Vec<&str> = record.culprits.iter().map(|c| c.flag.as_str()).collect();
    assert_eq!(names, ["FAKE_BF16"]);
    assert!(
        record.culprits[0].direction.starts_with("on (=1) corrupts"),
        "{:?}",
        record.culprits
    );

    // FAKE_BF16 is decided at screening with exactly the fake's victims, and gets nothing more.
    let bf16 = record.flags.iter().find(|f| f.name == "FAKE_BF16").unwrap();
    assert_eq!(bf16.status, Status::Implicated, "{bf16:?}");
    assert_eq!(bf16.looks, 1);
    assert_eq!(bf16.arms[0].stats.counts.leak, bf16_victims);
    assert_eq!(bf16.arms[0].stats.counts.done, n0 - bf16_victims);
    assert_eq!(bf16.arms[1].stats.counts.done, n0);
    assert!(bf16.p_adjusted < record.alpha_per_look);

    // FAKE_NOISE changes only speed: both arms leak the same victims, look after look.
    let noise = record
        .flags
        .iter()
        .find(|f| f.name == "FAKE_NOISE")
        .unwrap();
    assert_ne!(noise.status, Status::Implicated, "{noise:?}");
    let extra = culprit::allocate::extra_look_sizes(400, 2);
    assert_eq!(extra, vec![50, 50]);
    assert_eq!(
        noise.looks, 3,
        "the whole rest of the budget goes to the open flag"
    );
    let noise_victims: u64 = (1..=3).map(|j| victims(&plan.workload, j, 50)).sum();
    assert_eq!(noise.arms[0].stats.counts.leak, noise_victims);
    assert_eq!(noise.arms[1].stats.counts.leak, noise_victims);
    assert_eq!(noise.p_value, 1.0);

    // The budget holds, and every pair is counted.
    let per_look: u64 = record.looks.iter().map(|l| 2 * l.sessions_per_arm).sum();
    assert_eq!(record.sessions_spent, per_look);
    assert_eq!(record.sessions_spent, 400);
    assert!(record.sessions_spent <= record.budget);
    assert_eq!(record.max_looks, 3);

    // Artefacts: culprit.json, summary.md, and one normal run directory per look.
    let dir = &plan.dir;
    let json: serde_json::Value =
        serde_json::from_str(&crate::common::read(&dir.join("culprit.json"))).unwrap();
    assert_eq!(json["schema"], "bisect.culprit/1");
    assert_eq!(json["culprits"][0]["flag"], "FAKE_BF16");
    let bf16_json = flag(&json, "FAKE_BF16");
    assert_eq!(bf16_json["status"], "implicated");
    assert_eq!(arm(bf16_json, "on")["corrupted"], bf16_victims);
    assert!(arm(bf16_json, "on")["ci95"][0].as_f64().unwrap() > 0.0);
    assert!(bf16_json["diff_ci95"][0].as_f64().unwrap() > 0.0);
    assert_eq!(
        flag(&json, "FAKE_NOISE")["runs"],
        serde_json::json!([
            "flags/FAKE_NOISE",
            "flags/FAKE_NOISE-look2",
            "flags/FAKE_NOISE-look3"
        ])
    );
    for run in [
        "flags/FAKE_BF16",
        "flags/FAKE_NOISE",
        "flags/FAKE_NOISE-look3",
    ] {
        let run_json: serde_json::Value =
            serde_json::from_str(&crate::common::read(&dir.join(run).join("run.json"))).unwrap();
        assert_eq!(run_json["status"], "finished", "{run}");
        assert_eq!(run_json["arms"].as_array().unwrap().len(), 2, "{run}");
    }
    let look3: serde_json::Value = serde_json::from_str(&crate::common::read(
        &dir.join("flags/FAKE_NOISE-look3/run.json"),
    ))
    .unwrap();
    assert_eq!(look3["workload"]["seed"], plan.workload.seed + 2);
    let summary = crate::common::read(&dir.join("summary.md"));
    assert!(
        summary.contains("FAKE_BF16") && summary.contains("implicated"),
        "{summary}"
    );
    let table = culprit::record::render_table(&record);
    let bf16_row = table.find("│ FAKE_BF16").unwrap();
    let noise_row = table.find("│ FAKE_NOISE").unwrap();
    assert!(bf16_row < noise_row, "sorted by adjusted p:\n{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_flag_is_degraded_and_gets_no_more_budget() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let mut plan = culprit_plan(&t, &["FAKE_SLOW", "FAKE_NOISE"], 128, 2);
    plan.workload.timeout_s = 0.2;
    let mut control = t.engine.control();
    let record = culprit::run(&plan, &mut control, &Quiet, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(t.launch_bytes(), before);
    let slow = record.flags.iter().find(|f| f.name == "FAKE_SLOW").unwrap();
    assert_eq!(slow.status, Status::Inconclusive, "{slow:?}");
    assert!(slow.degraded);
    assert!(
        slow.reasons[0].contains("degraded, not a same-speed toggle"),
        "{slow:?}"
    );
    assert_eq!(slow.looks, 1, "a degraded flag gets no extra look");
    assert_eq!(slow.sessions, 32);
    assert_eq!(slow.arms[0].stats.counts.timeout, 16);
    let noise = record
        .flags
        .iter()
        .find(|f| f.name == "FAKE_NOISE")
        .unwrap();
    assert_eq!(noise.looks, 3, "{noise:?}");
    assert!(record.culprits.is_empty());
    assert_eq!(record.sessions_spent, 128);
    assert!(record.sessions_spent <= record.budget);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_before_any_edit() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let cases: [(&[&str], u64, &str); 4] = [
        (&["FAKE_BF16"], 400, "at least 2 flags"),
        (&["FAKE_BF16", "FAKE_NOISE", "FAKE_BF16"], 400, "twice"),
        (&["FAKE_BF16", "FAKE_NOISE"], 31, "too small"),
        (&["FAKE_NOISE", "FAKE_BF16_DECODE_ONLY"], 400, "prefill"),
    ];
    for (flags, budget, message) in cases {
        let plan = culprit_plan(&t, flags, budget, 2);
        let mut control = t.engine.control();
        let err = culprit::run(&plan, &mut control, &Quiet, CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(
            bisect_harness::exit::code_for_error(&err),
            2,
            "{flags:?}: {err:#}"
        );
        assert!(format!("{err:#}").contains(message), "{flags:?}: {err:#}");
        assert_eq!(t.engine.requests(), 0, "{flags:?}");
        assert!(!plan.dir.exists(), "{flags:?}: nothing written");
    }
    assert_eq!(t.launch_bytes(), before);
    // The smallest budget that pays a screening pair per flag is accepted.
    assert!(culprit::check_request(
        &culprit_plan(&t, &["FAKE_BF16", "FAKE_NOISE"], 32, 2).flags,
        32
    )
    .is_ok());
}

#[test]
fn binary_exits_2_on_bad_input_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["culprit", "--flags", "BF16_INDEX_K"][..],
        &["culprit", "--flags", "BF16_INDEX_K,NO_SUCH_FLAG"][..],
        &[
            "culprit",
            "--flags",
            "BF16_INDEX_K,HICACHE",
            "--budget",
            "20",
        ][..],
        &["culprit", "--flags", "BF16_INDEX_K,HICACHE", "--alpha", "2"][..],
        &[
            "culprit",
            "--flags",
            "BF16_INDEX_K,HICACHE",
            "--sessions",
            "80",
        ][..],
    ] {
        let out = bisect(args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("fix"), "{args:?}: {stderr}");
    }
    assert!(
        !dir.path().join("results").exists(),
        "a refused search writes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_would_lower_the_load_is_refused() {
    let t = FakeTarget::new().await;
    let mut plan = culprit_plan(&t, &["FAKE_BF16", "FAKE_NOISE"], 64, 2);
    // Screening looks of 64 / (4 * 2) = 8 sessions per arm, below a load of 32.
    plan.workload.sessions = 32;
    let err = plan.validate().unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("below the load of 32"), "{msg}");
    assert!(msg.contains("fix: pass --budget 256"), "{msg}");
    assert_eq!(
        bisect_harness::exit::code_for_error(&err),
        bisect_harness::exit::BAD_INPUT
    );
}
