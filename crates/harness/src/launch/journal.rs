//! Edits launch configs on disk so that they are always undone: a journal of the
//! originals is written durably before the first edit, every write is atomic
//! (temp file + fsync + rename, permissions kept), and a journal left by a dead
//! process is recovered on the next start or by `bisect restore`.
//!
//! The journal lives in the target's state directory (`state.rs`, keyed by the launch
//! configs, not by `--results`), under the target's lock: `journal.json` ({pid,
//! started_at, files: [{path, copy, mode, len, crc32}]}) and one `original-N` copy per
//! file. The journal names the launch configs by canonical path, so a symlinked config
//! is restored where it lives. Taking the lock replays a journal and kills the engines
//! a dead bisect left (`processes.json`). Journals that older versions left in
//! `<results>/.bisect-journal` are still recovered from there.
use std::collections::BTreeMap;
use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::config::{FlagSpec, RoleSpec};

use super::state::{self, LockGuard, Reentry, SpawnedGroup};
use super::{read_setting, write_setting, LaunchError};

/// Name of the journal file inside the journal directory.
pub const JOURNAL_FILE: &str = "journal.json";
const COPY_PREFIX: &str = "original-";

#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    pid: u32,
    started_at: String,
    files: Vec<JournalEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct JournalEntry {
    path: PathBuf,
    /// File name of the byte-for-byte copy, beside the journal.
    copy: String,
    mode: u32,
    len: u64,
    crc32: u32,
}

/// One launch config as it was before the first edit.
#[derive(Debug)]
struct Original {
    path: PathBuf,
    bytes: Vec<u8>,
    mode: u32,
}

/// Holds the journal for a set of launch configs: [`Editor::apply`] edits them,
/// [`Editor::restore`] (or dropping the editor) puts every original back.
#[derive(Debug)]
pub struct Editor {
    dir: PathBuf,
    originals: Vec<Original>,
    restored: bool,
    recovered: Vec<PathBuf>,
    killed: Vec<SpawnedGroup>,
    /// The target's lock, released once the originals are back.
    lock: Option<LockGuard>,
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

/// What recovery found and undid.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Launch configs restored from a journal.
    pub restored: Vec<PathBuf>,
    /// Process groups of a dead bisect that were killed.
    pub killed: Vec<SpawnedGroup>,
}

/// Writes every original recorded in the journal in `dir` back byte-for-byte with its
/// permissions, and removes the journal. The caller holds the lock (or the legacy
/// journal's holder is gone).
fn replay(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let journal_path = dir.join(JOURNAL_FILE);
    let bytes = match fs::read(&journal_path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", journal_path.display())),
    };
    let journal: Journal = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a bisect journal; restore the launch configs from the original-* copies beside it by hand, then delete it",
            journal_path.display()
        )
    })?;
    let mut restored = Vec::new();
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
        put_back(&entry.path, &original, entry.mode)?;
        let _ = fs::remove_file(temp_path(&entry.path));
        restored.push(entry.path.clone());
    }
    fs::remove_file(&journal_path)
        .with_context(|| format!("removing {}", journal_path.display()))?;
    remove_copies(dir).with_context(|| format!("removing saved originals in {}", dir.display()))?;
    sync_dir(dir);
    Ok(restored)
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
fn recover_legacy(legacy_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
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

/// Takes the lock of every target state under `root` that no live process holds,
/// kills the engines its dead owner left and replays its journal. States held by a
/// live bisect (this one included) are left alone.
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
            Err(e) if e.downcast_ref::<crate::exit::Failure>().is_some() => continue,
            Err(e) => return Err(e),
        };
        recovery
            .killed
            .extend(state::kill_stale_groups(guard.dir())?);
        recovery.restored.extend(replay(guard.dir())?);
        drop(guard);
    }
    Ok(recovery)
}

/// Recovers what dead bisect processes left: the legacy journal in `legacy_dir`, then
/// every target state under `root` (see [`recover`]).
pub fn recover_at(root: &Path, legacy_dir: &Path) -> anyhow::Result<Recovery> {
    let legacy = recover_legacy(legacy_dir)?;
    let mut recovery = sweep(root)?;
    recovery.restored.splice(0..0, legacy);
    Ok(recovery)
}

