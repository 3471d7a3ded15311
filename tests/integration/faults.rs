//! The fault-injection suite (issue 8): a real `bisect run` (the built binary) against
//! the embedded engine, roles spawned by bisect, is killed or interrupted, and then:
//! - the launch configs are back byte for byte, content and mode (after the next
//!   invocation for kill -9; before the process exits for SIGINT/SIGTERM/SIGHUP);
//! - no process of the dead run survives: neither the process groups it recorded nor
//!   anything whose command line names this target's launch scripts or ports;
//! - no run reports a verdict measured on an engine it did not start: every engine in a
//!   finished run's `engine_info` names that run's bisect as its parent, and an
//!   interrupted run records no verdict.
//!
//! kill -9 lands at seeded random points (ChaCha8, seed [`SEED`]) spread over the
//! duration of a clean run measured first, and in each phase; the signals land in each
//! phase through the test-only pause hook (`BISECT_FAULT_PAUSE`, crates/harness/src/fault.rs). Other
//! fault classes live beside their setup: overlapping runs and a hanging restart
//! command in ownership.rs, kill -9 against restart-command roles in crash.rs. The
//! figures of README's "Guarantees" table come from the `faults:` lines these tests
//! print (`cargo test --test integration faults -- --nocapture`).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The suite's fixed seed.
const SEED: u64 = 0x00B1_5EC7_0008;
/// kill -9 trials in all, split over two tests.
const KILL_TRIALS: usize = 50;
/// Every this many kill -9 trials, the next invocation is a whole run (with a verdict)
/// instead of `bisect restore`.
const FULL_RUN_EVERY: usize = 5;

/// One fault test at a time: each keeps a pair of embedded engines busy, and the other
/// tests of this binary (some with load-sensitive margins) share the machine.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    crate::common::heavy()
}

/// A target of two embedded-engine roles that bisect spawns itself, in a temp dir.
struct Embedded {
    dir: tempfile::TempDir,
    ports: [u16; 2],
}

/// A launch config as the user owns it: bytes and permission bits.
type Owned = Vec<(Vec<u8>, u32)>;

