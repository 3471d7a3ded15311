//! Shared helpers: temporary fake targets, flag catalogs and plans.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bisect_harness::arm::TestbedOptions;
use bisect_harness::commands::run::RunPlan;
use bisect_harness::config::{FlagCatalog, RoleSpec, TargetProfile, Workload};
use bisect_harness::control::EngineControl;
use bisect_harness::core::evidence::Policy;
use bisect_harness::results::run_record::RunRecord;

use crate::fake::FakeEngine;

/// Tests whose verdicts rest on the machine's speed (the embedded race's rate, a real
/// model on llama-server, kill -9 timings) run one at a time: on a 2-core CI machine a
/// llama-server beside the embedded engine changes the race's rate between blocks, and
/// a search that assumes a constant rate per commit is misled (it then fails its own
/// verification, exit 3, as it should, but the test measures nothing).
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    // A failed heavy test must not fail the others with a poisoned lock.
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

pub const PREFILL_LAUNCH: &str = "#!/bin/sh\n# fake prefill\nexport FAKE_INDEX_BF16=1\nexec fake-engine --role prefill --port 1\n";
pub const DECODE_LAUNCH: &str = "#!/bin/sh\n# fake decode\nexport FAKE_INDEX_BF16=1\nexport FAKE_RACE=1\nexport FAKE_SLOW=0\nexport FAKE_SLOW_MS=800\nexec fake-engine --role decode --port 2 --fake-noise 0\n";

/// Flags of the fake engine, as catalog files.
pub const FAKE_FLAGS: &[(&str, &str)] = &[
    (
        "FAKE_BF16",
        "doc = \"fake index dtype\"\nenv = \"FAKE_INDEX_BF16\"\nroles = [\"prefill\", \"decode\"]\non = \"1\"\noff = \"0\"\n",
    ),
    (
        "FAKE_BF16_DECODE_ONLY",
        "doc = \"the same variable, listed for decode only: half-applied\"\nenv = \"FAKE_INDEX_BF16\"\nroles = [\"decode\"]\non = \"1\"\noff = \"0\"\n",
    ),
    (
        "FAKE_SLOW",
        "doc = \"slow decode\"\nenv = \"FAKE_SLOW\"\nroles = [\"decode\"]\non = \"1\"\noff = \"0\"\n",
    ),
    (
        "FAKE_RACE",
        "doc = \"the fake's race: with FAKE_BF16 on, a quarter of sessions corrupt\"\nenv = \"FAKE_RACE\"\nroles = [\"decode\"]\non = \"1\"\noff = \"0\"\n",
    ),
    (
        "FAKE_NOISE",
        "doc = \"speed noise only\"\narg = \"--fake-noise\"\nroles = [\"decode\"]\non = \"0\"\noff = \"3\"\n",
    ),
];

pub struct FakeTarget {
    pub dir: tempfile::TempDir,
    pub engine: FakeEngine,
    pub target: TargetProfile,
    pub catalog: FlagCatalog,
}

impl FakeTarget {
    pub async fn new() -> FakeTarget {
        let dir = tempfile::tempdir().unwrap();
        let prefill = dir.path().join("prefill.sh");
        let decode = dir.path().join("decode.sh");
        std::fs::write(&prefill, PREFILL_LAUNCH).unwrap();
        std::fs::write(&decode, DECODE_LAUNCH).unwrap();
        let flags = dir.path().join("flags");
        std::fs::create_dir_all(&flags).unwrap();
        for (name, text) in FAKE_FLAGS {
            std::fs::write(flags.join(format!("{name}.toml")), text).unwrap();
        }
        let engine = FakeEngine::start(prefill.clone(), decode.clone()).await;
        let role = |name: &str, launch: PathBuf, addr: std::net::SocketAddr| RoleSpec {
            name: name.into(),
            launch,
            restart: Some("true".into()),
            health: format!("http://{addr}/health"),
            metrics: Some(format!("http://{addr}/metrics")),
            health_timeout_s: 10,
            restart_timeout_s: 300,
            ..RoleSpec::new(name, PathBuf::new(), String::new(), None)
        };
        let target = TargetProfile {
            name: "fake".into(),
            api: format!("http://{}/v1", engine.decode_addr),
            model: "fake".into(),
            api_key_env: None,
            roles: vec![
                role("prefill", prefill, engine.prefill_addr),
                role("decode", decode, engine.decode_addr),
            ],
            source: None,
            engine: Default::default(),
            markup: bisect_harness::core::classify::MarkupFamily::ALL.to_vec(),
            flags_dir: None,
            rejections: Vec::new(),
            launch_scripts: Vec::new(),
            replica: None,
            replicas: Vec::new(),
        };
        let catalog = FlagCatalog::load(&[flags]).unwrap();
        FakeTarget {
            dir,
            engine,
            target,
            catalog,
        }
    }

    pub fn launch_bytes(&self) -> (Vec<u8>, Vec<u8>) {
        (
            std::fs::read(&self.target.roles[0].launch).unwrap(),
            std::fs::read(&self.target.roles[1].launch).unwrap(),
        )
    }

