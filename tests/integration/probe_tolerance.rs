//! A probe that tolerates corruption (issue 43, item 3): the tool-call probe asks the
//! first rounds of three sessions, one at a time, and one parsed call among them proves
//! the engine's parser. An engine whose parser works but whose first rounds are
//! sometimes corrupted even alone is tested, with a note; only an engine that returns
//! every call as text is refused. The zero-work mock engine, spawned by bisect from a
//! launch config, leaks the first round of the sessions whose task message has
//! `crc32 % M == 0` (`BISECT_MOCK_LEAK_FIRST_ROUND=M`, a flag like any other).

use std::path::{Path, PathBuf};

use bisect_engine::mock::{FaultRule, MockConfig, MockServer};
use serde_json::Value;

/// Sessions the probe asks (`core::toolprobe::TRIES`).
const TRIES: u32 = 3;

/// Which of the first `count` sessions of workload `smoke` a mock started with
/// `--leak-first-round modulus` leaks the first round of: the mock picks by the task
/// message, the last message a session starts with.
fn leaking(modulus: u32, count: u32) -> Vec<bool> {
    let workload = bisect_harness::config::load_workload("smoke").unwrap();
    let rule = FaultRule::leak_first_round(modulus);
    (0..count)
        .map(|i| {
            let (_, messages) = bisect_harness::core::task::initial_conversation(&workload, i);
            let task = messages.last().unwrap().content.as_deref().unwrap();
            rule.selects(task)
        })
        .collect()
}

/// How many of the probe's sessions leak with `modulus`.
fn leaks_in_probe(modulus: u32) -> usize {
    leaking(modulus, TRIES).iter().filter(|l| **l).count()
}

/// Moduli whose first rounds leak in some but not all of the probe's sessions, the
/// smallest first.
fn partly_leaking() -> Vec<u32> {
    let found: Vec<u32> = (2..40)
        .filter(|m| (1..TRIES as usize).contains(&leaks_in_probe(*m)))
        .collect();
    assert!(
        found.len() >= 2,
        "no modulus leaks part of the probe: {found:?}"
    );
    found
}

/// A one-role target spawning the mock engine, which starts with
/// `BISECT_MOCK_LEAK_FIRST_ROUND=default`; flag `LEAK` sets it (`on`/`off` values), and
/// flag `NOTHING` sets a variable nothing reads.
fn leaky_target(dir: &Path, default: u32, on: u32, off: u32) -> (PathBuf, u16) {
    let (default, on, off) = (default.to_string(), on.to_string(), off.to_string());
    let flags = [
        crate::common::MockFlag {
            name: "LEAK",
            env: "BISECT_MOCK_LEAK_FIRST_ROUND",
            start: &default,
            doc: "the mock leaks the first round of the sessions whose task has crc32 % M == 0 (0: never)",
            on: &on,
            off: &off,
        },
        crate::common::MockFlag {
            name: "NOTHING",
            env: "BISECT_TEST_NOTHING",
            start: "0",
            doc: "a variable the mock does not read",
            on: "1",
            off: "0",
        },
    ];
    crate::common::mock_target(dir, 0, &flags)
}

