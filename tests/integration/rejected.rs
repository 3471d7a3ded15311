//! Engine-rejected tool calls end to end (docs/design.md 3.5, `rejected`): the fake decode
//! answers a quarter of the sessions, in round 2 of the on arm, with the HTTP 500
//! llama-server sends when the model's tool-call markup does not parse. With the
//! llama.cpp preset's patterns those sessions are corruption and the flag is
//! implicated; counted as errors, as before, the same run only says the on arm was
//! degraded. `bisect reclassify` judges the kept replies again with the run's patterns.

use std::path::Path;

use bisect_harness::commands::reclassify::reclassify_dir;
use bisect_harness::commands::run::{self as experiment, Quiet, RunPlan};
use bisect_harness::config::{Engine, FlagCatalog};
use bisect_harness::core::arm_stats::ArmLabel;
use bisect_harness::core::session::{SessionClass, SessionResult};
use bisect_harness::core::verdict::Status;
use bisect_harness::results::run_record::{ArmRecord, RunRecord};
use bisect_harness::results::ResultsDir;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::{fake_race_victims, read, FakeTarget};

const SESSIONS: u32 = 64;

/// The fake with a `FAKE_REJECT` flag in its decode launch config and catalog.
async fn rejecting_target() -> FakeTarget {
    rejecting_target_found_at("0").await
}

/// [`rejecting_target`] with FAKE_REJECT at `found` in the launch config as found.
async fn rejecting_target_found_at(found: &str) -> FakeTarget {
    let mut t = FakeTarget::new().await;
    let decode = &t.target.roles[1].launch;
    let text = read(decode).replace("exec ", &format!("export FAKE_REJECT={found}\nexec "));
    std::fs::write(decode, text).unwrap();
    t.engine.reload().unwrap();
    let flags = t.dir.path().join("flags");
    std::fs::write(
        flags.join("FAKE_REJECT.toml"),
        "doc = \"decode answers a quarter of the sessions with llama.cpp's parse-failure 500\"\nenv = \"FAKE_REJECT\"\nroles = [\"decode\"]\non = \"1\"\noff = \"0\"\n",
    )
    .unwrap();
    t.catalog = FlagCatalog::load(&[flags]).unwrap();
    t
}

/// The FAKE_REJECT run, with the race off (its index dtype pinned to 0), into `dir`.
fn plan(t: &FakeTarget, dir: &str, engine: Engine) -> RunPlan {
    let mut plan = t.plan("FAKE_REJECT", SESSIONS, 4);
    t.pin(&mut plan, "FAKE_BF16", "0");
    plan.run_dir = plan.run_dir.with_file_name(dir);
    plan.target.engine = engine;
    plan.target.rejections = engine.rejections();
    plan
}

async fn run(t: &FakeTarget, plan: &RunPlan) -> RunRecord {
    let mut control = t.engine.control();
    experiment::run_experiment(plan, &mut control, &Quiet, CancellationToken::new())
        .await
        .unwrap()
}

/// The on arm's race victims came back rejected and the rest of its sessions done.
#[track_caller]
fn assert_victims_rejected(on: &ArmRecord, victims: u64) {
    assert_eq!(on.stats.counts[SessionClass::Rejected], victims);
    assert_eq!(
        on.stats.counts[SessionClass::Done],
        u64::from(SESSIONS) - victims
    );
}

