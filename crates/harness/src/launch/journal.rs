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
use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::config::{FlagSpec, RoleSpec};
use crate::exit::Failure;

use super::state::{self, LockGuard, Reentry, SpawnedGroup};
use super::{read_setting, write_setting, LaunchError};

/// Name of the journal file inside the journal directory.
pub const JOURNAL_FILE: &str = "journal.json";
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
pub struct Editor {
    files: Vec<Journaled>,
    restored: bool,
    recovered: Vec<PathBuf>,
    killed: Vec<SpawnedGroup>,
    /// Versions kept aside (at recovery or restore) and not yet handed to the caller.
    kept: Vec<Kept>,
    /// Every file's lock, released once all originals are back.
    locks: Vec<LockGuard>,
}

/// Refuses, before any edit, a launch config bisect could not write or restore: a
/// read-only file (it would otherwise be silently replaced by the rename), a file this
/// user cannot open for writing, or a folder where the atomic write's temp file cannot
/// be created.
fn check_writable(path: &Path, mode: u32) -> Result<(), LaunchError> {
    let refuse = |reason: String, fix: String| LaunchError::NotWritable {
        path: path.to_path_buf(),
        reason,
        fix,
    };
    if mode & 0o222 == 0 {
        return Err(refuse(
            format!("is read-only (mode {:04o})", mode & 0o7777),
            format!("make it writable (chmod u+w {}) if bisect may edit it, or leave its flags out of the run", path.display()),
        ));
    }
    if let Err(e) = fs::OpenOptions::new().write(true).open(path) {
        return Err(refuse(
            format!("cannot be opened for writing: {e}"),
            "run bisect as a user who may write the launch configs".into(),
        ));
    }
    let probe = temp_path(path);
    let folder = path.parent().unwrap_or(Path::new("/"));
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(refuse(
            format!(
                "sits in {} where bisect cannot create {} for its atomic writes: {e}",
                folder.display(),
                probe.display()
            ),
            format!("make {} writable for this user", folder.display()),
        )),
    }
}

/// Where a file's in-progress atomic write goes: beside it, so the rename stays on one
/// filesystem, under a fixed name so recovery can clean it up.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.bisect-tmp"))
}

/// fsync of a directory makes a rename in it durable; some filesystems refuse it, and
/// the data itself is already synced, so that failure is only logged.
fn sync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!("fsync of directory {} failed: {e}", dir.display());
    }
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(Permissions::from_mode(mode & 0o7777))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    Ok(())
}

/// Saves someone else's version of the launch config `path` beside it, under a new name
/// (`<name>.changed-during-bisect-<UTC time>[-N]`, never overwriting a file) that no
/// `*.sh`-style glob picks up, without execute permission. Returns the copy's path.
fn keep_aside(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    for n in 1u32.. {
        let suffix = if n == 1 {
            String::new()
        } else {
            format!("-{n}")
        };
        let copy = path.with_file_name(format!("{name}.changed-during-bisect-{stamp}{suffix}"));
        let mut file = match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o666)
            .open(&copy)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "keeping the changed version of {} in {}",
                        path.display(),
                        copy.display()
                    )
                })
            }
        };
        if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
            let _ = fs::remove_file(&copy);
            return Err(e).with_context(|| {
                format!(
                    "keeping the changed version of {} in {}",
                    path.display(),
                    copy.display()
                )
            });
        }
        if let Some(dir) = copy.parent() {
            sync_dir(dir);
        }
        return Ok(copy);
    }
    unreachable!("a free name is found before the counter runs out")
}

/// Whether the process that wrote a journal still holds it. A live process that is
/// not bisect (its pid was reused) does not.
fn holder_alive(pid: u32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    if pid == std::process::id() {
        return false;
    }
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let exists = matches!(kill(Pid::from_raw(raw), None), Ok(()) | Err(Errno::EPERM));
    if !exists {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => comm.trim().starts_with("bisect"),
        // Without /proc we cannot tell; keeping the journal is the safe side.
        Err(_) => true,
    }
}

