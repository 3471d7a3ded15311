//! Per-launch-config state: what bisect owns while it works on a launch config, kept
//! where every invocation that touches the same file finds it, whatever its `--results`
//! and whatever other files its target has.
//!
//! The state directory of a launch config is `$XDG_STATE_HOME/bisect/<key>`
//! (`~/.local/state/bisect/<key>` without it), `<key>` a hash of the file's canonical
//! path. A command takes the state of every launch config of its target, in path order
//! (`journal/`), so two targets that share one file (prefill.sh + decode.sh, and
//! decode.sh alone) are never worked on at once: the lock is per file, not per set of
//! files, because a set key let each of them journal the other's edits as originals.
//! It holds:
//! - `lock.json`: the owner ({pid, start_ticks, cmdline, started_at}). The lock is
//!   held while the owner runs; a lock whose pid is gone, or belongs to a process that
//!   started at another time (a recycled pid), is stale and taken over;
//! - the file's journal (`journal.json` + `original-0`, see `journal/`);
//! - `processes.json`: the process groups bisect spawned for roles launched from this
//!   file, each with its leader's start time, so recovery kills exactly those and nothing
//!   else;
//! - `files.json`: the launch config the key stands for (for people and for the sweep
//!   that recovers every stale state).
//!
//! Older versions keyed one state by the sorted set of a target's launch configs (the
//! key of a one-file target is the same either way); such states are still found by
//! their `files.json`, recovered, and respected while a live bisect holds them.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::exit::Failure;

const LOCK_FILE: &str = "lock.json";
const PROCESSES_FILE: &str = "processes.json";
const FILES_FILE: &str = "files.json";
/// Held (flock) only for the moment of checking and taking or dropping `lock.json`, so
/// two processes that both find a stale lock cannot both take it over.
const MUTEX_FILE: &str = ".lock-mutex";

/// Serialises the check-and-take of `lock.json` between processes (and threads); the
/// kernel drops it if the holder dies.
fn lock_mutex(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<fs::File>> {
    let path = dir.join(MUTEX_FILE);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno)
        .with_context(|| format!("locking {}", path.display()))
}

/// Root of every target's state: `$XDG_STATE_HOME/bisect`, else `~/.local/state/bisect`.
pub fn state_root() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("bisect")
}

/// The launch configs by canonical path, sorted and without repeats.
pub(crate) fn canonical_files(files: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut canonical = Vec::with_capacity(files.len());
    for file in files {
        canonical.push(
            fs::canonicalize(file).with_context(|| format!("launch config {}", file.display()))?,
        );
    }
    canonical.sort();
    canonical.dedup();
    Ok(canonical)
}

/// Where the state directory keyed by the launch configs `canonical` (sorted) is,
/// created or not: one file's (see [`file_state_dir`]), or an older version's target.
pub(crate) fn state_path(root: &Path, canonical: &[PathBuf]) -> PathBuf {
    use std::hash::Hasher;
    use std::os::unix::ffi::OsStrExt;
    let mut hasher = fnv::FnvHasher::default();
    for path in canonical {
        hasher.write(path.as_os_str().as_bytes());
        hasher.write(&[0]);
    }
    root.join(format!("{:016x}", hasher.finish()))
}

/// The state directory of one launch config (its canonical path), created if needed.
pub(crate) fn file_state_dir(root: &Path, file: &Path) -> anyhow::Result<PathBuf> {
    state_dir(root, &[file.to_path_buf()])
}

/// The state directory keyed by the launch configs `canonical` (sorted), created if
/// needed.
pub fn state_dir(root: &Path, canonical: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let dir = state_path(root, canonical);
    fs::create_dir_all(&dir)
        .with_context(|| format!("creating state directory {}", dir.display()))?;
    let listing = dir.join(FILES_FILE);
    if !listing.exists() {
        let json = serde_json::to_vec_pretty(canonical)?;
        fs::write(&listing, json).with_context(|| format!("writing {}", listing.display()))?;
    }
    Ok(dir)
}