impl Embedded {
    fn new() -> Embedded {
        use bisect_harness::config::embedded::{decode_script, free_port, prefill_script};
        let dir = tempfile::tempdir().unwrap();
        let exe = env!("CARGO_BIN_EXE_bisect");
        let prefill = free_port().unwrap();
        let mut decode = free_port().unwrap();
        while decode == prefill {
            decode = free_port().unwrap();
        }
        let write = |name: &str, text: String, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        // Two different modes, so a restore that loses the mode is seen.
        write("prefill.sh", prefill_script(exe, prefill), 0o750);
        write("decode.sh", decode_script(exe, decode, prefill), 0o640);
        let role = |name: &str, port: u16| {
            format!(
                "\n[[role]]\nname = \"{name}\"\nlaunch = \"{name}.sh\"\nhealth = \"http://127.0.0.1:{port}/health\"\nmetrics = \"http://127.0.0.1:{port}/metrics\"\nhealth_timeout_s = 120\n"
            )
        };
        std::fs::write(
            dir.path().join("target.toml"),
            format!(
                "name = \"faults\"\napi = \"http://127.0.0.1:{decode}/v1\"\nmodel = \"bisect-mini-dsv4\"\n{}{}",
                role("prefill", prefill),
                role("decode", decode)
            ),
        )
        .unwrap();
        Embedded {
            dir,
            ports: [prefill, decode],
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn owned(&self) -> Owned {
        ["prefill.sh", "decode.sh"]
            .iter()
            .map(|name| {
                let path = self.path(name);
                let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
                (std::fs::read(&path).unwrap(), mode)
            })
            .collect()
    }

    fn bisect(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bisect"));
        cmd.env("XDG_STATE_HOME", self.path("state"))
            .env_remove(bisect_harness::fault::ENV)
            .current_dir(self.dir.path());
        cmd
    }

    /// `bisect run` on this target, stderr into `err_name` (or piped when `None`).
    fn run(&self, results: &str, pause: Option<&str>, err_name: Option<&str>) -> Child {
        let mut cmd = self.bisect();
        cmd.args(["run", "--flag", "BF16_INDEX_K", "--target", "target.toml"])
            .args(["--workload", "smoke", "--sessions", "4", "--rounds", "3"])
            .args(["--results", results])
            .stdout(Stdio::null());
        if let Some(phase) = pause {
            cmd.env(bisect_harness::fault::ENV, phase);
        }
        match err_name {
            Some(name) => cmd.stderr(std::fs::File::create(self.path(name)).unwrap()),
            None => cmd.stderr(Stdio::piped()),
        };
        cmd.spawn().unwrap()
    }

    /// The state directories of the target's launch configs (one per file), once a
    /// command created them.
    fn state_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.path("state/bisect"))
            .map(|dirs| {
                dirs.map(|e| e.unwrap().path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Process groups the run recorded (`processes.json` of every launch config), if any.
    fn recorded_groups(&self) -> Vec<i32> {
        self.state_dirs()
            .iter()
            .filter_map(|d| std::fs::read(d.join("processes.json")).ok())
            .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .filter_map(|v| v.as_array().cloned())
            .flatten()
            .filter_map(|g| g["pgid"].as_i64().map(|p| p as i32))
            .collect()
    }

    /// Live (not zombie) processes of this target: a group in `groups`, or a command
    /// line naming its directory or one of its ports.
    fn survivors(&self, groups: &[i32]) -> Vec<String> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let ports: Vec<String> = self.ports.iter().map(|p| format!("--port\0{p}")).collect();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.len() < 3 || fields[0] == "Z" {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
            let in_group = fields[2].parse::<i32>().is_ok_and(|g| groups.contains(&g));
            // The test's own bisect commands use relative paths (the directory is their
            // cwd, which a command line does not show) and were waited for: only
            // launch scripts (`sh DIR/prefill.sh`) and engines (`--port P`) match.
            if in_group || cmdline.contains(&dir) || ports.iter().any(|p| cmdline.contains(p)) {
                found.push(format!("pid {pid}: {}", cmdline.replace('\0', " ")));
            }
        }
        found
    }

    /// Survivors after SIGKILL has had time to land (it is asynchronous).
    fn settled_survivors(&self, groups: &[i32]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.survivors(groups);
            if left.is_empty() || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Files that must not outlive a run: the journal, recorded groups, the lock, and
    /// half-written launch configs.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for state in self.state_dirs() {
            for name in ["journal.json", "processes.json", "lock.json"] {
                if state.join(name).exists() {
                    left.push(format!("{}/{name}", state.display()));
                }
            }
        }
        for entry in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".bisect-tmp") {
                left.push(name);
            }
        }
        left
    }
}

/// What one fault class came to over its trials.
#[derive(Default, Debug)]
struct Tally {
    trials: usize,
    configs_lost: usize,
    orphans: usize,
    wrong_engine: usize,
    verdicts: usize,
    /// Kills that found the launch configs edited / engines recorded as running: the
    /// trials where a lost restore or an orphan could have happened.
    edited_at_kill: usize,
    engines_at_kill: usize,
}

impl Tally {
    fn report(&self, class: &str) {
        // The figure the README's "Guarantees" table quotes.
        println!(
            "faults: {class}: {} trials ({} with configs edited, {} with engines running), configs lost {}, orphans {}, wrong-engine verdicts {} ({} finished runs checked)",
            self.trials,
            self.edited_at_kill,
            self.engines_at_kill,
            self.configs_lost,
            self.orphans,
            self.wrong_engine,
            self.verdicts
        );
        assert_eq!(
            (self.configs_lost, self.orphans, self.wrong_engine),
            (0, 0, 0),
            "{class}: {self:?}"
        );
    }
}

