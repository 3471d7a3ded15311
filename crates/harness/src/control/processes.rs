//! The processes engine control runs: a role's restart command (own process group,
//! timeout, killed on Ctrl-C) with the proof that it restarted the engine, and `sh
//! LAUNCH` spawned in its own group with the parent-death signal, stopped with TERM then
//! KILL; the tail of a role's log for error messages.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::config::RoleSpec;
use crate::exit::{Failure, Problem};

use super::Spawned;

/// How long a role restarted by its own command may answer health without proof that
/// it was restarted (health went down, or its reported pid / start time changed)
/// before the restart is reported as not having happened.
pub(super) const RESTART_PROOF_GRACE_S: u64 = 10;

/// The evidence that a role's restart command restarted its engine: who answered
/// before (its identity from the best source there is, [`super::identity`]), and
/// whether health was seen failing since.
pub(super) struct RestartWatch {
    before: Option<String>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    poller: tokio::task::JoinHandle<()>,
}

impl RestartWatch {
    /// Takes the engine's identity, then polls health every 100 ms until dropped.
    pub(super) async fn start(
        http: &reqwest::Client,
        role: &RoleSpec,
        api_key: Option<&str>,
    ) -> RestartWatch {
        use std::sync::atomic::{AtomicBool, Ordering};
        let down = std::sync::Arc::new(AtomicBool::new(false));
        let answers = |http: reqwest::Client, url: String| async move {
            matches!(http.get(&url).send().await, Ok(r) if r.status().is_success())
        };
        if !answers(http.clone(), role.health.clone()).await {
            down.store(true, Ordering::SeqCst);
        }
        let before = super::identity::identify(http, role, api_key, None).await;
        let before = before.is_known().then(|| before.text());
        let poller = {
            let (http, url, down) = (http.clone(), role.health.clone(), down.clone());
            tokio::spawn(async move {
                loop {
                    if !answers(http.clone(), url.clone()).await {
                        down.store(true, Ordering::SeqCst);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        RestartWatch {
            before,
            down,
            poller,
        }
    }

    /// Ok once the restart is proven; else why not, in words.
    pub(super) async fn proof(
        &self,
        http: &reqwest::Client,
        role: &RoleSpec,
        api_key: Option<&str>,
    ) -> Result<(), String> {
        // Who answers now is read even when health went down: going down can be another
        // role's doing, and the engine's own start time is the better witness.
        let after = super::identity::identify(http, role, api_key, None).await;
        let after = after.is_known().then(|| after.text());
        let went_down = self.down.load(std::sync::atomic::Ordering::SeqCst);
        crate::core::effective::restart_proven(self.before.as_deref(), after.as_deref(), went_down)
    }
}

impl Drop for RestartWatch {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

/// Runs a role's restart command (`sh -c`) in its own process group, output to a log
/// file, for at most the role's `restart_timeout_s`; a timeout or a cancellation kills
/// the whole group (the command's children included) before returning.
pub(super) async fn run_restart_command(
    role: &RoleSpec,
    cmd: &str,
    logs_dir: &Path,
    label: &str,
    cancel: &CancellationToken,
    hide_env: Option<String>,
) -> anyhow::Result<()> {
    let log = logs_dir.join(format!("{label}-{}-restart.log", role.name));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut command = Command::new("sh");
    command.arg("-c").arg(cmd);
    own_group_logged(&mut command, out, hide_env)?;
    let mut child = command
        .spawn()
        .with_context(|| format!("running restart command for role {}: {cmd}", role.name))?;
    let group = child.id();
    let kill_group = || {
        if let Some(pgid) = group {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    let limit = Duration::from_secs(role.restart_timeout_s.max(1));
    let status = tokio::select! {
        status = child.wait() => status
            .with_context(|| format!("waiting for the restart command of role {}", role.name))?,
        _ = tokio::time::sleep(limit) => {
            kill_group();
            let _ = child.wait().await;
            return Err(Failure::could_not_run(
                format!(
                    "restart command for role {} did not finish within {} s and was killed: {cmd}\n{}",
                    role.name,
                    limit.as_secs(),
                    log_excerpt(&log, 20)
                ),
                "make the command return once the restart is issued, or raise restart_timeout_s for the role in the target profile",
            )
            .into());
        }
        _ = cancel.cancelled() => {
            kill_group();
            let _ = child.wait().await;
            return Err(Failure::Interrupted.into());
        }
    };
    // A command that succeeded may leave a daemon in its group on purpose (`nohup
    // server &`): that engine is the deployment's, so it is not killed here.
    if !status.success() {
        return Err(Failure::CouldNotRun(Problem::message_only(format!(
            "restart command for role {} failed ({status}): {cmd}\n{}{}",
            role.name,
            crate::core::root_cause::root_cause_words(
                &std::fs::read_to_string(&log).unwrap_or_default(),
                &log.display().to_string()
            ),
            truncate(&log_tail(&log, 40), 2000)
        )))
        .into());
    }
    Ok(())
}

/// What every process engine control starts gets: no stdin, stdout and stderr to
/// `log`, its own process group (so the whole group can be killed), killed when its
/// handle is dropped and when bisect dies, and without the API key variable where the
/// role must not see it.
fn own_group_logged(
    command: &mut Command,
    log: std::fs::File,
    hide_env: Option<String>,
) -> anyhow::Result<()> {
    let err = log.try_clone()?;
    command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    if let Some(var) = hide_env {
        command.env_remove(var);
    }
    die_with_parent(command);
    Ok(())
}

/// Makes a spawned child die with bisect (Linux `PR_SET_PDEATHSIG(SIGKILL)`), so even a
/// kill -9 of bisect leaves no engine behind. The signal follows the child across
/// `exec` (a launch script that ends in `exec server ...`); grandchildren are covered by
/// the process-group record instead. It fires when the forking *thread* exits: the
/// tokio worker threads and the main thread that spawn here live as long as the run.
fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child between fork and exec, where only
        // async-signal-safe calls are allowed: it makes two system calls (prctl(2),
        // getppid(2)), allocates nothing and touches no lock or shared state.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                // The parent may have died before prctl took effect: then die now.
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
                }
                Ok(())
            });
        }
    }
}

/// `LABEL-ROLE.log` under `logs_dir`, opened to append: where a spawned role's output,
/// or a followed role's log, goes.
fn open_log(
    role: &RoleSpec,
    logs_dir: &Path,
    label: &str,
) -> anyhow::Result<(std::path::PathBuf, std::fs::File)> {
    let log = logs_dir.join(format!("{label}-{}.log", role.name));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening {}", log.display()))?;
    Ok((log, out))
}

pub(super) fn spawn_launch(
    role: &RoleSpec,
    logs_dir: &Path,
    label: &str,
    hide_env: Option<String>,
) -> anyhow::Result<Spawned> {
    let (log, out) = open_log(role, logs_dir, label)?;
    // Scripts may refer to files beside them, so run them from their own directory.
    let launch = std::path::absolute(&role.launch)
        .with_context(|| format!("resolving {}", role.launch.display()))?;
    let mut command = Command::new("sh");
    command
        .arg(&launch)
        .current_dir(launch.parent().unwrap_or(Path::new("/")));
    own_group_logged(&mut command, out, hide_env)?;
    let child = command
        .spawn()
        .with_context(|| format!("spawning sh {}", role.launch.display()))?;
    Ok(Spawned {
        role: role.name.clone(),
        child,
        log,
        state_dir: None,
    })
}

/// A role started by its restart command has its log followed by the role's `log`
/// command (`sh -c`, e.g. `journalctl -u UNIT -f -n 0 -o cat`), in its own process
/// group, its output into `LABEL-ROLE.log` as a spawned role's: what its mechanism's
/// log witnesses read (arm/witness.rs). Started once the role is healthy, so a command
/// that follows the new process (`kubectl logs -f`) finds it; stopped with the engines.
pub(super) fn spawn_follower(
    role: &RoleSpec,
    cmd: &str,
    logs_dir: &Path,
    label: &str,
) -> anyhow::Result<Spawned> {
    let (log, out) = open_log(role, logs_dir, label)?;
    let mut command = Command::new("sh");
    command.arg("-c").arg(cmd);
    own_group_logged(&mut command, out, None)?;
    let child = command
        .spawn()
        .with_context(|| format!("running the log command of role {}: {cmd}", role.name))?;
    Ok(Spawned {
        role: role.name.clone(),
        child,
        log,
        state_dir: None,
    })
}

pub(super) async fn stop_child(child: &mut Child) -> anyhow::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    if let Some(pid) = child.id() {
        let group = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            child.wait().await?;
        }
        // The group may hold children that outlived `sh`; make sure they are gone too.
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    }
    Ok(())
}

/// What a failed start's message shows of the role's log: the first error lines (the
/// root cause, often far above the tail: [`crate::core::root_cause`]), then the last `n`
/// lines.
pub fn log_excerpt(path: &Path, n: usize) -> String {
    let cause = std::fs::read(path)
        .map(|bytes| {
            crate::core::root_cause::root_cause_words(
                &String::from_utf8_lossy(&bytes),
                &path.display().to_string(),
            )
        })
        .unwrap_or_default();
    format!(
        "{cause}last lines of {}:\n{}",
        path.display(),
        log_tail(path, n)
    )
}

/// The last `n` lines of a log file (for error messages).
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            lines[start..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}
