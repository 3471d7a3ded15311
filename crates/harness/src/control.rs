//! Engine control: bring a target's roles up with a given launch config and down again.
//!
//! Two ways, per role (docs/design.md 3.2): a `restart` command run through `sh -c` and
//! checked, or, without one, `sh LAUNCH` spawned by bisect in its own process group with
//! stdout/stderr captured under the run's `logs/`. Either way the role is then waited on
//! at its health URL. Everything here sits behind [`EngineControl`] so the experiment
//! can be driven against fakes without processes.
//!
//! Bisect owns what it starts: before restarting anything, the controller holds the lock
//! of every launch config of the target (shared with this process's editor, or taken:
//! a probe edits nothing but must neither restart engines nor read configs that another
//! bisect has edited, nor let one start meanwhile). Every spawned role's process group
//! is recorded (with its leader's start time) in its launch config's state, so that
//! after a kill -9 the next bisect kills exactly those groups; every child also gets
//! `PR_SET_PDEATHSIG(SIGKILL)` on Linux. A restart command runs in its own process
//! group with a timeout (`restart_timeout_s`), and Ctrl-C kills that group at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use futures::future::BoxFuture;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::config::{RoleSpec, TargetProfile};
use crate::exit::Failure;
use crate::launch::{self, SpawnedGroup, TargetLocks};

/// What an arm needs from engine control. Object-safe async without a macro crate: the
/// methods return boxed futures.
pub trait EngineControl: Send {
    /// Start every role with its launch config as it is now on disk (a role with a
    /// restart command: restart it), then wait until all are healthy. `label` names the
    /// arm (used for log file names). Returns the health wait per role in seconds.
    ///
    /// The caller has stopped what this controller started ([`EngineControl::stop`]):
    /// the arm lifecycle stops once, then checks that nothing answers where bisect is
    /// about to spawn, then restarts ([`crate::arm::Testbed::restart`]).
    fn restart<'a>(
        &'a mut self,
        label: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, anyhow::Result<BTreeMap<String, f64>>>;

    /// Stop whatever this controller started (spawned roles). Idempotent.
    fn stop(&mut self) -> BoxFuture<'_, anyhow::Result<()>>;

    /// Hold the target's launch configs for as long as this controller lives: refused
    /// (exit 3, naming the file and its holder) while another bisect holds any of them,
    /// and no other bisect starts on them meanwhile. A command that edits them already
    /// holds them through its editor; a probe, which only reads them, calls this first.
    /// Returns what was undone of a dead bisect's leftovers, one line each for the user.
    /// Restarting claims them too.
    fn claim(&mut self) -> anyhow::Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Per role, for the latest restart: an upper bound on the health poller's padding,
    /// the time from the last probe that found the role unhealthy to the probe that
    /// found it healthy (the engine became ready somewhere in between). Empty where the
    /// controller does not poll.
    fn health_padding(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }
}

/// The health poller's first gap between probes; it grows by half each probe up to
/// [`HEALTH_POLL_MAX`]. Probes of a port nothing listens on are refused at once, so
/// polling often costs little, and the padding between an engine being ready and bisect
/// noticing stays below the longest gap (it was up to 200 ms with a fixed interval).
const HEALTH_POLL_FIRST: Duration = Duration::from_millis(2);
const HEALTH_POLL_MAX: Duration = Duration::from_millis(20);

/// Real processes: restart commands or spawned launch scripts.
pub struct ProcessControl {
    roles: Vec<RoleSpec>,
    /// The variable holding the API key: removed from engines' environments unless
    /// their role says `pass_api_key = true`.
    api_key_env: Option<String>,
    /// The key itself, sent with every read of an engine's self-report (a restart's
    /// proof, a spawned role's ownership check) as the lifecycle's reads send it.
    api_key: Option<String>,
    logs_dir: PathBuf,
    http: reqwest::Client,
    spawned: Vec<Spawned>,
    /// The locks of the target's launch configs, taken at the first claim or restart
    /// (shared with this process's launch-config editor when it holds them already).
    state: Option<TargetLocks>,
    state_root: PathBuf,
    /// Role -> padding bound of the latest restart ([`EngineControl::health_padding`]).
    padding: BTreeMap<String, f64>,
}

struct Spawned {
    role: String,
    child: Child,
    log: PathBuf,
    /// The state directory where its group is recorded (its launch config's).
    state_dir: Option<PathBuf>,
}