/// Whether every engine a finished run measured was a child of that run's bisect.
fn engines_were_its_own(run_json: &Path, bisect_pid: u32) -> bool {
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_json).unwrap()).unwrap();
    let info = record["engine_info"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    !info.is_empty()
        && info
            .values()
            .all(|doc| doc["ppid"].as_u64() == Some(u64::from(bisect_pid)))
}

/// The one run directory under `results`.
fn run_dir(results: &Path) -> PathBuf {
    std::fs::read_dir(results)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("run.json").exists())
        .unwrap_or_else(|| panic!("no run directory in {}", results.display()))
}

/// One clean run: its wall time (what the kill delays spread over) and its check.
fn clean_run(t: &Embedded, results: &str, tally: &mut Tally) -> Duration {
    let started = Instant::now();
    let child = t.run(results, None, Some("clean.err"));
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    let err = std::fs::read_to_string(t.path("clean.err")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{err}");
    let dir = run_dir(&t.path(results));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert!(record["verdict"].is_object(), "{record}");
    tally.verdicts += 1;
    if !engines_were_its_own(&dir.join("run.json"), pid) {
        tally.wrong_engine += 1;
    }
    took
}

/// kill -9 trials `range` of the seeded sequence, on one target.
fn kill_trials(range: std::ops::Range<usize>) {
    let _one = exclusive();
    let t = Embedded::new();
    let original = t.owned();
    let mut tally = Tally::default();
    // The shorter of two clean runs: a load spike during one would push the kills past
    // the end of the runs they are meant to land in.
    let run_time = clean_run(&t, "clean1", &mut tally).min(clean_run(&t, "clean2", &mut tally));
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    // Draw the whole sequence so both halves come from the one seeded stream.
    let fractions: Vec<f64> = (0..KILL_TRIALS).map(|_| rng.random::<f64>()).collect();
    for (trial, fraction) in fractions
        .iter()
        .enumerate()
        .take(range.end)
        .skip(range.start)
    {
        // Delays over 110% of a clean run: most land inside it, a few after its end.
        let delay = run_time.mul_f64(1.1 * fraction);
        let mut child = t.run(&format!("k{trial}"), None, Some("kill.err"));
        std::thread::sleep(delay);
        let groups = t.recorded_groups();
        child.kill().unwrap(); // SIGKILL: no chance to clean up
        child.wait().unwrap();
        let groups: Vec<i32> = groups.into_iter().chain(t.recorded_groups()).collect();
        tally.trials += 1;
        tally.edited_at_kill += usize::from(t.owned() != original);
        tally.engines_at_kill += usize::from(!groups.is_empty());

        let next_is_run = trial % FULL_RUN_EVERY == FULL_RUN_EVERY - 1;
        if next_is_run {
            // The next invocation restores, kills what is left, and runs on engines
            // it started itself.
            let results = format!("n{trial}");
            let before_next = Instant::now();
            let child = t.run(&results, None, Some("next.err"));
            let pid = child.id();
            let out = child.wait_with_output().unwrap();
            let err = std::fs::read_to_string(t.path("next.err")).unwrap_or_default();
            assert_eq!(
                out.status.code(),
                Some(0),
                "trial {trial} (killed after {delay:?}), next run: {err}"
            );
            assert!(before_next.elapsed() < Duration::from_secs(120));
            tally.verdicts += 1;
            if !engines_were_its_own(&run_dir(&t.path(&results)).join("run.json"), pid) {
                tally.wrong_engine += 1;
            }
        } else {
            let out = t.bisect().arg("restore").output().unwrap();
            assert!(
                out.status.success(),
                "trial {trial}: restore failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if t.owned() != original {
            tally.configs_lost += 1;
            eprintln!("trial {trial} (killed after {delay:?}): launch configs differ");
        }
        let left = t.settled_survivors(&groups);
        if !left.is_empty() {
            tally.orphans += 1;
            eprintln!("trial {trial} (killed after {delay:?}): survivors {left:?}");
        }
        let files = t.leftovers();
        assert!(files.is_empty(), "trial {trial}: left behind {files:?}");
    }
    tally.report(&format!(
        "kill -9 at seeded random points, trials {range:?}"
    ));
}

#[test]
fn kill_dash_nine_at_random_points_first_half() {
    kill_trials(0..KILL_TRIALS / 2);
}

#[test]
fn kill_dash_nine_at_random_points_second_half() {
    kill_trials(KILL_TRIALS / 2..KILL_TRIALS);
}

/// Phases as the pause hook names them, in the off arm (the on arm writes the value
/// the configs already hold, so a lost restore would not show): `editing:2` between
/// the off arm's two writes, `restarting:2` its restart, `health:3` its prefill's
/// health wait (each arm waits for two roles), `workload:2` its first session back;
/// `results:2` the record written after the first arm block (the first is written
/// before anything is edited).
const PHASES: [(&str, &str); 5] = [
    ("editing", "editing:2"),
    ("restarting", "restarting:2"),
    ("health wait", "health:3"),
    ("mid-workload", "workload:2"),
    ("writing results", "results:2"),
];

/// SIGINT, SIGTERM and SIGHUP in every phase: exit 130, configs restored before the
/// process exits, nothing left running, no verdict in the record. SIGKILL in every
/// phase: the same once `bisect restore` has run (the kill -9 trials at points no
/// timing decides).
fn signal_in_every_phase(signal: Signal) {
    let _one = exclusive();
    let t = Embedded::new();
    let original = t.owned();
    let mut tally = Tally::default();
    for (i, (name, pause)) in PHASES.iter().enumerate() {
        let results = format!("s{i}");
        let mut child = t.run(&results, Some(pause), None);
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let marker = format!("fault-pause: {}", pause.split(':').next().unwrap());
        let mut seen = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            let hit = line == marker;
            seen.push(line);
            if hit {
                break;
            }
        }
        assert_eq!(
            seen.last(),
            Some(&marker),
            "{name}: never paused: {seen:#?}"
        );
        let groups = t.recorded_groups();
        tally.edited_at_kill += usize::from(t.owned() != original);
        tally.engines_at_kill += usize::from(!groups.is_empty());
        if *name != "writing results" {
            assert_ne!(
                t.owned(),
                original,
                "{name}: the off arm's configs are in place"
            );
        }
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = child.wait().unwrap();
        tally.trials += 1;
        if signal == Signal::SIGKILL {
            let out = t.bisect().arg("restore").output().unwrap();
            assert!(out.status.success(), "{name}: restore failed: {out:?}");
        } else {
            assert_eq!(
                status.code(),
                Some(130),
                "{signal} in {name}: {seen:#?}\n{rest:#?}"
            );
        }
        if t.owned() != original {
            tally.configs_lost += 1;
            eprintln!("{signal} in {name}: launch configs differ after exit");
        }
        let left = t.settled_survivors(&groups);
        if !left.is_empty() {
            tally.orphans += 1;
            eprintln!("{signal} in {name}: survivors {left:?}");
        }
        assert!(
            t.leftovers().is_empty(),
            "{signal} in {name}: {:?}",
            t.leftovers()
        );
        let record: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(run_dir(&t.path(&results)).join("run.json")).unwrap(),
        )
        .unwrap();
        if signal != Signal::SIGKILL {
            assert_eq!(record["status"], "interrupted", "{signal} in {name}");
        }
        if !record["verdict"].is_null() {
            tally.wrong_engine += 1;
        }
    }
    tally.report(&format!("{signal} in every phase"));
}

#[test]
fn kill_dash_nine_in_every_phase() {
    signal_in_every_phase(Signal::SIGKILL);
}

#[test]
fn sigint_in_every_phase() {
    signal_in_every_phase(Signal::SIGINT);
}

#[test]
fn sigterm_in_every_phase() {
    signal_in_every_phase(Signal::SIGTERM);
}

#[test]
fn sighup_in_every_phase() {
    signal_in_every_phase(Signal::SIGHUP);
}
