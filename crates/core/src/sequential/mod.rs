//! Sequential A/B test of two corruption rates (`on` vs `off`) whose error control holds
//! under optional stopping: the experiment looks after every pair of arm blocks and stops
//! as soon as the data decide, instead of running a sample size fixed in advance. It owns
//! the design (error rates, minimum effect, block size, the finite cap on sessions), the
//! state of one experiment (every look recorded for run.json) and the decision at each look.
//!
//! CHOICE, made by simulation (`cargo bench --bench sequential`, figures in
//! docs/sequential.md): an anytime-valid e-process, not a group-sequential design with
//! Lan-DeMets O'Brien-Fleming-type spending. Both were run through the same binomial
//! scenarios at equal alpha and power (80% at 6% vs 1%), looks every 20 sessions per arm:
//! - the seeds' effects (18% vs 1%, 17% vs 0%, 12% vs 0%) stop after 3-5 looks, at
//!   0.21-0.29x the sessions of the fixed design sized for that power; the spending design
//!   needs 1.4-1.9x as many sessions and restarts as the e-process, because its first
//!   boundaries are huge when the cap is sized for a 5-point effect;
//! - clean arms (A/A at 0%) clear after 140 sessions per arm, against 200 (at alpha 0.01);
//! - the false-positive rate stays below alpha by construction (Ville's inequality), at
//!   any number of looks, any block sizes, short blocks from failed sessions, and runs
//!   that are resumed and extended; the spending design's z test holds alpha only
//!   approximately (rates of 0-18% in blocks of 20 are far from normal) and only for the
//!   planned looks;
//! - the price: a cap about 1.4x the fixed design (480 vs 353 per arm at alpha 0.01); near
//!   or below the design effect the spending design is stronger (5% vs 1%: 60% implicated
//!   against 77%), and the always-valid interval is too wide to clear arms at a 5%
//!   background rate within the cap, where the spending design's repeated intervals clear
//!   about 70%. Those runs end `underpowered` at the cap.
//!
//! Methods, each implemented as its source states it:
//! - The e-process: R. J. Turner, A. Ly and P. D. Grunwald (2021), "Safe tests and
//!   always-valid confidence intervals for contingency tables and beyond", arXiv
//!   2106.02693 (later "Generic E-variables for exact sequential k-sample tests that allow
//!   for optional stopping"), as in the R package safestats
//!   (`safeTwoProportionsTest`, no restriction on the alternative). Per block of `na`
//!   sessions of `on` and `nb` of `off`, the e-variable is the likelihood ratio
//!   `p_{ta,tb}(block) / p_{t0,t0}(block)` with `t0 = (na ta + nb tb) / (na + nb)`, which
//!   has expectation at most 1 under every common rate (its GROW property). `ta`, `tb` are
//!   predictable plug-in estimates from the blocks before this one, posterior means under
//!   Beta(0.18, 0.18) (safestats' default hyperparameters). The e-process is the product
//!   over blocks; by Ville's inequality `P(sup e >= 1/alpha) <= alpha` under the null, at
//!   any stopping time, so `implicated` is declared at the first look with e >= 1/alpha.
//! - Other bets ([`Bet`], for `cargo bench --bench sequential`; not the default): a convex
//!   mixture of e-processes each started at 1, the plug-in one and ones with fixed
//!   alternatives at the design effect (the same block likelihood ratio with fixed rates).
//!   Each is a test supermartingale under the null, so their mixture is one too (A.
//!   Ramdas, P. Grunwald, V. Vovk and G. Shafer (2023), "Game-theoretic statistics and
//!   safe anytime-valid inference", Statist. Sci. 38:576-601), and Ville's inequality
//!   holds for it. Measured against the plug-in, an oracle bet at the true rates and A.
//!   Wald's (1945) bound in docs/sequential.md, "How close to the bound": better at every
//!   effect, but no bet reaches 0.6x the fixed design at 3% vs 0%, so the plug-in stays.
//! - The always-valid interval for the difference: per arm, H. Robbins (1970),
//!   "Statistical methods related to the law of the iterated logarithm", Ann. Math. Statist.
//!   41:1397-1409, conjugate-mixture confidence sequence
//!   `{p : B(a+k, b+n-k) / B(a, b) / (p^k (1-p)^(n-k)) < 2 / clear_alpha}` with the
//!   Jeffreys mixture a = b = 1/2 (S. R. Howard, A. Ramdas, J. McAuliffe and J. Sekhon
//!   (2021), "Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann.
//!   Statist. 49:1055-1080, section 3), intersected over looks; the difference interval
//!   is `[lo_on - hi_off, hi_on - lo_off]` (Bonferroni over the two arms). `cleared` is
//!   declared when it lies strictly inside (-min_effect, +min_effect).
//! - The cap: the smallest number of looks by which the e-process implicates with the
//!   design's power when `on` corrupts `min_effect` more than a `baseline` rate, estimated
//!   like safestats' `designSafeTwoProportions` by simulating the stopping rule itself
//!   (4000 experiments from a fixed ChaCha8 seed, so the design is deterministic).
//! - The comparator in [`group_sequential`]: K. K. G. Lan and D. L. DeMets (1983),
//!   "Discrete sequential boundaries for clinical trials", Biometrika 70:659-663, with the
//!   O'Brien-Fleming-type spending function `2 - 2 Phi(z_{1-a/2} / sqrt(t))` per side
//!   (a = alpha/2, as rpact and gsDesign apply it); boundaries
//!   by the recursive numerical integration of C. Jennison and B. W. Turnbull (2000),
//!   "Group Sequential Methods with Applications to Clinical Trials", chapter 19.
//!
//! Pure: no I/O; the only randomness is the seeded simulation behind the design.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::stats;

