//! A validated plan's vocabulary: how it names its cells (the flag-value axes or an
//! explicit list), its load cells and what they sweep, and the regression rule's
//! thresholds. The cells module expands these into concrete cells; the plan's parsing
//! (the rest of [`super`]) produces them. Here, below both, so neither imports the other.

use crate::config::{FlagSpec, Pin};
use crate::core::load::Allocation;

/// How a plan names its cells before expansion.
#[derive(Debug, Clone)]
pub enum Layout {
    /// The cross product of flag values, then rounds, then sessions (innermost).
    Axes {
        flags: Vec<(FlagSpec, Vec<String>)>,
        sessions: Vec<u32>,
        /// `None`: every cell runs the workload's rounds and the id carries no rounds.
        rounds: Option<Vec<u32>>,
    },
    /// An explicit list; every cell names the same flags.
    Cells(Vec<CellSpec>),
}

#[derive(Debug, Clone)]
pub struct CellSpec {
    pub flags: Vec<Pin>,
    pub sessions: u32,
    pub rounds: Option<u32>,
}

/// A validated load cell, before its id and hash are made ([`super::super::cells`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoadCellSpec {
    /// The other flags, one value each for every block.
    pub fixed: Vec<Pin>,
    pub sweep: LoadSweep,
    pub rounds: Option<u32>,
}

/// What a load cell sweeps.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadSweep {
    /// Sessions in flight, ascending.
    pub levels: Vec<u32>,
    /// Each level an A/B of this flag; `None`: every level against the lowest.
    pub flag: Option<FlagSpec>,
    pub allocation: Allocation,
}

/// The thresholds of the per-cell regression rule (see `matrix::baseline`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RegressionPolicy {
    /// Holm-adjusted one-sided Fisher p below this: corruption significantly higher.
    pub alpha: f64,
    /// ...and the rate must also have risen by at least this much (absolute).
    pub min_effect: f64,
    /// tokens/s below (1 - this) x the baseline's: slower beyond noise.
    pub(crate) tokens_per_s_noise: f64,
    /// A cell with more than this fraction of error+timeout sessions is degraded.
    pub degraded_fraction: f64,
}

pub(crate) const DEFAULT_ALPHA: f64 = 0.01;
pub(crate) const DEFAULT_MIN_EFFECT: f64 = 0.05;
/// The same 25% that docs/design.md 3.7 uses to warn about a tokens/s confound.
pub(crate) const DEFAULT_TOKENS_PER_S_NOISE: f64 = 0.25;
/// The same 10% that makes an arm "degraded" in docs/design.md 3.7.
pub(crate) const DEFAULT_DEGRADED_FRACTION: f64 = 0.10;

impl Default for RegressionPolicy {
    fn default() -> Self {
        RegressionPolicy {
            alpha: DEFAULT_ALPHA,
            min_effect: DEFAULT_MIN_EFFECT,
            tokens_per_s_noise: DEFAULT_TOKENS_PER_S_NOISE,
            degraded_fraction: DEFAULT_DEGRADED_FRACTION,
        }
    }
}
