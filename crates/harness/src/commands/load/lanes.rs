//! A load sweep on replica sets (docs/load.md, "Replica sets"): a fixed A/B sweep
//! (`--flag`, no `--adaptive`, sessions in flight) on a target that lists several sets
//! deals its levels to the sets ([`deal`]), and every set runs its levels' blocks, both
//! arms of a level one after the other, at the same time as the other sets, each through
//! the one block lifecycle on its own testbed (write and read back, restart, identity
//! and effective values, probe, death watch, drive, load check, restore).
//!
//! The sweep itself is unchanged: its order is fixed in advance
//! ([`crate::core::load::fixed_order`]), so the sets run blocks before the sweep asks
//! for them, and the sweep is fed each block's outcome in its own order as it arrives
//! (a block asked for out of that order stops the sweep: the seam's contract). Every
//! level's question (does `on` corrupt more than `off` at this load?) is answered on one
//! set, so a set's own difference never enters a comparison; it can only bend the fit
//! across levels, which the per-level tests do not read.
//!
//! Sweeps that compare across levels (no `--flag`: every level against the lowest),
//! choose each block from the last ones (`--adaptive`), or size each level's filler on
//! the engines (`--pressures`) run on the first set, and say so.

use std::collections::BTreeMap;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Blocks, LoadPlan, Recorder, Sweep};
use crate::arm::{lifecycle_lanes, open_lanes, Progress, Testbed};
use crate::commands::blocks::{drive, BlockRunner};
use crate::commands::replicas::{first_failure, lane_progress};
use crate::control::EngineControl;
use crate::core::culprit::BlockOutcome;
use crate::core::load::{fixed_order, sweep, Allocation, Axis, LevelBlock, LoadParams, LoadReport};
use crate::results::load::LoadRecord;

impl LoadPlan {
    /// Whether the sweep runs on every replica set at once: a fixed A/B sweep of sessions
    /// in flight over at least two levels, on a target with several sets.
    pub fn on_replicas(&self) -> bool {
        !self.target.replicas.is_empty()
            && self.flag.is_some()
            && matches!(self.params.allocation, Allocation::Fixed { .. })
            && matches!(self.params.axis, Axis::InFlight)
            && self.params.levels.len() >= 2
    }

    /// Why a sweep on a target with several sets runs on the first alone; `None` when it
    /// uses them all.
    pub(crate) fn why_first_set(&self) -> Option<&'static str> {
        if self.on_replicas() {
            return None;
        }
        Some(if self.flag.is_none() {
            "a sweep without --flag compares every level with the lowest, on one set"
        } else if !matches!(self.params.allocation, Allocation::Fixed { .. }) {
            "an adaptive sweep chooses each block from the ones before it"
        } else if !matches!(self.params.axis, Axis::InFlight) {
            "a pressure sweep sizes each level's filler on one set's engines"
        } else {
            "a sweep of one level has nothing to deal"
        })
    }

    /// The sets of engines the sweep holds: as many as it deals levels to, else one.
    pub fn sets(&self) -> u32 {
        if self.on_replicas() {
            (self.target.replicas.len() + 1).min(self.params.levels.len()) as u32
        } else {
            1
        }
    }
}

/// The set each level of `params`'s sweep runs on, over `sets` sets: the levels dealt
/// longest first, each to the set with the least work so far (Graham's
/// longest-processing-time rule), a level's work its arms' waves of sessions (a block of
/// `n` sessions at `c` in flight drives `ceil(n / c)` waves) plus a restart each, priced
/// as one wave. Low levels drive many waves: dealing level i to set i mod N would give
/// one set the lowest level's long blocks and the other the short ones.
fn deal(params: &LoadParams, sets: usize) -> Vec<usize> {
    let mut work = vec![0u64; params.levels.len()];
    for b in fixed_order(params) {
        if let Some(i) = params.levels.iter().position(|&l| l == b.level) {
            work[i] += b.sessions.div_ceil(u64::from(b.in_flight.max(1))) + 1;
        }
    }
    let mut order: Vec<usize> = (0..work.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(work[i]));
    let mut load = vec![0u64; sets.max(1)];
    let mut set = vec![0; work.len()];
    for i in order {
        let least = (0..load.len()).min_by_key(|&k| load[k]).unwrap_or(0);
        load[least] += work[i];
        set[i] = least;
    }
    set
}