/// Beta hyperparameters (both shapes, both arms) of the plug-in estimates: safestats'
/// default, chosen there to minimise the regret of the e-value.
pub(crate) const PLUG_IN_PRIOR: f64 = 0.18;

/// [`Bet::DesignMixture`]: the share of the plug-in e-process; the rest is spread over fixed
/// alternatives at the design effect. At 1/2 the mixture is never more than a factor 2
/// (ln 2 in log wealth) behind the plug-in alone.
pub(crate) const PLUG_IN_SHARE: f64 = 0.5;

/// [`Bet::DesignMixture`]: the background rate of a clean arm (the seeds' `off` arms run at
/// 0%), the second baseline of its fixed alternatives.
pub(crate) const CLEAN_BASELINE: f64 = 0.001;

/// Beta(1/2, 1/2) mixing distribution of the per-arm confidence sequences: it keeps the
/// bound tight near a rate of 0, where corruption rates of clean arms live.
pub(crate) const SEQUENCE_PRIOR: f64 = 0.5;

/// Experiments simulated to place the cap; the power estimate's standard error is 0.6%.
const PLAN_REPETITIONS: usize = 4000;

/// Experiments simulated per candidate block size when choosing one for a cost model.
const COST_REPETITIONS: usize = 1000;

/// Seed of every planning simulation, so a design is a pure function of its goal.
const PLAN_SEED: u64 = 0x5afe_2021;

/// The planner searches caps up to this multiple of the fixed design's sessions...
const HORIZON_FACTOR: u64 = 4;

/// ...and never beyond this many sessions per arm, which bounds the planning time of a
/// goal with a tiny `min_effect` (such a goal is `Unreachable`).
const MAX_PLANNED_PER_ARM: u64 = 20_000;

/// What the experiment must achieve; [`SequentialDesign::plan`] derives the cap from it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DesignGoal {
    /// Probability of implicating a flag that does not change the rate, over the whole
    /// experiment, however it stops.
    pub alpha: f64,
    /// Probability of implicating when the rates differ by `min_effect` from `baseline`.
    pub power: f64,
    /// The smallest difference in corruption rate worth finding (absolute).
    pub min_effect: f64,
    /// The corruption rate expected without the bug (sizes the cap).
    pub baseline: f64,
    /// Error rate of the always-valid interval that decides `cleared` (0.05: the same 95%
    /// as the fixed verdict's Newcombe interval, here valid at every look).
    pub clear_alpha: f64,
    /// Sessions per arm between looks.
    pub block_per_arm: u64,
}

