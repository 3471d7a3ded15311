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

/// A run whose stderr reader went away (`bisect run 2>&1 | tee log`, tee killed) still
/// hears SIGTERM: its progress lines and the signal's message are dropped, not a panic
/// that killed the signal task before it cancelled the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_stderr_closed_still_restores_and_exits_130() {
    let t = FakeTarget::new().await;
    let (mut child, before) = start_run_until_edited(&t, Stdio::piped()).await;
    drop(child.stderr.take());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || {
        // A run deaf to the signal would finish its arms on its own (the fake is fast),
        // so the exit code, not a hang, is what tells.
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(t.launch_bytes(), before, "restored before exiting");
}

/// Runs `plan` in process with `control`; the run must fail: its error.
async fn run_must_fail(
    plan: &bisect_harness::commands::run::RunPlan,
    control: &mut Meddled,
) -> anyhow::Error {
    bisect_harness::commands::run::run_experiment(
        plan,
        control,
        &bisect_harness::commands::run::Quiet,
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap_err()
}

/// The fake's control with someone else's hand on the files: `after_restart(n)` runs
/// after the n-th restart (1-based), `before_stop(n)` before each stop, n restarts done.
struct Meddled {
    inner: crate::fake::FakeControl,
    restarts: u32,
    after_restart: Box<dyn FnMut(u32) + Send>,
    before_stop: Box<dyn FnMut(u32) + Send>,
}

impl Meddled {
    fn new(t: &FakeTarget) -> Meddled {
        Meddled {
            inner: t.engine.control(),
            restarts: 0,
            after_restart: Box::new(|_| {}),
            before_stop: Box::new(|_| {}),
        }
    }
}

impl bisect_harness::control::EngineControl for Meddled {
    fn restart<'a>(
        &'a mut self,
        label: &'a str,
        cancel: &'a tokio_util::sync::CancellationToken,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<std::collections::BTreeMap<String, f64>>>
    {
        Box::pin(async move {
            let waits = self.inner.restart(label, cancel).await?;
            self.restarts += 1;
            (self.after_restart)(self.restarts);
            Ok(waits)
        })
    }

    fn stop(&mut self) -> futures::future::BoxFuture<'_, anyhow::Result<()>> {
        (self.before_stop)(self.restarts);
        self.inner.stop()
    }
}

/// Issue: each arm's edit re-read the launch config, so a change someone made during
/// the first arm ran in every later arm (the arms then differed by more than the flag,
/// with no confound), and the restore then wrote over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_by_someone_else_during_a_run_stops_it_and_is_kept() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = t.plan("FAKE_BF16", 4, 1);
    let decode = t.target.roles[1].launch.canonicalize().unwrap();
    let theirs = format!(
        "{}# someone's own change\n",
        crate::common::DECODE_LAUNCH.replace("FAKE_SLOW_MS=800", "FAKE_SLOW_MS=900")
    );
    let mut control = Meddled::new(&t);
    {
        let (decode, theirs) = (decode.clone(), theirs.clone());
        control.after_restart = Box::new(move |n| {
            if n == 1 {
                let text = std::fs::read_to_string(&decode).unwrap();
                // Whatever the first arm wrote, plus their change.
                let line = text
                    .lines()
                    .find(|l| l.contains("FAKE_INDEX_BF16"))
                    .unwrap();
                std::fs::write(&decode, theirs.replace("export FAKE_INDEX_BF16=1", line)).unwrap();
            }
        });
    }
    let err = run_must_fail(&plan, &mut control).await;
    let msg = format!("{err:#}");
    assert!(
        msg.contains(&decode.display().to_string())
            && msg.contains("the arms would differ by more than the flag"),
        "{msg}"
    );
    assert_eq!(bisect_harness::commands::code_for_error(&err), 3);
    assert_eq!(control.restarts, 1, "no second arm");
    assert_eq!(t.launch_bytes(), before, "the original is back");
    let kept: Vec<_> = std::fs::read_dir(decode.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("decode.sh.changed-during-bisect-")
        })
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let kept_text = std::fs::read_to_string(&kept[0]).unwrap();
    assert!(kept_text.contains("# someone's own change") && kept_text.contains("FAKE_SLOW_MS=900"));
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan.run_dir.join("run.json")).unwrap())
            .unwrap();
    assert_eq!(run["status"], "failed");
}

/// Issue: on a full disk the restore failed, then writing run.json failed too, and its
/// `?` returned before the restore's error was combined in: the user read only "writing
/// run.tmp~: No space left on device", not that the launch configs were still edited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restore_is_reported_first_when_the_results_cannot_be_written_either() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let mut plan = t.plan("FAKE_BF16", 4, 1);
    // Pinned for every arm, so decode.sh differs from its original at the end.
    t.pin(&mut plan, "FAKE_NOISE", "3");
    let decode = &t.target.roles[1].launch;
    let decode_tmp = decode.with_file_name(".decode.sh.bisect-tmp");
    let record_tmp = plan.run_dir.join("run.tmp~");
    // The close's stop (after both arms' restarts) leaves the disk as a full one would:
    // a directory where the atomic writes of decode.sh and of run.json put their temp
    // files, so both the restore and the record's write fail.
    let mut control = Meddled::new(&t);
    let blocked = [decode_tmp.clone(), record_tmp.clone()];
    control.before_stop = Box::new(move |restarts| {
        if restarts == 2 {
            for path in &blocked {
                std::fs::create_dir_all(path).unwrap();
            }
        }
    });
    let err = run_must_fail(&plan, &mut control).await;
    let msg = format!("{err:#}");
    assert!(
        msg.starts_with("restoring the original launch configs"),
        "{msg}"
    );
    assert!(
        msg.contains(&decode.canonicalize().unwrap().display().to_string()),
        "{msg}"
    );
    assert!(
        msg.contains("the results could not be written either") && msg.contains("run.tmp~"),
        "{msg}"
    );
    assert_ne!(t.launch_bytes(), before, "the configs are still edited");

    // Once there is room again, the journal that was kept puts the originals back.
    std::fs::remove_dir(&decode_tmp).unwrap();
    std::fs::remove_dir(&record_tmp).unwrap();
    let recovery = bisect_harness::launch::recover_at(
        plan.testbed.state_root.as_deref().unwrap(),
        &plan.testbed.journal_dir,
    )
    .unwrap();
    assert!(!recovery.restored.is_empty());
    assert_eq!(t.launch_bytes(), before);
}
