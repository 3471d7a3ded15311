//! The culprit search's state and its order: [`search`] builds the state machine that
//! runs the phases of the module header one after the other on one [`Search`], which
//! each phase's module extends.
//! Running a block is the only way its evidence grows; how a configuration's looks pair
//! with the failing end's is pinned at the configuration's first evaluation.

use std::collections::{BTreeSet, HashMap};

use super::block::{BlockOutcome, BlockRequest};
use super::evidence::{looks_of, totals, EvidenceKey, FailingSet};
use super::params::SearchParams;
use super::report::{Answer, Outcome, SearchReport, StepRecord, Untestable};
use crate::machine::{Machine, Port};
use crate::sequential::SequentialDesign;
use crate::stats;

/// What the search reports as it goes (the step log, culprit.json).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A block ran and was taken in as evidence.
    Block(BlockRequest, BlockOutcome),
    /// A step was decided.
    Step(StepRecord),
}

/// Why a search stopped without an answer: its driver broke the seam's contract.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SearchError {
    #[error("block {block} returned {got} sessions, asked for {asked}")]
    WrongSessions { block: u64, got: usize, asked: u64 },
}

/// The culprit search as a sans-IO state machine ([`crate::machine`]): ask
/// `next_block`, run it, `observe` what it gave; a spent budget is an answer
/// (inconclusive, with what was found), never an error.
pub(crate) type CulpritSearch =
    Machine<BlockRequest, BlockOutcome, Event, Result<SearchReport, SearchError>>;

/// Why the search stopped before an answer.
pub(super) enum Halt {
    Budget,
    /// The search ended early with this answer (could not reproduce, no culprit, ...).
    Answer(Answer, String),
    Failed(SearchError),
}

/// The search for `params`, to be driven block by block (see [`CulpritSearch`]).
pub fn search(params: SearchParams) -> CulpritSearch {
    CulpritSearch::new(|port| async move { run_search(&params, port).await })
}

/// Run the search to its answer. Errors only when a block's outcome does not fit its
/// request; a spent budget is an answer (inconclusive, with what was found).
async fn run_search(
    params: &SearchParams,
    port: Port<BlockRequest, BlockOutcome, Event>,
) -> Result<SearchReport, SearchError> {
    let mut s = Search {
        port,
        p: params,
        design: params.design(params.alpha),
        navigate: params.design(params.navigate_alpha),
        evidence: HashMap::new(),
        pinned: HashMap::new(),
        blocks: Vec::new(),
        steps: Vec::new(),
        held: BTreeSet::new(),
        parked: BTreeSet::new(),
        untestable: Vec::new(),
        tested: Vec::new(),
        ends_verified: None,
        other_failures: Vec::new(),
        strict: false,
        retests: 0,
        final_tested: None,
        caught: Vec::new(),
    };
    let answer = match s.run().await {
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

/// The level a step decides at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    /// `navigate_alpha`: a ddmin step, whose error only steers the search.
    Navigate,
    /// `alpha`: a claim the answer rests on.
    Claim,
}

/// One entry of ddmin's cache.
pub(super) struct Tested {
    pub(super) set: FailingSet,
    pub(super) outcome: Outcome,
    /// Decided at `alpha` (else at `navigate_alpha`).
    pub(super) claim: bool,
}

/// The failing end as a configuration's first evaluation found it ([`Search::pin_pairing`]).
pub(super) struct Pinned {
    pub(super) failing_looks: usize,
    pub(super) failing_rate: f64,
}

/// One search's state: the evidence so far, the flags held out, ddmin's cache and the
/// level its steps decide at. Each phase's module adds its own methods.
pub(super) struct Search<'p> {
    /// Where blocks are asked for and events reported.
    pub(super) port: Port<BlockRequest, BlockOutcome, Event>,
    pub(super) p: &'p SearchParams,
    pub(super) design: SequentialDesign,
    /// The design of a ddmin step's "fails" (at `navigate_alpha`).
    pub(super) navigate: SequentialDesign,
    pub(super) evidence: HashMap<EvidenceKey, Vec<BlockOutcome>>,
    /// What the failing end had shown when each configuration was first evaluated: fixes,
    /// before anything has read the configuration's corruption counts, how its looks pair
    /// with the failing end's and where its e-process starts.
    pub(super) pinned: HashMap<EvidenceKey, Pinned>,
    pub(super) blocks: Vec<(BlockRequest, BlockOutcome)>,
    pub(super) steps: Vec<StepRecord>,
    /// Untestable flags: at their failing values in every configuration.
    pub(super) held: BTreeSet<usize>,
    /// Testable flags ddmin keeps at their failing values for now ([`Search::park_from`]):
    /// it narrows the other flags first, and the answer's re-test flips these.
    pub(super) parked: BTreeSet<usize>,
    pub(super) untestable: Vec<Untestable>,
    /// ddmin's cache: failing set (held flags included) -> outcome, and whether it was
    /// decided at the claims' level.
    pub(super) tested: Vec<Tested>,
    /// The held set for which the passing end was verified against the failing end.
    pub(super) ends_verified: Option<FailingSet>,
    pub other_failures: Vec<StepRecord>,
    /// Every step decides at `alpha` (after a navigation error was caught).
    pub(super) strict: bool,
    /// Re-tests run: generation of the next re-test's evidence.
    pub(super) retests: u32,
    /// The last test run as a re-test inside ddmin ([`Search::final_test`]).
    pub(super) final_tested: Option<(EvidenceKey, Outcome, String)>,
    /// The navigation errors caught, in words.
    pub(super) caught: Vec<String>,
}

