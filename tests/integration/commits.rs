//! `bisect commits` end to end on the embedded engine: the test builds a throwaway git
//! repository of the engine's launch scripts (64 commits after the good end, fp8 index-K
//! at the start; in one of them the bf16 index-K default is turned on, the seeds' change),
//! and the search checks each tested commit out into its own worktree, "builds" it (a
//! syntax check of the scripts), launches the engines from that worktree's scripts and
//! drives one block at the load. The race depends on how requests interleave, so the
//! assertions are the answer and wide bounds, never exact counts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bisect_harness::arm::TestbedOptions;
use bisect_harness::commands::commits::block::ControlFactory;
use bisect_harness::commands::commits::build::BuildStep;
use bisect_harness::commands::commits::range::{Find, RangeSpec};
use bisect_harness::commands::commits::slurm::Rounds;
use bisect_harness::commands::commits::{self, CommitsPlan};
use bisect_harness::commands::run::Quiet;
use bisect_harness::config::{embedded, FlagCatalog, FlagSpec, TargetProfile};
use bisect_harness::control::{EngineControl, ProcessControl};
use bisect_harness::core::evidence::Policy;
use tokio_util::sync::CancellationToken;

const COMMITS: usize = 64;
pub(crate) const BF16_OFF: &str = "export SGLANG_DSV4_BF16_INDEX_K=0\n";
pub(crate) const BF16_ON: &str = "export SGLANG_DSV4_BF16_INDEX_K=1\n";
const SYNC_OFF: &str = "export SGLANG_DSV4_INDEX_K_HICACHE_SYNC=0\n";
const SYNC_ON: &str = "export SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1\n";

pub(crate) fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Replaces `from` by `to` in both launch scripts.
fn edit_scripts(repo: &Path, edits: &[(&str, &str)]) {
    for script in ["prefill.sh", "decode.sh"] {
        let path = repo.join(script);
        let mut text = std::fs::read_to_string(&path).unwrap();
        for (from, to) in edits {
            text = text.replace(from, to);
        }
        std::fs::write(&path, text).unwrap();
    }
}

/// The repository and the embedded target launched from it: bf16 from the start when
/// `from_start`, turned on by commit `culprit` (1..=64) when given; every other commit
/// changes a notes file only. Returns the repository, the profile, and the commit ids
/// (index 0 the good end).
fn engine_repo(
    dir: &Path,
    culprit: Option<usize>,
    from_start: bool,
) -> (PathBuf, TargetProfile, Vec<String>) {
    let start: &[(&str, &str)] = if from_start {
        &[]
    } else {
        &[(BF16_ON, BF16_OFF)]
    };
    let change = culprit.map(|c| Change {
        commit: c,
        edits: &[(BF16_OFF, BF16_ON)],
        subject: "turn the bf16 index-K default on (needle recall)",
    });
    scripted_repo(dir, COMMITS, start, change)
}

/// The culprit's commit of a scripted repository: its edits to the launch scripts.
pub(crate) struct Change {
    pub(crate) commit: usize,
    pub(crate) edits: &'static [(&'static str, &'static str)],
    pub(crate) subject: &'static str,
}

/// The embedded engine's launch scripts with `start` applied at the good end, then
/// `commits` commits, `change` at its commit and notes-file changes elsewhere.
pub(crate) fn scripted_repo(
    dir: &Path,
    commits: usize,
    start: &[(&str, &str)],
    change: Option<Change>,
) -> (PathBuf, TargetProfile, Vec<String>) {
    let repo = dir.join("engine");
    std::fs::create_dir_all(&repo).unwrap();
    let target = embedded::profile(&repo, Path::new(env!("CARGO_BIN_EXE_bisect"))).unwrap();
    target.write_launch_scripts().unwrap();
    edit_scripts(&repo, start);
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("NOTES"), "notes\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &["commit", "-q", "-m", "good: the engine's launch scripts"],
    );
    let mut shas = vec![git(&repo, &["rev-parse", "HEAD"])];
    for i in 1..=commits {
        let subject = match &change {
            Some(c) if c.commit == i => {
                edit_scripts(&repo, c.edits);
                c.subject.to_string()
            }
            _ => {
                let mut notes = std::fs::read_to_string(repo.join("NOTES")).unwrap();
                notes += &format!("change {i}\n");
                std::fs::write(repo.join("NOTES"), notes).unwrap();
                format!("change {i}")
            }
        };
        git(&repo, &["commit", "-q", "-am", &subject]);
        shas.push(git(&repo, &["rev-parse", "HEAD"]));
    }
    (repo, target, shas)
}