/// Recovers after a bisect that died (kill -9, crash): kills the engines it spawned and
/// restores every launch config it left edited, byte-for-byte with permissions, for
/// every target whose lock no live bisect holds, plus a journal an older version left in
/// `legacy_dir` (`<results>/.bisect-journal`). Returns the restored files.
pub fn recover(legacy_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(recover_at(&state::state_root(), legacy_dir)?.restored)
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

impl Editor {
    /// Takes the target's lock (refused while another live bisect holds it), recovers
    /// what a dead bisect left on this target (its engines killed, its journal
    /// replayed, see [`Editor::recovered`]) and a legacy journal in `journal_dir`
    /// (the results root's `.bisect-journal`), checks that every launch config can be
    /// written, then saves `files` and writes the journal durably, before any edit.
    pub fn begin(journal_dir: &Path, files: &[PathBuf]) -> anyhow::Result<Editor> {
        Editor::begin_at(&state::state_root(), journal_dir, files)
    }

    /// [`Editor::begin`] with the state under `root` instead of `$XDG_STATE_HOME/bisect`.
    pub fn begin_at(root: &Path, legacy_dir: &Path, files: &[PathBuf]) -> anyhow::Result<Editor> {
        let canonical = state::canonical_files(files)?;
        let dir = state::state_dir(root, &canonical)?;
        let lock = state::lock(&dir, Reentry::TakeOver)?;
        let killed = state::kill_stale_groups(&dir)?;
        let mut recovered = replay(&dir)?;
        recovered.extend(recover_legacy(legacy_dir)?);
        for path in &recovered {
            tracing::warn!(
                "restored {} from the journal of an earlier bisect that did not finish",
                path.display()
            );
        }
        remove_copies(&dir).with_context(|| format!("cleaning {}", dir.display()))?;

        let mut originals: Vec<Original> = Vec::new();
        for file in files {
            let path = fs::canonicalize(file)
                .with_context(|| format!("launch config {}", file.display()))?;
            if originals.iter().any(|o| o.path == path) {
                continue;
            }
            let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let mode = fs::metadata(&path)
                .with_context(|| format!("reading permissions of {}", path.display()))?
                .permissions()
                .mode();
            check_writable(&path, mode)?;
            originals.push(Original { path, bytes, mode });
        }

        let mut entries = Vec::with_capacity(originals.len());
        for (i, o) in originals.iter().enumerate() {
            let copy = format!("{COPY_PREFIX}{i}");
            let copy_path = dir.join(&copy);
            write_atomic(&copy_path, &o.bytes, 0o600).with_context(|| {
                format!(
                    "saving the original of {} to {}",
                    o.path.display(),
                    copy_path.display()
                )
            })?;
            entries.push(JournalEntry {
                path: o.path.clone(),
                copy,
                mode: o.mode,
                len: o.bytes.len() as u64,
                crc32: crc32fast::hash(&o.bytes),
            });
        }
        let journal = Journal {
            pid: std::process::id(),
            started_at: chrono::Utc::now().to_rfc3339(),
            files: entries,
        };
        let journal_path = dir.join(JOURNAL_FILE);
        let json = serde_json::to_vec_pretty(&journal).context("encoding the journal")?;
        write_atomic(&journal_path, &json, 0o600)
            .with_context(|| format!("writing {}", journal_path.display()))?;

        Ok(Editor {
            dir,
            originals,
            restored: false,
            recovered,
            killed,
            lock,
        })
    }

    /// The target's state directory (journal, lock, spawned process groups).
    pub fn state_dir(&self) -> &Path {
        &self.dir
    }

    /// Process groups of a dead bisect that [`Editor::begin`] killed.
    pub fn killed(&self) -> &[SpawnedGroup] {
        &self.killed
    }

    /// Files a stale journal held and [`Editor::begin`] restored.
    pub fn recovered(&self) -> &[PathBuf] {
        &self.recovered
    }

    /// The journaled launch configs (canonical paths).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.originals.iter().map(|o| o.path.as_path())
    }

    /// Writes `value` for `flag` into the launch config of every role in `roles` that
    /// the flag lists, then reads each back; returns {role: value read back}. Every
    /// error comes before the caller restarts anything. Call
    /// [`super::check_partial`] first unless `--allow-partial` was given.
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
            let original = self.originals.iter().find(|o| o.path == path).ok_or_else(|| {
                anyhow!(
                    "launch config {} of role {} is not journaled; pass every launch config to Editor::begin",
                    role.launch.display(),
                    role.name
                )
            })?;
            resolved.push((role, path, original.mode));
        }

        for (i, (role, path, mode)) in resolved.iter().enumerate() {
            if i > 0 {
                crate::fault::pause("editing");
            }
            let text = fs::read_to_string(path)
                .with_context(|| format!("reading launch config {}", path.display()))?;
            let edited = write_setting(&text, flag, value, &role.launch)?;
            if edited != text {
                write_atomic(path, edited.as_bytes(), *mode)
                    .with_context(|| format!("writing launch config {}", path.display()))?;
            }
        }

        let mut readback = BTreeMap::new();
        for (role, path, _) in &resolved {
            let text = fs::read_to_string(path)
                .with_context(|| format!("reading back launch config {}", path.display()))?;
            let got = verify_readback(&role.name, &role.launch, &text, flag, value)?;
            readback.insert(role.name.clone(), got);
        }
        Ok(readback)
    }

    /// Puts every original back byte-for-byte (with its permissions) and removes the
    /// journal. On failure the journal stays, so `bisect restore` can finish the job.
    pub fn restore(&mut self) -> anyhow::Result<()> {
        if self.restored {
            return Ok(());
        }
        for o in &self.originals {
            put_back(&o.path, &o.bytes, o.mode)?;
        }
        let journal_path = self.dir.join(JOURNAL_FILE);
        match fs::remove_file(&journal_path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("removing {}", journal_path.display()))
            }
        }
        remove_copies(&self.dir)
            .with_context(|| format!("removing saved originals in {}", self.dir.display()))?;
        sync_dir(&self.dir);
        self.restored = true;
        self.lock = None;
        Ok(())
    }
}

