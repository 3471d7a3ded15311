//! An engine poisoned by its first failure is told apart from load (issue: evidence over
//! time): the zero-work mock engine, spawned by bisect from a launch config, becomes
//! poisoned the first time a chosen number of requests is in flight
//! (`BISECT_MOCK_POISON_AT_RUNNING`, a flag like any other) and from then on answers
//! every call with a wrong argument, alone or not, until it restarts. After a block's
//! first corrupted session bisect runs one session alone on the same engine (the
//! canary): corrupted alone, the engine is named poisoned, the block's sessions are
//! counted before and after the first failure, and the verdict says so instead of
//! implying a load-dependent rate.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A one-role target spawning the mock engine, with flag `POISON` setting the in-flight
/// count that poisons it (`on`/`off` values given).
fn poisoning_target(dir: &Path, on: &str, off: &str) -> PathBuf {
    let flag = crate::common::MockFlag {
        name: "POISON",
        env: "BISECT_MOCK_POISON_AT_RUNNING",
        start: "0",
        doc: "the mock is poisoned for good at this many requests in flight (0: never)",
        on,
        off,
    };
    crate::common::mock_target(dir, 50, &[flag]).0
}

#[test]
fn a_poisoned_engine_is_named_poisoned_and_its_later_sessions_are_counted_apart() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = poisoning_target(dir.path(), "6", "0");
    let (code, record, stderr) = crate::common::run_record(
        dir.path(),
        &profile,
        &[
            "--flag",
            "POISON",
            "--workload",
            "smoke",
            "--sessions",
            "24",
            "--concurrency",
            "8",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let verdict = &record["verdict"];
    assert_eq!(verdict["status"], "implicated", "{verdict:#}");
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("implicated: POISON on (=6): poisoned after the first failure"),
        "{summary}"
    );
    assert!(
        verdict["reasons"][0]
            .as_str()
            .unwrap()
            .ends_with("its rate is a poisoned engine's, not a load-dependent rate"),
        "{verdict:#}"
    );
    let runs = record["runs"].as_array().unwrap();
    let on = runs.iter().find(|b| b["label"] == "on").unwrap();
    let canary = &on["canaries"][0];
    // Alone on the same engine, the canary came back corrupted: a wrong argument.
    assert_eq!(canary["class"], "wrong_args", "{canary:#}");
    let (before, after) = (&canary["before"], &canary["after"]);
    let judged = before["judged"].as_u64().unwrap() + after["judged"].as_u64().unwrap();
    assert!(judged >= 1, "{canary:#}");
    // Every session that started after the first failure was corrupted.
    assert_eq!(after["corrupted"], after["judged"], "{canary:#}");
    assert!(
        stderr.contains("the engine was poisoned after the first failure"),
        "{stderr}"
    );
    // The off arm never failed: no canary was run there.
    let off = runs.iter().find(|b| b["label"] == "off").unwrap();
    assert!(off["canaries"].is_null(), "{off:#}");
}

/// The matrix's cells of one restart group share an engine: a block whose canary found
/// it poisoned has restarted it for the canary's second look, so the next cell starts on
/// a fresh engine, and each cell's record names the poisoning.
#[test]
fn a_matrix_cell_names_a_poisoned_engine_and_hands_on_a_fresh_one() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    poisoning_target(dir.path(), "6", "0");
    std::fs::write(
        dir.path().join("plan.toml"),
        "name = \"poison\"\ntarget = \"target.toml\"\nworkload = \"smoke\"\nflags_dir = [\"flags\"]\nsessions = [8, 16]\nrepeats = 1\n\n[axes]\nPOISON = [\"6\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(["matrix", "plan.toml", "--results", "results"])
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let run = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .next()
        .expect("the matrix's results directory")
        .unwrap()
        .path();
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("matrix.json")).unwrap()).unwrap();
    let cells = record["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for cell in cells {
        let canary = &cell["canaries"][0];
        // Corrupted alone on the engine the failure left, clean alone on a fresh one.
        assert_eq!(canary["class"], "wrong_args", "{cell:#}");
        assert_eq!(canary["fresh"], "done", "{cell:#}");
    }
    assert_eq!(
        stderr
            .matches("the engine was poisoned after the first failure")
            .count(),
        2,
        "{stderr}"
    );
}