fn plan(dir: &Path, repo: &Path, target: TargetProfile, concurrency: u32) -> CommitsPlan {
    let mut workload = bisect_harness::config::load_workload("agentic").unwrap();
    workload.concurrency = Some(concurrency);
    CommitsPlan {
        id: "test-commits".into(),
        command: "bisect commits".into(),
        range: RangeSpec::Git {
            repo: repo.to_path_buf(),
            good: "main~64".into(),
            bad: "main".into(),
        },
        find: Find::Break,
        build: BuildStep::Build("sh -n prefill.sh && sh -n decode.sh".into()),
        target,
        workload,
        policy: Policy::default(),
        max_sessions: commits::DEFAULT_MAX_SESSIONS,
        dir: dir.join("results/test-commits"),
        api_key: None,
        resume: false,
        flag: None,
        background: 0.02,
        pins: Vec::new(),
        testbed: TestbedOptions {
            journal_dir: dir.join("results/.bisect-journal"),
            state_root: Some(dir.join("state")),
            allow_partial: false,
            metrics_period: Duration::from_millis(100),
            reference_cache: Some(dir.join("results/reference-cache")),
        },
        parallel: 1,
        rounds: Rounds::Local,
        oracle: None,
    }
}

async fn search(plan: &CommitsPlan, state: &Path) -> commits::record::CommitsRecord {
    let state = state.to_path_buf();
    let controls: Box<ControlFactory<'_>> = Box::new(move |target, logs| {
        let control = ProcessControl::new(target, logs, None)?.with_state_root(&state);
        Ok(Box::new(control) as Box<dyn EngineControl>)
    });
    commits::run(plan, controls.as_ref(), &Quiet, CancellationToken::new())
        .await
        .unwrap()
}