fn remove_copies(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(COPY_PREFIX) {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn write_journal(dir: &Path, journal: &Journal) -> anyhow::Result<()> {
    let path = dir.join(JOURNAL_FILE);
    let json = serde_json::to_vec_pretty(journal).context("encoding the journal")?;
    write_atomic(&path, &json, 0o600).with_context(|| format!("writing {}", path.display()))
}

/// Removes the journal in `dir` and its saved originals: the originals are back.
fn clear_journal(dir: &Path) -> anyhow::Result<()> {
    let journal_path = dir.join(JOURNAL_FILE);
    match fs::remove_file(&journal_path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", journal_path.display())),
    }
    remove_copies(dir).with_context(|| format!("removing saved originals in {}", dir.display()))?;
    sync_dir(dir);
    Ok(())
}

/// What recovery found and undid.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Launch configs restored from a journal.
    pub restored: Vec<PathBuf>,
    /// Process groups of a dead bisect that were killed.
    pub killed: Vec<SpawnedGroup>,
    /// Launch configs someone else changed after the dead bisect's last edit: their
    /// version kept beside them before the original was put back.
    pub kept: Vec<Kept>,
}

impl Recovery {
    fn absorb(&mut self, other: Recovery) {
        self.restored.extend(other.restored);
        self.killed.extend(other.killed);
        self.kept.extend(other.kept);
    }

    /// One line per thing undone, for the user.
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .restored
            .iter()
            .map(|p| {
                format!(
                    "restored {} left edited by an earlier bisect that did not finish",
                    p.display()
                )
            })
            .collect();
        lines.extend(self.killed.iter().map(|g| {
            format!(
                "stopped role {} (process group {}), left running by an earlier bisect that did not finish",
                g.role, g.pgid
            )
        }));
        lines.extend(self.kept.iter().map(|k| format!("warning: {k}")));
        lines
    }
}

/// Writes every original recorded in the journal in `dir` back byte-for-byte with its
/// permissions, and removes the journal. A file whose content is neither the original
/// nor what the journal says bisect wrote was changed by someone else since: that
/// version is kept beside it first. The caller holds the lock (or the legacy journal's
/// holder is gone).
fn replay(dir: &Path) -> anyhow::Result<Recovery> {
    let journal_path = dir.join(JOURNAL_FILE);
    let bytes = match fs::read(&journal_path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Recovery::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", journal_path.display())),
    };
    let journal: Journal = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a bisect journal; restore the launch configs from the original-* copies beside it by hand, then delete it",
            journal_path.display()
        )
    })?;
    let mut recovery = Recovery::default();
    for entry in &journal.files {
        let copy_path = dir.join(&entry.copy);
        let original = fs::read(&copy_path)
            .with_context(|| format!("reading the saved original {}", copy_path.display()))?;
        if original.len() as u64 != entry.len || crc32fast::hash(&original) != entry.crc32 {
            bail!(
                "saved original {} of {} is damaged (length or checksum differs); not restoring it\n  fix: restore {} by hand, then delete {}",
                copy_path.display(),
                entry.path.display(),
                entry.path.display(),
                journal_path.display()
            );
        }
        if let (Some(written), Ok(current)) = (&entry.written, fs::read(&entry.path)) {
            if current != original && !written.contains(&Stamp::of(&current)) {
                let copy = keep_aside(&entry.path, &current, entry.mode)?;
                recovery.kept.push(Kept {
                    path: entry.path.clone(),
                    copy,
                });
            }
        }
        put_back(&entry.path, &original, entry.mode)?;
        let _ = fs::remove_file(temp_path(&entry.path));
        recovery.restored.push(entry.path.clone());
    }
    fs::remove_file(&journal_path)
        .with_context(|| format!("removing {}", journal_path.display()))?;
    remove_copies(dir).with_context(|| format!("removing saved originals in {}", dir.display()))?;
    sync_dir(dir);
    Ok(recovery)
}

/// Makes `path` hold exactly `bytes` with permissions `mode` (content and mode both).
fn put_back(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let current = fs::read(path).ok();
    if current.as_deref() != Some(bytes) {
        write_atomic(path, bytes, mode).with_context(|| format!("restoring {}", path.display()))
    } else {
        fs::set_permissions(path, Permissions::from_mode(mode & 0o7777))
            .with_context(|| format!("restoring permissions of {}", path.display()))
    }
}

/// Recovers a journal that an older bisect left in `legacy_dir` (refused while the
/// process that wrote it runs).
fn recover_legacy(legacy_dir: &Path) -> anyhow::Result<Recovery> {
    let journal_path = legacy_dir.join(JOURNAL_FILE);
    if let Ok(bytes) = fs::read(&journal_path) {
        if let Ok(journal) = serde_json::from_slice::<Journal>(&bytes) {
            if holder_alive(journal.pid) {
                bail!(
                    "launch configs are being edited by another bisect (pid {}, started {}); journal {}\n  fix: wait for it to finish, or stop it (it restores the configs on exit)",
                    journal.pid,
                    journal.started_at,
                    journal_path.display()
                );
            }
        }
    }
    replay(legacy_dir)
}

