//! An engine that dies is evidence (issue: engine deaths): the zero-work mock engine,
//! spawned by bisect from a launch config, dies of a real SIGSEGV the moment a chosen
//! number of requests is in flight (`BISECT_MOCK_CRASH_AT_RUNNING`, a flag like any
//! other). The run names each death with its signal, the time and the load, classes the
//! sessions it cut short `crashed` (never error, timeout or a corruption class), and
//! judges the deaths by engine lives.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A one-role target spawning the mock engine, with flag `CRASH` setting the in-flight
/// count it dies at (`on`/`off` values given).
fn crashing_target(dir: &Path, on: &str, off: &str) -> PathBuf {
    let flag = crate::common::MockFlag {
        name: "CRASH",
        env: "BISECT_MOCK_CRASH_AT_RUNNING",
        start: "0",
        doc: "the mock dies of SIGSEGV at this many requests in flight (0: never)",
        on,
        off,
    };
    crate::common::mock_target(dir, 150, &[flag]).0
}

/// `bisect run --flag CRASH` on `profile`, 16 `smoke` sessions a block, two blocks an
/// arm: (exit code, run.json, the run's directory).
fn run(dir: &Path, profile: &Path, concurrency: u32) -> (i32, Value, PathBuf) {
    let concurrency = concurrency.to_string();
    run_with(
        dir,
        profile,
        &[
            "--workload",
            "smoke",
            "--sessions",
            "16",
            "--concurrency",
            &concurrency,
            "--repeats",
            "2",
        ],
    )
}

/// `bisect run --flag CRASH ARGS` on `profile`: (exit code, run.json, its directory).
fn run_with(dir: &Path, profile: &Path, args: &[&str]) -> (i32, Value, PathBuf) {
    let mut all = vec!["--flag", "CRASH"];
    all.extend(args);
    let (code, record, _) = crate::common::run_record(dir, profile, &all);
    let run_dir = dir.join("results").join(record["id"].as_str().unwrap());
    (code.unwrap(), record, run_dir)
}

fn blocks<'a>(record: &'a Value, label: &str) -> Vec<&'a Value> {
    record["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["label"] == label)
        .collect()
}

#[test]
fn an_engine_that_dies_of_sigsegv_at_load_in_one_arm_implicates_the_flag() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = crashing_target(dir.path(), "4", "0");
    let serve_before = std::fs::read(dir.path().join("serve.sh")).unwrap();
    let (code, record, run_dir) = run(dir.path(), &profile, 8);
    assert_eq!(code, 0, "{record:#}");
    let verdict = &record["verdict"];
    assert_eq!(verdict["status"], "implicated", "{verdict:#}");
    let direction = verdict["direction"].as_str().unwrap();
    // Each block restarts its engine after every death and goes on, until the death
    // budget (8 a block): 16 deaths and 14 restarts in the on arm's two blocks.
    assert!(
        direction.starts_with("on (=4) crashes the engine: 16 engine deaths (SIGSEGV) at ")
            && direction.contains("(the client's count): 14 restarts, 2 of 2 blocks died")
            && direction.contains("off (=0) 0 of 2 blocks died, 128 requests served"),
        "{direction}"
    );
    for block in blocks(&record, "on") {
        let deaths = block["deaths"].as_array().unwrap();
        assert_eq!(deaths.len(), 8, "{block:#}");
        assert_eq!(block["restarts"].as_array().unwrap().len(), 7, "{block:#}");
        assert!(block["unrun"].as_u64().unwrap() >= 1, "{block:#}");
        for death in deaths {
            assert_eq!(death["role"], "server");
            assert_eq!(death["exit"]["signal"], 11);
            assert_eq!(death["exit"]["signal_name"], "SIGSEGV");
            // The mock dies at 4 in flight: the client's count around it says so.
            assert!(death["in_flight"].as_u64().unwrap() >= 4, "{death}");
        }
        // The sessions it cut short are the death's, not errors or timeouts.
        let counts = &block["counts"];
        assert!(counts["crashed"].as_u64().unwrap() >= 1, "{block:#}");
        assert_eq!(counts["error"], 0, "{block:#}");
        assert_eq!(counts["timeout"], 0, "{block:#}");
        assert!(
            block["engine_replaced"].is_null(),
            "a death is not a replacement: {block:#}"
        );
    }
    for block in blocks(&record, "off") {
        assert!(block["deaths"].is_null(), "{block:#}");
        assert_eq!(block["counts"]["done"], 16, "{block:#}");
    }
    // Every crashed session says which death cut it short.
    let sessions = std::fs::read_to_string(run_dir.join("sessions.jsonl")).unwrap();
    let mut crashed = 0;
    for line in sessions.lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        if s["class"] == "crashed" {
            crashed += 1;
            assert!(
                s["evidence"]
                    .as_str()
                    .unwrap()
                    .starts_with("crashed: role server killed by SIGSEGV (signal 11) at "),
                "{s}"
            );
        }
        assert_ne!(s["class"], "error", "{s}");
    }
    assert!(crashed >= 2);
    let summary = std::fs::read_to_string(run_dir.join("summary.md")).unwrap();
    assert!(summary.contains("Engine deaths"), "{summary}");
    assert!(
        summary.contains("block on r0: role server killed by SIGSEGV"),
        "{summary}"
    );
    let report = std::fs::read_to_string(run_dir.join("report.html")).unwrap();
    assert!(report.contains("<h2>Engine deaths</h2>"));
    assert_eq!(
        std::fs::read(dir.path().join("serve.sh")).unwrap(),
        serve_before
    );
}

