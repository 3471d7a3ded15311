//! Engine control against real processes and a live HTTP health endpoint.

use super::*;

/// A one-role target on a dead port.
fn solo_target(launch: PathBuf, restart: Option<&str>, health_timeout_s: u64) -> TargetProfile {
    // A profile's launch config exists (loading checks it), and restarting takes its
    // lock even where a restart command does the work.
    if !launch.exists() {
        std::fs::write(&launch, "#!/bin/sh\n").unwrap();
    }
    TargetProfile {
        name: "t".into(),
        api: "http://127.0.0.1:9/v1".into(),
        model: "m".into(),
        api_key_env: None,
        roles: vec![RoleSpec {
            name: "solo".into(),
            launch,
            restart: restart.map(String::from),
            health: "http://127.0.0.1:9/health".into(),
            metrics: None,
            health_timeout_s,
            restart_timeout_s: 300,
            ..RoleSpec::new("solo", PathBuf::new(), String::new(), None)
        }],
        source: None,
        engine: Default::default(),
        markup: crate::core::classify::MarkupFamily::ALL.to_vec(),
        flags_dir: None,
        rejections: Vec::new(),
        launch_scripts: Vec::new(),
        replica: None,
        replicas: Vec::new(),
    }
}

#[test]
fn log_tail_keeps_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.log");
    std::fs::write(&p, "a\nb\nc\nd\n").unwrap();
    assert_eq!(log_tail(&p, 2), "c\nd");
    assert_eq!(log_tail(&p, 10), "a\nb\nc\nd");
}

/// A one-role target whose role bisect spawns from `script`, written into `dir`.
fn spawned_solo(dir: &Path, script: &str, health_timeout_s: u64) -> TargetProfile {
    let launch = dir.join("role.sh");
    std::fs::write(&launch, script).unwrap();
    solo_target(launch, None, health_timeout_s)
}

/// Control of `target` without an API key, its logs and state kept in `dir`.
fn control_in(dir: &Path, target: &TargetProfile) -> ProcessControl {
    ProcessControl::new(target, &dir.join("logs"), None)
        .unwrap()
        .with_state_root(&dir.join("state"))
}

/// The error of a restart that must fail.
async fn failed_restart(ctl: &mut ProcessControl, label: &str) -> anyhow::Error {
    ctl.restart(label, &CancellationToken::new())
        .await
        .unwrap_err()
}

