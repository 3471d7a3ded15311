//! The blocks of one step at a built commit, into its [`StepEntry`]: one block, or with
//! `--flag` the flag's A/B at the commit (docs/commits.md): the on block, then the off
//! block (not run when the on block could not tell: the pair could not either), each
//! through the arm lifecycle with the arm's value written, and the pair judged into the
//! step's observation ([`judge_pair`]: the on arm's counts, or "could not tell" when the
//! off arm corrupts above the background).

use std::path::Path;

use super::block::{self, BlockContext, Ran};
use super::record::{observation_words, ArmStep, StepEntry};
use crate::config::{FlagSpec, TargetProfile};
use crate::core::commits::observation::judge_pair;
use crate::core::commits::Observation;

/// The flag under test and the off arm's background rate.
pub(crate) struct Ab<'f> {
    pub flag: &'f FlagSpec,
    pub background: f64,
}

/// Runs the step's blocks at `target` into `root/blocks/` and fills `step` with them: its
/// observation, seconds and sessions, and each block's folder, peak and self-reports.
pub(crate) async fn run_blocks(
    ctx: &BlockContext<'_>,
    target: &TargetProfile,
    ab: Option<Ab<'_>>,
    root: &Path,
    step: &mut StepEntry,
) -> anyhow::Result<()> {
    let n = step.step;
    let sessions = u64::from(ctx.workload.sessions);
    let Some(Ab { flag, background }) = ab else {
        let ran = block::run_block(
            ctx,
            target,
            None,
            &format!("b{n:03}"),
            &block::block_dir(root, n),
        )
        .await?;
        step.spent.block_s = Some(ran.wall_s);
        step.spent.sessions = sessions;
        step.engine = Some(ran.spent);
        step.dir = Some(format!("blocks/b{n:03}"));
        step.wall_s = Some(ran.wall_s);
        step.peak_engine = ran.peak_engine();
        step.engine_info = ran.engine_info;
        step.observation = ran.observation;
        return Ok(());
    };
    let mut arms = Vec::new();
    let mut engine = crate::core::cost::Spent::default();
    for (arm, value) in [("on", flag.on.as_str()), ("off", flag.off.as_str())] {
        let label = format!("b{n:03}-{arm}");
        let dir = root.join("blocks").join(&label);
        let ran = block::run_block(ctx, target, Some((flag, value)), &label, &dir).await?;
        ctx.progress.note(&format!(
            "{} {arm} ({}={value}): {}",
            label,
            flag.name,
            observation_words(&ran.observation)
        ));
        let could_not_tell = !matches!(ran.observation, Observation::Block { .. });
        engine.add(&ran.spent);
        arms.push(arm_step(arm, value, &label, ran));
        if could_not_tell {
            break;
        }
    }
    let on = arms[0].observation.clone();
    let off = arms.get(1).map(|a| a.observation.clone());
    step.observation = judge_pair(&flag.name, on, off, background);
    step.spent.block_s = Some(arms.iter().map(|a| a.wall_s).sum());
    step.spent.sessions = sessions * arms.len() as u64;
    step.wall_s = step.spent.block_s;
    step.engine = Some(engine);
    step.arms = arms;
    Ok(())
}

fn arm_step(arm: &str, value: &str, label: &str, ran: Ran) -> ArmStep {
    ArmStep {
        arm: arm.into(),
        value: value.into(),
        dir: format!("blocks/{label}"),
        peak_engine: ran.peak_engine(),
        wall_s: ran.wall_s,
        engine_info: ran.engine_info,
        observation: ran.observation,
    }
}
