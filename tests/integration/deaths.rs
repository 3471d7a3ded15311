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
    let port = crate::common::free_port();
    std::fs::write(
        dir.join("serve.sh"),
        format!(
            "#!/bin/sh\nexport BISECT_MOCK_CRASH_AT_RUNNING=0\nexec {} mock-engine --port {port} --jitter-ms 150\n",
            env!("CARGO_BIN_EXE_bisect")
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("flags")).unwrap();
    std::fs::write(
        dir.join("flags/CRASH.toml"),
        format!("doc = \"the mock dies of SIGSEGV at this many requests in flight (0: never)\"\nenv = \"BISECT_MOCK_CRASH_AT_RUNNING\"\nroles = [\"server\"]\non = \"{on}\"\noff = \"{off}\"\n"),
    )
    .unwrap();
    let profile = dir.join("target.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"crashing-mock\"\napi = \"http://127.0.0.1:{port}/v1\"\nmodel = \"mock\"\nflags_dir = \"flags\"\n\n[[role]]\nname = \"server\"\nlaunch = \"serve.sh\"\nhealth = \"http://127.0.0.1:{port}/health\"\nmetrics = \"http://127.0.0.1:{port}/metrics\"\nhealth_timeout_s = 30\n"
        ),
    )
    .unwrap();
    profile
}

/// `bisect run --flag CRASH` on `profile`: (exit code, run.json, the run's directory).
fn run(dir: &Path, profile: &Path, concurrency: u32) -> (i32, Value, PathBuf) {
    let results = dir.join("results");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args([
            "run",
            "--flag",
            "CRASH",
            "--workload",
            "smoke",
            "--sessions",
            "16",
        ])
        .args(["--concurrency", &concurrency.to_string(), "--repeats", "2"])
        .arg("--target")
        .arg(profile)
        .arg("--results")
        .arg(&results)
        .arg("--json")
        .env("XDG_STATE_HOME", dir.join("state"))
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let record: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no run.json on stdout ({e}): {stderr}"));
    let run_dir = results.join(record["id"].as_str().unwrap());
    (out.status.code().unwrap(), record, run_dir)
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
    assert!(
        direction.starts_with("on (=4) crashes the engine: 2 engine deaths (SIGSEGV) at ")
            && direction.contains("2 of 2 blocks died")
            && direction.contains("off (=0) 0 of 2 blocks died"),
        "{direction}"
    );
    for block in blocks(&record, "on") {
        let deaths = block["deaths"].as_array().unwrap();
        assert_eq!(deaths.len(), 1, "{block:#}");
        let death = &deaths[0];
        assert_eq!(death["role"], "server");
        assert_eq!(death["exit"]["signal"], 11);
        assert_eq!(death["exit"]["signal_name"], "SIGSEGV");
        assert!(death["in_flight"].as_u64().unwrap() >= 1, "{death}");
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
