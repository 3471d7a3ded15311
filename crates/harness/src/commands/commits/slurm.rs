//! Where a round's blocks run (docs/commits.md, "Slurm"): here, one after another, or,
//! with `--parallel K`, as one Slurm job array per round. The search writes the round's
//! steps (`rounds/sNNN/tasks.json`) and a job script that runs `bisect commits` with the
//! search's own arguments plus `--round-task` ([`super::task`]), submits it with `sbatch
//! --array=0-(n-1)` (the user's `--sbatch` options after bisect's, so theirs win), waits
//! for the array with `squeue`, and collects each task's step in plan order. A task that
//! left no step (its node failed, Slurm killed it, its process erred) is "could not
//! tell" for its commit, with the last line of its output as the reason: it weighs
//! nothing, and a commit that keeps failing becomes untestable. Ctrl-C cancels the array
//! (`scancel`).
//!
//! The search's folder, the repository, and the bisect binary must be reachable at the
//! same paths from every node (a shared file system), as for the matrix's shards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::process::Command;

use super::block::{launch_inside, BlockContext};
use super::build::BuildStep;
use super::record::StepEntry;
use super::task::{result_file, Planned, RoundPlan, TASKS_FILE};
use crate::config::embedded::shell_quote;
use crate::config::TargetProfile;
use crate::core::commits::{Observation, Spent};
use crate::exit::Failure;

/// Where a round's blocks run.
#[derive(Debug, Clone, Default)]
pub enum Rounds {
    /// In this process, one after another.
    #[default]
    Local,
    /// In this process, a round's steps at once on the target's replica sets
    /// ([`super::lanes`]).
    Replicas,
    /// One Slurm array task per block of the round.
    Slurm(SlurmRounds),
}

/// How rounds are submitted to Slurm.
#[derive(Debug, Clone)]
pub struct SlurmRounds {
    /// The program and arguments each task runs (`--round-task ROUND` is appended):
    /// this bisect with the search's own arguments.
    pub task_command: Vec<String>,
    /// `--sbatch` options (partition, account, time, GPUs, `--exclusive`).
    pub sbatch_args: Vec<String>,
    /// The tasks' working directory: the search's, so relative paths mean the same.
    pub workdir: PathBuf,
    /// How often `squeue` is asked whether the array is still there.
    pub poll: Duration,
}

/// Refuses a search whose blocks, run at once by a round's tasks, would write the same
/// files: with `--flag` or `--set` a block writes its values into the launch configs it
/// launches from, which are each commit's own only inside the repository's worktrees.
/// A launch config outside the repository (or every one, with `--artifact`) is the
/// user's, one file for every task: their writes would cross, and an engine could start
/// with another task's value.
pub(crate) fn refuse_shared_writes(
    target: &TargetProfile,
    repo: Option<&Path>,
    build: &BuildStep,
    writes: bool,
) -> anyhow::Result<()> {
    if !writes {
        return Ok(());
    }
    let shared: Vec<String> = target
        .roles
        .iter()
        .filter(|role| {
            matches!(build, BuildStep::Artifact(_))
                || repo.and_then(|repo| launch_inside(role, repo)).is_none()
        })
        .map(|role| format!("{} ({})", role.launch.display(), role.name))
        .collect();
    if shared.is_empty() {
        return Ok(());
    }
    Err(Failure::bad_input(
        format!(
            "--parallel with --flag or --set: a round's blocks run at once and each writes its values into {}, which every task shares (outside the repository's worktrees)",
            shared.join(", ")
        ),
        "point the roles' launch configs into the repository and use --build, or drop --parallel and --sbatch",
    )
    .into())
}

/// Refuses `--artifact` with rounds unless a role's restart command names `{commit}`:
/// each task runs the artifact's command on its own node, and an install into an
/// environment that tasks share (a home directory's venv) would let concurrent tasks run
/// each other's commit. A restart naming the commit (an image tag) cannot.
pub(crate) fn refuse_shared_artifacts(
    target: &TargetProfile,
    build: &BuildStep,
) -> anyhow::Result<()> {
    let named = target
        .roles
        .iter()
        .any(|r| r.restart.as_deref().is_some_and(|c| c.contains("{commit}")));
    if matches!(build, BuildStep::Artifact(_)) && !named {
        return Err(Failure::bad_input(
            "--parallel with --artifact: a round's tasks install their commits' artifacts at once, and nothing tells that they do not share one environment",
            "name {commit} in the roles' restart commands (e.g. an image tag), or use --build with the build's product inside the worktree, or drop --parallel and --sbatch",
        )
        .into());
    }
    Ok(())
}

/// `squeue` failures in a row (other than "the job is gone") before the wait gives up.
const SQUEUE_RETRIES: u32 = 30;

