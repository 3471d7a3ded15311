//! The culprit search's one seam to the engines: a block it asks for ([`BlockRequest`])
//! and what the block gave ([`BlockOutcome`]), passed through the search's state machine
//! (`CulpritSearch`, in `search.rs`: a testbed runs its blocks in `bisect culprit`, an
//! oracle in simulations).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::session::SessionClass;

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
    /// What the witnesses of the flags the block set counted (core::mechanism): a
    /// configuration whose path never ran is never a pass, a level never flat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mechanisms: Vec<crate::mechanism::MechanismRecord>,
    /// Each replica set's counts, where the block was split over several
    /// ([`super::split`]); empty on one set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sets: Vec<SetShare>,
}

/// What one set's share of a block gave: its sessions, corrupted and judged (error,
/// timeout, truncated and crashed sessions are not judged: `SessionClass::is_judged`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetShare {
    pub sessions: u64,
    pub corrupted: u64,
    pub judged: u64,
}

impl SetShare {
    pub(super) fn of(outcome: &BlockOutcome) -> SetShare {
        SetShare {
            sessions: outcome.classes.len() as u64,
            corrupted: outcome.classes.iter().filter(|c| c.is_corrupted()).count() as u64,
            judged: outcome.classes.iter().filter(|c| c.is_judged()).count() as u64,
        }
    }

    pub(super) fn add(&mut self, other: &SetShare) {
        self.sessions += other.sessions;
        self.corrupted += other.corrupted;
        self.judged += other.judged;
    }
}
