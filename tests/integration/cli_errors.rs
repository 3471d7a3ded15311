//! Bad input through the real binary: exit 2 with file:line and a fix, nothing touched;
//! an engine that never becomes healthy: exit 3, launch configs restored.

use crate::common::bisect;
use std::path::Path;

/// Runs `bisect ARGS` in `dir`, checks its exit code and returns its stderr.
fn exits_with(code: i32, args: &[&str], dir: &Path) -> String {
    let out = bisect(args, dir);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    stderr
}

/// `bisect run --flag FLAG --target PROFILE`, then `extra`.
fn run_args<'a>(flag: &'a str, profile: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--flag", flag, "--target", profile.to_str().unwrap()];
    args.extend_from_slice(extra);
    args
}

/// A target profile whose single role is `sh launch.sh`, on a dead port.
fn write_target(dir: &Path, launch_text: &str, extra: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("serve.sh"), launch_text).unwrap();
    let profile = dir.join("target.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"t\"\napi = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n{extra}\n[[role]]\nname = \"prefill\"\nlaunch = \"serve.sh\"\nhealth = \"http://127.0.0.1:9/health\"\nhealth_timeout_s = 2\n\n[[role]]\nname = \"decode\"\nlaunch = \"serve.sh\"\nhealth = \"http://127.0.0.1:9/health\"\nhealth_timeout_s = 2\n"
        ),
    )
    .unwrap();
    profile
}

#[test]
fn malformed_target_toml_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("target.toml");
    std::fs::write(
        &profile,
        "name = \"t\"\napi = \"http://x/v1\"\nmodel = = \"m\"\n",
    )
    .unwrap();
    let err = exits_with(2, &run_args("BF16_INDEX_K", &profile, &[]), dir.path());
    assert!(err.contains("target.toml:3"), "{err}");
}

#[test]
fn unknown_flag_lists_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let err = exits_with(2, &["run", "--flag", "NOPE"], dir.path());
    assert!(
        err.contains("NOPE") && err.contains("BF16_INDEX_K") && err.contains("HICACHE"),
        "{err}"
    );
    assert!(
        !dir.path().join("results").exists(),
        "nothing written for bad input"
    );
}

#[test]
fn shell_metacharacters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let set = [
        "run",
        "--flag",
        "BF16_INDEX_K",
        "--set",
        "TOPK_V2=1;rm -rf /",
    ];
    exits_with(2, &set, dir.path());
    let flags = dir.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    std::fs::write(
        flags.join("EVIL.toml"),
        "doc = \"x\"\nenv = \"EVIL\"\nroles = [\"decode\"]\non = \"$(reboot)\"\noff = \"0\"\n",
    )
    .unwrap();
    let err = exits_with(
        2,
        &["run", "--flag", "EVIL", "--flags-dir", "flags"],
        dir.path(),
    );
    assert!(err.contains("EVIL.toml:4"), "{err}");
}

#[test]
fn missing_launch_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let profile = write_target(dir.path(), "#!/bin/sh\nexec true\n", "");
    std::fs::remove_file(dir.path().join("serve.sh")).unwrap();
    let err = exits_with(2, &run_args("BF16_INDEX_K", &profile, &[]), dir.path());
    assert!(err.contains("serve.sh"), "{err}");
}

#[test]
fn launch_file_without_a_place_for_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let text = "# only comments, no command to add --cuda-graph-max-bs to\n";
    let profile = write_target(dir.path(), text, "");
    let err = exits_with(2, &run_args("CUDA_GRAPH_MAX_BS", &profile, &[]), dir.path());
    assert!(err.contains("serve.sh"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("serve.sh")).unwrap(),
        text
    );
}

#[test]
fn engine_never_healthy_is_exit_3_and_configs_restored() {
    let dir = tempfile::tempdir().unwrap();
    let text = "#!/bin/sh\nexport SGLANG_DSV4_BF16_INDEX_K=1\nexec sleep 20\n";
    let profile = write_target(dir.path(), text, "");
    let args = run_args("BF16_INDEX_K", &profile, &["--sessions", "2"]);
    let err = exits_with(3, &args, dir.path());
    assert!(err.contains("not healthy"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("serve.sh")).unwrap(),
        text
    );
}