/// How long a cancelled array may take to go (its tasks restore launch configs and stop
/// engines on SIGTERM) before the search removes their worktrees anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(60);

/// The job id file of a round: what a later search cancels if this one was killed.
const JOB_FILE: &str = "job";

/// A submitted array: its id and, on a federation of clusters, its cluster
/// (`sbatch --parsable` prints `id;cluster`).
#[derive(Debug, Clone, PartialEq)]
struct Job {
    id: String,
    cluster: Option<String>,
}

impl Job {
    fn parse(parsable: &str) -> Option<Job> {
        let mut parts = parsable.trim().splitn(2, ';');
        let id = parts.next()?.trim().to_string();
        if id.is_empty() {
            return None;
        }
        let cluster = parts.next().map(str::trim).filter(|c| !c.is_empty());
        Some(Job {
            id,
            cluster: cluster.map(str::to_string),
        })
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        if let Some(cluster) = &self.cluster {
            cmd.arg(format!("--clusters={cluster}"));
        }
        cmd.kill_on_drop(true);
        cmd
    }

    /// Whether `squeue` still lists the array (any partition, hidden ones included);
    /// `None` when squeue failed for another reason than the job being gone.
    async fn listed(&self) -> anyhow::Result<Option<bool>> {
        let out = self
            .command("squeue")
            .args(["--all", "-h", "-j", &self.id, "-o", "%i"])
            .output()
            .await
            .context("running squeue")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            // With --clusters, squeue prints a "CLUSTER: name" line: only lines naming
            // the job (`123`, `123_4`, `123_[0-3]`) count.
            let stdout = String::from_utf8_lossy(&out.stdout);
            let id = &self.id;
            Ok(Some(stdout.lines().any(|l| {
                let l = l.trim();
                l == id || l.starts_with(&format!("{id}_"))
            })))
        } else if stderr.contains("Invalid job id") {
            // Purged after it ended.
            Ok(Some(false))
        } else {
            Ok(None)
        }
    }

    /// `scancel`, then until `squeue` no longer lists it (at most [`CANCEL_GRACE`]).
    async fn cancel(&self) {
        let _ = self.command("scancel").arg(&self.id).output().await;
        let deadline = tokio::time::Instant::now() + CANCEL_GRACE;
        while tokio::time::Instant::now() < deadline {
            if matches!(self.listed().await, Ok(Some(false))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cluster {
            Some(c) => write!(f, "{} on {c}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

/// Cancels the arrays of a search that was killed (their ids in `rounds/*/job`), so
/// none of their tasks still writes into the search's folder; called before a search
/// on Slurm starts or resumes.
pub(crate) async fn cancel_leftovers(dir: &Path) {
    let Ok(rounds) = std::fs::read_dir(dir.join("rounds")) else {
        return;
    };
    for round in rounds.flatten().map(|e| e.path()) {
        let Some(job) = std::fs::read_to_string(round.join(JOB_FILE))
            .ok()
            .and_then(|t| Job::parse(&t))
        else {
            continue;
        };
        if matches!(job.listed().await, Ok(Some(true))) {
            job.cancel().await;
        }
    }
}

impl SlurmRounds {
    /// Runs the round's steps as one job array; their steps, in plan order.
    pub(crate) async fn run_round(
        &self,
        dir: &Path,
        planned: &[Planned],
        ctx: &BlockContext<'_>,
    ) -> anyhow::Result<Vec<StepEntry>> {
        let round = std::path::absolute(dir)?
            .join("rounds")
            .join(format!("s{:03}", planned[0].step));
        if round.exists() {
            // A round of a killed search, planned again: its tasks' leftovers go.
            std::fs::remove_dir_all(&round)
                .with_context(|| format!("removing {}", round.display()))?;
        }
        std::fs::create_dir_all(&round).with_context(|| format!("creating {}", round.display()))?;
        let plan = RoundPlan::new(planned.to_vec());
        crate::results::write_atomic(&round.join(TASKS_FILE), &serde_json::to_vec_pretty(&plan)?)?;
        let script = round.join("task.sh");
        std::fs::write(&script, self.job_script(&round))
            .with_context(|| format!("writing {}", script.display()))?;
        let job = self.submit(&round, &script, planned.len()).await?;
        let commits: Vec<String> = planned.iter().map(|p| p.commit.to_string()).collect();
        ctx.progress.note(&format!(
            "round of step {}: Slurm array job {job}, {} tasks (commits {})",
            planned[0].step,
            planned.len(),
            commits.join(", ")
        ));
        if let Err(e) = self.wait(&job, ctx).await {
            // Whatever stopped the wait, no task of this array may run on unseen.
            job.cancel().await;
            return Err(e);
        }
        Ok(planned
            .iter()
            .enumerate()
            .map(|(i, p)| StepEntry {
                round: Some(planned[0].step),
                ..collect(dir, &round, i, p, &job, &plan.nonce)
            })
            .collect())
    }

    fn job_script(&self, round: &Path) -> String {
        let words: Vec<String> = self
            .task_command
            .iter()
            .map(String::as_str)
            .chain(["--round-task", &round.display().to_string()])
            .map(shell_quote)
            .collect();
        format!(
            "#!/bin/sh\n# One task of a `bisect commits --parallel` round: the step of {TASKS_FILE} at\n# $SLURM_ARRAY_TASK_ID (its build, its blocks), written to task-<index>-<nonce>.json.\nexec {}\n",
            words.join(" ")
        )
    }

    /// `sbatch --parsable --array=...`; the job, its id written into the round.
    async fn submit(&self, round: &Path, script: &Path, tasks: usize) -> anyhow::Result<Job> {
        let mut cmd = Command::new("sbatch");
        cmd.arg("--parsable")
            .arg(format!("--array=0-{}", tasks - 1))
            .arg("--job-name=bisect-commits")
            .arg(format!("--output={}/task-%a.out", round.display()))
            .arg(format!("--chdir={}", self.workdir.display()))
            .args(&self.sbatch_args)
            .arg(script)
            .kill_on_drop(true);
        let out = cmd
            .output()
            .await
            .context("running sbatch (is this a Slurm login node?)")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let job = match (out.status.success(), Job::parse(&stdout)) {
            (true, Some(job)) => job,
            _ => {
                return Err(Failure::bad_input(
                    format!(
                        "sbatch refused the round's job array ({}): {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                    "check the --sbatch options (partition, account, time) against the cluster",
                )
                .into())
            }
        };
        std::fs::write(round.join(JOB_FILE), stdout.trim())
            .with_context(|| format!("writing {}", round.join(JOB_FILE).display()))?;
        Ok(job)
    }

    /// Until `squeue` no longer lists the job; Ctrl-C stops the wait.
    async fn wait(&self, job: &Job, ctx: &BlockContext<'_>) -> anyhow::Result<()> {
        let mut failures = 0;
        loop {
            match job.listed().await? {
                Some(false) => return Ok(()),
                Some(true) => failures = 0,
                None => {
                    failures += 1;
                    if failures >= SQUEUE_RETRIES {
                        anyhow::bail!(
                            "squeue failed {failures} times in a row waiting for job {job}"
                        );
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.poll) => {}
                _ = ctx.cancel.cancelled() => return Err(Failure::Interrupted.into()),
            }
        }
    }
}

/// Task `index`'s step, or "could not tell" when it left none. A task that left none may
/// have died mid-block, its commit's worktree half edited: that commit's build marker
/// goes, so the next task checks it out afresh.
fn collect(
    dir: &Path,
    round: &Path,
    index: usize,
    planned: &Planned,
    job: &Job,
    nonce: &str,
) -> StepEntry {
    let file = result_file(round, index, nonce);
    let read = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str::<StepEntry>(&t).ok());
    match read {
        Some(step) if step.step == planned.step && step.commit == planned.commit => step,
        _ => {
            super::build::forget_one(dir, &planned.sha);
            let out = round.join(format!("task-{index}.out"));
            let tail = std::fs::read_to_string(&out)
                .ok()
                .and_then(|t| {
                    t.lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .map(str::to_string)
                })
                .map(|l| l.chars().take(300).collect::<String>())
                .unwrap_or_else(|| "no output".into());
            let reason = format!("array task {index} of job {job} left no result ({tail})");
            let spent = Spent {
                sessions: sessions_left_behind(dir, planned.step),
                ..Spent::default()
            };
            planned.step_entry(Observation::CouldNotTell { reason }, spent)
        }
    }
}

/// Sessions the blocks of step `step` finished before their task died (the lines of
/// their sessions.jsonl): spent, so they count against the budget.
fn sessions_left_behind(dir: &Path, step: u64) -> u64 {
    ["", "-on", "-off"]
        .iter()
        .filter_map(|arm| {
            std::fs::read_to_string(dir.join(format!("blocks/b{step:03}{arm}/sessions.jsonl"))).ok()
        })
        .map(|text| text.lines().filter(|l| !l.trim().is_empty()).count() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::commits::Purpose;

    fn planned(step: u64, commit: usize) -> Planned {
        Planned {
            step,
            commit,
            sha: format!("{commit:040}"),
            subject: "s".into(),
            purpose: Purpose::Search,
        }
    }

    #[test]
    fn the_job_script_runs_the_search_arguments_on_the_round() {
        let slurm = SlurmRounds {
            task_command: vec![
                "/opt/bisect dir/bisect".into(),
                "commits".into(),
                "it's".into(),
                String::new(),
            ],
            sbatch_args: Vec::new(),
            workdir: PathBuf::from("/w"),
            poll: Duration::from_secs(1),
        };
        let script = slurm.job_script(Path::new("/r/rounds/s004"));
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(
            script.ends_with(
                "exec '/opt/bisect dir/bisect' commits 'it'\\''s' '' --round-task /r/rounds/s004\n"
            ),
            "{script}"
        );
    }

    #[test]
    fn a_task_without_its_step_could_not_tell_with_its_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let search = dir.path();
        let round = search.join("rounds/s007");
        std::fs::create_dir_all(&round).unwrap();
        std::fs::create_dir_all(search.join("builds")).unwrap();
        let job = Job::parse("42").unwrap();
        let p = planned(7, 3);
        // The commit's build marker: its task may have died mid-block, so it goes.
        let marker = search.join(format!(
            "builds/{}.ready",
            crate::commands::commits::git::short_id(&p.sha)
        ));
        std::fs::write(&marker, "null").unwrap();
        std::fs::write(round.join("task-1.out"), "building\nerror: node lost\n\n").unwrap();
        // The on block had finished 3 sessions: they are spent.
        std::fs::create_dir_all(search.join("blocks/b007-on")).unwrap();
        std::fs::write(search.join("blocks/b007-on/sessions.jsonl"), "{}\n{}\n{}\n").unwrap();
        let step = collect(search, &round, 1, &p, &job, "n2");
        assert_eq!(step.step, 7);
        assert_eq!(step.commit, 3);
        assert_eq!(step.spent.sessions, 3);
        assert_eq!(
            step.observation,
            Observation::CouldNotTell {
                reason: "array task 1 of job 42 left no result (error: node lost)".into()
            }
        );
        assert!(!marker.exists());
        // Another step's result, or an earlier submission's (another nonce), is not this
        // one's.
        let mut other = step.clone();
        other.step = 6;
        let write = |nonce: &str, step: &StepEntry| {
            std::fs::write(
                result_file(&round, 1, nonce),
                serde_json::to_string(step).unwrap(),
            )
            .unwrap()
        };
        write("n2", &other);
        let mut own = other;
        own.step = 7;
        own.observation = Observation::Block {
            corrupted: 2,
            judged: 80,
        };
        write("n1", &own);
        assert!(matches!(
            collect(search, &round, 1, &p, &job, "n2").observation,
            Observation::CouldNotTell { .. }
        ));
        // Its own is taken as it is.
        write("n2", &own);
        assert_eq!(collect(search, &round, 1, &p, &job, "n2"), own);
    }

    #[test]
    fn parsable_job_ids_keep_their_cluster() {
        assert_eq!(
            Job::parse("4242\n"),
            Some(Job {
                id: "4242".into(),
                cluster: None
            })
        );
        let job = Job::parse("4242;gpu\n").unwrap();
        assert_eq!(job.cluster.as_deref(), Some("gpu"));
        assert_eq!(job.to_string(), "4242 on gpu");
        assert_eq!(Job::parse("  \n"), None);
    }

    #[test]
    fn writes_outside_the_worktrees_are_refused_for_rounds() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("engine");
        let exe = Path::new("/bin/bisect");
        let inside = crate::config::embedded::profile(&repo, exe).unwrap();
        let outside = crate::config::embedded::profile(dir.path(), exe).unwrap();
        let build = BuildStep::Build("make".into());
        let artifact = BuildStep::Artifact("pip install e-{commit}.whl".into());
        // Nothing written: anything goes.
        refuse_shared_writes(&outside, Some(&repo), &build, false).unwrap();
        // Each commit's worktree has its own launch configs.
        refuse_shared_writes(&inside, Some(&repo), &build, true).unwrap();
        // An artifact's install is the node's: only a restart naming the commit is safe.
        refuse_shared_artifacts(&inside, &build).unwrap();
        let err = refuse_shared_artifacts(&inside, &artifact).unwrap_err();
        assert!(format!("{err:#}").contains("fix: name {commit}"), "{err:#}");
        let mut tagged = inside.clone();
        tagged.roles[0].restart = Some("docker run engine:{commit}".into());
        refuse_shared_artifacts(&tagged, &artifact).unwrap();
        for (target, step) in [(&outside, &build), (&inside, &artifact)] {
            let err = refuse_shared_writes(target, Some(&repo), step, true).unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains("prefill.sh (prefill), ") && text.contains("fix: point the roles'"),
                "{text}"
            );
        }
    }
}
