//! Engine control: bring a target's roles up with a given launch config and down again.
//!
//! Two ways, per role (docs/design.md 3.2): a `restart` command run through `sh -c` and
//! checked, or, without one, `sh LAUNCH` spawned by bisect in its own process group with
//! stdout/stderr captured under the run's `logs/`. Either way the role is then waited on
//! at its health URL. Everything here sits behind [`EngineControl`] so the experiment
//! can be driven against fakes without processes.

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

/// What an arm needs from engine control. Object-safe async without a macro crate: the
/// methods return boxed futures.
pub trait EngineControl: Send {
    /// (Re)start every role with its launch config as it is now on disk, then wait until
    /// all are healthy. `label` names the arm (used for log file names). Returns the
    /// health wait per role in seconds.
    fn restart<'a>(
        &'a mut self,
        label: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, anyhow::Result<BTreeMap<String, f64>>>;

    /// Stop whatever this controller started (spawned roles). Idempotent.
    fn stop(&mut self) -> BoxFuture<'_, anyhow::Result<()>>;
}

/// Real processes: restart commands or spawned launch scripts.
pub struct ProcessControl {
    roles: Vec<RoleSpec>,
    logs_dir: PathBuf,
    http: reqwest::Client,
    spawned: Vec<Spawned>,
}

struct Spawned {
    role: String,
    child: Child,
    log: PathBuf,
}

impl ProcessControl {
    pub fn new(target: &TargetProfile, logs_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs_dir)
            .with_context(|| format!("creating logs directory {}", logs_dir.display()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(3))
            .build()?;
        Ok(ProcessControl {
            roles: target.roles.clone(),
            logs_dir: logs_dir.to_path_buf(),
            http,
            spawned: Vec::new(),
        })
    }

    async fn stop_all(&mut self) -> anyhow::Result<()> {
        let mut first_err = None;
        for mut s in self.spawned.drain(..) {
            if let Err(e) = stop_child(&mut s.child).await {
                first_err.get_or_insert(anyhow!("stopping role {}: {e:#}", s.role));
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
        self.stop_all().await?;
        let roles = self.roles.clone();
        for role in &roles {
            match &role.restart {
                Some(cmd) => run_restart_command(&role.name, cmd, &self.logs_dir, label).await?,
                None => {
                    let spawned = spawn_launch(role, &self.logs_dir, label)?;
                    self.spawned.push(spawned);
                }
            }
        }
        let mut waits = BTreeMap::new();
        for role in &roles {
            let started = Instant::now();
            self.wait_healthy(role, cancel).await?;
            waits.insert(role.name.clone(), started.elapsed().as_secs_f64());
        }
        Ok(waits)
    }

    async fn wait_healthy(
        &mut self,
        role: &RoleSpec,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(role.health_timeout_s.max(1));
        loop {
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
                Ok(resp) if resp.status().is_success() => return Ok(()),
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
            tokio::select! {
                _ = cancel.cancelled() => return Err(Failure::Interrupted.into()),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
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
            }
        }
    }
}

async fn run_restart_command(
    role: &str,
    cmd: &str,
    logs_dir: &Path,
    label: &str,
) -> anyhow::Result<()> {
    let log = logs_dir.join(format!("{label}-{role}-restart.log"));
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running restart command for role {role}: {cmd}"))?;
    let mut text = out.stdout.clone();
    text.extend_from_slice(&out.stderr);
    std::fs::write(&log, &text).with_context(|| format!("writing {}", log.display()))?;
    if !out.status.success() {
        return Err(Failure::CouldNotRun(format!(
            "restart command for role {role} failed ({}): {cmd}\n{}",
            out.status,
            truncate(&String::from_utf8_lossy(&text), 2000)
        ))
        .into());
    }
    Ok(())
}

fn spawn_launch(role: &RoleSpec, logs_dir: &Path, label: &str) -> anyhow::Result<Spawned> {
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
    let child = Command::new("sh")
        .arg(&launch)
        .current_dir(launch.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning sh {}", role.launch.display()))?;
    Ok(Spawned {
        role: role.name.clone(),
        child,
        log,
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
            }],
            source: None,
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

    #[tokio::test]
    async fn spawned_role_that_exits_reports_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let launch = dir.path().join("role.sh");
        std::fs::write(&launch, "echo starting up\necho boom >&2\nexit 7\n").unwrap();
        let target = solo_target(launch, None, 30);
        let mut ctl = ProcessControl::new(&target, &dir.path().join("logs")).unwrap();
        let err = ctl
            .restart("on", &CancellationToken::new())
            .await
            .unwrap_err();
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
    async fn failing_restart_command_is_could_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let target = solo_target(dir.path().join("unused.sh"), Some("echo nope; exit 3"), 1);
        let mut ctl = ProcessControl::new(&target, &dir.path().join("logs")).unwrap();
        let err = ctl
            .restart("off", &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(format!("{err:#}").contains("nope"));
        assert_eq!(
            crate::exit::code_for_error(&err),
            crate::exit::COULD_NOT_RUN
        );
    }
}