/// Kills what a dead owner of the state in `guard` left running and replays its journal.
/// Its launch configs' in-progress atomic writes go too: with the lock held no live
/// process writes them, and a kill can land before any journal exists (the writability
/// probe), where the replay would not know the file.
fn recover_state(guard: &LockGuard) -> anyhow::Result<Recovery> {
    let killed = state::kill_stale_groups(guard.dir())?;
    let mut recovery = replay(guard.dir())?;
    recovery.killed.splice(0..0, killed);
    for file in state::listed_files(guard.dir()) {
        let _ = fs::remove_file(temp_path(&file));
    }
    Ok(recovery)
}

/// Takes the lock of every state under `root` that no live process holds, kills the
/// engines its dead owner left and replays its journal. States held by a live bisect
/// (this one included) are left alone.
fn sweep(root: &Path) -> anyhow::Result<Recovery> {
    let mut recovery = Recovery::default();
    for dir in state::all_state_dirs(root) {
        // Nothing to recover: leave it alone (it may be a state another process is just
        // creating; locking it would make that process's own lock attempt fail).
        if !state::has_leftovers(&dir) {
            continue;
        }
        let guard = match state::lock(&dir, Reentry::Skip) {
            Ok(Some(guard)) => guard,
            Ok(None) => continue,
            // Held by another live bisect: it is not stale.
            Err(e) if e.downcast_ref::<Failure>().is_some() => continue,
            Err(e) => return Err(e),
        };
        recovery.absorb(recover_state(&guard)?);
        drop(guard);
    }
    Ok(recovery)
}

/// The launch configs `canonical` (sorted), each one's lock taken in that order, with
/// what dead owners left on them undone. The order matters: of two bisects whose files
/// overlap, the first to reach a common file holds it and the other is refused there
/// (naming the file and its holder), so they never each hold a part. Recovered: the
/// states this call took rather than shared with this process's own editor, and the
/// states of older versions, keyed by a whole target, that list one of the files (a live
/// bisect holding one of those is refused like any holder).
pub(super) fn take_files(
    root: &Path,
    canonical: &[PathBuf],
    reentry: Reentry,
) -> anyhow::Result<(Vec<(PathBuf, LockGuard)>, Recovery)> {
    let mut locks = Vec::with_capacity(canonical.len());
    for file in canonical {
        let dir = state::file_state_dir(root, file)?;
        let guard = state::lock(&dir, reentry)?
            .context("only the sweep skips a lock this process holds")?;
        locks.push((file.clone(), guard));
    }
    let mut recovery = Recovery::default();
    for (_, guard) in locks.iter().filter(|(_, g)| g.owned()) {
        recovery.absorb(recover_state(guard)?);
    }
    for dir in state::all_state_dirs(root) {
        if locks.iter().any(|(_, g)| g.dir() == dir)
            || !state::has_leftovers(&dir)
            || !state::listed_files(&dir)
                .iter()
                .any(|f| canonical.contains(f))
        {
            continue;
        }
        if let Some(guard) = state::lock(&dir, Reentry::Skip)? {
            recovery.absorb(recover_state(&guard)?);
        }
    }
    Ok((locks, recovery))
}

/// Recovers what dead bisect processes left: the legacy journal in `legacy_dir`, then
/// every state under `root` (see [`recover`]).
pub fn recover_at(root: &Path, legacy_dir: &Path) -> anyhow::Result<Recovery> {
    let mut recovery = recover_legacy(legacy_dir)?;
    recovery.absorb(sweep(root)?);
    Ok(recovery)
}

