//! The launch-config editor (docs/design.md 3.3): reads and writes one flag's setting in
//! each role's launch config, refuses half-applied flags, and journals the originals
//! so every edit is undone, even after a crash.
//!
//! `shell` lexes a launch config into words and commands; `edit` holds the pure text
//! functions that read and write a setting with it; `journal` the file operations ([`Editor`],
//! [`recover`]). Bad input (a value, a partial flag, a config with no place for the
//! setting, a readback that disagrees) is a [`LaunchError`] (exit code 2); I/O failures
//! are plain `anyhow` errors.

mod atomic;
mod edit;
mod journal;
#[cfg(test)]
mod proptests;
mod shell;
mod state;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::exit::Problem;

pub(crate) use edit::{check_partial, read_setting, setting_line, write_setting};
pub use journal::Recovery;
pub use journal::{gone_words, recover, recover_at, Kept};
pub(crate) use journal::{Editor, JOURNAL_FILE};
pub use state::state_root;
pub use state::SpawnedGroup;
pub(crate) use state::{forget_group, process_group_of, record_group, start_ticks};

/// The launch configs of a target, held by this process: each file's lock, taken for a
/// command that does not edit them (a probe) or shared with this process's editor.
#[derive(Debug)]
pub(crate) struct TargetLocks {
    /// (canonical path, its state's lock), sorted by path.
    held: Vec<(PathBuf, state::LockGuard)>,
}

impl TargetLocks {
    /// The state directory of the launch config `file` (where the process groups of the
    /// roles it launches are recorded).
    pub(crate) fn dir_of(&self, file: &Path) -> anyhow::Result<PathBuf> {
        let canonical = std::fs::canonicalize(file)
            .with_context(|| format!("launch config {}", file.display()))?;
        self.held
            .iter()
            .find(|(path, _)| *path == canonical)
            .map(|(_, guard)| guard.dir().to_path_buf())
            .with_context(|| format!("launch config {} is not held", file.display()))
    }
}

/// Takes (or shares with this process's editor) the lock of every launch config in
/// `files`, in path order, under `root`: refused (exit 3, naming the file and its
/// holder) while another live bisect holds any of them. A lock taken rather than shared
/// recovers what a dead owner left on that file first (its journal replayed, its engines
/// killed), returned for the user.
pub(crate) fn lock_target(
    root: &Path,
    files: &[PathBuf],
) -> anyhow::Result<(TargetLocks, Recovery)> {
    let canonical = state::canonical_files(files)?;
    let (held, recovery) = journal::take_files(root, &canonical, state::Reentry::Share)?;
    Ok((TargetLocks { held }, recovery))
}

/// The journal of edits a bisect keeps for one of these launch configs, if one exists
/// under `root`: a run in progress, or one that died with its edits still in the files.
/// Creates nothing (for `bisect check`).
pub(crate) fn pending_journal(root: &Path, files: &[PathBuf]) -> Option<PathBuf> {
    let canonical = state::canonical_files(files).ok()?;
    // Each file's own state, then states older versions keyed by a whole target.
    let keyed = canonical
        .iter()
        .map(|f| state::state_path(root, std::slice::from_ref(f)))
        .chain(std::iter::once(state::state_path(root, &canonical)));
    let listing = state::all_state_dirs(root).into_iter().filter(|dir| {
        state::listed_files(dir)
            .iter()
            .any(|f| canonical.contains(f))
    });
    keyed
        .chain(listing)
        .map(|dir| dir.join(JOURNAL_FILE))
        .find(|journal| journal.is_file())
}

/// The state directory path for sorted canonical launch configs (tests that plant
/// state where bisect would look).
#[cfg(test)]
pub(crate) fn state_root_for_tests(root: &std::path::Path, canonical: &[PathBuf]) -> PathBuf {
    state::state_path(root, canonical)
}

/// A launch config or flag value the editor refuses. [`LaunchError::problem`] says what
/// is wrong (naming the file and line where known) and how to fix it, as two values;
/// `Display` prints them the way every problem is printed.
#[derive(Debug)]
pub(crate) enum LaunchError {
    BadValue {
        flag: String,
        reason: String,
    },
    /// The flag's setting appears in the launch config of a role the flag does not list.
    Partial {
        /// Which role's config sets it (its message names it too).
        #[allow(dead_code)]
        role: String,
        path: PathBuf,
        line: usize,
        message: String,
        fix: String,
    },
    NoPlace {
        path: PathBuf,
        line: usize,
        flag: String,
        key: String,
    },
    NoRole {
        flag: String,
        listed: Vec<String>,
        available: Vec<String>,
    },
    Readback {
        role: String,
        path: PathBuf,
        key: String,
        expected: String,
        found: Option<String>,
    },
    /// Checked for every launch config before the first edit.
    NotWritable {
        path: PathBuf,
        reason: String,
        fix: String,
    },
}

impl LaunchError {
    /// What is wrong and what to do, apart.
    pub(crate) fn problem(&self) -> Problem {
        match self {
            LaunchError::BadValue { flag, reason, .. } => Problem::new(
                format!("flag {flag}: {reason}"),
                "use a plain value (letters, digits, . _ : / , = + -)",
            ),
            LaunchError::Partial {
                path,
                line,
                message,
                fix,
                ..
            } => Problem::new(format!("{}:{line}: {message}", path.display()), fix.clone()),
            LaunchError::NoPlace {
                path,
                line,
                flag,
                key,
            } => Problem::new(
                format!(
                    "{}:{line}: no launch command to add {key} (flag {flag}) to",
                    path.display()
                ),
                format!(
                    "make the script end with its launch command (e.g. `exec python -m sglang.launch_server ...`) or add {key} to it by hand"
                ),
            ),
            LaunchError::NoRole {
                flag,
                listed,
                available,
            } => Problem::new(
                format!(
                    "flag {flag} lists roles {} but the target has none of them (its roles: {})",
                    listed.join(", "),
                    available.join(", ")
                ),
                format!(
                    "name the target's roles in the flag's roles (a --flags-dir copy of {flag}.toml), or rename the target's roles"
                ),
            ),
            LaunchError::Readback {
                role,
                path,
                key,
                expected,
                found,
            } => Problem::new(
                format!(
                    "{}: after writing {key}={expected} for role {role:?}, reading it back gives {}",
                    path.display(),
                    found
                        .as_deref()
                        .map(|f| format!("{f:?}"))
                        .unwrap_or_else(|| "nothing".into())
                ),
                format!(
                    "check the script for a later or conditional setting of {key} that bisect cannot see, or set it by hand once"
                ),
            ),
            LaunchError::NotWritable { path, reason, fix } => Problem::new(
                format!("{}: launch config {reason}", path.display()),
                fix.clone(),
            ),
        }
    }
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.problem().fmt(f)
    }
}

impl std::error::Error for LaunchError {}
