//! `bisect reclassify`: a stored run replays to exactly the classes it was given live,
//! and a run whose leak sessions an old, blind rule called `done` is reclassified from
//! its stored transcripts; counts and verdict change, originals kept.

use std::process::Command;

use std::collections::BTreeSet;

use bisect_harness::commands::reclassify::{reclassify_session, recorded_workload};
use bisect_harness::commands::run::{self as experiment, Quiet, RunPlan};
use bisect_harness::core::arm_stats::ArmLabel;
use bisect_harness::core::classify::Classifier;
use bisect_harness::core::evidence::Policy;
use bisect_harness::core::session::{RoundClass, SessionClass};
use bisect_harness::core::verdict::Status;
use bisect_harness::results::ResultsDir;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::{fake_race_victims, read, FakeTarget};

/// `bisect reclassify DIR`, which must succeed: its stdout.
fn reclassify(dir: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .arg("reclassify")
        .arg(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `plan` against the fake, replays every stored session under the same rules and
/// checks each comes back unchanged (class, first bad round, evidence, rounds, all of it);
/// returns the classes seen.
async fn replays_to_its_live_classes(t: &FakeTarget, plan: &RunPlan) -> BTreeSet<SessionClass> {
    let mut control = t.engine.control();
    experiment::run_experiment(plan, &mut control, &Quiet, CancellationToken::new())
        .await
        .unwrap();
    let dir = ResultsDir::open(&plan.run_dir);
    let record = dir.read_record().unwrap();
    let workload = recorded_workload(&record.workload, None).unwrap();
    let classifier = Classifier::with_defaults(&workload.tools).unwrap();
    let sessions = dir.read_sessions().unwrap();
    assert_eq!(sessions.len() as u32, 2 * plan.workload.sessions);
    for live in &sessions {
        let (replayed, incomplete) = reclassify_session(&classifier, &workload, live).unwrap();
        assert!(!incomplete, "{}", live.evidence);
        assert_eq!(
            serde_json::to_value(&replayed).unwrap(),
            serde_json::to_value(live).unwrap(),
            "session {} #{} replays to another ending",
            live.label,
            live.index
        );
    }
    sessions.iter().map(|s| s.class).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_run_reclassifies_to_exactly_its_live_classes() {
    let t = FakeTarget::new().await;
    // Four rounds for three steps: race victims leak in round 2, the rest are done.
    let racy = t.plan("FAKE_BF16", 16, 4);
    let seen = replays_to_its_live_classes(&t, &racy).await;
    assert_eq!(
        seen,
        BTreeSet::from([SessionClass::Done, SessionClass::Leak])
    );

    // Three rounds: the arm with the race leaks or runs out of rounds; the slow arm
    // times out (a transport round, kept as stored).
    let mut slow = t.plan("FAKE_SLOW", 16, 3);
    slow.workload.timeout_s = 0.2;
    let seen = replays_to_its_live_classes(&t, &slow).await;
    assert_eq!(
        seen,
        BTreeSet::from([
            SessionClass::Maxrounds,
            SessionClass::Leak,
            SessionClass::Timeout
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclassify_restores_leaks_an_old_rule_missed_and_keeps_the_originals() {
    let t = FakeTarget::new().await;
    let plan = t.plan("FAKE_BF16", 64, 4);
    let victims = fake_race_victims(&plan.workload, 64);
    let mut control = t.engine.control();
    crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let dir = ResultsDir::open(&plan.run_dir);

    // The old rule: any text answer ends the session `done`; markup was not looked for.
    let mut sessions = dir.read_sessions().unwrap();
    for s in sessions
        .iter_mut()
        .filter(|s| s.class == SessionClass::Leak)
    {
        s.class = SessionClass::Done;
        s.first_bad_round = None;
        s.evidence = "old rule: a text answer".into();
        for r in &mut s.rounds {
            r.class = RoundClass::Ok;
        }
    }
    let mut old = dir.read_record().unwrap();
    bisect_harness::commands::reclassify::recount(&mut old, &sessions, &Policy::default());
    assert_eq!(old.arms[0].stats.counts[SessionClass::Leak], 0);
    let old_status = old.verdict.as_ref().unwrap().status;
    assert_ne!(old_status, Status::Implicated);
    let old_lines: String = sessions
        .iter()
        .map(|s| serde_json::to_string(s).unwrap() + "\n")
        .collect();
    std::fs::write(plan.run_dir.join("sessions.jsonl"), &old_lines).unwrap();
    dir.write_record(&old).unwrap();

    let stdout = reclassify(&plan.run_dir);
    assert!(
        stdout.contains(&format!("{victims} changed class")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("verdict: {} -> implicated", old_status.as_str())),
        "{stdout}"
    );

    let new = dir.read_record().unwrap();
    let on = new.arms.iter().find(|a| a.label == ArmLabel::On).unwrap();
    assert_eq!(on.stats.counts[SessionClass::Leak], victims);
    assert_eq!(on.stats.counts[SessionClass::Done], 64 - victims);
    assert_eq!(on.stats.first_bad_round, vec![0, victims]);
    assert_eq!(new.verdict.as_ref().unwrap().status, Status::Implicated);
    let reclassified = dir.read_sessions().unwrap();
    assert_eq!(
        reclassified
            .iter()
            .filter(|s| s.class == SessionClass::Leak)
            .count() as u64,
        victims
    );

    // The originals: backups byte for byte, and the previous counts/verdict in run.json.
    let run_json: Value = serde_json::from_str(&read(&plan.run_dir.join("run.json"))).unwrap();
    let entry = &run_json["reclassified"][0];
    assert_eq!(entry["arms"][0]["counts"]["leak"], 0);
    assert_eq!(entry["verdict"]["status"], old_status.as_str());
    assert_eq!(entry["changed_sessions"], victims);
    let backup = plan
        .run_dir
        .join(entry["sessions_backup"].as_str().unwrap());
    assert_eq!(read(&backup), old_lines);
    let run_backup = plan
        .run_dir
        .join(entry["run_json_backup"].as_str().unwrap());
    let previous: Value = serde_json::from_str(&read(&run_backup)).unwrap();
    assert_eq!(previous["verdict"]["status"], old_status.as_str());
    assert!(read(&plan.run_dir.join("summary.md")).contains("implicated"));

    // Re-rendering keeps the history.
    let out = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .arg("report")
        .arg(&plan.run_dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let run_json: Value = serde_json::from_str(&read(&plan.run_dir.join("run.json"))).unwrap();
    assert_eq!(run_json["reclassified"].as_array().unwrap().len(), 1);
}

/// A run whose profile counts only Hermes markup (`markup = ["hermes"]`) did not count the
/// fake's DSML leaks; `bisect reclassify` judges with the families the run recorded, so
/// nothing changes class. Judged with every family (what it did before run.json recorded
/// them), the DSML rounds would have become leaks and the verdict moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclassify_judges_with_the_markup_families_the_run_counted() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_BF16", 32, 4);
    plan.target.markup = vec![bisect_harness::core::classify::MarkupFamily::Hermes];
    let mut control = t.engine.control();
    crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let dir = ResultsDir::open(&plan.run_dir);
    let before = dir.read_record().unwrap();
    assert_eq!(
        before.header.target.markup,
        Some(vec![bisect_harness::core::classify::MarkupFamily::Hermes])
    );
    assert_eq!(
        before.arms[0].stats.counts[SessionClass::Leak],
        0,
        "DSML is not counted here"
    );

    let stdout = reclassify(&plan.run_dir);
    assert!(stdout.contains(" 0 changed class"), "{stdout}");
    assert!(!stdout.contains("note:"), "{stdout}");
    let after = dir.read_record().unwrap();
    assert_eq!(after.arms[0].stats.counts[SessionClass::Leak], 0);
    assert_eq!(
        after.verdict.as_ref().map(|v| v.status),
        before.verdict.as_ref().map(|v| v.status)
    );

    // An older record (no markup written) is judged with every family, and says so.
    let mut old: Value = serde_json::from_str(&read(&plan.run_dir.join("run.json"))).unwrap();
    old["target"].as_object_mut().unwrap().remove("markup");
    std::fs::write(plan.run_dir.join("run.json"), old.to_string()).unwrap();
    let stdout = reclassify(&plan.run_dir);
    assert!(
        stdout.contains("note: run.json does not say which markup families"),
        "{stdout}"
    );
    assert!(dir.read_record().unwrap().arms[0].stats.counts[SessionClass::Leak] > 0);
}
