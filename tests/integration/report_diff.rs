//! `bisect diff`: two real runs against the fake engine side by side (markdown snapshot),
//! and the bad-input cases through the binary (exit 2, the path named).

use std::process::Command;

use bisect_harness::commands::run::{self as experiment, Quiet};
use tokio_util::sync::CancellationToken;

use crate::common::FakeTarget;
use crate::report_html::redactions;

fn bisect(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args)
        .output()
        .expect("running bisect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_of_two_runs_markdown_snapshot() {
    let t = FakeTarget::new().await;
    let mut a = t.plan("FAKE_BF16", 32, 3);
    a.id = "night-1".into();
    a.run_dir = a.run_dir.with_file_name("night-1");
    // The second night ran fewer sessions: a workload confound the diff must name.
    let mut b = t.plan("FAKE_BF16", 24, 3);
    b.id = "night-2".into();
    b.run_dir = b.run_dir.with_file_name("night-2");
    for plan in [&a, &b] {
        let mut control = t.engine.control();
        experiment::run_experiment(plan, &mut control, &Quiet, CancellationToken::new())
            .await
            .unwrap();
    }
    let out = bisect(&[
        "diff".as_ref(),
        a.run_dir.as_os_str(),
        b.run_dir.as_os_str(),
        "--format".as_ref(),
        "md".as_ref(),
    ]);
    let md = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        md.contains("| run | workload sessions | 32 | 24 | blocking |"),
        "{md}"
    );
    insta::with_settings!({filters => {
        let mut f = redactions();
        // Load figures move with the machine; keep the row, not its numbers.
        f.push((r"\| (peak running \([a-z]+\)|tokens/s|wall time \(s\)) \|[^\n]*", "| $1 | [load] |"));
        f
    }}, {
        insta::assert_snapshot!("diff_md_two_fake_runs", md);
    });

    let json = bisect(&[
        "diff".as_ref(),
        a.run_dir.as_os_str(),
        b.run_dir.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["kind"], "run");
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    let table = bisect(&[
        "diff".as_ref(),
        a.run_dir.as_os_str(),
        b.run_dir.as_os_str(),
    ]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("B - A [95% CI]"));
}

#[test]
fn diff_refuses_a_run_against_a_matrix_and_a_missing_run_json() {
    let dir = tempfile::tempdir().unwrap();
    let (run, matrix, empty) = (
        dir.path().join("run"),
        dir.path().join("matrix"),
        dir.path().join("empty"),
    );
    for d in [&run, &matrix, &empty] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(run.join("run.json"), r#"{"id": "r", "arms": []}"#).unwrap();
    std::fs::write(matrix.join("matrix.json"), r#"{"cells": []}"#).unwrap();
    let out = bisect(&["diff".as_ref(), run.as_os_str(), matrix.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot diff a run against a matrix"));
    let out = bisect(&["diff".as_ref(), run.as_os_str(), empty.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let expected = empty.join("run.json").display().to_string();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&expected),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bisect(&["reclassify".as_ref(), empty.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
}