impl Default for DesignGoal {
    /// The verdict's policy (docs/design.md 3.7): alpha 0.01, power 0.8, min_effect 0.05; a 1%
    /// background rate and looks every 20 sessions per arm.
    fn default() -> Self {
        DesignGoal {
            alpha: 0.01,
            power: 0.8,
            min_effect: 0.05,
            baseline: 0.01,
            clear_alpha: 0.05,
            block_per_arm: 20,
        }
    }
}

impl DesignGoal {
    fn validate(&self) -> Result<(), DesignError> {
        let open_unit = |name, value: f64| {
            if value > 0.0 && value < 1.0 {
                Ok(())
            } else {
                Err(DesignError::Invalid {
                    name,
                    expected: "in (0, 1)",
                    value,
                })
            }
        };
        open_unit("alpha", self.alpha)?;
        open_unit("power", self.power)?;
        open_unit("min_effect", self.min_effect)?;
        open_unit("clear_alpha", self.clear_alpha)?;
        if !(self.baseline >= 0.0 && self.baseline + self.min_effect <= 1.0) {
            return Err(DesignError::Invalid {
                name: "baseline",
                expected: "in [0, 1 - min_effect]",
                value: self.baseline,
            });
        }
        if self.block_per_arm == 0 {
            return Err(DesignError::Invalid {
                name: "block_per_arm",
                expected: "at least 1",
                value: 0.0,
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum DesignError {
    #[error("{name} must be {expected}, got {value}")]
    Invalid {
        name: &'static str,
        expected: &'static str,
        value: f64,
    },
    #[error("no cap up to {max_per_arm} sessions per arm reaches power {power}")]
    Unreachable { power: f64, max_per_arm: u64 },
}

/// Seconds an experiment costs: its sessions, and two restarts per look (each look follows
/// one block of each arm, and switching arms restarts the engines).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Wall seconds per session at the experiment's load (arm wall time / sessions).
    pub session_s: f64,
    /// Wall seconds per restart (edit, restart, health wait).
    pub restart_s: f64,
}

impl CostModel {
    pub fn seconds(&self, sessions: f64, looks: f64) -> f64 {
        sessions * self.session_s + 2.0 * looks * self.restart_s
    }
}

/// A planned sequential experiment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SequentialDesign {
    pub alpha: f64,
    /// The power the cap was sized for (at `min_effect` from `baseline`).
    pub power: f64,
    pub min_effect: f64,
    pub baseline: f64,
    pub clear_alpha: f64,
    pub block_per_arm: u64,
    /// The cap: the experiment ends `underpowered` when an arm reaches it undecided.
    pub max_per_arm: u64,
}

impl SequentialDesign {
    /// The design whose cap gives the goal's power: the smallest whole number of blocks by
    /// which at least `power` of the simulated experiments with rates `baseline +
    /// min_effect` vs `baseline` are implicated.
    pub fn plan(goal: DesignGoal) -> Result<Self, DesignError> {
        Self::plan_with_bet(goal, Bet::PlugIn)
    }

    /// [`SequentialDesign::plan`] for an e-process with another [`Bet`]: the cap by which
    /// that e-process reaches the power (run it with [`SequentialDesign::simulate_with_bet`]).
    pub fn plan_with_bet(goal: DesignGoal, bet: Bet) -> Result<Self, DesignError> {
        goal.validate()?;
        let fixed = stats::sessions_per_arm(goal.baseline, goal.min_effect, goal.alpha, goal.power);
        let horizon_looks = fixed
            .saturating_mul(HORIZON_FACTOR)
            .min(MAX_PLANNED_PER_ARM)
            .div_ceil(goal.block_per_arm);
        let unreachable = DesignError::Unreachable {
            power: goal.power,
            max_per_arm: horizon_looks.saturating_mul(goal.block_per_arm),
        };
        let horizon = Self::with_cap(goal, horizon_looks.saturating_mul(goal.block_per_arm))?;
        let mut rng = ChaCha8Rng::seed_from_u64(PLAN_SEED);
        let p_off = goal.baseline;
        let p_on = goal.baseline + goal.min_effect;
        let mut implicated_at: Vec<u64> = (0..PLAN_REPETITIONS)
            .filter_map(|_| {
                let run = simulate_one(&horizon, bet, p_on, p_off, &mut rng);
                matches!(run.decision, Decision::Implicated { .. }).then_some(run.looks)
            })
            .collect();
        implicated_at.sort_unstable();
        let needed = (goal.power * PLAN_REPETITIONS as f64).ceil() as usize;
        let looks = *implicated_at
            .get(needed.saturating_sub(1))
            .ok_or(unreachable)?;
        Self::with_cap(goal, looks * goal.block_per_arm)
    }

    /// A design with a given cap (no simulation): `power` is then the goal's nominal value,
    /// not a property of the cap.
    pub(crate) fn with_cap(goal: DesignGoal, max_per_arm: u64) -> Result<Self, DesignError> {
        goal.validate()?;
        if max_per_arm == 0 {
            return Err(DesignError::Invalid {
                name: "max_per_arm",
                expected: "at least 1",
                value: 0.0,
            });
        }
        Ok(SequentialDesign {
            alpha: goal.alpha,
            power: goal.power,
            min_effect: goal.min_effect,
            baseline: goal.baseline,
            clear_alpha: goal.clear_alpha,
            block_per_arm: goal.block_per_arm,
            max_per_arm,
        })
    }

    /// Plans one design per candidate block size and keeps the cheapest: expected seconds
    /// averaged over the design alternative and the null at `baseline`, each estimated by
    /// simulating the stopping rule. Ties keep the earlier candidate.
    pub fn plan_for_cost(
        goal: DesignGoal,
        cost: CostModel,
        block_candidates: &[u64],
    ) -> Result<Self, DesignError> {
        let mut best: Option<(f64, SequentialDesign)> = None;
        for &block_per_arm in block_candidates {
            let design = Self::plan(DesignGoal {
                block_per_arm,
                ..goal
            })?;
            let p_alt = goal.baseline + goal.min_effect;
            let seconds = [(p_alt, goal.baseline), (goal.baseline, goal.baseline)]
                .iter()
                .map(|&(p_on, p_off)| {
                    let oc = design.simulate(p_on, p_off, COST_REPETITIONS, PLAN_SEED);
                    cost.seconds(oc.mean_sessions, oc.mean_looks)
                })
                .sum::<f64>()
                / 2.0;
            if best.is_none_or(|(lowest, _)| seconds < lowest) {
                best = Some((seconds, design));
            }
        }
        best.map(|(_, design)| design).ok_or(DesignError::Invalid {
            name: "block_candidates",
            expected: "not empty",
            value: 0.0,
        })
    }

    /// The e-value at which the null is rejected.
    pub fn threshold(&self) -> f64 {
        1.0 / self.alpha
    }

    /// The number of looks after which the experiment ends undecided.
    pub fn max_looks(&self) -> u64 {
        self.max_per_arm.div_ceil(self.block_per_arm)
    }

    /// Operating characteristics by simulation: `repetitions` experiments with true rates
    /// `p_on` and `p_off`, blocks of `block_per_arm` Bernoulli sessions per arm, each run
    /// through [`SequentialState::look`] until it decides.
    pub fn simulate(
        &self,
        p_on: f64,
        p_off: f64,
        repetitions: usize,
        seed: u64,
    ) -> OperatingCharacteristics {
        self.simulate_with_bet(Bet::PlugIn, p_on, p_off, repetitions, seed)
    }

    /// [`SequentialDesign::simulate`] for an e-process with another [`Bet`].
    pub fn simulate_with_bet(
        &self,
        bet: Bet,
        p_on: f64,
        p_off: f64,
        repetitions: usize,
        seed: u64,
    ) -> OperatingCharacteristics {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let runs: Vec<SimulatedRun> = (0..repetitions)
            .map(|_| simulate_one(self, bet, p_on, p_off, &mut rng))
            .collect();
        OperatingCharacteristics::from_runs(&runs, p_on - p_off)
    }
}

/// Corrupted sessions of a number of classified sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub corrupted: u64,
    pub sessions: u64,
}

impl Tally {
    fn checked(arm: &'static str, (corrupted, sessions): (u64, u64)) -> Result<Self, LookError> {
        if corrupted > sessions {
            return Err(LookError::Counts {
                arm,
                corrupted,
                sessions,
            });
        }
        Ok(Tally {
            corrupted,
            sessions,
        })
    }

    fn rate(self) -> f64 {
        stats::rate(self.corrupted, self.sessions)
    }

    fn add(self, other: Tally) -> Tally {
        Tally {
            corrupted: self.corrupted + other.corrupted,
            sessions: self.sessions + other.sessions,
        }
    }

    /// Posterior mean under Beta(PLUG_IN_PRIOR, PLUG_IN_PRIOR): always inside (0, 1).
    #[cfg(test)]
    fn plug_in(self) -> f64 {
        self.plug_in_with(ArmPrior::default())
    }

    /// Posterior mean under the arm's prior: always inside (0, 1).
    fn plug_in_with(self, prior: ArmPrior) -> f64 {
        (self.corrupted as f64 + prior.corrupted)
            / (self.sessions as f64 + prior.corrupted + prior.clean)
    }
}

/// Beta prior of one arm's plug-in estimate, in pseudo-sessions. The default is safestats'
/// Beta(0.18, 0.18). Any prior is valid: the e-variable has expectation at most 1 under
/// the null for every plug-in rate that does not depend on the look's own data
/// (`block_e_value_has_expectation_at_most_one_under_every_null`), so a prior may come
/// from a design or from data the e-process never reads; it only moves power.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct ArmPrior {
    pub corrupted: f64,
    pub clean: f64,
}

impl Default for ArmPrior {
    fn default() -> Self {
        ArmPrior {
            corrupted: PLUG_IN_PRIOR,
            clean: PLUG_IN_PRIOR,
        }
    }
}

impl ArmPrior {
    /// A guess of the arm's rate worth `weight` sessions, over the default prior (so the
    /// plug-in stays inside (0, 1) even for a guess of 0 or 1).
    pub(crate) fn guess(rate: f64, weight: f64) -> Self {
        let rate = rate.clamp(0.0, 1.0);
        ArmPrior {
            corrupted: PLUG_IN_PRIOR + rate * weight,
            clean: PLUG_IN_PRIOR + (1.0 - rate) * weight,
        }
    }
}

/// The priors of both arms' plug-in estimates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PlugInPrior {
    pub on: ArmPrior,
    pub off: ArmPrior,
}