/// The prefill launch script a block in `block` (`blocks/bNNN[-arm]`) started from.
fn launched_prefill(plan: &CommitsPlan, block: &str) -> String {
    let label = block.trim_start_matches("blocks/");
    let path = plan
        .dir
        .join(block)
        .join(format!("launch/{label}-r0/prefill--prefill.sh"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The search ended with `answer` (its name): its verdict line.
#[track_caller]
fn assert_answer(record: &commits::record::CommitsRecord, answer: &str) -> String {
    let verdict = record.verdict.clone().unwrap_or_default();
    assert_eq!(record.answer.map(|a| a.name()), Some(answer), "{verdict}");
    verdict
}

/// The search ended "could not reproduce" (exit 1) at `load` in flight.
#[track_caller]
fn assert_could_not_reproduce(record: &commits::record::CommitsRecord, load: u32) {
    let verdict = assert_answer(record, "could_not_reproduce");
    assert!(
        verdict.contains(&format!("at {load} in flight")),
        "{verdict}"
    );
    assert_eq!(commits::exit_code(record), 1);
}

/// The user's repository as it was: same HEAD, branch, clean tree, no worktree left.
pub(crate) fn assert_untouched(repo: &Path, head: &str) {
    assert_eq!(git(repo, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(repo, &["symbolic-ref", "--short", "HEAD"]), "main");
    assert_eq!(git(repo, &["status", "--porcelain"]), "");
    assert_eq!(git(repo, &["worktree", "list"]).lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn the_commit_that_turns_bf16_on_is_found_and_verified() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let (repo, target, shas) = engine_repo(dir.path(), Some(37), false);
    let plan = plan(dir.path(), &repo, target, 80);
    let record = search(&plan, &dir.path().join("state")).await;
    let verdict = assert_answer(&record, "culprit");
    let culprit = record.culprit.clone().unwrap();
    assert_eq!(culprit.sha, shas[37], "{verdict}");
    assert_eq!(
        culprit.subject,
        "turn the bf16 index-K default on (needle recall)"
    );
    assert_eq!(record.parent.as_ref().unwrap().sha, shas[36]);
    assert!(
        verdict.starts_with("commit 37 raises corruption from"),
        "{verdict}"
    );
    assert!(verdict.contains("at 80 in flight"), "{verdict}");
    assert!(!record.verification.is_empty());
    assert_eq!(commits::exit_code(&record), 0);
    // Far fewer blocks than commits; every block at the load, each in its own folder.
    assert!(record.steps.len() < 40, "{} steps", record.steps.len());
    for step in &record.steps {
        let d = plan.dir.join(step.dir.as_deref().unwrap());
        assert!(d.join("sessions.jsonl").is_file(), "{}", d.display());
    }
    // The engines ran the commit's own scripts: the culprit's block read bf16 on.
    let at_culprit = record.steps.iter().find(|s| s.commit == 37).unwrap();
    let launched = launched_prefill(&plan, at_culprit.dir.as_deref().unwrap());
    assert!(launched.contains(BF16_ON), "{launched}");
    for file in ["commits.json", "steps.jsonl", "summary.md", "report.html"] {
        assert!(plan.dir.join(file).is_file(), "{file}");
    }
    let html = std::fs::read_to_string(plan.dir.join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains(&shas[37][..12]));
    assert!(!plan.dir.join("worktrees").exists());
    assert_untouched(&repo, &shas[COMMITS]);

    // --resume replays every logged step and reaches the same answer, running nothing.
    let mut resumed = plan.clone();
    resumed.resume = true;
    let again = search(&resumed, &dir.path().join("state")).await;
    assert_eq!(again.replayed_steps, record.steps.len());
    assert_eq!(again.answer, record.answer);
    assert_eq!(again.culprit.unwrap().sha, shas[37]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn a_range_without_the_change_has_no_culprit() {
    let _one = crate::common::heavy();
    // bf16 on from the good end on: both ends corrupt alike. Ruling out a rise of 5
    // points at a 16% rate takes about 1200 sessions per end; this test asks whether the
    // range raises corruption by 15 points (the seeds' effect), which 3-6 blocks per end
    // settle.
    let dir = tempfile::tempdir().unwrap();
    let (repo, target, shas) = engine_repo(dir.path(), None, true);
    let mut plan = plan(dir.path(), &repo, target, 80);
    plan.policy.min_effect = 0.15;
    let record = search(&plan, &dir.path().join("state")).await;
    let verdict = assert_answer(&record, "no_culprit");
    assert!(
        verdict.starts_with("no culprit: the ends do not differ at 80 in flight"),
        "{verdict}"
    );
    assert!(record
        .steps
        .iter()
        .all(|s| s.commit == 0 || s.commit == COMMITS));
    assert_eq!(commits::exit_code(&record), 1);
    assert_untouched(&repo, &shas[COMMITS]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn at_8_in_flight_the_bad_end_does_not_reproduce() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let (repo, target, shas) = engine_repo(dir.path(), Some(37), false);
    let mut plan = plan(dir.path(), &repo, target, 8);
    plan.workload.sessions = 40;
    let record = search(&plan, &dir.path().join("state")).await;
    assert_could_not_reproduce(&record, 8);
    assert_untouched(&repo, &shas[COMMITS]);
}

/// The flag catalog's entry `name`.
fn flag(name: &str) -> FlagSpec {
    FlagCatalog::load(&[]).unwrap().get(name).unwrap().clone()
}

/// Commits after the good end in the `--flag` test, and the one that drops the sync.
const FLAG_COMMITS: usize = 16;
const DROP_SYNC: usize = 11;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn with_a_flag_the_commit_since_which_bf16_corrupts_is_found() {
    let _one = crate::common::heavy();
    // The seeds' case: bf16 index-K is safe while readers wait for the HiCache index-K
    // load-back (the sync, on at the good end); commit 11 drops the sync. Every step runs
    // BF16_INDEX_K on and off at the commit; the on arm corrupts from commit 11 on, the
    // off arm (fp8) stays near zero everywhere.
    let dir = tempfile::tempdir().unwrap();
    let change = Change {
        commit: DROP_SYNC,
        edits: &[(SYNC_ON, SYNC_OFF)],
        subject: "drop the index-K HiCache sync (prefill latency)",
    };
    let (repo, target, shas) = scripted_repo(
        dir.path(),
        FLAG_COMMITS,
        &[(SYNC_OFF, SYNC_ON)],
        Some(change),
    );
    let mut plan = plan(dir.path(), &repo, target, 80);
    if let RangeSpec::Git { good, .. } = &mut plan.range {
        *good = format!("main~{FLAG_COMMITS}");
    }
    plan.flag = Some(flag("BF16_INDEX_K"));
    let record = search(&plan, &dir.path().join("state")).await;
    let verdict = assert_answer(&record, "culprit");
    assert_eq!(
        record.culprit.as_ref().unwrap().sha,
        shas[DROP_SYNC],
        "{verdict}"
    );
    assert_eq!(record.parent.as_ref().unwrap().sha, shas[DROP_SYNC - 1]);
    assert!(
        verdict.starts_with("commit 11 raises corruption with BF16_INDEX_K on from"),
        "{verdict}"
    );
    assert!(verdict.contains("; BF16_INDEX_K off there "), "{verdict}");
    assert!(verdict.contains(", clean: below the on arm's"), "{verdict}");
    assert_eq!(commits::exit_code(&record), 0);
    assert_eq!(record.flag.as_ref().unwrap().name, "BF16_INDEX_K");
    assert!(record.off_at_culprit.unwrap().judged > 0);
    assert!(record.steps.len() < 30, "{} steps", record.steps.len());
    // Both arms per step, on first, each block in its own folder with the arm's value
    // in the launch configs it started from.
    for step in &record.steps {
        assert!(step.dir.is_none() && !step.arms.is_empty(), "{step:?}");
        for (arm, expected) in step.arms.iter().zip([("on", "1"), ("off", "0")]) {
            assert_eq!((arm.arm.as_str(), arm.value.as_str()), expected);
            assert!(plan.dir.join(&arm.dir).join("sessions.jsonl").is_file());
        }
    }
    let at_culprit = record
        .steps
        .iter()
        .find(|s| s.commit == DROP_SYNC && s.arms.len() == 2)
        .unwrap();
    let on = launched_prefill(&plan, &at_culprit.arms[0].dir);
    assert!(on.contains(BF16_ON) && on.contains(SYNC_OFF), "{on}");
    assert!(launched_prefill(&plan, &at_culprit.arms[1].dir).contains(BF16_OFF));
    assert!(!plan.dir.join("worktrees").exists());
    assert_untouched(&repo, &shas[FLAG_COMMITS]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn a_pin_reaches_every_commit_and_resume_refuses_another() {
    let _one = crate::common::heavy();
    // The range of the first test (commit 37 turns bf16 on), with the fix pinned in every
    // block: the bad end runs bf16 with the sync and does not reproduce.
    let dir = tempfile::tempdir().unwrap();
    let (repo, target, shas) = engine_repo(dir.path(), Some(37), false);
    let mut plan = plan(dir.path(), &repo, target, 80);
    plan.pins = vec![bisect_harness::config::Pin::new(
        flag("INDEX_K_HICACHE_SYNC"),
        "1",
    )];
    let record = search(&plan, &dir.path().join("state")).await;
    assert_could_not_reproduce(&record, 80);
    assert_eq!(record.pinned, ["INDEX_K_HICACHE_SYNC=1"]);
    let header = std::fs::read_to_string(plan.dir.join("steps.jsonl")).unwrap();
    assert!(
        header
            .lines()
            .next()
            .unwrap()
            .contains("\"pinned\":[\"INDEX_K_HICACHE_SYNC=1\"]"),
        "{header}"
    );
    let first = &record.steps[0];
    assert_eq!(first.commit, COMMITS);
    let launched = launched_prefill(&plan, "blocks/b001");
    assert!(
        launched.contains(BF16_ON) && launched.contains(SYNC_ON),
        "{launched}"
    );
    assert_untouched(&repo, &shas[COMMITS]);

    // Resuming without the pin is another search: refused before anything runs.
    let mut resumed = plan.clone();
    resumed.resume = true;
    resumed.pins.clear();
    let controls: Box<ControlFactory<'_>> = Box::new(|target, logs| {
        Ok(Box::new(ProcessControl::new(target, logs, None)?) as Box<dyn EngineControl>)
    });
    let err = commits::run(
        &resumed,
        controls.as_ref(),
        &Quiet,
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert_eq!(bisect_harness::commands::code_for_error(&err), 2, "{err:#}");
    assert!(
        format!("{err:#}").contains("differs from this one"),
        "{err:#}"
    );
}

/// Runs `bisect ARGS` in `dir`; (exit code, stdout, stderr).
fn cli(args: &[&str], dir: &Path) -> (Option<i32>, String, String) {
    let out = crate::common::bisect(args, dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Runs `bisect ARGS` in `dir`, which must refuse it as a bad request (exit 2): its
/// stderr.
#[track_caller]
fn refused(args: &[&str], dir: &Path) -> String {
    let (code, _, err) = cli(args, dir);
    assert_eq!(code, Some(2), "{err}");
    err
}

#[test]
fn bad_requests_exit_2_with_the_fix_and_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let err = refused(
        &["commits", "--repo", "nowhere", "a", "b", "--build", "true"],
        d,
    );
    assert!(
        err.contains("--repo nowhere: not a git repository"),
        "{err}"
    );
    // Neither --build nor --artifact.
    refused(&["commits", "--repo", ".", "a", "b"], d);
    // --background belongs to --flag; a pin names a catalog flag, not the flag under test.
    let err = refused(
        &[
            "commits",
            "--repo",
            ".",
            "a",
            "b",
            "--build",
            "true",
            "--background",
            "0.1",
        ],
        d,
    );
    assert!(err.contains("--flag"), "{err}");
    // The ends swapped: refused before anything is checked out or started.
    let repo = d.join("r");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    for i in 0..3 {
        std::fs::write(repo.join("f"), format!("{i}\n")).unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", &format!("c{i}")]);
    }
    let r = repo.to_str().unwrap();
    // The embedded engine's own launch scripts are not in the repository: no commit
    // would ever run.
    let err = refused(
        &["commits", "--repo", r, "main~2", "main", "--build", "true"],
        d,
    );
    assert!(
        err.contains("every commit would be measured on the same engine"),
        "{err}"
    );
    let err = refused(
        &[
            "commits",
            "--repo",
            r,
            "main",
            "main~2",
            "--artifact",
            "true",
        ],
        d,
    );
    assert!(err.contains("is not an ancestor of the bad end"), "{err}");
    let err = refused(
        &["commits", "--repo", r, "nope", "main", "--artifact", "true"],
        d,
    );
    assert!(err.contains("\"nope\" is not a commit"), "{err}");
    let err = refused(
        &[
            "commits",
            "--repo",
            r,
            "main~2",
            "main",
            "--artifact",
            "true",
            "--flag",
            "BF16_INDEX_K",
            "--set",
            "BF16_INDEX_K=0",
        ],
        d,
    );
    assert!(err.contains("BF16_INDEX_K is the flag under test"), "{err}");
    assert_eq!(git(&repo, &["worktree", "list"]).lines().count(), 1);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    // Releases: two or more plain names, made runnable by --artifact, never --build.
    let err = refused(&["commits", "--releases", "0.3.8", "--artifact", "true"], d);
    assert!(err.contains("two releases or more"), "{err}");
    let err = refused(
        &[
            "commits",
            "--releases",
            "0.3.8,0.3.9 x",
            "--artifact",
            "true",
        ],
        d,
    );
    assert!(err.contains("not a plain name"), "{err}");
    let err = refused(
        &["commits", "--releases", "0.3.8,0.3.9", "--build", "true"],
        d,
    );
    assert!(err.contains("--artifact"), "{err}");
    let err = refused(
        &[
            "commits",
            "--releases",
            "0.3.8,0.3.9",
            "--repo",
            r,
            "--artifact",
            "true",
        ],
        d,
    );
    assert!(err.contains("--repo"), "{err}");
}

/// Releases r1..=r6 of the embedded engine's launch scripts, `releases/<name>/` under
/// `dir`: bf16 index-K on (the needle-recall race) in r1..=r3, off from r4 on.
fn scripted_releases(dir: &Path, scripts: &Path) -> Vec<String> {
    let names: Vec<String> = (1..=6).map(|i| format!("r{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let release = dir.join("releases").join(name);
        std::fs::create_dir_all(&release).unwrap();
        for script in ["prefill.sh", "decode.sh"] {
            let text = std::fs::read_to_string(scripts.join(script)).unwrap();
            let text = if i < 3 {
                text.replace(BF16_OFF, BF16_ON)
            } else {
                text.replace(BF16_ON, BF16_OFF)
            };
            std::fs::write(release.join(script), text).unwrap();
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn the_release_that_fixed_it_is_found_with_find_fix() {
    let _one = crate::common::heavy();
    // mozregression's find-fix: releases oldest first, the old ones corrupt, a later one
    // stopped. The artifact "installs" a release by copying its scripts to where the
    // target's roles launch from (as a pip install replaces the engine).
    let dir = tempfile::tempdir().unwrap();
    let engine = dir.path().join("engine");
    std::fs::create_dir_all(&engine).unwrap();
    let target = embedded::profile(&engine, Path::new(env!("CARGO_BIN_EXE_bisect"))).unwrap();
    target.write_launch_scripts().unwrap();
    let names = scripted_releases(dir.path(), &engine);
    let mut plan = plan(dir.path(), &engine, target, 80);
    plan.range = RangeSpec::Releases(names.clone());
    plan.find = Find::Fix;
    plan.build = BuildStep::Artifact(format!(
        "cp {0}/releases/{{release}}/prefill.sh {0}/releases/{{release}}/decode.sh {1}/ && echo {{release}} >> {0}/installs.txt",
        dir.path().display(),
        engine.display()
    ));
    let record = search(&plan, &dir.path().join("state")).await;
    let verdict = assert_answer(&record, "culprit");
    assert!(record.releases);
    // Newest first: the fixed end is the search's good end.
    let order: Vec<&str> = record.commits.iter().map(|c| c.sha.as_str()).collect();
    assert_eq!(order, ["r6", "r5", "r4", "r3", "r2", "r1"]);
    assert_eq!(record.first_fixed.as_ref().unwrap().sha, "r4", "{verdict}");
    assert!(
        verdict.starts_with("release r4 is the first fixed, release r3 the last that corrupts; in the search's numbering (newest first): commit 3 raises corruption"),
        "{verdict}"
    );
    assert_eq!(record.culprit.as_ref().unwrap().sha, "r3", "{verdict}");
    assert_eq!(commits::exit_code(&record), 0);
    // Every tested release was installed before its block, and its block ran its scripts.
    let installs = std::fs::read_to_string(dir.path().join("installs.txt")).unwrap();
    for step in &record.steps {
        assert!(installs.lines().any(|l| l == step.sha), "{installs}");
        let launched = launched_prefill(&plan, step.dir.as_deref().unwrap());
        let broken = ["r1", "r2", "r3"].contains(&step.sha.as_str());
        assert_eq!(
            launched.contains(BF16_ON),
            broken,
            "{}: {launched}",
            step.sha
        );
    }
    let summary = std::fs::read_to_string(plan.dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("First fixed: `r4` release r4 (number 2); the last that corrupts: `r3` release r3 (number 3)"),
        "{summary}"
    );
    assert!(
        summary.contains("Releases: 5 before r6 back to r1, searched for the first without"),
        "{summary}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plan.dir.join("commits.json")).unwrap()).unwrap();
    assert_eq!(json["find"], "fix");
    assert_eq!(json["first_fixed"]["sha"], "r4");
    assert!(!plan.dir.join("worktrees").exists());
}

#[test]
fn simulate_prints_the_benchmark_table() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = cli(
        &["commits", "--simulate", "--searches", "5", "--sizes", "16"],
        dir.path(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("### 16 commits"), "{out}");
    for method in [
        "commit search",
        "plain bisection",
        "bisection, 3 blocks per probe",
    ] {
        assert!(out.contains(method), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_build_removes_the_worktrees() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, target, shas) = engine_repo(dir.path(), Some(37), false);
    let mut plan = plan(dir.path(), &repo, target, 80);
    plan.build = BuildStep::Build("sleep 30".into());
    let cancel = CancellationToken::new();
    let later = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        later.cancel();
    });
    let controls: Box<ControlFactory<'_>> = Box::new(|target, logs| {
        Ok(Box::new(ProcessControl::new(target, logs, None)?) as Box<dyn EngineControl>)
    });
    let started = std::time::Instant::now();
    let err = commits::run(&plan, controls.as_ref(), &Quiet, cancel)
        .await
        .unwrap_err();
    assert_eq!(
        bisect_harness::commands::code_for_error(&err),
        130,
        "{err:#}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the build was not killed"
    );
    assert!(!plan.dir.join("worktrees").exists());
    assert_untouched(&repo, &shas[COMMITS]);
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan.dir.join("commits.json")).unwrap())
            .unwrap();
    assert_eq!(record["status"], "interrupted", "{record}");
}

/// `commits --oracle solo`: every block runs its sessions alone first, on the commit's
/// own build, and the search still finds the commit that turns bf16 on, with arguments
/// checked against the schema only (the oracle sees the wrong values the classifier
/// passes). Each commit's launch configs are its own cache entry: no block is judged
/// against another commit's reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole heavy tests (common::heavy), not tasks within one.
#[allow(clippy::await_holding_lock)]
async fn the_solo_oracle_judges_every_commit_block_against_itself_alone() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let change = Change {
        commit: 5,
        edits: &[(BF16_OFF, BF16_ON)],
        subject: "turn the bf16 index-K default on",
    };
    let (repo, target, shas) = scripted_repo(dir.path(), 8, &[(BF16_ON, BF16_OFF)], Some(change));
    let mut plan = plan(dir.path(), &repo, target, 80);
    plan.range = RangeSpec::Git {
        repo: repo.clone(),
        good: "main~8".into(),
        bad: "main".into(),
    };
    plan.workload.check_args = bisect_harness::config::CheckArgs::Schema;
    plan.oracle = Some(bisect_harness::core::solo::SoloOracle {
        threshold: bisect_harness::core::solo::DEFAULT_THRESHOLD,
    });
    let record = search(&plan, &dir.path().join("state")).await;
    let verdict = record.verdict.clone().unwrap_or_default();
    assert_eq!(
        record.culprit.map(|c| c.sha),
        Some(shas[5].clone()),
        "{verdict}"
    );
    let mut judged = 0;
    let mut diverged = 0;
    for block in std::fs::read_dir(plan.dir.join("blocks")).unwrap() {
        let block = block.unwrap().path();
        let label = block.file_name().unwrap().to_string_lossy().to_string();
        let alone = block.join("reference").join(&label).join("sessions.jsonl");
        assert!(alone.exists(), "{}: no reference", block.display());
        let sessions = std::fs::read_to_string(block.join("sessions.jsonl")).unwrap();
        judged += sessions
            .lines()
            .filter(|l| l.contains("\"oracle\":"))
            .count();
        diverged += sessions
            .lines()
            .filter(|l| l.contains("\"class\":\"diverged\""))
            .count();
    }
    assert!(
        judged >= 80,
        "{judged} sessions judged against themselves alone"
    );
    assert!(diverged >= 1, "no diverged session in any bf16 block");
    let entries = std::fs::read_dir(dir.path().join("results/reference-cache"))
        .unwrap()
        .count();
    assert!(
        entries >= 2,
        "{entries}: one entry per commit's configuration"
    );
}
