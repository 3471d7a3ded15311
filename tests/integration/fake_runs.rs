//! `bisect run`'s protocol against the fake engine, whose bugs are known exactly.

use std::sync::atomic::Ordering;

use bisect_harness::commands::run::{self as experiment, Quiet, RunPlan};
use bisect_harness::control::EngineControl;
use bisect_harness::core::arm_stats::ArmLabel;
use bisect_harness::core::session::SessionClass;
use bisect_harness::core::verdict::Status;
use tokio_util::sync::CancellationToken;

use crate::common::{fake_race_victims, read, FakeTarget};

/// Runs `plan` on the fake, which must refuse it: the error and its whole message.
async fn run_refused(plan: &RunPlan, control: &mut dyn EngineControl) -> (anyhow::Error, String) {
    let err = crate::common::run_quiet(plan, control).await.unwrap_err();
    let msg = format!("{err:#}");
    (err, msg)
}

/// The record `plan` wrote, finished or not.
fn run_json(plan: &RunPlan) -> serde_json::Value {
    serde_json::from_str(&read(&plan.run_dir.join("run.json"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racy_flag_is_implicated_with_exact_counts() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = t.plan("FAKE_BF16", 64, 4);
    let victims = fake_race_victims(&plan.workload, 64);
    assert!(
        victims >= 10,
        "workload gives too few race victims ({victims}) for a decisive test"
    );
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();

    let on = record.arm(ArmLabel::On).unwrap();
    let off = record.arm(ArmLabel::Off).unwrap();
    assert_eq!(on.stats.counts[SessionClass::Leak], victims);
    assert_eq!(on.stats.counts[SessionClass::Done], 64 - victims);
    assert_eq!(off.stats.counts[SessionClass::Done], 64);
    assert_eq!(on.stats.first_bad_round, vec![0, victims]);
    assert_eq!(on.readback.get("prefill").map(String::as_str), Some("1"));
    assert_eq!(off.readback.get("decode").map(String::as_str), Some("0"));
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Implicated, "{verdict:?}");
    assert!(
        verdict.direction.as_deref().unwrap().starts_with("on"),
        "{verdict:?}"
    );
    assert_eq!(control.restarts.load(Ordering::Relaxed), 2);
    // Each block names, per role, which process served it and where that was read.
    for block in &record.runs {
        for role in ["prefill", "decode"] {
            let identity = &block.identity[role];
            assert_eq!(
                identity.source,
                bisect_harness::core::effective::IdentitySource::EngineReport,
                "{identity:?}"
            );
            assert!(
                identity.started.is_some() && identity.listener.is_some(),
                "{identity:?}"
            );
        }
    }
    assert_eq!(
        t.launch_bytes(),
        before,
        "launch configs must be restored byte for byte"
    );

    // The results directory holds every artefact of docs/design.md 3.6.
    let dir = &plan.run_dir;
    let run_json: serde_json::Value =
        serde_json::from_str(&crate::common::read(&dir.join("run.json"))).unwrap();
    assert_eq!(run_json["verdict"]["status"], "implicated");
    assert_eq!(run_json["flag"]["env"], "FAKE_INDEX_BF16");
    assert_eq!(run_json["arms"].as_array().unwrap().len(), 2);
    assert_eq!(run_json["comparison"]["test"], "fisher_exact_two_sided");
    let sessions = crate::common::read(&dir.join("sessions.jsonl"));
    assert_eq!(sessions.lines().count(), 128);
    let leak_line = sessions
        .lines()
        .find(|l| l.contains("\"class\":\"leak\""))
        .unwrap();
    assert!(leak_line.contains("DSML"), "evidence kept: {leak_line}");
    let metrics = crate::common::read(&dir.join("metrics.csv"));
    assert!(metrics.starts_with("t_s,role,running"), "{metrics}");
    assert!(metrics.contains("on-r0") && metrics.contains("off-r0"));
    assert!(dir.join("launch/on-r0").is_dir() && dir.join("launch/off-r0").is_dir());
    let applied_on = crate::common::read(&dir.join("launch/on-r0/decode--decode.sh"));
    assert!(applied_on.contains("export FAKE_INDEX_BF16=1"));
    let applied_off = crate::common::read(&dir.join("launch/off-r0/prefill--prefill.sh"));
    assert!(applied_off.contains("export FAKE_INDEX_BF16=0"));
    assert!(crate::common::read(&dir.join("summary.md")).contains("implicated"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speed_only_flag_is_cleared() {
    let t = FakeTarget::new().await;
    // The race needs FAKE_INDEX_BF16=1: pin it off for both arms so nothing corrupts.
    let mut plan = t.plan("FAKE_NOISE", 100, 4);
    t.pin(&mut plan, "FAKE_BF16", "0");
    // Cleared needs the engine to have seen the target load: requests last long enough
    // for the 50 ms metrics poller to see the 100 in flight.
    t.engine.hold_requests(300);
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Cleared, "{verdict:?}");
    assert!(record
        .arms
        .iter()
        .all(|a| a.stats.counts[SessionClass::Done] == 100));
    assert_eq!(record.sets.get("FAKE_BF16").map(String::as_str), Some("0"));
    assert!(record
        .arms
        .iter()
        .all(|a| a.stats.peak_running["decode"] >= 90));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_difference_below_the_target_load_is_not_cleared() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_NOISE", 100, 4);
    t.pin(&mut plan, "FAKE_BF16", "0");
    // Requests answered at once: the engine never holds the 100 the run was meant to.
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Inconclusive, "{verdict:?}");
    assert!(
        verdict.summary.contains("of the target concurrency 100"),
        "{}",
        verdict.summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_difference_is_inconclusive_underpowered() {
    let t = FakeTarget::new().await;
    let plan = t.plan("FAKE_BF16", 12, 4);
    let victims = fake_race_victims(&plan.workload, 12);
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(record.arms[0].stats.counts[SessionClass::Leak], victims);
    assert_eq!(verdict.status, Status::Inconclusive, "{verdict:?}");
    assert!(
        verdict.reasons.iter().any(|r| r.contains("underpowered")),
        "{verdict:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_arm_is_degraded_not_a_verdict() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_SLOW", 20, 2);
    plan.workload.timeout_s = 0.2;
    t.pin(&mut plan, "FAKE_BF16", "0");
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let on = record.arm(ArmLabel::On).unwrap();
    assert_eq!(on.stats.counts[SessionClass::Timeout], 20);
    crate::common::assert_inconclusive_because(&record, |r| {
        r.contains("degraded") && r.contains("on")
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_applied_flag_is_refused_before_any_restart() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = t.plan("FAKE_BF16_DECODE_ONLY", 4, 1);
    let mut control = t.engine.control();
    let (err, msg) = run_refused(&plan, &mut control).await;
    assert!(
        msg.contains("prefill"),
        "names the role that also sets it: {msg}"
    );
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        bisect_harness::exit::BAD_INPUT
    );
    assert_eq!(control.restarts.load(Ordering::Relaxed), 0);
    assert_eq!(t.engine.requests(), 0);
    assert_eq!(t.launch_bytes(), before);

    // With --allow-partial the same flag runs, and the mismatch shows up as engine errors.
    let mut plan = plan;
    plan.testbed.allow_partial = true;
    plan.run_dir = plan.run_dir.with_file_name("partial-allowed");
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let off = record.arm(ArmLabel::Off).unwrap();
    assert_eq!(
        off.stats.counts[SessionClass::Error],
        4,
        "prefill 1 vs decode 0 disagree: every request fails"
    );
    assert_eq!(t.launch_bytes(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_interleave_and_pool() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_BF16", 16, 4);
    plan.repeats = 2;
    let victims = fake_race_victims(&plan.workload, 16);
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let order: Vec<String> = record
        .runs
        .iter()
        .map(|r| format!("{}{}", r.label, r.repeat.unwrap()))
        .collect();
    assert_eq!(order, ["on0", "off0", "off1", "on1"]);
    let on = record.arm(ArmLabel::On).unwrap();
    assert_eq!(on.sessions, 32);
    assert_eq!(on.stats.counts[SessionClass::Leak], 2 * victims);
    assert_eq!(control.restarts.load(Ordering::Relaxed), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_restored_when_a_restart_fails_midway() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = t.plan("FAKE_BF16", 8, 2);
    let mut control = FailingSecondRestart {
        inner: t.engine.control(),
        calls: 0,
    };
    let err = crate::common::run_quiet(&plan, &mut control)
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("simulated restart failure"));
    assert_eq!(t.launch_bytes(), before);
    let run_json = run_json(&plan);
    assert_eq!(run_json["status"], "failed");
    assert_eq!(
        run_json["runs"].as_array().unwrap().len(),
        1,
        "the finished arm is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_restores_and_reports_interrupted() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let mut plan = t.plan("FAKE_SLOW", 8, 2);
    plan.workload.timeout_s = 30.0;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let mut control = t.engine.control();
    let err = experiment::run_experiment(&plan, &mut control, &Quiet, cancel)
        .await
        .unwrap_err();
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        bisect_harness::exit::INTERRUPTED
    );
    assert_eq!(t.launch_bytes(), before);
    let run_json = run_json(&plan);
    assert_eq!(run_json["status"], "interrupted");
}

#[test]
fn session_classes_cover_design() {
    let names: Vec<&str> = SessionClass::iter().map(|c| c.name()).collect();
    assert_eq!(
        names,
        [
            "done",
            "maxrounds",
            "leak",
            "bad_args",
            "wrong_args",
            "no_tool",
            "error",
            "timeout",
            "truncated",
            "rejected",
            "crashed",
            "diverged",
            "drifted"
        ]
    );
}

struct FailingSecondRestart {
    inner: crate::fake::FakeControl,
    calls: u32,
}

impl bisect_harness::control::EngineControl for FailingSecondRestart {
    fn restart<'a>(
        &'a mut self,
        label: &'a str,
        cancel: &'a CancellationToken,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<std::collections::BTreeMap<String, f64>>>
    {
        self.calls += 1;
        if self.calls == 2 {
            return Box::pin(async { Err(anyhow::anyhow!("simulated restart failure")) });
        }
        self.inner.restart(label, cancel)
    }
    fn stop(&mut self) -> futures::future::BoxFuture<'_, anyhow::Result<()>> {
        self.inner.stop()
    }
}

/// Runs `plan` in process against the fake; the probe must run: its record.
async fn run_probe(
    plan: &bisect_harness::commands::probe::ProbePlan,
    control: &mut crate::fake::FakeControl,
) -> bisect_harness::commands::probe::ProbeRecord {
    bisect_harness::commands::probe::run_probe(plan, control, &Quiet, CancellationToken::new())
        .await
        .unwrap()
}

fn probe_plan(t: &FakeTarget, sessions: u32) -> bisect_harness::commands::probe::ProbePlan {
    let run = t.plan("FAKE_BF16", sessions, 4);
    bisect_harness::commands::probe::ProbePlan {
        id: "probe".into(),
        command: "bisect probe".into(),
        target: run.target,
        workload: run.workload,
        catalog: t.catalog.clone(),
        run_dir: t.dir.path().join("results/probe"),
        api_key: None,
        background: 0.02,
        bug_rate: 0.10,
        degraded_fraction: 0.10,
        metrics_period: std::time::Duration::from_millis(50),
        mechanism: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_says_corrupted_then_clean_and_never_edits() {
    use bisect_harness::commands::probe::Outcome;
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = probe_plan(&t, 64);
    let mut control = t.engine.control();
    let record = run_probe(&plan, &mut control).await;
    assert_eq!(
        record.outcome,
        Some(Outcome::Corrupted),
        "{}",
        record.reason
    );
    assert_eq!(record.flags["FAKE_BF16"]["decode"], "1");
    assert_eq!(t.launch_bytes(), before, "probe only reads the configs");

    // The "fixed build": both roles on the other dtype.
    for role in &t.target.roles {
        let text = std::fs::read_to_string(&role.launch)
            .unwrap()
            .replace("FAKE_INDEX_BF16=1", "FAKE_INDEX_BF16=0");
        std::fs::write(&role.launch, text).unwrap();
    }
    // "Clean" needs the load seen on the engine side: requests held long enough for the
    // metrics poller to see the 64 in flight.
    t.engine.hold_requests(150);
    let mut plan = probe_plan(&t, 64);
    plan.run_dir = t.dir.path().join("results/probe2");
    let record = run_probe(&plan, &mut control).await;
    assert_eq!(record.outcome, Some(Outcome::Clean), "{}", record.reason);
    assert!(
        plan.run_dir.join("probe.json").exists() && plan.run_dir.join("sessions.jsonl").exists()
    );

    // The same clean build on a target whose roles serve no metrics: 0/64 at a load
    // nobody measured is no "clean" (git bisect would mark the commit good); it cannot tell.
    let mut plan = probe_plan(&t, 64);
    plan.run_dir = t.dir.path().join("results/probe3");
    for role in &mut plan.target.roles {
        role.metrics = None;
    }
    let record = run_probe(&plan, &mut control).await;
    assert_eq!(record.outcome, Some(Outcome::Unknown), "{}", record.reason);
    assert_eq!(
        record.arm.as_ref().unwrap().stats.counts[SessionClass::Done],
        64
    );
    assert!(
        record.reason.contains("no engine-side load measurement"),
        "{}",
        record.reason
    );
    assert_eq!(Outcome::Unknown.exit_code(), 125);
}

/// The probe classifies with the target profile's markup families, as `bisect run`
/// does: the fake's race leaks DSML, a leak only where the profile counts DSML.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_classifies_with_the_profiles_markup() {
    use bisect_harness::core::classify::MarkupFamily;
    let t = FakeTarget::new().await;
    async fn probe(
        t: &FakeTarget,
        markup: Vec<MarkupFamily>,
        dir: &str,
    ) -> bisect_harness::commands::probe::ProbeRecord {
        let mut plan = probe_plan(t, 64);
        plan.target.markup = markup;
        plan.run_dir = t.dir.path().join(dir);
        run_probe(&plan, &mut t.engine.control()).await
    }
    let victims = fake_race_victims(&probe_plan(&t, 64).workload, 64);
    assert!(victims >= 10);
    let all = probe(&t, MarkupFamily::ALL.to_vec(), "results/all").await;
    assert_eq!(all.arm.unwrap().stats.counts[SessionClass::Leak], victims);
    let hermes = probe(&t, vec![MarkupFamily::Hermes], "results/hermes").await;
    let counts = hermes.arm.unwrap().stats.counts;
    assert_eq!(
        counts[SessionClass::Leak],
        0,
        "DSML is not a family this profile counts"
    );
    assert_eq!(counts.total(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_bisect_did_not_start_is_refused_before_anything_runs() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let mut plan = t.plan("FAKE_BF16", 8, 1);
    // Without a restart command bisect spawns the roles itself, so nothing may answer
    // on their health URLs before it does: the fake answering there is a leftover.
    for role in &mut plan.target.roles {
        role.restart = None;
    }
    let mut control = t.engine.control();
    let (err, msg) = run_refused(&plan, &mut control).await;
    assert!(msg.contains("something already answers on"), "{msg}");
    assert!(msg.contains("fix:"), "{msg}");
    assert!(msg.contains("\"prefill\""), "names what answered: {msg}");
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        bisect_harness::exit::COULD_NOT_RUN
    );
    assert_eq!(control.restarts.load(Ordering::Relaxed), 0);
    assert_eq!(
        t.engine.requests(),
        0,
        "no session ran against a foreign engine"
    );
    assert_eq!(t.launch_bytes(), before);
    let record = run_json(&plan);
    assert_eq!(record["status"], "failed");
    assert!(record["verdict"].is_null());
}

/// An engine that keeps running the first arm's value whatever the second writes (it
/// ignores restarts; a vLLM on CPU does the same with an attention backend): the second
/// arm is refused as soon as its engine reports the first arm's value, before any of its
/// sessions, with the reason; the launch configs come back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_runs_the_same_value_in_both_arms_is_refused_before_the_second_arms_sessions(
) {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = t.plan("FAKE_BF16", 32, 2);
    t.engine.ignore_restarts();
    let mut control = t.engine.control();
    let (err, msg) = run_refused(&plan, &mut control).await;
    assert!(
        msg.contains("arm off set FAKE_BF16=0 but the prefill engine reports it runs with \"1\", the value arm on sets: the engine ran the same FAKE_BF16 in both arms"),
        "{msg}"
    );
    assert!(msg.contains("refused before this arm's sessions"), "{msg}");
    assert!(msg.contains("fix:"), "{msg}");
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        bisect_harness::exit::COULD_NOT_RUN
    );
    let record = run_json(&plan);
    assert_eq!(record["status"], "failed");
    assert!(record["verdict"].is_null());
    // Only the first arm's sessions ran: one block of 32 (the block order puts on first).
    let sessions = std::fs::read_to_string(plan.run_dir.join("sessions.jsonl")).unwrap();
    let labels: std::collections::BTreeSet<String> = sessions
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["arm"].to_string())
        .collect();
    assert_eq!(sessions.lines().count(), 32, "{labels:?}");
    assert_eq!(t.launch_bytes(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_sample_runs_at_the_same_load() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_BF16", 48, 2);
    plan.workload.concurrency = Some(8);
    t.engine.hold_requests(50);
    let victims = fake_race_victims(&plan.workload, 48);
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    assert_eq!(record.workload["concurrency"], 8);
    assert_eq!(record.workload["sessions"], 48);
    for arm in &record.arms {
        assert_eq!(arm.sessions, 48);
        assert!(
            arm.stats.peak_running["client"] <= 8,
            "{:?}",
            arm.stats.peak_running
        );
        assert!(
            arm.stats.peak_running["decode"] <= 8,
            "{:?}",
            arm.stats.peak_running
        );
    }
    let on = record.arm(ArmLabel::On).unwrap();
    assert_eq!(on.stats.counts[SessionClass::Leak], victims);
}

/// An engine that returns every tool call as text (SGLang without `--tool-call-parser`)
/// can only ever show `leak` in both arms: the run refuses before its first block's
/// sessions (exit 3), with the engine's fix, and leaves the launch configs as found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_refuses_an_engine_that_returns_tool_calls_as_text() {
    let mut t = FakeTarget::new().await;
    let decode = &t.target.roles[1].launch;
    let text = read(decode).replace("exec ", "export FAKE_NO_PARSER=1\nexec ");
    std::fs::write(decode, text).unwrap();
    t.engine.reload().unwrap();
    t.target.engine = bisect_harness::config::Engine::Sglang;
    let before = t.launch_bytes();
    let plan = t.plan("FAKE_BF16", 8, 2);
    let mut control = t.engine.control();
    let (err, msg) = run_refused(&plan, &mut control).await;
    assert!(
        msg.contains("the tool-call probe") && msg.contains("came back as text"),
        "{msg}"
    );
    assert!(
        msg.contains("leak[dsml]"),
        "quotes the engine's reply: {msg}"
    );
    assert!(
        msg.contains("fix: start every SGLang role with --tool-call-parser"),
        "{msg}"
    );
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        bisect_harness::exit::COULD_NOT_RUN
    );
    // The probe's three sessions asked, every one of them (one call as text decides
    // nothing alone); no session was driven.
    assert_eq!(t.engine.requests(), 3);
    assert_eq!(t.launch_bytes(), before);
    let record = run_json(&plan);
    assert_eq!(record["status"], "failed");
    assert!(record["verdict"].is_null());
}