impl ProcessControl {
    /// Control of `target`'s roles, their logs under `logs_dir`; `api_key` is the key
    /// `api_key_env` names, where the target has one.
    pub fn new(
        target: &TargetProfile,
        logs_dir: &Path,
        api_key: Option<String>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs_dir)
            .with_context(|| format!("creating logs directory {}", logs_dir.display()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(3))
            .build()?;
        Ok(ProcessControl {
            roles: target.roles.clone(),
            api_key_env: target.api_key_env.clone(),
            api_key,
            logs_dir: logs_dir.to_path_buf(),
            http,
            spawned: Vec::new(),
            state: None,
            state_root: launch::state_root(),
            padding: BTreeMap::new(),
        })
    }

    fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// Keeps the target's state under `root` instead of `$XDG_STATE_HOME/bisect`.
    pub fn with_state_root(mut self, root: &Path) -> Self {
        self.state_root = root.to_path_buf();
        self
    }

    /// The locks of every launch config of the target (refused while another live
    /// bisect holds any of them); the lines say what was recovered on taking them.
    fn hold(&mut self) -> anyhow::Result<Vec<String>> {
        if self.state.is_some() {
            return Ok(Vec::new());
        }
        let files: Vec<PathBuf> = self.roles.iter().map(|r| r.launch.clone()).collect();
        let (locks, recovery) = launch::lock_target(&self.state_root, &files)?;
        self.state = Some(locks);
        Ok(recovery.lines())
    }

    /// The state directory of `role`'s launch config (its locks held).
    fn state_dir(&mut self, role: &RoleSpec) -> anyhow::Result<PathBuf> {
        self.hold()?;
        self.state
            .as_ref()
            .context("the launch configs are held")?
            .dir_of(&role.launch)
    }

