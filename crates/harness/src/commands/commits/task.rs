//! One array task of a `bisect commits --parallel K` round (docs/commits.md, "Slurm"):
//! the search writes the round's steps into `rounds/sNNN/tasks.json` and submits one task
//! per step; each task runs `bisect commits <the search's arguments> --round-task
//! rounds/sNNN`, which lands here: the step at `$SLURM_ARRAY_TASK_ID` is built (reusing a
//! build an earlier task of the search finished) and its blocks run through the same
//! lifecycle and checks as a step run in the search's own process, and the step is
//! written to `task-<index>.json` beside the plan, where the search collects it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::block::ControlFactory;
use super::build::Builder;
use super::git::CommitInfo;
use super::record::StepEntry;
use super::{run_step, CommitsPlan};
use crate::arm::Progress;
use crate::core::commits::{Observation, Purpose, Spent, Test};
use crate::exit::Failure;

/// The round's steps, as the search planned them.
pub(crate) const TASKS_FILE: &str = "tasks.json";

/// One step of a round: its number in the search, the commit and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    pub step: u64,
    pub commit: usize,
    pub sha: String,
    pub subject: String,
    pub purpose: Purpose,
}

impl Planned {
    /// This step with `observation` and `spent` only: no block folder, build or
    /// self-report (yet).
    pub(crate) fn step_entry(&self, observation: Observation, spent: Spent) -> StepEntry {
        StepEntry {
            step: self.step,
            commit: self.commit,
            sha: self.sha.clone(),
            purpose: self.purpose,
            observation,
            spent,
            dir: None,
            peak_engine: None,
            wall_s: None,
            build: None,
            engine_info: Default::default(),
            arms: Vec::new(),
            round: None,
            replica: None,
            engine: None,
        }
    }

    pub(crate) fn new(step: u64, test: Test, info: &CommitInfo) -> Self {
        Planned {
            step,
            commit: test.commit,
            sha: info.sha.clone(),
            subject: info.subject.clone(),
            purpose: test.purpose,
        }
    }
}

/// A round as its tasks read it: the steps, and a nonce naming this submission, so a
/// task of an earlier submission of the same round (a killed search's, resumed) can
/// never leave a step this one collects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RoundPlan {
    pub nonce: String,
    pub steps: Vec<Planned>,
}

impl RoundPlan {
    pub(crate) fn new(steps: Vec<Planned>) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        RoundPlan {
            nonce: format!("{:x}", nanos ^ (u128::from(std::process::id()) << 64)),
            steps,
        }
    }
}

/// Where task `index` of the submission `nonce` of the round in `round` leaves its step.
pub(crate) fn result_file(round: &Path, index: usize, nonce: &str) -> PathBuf {
    round.join(format!("task-{index}-{nonce}.json"))
}

/// The round's plan.
pub(crate) fn read_tasks(round: &Path) -> anyhow::Result<RoundPlan> {
    let path = round.join(TASKS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (the folder the search shares with its array tasks must be reachable from every node)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The search folder of a round folder (`<search>/rounds/sNNN`).
pub fn search_dir(round: &Path) -> anyhow::Result<PathBuf> {
    round
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            Failure::bad_input(
                format!(
                    "--round-task {}: not a round folder of a search (<search>/rounds/sNNN)",
                    round.display()
                ),
                "--round-task is written by `bisect commits --parallel` into its job scripts; do not pass it by hand",
            )
            .into()
        })
}

/// Runs task `index` of the round in `round` and writes its step; `plan.dir` is the
/// search's folder.
pub async fn run_task(
    plan: &CommitsPlan,
    round: &Path,
    index: usize,
    controls: &ControlFactory<'_>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<StepEntry> {
    let tasks = read_tasks(round)?;
    let Some(planned) = tasks.steps.get(index) else {
        return Err(Failure::bad_input(
            format!(
                "array task {index}: {} plans {} steps",
                round.join(TASKS_FILE).display(),
                tasks.steps.len()
            ),
            format!(
                "submit the round with --array=0-{}",
                tasks.steps.len().saturating_sub(1)
            ),
        )
        .into());
    };
    same_search(plan)?;
    let ctx = plan.block_context(controls, progress, cancel);
    let mut builder = Builder::shared(plan.build.clone(), &plan.dir);
    let mut worktrees = plan.worktrees(true);
    let step = run_step(plan, planned, &mut builder, &ctx, &mut worktrees).await?;
    let out = result_file(round, index, &tasks.nonce);
    crate::results::write_atomic(&out, &serde_json::to_vec_pretty(&step)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(step)
}

/// Refuses to run a step of another search than the one logged in the search's
/// steps.jsonl (the arguments parsed differently, or another bisect build reading them).
fn same_search(plan: &CommitsPlan) -> anyhow::Result<()> {
    let log = plan.dir.join("steps.jsonl");
    let (logged, _) = super::record::read_log(&log)?;
    let commits = plan.range.list(plan.find)?;
    let now = plan.header(&commits);
    if now != logged {
        return Err(Failure::bad_input(
            format!(
                "{}: this task parsed another search from its arguments (logged {logged:?}; task {now:?})",
                log.display()
            ),
            "run every task with the bisect binary and arguments the search was started with",
        )
        .into());
    }
    Ok(())
}
