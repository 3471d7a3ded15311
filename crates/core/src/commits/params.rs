//! What the commit search is asked ([`Params`]): the range's length, the block, the
//! decision thresholds, the budget, and with `--flag` the flag whose A/B each step runs.

use serde::{Deserialize, Serialize};

/// What the search is asked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Params {
    /// Commits in the first-parent range, both ends included (index 0 the good end).
    pub commits: usize,
    /// Sessions per block.
    pub block: u64,
    /// Sessions in flight (for words).
    pub concurrency: u32,
    /// The posterior stops at 1 - alpha; the ends decide at alpha, each verification at
    /// `alpha / max_verifications`.
    pub alpha: f64,
    /// The smallest rise in corruption worth finding.
    pub min_effect: f64,
    /// Error of the always-valid intervals (both arms together).
    pub clear_alpha: f64,
    pub max_sessions: u64,
    /// Most blocks per end, and per side of the verification.
    pub(crate) cap_blocks: u64,
    pub(crate) max_could_not_tell: u32,
    /// Seconds assumed before any was measured.
    pub(crate) build_s_guess: f64,
    pub(crate) block_s_guess: f64,
    /// `--flag NAME`: every step is an A/B pair of NAME's blocks, the on arm counted
    /// (`observation.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
    /// With `flag`: the rate above which the off arm's corruption is not the flag's.
    #[serde(default = "default_background")]
    pub background: f64,
    /// Candidates the search may verify: a failed verification sends it back to the
    /// search (its blocks kept as evidence) until this many were tried. Each
    /// verification decides at `alpha / max_verifications` (Bonferroni), so the claim's
    /// error stays at most `alpha` however many were run.
    /// A step log written before re-search existed has no such field: it replays with
    /// the one verification it ran under.
    #[serde(default = "one")]
    pub(crate) max_verifications: u32,
    /// Blocks per round (`--parallel K`): the search phase asks for K distinct commits at
    /// once, chosen by their joint information; the ends and the verification run their
    /// pair in one round. 1 (the default, and what a log without it ran) is one block at
    /// a time.
    #[serde(default = "one")]
    pub parallel: u32,
}

/// Verifications a search may run.
const MAX_VERIFICATIONS: u32 = 2;

/// The serde default of `max_verifications` and `parallel`: what logs without them ran.
fn one() -> u32 {
    1
}

/// `bisect probe`'s default background rate.
fn default_background() -> f64 {
    0.02
}

impl Params {
    /// What makes the search meaningless, in words naming the option.
    pub fn validate(&self) -> Result<(), String> {
        let open = |name: &str, v: f64| {
            if v > 0.0 && v < 1.0 {
                Ok(())
            } else {
                Err(format!("{name} must be in (0, 1), got {v}"))
            }
        };
        open("--alpha", self.alpha)?;
        open("min_effect", self.min_effect)?;
        open("clear_alpha", self.clear_alpha)?;
        open("--background", self.background)?;
        if self.commits < 2 {
            return Err("the range needs at least its two ends".into());
        }
        if self.block == 0
            || self.cap_blocks == 0
            || self.max_could_not_tell == 0
            || self.max_verifications == 0
            || self.parallel == 0
        {
            return Err("blocks, caps and retries must be at least 1".into());
        }
        if self.parallel as usize > super::choose::MAX_PARALLEL {
            return Err(format!(
                "--parallel {} is more than the {} blocks a round may run",
                self.parallel,
                super::choose::MAX_PARALLEL
            ));
        }
        if self.max_sessions < 2 * self.step_sessions() {
            return Err(format!(
                "--max-sessions {} cannot pay for one step at each end ({} sessions each)",
                self.max_sessions,
                self.step_sessions()
            ));
        }
        Ok(())
    }

    pub fn new(commits: usize, block: u64, concurrency: u32) -> Self {
        Params {
            commits,
            block,
            concurrency,
            alpha: 0.01,
            min_effect: 0.05,
            clear_alpha: 0.05,
            max_sessions: 8000,
            cap_blocks: 20,
            max_could_not_tell: 3,
            build_s_guess: 300.0,
            block_s_guess: 60.0,
            flag: None,
            background: default_background(),
            max_verifications: MAX_VERIFICATIONS,
            parallel: 1,
        }
    }

    /// The level each verification decides at.
    pub(crate) fn verify_alpha(&self) -> f64 {
        self.alpha / f64::from(self.max_verifications.max(1))
    }

    /// Sessions one step costs: a block, or with `flag` a block of each arm.
    pub(crate) fn step_sessions(&self) -> u64 {
        self.block * if self.flag.is_some() { 2 } else { 1 }
    }

    /// ` with NAME on` under `--flag`, else nothing: which arm the rates are.
    pub(crate) fn arm_words(&self) -> String {
        self.flag
            .as_ref()
            .map(|f| format!(" with {f} on"))
            .unwrap_or_default()
    }
}
