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
//!    threshold: not a same-speed toggle), one degrader at a time is found by halving:
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
//! 4. **Re-test**: the answer runs again as a fresh step (new blocks, new seeds) and
//!    must fail again before it is reported.
//!
//! **A step** is a sequential A/B decided with [`crate::core::sequential`] (the
//! anytime-valid e-process of Turner, Ly and Grunwald 2021), twice over: the step against
//! the verified passing end ("fails" when the e-process implicates the step) and the
//! failing end against the step ("passes" when it implicates the failing end; also when
//! the step's interval against the passing end clears). Both ends' blocks are reused by
//! every step: the step's sessions, in session-index order, are cut into looks of
//! `look` sessions and paired with the references' looks of the same rank; a reference
//! runs another block only when a step needs looks it does not have yet. Every block
//! runs at the experiment's concurrency (never fewer sessions than that load). "Fails"
//! also needs the class mix of the step's corrupted sessions to match the failing end's
//! ([`super::mix`], Freeman-Halton exact test at `mix_alpha`): a different mix is a
//! different failure mode, reported and not merged ("unresolved" to ddmin). "Passes" is
//! blocked when a block's engine-side peak concurrency fell below `min_load_fraction`
//! of the target (a load-dependent bug cannot be ruled out below its load). A step that
//! reaches `step_cap_blocks` undecided, or whose own blocks are degraded, is unresolved.
//!
//! Budget: a block that would take the sessions spent past `budget` is not run; the
//! search stops there and says what it had.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::mix;
use crate::core::sequential::{
    mixture_confidence_sequence, Decision, DesignGoal, Direction, LookRecord, SequentialDesign,
    SequentialState,
};
use crate::core::session::SessionClass;

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
    pub min_load_fraction: f64,
    pub mix_alpha: f64,
    /// Sessions the whole search may spend.
    pub budget: u64,
    /// A step gives up (unresolved) after this many of its own blocks.
    pub step_cap_blocks: u64,
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
            navigate_alpha: NAVIGATE_ALPHA,
            min_effect: 0.05,
            clear_alpha: 0.05,
            degraded_fraction: 0.10,
            min_load_fraction: 0.9,
            mix_alpha: MIX_ALPHA,
            budget,
            step_cap_blocks: 3,
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
/// Level of a ddmin step's decisions.
pub const NAVIGATE_ALPHA: f64 = 0.05;
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
        blocks: Vec::new(),
        steps: Vec::new(),
        held: BTreeSet::new(),
        untestable: Vec::new(),
        tested: Vec::new(),
        ends_verified: None,
        other_failures: Vec::new(),
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
    blocks: Vec<(BlockRequest, BlockOutcome)>,
    steps: Vec<StepRecord>,
    /// Untestable flags: at their failing values in every configuration.
    held: BTreeSet<usize>,
    untestable: Vec<Untestable>,
    /// ddmin's cache: failing set (held flags included) -> outcome.
    tested: Vec<(FailingSet, Outcome)>,
    /// The held set for which the passing end was verified against the failing end.
    ends_verified: Option<FailingSet>,
    other_failures: Vec<StepRecord>,
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