impl Search<'_> {
    pub(super) fn all(&self) -> FailingSet {
        (0..self.p.flags.len()).collect()
    }

    pub(super) fn testable(&self) -> Vec<usize> {
        (0..self.p.flags.len())
            .filter(|i| !self.held.contains(i))
            .collect()
    }

    pub(super) fn names(&self, set: &FailingSet) -> Vec<String> {
        set.iter().map(|&i| self.p.flags[i].name.clone()).collect()
    }

    pub(super) fn passing_end(&self) -> FailingSet {
        self.held.clone()
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

    /// The phases of the module header, in order. An answer found on the way (could not
    /// reproduce, no culprit, a claim that cannot be made) ends it as [`Halt::Answer`].
    async fn run(&mut self) -> Result<(Answer, String), Halt> {
        // 1. The failing end first: nothing else means anything if it does not fail.
        self.run_failing_end().await?;
        // 2. Every listed flag flipped. When that degrades the engine, some flip is not a
        // same-speed toggle: the search then starts at the finest granularity (one flag
        // flipped at a time, which is also how a flag whose flip alone degrades is found)
        // and verifies the passing end once the degrading flags are held out.
        self.run_block(&(self.passing_end(), 0)).await?;
        let finest = self.degraded(&(self.passing_end(), 0)).is_some();
        let mut start = None;
        if finest {
            // Finding it costs blocks: first make sure the failing end can fail at all
            // (its own always-valid bounds), as the ends would. Then halve towards the
            // degrading flag; when that cannot isolate it, screen every flip alone.
            self.failing_end_can_fail().await?;
            start = self.halve_degraded_end().await?;
            if start.is_none() && self.degraded(&(self.passing_end(), 0)).is_some() {
                self.screen_single_flips().await?;
            }
        }
        self.ensure_passing_end(0).await?;
        if let Some(p1) = start {
            self.park_from(&p1)?;
        }
        // 3. ddmin over the testable flags, 4. the answer's claims at alpha.
        let (answer, retest_key) = self.claimed_minimal_set(finest).await?;
        Ok(self.culprit_verdict(answer, &retest_key))
    }

    fn spent(&self) -> u64 {
        self.blocks.iter().map(|(r, _)| r.sessions).sum()
    }

    pub(super) async fn run_block(&mut self, key: &EvidenceKey) -> Result<(), Halt> {
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
        let outcome = self.port.ask(request.clone()).await;
        if outcome.classes.len() as u64 != request.sessions {
            return Err(Halt::Failed(SearchError::WrongSessions {
                block: number,
                got: outcome.classes.len(),
                asked: request.sessions,
            }));
        }
        self.port
            .emit(Event::Block(request.clone(), outcome.clone()));
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
    pub(super) fn pin_pairing(&mut self, key: &EvidenceKey) {
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

    pub(super) fn blocks_of(&self, key: &EvidenceKey) -> &[BlockOutcome] {
        self.evidence.get(key).map_or(&[], Vec::as_slice)
    }
}
