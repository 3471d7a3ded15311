//! The culprit search as a pure engine (docs/culprit.md): which flag values of a failing
//! configuration are needed for the failure, interactions included. Everything that
//! touches engines sits behind [`StepRunner`] (run one configuration for one block of
//! sessions at the experiment's load, return the classes of its sessions in index
//! order), so the whole search runs in tests and simulations without processes.
//!
//! The search, in order:
//! 1. **Both ends** (as mozregression and cargo-bisect-rustc verify good and bad before
//!    bisecting): the configuration as it is (every listed flag at its failing value,
//!    "F", the reference failure) against every listed flag flipped ("P"). Verified when
//!    the e-process implicates F. "Could not reproduce" when F's always-valid upper bound
//!    on its corruption rate falls below min_effect (the bug does not fire at this load);
//!    "no culprit among the listed flags" when P fails as much as F (the e-process
//!    implicates P, or the ends run out undecided while P's own always-valid lower bound
//!    is above zero).
//! 2. **Untestable flags**: if P is degraded (error+timeout share over the policy's
//!    threshold, or its fastest block over [`SLOW_RATIO`] times slower in tokens/s than
//!    the failing end's slowest: not a same-speed toggle; before a flag is blamed for
//!    slowness the failing end runs again if it has not since, so a machine that slowed
//!    down is not blamed on a flag), each flag is flipped alone once and those that
//!    degrade are held out; a degradation found later, one degrader at a time, by halving:
//!    hold back half the candidates (keep them at their failing values); if the rest
//!    flipped no longer degrades, the degrader is in the held half, else in the other.
//!    The flag found is held at its failing value from then on, untestable, with its
//!    reason; P is re-verified without it. Probes that did not degrade are steps like any
//!    other: their blocks are kept for the search below.
//! 3. **Delta debugging** (Zeller and Hildebrandt 2002, "Simplifying and isolating
//!    failure-inducing input", ddmin) over the testable flags: a test of a subset S runs
//!    the configuration with S at failing values and the other testable flags flipped.
//!    Outcomes are three-valued (fails / passes / unresolved, as ddmin allows); results
//!    are cached, and implied by monotonicity (a superset of a failing set fails, a
//!    subset of a passing set passes), which is the assumption that a failure needs its
//!    ingredients. The answer is 1-minimal: each of its flag values is needed.
//! 4. **The answer's claims at alpha**: it fails again as a fresh step (new blocks, new
//!    seeds; a test that would end ddmin runs as this re-test directly), and each of its
//!    values is needed: the configuration without it (or a tested superset of that
//!    without it) passes at alpha, from its blocks or by carrying its e-process on.
//!
//! **Error control.** ddmin steps decide at `navigate_alpha` ([`navigate_alpha`]:
//! 5 x alpha); the ends, re-tests and confirmations at `alpha`. A reported culprit of k
//! values rests on k + 1 claims at alpha (the re-test; per value, the configuration
//! without it passes, for k = 1 the verified passing end), so by the union bound it is
//! wrong with probability at most (k + 1) x alpha, given monotonicity. A navigation step's
//! error is not a claim: it can cost sessions or end inconclusive, never make a reported
//! answer wrong, because the answer's claims are re-decided at alpha. Carrying a step's
//! e-process on from 1/navigate_alpha to 1/alpha is valid: by Ville's inequality the
//! bound holds for the supremum over every look. The first claim that fails means a
//! navigation step erred: ddmin runs again, once, with every step at alpha (the blocks
//! kept, what was decided at the navigation level forgotten); a second failure, or a
//! claim undecided within `claim_cap_blocks`, is inconclusive with the reason.
//!
//! **A step** is a sequential A/B decided with [`crate::core::sequential`] (the
//! anytime-valid e-process of Turner, Ly and Grunwald 2021), twice over: the step against
//! the verified passing end ("fails" when the e-process implicates the step) and the
//! failing end against the step ("passes" when it implicates the failing end; also when
//! the step's interval against the passing end clears). Both ends' blocks are reused by
//! every step: the step's sessions, in session-index order, are cut into looks of
//! `look` sessions and paired with the passing end's looks of the same rank and with
//! every failing-end look run before the step's first evaluation
//! ([`Search::failing_pairs`]: unequal looks, fixed before its counts are read); a
//! reference runs another block only when a step needs looks it does not have yet. The
//! e-process against the passing end starts from the failing end's rate
//! ([`Search::step_prior`]: a plug-in prior from sessions it never reads). Every block
//! runs at the experiment's concurrency (never fewer sessions than that load). "Fails"
//! also needs the class mix of the step's corrupted sessions to match the failing end's
//! ([`super::mix`], Freeman-Halton exact test at `mix_alpha`): a different mix is a
//! different failure mode, reported and not merged ("unresolved" to ddmin). "Passes" is
//! blocked when a block's engine-side peak concurrency fell below `min_load_fraction`
//! of the target, or was not measured at all (a load-dependent bug cannot be ruled out
//! below its load, nor at a load nobody saw; `bisect run`'s rule for `cleared`); so is
//! the passing end standing in for "without it, it passes" of a one-value answer. A step that
//! reaches `step_cap_blocks` undecided (`claim_cap_blocks` at alpha), or whose own blocks
//! are degraded, is unresolved. The ends get twice their cap when their counts lean
//! towards a culprit over a background (differ by min_effect, the passing end at most
//! half the failing end's rate) before "no culprit" is considered.
//!
//! Budget: a block that would take the sessions spent past `budget` is not run; the
//! search stops there and says what it had.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::mix;
use crate::core::sequential::{
    mixture_confidence_sequence, ArmPrior, Decision, DesignGoal, Direction, LookRecord,
    PlugInPrior, SequentialDesign, SequentialState,
};
use crate::core::session::SessionClass;
use crate::core::stats;

/// Weight, in sessions, of the guesses a step's e-process against the passing end starts
/// from ([`Search::step_prior`]).
const PRIOR_SESSIONS: f64 = 10.0;

/// One listed flag: the value it has in the failing configuration and the value that
/// flips it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlagValues {
    pub name: String,
    pub failing: String,
    pub passing: String,
}

/// What the search needs besides its runner.
#[derive(Debug, Clone)]
pub struct SearchParams {
    pub flags: Vec<FlagValues>,
    /// Sessions per block: at least the load.
    pub block: u64,
    /// Sessions in flight in every block: the reproducing load.
    pub concurrency: u32,
    /// Sessions per sequential look (a block holds block / look looks).
    pub look: u64,
    /// Level of the ends and of the re-test: the claims the answer rests on.
    pub alpha: f64,
    /// Level of a ddmin step's decisions (either e-process): a wrong step steers the
    /// search; the answer is then re-tested at `alpha`.
    pub navigate_alpha: f64,
    pub min_effect: f64,
    pub clear_alpha: f64,
    pub degraded_fraction: f64,
    /// A configuration this many times slower than the failing end is degraded.
    pub slow_ratio: f64,
    pub min_load_fraction: f64,
    pub mix_alpha: f64,
    /// Sessions the whole search may spend.
    pub budget: u64,
    /// A step gives up (unresolved) after this many of its own blocks.
    pub step_cap_blocks: u64,
    /// The same for a step deciding at `alpha` (a re-test, a confirmation, any step once
    /// a navigation error was caught): a claim is worth more blocks than a direction.
    pub claim_cap_blocks: u64,
    /// Each end runs at most this many blocks before the ends are judged undecided.
    pub ends_cap_blocks: u64,
    /// Block b runs the workload with seed + b (fresh sessions every block).
    pub seed: u64,
}

impl SearchParams {
    /// Defaults for everything but the flags, the load and the budget.
    pub fn new(flags: Vec<FlagValues>, concurrency: u32, budget: u64, seed: u64) -> Self {
        SearchParams {
            flags,
            block: u64::from(concurrency).max(MIN_BLOCK),
            concurrency,
            look: LOOK_SESSIONS,
            alpha: 0.01,
            navigate_alpha: navigate_alpha(0.01),
            min_effect: 0.05,
            clear_alpha: 0.05,
            degraded_fraction: 0.10,
            slow_ratio: SLOW_RATIO,
            min_load_fraction: 0.9,
            mix_alpha: MIX_ALPHA,
            budget,
            step_cap_blocks: 3,
            claim_cap_blocks: 5,
            ends_cap_blocks: 3,
            seed,
        }
    }

