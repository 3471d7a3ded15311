//! Edits launch configs on disk so that they are always undone: a journal of the
//! originals is written durably before the first edit, every write is atomic
//! (temp file + fsync + rename, permissions kept), and a journal left by a dead
//! process is recovered on the next start or by `bisect restore`.
//!
//! Each launch config has its own state (`state.rs`, keyed by its canonical path, not by
//! `--results`) and its own lock. [`Editor::begin`] takes the lock of every file of the
//! target in path order, so a bisect whose files overlap another live bisect's is
//! refused, naming the file and its holder, before it reads anything: with one lock per
//! set of files, a second target sharing one file journaled the first one's edit as
//! the original and "restored" it last, leaving the file edited for good. A file's
//! journal is `journal.json` ({pid, started_at, files: [{path, copy, mode, len, crc32,
//! written}]}) and `original-0` in its state directory; `written` stamps (length, crc32)
//! what bisect last wrote and is about to write, so that recovery tells bisect's own
//! edit from someone else's. Taking a lock replays a dead owner's journal and kills the
//! engines it left (`processes.json`). Journals that older versions left in
//! `<results>/.bisect-journal`, or in a state keyed by a whole target's files, are still
//! recovered.
//!
//! Someone else's change to a launch config while bisect has it edited is neither
//! carried into later arms nor lost: before each edit and each restart the files must
//! still hold what bisect last wrote, else the run stops (the arms would differ by more
//! than the flag), and at the end the original is put back while the other version is
//! kept beside the file ([`Kept`]).
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::config::{FlagSpec, RoleSpec};
use crate::exit::{Failure, Problem};

use super::state::{self, LockGuard, Reentry, SpawnedGroup};
use super::{read_setting, write_setting, LaunchError};

/// Name of the journal file inside the journal directory.
pub(crate) const JOURNAL_FILE: &str = "journal.json";
const COPY_PREFIX: &str = "original-";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Journal {
    pid: u32,
    started_at: String,
    files: Vec<JournalEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct JournalEntry {
    path: PathBuf,
    /// File name of the byte-for-byte copy, beside the journal.
    copy: String,
    mode: u32,
    len: u64,
    crc32: u32,
    /// What bisect last wrote into the file and what it is about to write (at most
    /// two): content that is neither, nor the original, was written by someone else.
    /// Empty before the first edit; absent in journals of older versions, whose files
    /// are restored without this check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    written: Option<Vec<Stamp>>,
}

/// A file content's fingerprint in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    len: u64,
    crc32: u32,
}

impl Stamp {
    fn of(bytes: &[u8]) -> Stamp {
        Stamp {
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }
}

/// A launch config that someone other than bisect changed while bisect had it edited:
/// the original is back in `path`, and the version found there is kept in `copy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub path: PathBuf,
    pub copy: PathBuf,
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{path} was changed by someone other than bisect while bisect had it edited: \
             the original from before the run is back in {path}, and the changed version \
             is kept in {copy} (it may also hold a value bisect wrote for the run; compare \
             the two and copy back what should stay)",
            path = self.path.display(),
            copy = self.copy.display()
        )
    }
}

/// One journaled launch config of an [`Editor`].
#[derive(Debug)]
struct Journaled {
    /// Canonical path.
    path: PathBuf,
    /// Its state directory (lock, journal, spawned groups).
    dir: PathBuf,
    original: Vec<u8>,
    mode: u32,
    /// What bisect last wrote (the original before the first edit): anything else found
    /// in the file was written by someone else.
    written: Vec<u8>,
    /// The file's journal as on disk, rewritten when `written` changes.
    journal: Journal,
    /// Where someone else's version was kept at restore, once it was.
    kept: Option<PathBuf>,
    restored: bool,
}

/// Holds the journals of a target's launch configs: [`Editor::apply`] edits them,
/// [`Editor::restore`] (or dropping the editor) puts every original back.
#[derive(Debug)]
pub(crate) struct Editor {
    files: Vec<Journaled>,
    restored: bool,
    recovered: Vec<PathBuf>,
    killed: Vec<SpawnedGroup>,
    /// Versions kept aside (at recovery or restore) and not yet handed to the caller.
    kept: Vec<Kept>,
    /// Every file's lock, released once all originals are back.
    locks: Vec<LockGuard>,
}

/// The value read back from a role's launch config after an edit, or why it differs.
fn verify_readback(
    role: &str,
    path: &Path,
    text: &str,
    flag: &FlagSpec,
    value: &str,
) -> Result<String, LaunchError> {
    let found = read_setting(text, &flag.setting, flag);
    if found.as_deref() == Some(value) {
        Ok(value.to_string())
    } else {
        Err(LaunchError::Readback {
            role: role.to_string(),
            path: path.to_path_buf(),
            key: flag.setting.key().to_string(),
            expected: value.to_string(),
            found,
        })
    }
}

impl Journaled {
    /// Records in the journal, before the file is written, that `next` replaces what
    /// bisect last wrote: whenever the process dies, recovery finds one of the two.
    fn stamp_next(&mut self, next: &[u8]) -> anyhow::Result<()> {
        self.journal.files[0].written = Some(vec![Stamp::of(&self.written), Stamp::of(next)]);
        write_journal(&self.dir, &self.journal)
    }