impl Drop for Editor {
    fn drop(&mut self) {
        if !self.restored {
            if let Err(e) = self.restore() {
                tracing::error!(
                    "could not restore the launch configs: {e:#}; run `bisect restore` (journal in {})",
                    self.dir.display()
                );
            }
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
        /// The target's state directory, where the journal lives.
        fn journal(&self) -> PathBuf {
            state::state_dir(
                &self.root(),
                &state::canonical_files(&self.files()).unwrap(),
            )
            .unwrap()
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
        fn set_owner(&self, pid: u32, start_ticks: u64) {
            let owner = state::Owner {
                pid,
                start_ticks,
                cmdline: "bisect run".into(),
                started_at: "earlier".into(),
            };
            fs::write(
                self.journal().join("lock.json"),
                serde_json::to_vec(&owner).unwrap(),
            )
            .unwrap();
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
        assert!(s.journal().join(JOURNAL_FILE).is_file());
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
        assert!(!s.journal().join(JOURNAL_FILE).exists());
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
        assert!(!s.journal().join(JOURNAL_FILE).exists());
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
        let leftovers: Vec<_> = fs::read_dir(s.journal())
            .unwrap()
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
        fs::write(s.journal().join("original-0"), "truncated").unwrap();
        let err = s.recover().unwrap_err();
        assert!(format!("{err:#}").contains("damaged"), "{err:#}");
        assert!(
            s.journal().join(JOURNAL_FILE).exists(),
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
        assert!(!s.journal().join("lock.json").exists(), "lock released");
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
        assert!(!s.journal().join(JOURNAL_FILE).exists());
        assert!(!s.journal().join("lock.json").exists(), "lock released");
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