    async fn stop_all(&mut self) -> anyhow::Result<()> {
        let mut first_err = None;
        for mut s in self.spawned.drain(..) {
            let pgid = s.child.id();
            if let Err(e) = stop_child(&mut s.child).await {
                first_err.get_or_insert(anyhow!("stopping role {}: {e:#}", s.role));
            } else if let (Some(pgid), Some(dir)) = (pgid, &s.state_dir) {
                if let Err(e) = launch::forget_group(dir, pgid) {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn restart_all(
        &mut self,
        label: &str,
        cancel: &CancellationToken,
    ) -> anyhow::Result<BTreeMap<String, f64>> {
        // The one stop is the caller's, before its foreign-engine check: an engine of ours
        // still running here would be a second engine on the role's port.
        if let Some(running) = self.spawned.first() {
            return Err(anyhow!(
                "restarting while role {} is still running: stop the engines first",
                running.role
            ));
        }
        // Restart commands take no lock of their own: without this, a restart could act
        // on engines whose configs another bisect has edited. What was recovered on
        // taking the locks here was the claim's to report; a command that restarts
        // claims first or holds the configs through its editor.
        self.hold()?;
        let roles = self.roles.clone();
        let key_env = self.api_key_env.clone();
        let hide_key = |role: &RoleSpec| key_env.clone().filter(|_| !role.pass_api_key);
        let mut watches = BTreeMap::new();
        for role in &roles {
            match &role.restart {
                Some(cmd) => {
                    // Who answers before the command runs, and whether health goes down
                    // while it runs: the evidence that the restart happened.
                    let watch = RestartWatch::start(&self.http, role, self.api_key()).await;
                    run_restart_command(role, cmd, &self.logs_dir, label, cancel, hide_key(role))
                        .await?;
                    watches.insert(role.name.clone(), watch);
                }
                None => {
                    let state_dir = self.state_dir(role)?;
                    let mut spawned = spawn_launch(role, &self.logs_dir, label, hide_key(role))?;
                    spawned.state_dir = Some(state_dir.clone());
                    let pgid = spawned.child.id();
                    self.spawned.push(spawned);
                    if let Some(pgid) = pgid {
                        launch::record_group(
                            &state_dir,
                            SpawnedGroup {
                                role: role.name.clone(),
                                pgid,
                                start_ticks: launch::start_ticks(pgid).unwrap_or(0),
                                owner_pid: std::process::id(),
                            },
                        )?;
                    }
                }
            }
        }
        crate::fault::pause("restarting");
        let mut waits = BTreeMap::new();
        self.padding.clear();
        for role in &roles {
            let started = Instant::now();
            let watch = watches.remove(&role.name);
            let padding = self.wait_healthy(role, watch.as_ref(), cancel).await?;
            if watch.is_none() {
                self.check_own_engine(role).await?;
            }
            waits.insert(role.name.clone(), started.elapsed().as_secs_f64());
            self.padding.insert(role.name.clone(), padding);
        }
        Ok(waits)
    }

    /// A spawned role's engine that reports its pid must be in the process group bisect
    /// started for it: anything else answering there is an engine bisect did not start.
    async fn check_own_engine(&self, role: &RoleSpec) -> anyhow::Result<()> {
        let Some(group) = self
            .spawned
            .iter()
            .find(|s| s.role == role.name)
            .and_then(|s| s.child.id())
        else {
            return Ok(());
        };
        let Some(info) =
            crate::arm::fetch_server_info(&self.http, role, self.api_key.as_deref()).await
        else {
            return Ok(());
        };
        let Some(pid) = info.get("pid").and_then(|p| p.as_u64()) else {
            return Ok(());
        };
        match launch::process_group_of(pid as u32) {
            Some(pgid) if pgid == group => Ok(()),
            found => Err(Failure::CouldNotRun(format!(
                "the engine answering on {} for role {} reports pid {pid}, which is not in the \
                 process group {group} bisect started for it ({}): an engine bisect did not start \
                 would be measured\n  fix: stop that process (a run killed with -9 leaves its \
                 engines running), or give the role another port in its launch config",
                role.health,
                role.name,
                match found {
                    Some(other) => format!("its group is {other}"),
                    None => "no such process here".to_string(),
                }
            ))
            .into()),
        }
    }

    /// Polls the role's health URL until it answers 2xx; returns the padding bound in
    /// seconds (from the end of the last failed probe to the healthy answer; 0 when the
    /// first probe found it healthy).
    async fn wait_healthy(
        &mut self,
        role: &RoleSpec,
        watch: Option<&RestartWatch>,
        cancel: &CancellationToken,
    ) -> anyhow::Result<f64> {
        let deadline = Instant::now() + Duration::from_secs(role.health_timeout_s.max(1));
        let grace = Duration::from_secs(role.health_timeout_s.clamp(1, RESTART_PROOF_GRACE_S));
        let mut unproven_since: Option<Instant> = None;
        let mut paused = false;
        let mut gap = HEALTH_POLL_FIRST;
        let mut last_failed: Option<Instant> = None;
        loop {
            if !paused {
                paused = true;
                crate::fault::pause("health");
            }
            if cancel.is_cancelled() {
                return Err(Failure::Interrupted.into());
            }
            if let Some(s) = self.spawned.iter_mut().find(|s| s.role == role.name) {
                if let Some(status) = s.child.try_wait()? {
                    return Err(Failure::CouldNotRun(format!(
                        "role {} exited with {status} before becoming healthy; last lines of {}:\n{}",
                        role.name,
                        s.log.display(),
                        log_tail(&s.log, 20)
                    ))
                    .into());
                }
            }
            let last = match self.http.get(&role.health).send().await {
                Ok(resp) if resp.status().is_success() => {
                    let padding = last_failed.map_or(0.0, |t| t.elapsed().as_secs_f64());
                    let Some(watch) = watch else {
                        return Ok(padding);
                    };
                    match watch.proof(&self.http, role, self.api_key()).await {
                        Ok(()) => return Ok(padding),
                        Err(why) => {
                            let since = *unproven_since.get_or_insert_with(Instant::now);
                            if since.elapsed() >= grace || Instant::now() >= deadline {
                                return Err(Failure::CouldNotRun(format!(
                                    "restart of {} did not happen: {why}\n  fix: make the role's \
                                     restart command really restart the engine (a restart, not a \
                                     reload; the right service or container), or have the engine \
                                     report `pid` and `started_at` at its effective-config URL so a \
                                     fast restart can be told apart",
                                    role.name
                                ))
                                .into());
                            }
                            format!("HTTP 200, but {why}")
                        }
                    }
                }
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    format!("HTTP {status}: {}", truncate(&body, 200))
                }
                Err(e) => format!("{e}"),
            };
            if Instant::now() >= deadline {
                let tail = self
                    .spawned
                    .iter()
                    .find(|s| s.role == role.name)
                    .map(|s| {
                        format!(
                            "\nlast lines of {}:\n{}",
                            s.log.display(),
                            log_tail(&s.log, 20)
                        )
                    })
                    .unwrap_or_default();
                return Err(Failure::CouldNotRun(format!(
                    "role {} not healthy at {} after {} s (last: {last}){tail}",
                    role.name, role.health, role.health_timeout_s
                ))
                .into());
            }
            last_failed = Some(Instant::now());
            tokio::select! {
                _ = cancel.cancelled() => return Err(Failure::Interrupted.into()),
                _ = tokio::time::sleep(gap) => {}
            }
            gap = (gap * 3 / 2).min(HEALTH_POLL_MAX);
        }
    }
}

impl EngineControl for ProcessControl {
    fn restart<'a>(
        &'a mut self,
        label: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, anyhow::Result<BTreeMap<String, f64>>> {
        Box::pin(self.restart_all(label, cancel))
    }

    fn stop(&mut self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.stop_all())
    }

    fn claim(&mut self) -> anyhow::Result<Vec<String>> {
        self.hold()
    }

    fn health_padding(&self) -> BTreeMap<String, f64> {
        self.padding.clone()
    }
}

impl Drop for ProcessControl {
    fn drop(&mut self) {
        // Last resort (panic or early return): never leave engines running behind us.
        for s in &self.spawned {
            if let Some(pid) = s.child.id() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                if let Some(dir) = &s.state_dir {
                    let _ = launch::forget_group(dir, pid);
                }
            }
        }
    }
}

/// How long a role restarted by its own command may answer health without proof that
/// it was restarted (health went down, or its reported pid / start time changed)
/// before the restart is reported as not having happened.
const RESTART_PROOF_GRACE_S: u64 = 10;

/// The evidence that a role's restart command restarted its engine: who answered
/// before (the engine's reported identity), and whether health was seen failing since.
struct RestartWatch {
    before: Option<String>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    poller: tokio::task::JoinHandle<()>,
}

impl RestartWatch {
    /// Takes the engine's identity, then polls health every 100 ms until dropped.
    async fn start(http: &reqwest::Client, role: &RoleSpec, api_key: Option<&str>) -> RestartWatch {
        use std::sync::atomic::{AtomicBool, Ordering};
        let down = std::sync::Arc::new(AtomicBool::new(false));
        let answers = |http: reqwest::Client, url: String| async move {
            matches!(http.get(&url).send().await, Ok(r) if r.status().is_success())
        };
        if !answers(http.clone(), role.health.clone()).await {
            down.store(true, Ordering::SeqCst);
        }
        let before = crate::arm::fetch_server_info(http, role, api_key)
            .await
            .as_ref()
            .and_then(crate::core::effective::identity);
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
    async fn proof(
        &self,
        http: &reqwest::Client,
        role: &RoleSpec,
        api_key: Option<&str>,
    ) -> Result<(), String> {
        // Who answers now is read even when health went down: going down can be another
        // role's doing, and the engine's own start time is the better witness.
        let after = crate::arm::fetch_server_info(http, role, api_key)
            .await
            .as_ref()
            .and_then(crate::core::effective::identity);
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
async fn run_restart_command(
    role: &RoleSpec,
    cmd: &str,
    logs_dir: &Path,
    label: &str,
    cancel: &CancellationToken,
    hide_env: Option<String>,
) -> anyhow::Result<()> {
    let log = logs_dir.join(format!("{label}-{}-restart.log", role.name));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    if let Some(var) = hide_env {
        command.env_remove(var);
    }
    die_with_parent(&mut command);
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
            return Err(Failure::CouldNotRun(format!(
                "restart command for role {} did not finish within {} s and was killed: {cmd}\nlast lines of {}:\n{}\n  fix: make the command return once the restart is issued, or raise restart_timeout_s for the role in the target profile",
                role.name,
                limit.as_secs(),
                log.display(),
                log_tail(&log, 20)
            ))
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
        return Err(Failure::CouldNotRun(format!(
            "restart command for role {} failed ({status}): {cmd}\n{}",
            role.name,
            truncate(&log_tail(&log, 40), 2000)
        ))
        .into());
    }
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

fn spawn_launch(
    role: &RoleSpec,
    logs_dir: &Path,
    label: &str,
    hide_env: Option<String>,
) -> anyhow::Result<Spawned> {
    let log = logs_dir.join(format!("{label}-{}.log", role.name));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    // Scripts may refer to files beside them, so run them from their own directory.
    let launch = std::path::absolute(&role.launch)
        .with_context(|| format!("resolving {}", role.launch.display()))?;
    let mut command = Command::new("sh");
    command
        .arg(&launch)
        .current_dir(launch.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    if let Some(var) = hide_env {
        command.env_remove(var);
    }
    die_with_parent(&mut command);
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

async fn stop_child(child: &mut Child) -> anyhow::Result<()> {
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

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
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
            crate::exit::code_for_error(&err),
            crate::exit::COULD_NOT_RUN
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
        assert_eq!(crate::exit::code_for_error(&err), crate::exit::INTERRUPTED);
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
                let stat =
                    std::fs::read_to_string(e.unwrap().path().join("stat")).unwrap_or_default();
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
            crate::exit::code_for_error(&err),
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
            crate::exit::code_for_error(&err),
            crate::exit::COULD_NOT_RUN
        );
    }
}