/// A search whose first restart never gets healthy still held the engines for it: its
/// cost counts the restart and its seconds (issue 45's meter), though no block ran.
#[test]
fn a_failed_restart_is_metered() {
    let dir = tempfile::tempdir().unwrap();
    let text = "#!/bin/sh\nexport SGLANG_DSV4_BF16_INDEX_K=1\nexec sleep 20\n";
    let profile = write_target(dir.path(), text, "");
    let args = [
        "culprit",
        "--flags",
        "BF16_INDEX_K,TOPK_V2",
        "--target",
        profile.to_str().unwrap(),
    ];
    let err = exits_with(3, &args, dir.path());
    assert!(err.contains("not healthy"), "{err}");
    let results: Vec<_> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path().join("culprit.json"))
        .collect();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&results[0]).unwrap()).unwrap();
    let cost = &record["cost"];
    assert_eq!(cost["restarts"], 1, "{cost:#}");
    assert!(cost["restart_s"].as_f64().unwrap() >= 2.0, "{cost:#}");
    assert_eq!(record["blocks"].as_array().unwrap().len(), 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("serve.sh")).unwrap(),
        text
    );
}

#[test]
fn flags_command_lists_catalog_with_docs() {
    let dir = tempfile::tempdir().unwrap();
    let out = bisect(&["flags"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "BF16_INDEX_K",
        "HICACHE",
        "INDEX_K_HICACHE_SYNC",
        "MMA_FLASHMLA",
        "TOPK_V2",
        "CUDA_GRAPH_MAX_BS",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(text.contains("SGLANG_DSV4_BF16_INDEX_K"));
}

#[test]
fn usage_error_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    exits_with(2, &["run"], dir.path());
    exits_with(
        2,
        &["run", "--flag", "BF16_INDEX_K", "--repeats", "0"],
        dir.path(),
    );
}

#[test]
fn adaptive_usage_errors_are_exit_2_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    // --max-sessions belongs to --adaptive.
    exits_with(
        2,
        &["run", "--flag", "BF16_INDEX_K", "--max-sessions", "400"],
        dir.path(),
    );
    // Adaptive blocks alternate on their own: --repeats does not apply.
    let out = exits_with(
        2,
        &[
            "run",
            "--flag",
            "BF16_INDEX_K",
            "--adaptive",
            "--repeats",
            "2",
        ],
        dir.path(),
    );
    assert!(
        out.contains("--repeats does not apply to --adaptive"),
        "{out}"
    );
    // A cap below one block at the load.
    let out = exits_with(
        2,
        &[
            "run",
            "--flag",
            "BF16_INDEX_K",
            "--adaptive",
            "--concurrency",
            "40",
            "--max-sessions",
            "20",
        ],
        dir.path(),
    );
    assert!(
        out.contains("--max-sessions 20 is below the concurrency 40"),
        "{out}"
    );
    assert!(!dir.path().join("results").exists(), "nothing was started");
}

#[test]
fn history_of_a_directory_without_nights_says_how_to_make_them() {
    let dir = tempfile::tempdir().unwrap();
    let err = exits_with(2, &["history", "."], dir.path());
    assert!(err.contains("holds no matrix"), "{err}");
    assert!(err.contains("bisect matrix PLAN --results DIR"), "{err}");
    let err = exits_with(2, &["history", "no-such-dir"], dir.path());
    assert!(err.contains("cannot list"), "{err}");
}

#[test]
fn a_plan_commits_table_without_a_build_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("engine/.git")).unwrap();
    std::fs::write(
        dir.path().join("plan.toml"),
        "name = \"p\"\nsessions = [1]\n[axes]\nTOPK_V2 = [\"1\"]\n[commits]\nrepo = \"engine\"\n",
    )
    .unwrap();
    let err = exits_with(2, &["matrix", "plan.toml", "--no-baseline"], dir.path());
    assert!(err.contains("plan.toml:5"), "{err}");
    assert!(err.contains("exactly one of build and artifact"), "{err}");
}
