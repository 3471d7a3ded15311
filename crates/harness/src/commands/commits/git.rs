//! The repository side of `bisect commits`: the first-parent range between the two ends,
//! and one detached worktree per tested commit in a folder bisect owns. The user's
//! working tree, index and branches are never touched: `git worktree add --detach`
//! checks a commit out elsewhere and moves no ref; every worktree is removed (and the
//! repository's worktree list pruned) when the search ends, on every path, Ctrl-C
//! included ([`Worktrees`] also removes what is left when dropped).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::exit::Failure;

/// One commit of the range.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommitInfo {
    pub index: usize,
    pub sha: String,
    pub subject: String,
}

/// A commit id's first 12 characters (a release name, or a shorter id, whole): what
/// folders, logs and tables name it by.
pub(crate) fn short_id(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

fn git(repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .with_context(|| format!("running git {} in {}", args.join(" "), repo.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "git {} in {} failed: {}",
            args.join(" "),
            repo.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The good end, then every commit on the first-parent path to the bad end, oldest
/// first (the bad end last). Refused (exit 2) when a name does not resolve, when the good
/// end is not an ancestor of the bad end, or when they are the same commit.
pub(crate) fn first_parent_range(
    repo: &Path,
    good: &str,
    bad: &str,
) -> anyhow::Result<Vec<CommitInfo>> {
    let resolve = |name: &str, which: &str| {
        git(repo, &["rev-parse", "--verify", "--quiet", &format!("{name}^{{commit}}")]).map_err(|_| {
            Failure::bad_input(
                format!("{which} end {name:?} is not a commit of {}", repo.display()),
                format!(
                    "pass a commit id, tag or branch of that repository (`git -C {} log --oneline`)",
                    repo.display()
                ),
            )
        })
    };
    let good_sha = resolve(good, "the good")?;
    let bad_sha = resolve(bad, "the bad")?;
    if good_sha == bad_sha {
        return Err(Failure::bad_input(
            format!("the good and bad ends are the same commit {good_sha}"),
            "pass the last commit known good and the first known bad",
        )
        .into());
    }
    let ancestor = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["merge-base", "--is-ancestor", &good_sha, &bad_sha])
        .status()
        .context("running git merge-base")?;
    if !ancestor.success() {
        return Err(Failure::bad_input(
            format!("the good end {good} is not an ancestor of the bad end {bad}"),
            "pass GOOD BAD in that order, GOOD older",
        )
        .into());
    }
    let log = git(
        repo,
        &[
            "log",
            "--first-parent",
            "--reverse",
            "--format=%H %s",
            &format!("{good_sha}..{bad_sha}"),
        ],
    )?;
    let mut commits = vec![CommitInfo {
        index: 0,
        sha: good_sha.clone(),
        subject: git(repo, &["log", "-1", "--format=%s", &good_sha])?,
    }];
    for line in log.lines() {
        let (sha, subject) = line.split_once(' ').unwrap_or((line, ""));
        commits.push(CommitInfo {
            index: commits.len(),
            sha: sha.to_string(),
            subject: subject.to_string(),
        });
    }
    if commits.last().map(|c| c.sha.as_str()) != Some(bad_sha.as_str()) {
        return Err(Failure::bad_input(
            format!("the bad end {bad} is not on the first-parent path from the good end {good}"),
            "pass a bad end whose first-parent history reaches the good end",
        )
        .into());
    }
    Ok(commits)
}

/// `path` from this process's directory: `git -C REPO worktree add` reads a relative
/// path from the repository, and a build runs in the worktree by its path from here, so
/// a relative `--results` (the default) would put the worktree where no build finds it.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The worktrees of one search, under `root` (a folder in the search's results).
pub struct Worktrees {
    /// `None` for a search over releases, which checks nothing out.
    repo: Option<PathBuf>,
    root: PathBuf,
    made: Vec<PathBuf>,
    /// A Slurm array task's: what it makes outlives it (later rounds build on it), and
    /// the search that submitted it removes them all.
    kept: bool,
}

impl Worktrees {
    pub fn new(repo: &Path, root: &Path) -> Self {
        Worktrees {
            repo: Some(repo.to_path_buf()),
            root: absolute(root),
            made: Vec::new(),
            kept: false,
        }
    }

    /// An array task's worktrees: left in place when it ends.
    pub(crate) fn kept(repo: &Path, root: &Path) -> Self {
        let mut made = Worktrees::new(repo, root);
        made.kept = true;
        made
    }

    /// A release search's: no repository, nothing to check out or remove.
    pub fn none(root: &Path) -> Self {
        Worktrees {
            repo: None,
            root: absolute(root),
            made: Vec::new(),
            kept: false,
        }
    }

    /// Takes over every worktree under the root (made by array tasks, or left by a search
    /// that was killed), so [`Self::remove_all`] removes them.
    pub(crate) fn adopt_found(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for dir in entries.flatten().map(|e| e.path()) {
            if dir.is_dir() && !self.made.contains(&dir) {
                self.made.push(dir);
            }
        }
    }

    /// The commit checked out, detached, in a worktree of its own (made once).
    pub fn checkout(&mut self, sha: &str) -> anyhow::Result<PathBuf> {
        let Some(repo) = self.repo.clone() else {
            anyhow::bail!("a search over releases has no repository to check {sha} out of");
        };
        let dir = self.root.join(short_id(sha));
        if self.made.contains(&dir) {
            return Ok(dir);
        }
        std::fs::create_dir_all(&self.root)
            .with_context(|| format!("creating {}", self.root.display()))?;
        if dir.exists() {
            // Left by a search that was killed: not ours to trust, made again.
            let _ = git(
                &repo,
                &["worktree", "remove", "--force", &dir.to_string_lossy()],
            );
            let _ = std::fs::remove_dir_all(&dir);
            let _ = git(&repo, &["worktree", "prune"]);
        }
        let add = ["worktree", "add", "--detach", &dir.to_string_lossy(), sha];
        if git(&repo, &add).is_err() {
            // Array tasks add worktrees to one repository at once; git's own locks can
            // refuse one of them for a moment.
            std::thread::sleep(std::time::Duration::from_secs(1));
            let _ = std::fs::remove_dir_all(&dir);
            let _ = git(&repo, &["worktree", "prune"]);
            git(&repo, &add)?;
        }
        self.made.push(dir.clone());
        Ok(dir)
    }

    /// Removes every worktree made, and prunes the repository's list. Errors are
    /// collected, not stopped at.
    pub(crate) fn remove_all(&mut self) -> anyhow::Result<()> {
        let Some(repo) = self.repo.clone() else {
            return Ok(());
        };
        let mut failed = Vec::new();
        for dir in self.made.drain(..) {
            if let Err(e) = git(
                &repo,
                &["worktree", "remove", "--force", &dir.to_string_lossy()],
            ) {
                failed.push(format!("{e:#}"));
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        let _ = git(&repo, &["worktree", "prune"]);
        let _ = std::fs::remove_dir(&self.root);
        if failed.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("removing worktrees: {}", failed.join("; "))
        }
    }
}

impl Drop for Worktrees {
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.remove_all();
        }
    }
}
