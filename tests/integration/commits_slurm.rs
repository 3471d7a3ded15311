//! `bisect commits --parallel K` through the binary, its rounds submitted to stand-ins
//! for `sbatch`, `squeue` and `scancel` on PATH: the stand-in `sbatch` runs the array's
//! tasks one after another (each the job script the search wrote, with
//! `SLURM_ARRAY_TASK_ID` set, its output where `--output` says), logs its arguments, and
//! prints a job id; `squeue` then lists nothing. The real scheduler is proven by
//! scripts/slurm-ci.sh in CI; this proves the search's side of it on every `cargo test`:
//! the rounds, the job scripts, the tasks' steps collected in order, the answer.

use std::path::{Path, PathBuf};
use std::process::Command;

use bisect_harness::config::TargetProfile;

use crate::commits::{assert_untouched, git, scripted_repo, Change, BF16_OFF, BF16_ON};

/// Commits after the good end, and the one that turns bf16 index-K on.
const COMMITS: usize = 16;
const CULPRIT: usize = 11;

const SBATCH: &str = r#"#!/bin/sh
# Stand-in sbatch: runs the array's tasks here, one after another; prints a job id.
echo "$@" >> "$FAKE_SLURM_LOG"
array=""; out=""; chdir="."; script=""
for a in "$@"; do
  case "$a" in
    --array=*) array=${a#--array=} ;;
    --output=*) out=${a#--output=} ;;
    --chdir=*) chdir=${a#--chdir=} ;;
    --fail-task=*) fail=${a#--fail-task=} ;;
    -*) ;;
    *) script=$a ;;
  esac
done
job=$(( $(wc -l < "$FAKE_SLURM_LOG") + 100 ))
i=0
while [ "$i" -le "${array#0-}" ]; do
  log=$(printf '%s' "$out" | sed "s/%a/$i/")
  if [ "$i" = "${fail:-}" ]; then
    echo "slurmstepd: error: *** JOB $job ON node CANCELLED DUE TO NODE FAILURE ***" > "$log"
  else
    (cd "$chdir" && SLURM_ARRAY_JOB_ID=$job SLURM_ARRAY_TASK_ID=$i sh "$script") > "$log" 2>&1
  fi
  i=$((i + 1))
done
echo "$job"
"#;

/// A folder with the stand-ins, to put first on PATH.
fn fake_slurm(dir: &Path) -> PathBuf {
    let bin = dir.join("fake-slurm");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, text) in [
        ("sbatch", SBATCH),
        ("squeue", "#!/bin/sh\nexit 0\n"),
        ("scancel", "#!/bin/sh\nexit 0\n"),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&path)
            .status()
            .unwrap();
    }
    bin
}

/// `bisect ARGS` in `d` with the stand-ins first on PATH, its state in `d`.
fn bisect_on_fake_slurm(d: &Path, args: &[String]) -> std::process::Output {
    let bin = fake_slurm(d);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args)
        .env("PATH", path)
        .env("FAKE_SLURM_LOG", d.join("sbatch.log"))
        .env("XDG_STATE_HOME", d.join("state"))
        .current_dir(d)
        .output()
        .unwrap()
}