/// Looks (corrupted, classified) of `look` sessions each, in session-index order across
/// blocks; a trailing partial look waits for the next block.
fn looks_of(blocks: &[BlockOutcome], look: u64) -> Vec<(u64, u64)> {
    let all: Vec<SessionClass> = blocks
        .iter()
        .flat_map(|b| b.classes.iter().copied())
        .collect();
    all.chunks_exact(look as usize)
        .map(|chunk| {
            let classified = chunk.iter().filter(|c| !c.is_failure()).count() as u64;
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
        classified: all().filter(|c| !c.is_failure()).count() as u64,
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

    fn blocks_of(&self, key: &EvidenceKey) -> &[BlockOutcome] {
        self.evidence.get(key).map_or(&[], Vec::as_slice)
    }

    fn degraded(&self, blocks: &[BlockOutcome]) -> Option<String> {
        let t = totals(blocks);
        if t.sessions > 0 && t.error_timeout as f64 > self.p.degraded_fraction * t.sessions as f64 {
            Some(format!(
                "{} of {} sessions ended in error or timeout (over {:.0}%): not a same-speed toggle",
                t.error_timeout,
                t.sessions,
                100.0 * self.p.degraded_fraction
            ))
        } else {
            None
        }
    }

    fn record_step(
        &mut self,
        kind: StepKind,
        key: &EvidenceKey,
        outcome: Outcome,
        reason: String,
        observer: &mut dyn Observer,
    ) -> Result<(), Halt> {
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
            let (vp, vf) = self.step_states(key);
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
        if let Some(why) = self.degraded(self.blocks_of(&fail_key)) {
            let reason = format!("the configuration as it is is degraded: {why}");
            self.record_step(
                StepKind::Ends,
                &fail_key,
                Outcome::Degraded,
                reason.clone(),
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
        let finest = self
            .degraded(self.blocks_of(&(self.passing_end(), 0)))
            .is_some();
        if finest {
            self.screen_single_flips(runner, observer).await?;
        }
        self.ensure_passing_end(0, runner, observer).await?;
        // 3. ddmin over the testable flags.
        let testable = self.testable();
        let answer = self.ddmin(testable, finest, runner, observer).await?;
        self.ensure_passing_end(0, runner, observer).await?;
        // 4. Re-test the answer on fresh blocks.
        let answer_set: FailingSet = answer
            .iter()
            .copied()
            .chain(self.held.iter().copied())
            .collect();
        let retest_key = (answer_set.clone(), 1);
        let (outcome, reason) = self.decide_step(&retest_key, runner, observer).await?;
        self.record_step(
            StepKind::Retest,
            &retest_key,
            outcome,
            reason.clone(),
            observer,
        )?;
        let shown = self.show(&answer);
        if outcome != Outcome::Fails {
            return Ok((
                Answer::Inconclusive,
                format!(
                    "inconclusive: the minimal set {shown} did not fail again on re-test ({reason}); rerun with a larger --budget or check for flakiness{}",
                    self.untestable_words()
                ),
            ));
        }
        let t = totals(self.blocks_of(&retest_key));
        let p = totals(self.blocks_of(&(self.passing_end(), 0)));
        let f = totals(self.blocks_of(&fail_key));
        let needed = if answer.len() > 1 {
            "each needed: flipping any one of them passes"
        } else {
            "flipping it passes"
        };
        let mut verdict = format!(
            "culprit: {shown} is the minimal failure-inducing set ({needed}); re-tested: {} corrupted vs {} with every testable flag flipped (the configuration as it is: {}), at {} sessions in flight",
            pct(t.corrupted, t.classified),
            pct(p.corrupted, p.classified),
            pct(f.corrupted, f.classified),
            self.p.concurrency
        );
        verdict.push_str(&self.untestable_words());
        Ok((Answer::Culprit { flags: answer }, verdict))
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
            match self.degraded(self.blocks_of(&key)) {
                Some(w) => {
                    self.record_step(
                        StepKind::Degrade,
                        &key,
                        Outcome::Degraded,
                        format!(
                            "still degraded with {} held back: {w}",
                            self.names(&first.iter().copied().collect()).join(", ")
                        ),
                        observer,
                    )?;
                    evidence = w;
                    candidates = second.to_vec();
                }
                None => {
                    self.record_step(
                        StepKind::Degrade,
                        &key,
                        Outcome::Unresolved,
                        format!(
                            "not degraded with {} held back: the degrader is among them",
                            self.names(&first.iter().copied().collect()).join(", ")
                        ),
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
        if self.degraded(self.blocks_of(&alone_key)).is_none() {
            let before = self.held.len();
            self.screen_single_flips(runner, observer).await?;
            if self.held.len() > before {
                return Ok(());
            }
            self.held.insert(flag);
            self.untestable.push(Untestable {
                flag,
                reason: format!(
                    "flipping it to {} degrades the engine together with the other flips ({evidence}), though not alone",
                    self.p.flags[flag].passing
                ),
            });
            return Ok(());
        }
        self.held.insert(flag);
        self.untestable.push(Untestable {
            flag,
            reason: format!(
                "flipping it to {} degrades the engine, alone and with the other flips ({evidence})",
                self.p.flags[flag].passing
            ),
        });
        Ok(())
    }

    fn ends_state(&self) -> (SequentialState, Vec<(u64, u64)>) {
        let f = looks_of(self.blocks_of(&(self.all(), 0)), self.p.look);
        let p = looks_of(self.blocks_of(&(self.passing_end(), 0)), self.p.look);
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
        for flag in self.testable() {
            let mut set = self.all();
            set.remove(&flag);
            let key = (set, 0);
            if self.blocks_of(&key).is_empty() {
                self.run_block(&key, runner, observer).await?;
            }
            if let Some(why) = self.degraded(self.blocks_of(&key)) {
                self.record_step(
                    StepKind::Degrade,
                    &key,
                    Outcome::Degraded,
                    why.clone(),
                    observer,
                )?;
                self.held.insert(flag);
                self.untestable.push(Untestable {
                    flag,
                    reason: format!(
                        "flipping it alone to {} degrades the engine ({why})",
                        self.p.flags[flag].passing
                    ),
                });
            }
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
            if let Some(why) = self.degraded(self.blocks_of(&key)) {
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
            if self.degraded(self.blocks_of(&pass_key)).is_some() {
                // A later block of the passing end degraded: the caller holds out again.
                return Ok(());
            }
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
                Some((
                    Outcome::Passes,
                    Some((
                        Answer::CouldNotReproduce,
                        format!(
                            "could not reproduce: raise --concurrency or the workload ({words}; the failing end's always-valid upper bound {:.1}% is below the {:.0}-point effect sought)",
                            100.0 * f_bounds[1],
                            100.0 * self.p.min_effect
                        ),
                    )),
                ))
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
                if f_blocks >= self.p.ends_cap_blocks && p_blocks >= self.p.ends_cap_blocks {
                    if p_bounds[0] > 0.0 {
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
                self.record_step(StepKind::Ends, &fail_key, outcome, reason, observer)?;
                if let Some((a, w)) = answer {
                    return Err(Halt::Answer(a, format!("{w}{}", self.untestable_words())));
                }
                self.ends_verified = Some(self.held.clone());
                self.tested.push((self.all(), Outcome::Fails));
                self.tested.push((self.held.clone(), Outcome::Passes));
                return Ok(());
            }
        }
    }

    fn passing_ok(&self) -> bool {
        self.ends_verified.as_ref() == Some(&self.held)
    }

    fn step_states(&self, key: &EvidenceKey) -> (SequentialState, SequentialState) {
        let s = looks_of(self.blocks_of(key), self.p.look);
        let p = if self.passing_ok() {
            looks_of(self.blocks_of(&(self.passing_end(), 0)), self.p.look)
        } else {
            Vec::new()
        };
        let f = looks_of(self.blocks_of(&(self.all(), 0)), self.p.look);
        // A re-test (generation 1) decides at the full level; ddmin steps navigate, both
        // ways: a wrong step only steers the search, and the answer is re-tested.
        let fails_design = if key.1 == 0 {
            &self.navigate
        } else {
            &self.design
        };
        let mut vp = SequentialState::new(*fails_design);
        let mut vf = SequentialState::new(*fails_design);
        for i in 0..s.len().min(f.len()) {
            if vp.decision().is_none() && i < p.len() {
                vp.look(s[i], p[i]).expect("counts from classes");
            }
            if vf.decision().is_none() {
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

    fn evaluate(&self, key: &EvidenceKey) -> Eval {
        let blocks = self.blocks_of(key);
        if blocks.is_empty() {
            return Eval::NeedStep;
        }
        if let Some(why) = self.degraded(blocks) {
            return Eval::Decided(Outcome::Degraded, why);
        }
        let (vp, vf) = self.step_states(key);
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
                let target = self.p.min_load_fraction * f64::from(self.p.concurrency);
                let low = blocks
                    .iter()
                    .filter_map(|b| b.peak_engine)
                    .filter(|&peak| (peak as f64) < target)
                    .min();
                if let Some(peak) = low {
                    return Eval::Decided(
                        Outcome::Unresolved,
                        format!(
                            "passes ({}) but the engines peaked at {peak} running requests, below {:.0}% of the {} targeted: a load-dependent failure is not ruled out",
                            pct(t.corrupted, t.classified),
                            100.0 * self.p.min_load_fraction,
                            self.p.concurrency
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
                let f = looks_of(self.blocks_of(&(self.all(), 0)), self.p.look).len();
                if f < s {
                    return Eval::NeedFailing;
                }
                let pass_key = (self.passing_end(), 0);
                if self.passing_ok() {
                    if looks_of(self.blocks_of(&pass_key), self.p.look).len() < s {
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
                if blocks.len() as u64 >= self.p.step_cap_blocks {
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

    /// Run blocks until the step at `key` is decided.
    async fn decide_step(
        &mut self,
        key: &EvidenceKey,
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<(Outcome, String), Halt> {
        loop {
            match self.evaluate(key) {
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

    /// The outcome of the configuration with `subset` (testable flags) failing and every
    /// other testable flag flipped: cached, implied by monotonicity, or run as a step.
    async fn test(
        &mut self,
        subset: &[usize],
        runner: &mut impl StepRunner,
        observer: &mut dyn Observer,
    ) -> Result<Outcome, Halt> {
        let set: FailingSet = subset
            .iter()
            .copied()
            .chain(self.held.iter().copied())
            .collect();
        if let Some((_, outcome)) = self.tested.iter().find(|(t, _)| t == &set) {
            return Ok(*outcome);
        }
        for (tested, outcome) in &self.tested {
            let implied = (*outcome == Outcome::Fails && tested.is_subset(&set))
                || (*outcome == Outcome::Passes && tested.is_superset(&set));
            if implied {
                return Ok(*outcome);
            }
        }
        let key: EvidenceKey = (set.clone(), 0);
        let (outcome, reason) = self.decide_step(&key, runner, observer).await?;
        self.record_step(StepKind::Ddmin, &key, outcome, reason, observer)?;
        self.tested.push((set, outcome));
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
                    match self.test(&candidate, runner, observer).await? {
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
                            self.held.insert(flag);
                            self.untestable.push(Untestable {
                                flag,
                                reason: format!(
                                    "flipping it alone to {} degrades the engine ({why})",
                                    self.p.flags[flag].passing
                                ),
                            });
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