/// Recovers after a bisect that died (kill -9, crash): kills the engines it spawned and
/// restores every launch config it left edited, byte-for-byte with permissions, for
/// every launch config whose lock no live bisect holds, plus a journal an older version
/// left in `legacy_dir` (`<results>/.bisect-journal`).
pub fn recover(legacy_dir: &Path) -> anyhow::Result<Recovery> {
    recover_at(&state::state_root(), legacy_dir)
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
    /// `journal_dir` (the results root's `.bisect-journal`), checks that every launch
    /// config can be written, then saves `files` and writes their journals durably,
    /// before any edit.
    pub fn begin(journal_dir: &Path, files: &[PathBuf]) -> anyhow::Result<Editor> {
        Editor::begin_at(&state::state_root(), journal_dir, files)
    }

    /// [`Editor::begin`] with the state under `root` instead of `$XDG_STATE_HOME/bisect`.
    pub fn begin_at(root: &Path, legacy_dir: &Path, files: &[PathBuf]) -> anyhow::Result<Editor> {
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
    pub fn recovered(&self) -> &[PathBuf] {
        &self.recovered
    }

    /// Launch configs whose changed version was kept aside (by recovery in
    /// [`Editor::begin`], or by [`Editor::restore`]) since the last call: each is to be
    /// told to the user.
    pub fn take_kept(&mut self) -> Vec<Kept> {
        std::mem::take(&mut self.kept)
    }

    /// The journaled launch configs (canonical paths, sorted).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Errors (exit 3) unless every launch config still holds what bisect last wrote
    /// (before the first edit, the original): a change by someone else would reach the
    /// next arm and every later one, and the arms would differ by more than the flag.
    pub fn check_unchanged(&self) -> anyhow::Result<()> {
        if self.restored {
            return Ok(());
        }
        for f in &self.files {
            let now = fs::read(&f.path)
                .with_context(|| format!("reading launch config {}", f.path.display()))?;
            if now != f.written {
                return Err(Failure::CouldNotRun(format!(
                    "{} was changed by someone other than bisect while bisect had it edited: \
                     the next arm and every later one would run with that change, so the arms \
                     would differ by more than the flag; stopping\n  fix: leave the launch \
                     configs alone while bisect runs on them, then run again (bisect puts the \
                     original back now and keeps the changed version beside the file)",
                    f.path.display()
                ))
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
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "error: the launch configs are still edited: could not restore them: {e:#}\n  \
                     fix: free what blocked the write (a full disk?), then run `bisect restore` \
                     (journals in {})",
                    journals.join(", ")
                );
            }
        }
        for kept in self.kept.drain(..) {
            let _ = writeln!(std::io::stderr().lock(), "warning: {kept}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlagCatalog;

    const PREFILL: &str = "#!/bin/sh\n# prefill\nexport SGLANG_DSV4_BF16_INDEX_K=1  # bf16\nexec srv --role prefill \\\n  --enable-hierarchical-cache\n";
    const DECODE: &str = "#!/bin/sh\r\nexport SGLANG_DSV4_BF16_INDEX_K='1'\r\nexec srv --role decode --cuda-graph-max-bs 32\r\n";

    struct Setup {
        dir: tempfile::TempDir,
        roles: Vec<RoleSpec>,
    }

    impl Setup {
        fn new() -> Setup {
            let dir = tempfile::tempdir().unwrap();
            let mut roles = Vec::new();
            for (name, text, mode) in [("prefill", PREFILL, 0o755), ("decode", DECODE, 0o640)] {
                let path = dir.path().join(format!("{name}.sh"));
                fs::write(&path, text).unwrap();
                fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
                roles.push(RoleSpec {
                    name: name.into(),
                    launch: path,
                    restart: None,
                    health: "http://127.0.0.1:1/health".into(),
                    metrics: None,
                    health_timeout_s: 1,
                    restart_timeout_s: 300,
                    ..RoleSpec::new(name, PathBuf::new(), String::new(), None)
                });
            }
            Setup { dir, roles }
        }
        /// The state root (what `$XDG_STATE_HOME/bisect` is outside tests).
        fn root(&self) -> PathBuf {
            self.dir.path().join("state")
        }
        fn legacy(&self) -> PathBuf {
            self.dir.path().join("results/.bisect-journal")
        }
        /// The state directory of role `i`'s launch config, where its journal lives.
        fn state(&self, i: usize) -> PathBuf {
            state::file_state_dir(
                &self.root(),
                &fs::canonicalize(&self.roles[i].launch).unwrap(),
            )
            .unwrap()
        }
        /// Every launch config's state directory.
        fn states(&self) -> Vec<PathBuf> {
            (0..self.roles.len()).map(|i| self.state(i)).collect()
        }
        /// Whether any launch config's state holds `name`.
        fn any_state_has(&self, name: &str) -> bool {
            self.states().iter().any(|d| d.join(name).exists())
        }
        fn begin(&self, files: &[PathBuf]) -> anyhow::Result<Editor> {
            Editor::begin_at(&self.root(), &self.legacy(), files)
        }
        fn recover(&self) -> anyhow::Result<Vec<PathBuf>> {
            Ok(recover_at(&self.root(), &self.legacy())?.restored)
        }
        /// What a kill -9 leaves: the lock names a process that is gone.
        fn orphan(&self) {
            self.set_owner(u32::MAX, 0);
        }
        /// Every launch config's lock held by `pid`.
        fn set_owner(&self, pid: u32, start_ticks: u64) {
            for i in 0..self.roles.len() {
                self.set_owner_at(i, pid, start_ticks);
            }
        }
        /// Launch config `i`'s lock held by `pid`.
        fn set_owner_at(&self, i: usize, pid: u32, start_ticks: u64) {
            let owner = state::Owner {
                pid,
                start_ticks,
                cmdline: "bisect run".into(),
                started_at: "earlier".into(),
            };
            let lock = self.state(i).join("lock.json");
            fs::write(lock, serde_json::to_vec(&owner).unwrap()).unwrap();
        }
        fn files(&self) -> Vec<PathBuf> {
            self.roles.iter().map(|r| r.launch.clone()).collect()
        }
        fn text(&self, i: usize) -> String {
            fs::read_to_string(&self.roles[i].launch).unwrap()
        }
        fn mode(&self, i: usize) -> u32 {
            fs::metadata(&self.roles[i].launch)
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        }
        fn assert_pristine(&self) {
            assert_eq!(self.text(0), PREFILL);
            assert_eq!(self.text(1), DECODE);
            assert_eq!((self.mode(0), self.mode(1)), (0o755, 0o640));
        }
    }

    fn flag(name: &str) -> FlagSpec {
        FlagCatalog::builtin().get(name).unwrap().clone()
    }

    #[test]
    fn apply_edits_every_listed_role_reads_back_and_restore_undoes_it() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()).unwrap();
        assert!(ed.recovered().is_empty());
        assert!(s.states().iter().all(|d| d.join(JOURNAL_FILE).is_file()));
        assert_eq!(ed.files().count(), 2);

        let bf16 = flag("BF16_INDEX_K");
        let rb = ed.apply(&bf16, "0", &s.roles).unwrap();
        assert_eq!(
            rb,
            BTreeMap::from([
                ("decode".into(), "0".into()),
                ("prefill".into(), "0".into())
            ])
        );
        assert!(s
            .text(0)
            .contains("export SGLANG_DSV4_BF16_INDEX_K=0  # bf16\n"));
        assert!(s
            .text(1)
            .contains("export SGLANG_DSV4_BF16_INDEX_K='0'\r\n"));
        assert_eq!((s.mode(0), s.mode(1)), (0o755, 0o640));

        let hicache = flag("HICACHE");
        let rb = ed.apply(&hicache, "off", &s.roles).unwrap();
        assert_eq!(rb, BTreeMap::from([("prefill".into(), "off".into())]));
        assert!(!s.text(0).contains("hierarchical"));
        assert_eq!(
            s.text(1).matches("32").count(),
            1,
            "decode untouched by a prefill-only flag"
        );

        let graph = flag("CUDA_GRAPH_MAX_BS");
        assert_eq!(ed.apply(&graph, "64", &s.roles).unwrap()["decode"], "64");
        ed.apply(&bf16, "1", &s.roles).unwrap();
        ed.apply(&hicache, "on", &s.roles).unwrap();
        ed.apply(&graph, "32", &s.roles).unwrap();

        ed.restore().unwrap();
        s.assert_pristine();
        assert!(!s.any_state_has(JOURNAL_FILE));
        assert!(
            ed.apply(&bf16, "0", &s.roles).is_err(),
            "a restored editor edits nothing"
        );
    }

    #[test]
    fn drop_restores_the_originals() {
        let s = Setup::new();
        {
            let mut ed = s.begin(&s.files()).unwrap();
            ed.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap();
            assert_ne!(s.text(0), PREFILL);
        }
        s.assert_pristine();
        assert!(!s.any_state_has(JOURNAL_FILE));
    }

    #[test]
    fn a_crashed_run_is_recovered_by_the_next_begin() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()).unwrap();
        ed.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap();
        ed.apply(&flag("CUDA_GRAPH_MAX_BS"), "64", &s.roles)
            .unwrap();
        // A kill -9: no restore, no Drop.
        std::mem::forget(ed);
        assert_ne!(s.text(0), PREFILL);
        assert_ne!(s.text(1), DECODE);
        // A half-finished atomic write left behind by the crash.
        fs::write(temp_path(&s.roles[1].launch), "partial").unwrap();

        let mut next = s.begin(&s.files()).unwrap();
        let mut recovered = next.recovered().to_vec();
        recovered.sort();
        let mut expected: Vec<PathBuf> = s
            .files()
            .iter()
            .map(|f| fs::canonicalize(f).unwrap())
            .collect();
        expected.sort();
        assert_eq!(recovered, expected);
        s.assert_pristine();
        assert!(!temp_path(&s.roles[1].launch).exists());
        next.restore().unwrap();
        s.assert_pristine();
    }

    #[test]
    fn a_kill_during_the_writability_probe_leaves_nothing_for_restore_or_the_next_run() {
        let s = Setup::new();
        // The probe runs with the locks held and before any journal is written.
        let ed = s.begin(&s.files()).unwrap();
        std::mem::forget(ed);
        for i in 0..s.roles.len() {
            fs::remove_file(s.state(i).join(JOURNAL_FILE)).unwrap();
        }
        s.orphan();
        let probe = temp_path(&s.roles[1].launch);
        fs::write(&probe, "").unwrap();
        assert!(s.recover().unwrap().is_empty());
        assert!(!probe.exists(), "restore leaves the dead run's probe");

        // And a begin that finds it (no restore in between) takes over and runs.
        fs::write(&probe, "").unwrap();
        s.orphan();
        let mut next = s.begin(&s.files()).unwrap();
        assert!(!probe.exists());
        next.restore().unwrap();
        s.assert_pristine();
    }

    #[test]
    fn recover_restores_a_stale_journal_and_is_a_no_op_without_one() {
        let s = Setup::new();
        assert!(s.recover().unwrap().is_empty());
        let mut ed = s.begin(&s.files()).unwrap();
        ed.apply(&flag("HICACHE"), "off", &s.roles).unwrap();
        fs::set_permissions(&s.roles[0].launch, Permissions::from_mode(0o600)).unwrap();
        std::mem::forget(ed);
        // This process's own state is never swept: only a dead owner's is.
        assert!(s.recover().unwrap().is_empty());
        s.orphan();
        assert_eq!(s.recover().unwrap().len(), 2);
        s.assert_pristine();
        assert!(s.recover().unwrap().is_empty());
        let leftovers: Vec<_> = s
            .states()
            .iter()
            .flat_map(|d| fs::read_dir(d).unwrap())
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "files.json" && n != ".lock-mutex")
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_damaged_saved_original_is_not_restored() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()).unwrap();
        ed.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap();
        std::mem::forget(ed);
        s.orphan();
        fs::write(s.state(0).join("original-0"), "truncated").unwrap();
        let err = s.recover().unwrap_err();
        assert!(format!("{err:#}").contains("damaged"), "{err:#}");
        assert!(
            s.state(0).join(JOURNAL_FILE).exists(),
            "the journal is kept for a manual fix"
        );
    }

    #[test]
    fn a_journal_held_by_a_live_bisect_is_refused_and_a_dead_ones_recovered() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()).unwrap();
        ed.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap();
        std::mem::forget(ed);

        // A live process (pid and start time) holds the target's lock.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        s.set_owner(child.id(), state::start_ticks(child.id()).unwrap());
        assert!(
            s.recover().unwrap().is_empty(),
            "a live owner's state is not swept"
        );
        let err = s.begin(&s.files()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("another bisect") && msg.contains("fix:"),
            "{msg}"
        );
        assert_ne!(s.text(0), PREFILL, "nothing restored under a live holder");
        child.kill().unwrap();
        child.wait().unwrap();

        // The same pid, now dead: the next begin recovers before journaling anew.
        let mut next = s.begin(&s.files()).unwrap();
        assert_eq!(next.recovered().len(), 2);
        s.assert_pristine();
        next.restore().unwrap();
        assert!(!s.any_state_has("lock.json"), "locks released");
    }

    /// A live process that is not this test's: what another bisect looks like.
    fn other_bisect() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap()
    }

    /// Issue: the lock was keyed by the set of files, so a target with decode.sh alone
    /// and one with prefill.sh + decode.sh took different locks, and the second journaled
    /// the first one's edit as decode.sh's original (then "restored" it, for good).
    #[test]
    fn an_overlapping_set_of_launch_configs_is_refused_naming_the_file_and_holder() {
        let s = Setup::new();
        let decode = fs::canonicalize(&s.roles[1].launch).unwrap();
        let mut child = other_bisect();
        let mut first = s.begin(&s.files()).unwrap();
        first.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap();
        let edited = s.text(1);
        s.set_owner(child.id(), state::start_ticks(child.id()).unwrap());

        let err = s
            .begin(std::slice::from_ref(&s.roles[1].launch))
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&format!("launch config {} is in use", decode.display())),
            "{msg}"
        );
        assert!(msg.contains(&format!("pid {}", child.id())), "{msg}");
        assert!(msg.contains("bisect run") && msg.contains("fix:"), "{msg}");
        assert_eq!(
            crate::commands::code_for_error(&err),
            crate::exit::COULD_NOT_RUN
        );
        assert_eq!(s.text(1), edited, "the refused editor touched nothing");

        child.kill().unwrap();
        child.wait().unwrap();
        first.restore().unwrap();
        s.assert_pristine();
    }

    /// The other way round: the one-file target holds decode.sh; the two-file target is
    /// refused there and does not keep prefill.sh's lock it took first.
    #[test]
    fn a_refused_editor_holds_none_of_the_files_it_took_before_the_refusal() {
        let s = Setup::new();
        let mut child = other_bisect();
        let mut first = s.begin(std::slice::from_ref(&s.roles[1].launch)).unwrap();
        first
            .apply(&flag("BF16_INDEX_K"), "0", &s.roles[1..])
            .unwrap();
        s.set_owner_at(1, child.id(), state::start_ticks(child.id()).unwrap());

        let err = s.begin(&s.files()).unwrap_err();
        assert!(
            format!("{err:#}").contains("in use by another bisect"),
            "{err:#}"
        );
        assert!(
            !s.state(0).join("lock.json").exists(),
            "prefill.sh released"
        );
        assert!(!s.state(0).join(JOURNAL_FILE).exists());
        assert_eq!(s.text(0), PREFILL);

        child.kill().unwrap();
        child.wait().unwrap();
        first.restore().unwrap();
        s.assert_pristine();
    }

    #[test]
    fn a_probe_claim_is_refused_while_another_bisect_holds_one_of_its_files() {
        let s = Setup::new();
        let mut child = other_bisect();
        let ed = s.begin(&s.files()).unwrap();
        s.set_owner(child.id(), state::start_ticks(child.id()).unwrap());
        let err = super::super::lock_target(&s.root(), std::slice::from_ref(&s.roles[0].launch))
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("in use by another bisect"),
            "{err:#}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        drop(ed);
        // Free again: taken, and given back when dropped.
        let (locks, recovery) =
            super::super::lock_target(&s.root(), std::slice::from_ref(&s.roles[0].launch)).unwrap();
        assert!(recovery.restored.is_empty());
        assert!(s.state(0).join("lock.json").exists());
        drop(locks);
        assert!(!s.state(0).join("lock.json").exists());
    }

    /// Issue: each edit re-read the file, so a change made between two arms ran in every
    /// later arm (the arms then differ by more than the flag), and the restore then
    /// overwrote it.
    #[test]
    fn someone_elses_edit_stops_the_next_edit_and_is_kept_beside_the_file_at_restore() {
        let s = Setup::new();
        let prefill = fs::canonicalize(&s.roles[0].launch).unwrap();
        let mut ed = s.begin(&s.files()).unwrap();
        let bf16 = flag("BF16_INDEX_K");
        ed.apply(&bf16, "0", &s.roles).unwrap();
        let theirs = format!("{}# a port change made by hand\n", s.text(0));
        fs::write(&s.roles[0].launch, &theirs).unwrap();

        let err = ed.apply(&bf16, "1", &s.roles).unwrap_err();
        assert!(
            matches!(
                err.downcast_ref::<Failure>(),
                Some(Failure::CouldNotRun(m)) if m.contains(&prefill.display().to_string())
                    && m.contains("differ by more than the flag")
            ),
            "{err:#}"
        );
        assert_eq!(s.text(0), theirs, "nothing written over it");
        assert!(ed.check_unchanged().is_err(), "a restart is refused too");

        ed.restore().unwrap();
        s.assert_pristine();
        let kept = ed.take_kept();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept[0].path, prefill);
        assert_eq!(fs::read_to_string(&kept[0].copy).unwrap(), theirs);
        assert_eq!(kept[0].copy.parent(), prefill.parent());
        let mode = fs::metadata(&kept[0].copy).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0, "the kept copy is not executable");
        let msg = kept[0].to_string();
        assert!(
            msg.contains(&format!("is back in {}", prefill.display()))
                && msg.contains(&format!("kept in {}", kept[0].copy.display())),
            "{msg}"
        );
        assert!(ed.take_kept().is_empty(), "told once");
    }

    #[test]
    fn an_edit_by_someone_else_after_bisect_died_is_kept_when_its_journal_is_replayed() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()).unwrap();
        ed.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap();
        ed.apply(&flag("CUDA_GRAPH_MAX_BS"), "64", &s.roles)
            .unwrap();
        std::mem::forget(ed);
        let theirs = format!("{}# edited after the crash\n", s.text(1));
        fs::write(&s.roles[1].launch, &theirs).unwrap();
        s.orphan();

        let recovery = recover_at(&s.root(), &s.legacy()).unwrap();
        assert_eq!(recovery.restored.len(), 2);
        s.assert_pristine();
        // prefill.sh held bisect's own last edit: restored, nothing kept.
        assert_eq!(recovery.kept.len(), 1, "{:?}", recovery.kept);
        let kept = &recovery.kept[0];
        assert_eq!(kept.path, fs::canonicalize(&s.roles[1].launch).unwrap());
        assert_eq!(fs::read_to_string(&kept.copy).unwrap(), theirs);
        assert!(recovery.lines().iter().any(|l| l.contains("kept in")));
    }

    /// States of older versions were keyed by the whole set of a target's files: one a
    /// dead bisect left is recovered before an editor of one of its files journals it.
    #[test]
    fn a_dead_older_versions_state_for_a_whole_target_is_recovered_first() {
        let s = Setup::new();
        let canonical = state::canonical_files(&s.files()).unwrap();
        let old = state::state_dir(&s.root(), &canonical).unwrap();
        let mut entries = Vec::new();
        for (i, path) in canonical.iter().enumerate() {
            let bytes = fs::read(path).unwrap();
            fs::write(old.join(format!("original-{i}")), &bytes).unwrap();
            entries.push(JournalEntry {
                path: path.clone(),
                copy: format!("original-{i}"),
                mode: fs::metadata(path).unwrap().permissions().mode(),
                len: bytes.len() as u64,
                crc32: crc32fast::hash(&bytes),
                written: None,
            });
            fs::write(path, "#!/bin/sh\nexport SGLANG_DSV4_BF16_INDEX_K=0\n").unwrap();
        }
        write_journal(
            &old,
            &Journal {
                pid: u32::MAX,
                started_at: "earlier".into(),
                files: entries,
            },
        )
        .unwrap();
        fs::write(
            old.join("lock.json"),
            serde_json::to_vec(&state::Owner {
                pid: u32::MAX,
                start_ticks: 0,
                cmdline: "bisect run".into(),
                started_at: "earlier".into(),
            })
            .unwrap(),
        )
        .unwrap();

        let mut ed = s.begin(std::slice::from_ref(&s.roles[1].launch)).unwrap();
        assert_eq!(ed.recovered().len(), 2);
        s.assert_pristine();
        assert!(!old.join(JOURNAL_FILE).exists());
        ed.restore().unwrap();
        s.assert_pristine();
    }

    #[test]
    fn a_read_only_launch_config_is_refused_before_any_edit() {
        let s = Setup::new();
        fs::set_permissions(&s.roles[1].launch, Permissions::from_mode(0o444)).unwrap();
        let err = s.begin(&s.files()).unwrap_err();
        assert!(
            matches!(
                err.downcast_ref::<LaunchError>(),
                Some(LaunchError::NotWritable { .. })
            ),
            "{err:#}"
        );
        assert!(err.to_string().contains("fix:"), "{err}");
        assert!(!s.any_state_has(JOURNAL_FILE));
        assert!(!s.any_state_has("lock.json"), "locks released");
        assert_eq!(s.mode(1), 0o444);
    }

    #[test]
    fn restore_puts_a_changed_mode_back_even_when_the_bytes_match() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()).unwrap();
        fs::set_permissions(&s.roles[0].launch, Permissions::from_mode(0o700)).unwrap();
        ed.restore().unwrap();
        s.assert_pristine();
    }

    #[test]
    fn flags_for_roles_the_target_lacks_and_unjournaled_files_are_refused() {
        let s = Setup::new();
        let mut ed = s.begin(&s.files()[..1]).unwrap();
        let mut only_server = s.roles.clone();
        only_server[0].name = "server".into();
        only_server.truncate(1);
        let err = ed
            .apply(&flag("BF16_INDEX_K"), "0", &only_server)
            .unwrap_err();
        assert!(
            matches!(
                err.downcast_ref::<LaunchError>(),
                Some(LaunchError::NoRole { .. })
            ),
            "{err}"
        );
        let err = ed.apply(&flag("BF16_INDEX_K"), "0", &s.roles).unwrap_err();
        assert!(err.to_string().contains("not journaled"), "{err}");
        let err = ed
            .apply(&flag("BF16_INDEX_K"), "0 1", &s.roles[..1])
            .unwrap_err();
        assert!(
            matches!(
                err.downcast_ref::<LaunchError>(),
                Some(LaunchError::BadValue { .. })
            ),
            "{err}"
        );
        ed.restore().unwrap();
        s.assert_pristine();
    }

    #[test]
    fn readback_mismatch_names_role_file_and_values() {
        let f = flag("BF16_INDEX_K");
        let text = "export SGLANG_DSV4_BF16_INDEX_K=1\n";
        assert_eq!(
            verify_readback("decode", Path::new("d.sh"), text, &f, "1").unwrap(),
            "1"
        );
        let err = verify_readback("decode", Path::new("d.sh"), text, &f, "0").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("d.sh: after writing SGLANG_DSV4_BF16_INDEX_K=0"),
            "{msg}"
        );
        assert!(msg.contains("\"1\""), "{msg}");
        let err = verify_readback("decode", Path::new("d.sh"), "exec srv\n", &f, "0").unwrap_err();
        assert!(err.to_string().contains("gives nothing"), "{err}");
    }
}
