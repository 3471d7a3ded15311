//! What the culprit search tells: each decided step ([`StepRecord`]) and each block as
//! it happens, as events its driver hands on (the step log, the record), and at its end the answer
//! and the flags held out as untestable ([`SearchReport`]). These are culprit.json's and
//! the step log's shapes: extend, never rename.

use serde::{Deserialize, Serialize};

use super::block::{BlockOutcome, BlockRequest};
use crate::sequential::LookRecord;

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
    pub(crate) vs_passing: Option<LookRecord>,
    /// The last look of the failing end against the step.
    pub(crate) vs_failing: Option<LookRecord>,
    /// Freeman-Halton p of the step's corrupted-class mix against the failing end's.
    pub(crate) mix_p: Option<f64>,
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