    /// The testbed of a test: journal under `results/`, state in the temp dir.
    pub fn testbed(&self) -> TestbedOptions {
        TestbedOptions {
            journal_dir: self.dir.path().join("results/.bisect-journal"),
            state_root: Some(self.dir.path().join("state")),
            allow_partial: false,
            metrics_period: Duration::from_millis(50),
            reference_cache: Some(self.dir.path().join("results/reference-cache")),
        }
    }

    pub fn plan(&self, flag: &str, sessions: u32, rounds: u32) -> RunPlan {
        let mut workload = bisect_harness::config::load_workload("smoke").unwrap();
        workload.sessions = sessions;
        workload.rounds = rounds;
        workload.timeout_s = 5.0;
        let results = self.dir.path().join("results");
        RunPlan {
            id: format!("test-{flag}"),
            command: format!("bisect run --flag {flag}"),
            flag: self.catalog.get(flag).unwrap().clone(),
            target: self.target.clone(),
            workload,
            repeats: 1,
            pins: Vec::new(),
            run_dir: results.join(format!("test-{flag}")),
            policy: Policy::default(),
            api_key: None,
            testbed: self.testbed(),
            oracle: None,
            adaptive: None,
            pressure: None,
            costs: Default::default(),
        }
    }

    /// Pin the catalog's `flag` to `value` in both arms of `plan` (`--set`).
    pub fn pin(&self, plan: &mut RunPlan, flag: &str, value: &str) {
        let spec = self.catalog.get(flag).unwrap().clone();
        plan.pins
            .push(bisect_harness::config::Pin::new(spec, value));
    }
}

/// How many of the workload's sessions the fake's race hits (task hash divisible by 4).
pub fn fake_race_victims(workload: &Workload, sessions: u32) -> u64 {
    (0..sessions)
        .filter(|i| {
            let (_, messages) = bisect_harness::core::task::initial_conversation(workload, *i);
            let task = messages.last().unwrap().content.clone().unwrap();
            crate::fake::task_hash(&task) % 4 == 0
        })
        .count() as u64
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Run the real binary in `cwd` and capture its output. Its per-target state goes to
/// a temp dir removed when it returns, never to the user's `~/.local/state`.
pub fn bisect(args: &[&str], cwd: &Path) -> std::process::Output {
    let state = tempfile::tempdir().unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args)
        .env("XDG_STATE_HOME", state.path())
        .current_dir(cwd)
        .output()
        .expect("running bisect")
}

/// `bisect run`'s protocol on `plan`, quietly, never cancelled.
pub async fn run_quiet(
    plan: &RunPlan,
    control: &mut dyn EngineControl,
) -> anyhow::Result<RunRecord> {
    use bisect_harness::commands::run::{run_experiment, Quiet};
    run_experiment(
        plan,
        control,
        &Quiet,
        tokio_util::sync::CancellationToken::new(),
    )
    .await
}

/// The run ended inconclusive, and one of its verdict's reasons `says` why.
pub fn assert_inconclusive_because(record: &RunRecord, says: impl Fn(&str) -> bool) {
    use bisect_harness::core::verdict::Status;
    let verdict = record.verdict.as_ref().unwrap();
    assert_eq!(verdict.status, Status::Inconclusive, "{verdict:?}");
    assert!(verdict.reasons.iter().any(|r| says(r)), "{verdict:?}");
}

/// `bisect check`'s tool-call probe row (`kind = "tool_calls"` in its report) says the
/// engine's reply came back as parsed tool calls.
#[track_caller]
pub fn assert_tool_calls_parsed(probe: &serde_json::Value) {
    assert!(
        probe["detail"]
            .as_str()
            .unwrap()
            .starts_with("the reply came back as parsed tool_calls"),
        "{probe}"
    );
}

/// Run the real binary with `--json` among `args`, require exit 0 and read the record it
/// prints (run.json, load.json, matrix.json).
pub fn bisect_json(args: &[&str], cwd: &Path) -> serde_json::Value {
    let out = bisect(args, cwd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the record on stdout")
}

/// A loopback port nothing listens on now (the embedded target's own finder).
pub fn free_port() -> u16 {
    bisect_harness::config::embedded::free_port().unwrap()
}

/// One flag of a [`mock_target`]: an environment variable of the mock's launch script,
/// exported at `start` until bisect writes it.
pub struct MockFlag<'a> {
    pub name: &'a str,
    pub env: &'a str,
    pub start: &'a str,
    pub doc: &'a str,
    pub on: &'a str,
    pub off: &'a str,
}

/// The real binary run in `dir` with `args`, its per-target state in `dir/state` (kept
/// with the test's other files, never the user's): for tests that look at that state or
/// run several commands over one folder.
pub fn bisect_in(dir: &Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args)
        .env("XDG_STATE_HOME", dir.join("state"))
        .current_dir(dir)
        .output()
        .expect("running bisect")
}