/// What the e-process bets on. Every bet keeps it valid: each component is a product of
/// block e-variables whose rates do not depend on the block (expectation at most 1 under
/// every common rate), hence a test supermartingale from 1, and a convex mixture of test
/// supermartingales is one too, so Ville's inequality holds for the mixture.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Bet {
    /// safestats' plug-in estimates: the design's e-process.
    #[default]
    PlugIn,
    /// Half on the plug-in e-process, half spread evenly over e-processes with fixed
    /// alternatives at the design effect, both directions: `(baseline + min_effect,
    /// baseline)` and, from a clean arm, `(CLEAN_BASELINE + min_effect, CLEAN_BASELINE)`.
    /// Tried for effects below min_effect; not the default (docs/sequential.md, "How close
    /// to the bound").
    DesignMixture,
    /// Everything on one fixed alternative (rates kept inside (0, 1)). With the true rates
    /// it is the benchmark's oracle: the growth-optimal bet for them (GROW, Turner, Ly and
    /// Grunwald), a practical limit for any bet that has to learn them.
    Fixed { on: f64, off: f64 },
}

impl Bet {
    fn is_plug_in(&self) -> bool {
        *self == Bet::PlugIn
    }
}

/// The arm that corrupts more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    On,
    Off,
}

/// The outcome of one look.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Decision {
    /// Undecided: run another block of each arm.
    Continue,
    /// The rates differ (e-value >= 1/alpha); `direction` names the arm that corrupts more.
    Implicated { direction: Direction },
    /// The always-valid interval for the difference lies inside +-min_effect.
    Cleared,
    /// The cap was reached undecided; `interval` is the always-valid difference interval.
    Underpowered { interval: [f64; 2] },
}