/// Start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), `None` when there is no such process.
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after
    // the last ')'. Field 3 is the state, so field 22 is the 20th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process group of `pid` (field 5 of `/proc/PID/stat`), if it exists.
pub(crate) fn process_group_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `pid` is still the process that started at `ticks`.
fn same_process(pid: u32, ticks: u64) -> bool {
    start_ticks(pid) == Some(ticks)
}

/// Who holds a target's lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub pid: u32,
    pub start_ticks: u64,
    pub cmdline: String,
    pub started_at: String,
}

impl Owner {
    fn me() -> Owner {
        let pid = std::process::id();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| {
                raw.split(|b| *b == 0)
                    .filter(|w| !w.is_empty())
                    .map(|w| String::from_utf8_lossy(w).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        Owner {
            pid,
            start_ticks: start_ticks(pid).unwrap_or(0),
            cmdline,
            started_at: chrono::Utc::now().to_rfc3339(),
        }
    }

    fn alive(&self) -> bool {
        same_process(self.pid, self.start_ticks)
    }
}

/// How to treat a lock this very process already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reentry {
    /// Share it (engine control inside a command whose editor holds the lock).
    Share,
    /// Take it over as if stale (an editor that this process left without restoring).
    TakeOver,
    /// Leave the state alone (the sweep must not touch a state this process works on).
    Skip,
}

/// A held lock; an owning guard removes the lock file when dropped.
#[derive(Debug)]
pub(crate) struct LockGuard {
    dir: PathBuf,
    owned: bool,
}

impl LockGuard {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this guard took the lock (rather than sharing one this process holds):
    /// whatever the state holds was left by someone else, and is to be recovered.
    pub fn owned(&self) -> bool {
        self.owned
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let path = self.dir.join(LOCK_FILE);
        let _mutex = lock_mutex(&self.dir);
        if read_owner(&path).is_some_and(|o| o.pid == std::process::id()) {
            let _ = fs::remove_file(&path);
        }
    }
}

fn read_owner(path: &Path) -> Option<Owner> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// The launch configs a state stands for (its `files.json`; empty when unreadable).
pub(crate) fn listed_files(dir: &Path) -> Vec<PathBuf> {
    fs::read(dir.join(FILES_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<PathBuf>>(&b).ok())
        .unwrap_or_default()
}

/// The lock could not be taken: `Ok(None)` from [`lock`] with [`Reentry::Skip`], or
/// this error (exit 3) when another live bisect holds it.
fn held_by(owner: &Owner, dir: &Path) -> anyhow::Error {
    let files = listed_files(dir);
    let named = match files.as_slice() {
        [one] => format!("the launch config {} is", one.display()),
        many => format!(
            "the launch configs {} are",
            many.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Failure::busy(
        format!(
            "{named} in use by another bisect (pid {}, started {}): {}",
            owner.pid, owner.started_at, owner.cmdline
        ),
        format!(
            "wait for it to finish, or stop it (Ctrl-C or kill restores its configs; after kill -9 the next bisect recovers them); state in {}",
            dir.display()
        ),
    )
    .into()
}

/// Takes the lock of the state in `dir`. Another live owner is refused (exit 3, with
/// its pid and command line); a stale one is taken over. `Ok(None)` only with
/// [`Reentry::Skip`] when this process holds it.
pub fn lock(dir: &Path, reentry: Reentry) -> anyhow::Result<Option<LockGuard>> {
    let path = dir.join(LOCK_FILE);
    let me = Owner::me();
    let json = serde_json::to_vec_pretty(&me)?;
    let _mutex = lock_mutex(dir)?;
    loop {
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(&json)
                    .and_then(|()| f.sync_all())
                    .with_context(|| format!("writing {}", path.display()))?;
                return Ok(Some(LockGuard {
                    dir: dir.to_path_buf(),
                    owned: true,
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
        match read_owner(&path) {
            Some(owner) if owner.pid == me.pid => match reentry {
                Reentry::Share => {
                    return Ok(Some(LockGuard {
                        dir: dir.to_path_buf(),
                        owned: false,
                    }))
                }
                Reentry::Skip => return Ok(None),
                Reentry::TakeOver => {}
            },
            Some(owner) if owner.alive() => return Err(held_by(&owner, dir)),
            // Dead, recycled pid, or a lock file cut short by a crash: stale.
            _ => {}
        }
        // Stale: remove it and create ours (under the mutex, so no other taker races).
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing stale {}", path.display())),
        }
    }
}

/// One process group bisect spawned for a role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnedGroup {
    pub role: String,
    /// Process group id = pid of its leader (`sh LAUNCH`).
    pub pgid: u32,
    /// The leader's start time, so a recycled pid is never killed.
    pub start_ticks: u64,
    /// The bisect process that spawned it.
    pub owner_pid: u32,
}

fn read_groups(dir: &Path) -> anyhow::Result<Vec<SpawnedGroup>> {
    let path = dir.join(PROCESSES_FILE);
    match fs::read(&path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn write_groups(dir: &Path, groups: &[SpawnedGroup]) -> anyhow::Result<()> {
    let path = dir.join(PROCESSES_FILE);
    if groups.is_empty() {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(()),
        };
    }
    let json = serde_json::to_vec_pretty(groups)?;
    super::atomic::write_atomic(&path, &json, 0o600)
        .with_context(|| format!("writing {}", path.display()))
}

/// Records a spawned group durably (call with the lock held).
pub(crate) fn record_group(dir: &Path, group: SpawnedGroup) -> anyhow::Result<()> {
    let mut groups = read_groups(dir)?;
    groups.retain(|g| g.pgid != group.pgid);
    groups.push(group);
    write_groups(dir, &groups)
}

/// Forgets a group that was stopped.
pub(crate) fn forget_group(dir: &Path, pgid: u32) -> anyhow::Result<()> {
    let mut groups = read_groups(dir)?;
    groups.retain(|g| g.pgid != pgid);
    write_groups(dir, &groups)
}

/// Whether a recorded group is still the one bisect spawned: its leader is the same
/// process (same start time), or the leader is gone but members of the group live on
/// (the kernel does not reuse a pid while a group still carries it as pgid).
fn still_ours(group: &SpawnedGroup) -> bool {
    use nix::sys::signal::killpg;
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(group.pgid) else {
        return false;
    };
    match start_ticks(group.pgid) {
        Some(ticks) => ticks == group.start_ticks,
        None => killpg(Pid::from_raw(raw), None).is_ok(),
    }
}

/// Kills (SIGKILL) every recorded group spawned by another bisect process that is
/// still the same group, and forgets them all. Call with the lock held. Returns the
/// groups killed.
pub(crate) fn kill_stale_groups(dir: &Path) -> anyhow::Result<Vec<SpawnedGroup>> {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    let me = std::process::id();
    let groups = read_groups(dir)?;
    let (mine, theirs): (Vec<_>, Vec<_>) = groups.into_iter().partition(|g| g.owner_pid == me);
    let mut killed = Vec::new();
    for group in theirs {
        if still_ours(&group) {
            if let Ok(raw) = i32::try_from(group.pgid) {
                let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
                killed.push(group);
            }
        }
    }
    write_groups(dir, &mine)?;
    Ok(killed)
}

/// Whether a state holds anything a dead owner may have left (a lock, a journal,
/// spawned groups). The sweep skips the others: locking a state another process is
/// just creating would make that process's lock attempt fail.
pub(crate) fn has_leftovers(dir: &Path) -> bool {
    [LOCK_FILE, PROCESSES_FILE, super::JOURNAL_FILE]
        .iter()
        .any(|f| dir.join(f).exists())
}

/// Every state directory under `root` (for the sweep that recovers stale ones).
pub(crate) fn all_state_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join(FILES_FILE).is_file())
        .collect();
    dirs.sort();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_of_this_process_is_stable_and_a_missing_pid_has_none() {
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert_eq!(start_ticks(me), start_ticks(me));
        assert_eq!(start_ticks(u32::MAX), None);
    }

    #[test]
    fn the_key_ignores_order_and_repeats() {
        let root = tempfile::tempdir().unwrap();
        let a = PathBuf::from("/a/prefill.sh");
        let b = PathBuf::from("/b/decode.sh");
        let one = state_dir(root.path(), &[a.clone(), b.clone()]).unwrap();
        let two = state_dir(root.path(), std::slice::from_ref(&a)).unwrap();
        assert_ne!(one, two);
        assert_eq!(state_dir(root.path(), &[a, b]).unwrap(), one);
        assert_eq!(all_state_dirs(root.path()).len(), 2);
    }

    #[test]
    fn a_live_owner_is_refused_a_dead_or_recycled_one_taken_over() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let live = Owner {
            pid: child.id(),
            start_ticks: start_ticks(child.id()).unwrap(),
            cmdline: "bisect run --flag X".into(),
            started_at: "then".into(),
        };
        let write = |o: &Owner| fs::write(dir.join(LOCK_FILE), serde_json::to_vec(o).unwrap());
        write(&live).unwrap();
        let err = lock(dir, Reentry::TakeOver).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(&format!("pid {}", child.id())), "{msg}");
        assert!(
            msg.contains("bisect run --flag X") && msg.contains("fix:"),
            "{msg}"
        );
        assert_eq!(
            crate::commands::code_for_error(&err),
            crate::exit::COULD_NOT_RUN
        );

        // The same pid with another start time is a recycled pid: stale.
        write(&Owner {
            start_ticks: live.start_ticks + 1,
            ..live.clone()
        })
        .unwrap();
        let guard = lock(dir, Reentry::TakeOver).unwrap().unwrap();
        assert_eq!(
            read_owner(&dir.join(LOCK_FILE)).unwrap().pid,
            std::process::id()
        );
        // This process shares or skips its own lock.
        assert!(!lock(dir, Reentry::Share).unwrap().unwrap().owned);
        assert!(lock(dir, Reentry::Skip).unwrap().is_none());
        drop(guard);
        assert!(!dir.join(LOCK_FILE).exists());

        child.kill().unwrap();
        child.wait().unwrap();
        write(&live).unwrap();
        assert!(
            lock(dir, Reentry::TakeOver).unwrap().is_some(),
            "dead owner"
        );
    }

    #[test]
    fn stale_groups_are_killed_only_while_they_are_the_same_processes() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let ticks = start_ticks(pgid).unwrap();
        let group = |start_ticks, owner_pid| SpawnedGroup {
            role: "solo".into(),
            pgid,
            start_ticks,
            owner_pid,
        };
        // Recorded by this process: never killed by recovery.
        record_group(dir, group(ticks, std::process::id())).unwrap();
        assert!(kill_stale_groups(dir).unwrap().is_empty());
        // Another start time: a recycled pid, left alone and forgotten.
        forget_group(dir, pgid).unwrap();
        record_group(dir, group(ticks + 1, u32::MAX)).unwrap();
        assert!(kill_stale_groups(dir).unwrap().is_empty());
        assert!(read_groups(dir).unwrap().is_empty());
        assert!(child.try_wait().unwrap().is_none());
        // The same process, spawned by a dead bisect: killed.
        record_group(dir, group(ticks, u32::MAX)).unwrap();
        assert_eq!(kill_stale_groups(dir).unwrap().len(), 1);
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(!dir.join(PROCESSES_FILE).exists());
    }
}