#[tokio::test]
async fn spawned_role_that_exits_reports_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo starting up\necho boom >&2\nexit 7\n";
    let mut ctl = control_in(dir.path(), &spawned_solo(dir.path(), script, 30));
    let err = failed_restart(&mut ctl, "on").await;
    let msg = format!("{err:#}");
    assert!(msg.contains("exited"), "{msg}");
    assert!(msg.contains("boom"), "{msg}");
    assert_eq!(
        crate::commands::code_for_error(&err),
        crate::exit::COULD_NOT_RUN
    );
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_start_names_the_first_error_far_above_the_tail() {
    // vLLM's shape: the engine core's traceback (the cause), then pages of shutdown, then
    // the API server's own summary, which is all a 20-line tail would show.
    let dir = tempfile::tempdir().unwrap();
    let script = "echo 'INFO starting'\n\
        echo 'Traceback (most recent call last):' >&2\n\
        echo '  File \"core.py\", line 3, in run' >&2\n\
        echo '(EngineCore pid=9) ERROR [core.py:712] ValueError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.' >&2\n\
        for i in $(seq 1 40); do echo \"INFO shutting down $i\"; done\n\
        echo 'RuntimeError: Engine core initialization failed. See root cause above.' >&2\n\
        exit 1\n";
    let mut ctl = control_in(dir.path(), &spawned_solo(dir.path(), script, 30));
    let msg = format!("{:#}", failed_restart(&mut ctl, "on").await);
    let cause = msg.find("the first error in").expect(&msg);
    let tail = msg.find("last lines of").expect(&msg);
    assert!(cause < tail, "{msg}");
    assert!(
        msg[cause..tail].contains("line 4: (EngineCore pid=9) ERROR [core.py:712] ValueError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
        "{msg}"
    );
    assert!(
        !msg[tail..].contains("ValueError"),
        "the tail alone misses it: {msg}"
    );
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn an_engine_that_exits_at_once_beside_lingering_connections_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    // A connection to the role's port that the client closed first: TIME_WAIT, 60 s.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (served, _) = listener.accept().unwrap();
    drop(client);
    std::thread::sleep(Duration::from_millis(50));
    drop(served);
    drop(listener);
    let url = format!("http://127.0.0.1:{port}/health");
    assert!(identity::port_lingering(&url).unwrap() > 0);
    // The first start fails at once (as a server that cannot bind), the second serves.
    let marker = dir.path().join("started-once");
    let script = format!(
        "if [ ! -e {m} ]; then touch {m}; echo \"E couldn't bind\"; exit 1; fi\nexec python3 -c '{py}' {port}\n",
        m = marker.display(),
        py = REUSEPORT_SERVER,
    );
    let mut target = spawned_solo(dir.path(), &script, 30);
    target.roles[0].health = url;
    let mut ctl = control_in(dir.path(), &target).with_linger_wait(Duration::from_millis(300));
    ctl.restart("on", &CancellationToken::new()).await.unwrap();
    let log = std::fs::read_to_string(dir.path().join("logs/on-solo.log")).unwrap();
    assert!(
        log.contains("bisect: the start above failed while connections to its port lingered"),
        "{log}"
    );
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_does_not_stop_for_its_caller_and_refuses_over_a_running_role() {
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = control_in(dir.path(), &spawned_solo(dir.path(), "exec sleep 600\n", 1));
    // Never healthy on the dead port: the spawned role is left running.
    let err = failed_restart(&mut ctl, "on").await;
    assert!(format!("{err:#}").contains("not healthy"), "{err:#}");
    let err = failed_restart(&mut ctl, "off").await;
    assert!(format!("{err:#}").contains("still running"), "{err:#}");
    ctl.stop().await.unwrap();
    assert!(ctl.spawned.is_empty());
}

/// What a spawned role sees of `$HOME` when the profile names HOME as the API key's
/// variable (a variable every test environment has, so no test sets one).
async fn home_seen_by_spawned_role(pass_api_key: bool) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut target = spawned_solo(dir.path(), "echo \"home=[$HOME]\"\nexit 7\n", 30);
    target.api_key_env = Some("HOME".into());
    target.roles[0].pass_api_key = pass_api_key;
    let mut ctl = control_in(dir.path(), &target);
    let err = failed_restart(&mut ctl, "on").await;
    ctl.stop().await.unwrap();
    let msg = format!("{err:#}");
    let at = msg
        .find("home=[")
        .expect("the role's output is in the error");
    msg[at..].lines().next().unwrap().to_string()
}

#[tokio::test]
async fn spawned_roles_do_not_inherit_the_key_variable_unless_the_profile_says() {
    let home = std::env::var("HOME").expect("tests run with HOME set");
    assert_eq!(home_seen_by_spawned_role(false).await, "home=[]");
    assert_eq!(
        home_seen_by_spawned_role(true).await,
        format!("home=[{home}]")
    );
}

fn solo_with_restart_timeout(dir: &Path, cmd: &str, restart_timeout_s: u64) -> TargetProfile {
    let mut target = solo_target(dir.join("unused.sh"), Some(cmd), 1);
    target.roles[0].restart_timeout_s = restart_timeout_s;
    target
}

/// The pid the restart command wrote, once it has started.
async fn restart_pid(path: &Path) -> i32 {
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn group_gone(pgid: i32) -> bool {
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_err()
}

#[tokio::test]
async fn cancelling_a_hanging_restart_command_kills_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("restart.pid");
    let cmd = format!("echo $$ > {}; sleep 600 & wait", pid_file.display());
    let target = solo_with_restart_timeout(dir.path(), &cmd, 600);
    let mut ctl = control_in(dir.path(), &target);
    let cancel = CancellationToken::new();
    let canceller = {
        let cancel = cancel.clone();
        let pid_file = pid_file.clone();
        tokio::spawn(async move {
            let pid = restart_pid(&pid_file).await;
            cancel.cancel();
            pid
        })
    };
    let err = ctl.restart("on", &cancel).await.unwrap_err();
    assert_eq!(
        crate::commands::code_for_error(&err),
        crate::exit::INTERRUPTED
    );
    let pgid = canceller.await.unwrap();
    // SIGKILL is delivered before wait() returns for the leader; its background
    // child may take a moment to be reaped by init.
    for _ in 0..500 {
        if group_gone(pgid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        std::fs::read_dir("/proc").unwrap().all(|e| {
            let stat = std::fs::read_to_string(e.unwrap().path().join("stat")).unwrap_or_default();
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let fields: Vec<&str> = rest.split_whitespace().collect();
            !(fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z")
        }),
        "a live member of the restart command's group {pgid} survived"
    );
}

#[tokio::test]
async fn a_restart_command_past_its_timeout_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let target = solo_with_restart_timeout(dir.path(), "echo hanging; sleep 600", 1);
    let mut ctl = control_in(dir.path(), &target);
    let err = failed_restart(&mut ctl, "on").await;
    let msg = format!("{err:#}");
    assert!(msg.contains("did not finish within 1 s"), "{msg}");
    assert!(msg.contains("hanging") && msg.contains("fix:"), "{msg}");
    assert_eq!(
        crate::commands::code_for_error(&err),
        crate::exit::COULD_NOT_RUN
    );
}

#[tokio::test]
async fn a_restart_is_proven_through_an_effective_url_that_wants_the_key() {
    let addr = crate::test_http::keyed_engine().await;
    let dir = tempfile::tempdir().unwrap();
    let mut target = solo_target(dir.path().join("unused.sh"), Some("true"), 1);
    target.roles[0].health = format!("http://{addr}/health");
    target.roles[0].effective_url = Some(format!("http://{addr}/config"));
    // Health never goes down, so only the pid read with the key proves the restart.
    let mut ctl = ProcessControl::new(
        &target,
        &dir.path().join("logs"),
        Some(crate::test_http::KEY.into()),
    )
    .unwrap()
    .with_state_root(&dir.path().join("state"));
    ctl.restart("on", &CancellationToken::new()).await.unwrap();
    // Without the key the engine says nothing about itself: no proof.
    let mut keyless = control_in(dir.path(), &target);
    let err = failed_restart(&mut keyless, "off").await;
    assert!(format!("{err:#}").contains("did not happen"), "{err:#}");
}

/// Control of a one-role target restarted by a command (`true`) whose engine proves the
/// restart with the key, and whose `log` command is `log`.
async fn keyed_with_log(dir: &Path, log: &str) -> ProcessControl {
    let addr = crate::test_http::keyed_engine().await;
    let mut target = solo_target(dir.join("unused.sh"), Some("true"), 1);
    target.roles[0].health = format!("http://{addr}/health");
    target.roles[0].effective_url = Some(format!("http://{addr}/config"));
    target.roles[0].log = Some(log.into());
    ProcessControl::new(
        &target,
        &dir.join("logs"),
        Some(crate::test_http::KEY.into()),
    )
    .unwrap()
    .with_state_root(&dir.join("state"))
}

/// A role under a restart command with a `log` command: after the restart the command
/// follows the role's log into the run's logs (what log witnesses read), it is listed
/// among the logs but never as an engine for the death watch, and stopping the engines
/// stops it.
#[tokio::test]
async fn a_restarted_roles_log_command_is_followed_until_the_engines_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = keyed_with_log(
        dir.path(),
        "echo 'fragmentation: 0.12 - requesting defrag'; exec sleep 60",
    )
    .await;
    ctl.restart("on", &CancellationToken::new()).await.unwrap();
    let logs = ctl.logs();
    assert_eq!(
        logs,
        vec![("solo".to_string(), dir.path().join("logs/on-solo.log"))]
    );
    assert!(ctl.spawned().is_empty(), "a log command is not an engine");
    let followed = async {
        loop {
            if std::fs::read_to_string(&logs[0].1).is_ok_and(|t| t.contains("requesting defrag")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), followed)
        .await
        .expect("the log command's output reaches the role's log");
    let pid = ctl.followers[0].child.id().unwrap() as i32;
    ctl.stop().await.unwrap();
    assert!(ctl.logs().is_empty());
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "the log command is gone"
    );
}

/// A log command that exits (no permission, a typo) is a lost log, said with its exit
/// status, so the witnesses that read it are "could not tell", never "never ran".
#[tokio::test]
async fn a_log_command_that_exits_is_a_lost_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = keyed_with_log(
        dir.path(),
        "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 1",
    )
    .await;
    ctl.restart("on", &CancellationToken::new()).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let lost = ctl.lost_logs();
            if !lost.is_empty() {
                return lost;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the exit is noticed");
    assert_eq!(lost[0].0, "solo");
    assert!(
        lost[0].1.contains("log command exited (exit status: 1)"),
        "{}",
        lost[0].1
    );
    ctl.stop().await.unwrap();
}

/// Issue: restart commands took no lock, so a probe restarted the engines in the
/// middle of a run's arm. Restarting (and a probe's claim) now holds the launch
/// configs first.
#[tokio::test]
async fn no_restart_command_runs_while_another_bisect_holds_the_launch_config() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let target = solo_target(
        dir.path().join("solo.sh"),
        Some(&format!("touch '{}'", ran.display())),
        1,
    );
    let mut other = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let canonical = std::fs::canonicalize(&target.roles[0].launch).unwrap();
    let state = crate::launch::state_root_for_tests(&dir.path().join("state"), &[canonical]);
    std::fs::create_dir_all(&state).unwrap();
    let owner = serde_json::json!({
        "pid": other.id(),
        "start_ticks": launch::start_ticks(other.id()).unwrap(),
        "cmdline": "bisect run --flag X",
        "started_at": "earlier",
    });
    std::fs::write(state.join("lock.json"), owner.to_string()).unwrap();

    let mut ctl = control_in(dir.path(), &target);
    let err = ctl.claim().unwrap_err();
    assert!(
        format!("{err:#}").contains("in use by another bisect"),
        "{err:#}"
    );
    let err = failed_restart(&mut ctl, "on").await;
    assert!(
        format!("{err:#}").contains(&format!("pid {}", other.id())),
        "{err:#}"
    );
    assert!(!ran.exists(), "the restart command did not run");
    other.kill().unwrap();
    other.wait().unwrap();
    // The holder gone, its lock is stale and taken over.
    ctl.claim().unwrap();
    assert!(std::fs::read_to_string(state.join("lock.json"))
        .unwrap()
        .contains(&format!("\"pid\": {}", std::process::id())));
}

