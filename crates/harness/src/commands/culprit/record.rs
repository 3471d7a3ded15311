//! What `bisect culprit` writes and prints: `culprit.json` (the record below; field names
//! are a contract, extend, never rename), `summary.md`, `report.html` and the terminal
//! summary (rendered by [`super::export`]). The step log (`steps.jsonl`) is
//! [`super::steplog`]'s.

use serde::{Deserialize, Serialize};

use crate::core::culprit::{
    replica_check, set_tallies, FlagValues, Outcome, ReplicaCheck, SetShare, StepRecord,
};
use crate::core::evidence::Severity;

pub(crate) const SCHEMA: &str = "bisect.culprit/2";

/// `culprit.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CulpritRecord {
    /// schema, id, command, times, status, target: the header every record opens with.
    #[serde(flatten)]
    pub header: crate::results::RecordHeader,
    /// The base workload; block b runs it with seed + b, `block_sessions` sessions at
    /// `concurrency` in flight.
    pub workload: serde_json::Value,
    pub concurrency: u32,
    pub(crate) block_sessions: u64,
    pub(crate) look_sessions: u64,
    pub budget: u64,
    pub alpha: f64,
    pub navigate_alpha: f64,
    pub min_effect: f64,
    /// Pinned for every block (`--set NAME=VALUE`).
    pub pinned: Vec<String>,
    /// The markup families whose tool-call syntax in a reply counts as a leak (the target
    /// profile's `markup`, as `bisect run` classifies).
    #[serde(default)]
    pub markup: Vec<crate::core::classify::MarkupFamily>,
    /// The listed flags with their failing (as found) and passing (flipped) values.
    pub flags: Vec<FlagValues>,
    /// `culprit`, `no_culprit`, `could_not_reproduce`, `inconclusive`; None while running.
    pub answer: Option<crate::commands::answer::SearchAnswer>,
    /// The verdict in words.
    pub verdict: Option<String>,
    /// The minimal failure-inducing set: catalog names with their failing values.
    pub culprit: Vec<FlagValue>,
    pub untestable: Vec<UntestableFlag>,
    /// Steps that failed with another class mix than the reference failure.
    pub(crate) other_failures: Vec<StepRecord>,
    /// What the blocks could not check, one sentence each (a listed or pinned flag that
    /// no engine reports: only the launch-file read-back stands for it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub steps: Vec<StepRecord>,
    pub blocks: Vec<BlockSummary>,
    pub sessions_spent: u64,
    pub restarts: u64,
    /// Blocks answered from the step log of an earlier run (`--resume`).
    pub replayed_blocks: u64,
    pub wall_s: f64,
    /// The replica sets every block was split over, each set driving its share of the
    /// block's sessions at the full load at the same time (docs/culprit.md, "Replica
    /// sets"); empty on one set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replica_sets: Vec<String>,
    /// Whether those sets corrupted alike (core::culprit::replica_check); `None` on one
    /// set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_check: Option<ReplicaCheck>,
    /// What the search cost: restarts, driving, engine-hours, wall (core::cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::core::cost::Cost>,
    pub error: Option<String>,
}

/// A flag at a value, as the catalog names it and as the launch config spells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlagValue {
    pub flag: String,
    pub value: String,
    /// `SGLANG_DSV4_BF16_INDEX_K=1`, `--enable-hierarchical-cache`, `--cuda-graph-max-bs 32`.
    pub setting: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UntestableFlag {
    pub flag: String,
    /// The value it is held at (its failing value).
    pub value: String,
    pub setting: String,
    pub reason: String,
}

/// One block, without its sessions (those are in `blocks/bNNN/sessions.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockSummary {
    pub block: u64,
    pub failing: Vec<String>,
    pub sessions: u64,
    pub corrupted: u64,
    pub error_timeout: u64,
    pub peak_engine: Option<u64>,
    pub seed: u64,
    pub wall_s: f64,
    pub dir: String,
    /// Each replica set's share of the block (its sessions in `dir/<set>/`), in the
    /// order of `replica_sets`; empty on one set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sets: Vec<SetShare>,
}

impl CulpritRecord {
    /// Recheck the replica sets over every block so far (after each block).
    pub(super) fn check_replicas(&mut self) {
        if self.replica_sets.len() < 2 {
            return;
        }
        let tallies = set_tallies(
            self.blocks.iter().map(|b| b.sets.as_slice()),
            self.replica_sets.len(),
        );
        self.replica_check = replica_check(&self.replica_sets, &tallies, self.alpha);
    }
}

pub(super) fn outcome_word(o: Outcome) -> &'static str {
    match o {
        Outcome::Fails => "fails",
        Outcome::Passes => "passes",
        Outcome::OtherFailure => "other failure",
        Outcome::Degraded => "degraded",
        Outcome::Unresolved => "unresolved",
    }
}

pub(super) fn failing_words(record: &CulpritRecord, step: &StepRecord) -> String {
    if step.failing.len() == record.flags.len() {
        "all (as found)".into()
    } else if step.failing.is_empty() {
        "none (all flipped)".into()
    } else {
        step.failing.join(", ")
    }
}

pub(super) fn head(record: &CulpritRecord) -> Vec<String> {
    let mut lines = vec![format!(
        "{} sessions in {} blocks of {} at {} in flight ({} restarts, {:.0} s), budget {}",
        record.sessions_spent,
        record.blocks.len(),
        record.block_sessions,
        record.concurrency,
        record.restarts,
        record.wall_s,
        record.budget
    )];
    if let Some(cost) = &record.cost {
        lines.push(cost.line());
    }
    if !record.pinned.is_empty() {
        lines.push(format!("pinned: {}", record.pinned.join(", ")));
    }
    if !record.replica_sets.is_empty() {
        lines.push(format!(
            "replica sets {}: every block split over them at once, each set driving its share at {} in flight",
            record.replica_sets.join(", "),
            record.concurrency
        ));
    }
    if let Some(check) = &record.replica_check {
        lines.push(match check.severity {
            Severity::Info => format!("replica check: {}", check.note),
            _ => format!("warning: {}", check.note),
        });
    }
    if record.replayed_blocks > 0 {
        lines.push(format!(
            "{} blocks replayed from the step log of the earlier run",
            record.replayed_blocks
        ));
    }
    for u in &record.untestable {
        lines.push(format!(
            "untestable: {} ({}): {}",
            u.flag, u.setting, u.reason
        ));
    }
    for w in &record.warnings {
        lines.push(format!("warning: {w}"));
    }
    for o in &record.other_failures {
        lines.push(format!(
            "another failure mode with failing values {}: {}",
            o.failing.join(", "),
            o.reason
        ));
    }
    if let Some(e) = &record.error {
        lines.push(format!("error: {e}"));
    }
    lines
}

/// The columns of the step tables: the terminal's leaves out the reason.
pub(super) const STEP_COLUMNS: [&str; 7] = [
    "step",
    "kind",
    "failing values",
    "outcome",
    "corrupted",
    "blocks",
    "reason",
];