#[test]
fn an_engine_that_dies_in_both_arms_is_inconclusive_naming_the_deaths() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = crashing_target(dir.path(), "4", "6");
    let (code, record, _) = run(dir.path(), &profile, 8);
    assert_eq!(code, 0, "{record:#}");
    let verdict = &record["verdict"];
    assert_eq!(verdict["status"], "inconclusive", "{verdict:#}");
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.contains("the engine died in both arms") && summary.contains("SIGSEGV"),
        "{summary}"
    );
}

#[test]
fn an_engine_that_dies_at_one_in_flight_is_said_to() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = crashing_target(dir.path(), "1", "0");
    let (code, record, _) = run(dir.path(), &profile, 1);
    assert_eq!(code, 0, "{record:#}");
    let reasons = record["verdict"]["reasons"].to_string();
    assert!(
        reasons
            .contains("every death came at 1 request in flight: the crash is not load-dependent"),
        "{reasons}"
    );
}

#[test]
fn a_default_run_on_an_engine_dying_at_load_is_implicated_by_its_deaths_in_one_command() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    // Dies once 40 requests are in flight: never alone, always at the default load.
    let profile = crashing_target(dir.path(), "40", "0");
    let (code, record, _) = run_with(dir.path(), &profile, &[]);
    assert_eq!(code, 0, "{record:#}");
    let verdict = &record["verdict"];
    assert_eq!(verdict["status"], "implicated", "{verdict:#}");
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.contains("on (=40) crashes the engine: 8 engine deaths (SIGSEGV) at ")
            && summary.contains("7 restarts"),
        "{summary}"
    );
    // The in-flight words are the client's count around each death, never the 0 or 1 a
    // gauge read after the death, and never contradict each other.
    assert!(!summary.contains("at 0 in flight"), "{summary}");
    assert!(!summary.contains("not load-dependent"), "{summary}");
    let on = blocks(&record, "on");
    for death in on[0]["deaths"].as_array().unwrap() {
        assert!(death["in_flight"].as_u64().unwrap() >= 40, "{death}");
    }
    let restarts = on[0]["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 7);
    assert!(restarts
        .iter()
        .all(|r| r["restart_s"].as_f64().unwrap() > 0.0));
}
