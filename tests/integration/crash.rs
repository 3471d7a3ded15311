//! kill -9 in the middle of a run: the launch configs are left edited, and the next
//! start (or `bisect restore`) puts the originals back byte for byte. The journal lives
//! in the target's state under `$XDG_STATE_HOME/bisect`, which these tests point into
//! their temp dir.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::FakeTarget;

/// Where the bisect processes of a test keep their per-target state.
pub fn state_home(t: &FakeTarget) -> std::path::PathBuf {
    t.dir.path().join("state")
}

/// The journal of the one target under `dir/state`, if there is one.
pub fn journal_path(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    std::fs::read_dir(dir.join("state/bisect"))
        .ok()?
        .map(|e| e.unwrap().path().join("journal.json"))
        .find(|p| p.exists())
}

/// The fake target as a profile file for the real binary: each role's restart command
/// touches the fake's restart marker (a real restart, in the fake's world), then runs
/// `restart_tail`. `top` is added to the profile's top-level keys, `role_extra` to
/// every role.
pub fn write_profile_with(
    t: &FakeTarget,
    top: &str,
    restart_tail: &str,
    role_extra: &str,
) -> std::path::PathBuf {
    let mut text = format!(
        "name = \"fake\"\napi = \"{}\"\nmodel = \"fake\"\n{top}",
        t.target.api
    );
    for (i, role) in t.target.roles.iter().enumerate() {
        text.push_str(&format!(
            "\n[[role]]\nname = \"{}\"\nlaunch = \"{}\"\nrestart = \"touch '{}'{restart_tail}\"\nhealth = \"{}\"\nmetrics = \"{}\"\n{role_extra}",
            role.name,
            role.launch.file_name().unwrap().to_str().unwrap(),
            t.engine.restart_marker(i).display(),
            role.health,
            role.metrics.as_deref().unwrap()
        ));
    }
    let path = t.dir.path().join("target.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn write_profile(t: &FakeTarget) -> std::path::PathBuf {
    write_profile_with(t, "", "", "")
}

/// Start `bisect run` as a child process against a slowed-down fake and return once it
/// has written the off arm's values (the launch configs then differ from `before`).
async fn start_run_until_edited(
    t: &FakeTarget,
    stderr: Stdio,
) -> (std::process::Child, (Vec<u8>, Vec<u8>)) {
    // Make the fake slow so the run is still in an arm when it is stopped.
    let decode = &t.target.roles[1].launch;
    let slow = crate::common::DECODE_LAUNCH.replace("FAKE_SLOW=0", "FAKE_SLOW=1");
    std::fs::write(decode, &slow).unwrap();
    t.engine.reload().unwrap();
    let before = t.launch_bytes();
    let profile = write_profile(t);
    let child = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .env("XDG_STATE_HOME", state_home(t))
        .args([
            "run",
            "--flag",
            "FAKE_BF16",
            "--flags-dir",
            "flags",
            "--target",
        ])
        .arg(&profile)
        .args(["--workload", "smoke", "--sessions", "4", "--timeout", "20"])
        .current_dir(t.dir.path())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    // The on arm's value equals the original: wait for the off arm's edit.
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.launch_bytes() == before {
        assert!(Instant::now() < deadline, "bisect never wrote the off arm");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_then_next_start_restores() {
    let t = FakeTarget::new().await;
    let (mut child, before) = start_run_until_edited(&t, Stdio::null()).await;
    let journal = journal_path(t.dir.path()).expect("journal written before the first edit");
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    assert_ne!(t.launch_bytes(), before, "the kill left the configs edited");

    // The next start replays the journal before anything else, even a failing command.
    let out = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .env("XDG_STATE_HOME", state_home(&t))
        .args(["run", "--flag", "NOPE"])
        .current_dir(t.dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("restored"), "{err}");
    assert_eq!(t.launch_bytes(), before);
    assert!(!journal.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_restores_and_exits_130() {
    let t = FakeTarget::new().await;
    let (mut child, before) = start_run_until_edited(&t, Stdio::piped()).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert_eq!(out.0.code(), Some(130), "{}", out.1);
    assert_eq!(t.launch_bytes(), before, "restored before exiting");
    let results = t.dir.path().join("results");
    let run_dir = std::fs::read_dir(&results)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("run.json").exists())
        .unwrap();
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["status"], "interrupted");
}