/// The embedded target launched from `repo`, as a profile file.
fn target_file(dir: &Path, target: &TargetProfile) -> PathBuf {
    let mut text = format!(
        "name = \"engine-repo\"\napi = \"{}\"\nmodel = \"m\"\nengine = \"embedded\"\n",
        target.api
    );
    for role in &target.roles {
        text += &format!(
            "\n[[role]]\nname = \"{}\"\nlaunch = \"{}\"\nhealth = \"{}\"\nmetrics = \"{}\"\n",
            role.name,
            role.launch.display(),
            role.health,
            role.metrics.as_deref().unwrap()
        );
    }
    let path = dir.join("target.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn parallel_rounds_run_as_array_tasks_and_find_the_culprit() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let change = Change {
        commit: CULPRIT,
        edits: &[(BF16_OFF, BF16_ON)],
        subject: "turn the bf16 index-K default on (needle recall)",
    };
    let (repo, target, shas) = scripted_repo(d, COMMITS, &[(BF16_ON, BF16_OFF)], Some(change));
    let profile = target_file(d, &target);
    let good = format!("main~{COMMITS}");
    let profile = profile.display().to_string();
    let repo_arg = repo.display().to_string();
    let args: Vec<String> = [
        "commits",
        "--repo",
        &repo_arg,
        &good,
        "main",
        "--build",
        "sh -n prefill.sh && sh -n decode.sh",
        "--target",
        &profile,
        "--concurrency",
        "80",
        "--parallel",
        "3",
        "--sbatch=--exclusive",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    let out = bisect_on_fake_slurm(d, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["answer"], "culprit", "{}", record["verdict"]);
    assert_eq!(record["culprit"]["sha"], shas[CULPRIT].as_str());
    assert_eq!(record["params"]["parallel"], 3);

    // Every round was one array, bisect's options first and the user's after them.
    let submitted = std::fs::read_to_string(d.join("sbatch.log")).unwrap();
    let arrays: Vec<&str> = submitted.lines().collect();
    assert!(arrays.iter().all(|l| l.starts_with("--parsable --array=0-")
        && l.contains(" --exclusive ")
        && l.ends_with("/task.sh")));
    assert!(
        arrays[0].starts_with("--parsable --array=0-1 "),
        "{submitted}"
    );
    assert!(
        arrays
            .iter()
            .any(|l| l.starts_with("--parsable --array=0-2 ")),
        "{submitted}"
    );
    assert!(stderr.contains("Slurm array job"), "{stderr}");

    // The steps, numbered in order, each with the block its task ran.
    let steps = record["steps"].as_array().unwrap();
    let results = d.join("results");
    let search = std::fs::read_dir(&results)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("commits.json").is_file())
        .unwrap();
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["step"], i as u64 + 1);
        let block = search.join(step["dir"].as_str().unwrap());
        assert!(
            block.join("sessions.jsonl").is_file(),
            "{}",
            block.display()
        );
    }
    let rounds = std::fs::read_dir(search.join("rounds")).unwrap().count();
    assert_eq!(rounds, arrays.len());
    // summary.md numbers the rounds beside the steps.
    let summary = std::fs::read_to_string(search.join("summary.md")).unwrap();
    assert!(
        summary.contains(&format!(
            "Up to 3 blocks a round, side by side as Slurm job arrays: {} steps in {rounds} rounds.",
            steps.len()
        )),
        "{summary}"
    );
    assert!(summary.contains("| 1 (round 1) | 16 `"), "{summary}");
    assert!(summary.contains("| 2 (round 1) | 0 `"), "{summary}");
    assert!(
        steps.len() > rounds,
        "{} steps in {rounds} rounds",
        steps.len()
    );
    // A commit built by one round's task is not built again by a later one.
    let mut built: Vec<&str> = steps
        .iter()
        .filter_map(|s| s["build"]["sha"].as_str())
        .collect();
    let all = built.len();
    built.sort_unstable();
    built.dedup();
    assert_eq!(built.len(), all, "{built:?}");
    assert!(!search.join("worktrees").exists());
    assert_untouched(&repo, &shas[COMMITS]);
    assert!(!git(&repo, &["worktree", "list"]).contains("worktrees"));
}

#[test]
fn a_task_that_leaves_no_step_could_not_tell_and_a_missing_sbatch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (repo, target, _) = scripted_repo(d, 4, &[], None);
    let profile = target_file(d, &target);
    let profile = profile.display().to_string();
    let repo_arg = repo.display().to_string();
    let args = |extra: &[&str]| {
        let mut a: Vec<String> = [
            "commits",
            "--repo",
            &repo_arg,
            "main~4",
            "main",
            "--build",
            "true",
            "--target",
            &profile,
            "--sessions",
            "8",
            "--concurrency",
            "8",
            "--parallel",
            "2",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // No sbatch on PATH: refused before anything runs, with the fix.
    let empty = d.join("empty-bin");
    std::fs::create_dir(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args(&[]))
        .env("PATH", &empty)
        .env("XDG_STATE_HOME", d.join("state"))
        .current_dir(d)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sbatch is not on PATH"), "{stderr}");
    assert!(!d.join("results").exists());

    // Every array loses its task 0 to a node failure: the bad end never tells, becomes
    // untestable after three tries, and the search says so (inconclusive, exit 3).
    let out = bisect_on_fake_slurm(d, &args(&["--sbatch=--fail-task=0"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = record["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("commit 4 cannot be tested (could not tell 3 times: array task 0 of job")
            && verdict.contains("left no result (slurmstepd: error: *** JOB"),
        "{verdict}"
    );
}