impl Decision {
    /// Whether the experiment ends here.
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self, Decision::Continue)
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum LookError {
    #[error("arm {arm}: {corrupted} corrupted sessions of {sessions} is impossible")]
    Counts {
        arm: &'static str,
        corrupted: u64,
        sessions: u64,
    },
    #[error("the experiment already ended with {0:?}")]
    Decided(Decision),
}

/// One look as run.json records it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LookRecord {
    /// 1-based.
    pub look: u64,
    /// Cumulative over all blocks so far.
    pub on: Tally,
    pub off: Tally,
    /// This block's factor of the e-process.
    pub(crate) block_e_value: f64,
    /// The e-process after this look.
    pub e_value: f64,
    /// 1/alpha.
    pub threshold: f64,
    /// Corruption rate of `on` minus that of `off`.
    pub rate_diff: f64,
    /// Always-valid (1 - clear_alpha) interval for the difference.
    pub diff_interval: [f64; 2],
    pub decision: Decision,
}

/// One experiment in progress: feed it each pair of blocks with [`SequentialState::look`].
/// It serialises whole (design, tallies, e-process, intervals, looks), so a run can record
/// it and a resumed run can carry on from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialState {
    design: SequentialDesign,
    on: Tally,
    off: Tally,
    log_e: f64,
    on_bounds: [f64; 2],
    off_bounds: [f64; 2],
    looks: Vec<LookRecord>,
    /// Where the plug-in estimates start (safestats' default unless a caller knows more).
    #[serde(default)]
    prior: PlugInPrior,
    /// The e-process's bet; `log_e` is that of the mixture.
    #[serde(default, skip_serializing_if = "Bet::is_plug_in")]
    bet: Bet,
    /// Log wealth of each component of a bet other than the plug-in alone (unweighted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    log_wealth: Vec<f64>,
}

