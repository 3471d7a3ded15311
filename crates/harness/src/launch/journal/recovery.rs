//! Recovery of what a dead bisect left (docs/design.md, "Journal"): its journal
//! replayed (the originals put back, someone else's version kept beside the file), its
//! engines killed, and the journals older versions left, swept; and taking the files'
//! locks, which recovers each first.

use std::fs::{self, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::disk::{keep_aside, remove_copies, sync_dir, temp_path, write_atomic};
use super::{Journal, Kept, Stamp, JOURNAL_FILE};
use crate::exit::Failure;
use crate::launch::state::{self, LockGuard, Reentry, SpawnedGroup};

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
    /// Launch configs journaled as edited whose folder no longer exists (a worktree or
    /// checkout removed since): nothing to put back, and not recreated.
    pub gone: Vec<PathBuf>,
}

impl Recovery {
    pub(super) fn absorb(&mut self, other: Recovery) {
        self.restored.extend(other.restored);
        self.killed.extend(other.killed);
        self.kept.extend(other.kept);
        self.gone.extend(other.gone);
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
        lines.extend(self.gone.iter().map(|p| gone_words(p)));
        lines
    }
}

/// What a journaled launch config whose folder is gone means for the user.
pub fn gone_words(path: &Path) -> String {
    format!(
        "warning: {} was left edited by an earlier bisect that did not finish, but its folder no longer exists (a worktree or checkout removed since): nothing to restore",
        path.display()
    )
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
        // Its whole folder removed (a search's worktree taken away after a kill):
        // putting the file back would recreate a piece of a tree that is gone.
        if entry.path.parent().is_some_and(|d| !d.exists()) {
            recovery.gone.push(entry.path.clone());
            continue;
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
pub(super) fn put_back(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
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
pub(super) fn recover_legacy(legacy_dir: &Path) -> anyhow::Result<Recovery> {
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
pub(in crate::launch) fn take_files(
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
