//! Turning a commit into something the target can run: `--build CMD` runs CMD (`sh -c`)
//! in the commit's worktree; `--artifact CMD` runs CMD with `{commit}` replaced by the
//! commit id in the search's folder, with no checkout (a per-commit wheel or image, as
//! mozregression fetches nightlies). Both see `BISECT_COMMIT` (the id) and
//! `BISECT_COMMIT_DIR` (the worktree; the search's folder for an artifact). In a search
//! over `--releases`, `{release}` (and `{commit}`, and `BISECT_COMMIT`) is the release name. Exit 0: built;
//! exit 125 or any other failure: the commit is untestable, never "bad" (git bisect's
//! convention). A build runs in its own process group, killed whole on Ctrl-C. Output goes to `builds/<commit>.log`. Results are cached per commit id
//! for the search's life, so a commit tested again costs no build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::Context;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::git::Worktrees;
use crate::exit::Failure;

/// How a commit becomes runnable.
#[derive(Debug, Clone, PartialEq)]
pub enum BuildStep {
    /// Run in the commit's worktree.
    Build(String),
    /// A command template over `{commit}`, no worktree.
    Artifact(String),
}

/// One build as commits.json records it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BuildEntry {
    pub commit: usize,
    pub sha: String,
    pub seconds: f64,
    pub ok: bool,
    /// Why it is untestable, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub log: String,
}

/// What a commit built into.
#[derive(Debug, Clone, PartialEq)]
pub enum Built {
    /// Runs from this folder (the worktree; `None` for an artifact).
    Ready(Option<PathBuf>),
    Untestable(String),
}

/// The builds of one search, cached by commit id.
pub struct Builder {
    step: BuildStep,
    dir: PathBuf,
    cache: BTreeMap<String, Built>,
    /// A Slurm array task's: a finished build leaves `builds/<commit>.ready` (its folder)
    /// for the tasks of later rounds, which then build nothing.
    shared: bool,
}

impl Builder {
    /// Builds logged under `dir/builds/`.
    pub fn new(step: BuildStep, dir: &Path) -> Self {
        Builder {
            step,
            dir: dir.to_path_buf(),
            cache: BTreeMap::new(),
            shared: false,
        }
    }

    /// An array task's builder: builds of earlier tasks of the search are reused.
    pub(crate) fn shared(step: BuildStep, dir: &Path) -> Self {
        Builder {
            shared: true,
            ..Builder::new(step, dir)
        }
    }

    /// Whether a build is shared between array tasks: only a `--build`, whose product
    /// is the commit's worktree. An artifact's command installs onto the node it runs on,
    /// so every task runs it.
    fn shares_builds(&self) -> bool {
        self.shared && matches!(self.step, BuildStep::Build(_))
    }

    fn ready_marker(&self, sha: &str) -> PathBuf {
        ready_marker(&self.dir, sha)
    }

    /// A build an earlier array task finished, its folder still there.
    fn built_by_another_task(&self, sha: &str) -> Option<Built> {
        let text = std::fs::read_to_string(self.ready_marker(sha)).ok()?;
        let folder: Option<PathBuf> = serde_json::from_str(&text).ok()?;
        match folder {
            Some(f) if !f.is_dir() => None,
            folder => Some(Built::Ready(folder)),
        }
    }

    /// The commit built (`None` seconds when cached), or why it is untestable. A
    /// `--build` is cached (its product is the commit's worktree); an artifact's command
    /// runs every time its commit is tested, since what it installs lives outside bisect's
    /// folders and another commit's install may have replaced it since. An untestable
    /// commit is never tested again, so its result is kept either way.
    pub async fn build(
        &mut self,
        commit: usize,
        sha: &str,
        worktrees: &mut Worktrees,
        cancel: &CancellationToken,
    ) -> anyhow::Result<(Built, Option<BuildEntry>)> {
        match self.cache.get(sha) {
            Some(built @ Built::Untestable(_)) => return Ok((built.clone(), None)),
            Some(built) if matches!(self.step, BuildStep::Build(_)) => {
                return Ok((built.clone(), None))
            }
            _ => {}
        }
        if let Some(built) = self
            .shares_builds()
            .then(|| self.built_by_another_task(sha))
            .flatten()
        {
            return Ok((built, None));
        }
        let short = super::git::short_id(sha);
        let logs = self.dir.join("builds");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let log = logs.join(format!("{short}.log"));
        let started = Instant::now();
        let (cmd, cwd, folder) = match &self.step {
            BuildStep::Build(cmd) => match worktrees.checkout(sha) {
                Ok(tree) => (cmd.clone(), tree.clone(), Some(tree)),
                // In an array task a checkout that fails (git's locks, with other tasks
                // adding worktrees) says nothing of the commit: the task fails, and its
                // step could not tell.
                Err(e) if self.shared => return Err(e),
                Err(e) => {
                    let built = Built::Untestable(format!("could not check it out: {e:#}"));
                    return Ok(self.remember(commit, sha, built, started, &log));
                }
            },
            BuildStep::Artifact(template) => {
                let cmd = template.replace("{commit}", sha).replace("{release}", sha);
                (cmd, self.dir.clone(), None)
            }
        };
        let status = run_logged(&cmd, &cwd, sha, &log, cancel).await?;
        let built = match status {
            Some(0) => Built::Ready(folder),
            Some(125) => Built::Untestable(format!(
                "the build exited 125 (cannot be tested; see {})",
                rel(&log, &self.dir)
            )),
            Some(code) => Built::Untestable(format!(
                "the build failed, exit {code} (see {})",
                rel(&log, &self.dir)
            )),
            None => Built::Untestable(format!(
                "the build was killed by a signal (see {})",
                rel(&log, &self.dir)
            )),
        };
        Ok(self.remember(commit, sha, built, started, &log))
    }

