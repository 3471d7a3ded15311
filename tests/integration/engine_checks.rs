//! What bisect checks about the engines it measures (issue 8): a restart command that
//! did not restart its engine fails the arm; the effective configuration is read where
//! the profile says (URL, JSON pointer), and its absence is a recorded warning; the
//! API key never reaches a file bisect writes, its terminal output, or an engine's
//! environment.

use std::path::Path;
use std::process::Command;

use bisect_harness::arm::NO_EFFECTIVE_WARNING;
use bisect_harness::core::arm_stats::ArmLabel;
use bisect_harness::core::effective::EffectivePointer;
use bisect_harness::core::evidence::Severity;

use crate::common::{FakeTarget, DECODE_LAUNCH};
use crate::crash::{state_home, write_profile_with};

fn run_binary(t: &FakeTarget, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bisect"))
        .env("XDG_STATE_HOME", state_home(t))
        .envs(env.iter().copied())
        .args(["run", "--flag", "FAKE_BF16", "--flags-dir", "flags"])
        .args(["--target", "target.toml", "--workload", "smoke"])
        .args(extra)
        .current_dir(t.dir.path())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_command_that_restarts_nothing_fails_the_arm() {
    let t = FakeTarget::new().await;
    t.engine.reload().unwrap();
    t.engine.never_restart();
    let err = refused_restart(t, "health_timeout_s = 2\n").await;
    assert!(err.contains("restart of prefill did not happen"), "{err}");
    assert!(err.contains("still reports pid"), "{err}");
    assert!(err.contains("fix:"), "{err}");
}

/// Runs two sessions through the binary against `t` with a restart command per role
/// (the profile's `extra` role lines); the run must refuse its first restart: exit 3,
/// launch configs as before. Its stderr.
async fn refused_restart(t: FakeTarget, extra: &str) -> String {
    write_profile_with(&t, "", "", extra);
    let before = t.launch_bytes();
    let (out, t) = tokio::task::spawn_blocking(move || {
        let out = run_binary(&t, &["--sessions", "2"], &[]);
        (out, t)
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(t.launch_bytes(), before);
    err
}

/// Health that goes down and comes back is no proof when the engine still reports the
/// same pid and start time: the blink can be another role's restart (a decode whose
/// health reports a restarting prefill) while this role's own command restarted nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_that_blinks_on_the_same_process_is_no_restart() {
    let t = FakeTarget::new().await;
    t.engine.reload().unwrap();
    t.engine.never_restart_but_blink_health(60);
    // The blink lasts 60 health checks (about a second at the poll's 20 ms cap): long
    // enough for the restart watch (every 100 ms) to see it, well inside the timeout.
    let err = refused_restart(t, "health_timeout_s = 5\n").await;
    assert!(err.contains("did not happen"), "{err}");
    assert!(
        err.contains("went down and came back, but the engine still reports pid"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_pointer_reads_the_flag_where_the_engine_reports_it() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_BF16", 4, 2);
    // The fake reports stale `flags` (never honoured) but its real `env`: the profile's
    // pointer says to read the env, so the check sees what the engine runs with.
    t.engine.ignore_restarts();
    let prefill = &mut plan.target.roles[0];
    prefill.effective_url = Some(format!("http://{}/server_info", t.engine.prefill_addr));
    prefill.effective_pointers.insert(
        "FAKE_BF16".into(),
        EffectivePointer::plain("/env/FAKE_INDEX_BF16"),
    );
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    assert_eq!(record.arm(ArmLabel::On).unwrap().effective["prefill"], "1");
    assert_eq!(record.arm(ArmLabel::Off).unwrap().effective["prefill"], "0");
    assert!(!record.extra.contains_key("warnings"), "{:?}", record.extra);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_engine_reporting_the_flag_is_a_recorded_warning() {
    let t = FakeTarget::new().await;
    let mut plan = t.plan("FAKE_BF16", 4, 2);
    // Decode's document names the process but no flag.
    plan.target.roles[0].effective_url =
        Some(format!("http://{}/server_info", t.engine.decode_addr));
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    assert!(record.arm(ArmLabel::On).unwrap().effective.is_empty());
    assert_eq!(
        record.extra["warnings"],
        serde_json::json!([format!("FAKE_BF16: {NO_EFFECTIVE_WARNING}")])
    );
    let json = std::fs::read_to_string(plan.run_dir.join("run.json")).unwrap();
    assert!(json.contains(NO_EFFECTIVE_WARNING));
    // Not only in run.json: the verdict's confounds, reasons and summary say the flag's
    // value rests on the read-back alone, role by role, and so do summary.md and the page.
    let unverified: Vec<(&str, Severity)> = record
        .confounds
        .iter()
        .filter(|c| c.name.starts_with("unverified."))
        .map(|c| (c.name.as_str(), c.severity))
        .collect();
    assert_eq!(
        unverified,
        [
            ("unverified.decode", Severity::Warning),
            ("unverified.prefill", Severity::Warning)
        ]
    );
    let verdict = record.verdict.as_ref().unwrap();
    assert!(
        verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("warning: the prefill engine did not report the flag's value")),
        "{verdict:?}"
    );
    assert!(
        verdict
            .summary
            .contains("unverified.decode, unverified.prefill"),
        "{}",
        verdict.summary
    );
    for file in ["summary.md", "report.html"] {
        let text = std::fs::read_to_string(plan.run_dir.join(file)).unwrap();
        assert!(
            text.contains("the decode engine did not report the flag"),
            "{file}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_restarts_by_itself_during_an_arm_blocks_the_verdict() {
    let t = FakeTarget::new().await;
    let plan = t.plan("FAKE_BF16", 4, 2);
    // Decode "crashes" at the arm's second request and comes back at once, as under
    // systemd's Restart=always: every request still gets an answer.
    t.engine.crash_decode_after(2);
    let mut control = t.engine.control();
    let record = crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let on = record.arm(ArmLabel::On).unwrap();
    assert_eq!(on.stats.engine_replaced.len(), 1, "{:?}", on.stats);
    assert!(
        on.stats.engine_replaced[0].starts_with("role decode is another process")
            && on.stats.engine_replaced[0].contains("started gen-1 / listener")
            && on.stats.engine_replaced[0].contains("started gen-2 / listener")
            && on.stats.engine_replaced[0].contains("from the engine's self-report"),
        "{:?}",
        on.stats.engine_replaced
    );
    assert!(record
        .arm(ArmLabel::Off)
        .unwrap()
        .stats
        .engine_replaced
        .is_empty());
    let blocking: Vec<&str> = record
        .confounds
        .iter()
        .filter(|c| c.severity == bisect_harness::core::evidence::Severity::Blocking)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(blocking, vec!["engine_replaced"]);
    assert_eq!(
        record.verdict.as_ref().unwrap().status,
        bisect_harness::core::verdict::Status::Inconclusive
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_reaches_no_file_no_terminal_and_no_engine() {
    const KEY: &str = "sk-planted-3f9c2a7e51d04b88";
    let t = FakeTarget::new().await;
    let decode = DECODE_LAUNCH.replace(
        "export FAKE_RACE=1\n",
        "export FAKE_RACE=1\nexport FAKE_ECHO_KEY=1\n",
    );
    std::fs::write(&t.target.roles[1].launch, decode).unwrap();
    // The restart command dumps its environment into the log bisect keeps.
    write_profile_with(&t, "api_key_env = \"BISECT_TEST_KEY\"\n", "; env", "");
    let before = t.launch_bytes();
    let (out, t) = tokio::task::spawn_blocking(move || {
        let out = run_binary(
            &t,
            &[
                "--sessions",
                "2",
                "--rounds",
                "2",
                "--results",
                "results",
                "--json",
            ],
            &[("BISECT_TEST_KEY", KEY)],
        );
        (out, t)
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\"verdict\""),
        "the record was printed: {stdout}"
    );
    assert!(!err.contains(KEY) && !stdout.contains(KEY));
    assert_eq!(t.launch_bytes(), before);

    let mut files = Vec::new();
    files_under(&t.dir.path().join("results"), &mut files);
    let mut seen_echo = false;
    let mut seen_env = false;
    for file in &files {
        let text = String::from_utf8_lossy(&std::fs::read(file).unwrap()).into_owned();
        assert!(!text.contains(KEY), "{} holds the key", file.display());
        seen_echo |= text.contains("invalid API key: Bearer ***");
        seen_env |= file.to_string_lossy().ends_with("-restart.log") && text.contains("PATH=");
    }
    assert!(seen_echo, "the fake echoed the key and it was masked");
    assert!(
        seen_env,
        "a restart log holds the command's environment, without the key"
    );
    for name in ["run.json", "sessions.jsonl", "summary.md", "report.html"] {
        assert!(
            files.iter().any(|f| f.ends_with(name)),
            "{name} was written and checked"
        );
    }
}