    fn design(&self, alpha: f64) -> SequentialDesign {
        let goal = DesignGoal {
            alpha,
            min_effect: self.min_effect,
            clear_alpha: self.clear_alpha,
            block_per_arm: self.look,
            ..DesignGoal::default()
        };
        // The search's own caps end a step; the design's cap must never do it first.
        SequentialDesign::with_cap(goal, u64::MAX / 4).expect("validated policy")
    }
}

/// A block holds at least this many sessions, even at a low load: closed-loop driving
/// keeps the load while the sample grows.
pub const MIN_BLOCK: u64 = 80;
/// Level of the class-mix test. Low on purpose: a search tests the mix at every failing
/// step (up to a dozen), and a real change of failure mode (salad against no tool calls)
/// gives p far below it even on a dozen corrupted sessions.
pub const MIX_ALPHA: f64 = 0.001;
/// A ddmin step decides at `NAVIGATE_FACTOR * alpha` (0.05 at the default 0.01): its
/// errors cost sessions, not the answer, whose claims are re-decided at alpha (the
/// `//!` header). Chosen by the bench (mean over its nine scenarios): at 0.01 and 0.02
/// the searches cost more (656 and 646 sessions against 636) for no better accuracy; at
/// 0.1 they cost 633 but the worst scenario drops from 0.990 to 0.985.
pub const NAVIGATE_FACTOR: f64 = 5.0;

/// The level of a ddmin step for a search at `alpha`.
pub fn navigate_alpha(alpha: f64) -> f64 {
    (NAVIGATE_FACTOR * alpha).min(0.2)
}
/// A configuration whose fastest block drives fewer than 1/SLOW_RATIO of the tokens per
/// second of the failing end's slowest block is degraded: a slow fallback path, not a
/// same-speed toggle. 4x: the embedded engine's MMA fallback (SGLANG_SM120_MMA_FLASHMLA=0)
/// measured about 17x slower (26 s blocks against 1.5 s); blocks of one configuration on
/// a 2-core machine shared with builds varied by up to about 2x.
pub const SLOW_RATIO: f64 = 4.0;
/// Sessions per sequential look.
pub const LOOK_SESSIONS: u64 = 10;

/// Flags (indices into [`SearchParams::flags`]) at their failing values; the others
/// are flipped.
pub type FailingSet = BTreeSet<usize>;

/// One block to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRequest {
    /// 1-based, in the order the search asks for them.
    pub block: u64,
    /// Every listed flag -> the value to write.
    pub config: BTreeMap<String, String>,
    /// Names of the flags at their failing values.
    pub failing: Vec<String>,
    pub sessions: u64,
    pub concurrency: u32,
    pub seed: u64,
}

/// What one block gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockOutcome {
    /// Session classes in session-index order.
    pub classes: Vec<SessionClass>,
    /// Peak running requests of the busiest engine role; None when no role reports it.
    pub peak_engine: Option<u64>,
    pub wall_s: f64,
    /// Completion tokens per second of driving (restart and health wait left out); None
    /// when the engine reports no token counts. Compared with the failing end's to tell
    /// a same-speed toggle from a slow fallback path.
    #[serde(default)]
    pub tokens_per_s: Option<f64>,
    /// What the block could not check, one sentence each (a flag no engine reports);
    /// kept in the step log, so a resumed search still says it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Runs one configuration for one block: the only side effect of the search.
#[allow(async_fn_in_trait)]
pub trait StepRunner {
    async fn run_block(&mut self, request: &BlockRequest) -> anyhow::Result<BlockOutcome>;
}

/// What a step (or the ends) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Fails,
    Passes,
    /// Fails, but with a class mix unlike the reference failure's.
    OtherFailure,
    Degraded,
    Unresolved,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Failing end against passing end.
    Ends,
    /// A probe for the flag whose flip degrades the passing end.
    Degrade,
    Ddmin,
    Retest,
    /// A value of the answer shown needed at `alpha`: the configuration without it passes.
    Confirm,
}

/// One decided step, as culprit.json and the step log record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u32,
    pub kind: StepKind,
    /// The flags at their failing values (catalog names); the other listed ones flipped.
    pub failing: Vec<String>,
    pub outcome: Outcome,
    /// The step's own blocks.
    pub blocks: Vec<u64>,
    pub corrupted: u64,
    /// Classified sessions (error and timeout left out).
    pub classified: u64,
    pub sessions: u64,
    pub error_timeout: u64,
    /// The last look of the step against the passing end (the ends: failing vs passing).
    pub vs_passing: Option<LookRecord>,
    /// The last look of the failing end against the step.
    pub vs_failing: Option<LookRecord>,
    /// Freeman-Halton p of the step's corrupted-class mix against the failing end's.
    pub mix_p: Option<f64>,
    pub reason: String,
    /// The level its e-processes decided at: `navigate_alpha` for a ddmin step (until a
    /// navigation error is caught), `alpha` for the ends, re-tests and confirmations.
    #[serde(default)]
    pub alpha: Option<f64>,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Answer {
    /// The minimal failure-inducing set (indices), re-tested.
    Culprit {
        flags: Vec<usize>,
    },
    NoCulprit,
    CouldNotReproduce,
    Inconclusive,
}

/// A flag held out of the search, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Untestable {
    pub flag: usize,
    pub reason: String,
}

/// Everything the search found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchReport {
    pub answer: Answer,
    pub untestable: Vec<Untestable>,
    /// Steps that failed with another class mix: (failing flags, reason).
    pub other_failures: Vec<StepRecord>,
    pub steps: Vec<StepRecord>,
    pub blocks: Vec<(BlockRequest, BlockOutcome)>,
    pub sessions_spent: u64,
    /// One restart per block.
    pub restarts: u64,
    /// The verdict in words.
    pub verdict: String,
}

/// Why the search stopped before an answer.
enum Halt {
    Budget,
    /// The search ended early with this answer (could not reproduce, no culprit, ...).
    Answer(Answer, String),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Halt {
    fn from(e: anyhow::Error) -> Self {
        Halt::Failed(e)
    }
}

/// Whose blocks a step reads: a configuration and a generation (a re-test reads fresh
/// blocks of the same configuration).
type EvidenceKey = (FailingSet, u32);

/// Notified of every block and step as it happens (the step log).
pub trait Observer {
    fn block(&mut self, request: &BlockRequest, outcome: &BlockOutcome) -> anyhow::Result<()>;
    fn step(&mut self, step: &StepRecord) -> anyhow::Result<()>;
}

/// An observer that keeps nothing (simulations).
pub struct Silent;
impl Observer for Silent {
    fn block(&mut self, _: &BlockRequest, _: &BlockOutcome) -> anyhow::Result<()> {
        Ok(())
    }
    fn step(&mut self, _: &StepRecord) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Run the search to its answer. Errors only when the runner or the observer fails;
/// a spent budget is an answer (inconclusive, with what was found).
pub async fn search(
    params: &SearchParams,
    runner: &mut impl StepRunner,
    observer: &mut dyn Observer,
) -> anyhow::Result<SearchReport> {
    let mut s = Search {
        p: params,
        design: params.design(params.alpha),
        navigate: params.design(params.navigate_alpha),
        evidence: HashMap::new(),
        pinned: HashMap::new(),
        blocks: Vec::new(),
        steps: Vec::new(),
        held: BTreeSet::new(),
        untestable: Vec::new(),
        tested: Vec::new(),
        ends_verified: None,
        other_failures: Vec::new(),
        strict: false,
        retests: 0,
        final_tested: None,
        caught: Vec::new(),
    };
    let answer = match s.run(runner, observer).await {
        Ok(answer) => answer,
        Err(Halt::Budget) => (
            Answer::Inconclusive,
            format!(
                "inconclusive: the budget of {} sessions is spent ({})",
                params.budget,
                s.progress_words()
            ),
        ),
        Err(Halt::Answer(answer, words)) => (answer, words),
        Err(Halt::Failed(e)) => return Err(e),
    };
    let sessions_spent = s.blocks.iter().map(|(r, _)| r.sessions).sum();
    Ok(SearchReport {
        answer: answer.0,
        verdict: answer.1,
        untestable: s.untestable,
        other_failures: s.other_failures,
        steps: s.steps,
        restarts: s.blocks.len() as u64,
        blocks: s.blocks,
        sessions_spent,
    })
}

struct Search<'p> {
    p: &'p SearchParams,
    design: SequentialDesign,
    /// The design of a ddmin step's "fails" (at `navigate_alpha`).
    navigate: SequentialDesign,
    evidence: HashMap<EvidenceKey, Vec<BlockOutcome>>,
    /// What the failing end had shown when each configuration was first evaluated: fixes,
    /// before anything has read the configuration's corruption counts, how its looks pair
    /// with the failing end's and where its e-process starts.
    pinned: HashMap<EvidenceKey, Pinned>,
    blocks: Vec<(BlockRequest, BlockOutcome)>,
    steps: Vec<StepRecord>,
    /// Untestable flags: at their failing values in every configuration.
    held: BTreeSet<usize>,
    untestable: Vec<Untestable>,
    /// ddmin's cache: failing set (held flags included) -> outcome, and whether it was
    /// decided at the claims' level.
    tested: Vec<Tested>,
    /// The held set for which the passing end was verified against the failing end.
    ends_verified: Option<FailingSet>,
    other_failures: Vec<StepRecord>,
    /// Every step decides at `alpha` (after a navigation error was caught).
    strict: bool,
    /// Re-tests run: generation of the next re-test's evidence.
    retests: u32,
    /// The last test run as a re-test inside ddmin ([`Search::final_test`]).
    final_tested: Option<(EvidenceKey, Outcome, String)>,
    /// The navigation errors caught, in words.
    caught: Vec<String>,
}

/// The failing end as a configuration's first evaluation found it ([`Search::pin_pairing`]).
struct Pinned {
    failing_looks: usize,
    failing_rate: f64,
}

/// One entry of ddmin's cache.
struct Tested {
    set: FailingSet,
    outcome: Outcome,
    /// Decided at `alpha` (else at `navigate_alpha`).
    claim: bool,
}

/// The level a step decides at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// `navigate_alpha`: a ddmin step, whose error only steers the search.
    Navigate,
    /// `alpha`: a claim the answer rests on.
    Claim,
}

