//! `bisect load` (docs/load.md): the corruption rate as a function of the sessions in
//! flight (or of the KV cache's pressure at a fixed load, [`Axis`]), and the lowest
//! level at which the bug appears and at which the flag's mechanism runs. Pure: the sweep is a sans-IO
//! state machine ([`LoadSweep`]: it asks for one block of sessions at one level of load
//! and is told what it gave), so it runs unchanged in tests and in the simulation
//! ([`simulate`]).
//!
//! - [`fit`]: the isotonic (pool-adjacent-violators) fit of rate against load and its
//!   simultaneous band.
//! - [`threshold`]: the per-level one-sided tests (fixed: Fisher with Holm; adaptive:
//!   e-processes with Bonferroni), "flat", and the monotone resolution into the
//!   threshold and the next level worth a block.
//! - [`sweep`]: the order of blocks (fixed: every level once, ascending; adaptive: the
//!   open level next to the threshold, until nothing is open or its cap is spent), the
//!   engine-side load check of every block, and the answer in words.
//! - [`simulate`]: known dose-response curves scored through the real sweep.
//! - [`compare`]: two nights' sweeps of the same levels: did the threshold move.

pub mod compare;
pub mod fit;
pub mod report;
pub mod simulate;
pub mod sweep;
pub mod threshold;

use serde::{Deserialize, Serialize};

use crate::evidence::Policy;

pub use report::{Answer, Arm, LoadReport};
pub use sweep::{fixed_order, sweep, LevelBlock, LoadSweep};

/// Sessions per adaptive block at least (a level below half of it runs this many).
pub const MIN_BLOCK: u64 = 20;

/// The default levels of sessions in flight: the seeds' range, one at a time to 80.
pub const DEFAULT_LEVELS: [u32; 6] = [1, 8, 16, 32, 64, 80];

/// How sessions are spent across the levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Allocation {
    /// Every level (every arm of it) once, `sessions` sessions (at least the level).
    Fixed { sessions: u64 },
    /// Blocks where the answer is undecided, each level's arm capped at `max_sessions`.
    Adaptive { max_sessions: u64 },
}

/// What a sweep's levels are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Axis {
    /// Sessions in flight.
    #[default]
    InFlight,
    /// Pressure in percent of the engine's KV cache (core::pressure), every level at
    /// `in_flight` sessions in flight: each level's filler is sized to fill that share.
    Pressure { in_flight: u32 },
}

impl Axis {
    /// What the levels measure: "load" or "pressure".
    pub fn noun(self) -> &'static str {
        match self {
            Axis::InFlight => "load",
            Axis::Pressure { .. } => "pressure",
        }
    }

    /// A level in words: "8 in flight", "50% of the KV cache".
    pub fn words(self, level: u32) -> String {
        match self {
            Axis::InFlight => format!("{level} in flight"),
            Axis::Pressure { .. } => format!("{level}% of the KV cache"),
        }
    }

    /// The column's name in tables and charts.
    pub fn unit(self) -> &'static str {
        match self {
            Axis::InFlight => "in flight",
            Axis::Pressure { .. } => "pressure %",
        }
    }

    /// Sessions in flight at `level`.
    pub fn in_flight(self, level: u32) -> u32 {
        match self {
            Axis::InFlight => level,
            Axis::Pressure { in_flight } => in_flight,
        }
    }

    /// The share of the KV cache `level` aims at, on a pressure axis.
    pub fn pressure(self, level: u32) -> Option<f64> {
        match self {
            Axis::InFlight => None,
            Axis::Pressure { .. } => Some(f64::from(level) / 100.0),
        }
    }
}

/// What the sweep is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadParams {
    /// Sessions in flight (or pressure in percent, by `axis`), ascending, distinct.
    pub levels: Vec<u32>,
    /// What the levels are (records before pressure sweeps: sessions in flight).
    #[serde(default)]
    pub axis: Axis,
    /// Each level an A/B of a flag (`on` vs `off` at that load); otherwise every level
    /// against the lowest.
    pub ab: bool,
    pub allocation: Allocation,
    pub alpha: f64,
    pub min_effect: f64,
    /// A block whose busiest engine role ran fewer than this fraction of its level is
    /// short (run's rule, [`crate::confounds::engine_load_shortfall`]).
    pub min_load_fraction: f64,
    /// More than this fraction of error/timeout sessions in a block is a warning.
    pub degraded_fraction: f64,
    pub seed: u64,
}