    fn remember(
        &mut self,
        commit: usize,
        sha: &str,
        built: Built,
        started: Instant,
        log: &Path,
    ) -> (Built, Option<BuildEntry>) {
        self.cache.insert(sha.to_string(), built.clone());
        if let (true, Built::Ready(folder)) = (self.shares_builds(), &built) {
            // Best effort: without it a later task builds the commit again.
            let _ = std::fs::write(
                self.ready_marker(sha),
                serde_json::to_string(folder).unwrap_or_default(),
            );
        }
        let reason = match &built {
            Built::Untestable(why) => Some(why.clone()),
            Built::Ready(_) => None,
        };
        let entry = BuildEntry {
            commit,
            sha: sha.to_string(),
            seconds: started.elapsed().as_secs_f64(),
            ok: reason.is_none(),
            reason,
            log: rel(log, &self.dir),
        };
        (built, Some(entry))
    }
}

fn ready_marker(dir: &Path, sha: &str) -> PathBuf {
    dir.join("builds")
        .join(format!("{}.ready", super::git::short_id(sha)))
}

/// Removes one commit's build marker: its task died, perhaps mid-block.
pub(crate) fn forget_one(dir: &Path, sha: &str) {
    let _ = std::fs::remove_file(ready_marker(dir, sha));
}

/// Removes the build markers array tasks leave (`builds/*.ready`), so no task trusts a
/// build of an earlier, killed search.
pub(crate) fn forget_shared(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("builds")) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_some_and(|e| e == "ready") {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn rel(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `sh -c cmd` in `cwd`, output to `log`; the exit code (`None`: a signal). Ctrl-C kills
/// it and stops the search.
async fn run_logged(
    cmd: &str,
    cwd: &Path,
    sha: &str,
    log: &Path,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<i32>> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(cwd)
        .env("BISECT_COMMIT", sha)
        .env("BISECT_COMMIT_DIR", cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running the build `{cmd}` in {}", cwd.display()))?;
    let group = child.id();
    tokio::select! {
        status = child.wait() => Ok(status.context("waiting for the build")?.code()),
        _ = cancel.cancelled() => {
            // The whole group: a build's compilers and scripts die with it.
            if let Some(pgid) = group {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pgid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.wait().await;
            Err(Failure::Interrupted.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_artifact_is_installed_every_time_its_commit_is_tested() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut worktrees = Worktrees::new(d, &d.join("worktrees"));
        let cancel = CancellationToken::new();
        let step = BuildStep::Artifact("echo {commit} >> installs.txt".into());
        let mut builder = Builder::new(step, d);
        for _ in 0..2 {
            let (built, entry) = builder
                .build(3, "abc", &mut worktrees, &cancel)
                .await
                .unwrap();
            assert_eq!(built, Built::Ready(None));
            assert!(entry.is_some_and(|e| e.ok));
        }
        let installs = std::fs::read_to_string(d.join("installs.txt")).unwrap();
        assert_eq!(installs, "abc\nabc\n");
        // A failed install is not retried.
        let mut failing = Builder::new(BuildStep::Artifact("exit 3".into()), d);
        let (first, _) = failing
            .build(4, "def", &mut worktrees, &cancel)
            .await
            .unwrap();
        assert!(matches!(first, Built::Untestable(_)));
        let (again, entry) = failing
            .build(4, "def", &mut worktrees, &cancel)
            .await
            .unwrap();
        assert_eq!((again, entry), (first, None));
    }
}