impl SequentialState {
    pub fn new(design: SequentialDesign) -> Self {
        Self::with_prior(design, PlugInPrior::default())
    }

    /// An experiment whose plug-in estimates start from `prior` instead of safestats'
    /// uninformed Beta(0.18, 0.18): valid as long as the prior does not come from data
    /// this experiment's looks will contain.
    pub(crate) fn with_prior(design: SequentialDesign, prior: PlugInPrior) -> Self {
        SequentialState {
            bet: Bet::PlugIn,
            log_wealth: Vec::new(),
            prior,
            design,
            on: Tally::default(),
            off: Tally::default(),
            log_e: 0.0,
            on_bounds: [0.0, 1.0],
            off_bounds: [0.0, 1.0],
            looks: Vec::new(),
        }
    }

    /// An experiment whose e-process makes another [`Bet`] (the plug-in component, if any,
    /// from safestats' prior).
    fn with_bet(design: SequentialDesign, bet: Bet) -> Self {
        let mut state = Self::new(design);
        if !bet.is_plug_in() {
            state.log_wealth = vec![0.0; components(bet, &design).len()];
            state.bet = bet;
        }
        state
    }

    /// This block's log factor of the e-process, updating a mixture's components.
    fn block_log_e(&mut self, on_block: Tally, off_block: Tally) -> f64 {
        if self.bet.is_plug_in() {
            return block_log_e_value_with(self.on, self.off, self.prior, on_block, off_block);
        }
        let components = components(self.bet, &self.design);
        for ((_, component), wealth) in components.iter().zip(&mut self.log_wealth) {
            let (theta_a, theta_b) = match *component {
                Component::PlugIn => (
                    self.on.plug_in_with(self.prior.on),
                    self.off.plug_in_with(self.prior.off),
                ),
                Component::Fixed { on, off } => (on, off),
            };
            *wealth += block_log_likelihood_ratio(theta_a, theta_b, on_block, off_block);
        }
        log_mixture(&components, &self.log_wealth) - self.log_e
    }