/// The sweep's blocks in its order, each with the set that runs it (its level's deal).
fn dealt_blocks(params: &LoadParams, sets: usize) -> Vec<(LevelBlock, usize)> {
    let dealt = deal(params, sets);
    fixed_order(params)
        .into_iter()
        .map(|b| {
            let i = params.levels.iter().position(|&l| l == b.level);
            let set = i.map_or(0, |i| dealt[i]);
            (b, set)
        })
        .collect()
}

/// Run `plan` (a fixed A/B sweep, [`LoadPlan::on_replicas`]) on every replica set of its
/// target at once, one control per set in the target's order. Every set's launch
/// configs are restored whatever happened; load.json says how far it got.
pub async fn run_on_replicas(
    plan: &LoadPlan,
    controls: Vec<&mut dyn EngineControl>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<LoadRecord> {
    let sets: Vec<_> = plan
        .target
        .replica_sets()
        .into_iter()
        .take(plan.sets() as usize)
        .collect();
    anyhow::ensure!(
        plan.on_replicas() && controls.len() >= sets.len(),
        "a load sweep on replicas: {} engine controls for {} sets",
        controls.len(),
        sets.len()
    );
    let mut record = plan.started()?;
    let planned = dealt_blocks(&plan.params, sets.len());
    record.replicas = planned
        .iter()
        .map(|(b, set)| (b.block, sets[*set].replica_name().to_string()))
        .collect();
    crate::results::load::write(&plan.dir, &record)?;
    let written = plan.written();
    let specs = plan
        .testbed
        .lane_specs(&sets, plan.api_key.as_deref(), &written);
    let lane_progress = lane_progress(&sets, progress);
    // A set that fails stops the others (the sweep cannot be fed past its blocks);
    // Ctrl-C stops them all.
    let stop = cancel.child_token();
    let controls: Vec<&mut dyn EngineControl> = controls
        .into_iter()
        .take(sets.len())
        .map(|c| -> &mut dyn EngineControl { c })
        .collect();
    let beds = open_lanes(specs, controls, &lane_progress, stop.clone()).await?;
    let started = Instant::now();
    let job = plan.sweep();
    lifecycle_lanes(
        beds,
        &mut record,
        async |beds, record| {
            for bed in beds.iter_mut() {
                bed.pin(&plan.pins)?;
            }
            sweep_on_lanes(beds, &job, record, started, &planned, &stop, &cancel).await
        },
        |record, outcome, ending| plan.end(record, outcome, ending, started),
    )
    .await?;
    Ok(record)
}

/// Every set runs its levels' blocks (`planned`: the sweep's, each with its set) in the
/// sweep's order while the sweep is fed their outcomes in its own.
async fn sweep_on_lanes(
    beds: &mut [Testbed<'_>],
    job: &Sweep<'_>,
    record: &mut LoadRecord,
    started: Instant,
    planned: &[(LevelBlock, usize)],
    stop: &CancellationToken,
    cancel: &CancellationToken,
) -> anyhow::Result<LoadReport> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut lanes = Vec::new();
    for (n, bed) in beds.iter_mut().enumerate() {
        let classifier = std::sync::Arc::new(bed.target().classifier(job.workload)?);
        let name = bed.target().replica_name().to_string();
        let dealt: Vec<LevelBlock> = planned
            .iter()
            .filter(|(_, set)| *set == n)
            .map(|(b, _)| b.clone())
            .collect();
        let blocks = job.blocks(bed, classifier, BTreeMap::new());
        lanes.push(run_lane(blocks, dealt, name, tx.clone(), stop.clone()));
    }
    drop(tx);
    let mut feed = Feed {
        planned,
        rx,
        arrived: BTreeMap::new(),
    };
    let mut recorder = Recorder {
        record,
        dir: job.dir.to_path_buf(),
        started,
    };
    let flag = job.flag.map(|f| f.name.clone());
    let (ran, swept) = futures::join!(
        futures::future::join_all(lanes),
        drive(sweep(job.params.clone(), flag), &mut feed, &mut recorder)
    );
    let failures: Vec<anyhow::Error> = ran.into_iter().filter_map(Result::err).collect();
    if !failures.is_empty() {
        return Err(first_failure(failures, cancel));
    }
    swept
}

/// One set's blocks, in order, each outcome sent to the sweep as it comes; the first
/// error stops the other sets.
async fn run_lane(
    mut blocks: Blocks<'_, '_>,
    dealt: Vec<LevelBlock>,
    name: String,
    tx: mpsc::UnboundedSender<(u64, BlockOutcome)>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    for block in dealt {
        match blocks.run_block(&block).await {
            // The sweep may have ended on another set's error: nothing waits then.
            Ok(outcome) => drop(tx.send((block.block, outcome))),
            Err(e) => {
                stop.cancel();
                return Err(e.context(format!("replica set {name}")));
            }
        }
    }
    Ok(())
}

/// The sweep's side of the seam: the outcome of the block it asks for, once its set has
/// run it.
struct Feed<'p> {
    planned: &'p [(LevelBlock, usize)],
    rx: mpsc::UnboundedReceiver<(u64, BlockOutcome)>,
    arrived: BTreeMap<u64, BlockOutcome>,
}

