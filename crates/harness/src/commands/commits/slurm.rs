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

use super::block::BlockContext;
use super::record::StepEntry;
use super::task::{result_file, Planned, TASKS_FILE};
use crate::config::embedded::shell_quote;
use crate::core::commits::{Observation, Spent};
use crate::exit::Failure;

/// Where a round's blocks run.
#[derive(Debug, Clone, Default)]
pub enum Rounds {
    /// In this process, one after another.
    #[default]
    Local,
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

/// `squeue` failures in a row (other than "the job is gone") before the wait gives up.
const SQUEUE_RETRIES: u32 = 30;

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
        crate::results::write_atomic(
            &round.join(TASKS_FILE),
            &serde_json::to_vec_pretty(planned)?,
        )?;
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
        self.wait(&job, ctx).await?;
        Ok(planned
            .iter()
            .enumerate()
            .map(|(i, p)| StepEntry {
                round: Some(planned[0].step),
                ..collect(&round, i, p, &job)
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
            "#!/bin/sh\n# One task of a `bisect commits --parallel` round: the step of {TASKS_FILE} at\n# $SLURM_ARRAY_TASK_ID (its build, its blocks), written to task-<index>.json.\nexec {}\n",
            words.join(" ")
        )
    }

    /// `sbatch --parsable --array=...`; the job id.
    async fn submit(&self, round: &Path, script: &Path, tasks: usize) -> anyhow::Result<String> {
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
        let job = stdout.trim().split(';').next().unwrap_or("").to_string();
        if !out.status.success() || job.is_empty() {
            return Err(Failure::BadInput(format!(
                "sbatch refused the round's job array ({}): {}\n  fix: check the --sbatch options (partition, account, time) against the cluster",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
            .into());
        }
        Ok(job)
    }

    /// Until `squeue` no longer lists the job; Ctrl-C cancels it.
    async fn wait(&self, job: &str, ctx: &BlockContext<'_>) -> anyhow::Result<()> {
        let mut failures = 0;
        loop {
            let out = Command::new("squeue")
                .args(["-h", "-j", job, "-o", "%i"])
                .kill_on_drop(true)
                .output()
                .await
                .context("running squeue")?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                failures = 0;
                if String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                    return Ok(());
                }
            } else if stderr.contains("Invalid job id") {
                // Purged after it ended.
                return Ok(());
            } else {
                failures += 1;
                if failures >= SQUEUE_RETRIES {
                    anyhow::bail!(
                        "squeue failed {failures} times in a row waiting for job {job}: {}",
                        stderr.trim()
                    );
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.poll) => {}
                _ = ctx.cancel.cancelled() => {
                    let _ = Command::new("scancel").arg(job).output().await;
                    return Err(Failure::Interrupted.into());
                }
            }
        }
    }
}

/// Task `index`'s step, or "could not tell" when it left none (or another's).
fn collect(round: &Path, index: usize, planned: &Planned, job: &str) -> StepEntry {
    let file = result_file(round, index);
    let read = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str::<StepEntry>(&t).ok());
    match read {
        Some(step) if step.step == planned.step && step.commit == planned.commit => step,
        _ => {
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
            StepEntry {
                step: planned.step,
                commit: planned.commit,
                sha: planned.sha.clone(),
                purpose: planned.purpose,
                observation: Observation::CouldNotTell {
                    reason: format!("array task {index} of job {job} left no result ({tail})"),
                },
                spent: Spent::default(),
                dir: None,
                peak_engine: None,
                wall_s: None,
                build: None,
                engine_info: Default::default(),
                arms: Vec::new(),
                round: None,
            }
        }
    }
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
            ],
            sbatch_args: Vec::new(),
            workdir: PathBuf::from("/w"),
            poll: Duration::from_secs(1),
        };
        let script = slurm.job_script(Path::new("/r/rounds/s004"));
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(
            script.ends_with(
                "exec '/opt/bisect dir/bisect' commits 'it'\\''s' --round-task /r/rounds/s004\n"
            ),
            "{script}"
        );
    }

    #[test]
    fn a_task_without_its_step_could_not_tell_with_its_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let round = dir.path();
        std::fs::write(round.join("task-1.out"), "building\nerror: node lost\n\n").unwrap();
        let step = collect(round, 1, &planned(7, 3), "42");
        assert_eq!(step.step, 7);
        assert_eq!(step.commit, 3);
        assert_eq!(
            step.observation,
            Observation::CouldNotTell {
                reason: "array task 1 of job 42 left no result (error: node lost)".into()
            }
        );
        // Another step's result (a stale file) is not this one's.
        let mut other = step.clone();
        other.step = 6;
        std::fs::write(
            result_file(round, 1),
            serde_json::to_string(&other).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            collect(round, 1, &planned(7, 3), "42").observation,
            Observation::CouldNotTell { .. }
        ));
        // Its own is taken as it is.
        let mut own = other;
        own.step = 7;
        own.observation = Observation::Block {
            corrupted: 2,
            judged: 80,
        };
        std::fs::write(result_file(round, 1), serde_json::to_string(&own).unwrap()).unwrap();
        assert_eq!(collect(round, 1, &planned(7, 3), "42"), own);
    }
}