/// The sessions of the run in `dir` that the engine rejected.
fn rejected_sessions(dir: &Path) -> Vec<SessionResult> {
    let sessions = ResultsDir::open(dir).read_sessions().unwrap();
    sessions
        .into_iter()
        .filter(|s| s.class == SessionClass::Rejected)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_rejections_implicate_the_flag_as_corruption_does() {
    let t = rejecting_target().await;
    let plan = plan(&t, "llamacpp", Engine::Llamacpp);
    let victims = fake_race_victims(&plan.workload, SESSIONS);
    assert!(
        u64::from(SESSIONS) * 10 < victims * 100,
        "too few victims ({victims}) for the error count to degrade the arm"
    );
    let record = run(&t, &plan).await;
    let on = record.arm(ArmLabel::On).unwrap();
    let off = record.arm(ArmLabel::Off).unwrap();
    assert_victims_rejected(on, victims);
    assert_eq!(on.stats.counts[SessionClass::Error], 0);
    assert_eq!(on.stats.corrupted, victims);
    assert_eq!(on.stats.judged(), u64::from(SESSIONS));
    assert_eq!(on.stats.first_bad_round, vec![0, victims]);
    assert_eq!(off.stats.counts[SessionClass::Done], u64::from(SESSIONS));
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Implicated, "{verdict:?}");
    assert!(
        verdict.direction.as_deref().unwrap().starts_with("on"),
        "{verdict:?}"
    );
    assert!(
        !record.confounds.iter().any(|c| c.name == "error_timeout"),
        "{:?}",
        record.confounds
    );

    // The evidence is the engine's own reply; the session is no failure.
    let dir = &plan.run_dir;
    let rejected = rejected_sessions(dir);
    assert_eq!(rejected.len() as u64, victims);
    for s in &rejected {
        assert!(
            s.evidence.starts_with(
                "rejected[llamacpp.format]: HTTP 500: {\"error\":{\"code\":500,\"message\":\"The model produced output that does not match the expected Hermes 2 Pro format\""
            ),
            "{}",
            s.evidence
        );
        assert_eq!(s.error, None);
        let http = s.rounds[1].http.as_ref().unwrap();
        assert_eq!(
            (http.status, http.body.as_str()),
            (500, crate::fake::LLAMA_REJECTION)
        );
    }
    let run_json: Value = serde_json::from_str(&read(&dir.join("run.json"))).unwrap();
    assert_eq!(
        run_json["target"]["rejections"][0]["name"],
        "llamacpp.format"
    );
    let on_json = run_json["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["label"] == "on")
        .unwrap();
    assert_eq!(on_json["counts"]["rejected"], victims);
    let summary = read(&dir.join("summary.md"));
    assert!(
        summary.contains("leak/bad/wrong/no_tool/rejected"),
        "{summary}"
    );
    assert!(summary.contains(&format!("0/0/0/0/{victims}")), "{summary}");
    assert!(read(&dir.join("report.html")).contains("rejected (the engine refused"));

    // Replayed under the run's own patterns, nothing changes.
    let again = reclassify_dir(dir, None).unwrap();
    assert!(again.changed.is_empty(), "{:?}", again.changed);
    assert_eq!(
        again.record.verdict.as_ref().unwrap().status,
        Status::Implicated
    );
}

/// llama-server streaming: the parse failure arrives as an error event after HTTP 200
/// and a first chunk, with no `[DONE]`. Those rounds are the engine's rejections (once
/// they were assembled into a reply of the partial text and judged `no_tool`/`leak`),
/// with the partial text as evidence, and the flag that provokes them is implicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_rejections_mid_stream_implicate_the_flag() {
    let t = rejecting_target().await;
    let mut plan = plan(&t, "llamacpp-stream", Engine::Llamacpp);
    plan.workload.request.stream = true;
    let victims = fake_race_victims(&plan.workload, SESSIONS);
    let record = run(&t, &plan).await;
    let on = record.arm(ArmLabel::On).unwrap();
    let off = record.arm(ArmLabel::Off).unwrap();
    assert_victims_rejected(on, victims);
    assert_eq!(
        (
            on.stats.counts[SessionClass::Error],
            on.stats.counts[SessionClass::Leak],
            on.stats.counts[SessionClass::NoTool]
        ),
        (0, 0, 0)
    );
    assert_eq!(off.stats.counts[SessionClass::Done], u64::from(SESSIONS));
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Implicated, "{verdict:?}");
    let rejected = rejected_sessions(&plan.run_dir);
    assert_eq!(rejected.len() as u64, victims);
    for s in &rejected {
        assert!(
            s.evidence.starts_with("rejected[llamacpp.format]: HTTP 500 (an error event mid-stream after HTTP 200; streamed before it: \"<tool_call>{\\\"na\"): {\"error\":{\"code\":500"),
            "{}",
            s.evidence
        );
        let http = s.rounds[1].http.as_ref().unwrap();
        assert_eq!(http.partial.as_deref(), Some("<tool_call>{\"na"));
        assert_eq!(http.body, crate::fake::LLAMA_REJECTION);
    }
    // Reclassified from the record, the same.
    let again = reclassify_dir(&plan.run_dir, None).unwrap();
    assert!(again.changed.is_empty(), "{:?}", again.changed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_rejections_counted_as_errors_only_degrade_the_arm() {
    let t = rejecting_target().await;
    // A custom target names no pattern: the 500s are errors, as before this class.
    let plan = plan(&t, "custom", Engine::Custom);
    let victims = fake_race_victims(&plan.workload, SESSIONS);
    let record = run(&t, &plan).await;
    let on = record.arm(ArmLabel::On).unwrap();
    assert_eq!(on.stats.counts[SessionClass::Error], victims);
    assert_eq!(on.stats.counts[SessionClass::Rejected], 0);
    assert_eq!(on.stats.corrupted, 0);
    assert_eq!(on.stats.judged(), u64::from(SESSIONS) - victims);
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Inconclusive, "{verdict:?}");
    assert!(
        verdict.reasons.iter().any(|r| r.contains("degraded")),
        "{verdict:?}"
    );

    // The replies were kept: reclassified with llama.cpp's patterns written into the
    // record, the errors are rejections and the flag is implicated.
    let run_json = plan.run_dir.join("run.json");
    let mut raw: Value = serde_json::from_str(&read(&run_json)).unwrap();
    raw["target"]["rejections"] = serde_json::to_value(Engine::Llamacpp.rejections()).unwrap();
    std::fs::write(&run_json, serde_json::to_string_pretty(&raw).unwrap()).unwrap();
    let summary = reclassify_dir(&plan.run_dir, None).unwrap();
    assert_eq!(summary.changed.len() as u64, victims);
    assert!(summary
        .changed
        .iter()
        .all(|c| (c.3, c.4) == (SessionClass::Error, SessionClass::Rejected)));
    let on = summary.record.arm(ArmLabel::On).unwrap();
    assert_eq!(
        (
            on.stats.counts[SessionClass::Rejected],
            on.stats.counts[SessionClass::Error]
        ),
        (victims, 0)
    );
    assert_eq!(
        summary.record.verdict.as_ref().unwrap().status,
        Status::Implicated
    );
    let sessions = ResultsDir::open(&plan.run_dir).read_sessions().unwrap();
    assert!(sessions
        .iter()
        .filter(|s| s.class == SessionClass::Rejected)
        .all(|s| s.error.is_none()));
}

/// The culprit search classifies as `run` does: with the llama.cpp patterns the engine's
/// rejections are the corruption the search hunts (it once judged with the markup
/// families alone, so the same replies were errors and the flag was never found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_culprit_search_counts_engine_rejections_as_corruption() {
    let mut t = rejecting_target_found_at("1").await;
    t.target.engine = Engine::Llamacpp;
    t.target.rejections = Engine::Llamacpp.rejections();
    let plan =
        crate::culprit::culprit_plan(&t, &["FAKE_REJECT", "FAKE_NOISE"], &[("FAKE_BF16", "0")]);
    let record = crate::culprit::run(&t, &plan).await.unwrap();
    assert_eq!(
        record.answer.map(|a| a.name()),
        Some("culprit"),
        "{:?}",
        record.verdict
    );
    let culprit: Vec<&str> = record.culprit.iter().map(|c| c.flag.as_str()).collect();
    assert_eq!(culprit, ["FAKE_REJECT"], "{:?}", record.verdict);
}