    /// Puts the original back (keeping someone else's version aside first) and removes
    /// the journal. On failure the journal stays.
    fn restore(&mut self) -> anyhow::Result<()> {
        if self.kept.is_none() {
            if let Ok(current) = fs::read(&self.path) {
                if current != self.written && current != self.original {
                    self.kept = Some(keep_aside(&self.path, &current, self.mode)?);
                }
            }
        }
        put_back(&self.path, &self.original, self.mode).map_err(|e| match &self.kept {
            Some(copy) => e.context(format!(
                "the version someone else wrote during the run is kept in {}",
                copy.display()
            )),
            None => e,
        })?;
        clear_journal(&self.dir)?;
        self.restored = true;
        Ok(())
    }
}

impl Editor {
    /// Takes the lock of every launch config (refused while another live bisect holds
    /// any of them), recovers what a dead bisect left on them (its engines killed, its
    /// journals replayed, see [`Editor::recovered`]) and a legacy journal in
    /// `legacy_dir` (the results root's `.bisect-journal`), checks that every launch
    /// config can be written, then saves `files` and writes their journals durably,
    /// before any edit. The state lives under `root` (the CLI's: `$XDG_STATE_HOME/bisect`).
    pub(crate) fn begin_at(
        root: &Path,
        legacy_dir: &Path,
        files: &[PathBuf],
    ) -> anyhow::Result<Editor> {
        let canonical = state::canonical_files(files)?;
        let (locks, mut recovery) = take_files(root, &canonical, Reentry::TakeOver)?;
        recovery.absorb(recover_legacy(legacy_dir)?);
        for path in &recovery.restored {
            tracing::warn!(
                "restored {} from the journal of an earlier bisect that did not finish",
                path.display()
            );
        }

        let started_at = chrono::Utc::now().to_rfc3339();
        let mut journaled = Vec::with_capacity(locks.len());
        for (path, guard) in &locks {
            let dir = guard.dir().to_path_buf();
            remove_copies(&dir).with_context(|| format!("cleaning {}", dir.display()))?;
            let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let mode = fs::metadata(path)
                .with_context(|| format!("reading permissions of {}", path.display()))?
                .permissions()
                .mode();
            check_writable(path, mode)?;
            let entry = JournalEntry {
                path: path.clone(),
                copy: format!("{COPY_PREFIX}0"),
                mode,
                len: bytes.len() as u64,
                crc32: crc32fast::hash(&bytes),
                written: Some(Vec::new()),
            };
            journaled.push(Journaled {
                path: path.clone(),
                dir,
                written: bytes.clone(),
                original: bytes,
                mode,
                journal: Journal {
                    pid: std::process::id(),
                    started_at: started_at.clone(),
                    files: vec![entry],
                },
                kept: None,
                restored: false,
            });
        }
        for j in &journaled {
            let copy_path = j.dir.join(&j.journal.files[0].copy);
            write_atomic(&copy_path, &j.original, 0o600).with_context(|| {
                format!(
                    "saving the original of {} to {}",
                    j.path.display(),
                    copy_path.display()
                )
            })?;
            write_journal(&j.dir, &j.journal)?;
        }

        Ok(Editor {
            files: journaled,
            restored: false,
            recovered: recovery.restored,
            killed: recovery.killed,
            kept: recovery.kept,
            locks: locks.into_iter().map(|(_, guard)| guard).collect(),
        })
    }

    /// Process groups of a dead bisect that [`Editor::begin`] killed.
    pub fn killed(&self) -> &[SpawnedGroup] {
        &self.killed
    }

    /// Files a stale journal held and [`Editor::begin`] restored.
    pub(crate) fn recovered(&self) -> &[PathBuf] {
        &self.recovered
    }

    /// Launch configs whose changed version was kept aside (by recovery in
    /// [`Editor::begin`], or by [`Editor::restore`]) since the last call: each is to be
    /// told to the user.
    pub(crate) fn take_kept(&mut self) -> Vec<Kept> {
        std::mem::take(&mut self.kept)
    }

    /// The journaled launch configs (canonical paths, sorted).
    #[cfg(test)]
    pub(crate) fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Errors (exit 3) unless every launch config still holds what bisect last wrote
    /// (before the first edit, the original): a change by someone else would reach the
    /// next arm and every later one, and the arms would differ by more than the flag.
    pub(crate) fn check_unchanged(&self) -> anyhow::Result<()> {
        if self.restored {
            return Ok(());
        }
        for f in &self.files {
            let now = fs::read(&f.path)
                .with_context(|| format!("reading launch config {}", f.path.display()))?;
            if now != f.written {
                return Err(Failure::could_not_run(
                    format!(
                        "{} was changed by someone other than bisect while bisect had it edited: \
                         the next arm and every later one would run with that change, so the \
                         arms would differ by more than the flag; stopping",
                        f.path.display()
                    ),
                    "leave the launch configs alone while bisect runs on them, then run again \
                     (bisect puts the original back now and keeps the changed version beside \
                     the file)",
                )
                .into());
            }
        }
        Ok(())
    }