    /// Adds one block of each arm, `(corrupted, classified sessions)` of that block only,
    /// and decides. In order: implicated when the e-process reaches 1/alpha (and the
    /// observed rates differ, which names the direction); cleared when the difference
    /// interval lies inside +-min_effect; underpowered when an arm reached the cap or the
    /// looks ran out; else continue. A look after a final decision is an error.
    pub fn look(&mut self, on: (u64, u64), off: (u64, u64)) -> Result<Decision, LookError> {
        if let Some(last) = self.looks.last() {
            if last.decision.is_final() {
                return Err(LookError::Decided(last.decision));
            }
        }
        let on_block = Tally::checked("on", on)?;
        let off_block = Tally::checked("off", off)?;
        let block_log_e = self.block_log_e(on_block, off_block);
        self.log_e += block_log_e;
        self.on = self.on.add(on_block);
        self.off = self.off.add(off_block);

        let arm_alpha = self.design.clear_alpha / 2.0;
        self.on_bounds = intersect(
            self.on_bounds,
            mixture_confidence_sequence(self.on.corrupted, self.on.sessions, arm_alpha),
        );
        self.off_bounds = intersect(
            self.off_bounds,
            mixture_confidence_sequence(self.off.corrupted, self.off.sessions, arm_alpha),
        );
        let diff_interval = [
            self.on_bounds[0] - self.off_bounds[1],
            self.on_bounds[1] - self.off_bounds[0],
        ];
        let rate_diff = self.on.rate() - self.off.rate();
        let look = self.looks.len() as u64 + 1;
        let m = self.design.min_effect;
        let decision = if self.log_e >= -self.design.alpha.ln() && rate_diff != 0.0 {
            Decision::Implicated {
                direction: if rate_diff > 0.0 {
                    Direction::On
                } else {
                    Direction::Off
                },
            }
        } else if diff_interval[0] > -m && diff_interval[1] < m {
            Decision::Cleared
        } else if look >= self.design.max_looks()
            || self.on.sessions.min(self.off.sessions) >= self.design.max_per_arm
        {
            Decision::Underpowered {
                interval: diff_interval,
            }
        } else {
            Decision::Continue
        };
        self.looks.push(LookRecord {
            look,
            on: self.on,
            off: self.off,
            block_e_value: block_log_e.exp(),
            e_value: self.log_e.exp(),
            threshold: self.design.threshold(),
            rate_diff,
            diff_interval,
            decision,
        });
        Ok(decision)
    }

    #[cfg(test)]
    pub(crate) fn design(&self) -> &SequentialDesign {
        &self.design
    }

    /// Every look so far, in order.
    pub fn looks(&self) -> &[LookRecord] {
        &self.looks
    }

    pub fn e_value(&self) -> f64 {
        self.log_e.exp()
    }

    /// Cumulative `on` and `off` tallies.
    pub(crate) fn tallies(&self) -> (Tally, Tally) {
        (self.on, self.off)
    }

    /// The final decision, once there is one.
    pub fn decision(&self) -> Option<Decision> {
        self.looks
            .last()
            .map(|l| l.decision)
            .filter(Decision::is_final)
    }
}

mod evidence;
pub mod group_sequential;
mod simulate;

pub(crate) use evidence::{block_log_e_value, block_log_e_value_with, mixture_confidence_sequence};
use evidence::{block_log_likelihood_ratio, components, intersect, log_mixture, Component};
use simulate::simulate_one;
pub use simulate::{draw_binomial, OperatingCharacteristics, SimulatedRun};

#[cfg(test)]
mod tests;