/// What the confirmation of an answer's values came to.
enum Confirmation {
    Confirmed,
    /// A value is not needed: the configuration without it fails at alpha.
    Refuted(String),
    /// A value could not be shown needed (undecided, degraded, another failure).
    Unconfirmed(String),
}

/// A step's state after reading the blocks it has.
enum Eval {
    Decided(Outcome, String),
    /// Run another block of this configuration.
    NeedStep,
    /// Run another block of the failing end.
    NeedFailing,
    /// Make the passing end usable, with at least this many looks.
    NeedPassing(usize),
}

/// Looks (corrupted, judged) of `look` sessions each, in session-index order across
/// blocks; a trailing partial look waits for the next block. Judged: neither failed
/// nor truncated at max_tokens (`SessionClass::is_judged`), as every rate.
fn looks_of(blocks: &[BlockOutcome], look: u64) -> Vec<(u64, u64)> {
    let all: Vec<SessionClass> = blocks
        .iter()
        .flat_map(|b| b.classes.iter().copied())
        .collect();
    all.chunks_exact(look as usize)
        .map(|chunk| {
            let classified = chunk.iter().filter(|c| c.is_judged()).count() as u64;
            let corrupted = chunk.iter().filter(|c| c.is_corrupted()).count() as u64;
            (corrupted, classified)
        })
        .collect()
}

struct Totals {
    corrupted: u64,
    classified: u64,
    sessions: u64,
    error_timeout: u64,
}

fn totals(blocks: &[BlockOutcome]) -> Totals {
    let all = || blocks.iter().flat_map(|b| b.classes.iter());
    Totals {
        corrupted: all().filter(|c| c.is_corrupted()).count() as u64,
        classified: all().filter(|c| c.is_judged()).count() as u64,
        sessions: all().count() as u64,
        error_timeout: all().filter(|c| c.is_failure()).count() as u64,
    }
}

fn pct(k: u64, n: u64) -> String {
    if n == 0 {
        "-".into()
    } else {
        format!("{k}/{n} = {:.1}%", 100.0 * k as f64 / n as f64)
    }
}

