//! The harness against the embedded engine: real `bisect engine` processes started from
//! generated launch scripts, driven over HTTP, as a user runs it. The engine's race
//! depends on how requests interleave, so these tests assert verdicts and bounds with
//! wide margins (the default workload's defaults corrupt about 16% of sessions, fp8
//! none), never exact counts; exact counts are the fake engine's job.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn bisect(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("running bisect")
}

fn run_json(args: &[&str], cwd: &Path) -> Value {
    let out = bisect(args, cwd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("run.json on stdout")
}

fn arm<'a>(run: &'a Value, label: &str) -> &'a Value {
    run["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["label"] == label)
        .unwrap()
}

#[test]
fn bf16_index_k_is_implicated_and_scripts_are_restored() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_json(
        &["run", "--flag", "BF16_INDEX_K", "--repeats", "2", "--json"],
        dir.path(),
    );
    let (on, off) = (arm(&run, "on"), arm(&run, "off"));
    assert_eq!(on["sessions"], 160);
    let (on_bad, off_bad) = (
        on["corrupted"].as_u64().unwrap(),
        off["corrupted"].as_u64().unwrap(),
    );
    assert!(on_bad >= 8, "bf16 corrupts under load: {on_bad}/160");
    assert!(off_bad <= 3, "fp8 stays clean: {off_bad}/160");
    assert_eq!(
        on["counts"]["error"].as_u64().unwrap() + on["counts"]["timeout"].as_u64().unwrap(),
        0
    );
    assert_eq!(run["verdict"]["status"], "implicated", "{}", run["verdict"]);
    assert!(run["verdict"]["direction"]
        .as_str()
        .unwrap()
        .starts_with("on"));
    // Both roles read back the flag in every block.
    for block in run["runs"].as_array().unwrap() {
        assert_eq!(block["readback"]["prefill"], block["value"]);
        assert_eq!(block["readback"]["decode"], block["value"]);
    }
    // The engines reported their effective flags.
    let info = run["engine_info"].as_object().unwrap();
    assert!(info.keys().any(|k| k.starts_with("off-r0/")), "{info:?}");
    // The generated launch scripts are back to their originals.
    let run_dir = dir.path().join("results").join(run["id"].as_str().unwrap());
    let prefill = std::fs::read_to_string(run_dir.join("launch/prefill.sh")).unwrap();
    assert!(
        prefill.contains("export SGLANG_DSV4_BF16_INDEX_K=1\n"),
        "{prefill}"
    );
    let applied_off =
        std::fs::read_to_string(run_dir.join("launch/off-r0/prefill--prefill.sh")).unwrap();
    assert!(
        applied_off.contains("export SGLANG_DSV4_BF16_INDEX_K=0\n"),
        "{applied_off}"
    );
    assert!(run_dir.join("report.html").exists() && run_dir.join("summary.md").exists());
}

#[test]
fn slow_legacy_attention_is_degraded_not_judged() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_json(
        &[
            "run",
            "--flag",
            "MMA_FLASHMLA",
            "--sessions",
            "40",
            "--rounds",
            "2",
            "--timeout",
            "2",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(arm(&run, "off")["counts"]["timeout"], 40, "{}", run["arms"]);
    assert_eq!(arm(&run, "on")["counts"]["timeout"], 0, "{}", run["arms"]);
    assert_eq!(run["verdict"]["status"], "inconclusive");
    let reasons = run["verdict"]["reasons"].to_string();
    assert!(
        reasons.contains("degraded") && reasons.contains("arm off"),
        "{reasons}"
    );
}

#[test]
fn one_session_never_corrupts() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_json(
        &[
            "run",
            "--flag",
            "TOPK_V2",
            "--sessions",
            "1",
            "--repeats",
            "3",
            "--json",
        ],
        dir.path(),
    );
    for label in ["on", "off"] {
        let a = arm(&run, label);
        assert_eq!(a["counts"]["done"], 3, "{a}");
    }
}

#[test]
fn probe_of_the_embedded_defaults_sees_the_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let out = bisect(&["probe", "--sessions", "160", "--json"], dir.path());
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", record["reason"]);
    assert_eq!(record["outcome"], "corrupted");
    assert_eq!(record["flags"]["BF16_INDEX_K"]["prefill"], "1");
}