/// `bisect run --flag FLAG --workload smoke` on `profile`: (exit code, stdout, stderr).
fn run(dir: &Path, profile: &Path, flag: &str) -> (i32, String, String) {
    let results = dir.join("results");
    let args: Vec<&std::ffi::OsStr> = ["run", "--flag", flag, "--workload", "smoke"]
        .into_iter()
        .chain(["--sessions", "12", "--concurrency", "4", "--target"])
        .map(std::ffi::OsStr::new)
        .chain([
            profile.as_os_str(),
            "--results".as_ref(),
            results.as_os_str(),
            "--json".as_ref(),
        ])
        .collect();
    let out = crate::common::bisect_in(dir, &args);
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The probe's note for `leaked` of the probe's first rounds as text, the rest parsed.
fn note(leaked: usize) -> String {
    format!(
        "warning: the tool-call probe: {leaked} of {TRIES} first rounds came back as text alone \
         (one request in flight); {} of {TRIES} came back as parsed tool_calls, so the engine \
         parses tool calls and the command proceeds",
        TRIES as usize - leaked
    )
}

/// Some first rounds leak even alone, in both arms: the run proceeds (exit 0) with the
/// probe's note, and every session the mock picked is `leak` at round 1 in its arm.
#[test]
fn a_run_proceeds_on_an_engine_whose_first_rounds_sometimes_leak_alone() {
    let _one = crate::common::heavy();
    let moduli = partly_leaking();
    let (on, off) = (moduli[0], moduli[1]);
    let dir = tempfile::tempdir().unwrap();
    let (profile, _) = leaky_target(dir.path(), 0, on, off);
    let serve_before = std::fs::read(dir.path().join("serve.sh")).unwrap();
    let (code, stdout, stderr) = run(dir.path(), &profile, "LEAK");
    assert_eq!(code, 0, "{stderr}");
    let record: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(record["status"], "finished", "{record:#}");
    // The probe ran on the first block's engine, before its sessions.
    let first = record["runs"][0]["label"].as_str().unwrap();
    let probed = if first == "on" { on } else { off };
    let expected = note(leaks_in_probe(probed));
    assert!(stderr.contains(&expected), "{expected}\nnot in:\n{stderr}");
    assert!(
        stderr.contains("such sessions count in both arms (the first such reply: leak[dsml]"),
        "{stderr}"
    );
    assert!(!stderr.contains("could not tell whether"), "{stderr}");
    // Both arms ran every session; exactly the picked ones leaked, at round 1.
    let run_dir = dir
        .path()
        .join("results")
        .join(record["id"].as_str().unwrap());
    let sessions = std::fs::read_to_string(run_dir.join("sessions.jsonl")).unwrap();
    let picked = |label: &str| leaking(if label == "on" { on } else { off }, 12);
    let mut seen = 0;
    for line in sessions.lines() {
        let s: Value = serde_json::from_str(line).unwrap();
        let label = s["label"].as_str().unwrap();
        let index = s["index"].as_u64().unwrap() as usize;
        if picked(label)[index] {
            assert_eq!(s["class"], "leak", "{s}");
            assert_eq!(s["first_bad_round"], 1, "{s}");
        } else {
            assert_eq!(s["class"], "done", "{s}");
        }
        seen += 1;
    }
    assert_eq!(seen, 24);
    assert_eq!(
        std::fs::read(dir.path().join("serve.sh")).unwrap(),
        serve_before
    );
}

/// An engine that returns every call as text (`--leak-first-round 1` picks every
/// session) is still refused before any block (exit 3), with the engine's fix, after
/// all three of the probe's sessions were asked.
#[test]
fn a_run_refuses_a_spawned_engine_that_returns_every_call_as_text() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let (profile, _) = leaky_target(dir.path(), 1, 2, 0);
    let (code, _, stderr) = run(dir.path(), &profile, "NOTHING");
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains(
            "the tool-call probe (the first rounds of workload `smoke`'s sessions, one at a time, \
             before any block; 3 asked: 3 as text): the tool calls came back as text"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("the engine's reply: leak[dsml]"),
        "{stderr}"
    );
    assert!(
        stderr.contains("configure the engine's tool-call parser"),
        "the custom engine's fix: {stderr}"
    );
    // No record on stdout; the run's directory keeps one, failed, with no verdict.
    let runs: Vec<PathBuf> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(runs[0].join("run.json")).unwrap()).unwrap();
    assert_eq!(record["status"], "failed");
    assert!(record["verdict"].is_null());
    assert!(record["runs"].as_array().unwrap().is_empty(), "{record:#}");
}

/// A mock leaking the first rounds of the sessions `modulus` picks, in process, and
/// `bisect check` on a profile pointing at it: (exit code, report, stderr).
fn check_against(modulus: u32) -> (i32, Value, String) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (profile, port) = leaky_target(dir.path(), 0, 2, 0);
    let _server = runtime
        .block_on(MockServer::bind(
            ([127, 0, 0, 1], port).into(),
            MockConfig {
                faults: vec![FaultRule::leak_first_round(modulus)],
                ..MockConfig::default()
            },
        ))
        .unwrap();
    let out = crate::common::bisect(
        &[
            "check",
            "--json",
            "--workload",
            "smoke",
            "--target",
            profile.to_str().unwrap(),
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr: {stderr}"));
    (out.status.code().unwrap(), report, stderr)
}

fn tool_calls_row(report: &Value) -> Value {
    report["urls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["kind"] == "tool_calls")
        .unwrap_or_else(|| panic!("no tool_calls row: {report:#}"))
        .clone()
}

/// `bisect check` says what a run would: some first rounds as text pass the row, with
/// the run's note among the check's notes; every call as text fails it with the fix.
#[test]
fn check_passes_an_engine_whose_first_rounds_sometimes_leak_and_fails_one_that_always_does() {
    let modulus = partly_leaking()[0];
    let leaked = leaks_in_probe(modulus);
    let (code, report, stderr) = check_against(modulus);
    let row = tool_calls_row(&report);
    assert_eq!(row["ok"], true, "{row:#}");
    crate::common::assert_tool_calls_parsed(&row);
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!(
            "3 asked: {} parsed, {leaked} as text",
            TRIES as usize - leaked
        )),
        "{detail}"
    );
    let notes = report["notes"].as_array().unwrap();
    let expected = note(leaked);
    let expected = expected.trim_start_matches("warning: ");
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().starts_with(expected)),
        "{expected}\nnot in: {notes:#?}"
    );
    let problems = report["problems"].as_array().unwrap();
    assert!(
        !problems.iter().any(|p| p["subject"] == "tool calls"),
        "{problems:#?}"
    );
    assert_eq!(code, 0, "{problems:#?}\n{stderr}");

    let (code, report, stderr) = check_against(1);
    assert_eq!(code, 1, "{stderr}");
    let row = tool_calls_row(&report);
    assert_eq!(row["ok"], false, "{row:#}");
    let problem = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["subject"] == "tool calls")
        .unwrap_or_else(|| panic!("{report:#}"))
        .clone();
    let message = problem["message"].as_str().unwrap();
    assert!(
        message.contains("the tool calls came back as text")
            && message.contains("3 asked: 3 as text")
            && message.contains("leak[dsml]"),
        "{message}"
    );
    assert!(
        problem["fix"]
            .as_str()
            .unwrap()
            .starts_with("configure the engine's tool-call parser"),
        "{problem:#}"
    );
    assert!(
        !report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("the tool-call probe")),
        "{report:#}"
    );
}