impl Search<'_> {
    fn all(&self) -> FailingSet {
        (0..self.p.flags.len()).collect()
    }

    fn testable(&self) -> Vec<usize> {
        (0..self.p.flags.len())
            .filter(|i| !self.held.contains(i))
            .collect()
    }

    fn names(&self, set: &FailingSet) -> Vec<String> {
        set.iter().map(|&i| self.p.flags[i].name.clone()).collect()
    }

    fn passing_end(&self) -> FailingSet {
        self.held.clone()
    }

    fn spent(&self) -> u64 {
        self.blocks.iter().map(|(r, _)| r.sessions).sum()
    }

    fn progress_words(&self) -> String {
        let untestable = if self.untestable.is_empty() {
            String::new()
        } else {
            format!(
                "; untestable: {}",
                self.untestable
                    .iter()
                    .map(|u| self.p.flags[u.flag].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!(
            "{} steps decided in {} blocks{untestable}",
            self.steps.len(),
            self.blocks.len()
        )
    }

    async fn run_block(
        &mut self,
        key: &EvidenceKey,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        if self.spent() + self.p.block > self.p.budget {
            return Err(Halt::Budget);
        }
        let number = self.blocks.len() as u64 + 1;
        let config = self
            .p
            .flags
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let value = if key.0.contains(&i) {
                    &f.failing
                } else {
                    &f.passing
                };
                (f.name.clone(), value.clone())
            })
            .collect();
        let request = BlockRequest {
            block: number,
            config,
            failing: self.names(&key.0),
            sessions: self.p.block,
            concurrency: self.p.concurrency,
            seed: self.p.seed.wrapping_add(number),
        };
        let outcome = runner.run_block(&request).await?;
        if outcome.classes.len() as u64 != request.sessions {
            return Err(Halt::Failed(anyhow::anyhow!(
                "block {number} returned {} sessions, asked for {}",
                outcome.classes.len(),
                request.sessions
            )));
        }
        observer.block(&request, &outcome)?;
        self.evidence
            .entry(key.clone())
            .or_default()
            .push(outcome.clone());
        self.blocks.push((request, outcome));
        Ok(())
    }

    /// Fix how the configuration at `key` pairs with the failing end, at its first
    /// evaluation. Until then only its speed and error share have been read (the
    /// degradation checks, the machine check), never its corruption counts, so the
    /// pairing cannot depend on the data it will weigh.
    fn pin_pairing(&mut self, key: &EvidenceKey) {
        if !self.blocks_of(key).is_empty() && !self.pinned.contains_key(key) {
            let failing = self.blocks_of(&(self.all(), 0));
            let t = totals(failing);
            let pinned = Pinned {
                failing_looks: looks_of(failing, self.p.look).len(),
                failing_rate: stats::rate(t.corrupted, t.classified),
            };
            self.pinned.insert(key.clone(), pinned);
        }
    }

    fn blocks_of(&self, key: &EvidenceKey) -> &[BlockOutcome] {
        self.evidence.get(key).map_or(&[], Vec::as_slice)
    }

    /// Why the configuration at `key` is not a same-speed toggle of the failing end, if
    /// it is not: too many sessions in error or timeout, or much slower.
    fn degraded(&self, key: &EvidenceKey) -> Option<String> {
        let blocks = self.blocks_of(key);
        let t = totals(blocks);
        if t.sessions > 0 && t.error_timeout as f64 > self.p.degraded_fraction * t.sessions as f64 {
            return Some(format!(
                "{} of {} sessions ended in error or timeout (over {:.0}%): not a same-speed toggle",
                t.error_timeout,
                t.sessions,
                100.0 * self.p.degraded_fraction
            ));
        }
        if key.0 == self.all() {
            return None; // the failing end is the speed reference
        }
        self.slower(blocks)
    }

    /// Speed against the failing end: the configuration's fastest block against the
    /// failing end's slowest, so a machine that slowed down during either is given the
    /// benefit of the doubt (when both are slow, the machine is, not the flag). Slower by
    /// more than `slow_ratio` is degraded.
    fn slower(&self, blocks: &[BlockOutcome]) -> Option<String> {
        let fastest = blocks
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
        let reference: Vec<f64> = self
            .blocks_of(&(self.all(), 0))
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .collect();
        let slowest = reference.iter().copied().reduce(f64::min)?;
        if slowest <= 0.0 || fastest * self.p.slow_ratio >= slowest {
            return None;
        }
        let ratio = if fastest > 0.0 {
            format!("{:.1}x slower", slowest / fastest)
        } else {
            "no tokens at all".to_string()
        };
        Some(format!(
            "it ran at {fastest:.0} tokens/s (its fastest of {} blocks) against {slowest:.0} tokens/s for the configuration as it is (its slowest of {}): {ratio}, over the {}x allowed: not a same-speed toggle",
            blocks.len(),
            reference.len(),
            self.p.slow_ratio
        ))
    }

    /// Hold `flag` at its failing value from now on, untestable, with the reason.
    fn hold_out(&mut self, flag: usize, how: &str, why: &str) {
        self.held.insert(flag);
        self.untestable.push(Untestable {
            flag,
            reason: format!(
                "flipping it {how}to {} degrades the engine ({why})",
                self.p.flags[flag].passing
            ),
        });
    }

    fn record_step(
        &mut self,
        kind: StepKind,
        key: &EvidenceKey,
        (outcome, reason): (Outcome, String),
        level: Level,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        self.pin_pairing(key);
        let blocks = self.blocks_of(key);
        let t = totals(blocks);
        let ids = self
            .blocks
            .iter()
            .filter(|(r, _)| self.names(&key.0) == r.failing)
            .map(|(r, _)| r.block)
            .collect::<Vec<_>>();
        // A re-test's own blocks are the last ones of its configuration.
        let own = blocks.len();
        let ids = ids[ids.len().saturating_sub(own)..].to_vec();
        let (vs_passing, vs_failing, mix_p) = if kind == StepKind::Ends {
            let (state, _) = self.ends_state();
            (state.looks().last().copied(), None, None)
        } else {
            let (vp, vf) = self.step_states(key, level);
            let mix_p = (t.corrupted > 0).then(|| self.mix_p(key));
            (
                vp.looks().last().copied(),
                vf.looks().last().copied(),
                mix_p,
            )
        };
        let record = StepRecord {
            step: self.steps.len() as u32 + 1,
            kind,
            failing: self.names(&key.0),
            outcome,
            blocks: ids,
            corrupted: t.corrupted,
            classified: t.classified,
            sessions: t.sessions,
            error_timeout: t.error_timeout,
            vs_passing,
            vs_failing,
            mix_p,
            reason,
            alpha: Some(match level {
                Level::Navigate => self.p.navigate_alpha,
                Level::Claim => self.p.alpha,
            }),
        };
        observer.step(&record)?;
        if outcome == Outcome::OtherFailure {
            self.other_failures.push(record.clone());
        }
        self.steps.push(record);
        Ok(())
    }

    async fn run(
        &mut self,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(Answer, String), Halt> {
        let fail_key = (self.all(), 0);
        // 1. The failing end first: nothing else means anything if it does not fail.
        self.run_block(&fail_key, runner, observer).await?;
        if let Some(why) = self.degraded(&fail_key) {
            let reason = format!("the configuration as it is is degraded: {why}");
            self.record_step(
                StepKind::Ends,
                &fail_key,
                (Outcome::Degraded, reason.clone()),
                Level::Claim,
                observer,
            )?;
            return Ok((
                Answer::CouldNotReproduce,
                format!("could not reproduce: {reason}; fix the deployment before searching"),
            ));
        }
        // 2. Every listed flag flipped. When that degrades the engine, some flip is not a
        // same-speed toggle: the search then starts at the finest granularity (one flag
        // flipped at a time, which is also how a flag whose flip alone degrades is found)
        // and verifies the passing end once the degrading flags are held out.
        self.run_block(&(self.passing_end(), 0), runner, observer)
            .await?;
        let finest = self.degraded(&(self.passing_end(), 0)).is_some();
        if finest {
            // Screening every flip costs a block per flag: first make sure the failing
            // end can fail at all (its own always-valid bounds), as the ends would.
            loop {
                let f = totals(self.blocks_of(&fail_key));
                let [lower, upper] = mixture_confidence_sequence(
                    f.corrupted,
                    f.classified,
                    self.p.clear_alpha / 2.0,
                );
                if upper < self.p.min_effect {
                    let figures = format!(
                        "the configuration as it is: {}, at {} sessions in flight; its always-valid upper bound {:.1}% is below the {:.0}-point effect sought",
                        pct(f.corrupted, f.classified),
                        self.p.concurrency,
                        100.0 * upper,
                        100.0 * self.p.min_effect
                    );
                    let (outcome, answer, words) = self.not_reproduced(&fail_key, &figures);
                    self.record_step(
                        StepKind::Ends,
                        &fail_key,
                        (outcome, words.clone()),
                        Level::Claim,
                        observer,
                    )?;
                    return Ok((answer, words));
                }
                let f_blocks = self.blocks_of(&fail_key).len() as u64;
                if lower > 0.0 || f_blocks >= self.p.ends_cap_blocks {
                    break;
                }
                self.run_block(&fail_key, runner, observer).await?;
            }
            self.screen_single_flips(runner, observer).await?;
        }
        self.ensure_passing_end(0, runner, observer).await?;
        // 3. ddmin over the testable flags, 4. the answer's claims at alpha. A claim that
        // does not hold is a navigation error caught: the search runs again once with
        // every step at alpha (the blocks it has are kept: each step's e-process carries
        // on from them).
        let (answer, retest_key) = loop {
            let testable = self.testable();
            let answer = self.ddmin(testable, finest, runner, observer).await?;
            self.ensure_passing_end(0, runner, observer).await?;
            let answer_set = self.with_held(answer.iter().copied());
            let (retest_key, outcome, reason) = match self.final_tested.take() {
                // ddmin ended on a set it tested as the re-test: fresh blocks, at alpha.
                Some((key, outcome, reason)) if key.0 == answer_set => (key, outcome, reason),
                _ => {
                    self.retests += 1;
                    let retest_key = (answer_set.clone(), self.retests);
                    let (outcome, reason) = self
                        .decide_and_record(
                            &retest_key,
                            Level::Claim,
                            |_| StepKind::Retest,
                            runner,
                            observer,
                        )
                        .await?;
                    (retest_key, outcome, reason)
                }
            };
            let shown = self.show(&answer);
            if outcome != Outcome::Fails {
                if outcome == Outcome::Passes {
                    self.tested.push(Tested {
                        set: answer_set,
                        outcome,
                        claim: true,
                    });
                }
                let why = format!("{shown} did not fail again on re-test ({reason})");
                if self.escalate(&why) {
                    continue;
                }
                return Ok((
                    Answer::Inconclusive,
                    format!(
                        "inconclusive: the minimal set {shown} did not fail again on re-test ({reason}){}; rerun with a larger --budget or check for flakiness{}",
                        self.caught_words(),
                        self.untestable_words()
                    ),
                ));
            }
            match self.confirm_needed(&answer, runner, observer).await? {
                Confirmation::Confirmed => break (answer, retest_key),
                Confirmation::Refuted(why) if self.escalate(&why) => continue,
                Confirmation::Refuted(why) | Confirmation::Unconfirmed(why) => {
                    return Ok((
                        Answer::Inconclusive,
                        format!(
                            "inconclusive: {shown} fails (re-tested: {reason}) but is not shown minimal: {why}{}{}",
                            self.caught_words(),
                            self.untestable_words()
                        ),
                    ));
                }
            }
        };
        let shown = self.show(&answer);
        let t = totals(self.blocks_of(&retest_key));
        let p = totals(self.blocks_of(&(self.passing_end(), 0)));
        let f = totals(self.blocks_of(&fail_key));
        let needed = if answer.len() > 1 {
            "each needed: flipping any one of them passes"
        } else {
            "flipping it passes"
        };
        let mut verdict = format!(
            "culprit: {shown} is the minimal failure-inducing set ({needed}, at alpha {}); re-tested: {} corrupted vs {} with every testable flag flipped (the configuration as it is: {}), at {} sessions in flight",
            self.p.alpha,
            pct(t.corrupted, t.classified),
            pct(p.corrupted, p.classified),
            pct(f.corrupted, f.classified),
            self.p.concurrency
        );
        verdict.push_str(&self.caught_words());
        verdict.push_str(&self.untestable_words());
        Ok((Answer::Culprit { flags: answer }, verdict))
    }

    /// A claim did not hold at alpha: a navigation step erred. Once: every step from now
    /// on decides at alpha, and ddmin forgets what it decided at the navigation level.
    /// False when the search already ran at alpha.
    fn escalate(&mut self, why: &str) -> bool {
        if self.strict {
            return false;
        }
        self.strict = true;
        self.tested.retain(|t| t.claim);
        self.caught.push(why.to_string());
        true
    }

    fn caught_words(&self) -> String {
        self.caught
            .iter()
            .map(|w| {
                format!(
                    "; searched again with every step at alpha {} after {w}",
                    self.p.alpha
                )
            })
            .collect()
    }

    /// Each value of `answer` is needed: the configuration without it (or a tested one
    /// without it that holds the rest of the answer, which passes only if it does, by
    /// monotonicity) passes at alpha. Decided from the blocks already run where they
    /// suffice; else the step's own e-process is carried on to 1/alpha (valid at any
    /// stopping time). A one-value answer needs nothing more here than the passing end's
    /// load: without it is the passing end, verified at alpha.
    async fn confirm_needed(
        &mut self,
        answer: &[usize],
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<Confirmation, Halt> {
        for &flag in answer {
            let without = self.with_held(answer.iter().copied().filter(|&x| x != flag));
            if without == self.passing_end() {
                // The verified passing end is this claim ("without it, it passes"): a
                // pass, so it needs the load as any step's does.
                let pass_key = (self.passing_end(), 0);
                if let Some(why) = self.load_unconfirmed(self.blocks_of(&pass_key)) {
                    return Ok(Confirmation::Unconfirmed(format!(
                        "{}={} could not be shown needed: the passing end passes, but {why}",
                        self.p.flags[flag].name, self.p.flags[flag].failing
                    )));
                }
                continue;
            }
            let mut candidates: Vec<FailingSet> = Vec::new();
            for t in &self.tested {
                let evidence = !t.set.contains(&flag)
                    && t.set.is_superset(&without)
                    && (t.outcome == Outcome::Passes || t.set == without)
                    && !self.blocks_of(&(t.set.clone(), 0)).is_empty();
                if evidence && !candidates.contains(&t.set) {
                    candidates.push(t.set.clone());
                }
            }
            let decided = candidates.iter().any(|c| {
                matches!(
                    self.evaluate(&(c.clone(), 0), Level::Claim),
                    Eval::Decided(Outcome::Passes, _)
                )
            });
            if decided {
                continue;
            }
            // The configuration itself if it ran, else the tested one with most blocks.
            let pick = if candidates.contains(&without) {
                without.clone()
            } else {
                candidates
                    .iter()
                    .max_by_key(|c| self.blocks_of(&((*c).clone(), 0)).len())
                    .cloned()
                    .unwrap_or_else(|| without.clone())
            };
            let key: EvidenceKey = (pick.clone(), 0);
            let (outcome, reason) = self
                .decide_and_record(&key, Level::Claim, |_| StepKind::Confirm, runner, observer)
                .await?;
            self.tested.retain(|t| t.set != pick);
            self.tested.push(Tested {
                set: pick.clone(),
                outcome,
                claim: true,
            });
            let name = format!("{}={}", self.p.flags[flag].name, self.p.flags[flag].failing);
            let config = format!("{{{}}}", self.names(&pick).join(", "));
            match outcome {
                Outcome::Passes => {}
                Outcome::Fails => {
                    return Ok(Confirmation::Refuted(format!(
                        "{name} is not needed: {config} fails without it at alpha ({reason})"
                    )))
                }
                _ => {
                    return Ok(Confirmation::Unconfirmed(format!(
                        "{name} could not be shown needed at alpha {}: {config} {reason}",
                        self.p.alpha
                    )))
                }
            }
        }
        Ok(Confirmation::Confirmed)
    }

    fn show(&self, set: &[usize]) -> String {
        format!(
            "{{{}}}",
            set.iter()
                .map(|&i| format!("{}={}", self.p.flags[i].name, self.p.flags[i].failing))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    fn untestable_words(&self) -> String {
        self.untestable
            .iter()
            .map(|u| {
                format!(
                    "; untestable: {} (held at {}: {})",
                    self.p.flags[u.flag].name, self.p.flags[u.flag].failing, u.reason
                )
            })
            .collect()
    }

    /// Halve the candidates until one flag is left whose flip degrades the passing end.
    async fn find_degrader(
        &mut self,
        why: String,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        let mut candidates = self.testable();
        let mut evidence = why;
        while candidates.len() > 1 {
            let half = candidates.len().div_ceil(2);
            let (first, second) = candidates.split_at(half);
            // Hold back the first half: its flags stay at their failing values.
            let key: EvidenceKey = (
                self.held
                    .iter()
                    .copied()
                    .chain(first.iter().copied())
                    .collect(),
                0,
            );
            if self.blocks_of(&key).is_empty() {
                self.run_block(&key, runner, observer).await?;
            }
            match self.degraded(&key) {
                Some(w) => {
                    self.record_step(
                        StepKind::Degrade,
                        &key,
                        (
                            Outcome::Degraded,
                            format!(
                                "still degraded with {} held back: {w}",
                                self.names(&first.iter().copied().collect()).join(", ")
                            ),
                        ),
                        Level::Claim,
                        observer,
                    )?;
                    evidence = w;
                    candidates = second.to_vec();
                }
                None => {
                    self.record_step(
                        StepKind::Degrade,
                        &key,
                        (
                            Outcome::Unresolved,
                            format!(
                                "not degraded with {} held back: the degrader is among them",
                                self.names(&first.iter().copied().collect()).join(", ")
                            ),
                        ),
                        Level::Claim,
                        observer,
                    )?;
                    candidates = first.to_vec();
                }
            }
        }
        let flag = candidates[0];
        // Confirm with the flag flipped alone: a degradation that comes and goes (a flip
        // near the timeout) can mislead the halving; then every flag is screened alone.
        let mut alone = self.all();
        alone.remove(&flag);
        let alone_key = (alone, 0);
        if self.blocks_of(&alone_key).is_empty() {
            self.run_block(&alone_key, runner, observer).await?;
        }
        if self.slower(self.blocks_of(&alone_key)).is_some() {
            self.machine_check(std::slice::from_ref(&alone_key), runner, observer)
                .await?;
        }
        if self.degraded(&alone_key).is_none() {
            let before = self.held.len();
            self.screen_single_flips(runner, observer).await?;
            if self.held.len() > before {
                return Ok(());
            }
            self.hold_out(
                flag,
                "",
                &format!("together with the other flips: {evidence}; though not alone"),
            );
            return Ok(());
        }
        let alone = self.degraded(&alone_key).unwrap_or_default();
        self.hold_out(
            flag,
            "",
            &format!("alone: {alone}; with the other flips: {evidence}"),
        );
        Ok(())
    }

    fn ends_state(&self) -> (SequentialState, Vec<(u64, u64)>) {
        let pass_key = (self.passing_end(), 0);
        let f = self.failing_pairs(&pass_key);
        let p = looks_of(self.blocks_of(&pass_key), self.p.look);
        let mut state = SequentialState::new(self.design);
        for (a, b) in f.iter().zip(&p) {
            if state.look(*a, *b).expect("counts from classes").is_final() {
                break;
            }
        }
        (state, f)
    }

    /// One block of each flag flipped alone (every other flag as found): a flag whose
    /// flip alone degrades the engine is held out as untestable. The blocks that did not
    /// degrade are ddmin's first complement tests, kept for it.
    async fn screen_single_flips(
        &mut self,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        let singles: Vec<(usize, EvidenceKey)> = self
            .testable()
            .into_iter()
            .map(|flag| {
                let mut set = self.all();
                set.remove(&flag);
                (flag, (set, 0))
            })
            .collect();
        for (_, key) in &singles {
            if self.blocks_of(key).is_empty() {
                self.run_block(key, runner, observer).await?;
            }
        }
        let slow: Vec<EvidenceKey> = singles
            .iter()
            .filter(|(_, k)| self.slower(self.blocks_of(k)).is_some())
            .map(|(_, k)| k.clone())
            .collect();
        self.machine_check(&slow, runner, observer).await?;
        for (flag, key) in singles {
            if let Some(why) = self.degraded(&key) {
                self.record_step(
                    StepKind::Degrade,
                    &key,
                    (Outcome::Degraded, why.clone()),
                    Level::Claim,
                    observer,
                )?;
                self.hold_out(flag, "alone ", &why);
            }
        }
        Ok(())
    }

    /// Before a flag is blamed for slowness: if the failing end has not run since the
    /// slow blocks of `keys`, run it once more now. A machine that slowed down slows the
    /// failing end too, and its slowest block is the speed reference, so the flag is then
    /// not blamed; the block is evidence like any other of the failing end.
    async fn machine_check(
        &mut self,
        keys: &[EvidenceKey],
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        let last_of = |failing: &[String], blocks: &[(BlockRequest, BlockOutcome)]| {
            blocks
                .iter()
                .filter(|(r, _)| r.failing == failing)
                .map(|(r, _)| r.block)
                .max()
        };
        let failing_last = last_of(&self.names(&self.all()), &self.blocks).unwrap_or(0);
        let slow_last = keys
            .iter()
            .filter_map(|k| last_of(&self.names(&k.0), &self.blocks))
            .max();
        if slow_last.is_some_and(|slow| slow > failing_last) {
            self.run_block(&(self.all(), 0), runner, observer).await?;
        }
        Ok(())
    }

    /// Make the passing end (every testable flag flipped) usable as a reference: not
    /// degraded (else find the flag that degrades it), verified against the failing end
    /// (else the search ends here with that answer), with at least `looks` looks.
    async fn ensure_passing_end(
        &mut self,
        looks: usize,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        loop {
            let key = (self.passing_end(), 0);
            if self.blocks_of(&key).is_empty() {
                self.run_block(&key, runner, observer).await?;
                continue;
            }
            if let Some(why) = self.degraded(&key) {
                if self.testable().is_empty() {
                    return Err(Halt::Answer(
                        Answer::Inconclusive,
                        format!(
                            "inconclusive: every listed flag is untestable{}",
                            self.untestable_words()
                        ),
                    ));
                }
                self.find_degrader(why, runner, observer).await?;
                continue;
            }
            if self.ends_verified.as_ref() != Some(&self.held) {
                self.verify_ends(runner, observer).await?;
                continue;
            }
            if looks_of(self.blocks_of(&key), self.p.look).len() >= looks {
                return Ok(());
            }
            self.run_block(&key, runner, observer).await?;
        }
    }

    /// The failing end against the passing end (which is not degraded). Returns once
    /// both are verified; any other end of the ends is the search's answer.
    async fn verify_ends(
        &mut self,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
        let fail_key = (self.all(), 0);
        loop {
            let pass_key = (self.passing_end(), 0);
            if self.degraded(&pass_key).is_some() {
                // A later block of the passing end degraded: the caller holds out again.
                return Ok(());
            }
            self.pin_pairing(&pass_key);
            let (state, _) = self.ends_state();
            let f = totals(self.blocks_of(&fail_key));
            let p = totals(self.blocks_of(&pass_key));
            let f_bounds =
                mixture_confidence_sequence(f.corrupted, f.classified, self.p.clear_alpha / 2.0);
            let p_bounds =
                mixture_confidence_sequence(p.corrupted, p.classified, self.p.clear_alpha / 2.0);
            let words = format!(
                "the configuration as it is: {}, every testable flag flipped: {}, at {} sessions in flight",
                pct(f.corrupted, f.classified),
                pct(p.corrupted, p.classified),
                self.p.concurrency
            );
            let decision = state.decision();
            let end: Option<(Outcome, Option<(Answer, String)>)> = if matches!(
                decision,
                Some(Decision::Implicated {
                    direction: Direction::On
                })
            ) {
                Some((Outcome::Fails, None))
            } else if f_bounds[1] < self.p.min_effect {
                let figures = format!(
                    "{words}; the failing end's always-valid upper bound {:.1}% is below the {:.0}-point effect sought",
                    100.0 * f_bounds[1],
                    100.0 * self.p.min_effect
                );
                let (outcome, answer, words) = self.not_reproduced(&fail_key, &figures);
                Some((outcome, Some((answer, words))))
            } else if matches!(
                decision,
                Some(Decision::Implicated {
                    direction: Direction::Off
                })
            ) || (matches!(decision, Some(Decision::Cleared)) && f_bounds[0] > 0.0)
            {
                Some((Outcome::Fails, Some(no_culprit(&words))))
            } else {
                let f_blocks = self.blocks_of(&fail_key).len() as u64;
                let p_blocks = self.blocks_of(&pass_key).len() as u64;
                // Ends that differ by min_effect or more on their counts, the passing end at
                // most half the failing end's rate, undecided at the cap, are likely a
                // culprit over a background rate that fails the passing end too: they get
                // as many blocks again before "no culprit" is considered.
                let (f_rate, p_rate) = (
                    stats::rate(f.corrupted, f.classified),
                    stats::rate(p.corrupted, p.classified),
                );
                let leaning = f_rate - p_rate >= self.p.min_effect && f_rate >= 2.0 * p_rate;
                let cap = if leaning {
                    2 * self.p.ends_cap_blocks
                } else {
                    self.p.ends_cap_blocks
                };
                if f_blocks >= cap && p_blocks >= cap {
                    if leaning {
                        Some((
                            Outcome::Unresolved,
                            Some((
                                Answer::Inconclusive,
                                format!(
                                    "inconclusive: the ends differ but not at alpha {} after {cap} blocks each ({words})",
                                    self.p.alpha
                                ),
                            )),
                        ))
                    } else if p_bounds[0] > 0.0 {
                        Some((Outcome::Fails, Some(no_culprit(&words))))
                    } else {
                        Some((
                            Outcome::Unresolved,
                            Some((
                                Answer::Inconclusive,
                                format!("inconclusive: the ends could not be told apart ({words})"),
                            )),
                        ))
                    }
                } else {
                    // The end with fewer blocks runs next (the failing end on ties: its
                    // upper bound is what can stop a search that cannot reproduce).
                    let key = if f_blocks <= p_blocks {
                        fail_key.clone()
                    } else {
                        pass_key
                    };
                    self.run_block(&key, runner, observer).await?;
                    None
                }
            };
            if let Some((outcome, answer)) = end {
                let reason = match &answer {
                    Some((_, words)) => words.clone(),
                    None => format!("both ends verified: {words}"),
                };
                self.record_step(
                    StepKind::Ends,
                    &fail_key,
                    (outcome, reason),
                    Level::Claim,
                    observer,
                )?;
                if let Some((a, w)) = answer {
                    return Err(Halt::Answer(a, format!("{w}{}", self.untestable_words())));
                }
                self.ends_verified = Some(self.held.clone());
                self.tested.push(Tested {
                    set: self.all(),
                    outcome: Outcome::Fails,
                    claim: true,
                });
                self.tested.push(Tested {
                    set: self.held.clone(),
                    outcome: Outcome::Passes,
                    claim: true,
                });
                return Ok(());
            }
        }
    }

    fn passing_ok(&self) -> bool {
        self.ends_verified.as_ref() == Some(&self.held)
    }

    /// The failing end's looks paired with each look of the configuration at `key`, as
    /// far as the failing end has them. The pairing is fixed by what existed when the
    /// configuration was first evaluated (`pinned`: m looks), never by its own data,
    /// so the e-process stays valid: with m >= 2L (L looks per block), look i
    /// of the first block pairs with the r = m / L failing looks r i .. r i + r - 1
    /// (merged), so every failing-end session already run counts, instead of the first
    /// block's alone; later looks pair one to one with the failing end's looks from r L
    /// on. Turner, Ly and Grunwald's e-variable allows any group sizes per look
    /// (`block_log_e_value`), and a failing end with two blocks against a step's one is
    /// what the search has whenever the machine check has run: the claims "without this
    /// value it passes" then decide in the step's first block far more often.
    fn failing_pairs(&self, key: &EvidenceKey) -> Vec<(u64, u64)> {
        let f = looks_of(self.blocks_of(&(self.all(), 0)), self.p.look);
        if key.0 == self.all() {
            return f;
        }
        let per_block = (self.p.block / self.p.look).max(1) as usize;
        let m = self.pinned.get(key).map_or(f.len(), |p| p.failing_looks);
        let r = (m / per_block).max(1);
        let steps = looks_of(self.blocks_of(key), self.p.look)
            .len()
            .max(per_block);
        let mut out = Vec::new();
        for i in 0..steps {
            let range = if i < per_block {
                r * i..r * i + r
            } else {
                r * per_block + (i - per_block)..r * per_block + (i - per_block) + 1
            };
            if range.end > f.len() {
                break;
            }
            out.push(
                f[range]
                    .iter()
                    .fold((0, 0), |(k, n), &(dk, dn)| (k + dk, n + dn)),
            );
        }
        out
    }

    /// Where a step's e-process against the passing end (step "on", passing end "off")
    /// starts its plug-in estimates: the step is guessed to fail like the failing end did
    /// when the step was first evaluated (sessions this e-process never reads), the
    /// passing end to be clean, each guess worth [`PRIOR_SESSIONS`] sessions. Without it
    /// both start at 1/2, where the first look's e-value is exactly 1 and the next ones
    /// learn the rates slowly; the data outweigh a wrong guess within a block. The e-process
    /// against the failing end keeps safestats' uninformed start: a guess there could only
    /// come from the passing end, and it made "passes" decide on an unusually high sample
    /// of the failing end more often (README, culprit bench).
    fn step_prior(&self, key: &EvidenceKey) -> PlugInPrior {
        let failing = self.pinned.get(key).map_or_else(
            || {
                let t = totals(self.blocks_of(&(self.all(), 0)));
                stats::rate(t.corrupted, t.classified)
            },
            |p| p.failing_rate,
        );
        PlugInPrior {
            on: ArmPrior::guess(failing, PRIOR_SESSIONS),
            off: ArmPrior::guess(0.0, PRIOR_SESSIONS),
        }
    }

    fn step_states(&self, key: &EvidenceKey, level: Level) -> (SequentialState, SequentialState) {
        let s = looks_of(self.blocks_of(key), self.p.look);
        let p = if self.passing_ok() {
            looks_of(self.blocks_of(&(self.passing_end(), 0)), self.p.look)
        } else {
            Vec::new()
        };
        let f = self.failing_pairs(key);
        let design = match level {
            Level::Navigate => self.navigate,
            Level::Claim => self.design,
        };
        let mut vp = SequentialState::with_prior(design, self.step_prior(key));
        let mut vf = SequentialState::new(design);
        // Each e-process reads the looks its reference has: a step leaning one way only
        // needs more of the reference that can decide it (see `evaluate`).
        for i in 0..s.len() {
            if vp.decision().is_none() && i < p.len() {
                vp.look(s[i], p[i]).expect("counts from classes");
            }
            if vf.decision().is_none() && i < f.len() {
                vf.look(f[i], s[i]).expect("counts from classes");
            }
            if step_verdict(&vp, &vf).is_some() {
                break;
            }
        }
        (vp, vf)
    }

    fn mix_p(&self, key: &EvidenceKey) -> f64 {
        let step = mix::corrupted_mix(self.blocks_of(key).iter().flat_map(|b| b.classes.iter()));
        let reference = mix::corrupted_mix(
            self.blocks_of(&(self.all(), 0))
                .iter()
                .flat_map(|b| b.classes.iter()),
        );
        mix::mix_p_value(&step, &reference)
    }

    fn evaluate(&self, key: &EvidenceKey, level: Level) -> Eval {
        let blocks = self.blocks_of(key);
        if blocks.is_empty() {
            return Eval::NeedStep;
        }
        if let Some(why) = self.degraded(key) {
            return Eval::Decided(Outcome::Degraded, why);
        }
        let (vp, vf) = self.step_states(key, level);
        let t = totals(blocks);
        match step_verdict(&vp, &vf) {
            Some(Outcome::Fails) => {
                let p = self.mix_p(key);
                if p < self.p.mix_alpha {
                    let step = mix::corrupted_mix(blocks.iter().flat_map(|b| b.classes.iter()));
                    return Eval::Decided(
                        Outcome::OtherFailure,
                        format!(
                            "fails ({}) with another class mix than the reference failure (leak/bad/wrong/no_tool {}/{}/{}/{}; Freeman-Halton p = {p:.2e}): a different failure mode",
                            pct(t.corrupted, t.classified),
                            step[0], step[1], step[2], step[3]
                        ),
                    );
                }
                Eval::Decided(
                    Outcome::Fails,
                    format!(
                        "fails: {} corrupted, e-value {:.0} against the passing end, class mix as the reference (p = {p:.2})",
                        pct(t.corrupted, t.classified),
                        vp.e_value()
                    ),
                )
            }
            Some(Outcome::Passes) => {
                if let Some(why) = self.load_unconfirmed(blocks) {
                    return Eval::Decided(
                        Outcome::Unresolved,
                        format!(
                            "passes ({}) but {why}: a load-dependent failure is not ruled out",
                            pct(t.corrupted, t.classified),
                        ),
                    );
                }
                Eval::Decided(
                    Outcome::Passes,
                    format!(
                        "passes: {} corrupted, e-value {:.0} for the failing end against it",
                        pct(t.corrupted, t.classified),
                        vf.e_value()
                    ),
                )
            }
            _ => {
                let s = looks_of(blocks, self.p.look).len();
                let f = self.failing_pairs(key).len();
                let pass_key = (self.passing_end(), 0);
                // Which reference can decide it: a step whose rate is nearer the failing
                // end's can only come to "fails", against the passing end; one nearer the
                // passing end's, to "passes", against the failing end. Only that one runs
                // another block (the other keeps the looks it has).
                let fr = totals(self.blocks_of(&(self.all(), 0)));
                let pr = totals(self.blocks_of(&pass_key));
                let rate = stats::rate(t.corrupted, t.classified);
                let leans_fails = self.passing_ok()
                    && rate - stats::rate(pr.corrupted, pr.classified)
                        >= stats::rate(fr.corrupted, fr.classified) - rate;
                if f < s && !leans_fails {
                    return Eval::NeedFailing;
                }
                if self.passing_ok() {
                    if leans_fails && looks_of(self.blocks_of(&pass_key), self.p.look).len() < s {
                        return Eval::NeedPassing(s);
                    }
                } else {
                    // Without a usable passing end only "passes" can be decided. One that
                    // was never run is cheap to try; one that degraded costs a search for
                    // the degrading flag, worth it only once the step alone is stuck.
                    let tried = !self.blocks_of(&pass_key).is_empty();
                    if !tried || blocks.len() >= 2 {
                        return Eval::NeedPassing(s);
                    }
                }
                let cap = match level {
                    Level::Navigate => self.p.step_cap_blocks,
                    Level::Claim => self.p.claim_cap_blocks,
                };
                if blocks.len() as u64 >= cap {
                    return Eval::Decided(
                        Outcome::Unresolved,
                        format!(
                            "undecided after {} sessions ({} corrupted)",
                            t.sessions,
                            pct(t.corrupted, t.classified)
                        ),
                    );
                }
                Eval::NeedStep
            }
        }
    }

    /// The answer when the failing end did not fail (`figures`: its rate and bound).
    /// "Could not reproduce" is a claim about the load asked for, so it needs that load
    /// shown on the engine side, as a pass does: a build whose engine never ran more
    /// than a few requests at once (a capped max running requests, KV memory) would
    /// otherwise send the user to raise `--concurrency`, which changes nothing there.
    fn not_reproduced(&self, fail_key: &EvidenceKey, figures: &str) -> (Outcome, Answer, String) {
        match self.load_unconfirmed(self.blocks_of(fail_key)) {
            Some(why) => (
                Outcome::Unresolved,
                Answer::Inconclusive,
                format!(
                    "inconclusive: the configuration as it is did not fail, but not at the load asked: {why}; find what holds the engine back (its max running requests, KV memory, metrics) and search again ({figures})"
                ),
            ),
            None => (
                Outcome::Passes,
                Answer::CouldNotReproduce,
                format!("could not reproduce: raise --concurrency or the workload ({figures})"),
            ),
        }
    }

    /// Why `blocks` cannot show a pass at the experiment's load (`bisect run`'s rule for
    /// `cleared`): a block whose busiest engine role peaked below `min_load_fraction` of
    /// the target concurrency, or one no engine role measured at all (no metrics: the
    /// load is unconfirmed, as in `run`, never taken for granted).
    fn load_unconfirmed(&self, blocks: &[BlockOutcome]) -> Option<String> {
        let unmeasured = blocks.iter().filter(|b| b.peak_engine.is_none()).count();
        if unmeasured > 0 {
            return Some(format!(
                "{unmeasured} of its {} blocks had no engine-side load measurement (no role's \
                 metrics reported running requests), so the {} in flight targeted are unconfirmed",
                blocks.len(),
                self.p.concurrency
            ));
        }
        let target = self.p.min_load_fraction * f64::from(self.p.concurrency);
        let low = blocks
            .iter()
            .filter_map(|b| b.peak_engine)
            .filter(|&peak| (peak as f64) < target)
            .min()?;
        Some(format!(
            "the engines peaked at {low} running requests, below {:.0}% of the {} targeted",
            100.0 * self.p.min_load_fraction,
            self.p.concurrency
        ))
    }

    /// Run blocks until the step at `key` is decided.
    async fn decide_step(
        &mut self,
        key: &EvidenceKey,
        level: Level,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(Outcome, String), Halt> {
        loop {
            self.pin_pairing(key);
            match self.evaluate(key, level) {
                Eval::Decided(outcome, reason) => return Ok((outcome, reason)),
                Eval::NeedStep => self.run_block(key, runner, observer).await?,
                Eval::NeedFailing => self.run_block(&(self.all(), 0), runner, observer).await?,
                Eval::NeedPassing(looks) => {
                    let held = self.held.clone();
                    self.ensure_passing_end(looks, runner, observer).await?;
                    if self.held != held {
                        // A flag was held out on the way: this configuration is gone.
                        return Ok((
                            Outcome::Unresolved,
                            "a flag it flips was held out as untestable meanwhile".into(),
                        ));
                    }
                }
            }
        }
    }

    /// [`Search::decide_step`], then the step recorded as `kind_of(outcome)`.
    async fn decide_and_record(
        &mut self,
        key: &EvidenceKey,
        level: Level,
        kind_of: impl FnOnce(Outcome) -> StepKind,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(Outcome, String), Halt> {
        let (outcome, reason) = self.decide_step(key, level, runner, observer).await?;
        self.record_step(
            kind_of(outcome),
            key,
            (outcome, reason.clone()),
            level,
            observer,
        )?;
        Ok((outcome, reason))
    }

    /// The outcome of the configuration with `subset` (testable flags) failing and every
    /// other testable flag flipped: cached, implied by monotonicity, or run as a step.
    async fn test(
        &mut self,
        subset: &[usize],
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<Outcome, Halt> {
        let set = self.with_held(subset.iter().copied());
        if let Some(outcome) = self.cached(&set) {
            return Ok(outcome);
        }
        let level = if self.strict {
            Level::Claim
        } else {
            Level::Navigate
        };
        let key: EvidenceKey = (set.clone(), 0);
        let (outcome, _) = self
            .decide_and_record(&key, level, |_| StepKind::Ddmin, runner, observer)
            .await?;
        self.tested.push(Tested {
            set,
            outcome,
            claim: level == Level::Claim,
        });
        Ok(outcome)
    }

    /// The failing set of a configuration: the given testable flags failing, and the
    /// held-out ones, which every step keeps at their failing values.
    fn with_held(&self, failing: impl Iterator<Item = usize>) -> FailingSet {
        failing.chain(self.held.iter().copied()).collect()
    }

    /// The outcome of `set` as ddmin's cache has it: tested, or implied by monotonicity
    /// (a superset of a failing set fails, a subset of a passing set passes).
    fn cached(&self, set: &FailingSet) -> Option<Outcome> {
        if let Some(t) = self.tested.iter().rev().find(|t| &t.set == set) {
            return Some(t.outcome);
        }
        self.tested
            .iter()
            .find(|t| {
                (t.outcome == Outcome::Fails && t.set.is_subset(set))
                    || (t.outcome == Outcome::Passes && t.set.is_superset(set))
            })
            .map(|t| t.outcome)
    }

    /// Whether `subset` failing would end ddmin with it as the answer: every one-smaller
    /// subset of it is known to pass (cached, or implied by a passing superset), and it
    /// was never tested.
    fn would_end(&self, subset: &[usize]) -> bool {
        let whole = self.with_held(subset.iter().copied());
        if subset.is_empty() || self.cached(&whole).is_some() {
            return false;
        }
        subset.iter().all(|&x| {
            let smaller = self.with_held(subset.iter().copied().filter(|&y| y != x));
            self.tested
                .iter()
                .any(|t| t.outcome == Outcome::Passes && t.set.is_superset(&smaller))
        })
    }

    /// A test that can only end the search, so it is the answer's re-test: fresh blocks
    /// decided at alpha, never at the navigation level.
    async fn final_test(
        &mut self,
        subset: &[usize],
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<Outcome, Halt> {
        let set = self.with_held(subset.iter().copied());
        // Its own blocks when it has none yet (they are fresh, and a confirmation finds
        // them there), else a new generation.
        let key: EvidenceKey = if self.blocks_of(&(set.clone(), 0)).is_empty() {
            (set.clone(), 0)
        } else {
            self.retests += 1;
            (set.clone(), self.retests)
        };
        // Failing, it is the answer's re-test; otherwise a ddmin step decided at alpha.
        let kind_of = |outcome| {
            if outcome == Outcome::Fails {
                StepKind::Retest
            } else {
                StepKind::Ddmin
            }
        };
        let (outcome, reason) = self
            .decide_and_record(&key, Level::Claim, kind_of, runner, observer)
            .await?;
        self.tested.push(Tested {
            set,
            outcome,
            claim: true,
        });
        self.final_tested = Some((key, outcome, reason));
        Ok(outcome)
    }

    /// Zeller's ddmin with a three-valued test. Standard (from halves, subsets before
    /// complements) unless `finest`: then from single flags, complements first, so the
    /// first tests flip one flag at a time from the failing configuration, and a flag
    /// whose flip alone degrades the engine is held out as untestable.
    async fn ddmin(
        &mut self,
        delta: Vec<usize>,
        finest: bool,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<Vec<usize>, Halt> {
        let mut c = delta;
        let mut n = if finest { c.len().max(2) } else { 2 };
        'search: while c.len() >= 2 {
            let parts = split(&c, n);
            let orders: [bool; 2] = if finest { [true, false] } else { [false, true] };
            for complements in orders {
                if complements && n == 2 && !finest {
                    continue; // with two parts, complements are the subsets
                }
                for part in &parts {
                    let candidate: Vec<usize> = if complements {
                        c.iter().copied().filter(|x| !part.contains(x)).collect()
                    } else {
                        part.clone()
                    };
                    let flipped_alone =
                        complements && part.len() == 1 && c.len() == self.testable().len();
                    let outcome = if self.would_end(&candidate) {
                        self.final_test(&candidate, runner, observer).await?
                    } else {
                        self.test(&candidate, runner, observer).await?
                    };
                    match outcome {
                        Outcome::Fails => {
                            c = candidate;
                            n = if complements { (n - 1).max(2) } else { 2 };
                            continue 'search;
                        }
                        Outcome::Degraded if flipped_alone => {
                            let flag = part[0];
                            let why = self
                                .steps
                                .last()
                                .map(|s| s.reason.clone())
                                .unwrap_or_default();
                            self.hold_out(flag, "alone ", &why);
                            c.retain(|&x| x != flag);
                            n = n.min(c.len()).max(2);
                            continue 'search;
                        }
                        _ => {}
                    }
                }
            }
            if n >= c.len() {
                break;
            }
            n = (2 * n).min(c.len());
        }
        Ok(c)
    }
}

fn no_culprit(words: &str) -> (Answer, String) {
    (
        Answer::NoCulprit,
        format!("no culprit among the listed flags: with every one of them flipped it still fails ({words})"),
    )
}

/// A step's outcome from its two e-processes, or None while undecided. "Fails" wins a
/// tie: the step reproduces the failure, at whatever rate.
fn step_verdict(vs_passing: &SequentialState, vs_failing: &SequentialState) -> Option<Outcome> {
    match (vs_passing.decision(), vs_failing.decision()) {
        (
            Some(Decision::Implicated {
                direction: Direction::On,
            }),
            _,
        ) => Some(Outcome::Fails),
        (
            Some(Decision::Implicated {
                direction: Direction::Off,
            }),
            _,
        )
        | (Some(Decision::Cleared), _)
        | (
            _,
            Some(Decision::Implicated {
                direction: Direction::On,
            }),
        ) => Some(Outcome::Passes),
        _ => None,
    }
}

/// `items` cut into `n` consecutive parts of nearly equal size, larger parts first
/// (numpy's `array_split`).
pub fn split(items: &[usize], n: usize) -> Vec<Vec<usize>> {
    let n = n.clamp(1, items.len().max(1));
    let (base, extra) = (items.len() / n, items.len() % n);
    let mut parts = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        parts.push(items[start..start + len].to_vec());
        start += len;
    }
    parts
}