#[tokio::test]
async fn failing_restart_command_is_could_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let target = solo_target(dir.path().join("unused.sh"), Some("echo nope; exit 3"), 1);
    let mut ctl = control_in(dir.path(), &target);
    let err = failed_restart(&mut ctl, "off").await;
    assert!(format!("{err:#}").contains("nope"));
    assert_eq!(
        crate::commands::code_for_error(&err),
        crate::exit::COULD_NOT_RUN
    );
}

/// A stand-in engine in a process of its own that answers `/health` and binds its port
/// with SO_REUSEPORT, so a second one can take the port over while the first still
/// serves: a restart whose health never blinks. It reports nothing about itself.
const REUSEPORT_SERVER: &str = r#"
import http.server, socket, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
class S(http.server.HTTPServer):
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

fn reuseport_server(port: u16) -> std::process::Child {
    std::process::Command::new("python3")
        .args(["-c", REUSEPORT_SERVER, &port.to_string()])
        .spawn()
        .expect("python3 runs the stand-in (CI machines have CPython 3)")
}

/// Waits until the process listening on `port` is `pid`.
async fn listener_becomes(port: u16, pid: u32) {
    let url = format!("http://127.0.0.1:{port}/health");
    for _ in 0..200 {
        let found = crate::control::identity::local_listener(&url);
        if found.is_some_and(|l| l.starts_with(&format!("pid {pid} started "))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("pid {pid} never listened on {port}");
}

/// The issue this guards (engine profiles): no real engine's self-report carries a pid
/// or start time, so a restart command that replaced the process while health kept
/// answering could not be proven, and a crash-and-restart inside a block went unseen.
/// The process listening on the role's port names it.
#[tokio::test]
async fn a_process_that_takes_the_port_over_while_health_answers_is_told_apart() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut old = reuseport_server(port);
    listener_becomes(port, old.id()).await;
    let role = RoleSpec::new(
        "solo",
        PathBuf::new(),
        format!("http://127.0.0.1:{port}/health"),
        None,
    );
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let before = identity::identify(&http, &role, None, None).await;
    assert_eq!(
        before.source,
        crate::core::effective::IdentitySource::ListeningSocket
    );
    let watch = RestartWatch::start(&http, &role, None).await;
    // Not restarted yet: the same process answers, and that is said.
    assert!(watch.proof(&http, &role, None).await.is_err());

    // The "restart": a new process binds the port beside the old, then the old exits.
    let mut new = reuseport_server(port);
    tokio::time::sleep(Duration::from_millis(300)).await;
    old.kill().unwrap();
    old.wait().unwrap();
    listener_becomes(port, new.id()).await;
    let after = identity::identify(&http, &role, None, None).await;
    assert!(
        after
            .text()
            .starts_with(&format!("listener pid {} started ", new.id())),
        "{after:?}"
    );
    assert_ne!(after.text(), before.text());
    assert_eq!(watch.proof(&http, &role, None).await, Ok(()));
    new.kill().unwrap();
    new.wait().unwrap();
}