    /// Writes `value` for `flag` into the launch config of every role in `roles` that
    /// the flag lists, then reads each back; returns {role: value read back}. Every
    /// error comes before the caller restarts anything, and nothing is written when a
    /// launch config no longer holds what bisect last wrote ([`Editor::check_unchanged`]).
    /// Call [`super::check_partial`] first unless `--allow-partial` was given.
    pub fn apply(
        &mut self,
        flag: &FlagSpec,
        value: &str,
        roles: &[RoleSpec],
    ) -> anyhow::Result<BTreeMap<String, String>> {
        if self.restored {
            bail!("the launch-config editor was already restored; start a new one");
        }
        let targets: Vec<&RoleSpec> = roles
            .iter()
            .filter(|r| flag.roles.iter().any(|f| f == &r.name))
            .collect();
        if targets.is_empty() {
            return Err(LaunchError::NoRole {
                flag: flag.name.clone(),
                listed: flag.roles.clone(),
                available: roles.iter().map(|r| r.name.clone()).collect(),
            }
            .into());
        }

        let mut resolved = Vec::with_capacity(targets.len());
        for role in &targets {
            let path = fs::canonicalize(&role.launch).with_context(|| {
                format!(
                    "launch config {} of role {}",
                    role.launch.display(),
                    role.name
                )
            })?;
            let index = self.files.iter().position(|f| f.path == path).ok_or_else(|| {
                anyhow!(
                    "launch config {} of role {} is not journaled; pass every launch config to Editor::begin",
                    role.launch.display(),
                    role.name
                )
            })?;
            resolved.push((role, index));
        }
        self.check_unchanged()?;

        for (i, (role, index)) in resolved.iter().enumerate() {
            if i > 0 {
                crate::fault::pause("editing");
            }
            let file = &mut self.files[*index];
            // The file holds `written` (checked above): edit that, not a later re-read.
            let text = std::str::from_utf8(&file.written).map_err(|e| {
                anyhow!(
                    "reading launch config {}: not UTF-8 text ({e})",
                    file.path.display()
                )
            })?;
            let edited = write_setting(text, flag, value, &role.launch)?;
            if edited.as_bytes() != file.written {
                file.stamp_next(edited.as_bytes())?;
                write_atomic(&file.path, edited.as_bytes(), file.mode)
                    .with_context(|| format!("writing launch config {}", file.path.display()))?;
                file.written = edited.into_bytes();
            }
        }

        let mut readback = BTreeMap::new();
        for (role, index) in &resolved {
            let path = &self.files[*index].path;
            let text = fs::read_to_string(path)
                .with_context(|| format!("reading back launch config {}", path.display()))?;
            let got = verify_readback(&role.name, &role.launch, &text, flag, value)?;
            readback.insert(role.name.clone(), got);
        }
        Ok(readback)
    }

    /// Puts every original back byte-for-byte (with its permissions) and removes the
    /// journals. A launch config someone else changed since bisect's last edit gets its
    /// original back too, that version kept beside it ([`Editor::take_kept`]): the
    /// configs end as they were before the run, and nobody's edit is lost. Every file
    /// is tried; on failure its journal stays, so `bisect restore` can finish the job.
    pub fn restore(&mut self) -> anyhow::Result<()> {
        if self.restored {
            return Ok(());
        }
        let mut failed = None;
        for file in self.files.iter_mut().filter(|f| !f.restored) {
            match file.restore() {
                Ok(()) => {
                    if let Some(copy) = &file.kept {
                        self.kept.push(Kept {
                            path: file.path.clone(),
                            copy: copy.clone(),
                        });
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        self.restored = true;
        self.locks.clear();
        Ok(())
    }
}

impl Drop for Editor {
    fn drop(&mut self) {
        if !self.restored {
            if let Err(e) = self.restore() {
                // The harness commands install no tracing subscriber: stderr is the one
                // place the user sees this.
                let journals: Vec<String> = self
                    .files
                    .iter()
                    .filter(|f| !f.restored)
                    .map(|f| f.dir.display().to_string())
                    .collect();
                // Written, not `eprintln!`: a panic here, in a drop, would abort.
                let problem = Problem::new(
                    format!(
                        "error: the launch configs are still edited: could not restore them: {e:#}"
                    ),
                    format!(
                        "free what blocked the write (a full disk?), then run `bisect restore` \
                         (journals in {})",
                        journals.join(", ")
                    ),
                );
                let _ = writeln!(std::io::stderr().lock(), "{problem}");
            }
        }
        for kept in self.kept.drain(..) {
            let _ = writeln!(std::io::stderr().lock(), "warning: {kept}");
        }
    }
}

mod disk;
mod recovery;

use disk::{check_writable, clear_journal, keep_aside, remove_copies, write_atomic, write_journal};
pub(super) use recovery::take_files;
pub use recovery::Recovery;
pub use recovery::{gone_words, recover, recover_at};
use recovery::{put_back, recover_legacy};

#[cfg(test)]
mod tests;
