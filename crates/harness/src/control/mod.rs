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
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use futures::future::BoxFuture;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use crate::config::{RoleSpec, TargetProfile};
use crate::exit::{Failure, Problem};
use crate::launch::{self, SpawnedGroup, TargetLocks};

pub mod death;
pub mod determinism;
pub mod identity;
mod processes;
mod self_report;

pub use processes::{log_excerpt, log_tail};

/// How long a restart waits out the connections lingering on a role's port before
/// starting a role that exited at once again (TIME_WAIT is 60 s on Linux).
const LINGER_WAIT: Duration = Duration::from_secs(70);
use processes::{
    run_restart_command, spawn_follower, spawn_launch, stop_child, truncate, RestartWatch,
    RESTART_PROOF_GRACE_S,
};
pub(crate) use self_report::fetch_server_info;

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

    /// The processes this controller spawned for the latest restart, still held (not
    /// waited for), for the arm's death watch ([`death`]). Empty where it spawns none.
    fn spawned(&self) -> Vec<SpawnedRole> {
        Vec::new()
    }

    /// Per role, the file its log goes to for the latest restart: a spawned role's
    /// output, or what a restarted role's `log` command follows. What log witnesses read.
    fn logs(&self) -> Vec<(String, PathBuf)> {
        self.spawned()
            .into_iter()
            .map(|s| (s.role, s.log))
            .collect()
    }

    /// Per role, why its followed log stopped being followed (its `log` command exited:
    /// no permission, a typo, a lost session): the lines after it are missing, so what
    /// its log witnesses counted is not all there was.
    fn lost_logs(&mut self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// A role's process that engine control spawned: what the death watch reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnedRole {
    pub role: String,
    pub pid: u32,
    /// Its output, for the lines before a death.
    pub log: PathBuf,
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
    /// The `log` commands following restarted roles' logs (never engines: not in
    /// [`EngineControl::spawned`], not death-watched).
    followers: Vec<Spawned>,
    /// The locks of the target's launch configs, taken at the first claim or restart
    /// (shared with this process's launch-config editor when it holds them already).
    state: Option<TargetLocks>,
    state_root: PathBuf,
    /// Role -> padding bound of the latest restart ([`EngineControl::health_padding`]).
    padding: BTreeMap<String, f64>,
    /// How long a restart waits out connections lingering on a role's port before
    /// starting an engine that exited at once again ([`LINGER_WAIT`]).
    linger_wait: Duration,
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
            // No idle connection kept to an engine that may be stopped next: one open
            // when it stops lingers unacknowledged on its port.
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(3))
            .build()?;
        Ok(ProcessControl {
            roles: target.roles.clone(),
            api_key_env: target.api_key_env.clone(),
            api_key,
            logs_dir: logs_dir.to_path_buf(),
            http,
            spawned: Vec::new(),
            followers: Vec::new(),
            state: None,
            state_root: launch::state_root(),
            padding: BTreeMap::new(),
            linger_wait: LINGER_WAIT,
        })
    }

    /// A shorter wait for lingering connections (tests: TIME_WAIT itself lasts 60 s).
    #[cfg(test)]
    fn with_linger_wait(mut self, wait: Duration) -> Self {
        self.linger_wait = wait;
        self
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
        for mut f in self.followers.drain(..) {
            if let Err(e) = stop_child(&mut f.child).await {
                first_err.get_or_insert(anyhow!("stopping role {}'s log command: {e:#}", f.role));
            }
        }
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
                    self.spawn(role, label, hide_key(role), state_dir)?;
                }
            }
        }
        crate::fault::pause("restarting");
        let mut waits = BTreeMap::new();
        self.padding.clear();
        for role in &roles {
            let started = Instant::now();
            let watch = watches.remove(&role.name);
            let padding = match self.wait_healthy(role, watch.as_ref(), cancel).await {
                Err(e) if self.exited_beside_lingering_connections(role) => {
                    // Measured: a 0.3.36 llama-server cannot bind its port for up to a
                    // minute after a 0.3.8 one died there, while the connections to that
                    // port wait out TIME_WAIT (another process binding with SO_REUSEPORT
                    // can). Wait them out and start the role once more.
                    self.wait_connections_gone(role, cancel).await?;
                    let first = format!("{e:#}");
                    self.respawn(role, label, hide_key(role), &first)?;
                    self.wait_healthy(role, None, cancel).await.map_err(|again| {
                        again.context(format!(
                            "role {} also failed when started again after its port's old connections were gone; the first start: {first}",
                            role.name
                        ))
                    })?
                }
                other => other?,
            };
            if watch.is_none() {
                self.check_own_engine(role).await?;
            }
            waits.insert(role.name.clone(), started.elapsed().as_secs_f64());
            self.padding.insert(role.name.clone(), padding);
            if let (Some(_), Some(cmd)) = (&role.restart, &role.log) {
                self.followers
                    .push(spawn_follower(role, cmd, &self.logs_dir, label)?);
            }
        }
        Ok(waits)
    }

    /// Whether the role's spawned engine has exited while connections to or from its
    /// port on this host linger (TIME_WAIT and the other closing states).
    fn exited_beside_lingering_connections(&mut self, role: &RoleSpec) -> bool {
        let exited = self
            .spawned
            .iter_mut()
            .find(|s| s.role == role.name)
            .is_some_and(|s| matches!(s.child.try_wait(), Ok(Some(_))));
        exited && identity::port_lingering(&role.health).is_some_and(|n| n > 0)
    }

    /// Waits until no connection lingers on the role's port (TIME_WAIT lasts 60 s on
    /// Linux), at most the control's linger wait.
    async fn wait_connections_gone(
        &self,
        role: &RoleSpec,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < self.linger_wait
            && identity::port_lingering(&role.health).is_some_and(|n| n > 0)
        {
            tokio::select! {
                _ = cancel.cancelled() => return Err(Failure::Interrupted.into()),
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        Ok(())
    }

    /// The role's exited engine replaced by a fresh start of its launch config, the
    /// first start's failure written into its log.
    fn respawn(
        &mut self,
        role: &RoleSpec,
        label: &str,
        hide_env: Option<String>,
        first: &str,
    ) -> anyhow::Result<()> {
        let Some(i) = self.spawned.iter().position(|s| s.role == role.name) else {
            return Ok(());
        };
        let old = self.spawned.remove(i);
        let note = format!(
            "\nbisect: the start above failed while connections to its port lingered; started again once they were gone. The failure: {first}\n\n"
        );
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .open(&old.log)
            .and_then(|mut f| std::io::Write::write_all(&mut f, note.as_bytes()));
        let state_dir = match old.state_dir {
            Some(dir) => dir,
            None => self.state_dir(role)?,
        };
        self.spawn(role, label, hide_env, state_dir)
    }

    /// Starts the role's launch config in a process group of its own, recorded in
    /// `state_dir` (so a later bisect can tell it from a stranger's).
    fn spawn(
        &mut self,
        role: &RoleSpec,
        label: &str,
        hide_env: Option<String>,
        state_dir: PathBuf,
    ) -> anyhow::Result<()> {
        let mut spawned = spawn_launch(role, &self.logs_dir, label, hide_env)?;
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
        Ok(())
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
            crate::control::fetch_server_info(&self.http, role, self.api_key.as_deref()).await
        else {
            return Ok(());
        };
        let Some(pid) = info.get("pid").and_then(|p| p.as_u64()) else {
            return Ok(());
        };
        match launch::process_group_of(pid as u32) {
            Some(pgid) if pgid == group => Ok(()),
            found => Err(Failure::could_not_run(
                format!(
                    "the engine answering on {} for role {} reports pid {pid}, which is not in \
                     the process group {group} bisect started for it ({}): an engine bisect did \
                     not start would be measured",
                    role.health,
                    role.name,
                    match found {
                        Some(other) => format!("its group is {other}"),
                        None => "no such process here".to_string(),
                    }
                ),
                "stop that process (a run killed with -9 leaves its engines running), or give \
                 the role another port in its launch config",
            )
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
                    return Err(Failure::CouldNotRun(Problem::message_only(format!(
                        "role {} exited with {status} before becoming healthy; {}",
                        role.name,
                        log_excerpt(&s.log, 20)
                    )))
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
                                return Err(Failure::could_not_run(
                                    format!("restart of {} did not happen: {why}", role.name),
                                    "make the role's restart command really restart the engine \
                                     (a restart, not a reload; the right service or container), \
                                     or have the engine report `pid` and `started_at` at its \
                                     effective-config URL so a fast restart can be told apart",
                                )
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
                    .map(|s| format!("\n{}", log_excerpt(&s.log, 20)))
                    .unwrap_or_default();
                return Err(Failure::CouldNotRun(Problem::message_only(format!(
                    "role {} not healthy at {} after {} s (last: {last}){tail}",
                    role.name, role.health, role.health_timeout_s
                )))
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

    fn lost_logs(&mut self) -> Vec<(String, String)> {
        let roles = &self.roles;
        self.followers
            .iter_mut()
            .filter_map(|f| {
                let status = f.child.try_wait().ok()??;
                let cmd = roles
                    .iter()
                    .find(|r| r.name == f.role)
                    .and_then(|r| r.log.as_deref())
                    .unwrap_or_default();
                Some((
                    f.role.clone(),
                    format!(
                        "role {}'s log command exited ({status}) while it was followed: {cmd} \
                         (its output, {}, says why)",
                        f.role,
                        f.log.display()
                    ),
                ))
            })
            .collect()
    }

    fn logs(&self) -> Vec<(String, PathBuf)> {
        self.spawned
            .iter()
            .chain(&self.followers)
            .map(|s| (s.role.clone(), s.log.clone()))
            .collect()
    }

    fn spawned(&self) -> Vec<SpawnedRole> {
        self.spawned
            .iter()
            .filter_map(|s| {
                Some(SpawnedRole {
                    role: s.role.clone(),
                    pid: s.child.id()?,
                    log: s.log.clone(),
                })
            })
            .collect()
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
        // A log command's group too (a pipeline such as `journalctl -f | grep` outlives
        // its `sh`, which alone dies with bisect).
        for f in &self.followers {
            if let Some(pid) = f.child.id() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