impl LoadParams {
    /// A sweep of `levels` deciding by `policy`'s alpha, minimum effect, load rule and
    /// degraded fraction (the command line's `--alpha`, `--min-effect` and defaults).
    pub fn new(
        levels: Vec<u32>,
        ab: bool,
        allocation: Allocation,
        policy: &Policy,
        seed: u64,
    ) -> Self {
        LoadParams {
            levels,
            axis: Axis::InFlight,
            ab,
            allocation,
            alpha: policy.alpha,
            min_effect: policy.min_effect,
            min_load_fraction: policy.min_load_fraction,
            degraded_fraction: policy.degraded_fraction,
            seed,
        }
    }

    /// Levels from `1` doubling from 8 to below `max`, then `max` (`--max 80`: 1, 8,
    /// 16, 32, 64, 80).
    pub fn levels_up_to(max: u32) -> Vec<u32> {
        let mut levels = vec![1];
        let mut c = 8;
        while c < max {
            levels.push(c);
            c *= 2;
        }
        if max > 1 {
            levels.push(max);
        }
        levels
    }

    /// Why these levels cannot make a sweep, if they cannot.
    pub fn check_levels(levels: &[u32], ab: bool) -> Result<(), String> {
        if levels.contains(&0) {
            return Err("a level of 0 sessions in flight measures nothing".into());
        }
        if levels.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "levels {levels:?} are not strictly ascending (each level once, lowest first)"
            ));
        }
        let needed = if ab { 1 } else { 2 };
        if levels.len() < needed {
            return Err(format!(
                "{} level(s) given; without --flag the sweep compares every level with the lowest, so it needs at least 2",
                levels.len()
            ));
        }
        Ok(())
    }

    /// Sessions of one block at `level`: fixed, the planned sessions (at least the
    /// level's sessions in flight); adaptive, twice those (at least [`MIN_BLOCK`]), so that the load is
    /// held with sessions ending and new ones starting for half the block, not only
    /// reached at the start and drained. Measured on the embedded engine (docs/load.md):
    /// 64 sessions at 64 in flight corrupted 0 of 192 where 200 at 64 corrupted 12.
    pub(crate) fn block_sessions(&self, level: u32) -> u64 {
        let level = u64::from(self.axis.in_flight(level));
        match self.allocation {
            Allocation::Fixed { sessions } => sessions.max(level),
            Allocation::Adaptive { .. } => (2 * level).max(MIN_BLOCK),
        }
    }

    /// The blocks the sweep runs at fewest and at most, a restart each (core::cost; a
    /// pressure sweep's sizing restart added): fixed, every level's arms once (both the
    /// same); adaptive, one step (a block of a tested level and one as long of its
    /// baseline, the cheapest such step) at fewest, every tested level's steps up to the
    /// cap at most. A step's baseline block is the level's `off` arm (with a flag) or a
    /// block of the lowest level, at the lowest level's sessions in flight and the
    /// tested level's length (without one: the lowest level is every level's baseline
    /// and is not tested itself).
    pub fn planned_blocks(&self) -> (crate::cost::Blocks, crate::cost::Blocks) {
        let sizing = u64::from(matches!(self.axis, Axis::Pressure { .. }));
        let in_flight = |level: u32| self.axis.in_flight(level);
        let blocks = |b: Vec<(u64, u32)>| crate::cost::Blocks {
            restarts: b.len() as u64 + sizing,
            blocks: b,
        };
        let lowest = self.levels.first().copied().unwrap_or(1);
        let tested: &[u32] = if self.ab {
            &self.levels
        } else {
            self.levels.get(1..).unwrap_or(&[])
        };
        // One step at `level`: its block and its baseline's, as long.
        let step = |level: u32| {
            let n = self.block_sessions(level);
            let base = if self.ab { level } else { lowest };
            [(n, in_flight(level)), (n, in_flight(base))]
        };
        match self.allocation {
            Allocation::Fixed { .. } => {
                let arms = if self.ab { 2 } else { 1 };
                let all: Vec<(u64, u32)> = self
                    .levels
                    .iter()
                    .flat_map(|&l| {
                        std::iter::repeat_n((self.block_sessions(l), in_flight(l)), arms)
                    })
                    .collect();
                (blocks(all.clone()), blocks(all))
            }
            Allocation::Adaptive { max_sessions } => {
                let waves = |b: &[(u64, u32)]| -> f64 {
                    b.iter()
                        .map(|&(s, c)| (s as f64 / f64::from(c.max(1))).ceil())
                        .sum()
                };
                let fewest = tested
                    .iter()
                    .map(|&l| step(l).to_vec())
                    .min_by(|a, b| waves(a).total_cmp(&waves(b)))
                    .unwrap_or_default();
                let most = tested
                    .iter()
                    .flat_map(|&l| {
                        let steps = max_sessions.div_ceil(self.block_sessions(l).max(1));
                        std::iter::repeat_n(step(l), steps as usize).flatten()
                    })
                    .collect();
                (blocks(fewest), blocks(most))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed A/B sweep is priced exactly: every level's two arms once, each a restart,
    /// at least the level's sessions; an adaptive one from one step to every level's cap.
    #[test]
    fn a_sweep_is_priced_by_its_fewest_and_its_most_blocks() {
        let policy = crate::evidence::Policy::default();
        let fixed = LoadParams::new(
            vec![8, 80],
            true,
            Allocation::Fixed { sessions: 40 },
            &policy,
            1,
        );
        let (fewest, most) = fixed.planned_blocks();
        assert_eq!(fewest, most);
        assert_eq!(most.restarts, 4);
        assert_eq!(most.blocks, vec![(40, 8), (40, 8), (80, 80), (80, 80)]);
        let adaptive = LoadParams::new(
            vec![8, 80],
            false,
            Allocation::Adaptive { max_sessions: 320 },
            &policy,
            1,
        );
        let (fewest, most) = adaptive.planned_blocks();
        // Without a flag the lowest level (8) is every level's baseline and untested: a
        // step at 80 is a block of 160 at 80 in flight and one as long at 8 in flight.
        assert_eq!(fewest.blocks, vec![(160, 80), (160, 8)]);
        assert_eq!(most.blocks, vec![(160, 80), (160, 8), (160, 80), (160, 8)]);
        assert_eq!(most.restarts, 4);
        // With a flag every level is tested against its own off arm.
        let ab = LoadParams::new(
            vec![8, 80],
            true,
            Allocation::Adaptive { max_sessions: 320 },
            &policy,
            1,
        );
        let (fewest, most) = ab.planned_blocks();
        // The cheapest step in waves: 160 at 80 in flight is 2 waves, 20 at 8 is 3.
        assert_eq!(fewest.blocks, vec![(160, 80), (160, 80)]);
        // Level 8: blocks of 20, 16 steps of two; level 80: blocks of 160, 2 steps.
        assert_eq!(most.blocks.len(), 2 * 16 + 2 * 2);
    }

    #[test]
    fn levels_up_to_doubles_from_eight() {
        assert_eq!(LoadParams::levels_up_to(80), vec![1, 8, 16, 32, 64, 80]);
        assert_eq!(LoadParams::levels_up_to(64), vec![1, 8, 16, 32, 64]);
        assert_eq!(LoadParams::levels_up_to(4), vec![1, 4]);
        assert_eq!(LoadParams::levels_up_to(1), vec![1]);
        assert!(LoadParams::check_levels(&[1, 8, 8], false).is_err());
        assert!(LoadParams::check_levels(&[8], false).is_err());
        assert!(LoadParams::check_levels(&[8], true).is_ok());
        assert!(LoadParams::check_levels(&[0, 8], true).is_err());
    }
}
