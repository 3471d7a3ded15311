//! A commits search on replica sets (docs/commits.md, "Replica sets"): on a target that
//! lists several sets (`[[replica]]`), a round of the search's `--parallel K` commits
//! (K the number of sets unless given) runs at once, in this process, one commit's
//! blocks per set (step i of the round on set i mod N, a set with more than one running
//! its steps in turn), each through the one block lifecycle on its own set's engines
//! (write and read back, restart, identity and effective values, probe, death watch,
//! drive, restore). The round's commits are built first, one after another: builds share
//! the repository's worktrees and, on this machine, its cores.
//!
//! A comparison is never split over two sets. The search's pairs (both ends of the range,
//! and the verifying A/B of culprit against parent) run on the first set, one after the
//! other, as on a single replica; a `--flag` step's on and off blocks run on its own set.
//! What a set's difference can do is mislead the search's posterior between rounds (a
//! commit tested on a set that corrupts more looks worse): that costs blocks, not the
//! answer, which the first set's verifying A/B decides.

use super::block::BlockContext;
use super::build::Builder;
use super::git::Worktrees;
use super::record::StepEntry;
use super::task::Planned;
use super::{build_step, run_built, CommitsPlan, Prepared};
use crate::commands::replicas::{first_failure, LaneProgress};
use crate::core::commits::Purpose;

/// Which set runs step `i` of a round of `steps` on `sets` sets: the round's pairs
/// (ends, verification) on the first set; a search round's steps dealt i mod N.
pub(crate) fn set_of(purpose: Purpose, i: usize, sets: usize) -> usize {
    match purpose {
        Purpose::Search => i % sets.max(1),
        Purpose::Ends | Purpose::Verify => 0,
    }
}

/// Run the round's planned steps on the target's replica sets: built one after another,
/// then each set's steps at the same time as the other sets'. The steps come back in the
/// round's order, each naming its set and the round. A set whose block fails stops the
/// other sets (their steps could not be observed in order); the failure that is not
/// that stop is the round's.
pub(crate) async fn run_round(
    plan: &CommitsPlan,
    planned: &[Planned],
    builder: &mut Builder,
    ctx: &BlockContext<'_>,
    worktrees: &mut Worktrees,
) -> anyhow::Result<Vec<StepEntry>> {
    let sets = plan.target.replica_sets();
    let mut slots: Vec<Option<StepEntry>> = vec![None; planned.len()];
    let mut lanes: Vec<Vec<(usize, super::Ready)>> = (0..sets.len()).map(|_| Vec::new()).collect();
    for (i, p) in planned.iter().enumerate() {
        match build_step(plan, p, builder, ctx, worktrees).await? {
            Prepared::Done(step) => slots[i] = Some(step),
            Prepared::Ready(ready) => lanes[set_of(p.purpose, i, sets.len())].push((i, ready)),
        }
    }
    let progress: Vec<LaneProgress<'_>> = sets
        .iter()
        .map(|s| LaneProgress::new(ctx.progress, Some(s.replica_name().to_string())))
        .collect();
    let stop = ctx.cancel.child_token();
    let ran = futures::future::join_all(lanes.into_iter().zip(&sets).zip(&progress).map(
        |((steps, set), lane_progress)| {
            let lane_ctx = ctx.on_lane(lane_progress, stop.clone());
            let stop = stop.clone();
            async move {
                let mut done = Vec::new();
                for (i, ready) in steps {
                    match run_built(plan, set, ready, &lane_ctx).await {
                        Ok(step) => done.push((i, step)),
                        Err(e) => {
                            stop.cancel();
                            return Err(e.context(format!("replica set {}", set.replica_name())));
                        }
                    }
                }
                Ok(done)
            }
        },
    ))
    .await;
    let mut failures = Vec::new();
    for (outcome, set) in ran.into_iter().zip(&sets) {
        match outcome {
            Ok(done) => {
                for (i, step) in done {
                    slots[i] = Some(StepEntry {
                        replica: Some(set.replica_name().to_string()),
                        ..step
                    });
                }
            }
            Err(e) => failures.push(e),
        }
    }
    if !failures.is_empty() {
        return Err(first_failure(failures, &ctx.cancel));
    }
    let round = planned.first().map(|p| p.step);
    Ok(slots
        .into_iter()
        .map(|s| StepEntry {
            round,
            ..s.expect("every step of the round was built or ran")
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_stay_on_the_first_set_and_search_rounds_are_dealt() {
        assert_eq!(set_of(Purpose::Ends, 1, 2), 0);
        assert_eq!(set_of(Purpose::Verify, 1, 3), 0);
        let dealt: Vec<usize> = (0..5).map(|i| set_of(Purpose::Search, i, 2)).collect();
        assert_eq!(dealt, vec![0, 1, 0, 1, 0]);
    }
}