/// The directory of the record `record` (its `id`) under `dir/results/`.
pub fn record_dir(dir: &Path, record: &serde_json::Value) -> PathBuf {
    dir.join("results")
        .join(record["id"].as_str().expect("the record's id"))
}

/// `bisect run ARGS --target PROFILE --results DIR/results --json` in `dir`, its state in
/// `dir/state`: (exit code, run.json from stdout, stderr). Panics without a record.
pub fn run_record(
    dir: &Path,
    profile: &Path,
    args: &[&str],
) -> (Option<i32>, serde_json::Value, String) {
    let results = dir.join("results");
    let mut all: Vec<&std::ffi::OsStr> = vec!["run".as_ref()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    all.extend([
        "--target".as_ref(),
        profile.as_os_str(),
        "--results".as_ref(),
        results.as_os_str(),
        "--json".as_ref(),
    ]);
    let out = bisect_in(dir, &all);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let record = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no run.json on stdout ({e}): {stderr}"));
    (out.status.code(), record, stderr)
}

/// Each flag of a mock target as `dir/flags/NAME.toml`, on role `server`.
fn write_mock_flags(dir: &Path, flags: &[MockFlag<'_>]) {
    std::fs::create_dir_all(dir.join("flags")).unwrap();
    for f in flags {
        std::fs::write(
            dir.join(format!("flags/{}.toml", f.name)),
            format!(
                "doc = \"{}\"\nenv = \"{}\"\nroles = [\"server\"]\non = \"{}\"\noff = \"{}\"\n",
                f.doc, f.env, f.on, f.off
            ),
        )
        .unwrap();
    }
}

/// A one-role target in `dir` that spawns `bisect mock-engine` from `serve.sh` (which
/// exports each flag's variable at its `start`, and passes `--jitter-ms`), with `flags` in its
/// `flags/` directory: (the profile's path, the mock's port).
pub fn mock_target(dir: &Path, jitter_ms: u64, flags: &[MockFlag<'_>]) -> (PathBuf, u16) {
    let port = free_port();
    let exports: String = flags
        .iter()
        .map(|f| format!("export {}={}\n", f.env, f.start))
        .collect();
    std::fs::write(
        dir.join("serve.sh"),
        format!(
            "#!/bin/sh\n{exports}exec {} mock-engine --port {port} --jitter-ms {jitter_ms}\n",
            env!("CARGO_BIN_EXE_bisect")
        ),
    )
    .unwrap();
    write_mock_flags(dir, flags);
    let profile = dir.join("target.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"mock\"\napi = \"http://127.0.0.1:{port}/v1\"\nmodel = \"mock\"\nflags_dir = \"flags\"\n\n[[role]]\nname = \"server\"\nlaunch = \"serve.sh\"\nhealth = \"http://127.0.0.1:{port}/health\"\nmetrics = \"http://127.0.0.1:{port}/metrics\"\nhealth_timeout_s = 30\n"
        ),
    )
    .unwrap();
    (profile, port)
}

/// A target in `dir` with two replica sets, `a` and `b`, each one role spawning its own
/// `bisect mock-engine` on its own port (`serve-a.sh`, `serve-b.sh`, each exporting the
/// flags' variables at their `start` and passing `--token-delay-ms`), replica `b`'s
/// command line adding `plant_b` (a difference of its own, e.g. `--wrong-args-every 4`).
pub fn mock_replicas_target(
    dir: &Path,
    token_delay_ms: u64,
    flags: &[MockFlag<'_>],
    plant_b: &str,
) -> PathBuf {
    let exports: String = flags
        .iter()
        .map(|f| format!("export {}={}\n", f.env, f.start))
        .collect();
    let mut ports = Vec::new();
    for (set, extra) in [("a", ""), ("b", plant_b)] {
        let port = free_port();
        std::fs::write(
            dir.join(format!("serve-{set}.sh")),
            format!(
                "#!/bin/sh\n{exports}exec {} mock-engine --port {port} --token-delay-ms {token_delay_ms} {extra}\n",
                env!("CARGO_BIN_EXE_bisect")
            ),
        )
        .unwrap();
        ports.push(port);
    }
    write_mock_flags(dir, flags);
    let (a, b) = (ports[0], ports[1]);
    let profile = dir.join("target.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"mock-replicas\"\napi = \"http://127.0.0.1:{a}/v1\"\nmodel = \"mock\"\nflags_dir = \"flags\"\n\n\
             [[role]]\nname = \"server\"\nlaunch = \"serve-a.sh\"\nhealth = \"http://127.0.0.1:{a}/health\"\nmetrics = \"http://127.0.0.1:{a}/metrics\"\nhealth_timeout_s = 30\n\n\
             [[replica]]\nname = \"b\"\napi = \"http://127.0.0.1:{b}/v1\"\n\n\
             [[replica.role]]\nname = \"server\"\nlaunch = \"serve-b.sh\"\nhealth = \"http://127.0.0.1:{b}/health\"\nmetrics = \"http://127.0.0.1:{b}/metrics\"\nhealth_timeout_s = 30\n"
        ),
    )
    .unwrap();
    profile
}