impl BlockRunner<LevelBlock, BlockOutcome> for Feed<'_> {
    async fn run_block(&mut self, block: &LevelBlock) -> anyhow::Result<BlockOutcome> {
        let index = (block.block as usize).wrapping_sub(1);
        anyhow::ensure!(
            self.planned.get(index).map(|(b, _)| b) == Some(block),
            "the sweep asked for block {} ({:?}) out of its fixed order",
            block.block,
            block
        );
        loop {
            if let Some(outcome) = self.arrived.remove(&block.block) {
                return Ok(outcome);
            }
            match self.rx.recv().await {
                Some((n, outcome)) => {
                    self.arrived.insert(n, outcome);
                }
                None => anyhow::bail!("the replica sets stopped before block {} ran", block.block),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::evidence::Policy;
    use crate::core::load::{LoadParams, DEFAULT_LEVELS};

    fn params(levels: &[u32], sessions: u64) -> LoadParams {
        LoadParams::new(
            levels.to_vec(),
            true,
            Allocation::Fixed { sessions },
            &Policy::default(),
            1,
        )
    }

    /// Levels go longest first to the set with the least work; every block of a level
    /// (both arms) to that level's set, in the sweep's order.
    #[test]
    fn levels_are_dealt_by_their_work_with_both_arms_on_one_set() {
        // 24 sessions: 12, 6, 4 and 3 waves a block at 2, 4, 6 and 8 in flight.
        let p = params(&[2, 4, 6, 8], 24);
        assert_eq!(deal(&p, 2), vec![0, 1, 1, 1]);
        assert_eq!(deal(&params(&[2, 4, 6], 24), 2), vec![0, 1, 1]);
        assert_eq!(deal(&p, 1), vec![0, 0, 0, 0]);
        let blocks = dealt_blocks(&p, 2);
        let order: Vec<LevelBlock> = blocks.iter().map(|(b, _)| b.clone()).collect();
        assert_eq!(order, fixed_order(&p));
        let sets: Vec<(u32, usize)> = blocks.iter().map(|(b, s)| (b.level, *s)).collect();
        assert_eq!(
            sets,
            vec![
                (2, 0),
                (2, 0),
                (4, 1),
                (4, 1),
                (6, 1),
                (6, 1),
                (8, 1),
                (8, 1)
            ]
        );
        // The default levels at 80 sessions: the lowest level's 80 waves a block weigh
        // more than every other level's together.
        assert_eq!(
            deal(&params(&DEFAULT_LEVELS, 80), 2),
            vec![0, 1, 1, 1, 1, 1]
        );
    }
}
