//! What the commit search asks for and answers: a round of [`Test`]s (why each block is
//! run, [`Purpose`]), what a block cost ([`Spent`]), and the [`Answer`].

use serde::{Deserialize, Serialize};

/// Why a block is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    Ends,
    Search,
    Verify,
}

/// Seconds an observation cost, as measured; `build_s` is `None` for a cached build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub build_s: Option<f64>,
    pub block_s: Option<f64>,
    pub sessions: u64,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// Commits `first..=last` (one commit unless untestable commits widen it) raise
    /// corruption over `parent`; `verified` when the fresh A/B implicated it.
    Culprit {
        first: usize,
        last: usize,
        parent: usize,
        posterior: f64,
        verified: bool,
        words: String,
    },
    NoCulprit {
        words: String,
    },
    CouldNotReproduce {
        words: String,
    },
    Inconclusive {
        words: String,
        top: Vec<(usize, f64)>,
    },
}

impl Answer {
    pub fn words(&self) -> &str {
        match self {
            Answer::Culprit { words, .. }
            | Answer::NoCulprit { words }
            | Answer::CouldNotReproduce { words }
            | Answer::Inconclusive { words, .. } => words,
        }
    }
}

/// One block to run: at which commit, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Test {
    pub commit: usize,
    pub purpose: Purpose,
}

/// What to do next: a round of blocks (one unless [`super::Params::parallel`]; their commits
/// distinct, run side by side, observed in this order), or the answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Round(Vec<Test>),
    Done(Answer),
}
