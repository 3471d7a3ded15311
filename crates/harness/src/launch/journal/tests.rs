//! The journal against real files: edits, restores, recovery of a dead owner's
//! journal, and someone else's change kept.

use std::fs::Permissions;

use super::disk::temp_path;
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
        Setup::in_folder("")
    }
    /// The launch configs in `folder` of the temp dir (`""`: at its top).
    fn in_folder(folder: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join(folder)).unwrap();
        let mut roles = Vec::new();
        for (name, text, mode) in [("prefill", PREFILL, 0o755), ("decode", DECODE, 0o640)] {
            let path = dir.path().join(folder).join(format!("{name}.sh"));
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
    /// An editor over every launch config, BF16_INDEX_K set to 0 in all of them.
    fn edited(&self) -> Editor {
        let mut ed = self.begin(&self.files()).unwrap();
        ed.apply(&flag("BF16_INDEX_K"), "0", &self.roles).unwrap();
        ed
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
        let _ed = s.edited();
        assert_ne!(s.text(0), PREFILL);
    }
    s.assert_pristine();
    assert!(!s.any_state_has(JOURNAL_FILE));
}

#[test]
fn a_crashed_run_is_recovered_by_the_next_begin() {
    let s = Setup::new();
    let mut ed = s.edited();
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
fn a_journaled_config_whose_folder_is_gone_is_reported_and_not_recreated() {
    let s = Setup::in_folder("worktree");
    let mut ed = s.begin(&s.files()).unwrap();
    ed.apply(&flag("HICACHE"), "off", &s.roles).unwrap();
    // Killed, then its worktree removed (as a search's cleanup or `git worktree prune`).
    std::mem::forget(ed);
    s.orphan();
    fs::remove_dir_all(s.dir.path().join("worktree")).unwrap();
    let recovery = recover_at(&s.root(), &s.legacy()).unwrap();
    assert!(recovery.restored.is_empty());
    let mut gone = recovery.gone.clone();
    gone.sort();
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert!(
        !s.dir.path().join("worktree").exists(),
        "a removed folder is not recreated"
    );
    assert!(recovery
        .lines()
        .iter()
        .all(|l| l.contains("no longer exists")));
    // The journal is done with: the next command starts.
    assert!(recover_at(&s.root(), &s.legacy()).unwrap().gone.is_empty());
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
    std::mem::forget(s.edited());
    s.orphan();
    fs::write(s.state(0).join("original-0"), "truncated").unwrap();
    let err = s.recover().unwrap_err();
    assert_refused(&err, "damaged");
    assert!(
        s.state(0).join(JOURNAL_FILE).exists(),
        "the journal is kept for a manual fix"
    );
}

#[test]
fn a_journal_held_by_a_live_bisect_is_refused_and_a_dead_ones_recovered() {
    let s = Setup::new();
    std::mem::forget(s.edited());

    // A live process (pid and start time) holds the target's lock.
    let child = other_bisect();
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
    end(child);

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

/// The other bisect exits.
fn end(mut child: std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The other bisect exits, then the first editor restores: the files are as they were.
fn end_then_restore(child: std::process::Child, mut first: Editor, s: &Setup) {
    end(child);
    first.restore().unwrap();
    s.assert_pristine();
}

/// The error names what refused the edit.
fn assert_refused(err: &anyhow::Error, words: &str) {
    assert!(format!("{err:#}").contains(words), "{err:#}");
}

/// Issue: the lock was keyed by the set of files, so a target with decode.sh alone
/// and one with prefill.sh + decode.sh took different locks, and the second journaled
/// the first one's edit as decode.sh's original (then "restored" it, for good).
#[test]
fn an_overlapping_set_of_launch_configs_is_refused_naming_the_file_and_holder() {
    let s = Setup::new();
    let decode = fs::canonicalize(&s.roles[1].launch).unwrap();
    let child = other_bisect();
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

    end_then_restore(child, first, &s);
}

/// The other way round: the one-file target holds decode.sh; the two-file target is
/// refused there and does not keep prefill.sh's lock it took first.
#[test]
fn a_refused_editor_holds_none_of_the_files_it_took_before_the_refusal() {
    let s = Setup::new();
    let child = other_bisect();
    let mut first = s.begin(std::slice::from_ref(&s.roles[1].launch)).unwrap();
    first
        .apply(&flag("BF16_INDEX_K"), "0", &s.roles[1..])
        .unwrap();
    s.set_owner_at(1, child.id(), state::start_ticks(child.id()).unwrap());

    let err = s.begin(&s.files()).unwrap_err();
    assert_refused(&err, "in use by another bisect");
    assert!(
        !s.state(0).join("lock.json").exists(),
        "prefill.sh released"
    );
    assert!(!s.state(0).join(JOURNAL_FILE).exists());
    assert_eq!(s.text(0), PREFILL);

    end_then_restore(child, first, &s);
}

#[test]
fn a_probe_claim_is_refused_while_another_bisect_holds_one_of_its_files() {
    let s = Setup::new();
    let child = other_bisect();
    let ed = s.begin(&s.files()).unwrap();
    s.set_owner(child.id(), state::start_ticks(child.id()).unwrap());
    let err =
        super::super::lock_target(&s.root(), std::slice::from_ref(&s.roles[0].launch)).unwrap_err();
    assert_refused(&err, "in use by another bisect");
    end(child);
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
            Some(Failure::CouldNotRun(m)) if m.message.contains(&prefill.display().to_string())
                && m.message.contains("differ by more than the flag")
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
    let mut ed = s.edited();
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
