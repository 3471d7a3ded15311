//! What a two-arm decision is made from and with: each arm's observation (borrowed from
//! the record that holds it), the decision thresholds, and the confounds found in them.
//! The confound checks (`crate::confounds`) and the verdicts (`crate::verdict`,
//! `crate::adaptive::verdict`) both read these; they live here, below both, so neither
//! imports the other's vocabulary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::arm_stats::{ArmLabel, ArmStats};
use crate::format::percent_digits;
use crate::stats;

/// The confidence of every interval the verdict reports.
pub const CONFIDENCE: f64 = 0.95;

/// The decision thresholds. Defaults are those of docs/design.md 3.7.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// Significance level of the two-sided Fisher test.
    pub alpha: f64,
    /// The smallest difference in corruption rate worth finding (absolute, 0.05 = 5 points).
    pub min_effect: f64,
    /// An arm with more than this fraction of error+timeout sessions is degraded.
    pub degraded_fraction: f64,
    /// Recorded metrics that differ by more than this (relative) are warnings.
    pub warn_ratio: f64,
    /// Power used to size the "underpowered" advice.
    pub power: f64,
    /// `cleared` needs the engine to have run at least this fraction of the target
    /// concurrency (docs/design.md 3.7, "load"): a bug that needs load cannot be ruled
    /// out at a lower one.
    pub min_load_fraction: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            alpha: 0.01,
            min_effect: 0.05,
            degraded_fraction: 0.10,
            warn_ratio: 0.25,
            power: 0.8,
            min_load_fraction: 0.9,
        }
    }
}

/// What one arm (pooled over repeats) contributes to the decision, or one block of it
/// judged on its own: borrowed from the record that holds it, never copied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArmObservation<'a> {
    pub label: ArmLabel,
    /// The flag value this arm set.
    pub value: &'a str,
    /// The block's repeat index when this is one of several blocks its arm pooled (the
    /// reasons then name the block, `on-r1`); `None` for a pooled arm, or an arm of one
    /// block (which is its arm).
    pub block: Option<u32>,
    /// The replica set the block ran on, for a target with several (`[[replica]]`);
    /// `None` on a single replica and for pooled arms.
    pub replica: Option<&'a str>,
    pub stats: &'a ArmStats,
    /// Role -> the value read back from its launch config after the edit.
    pub readback: &'a BTreeMap<String, String>,
    /// Role -> the value the running engine reports, where it reports one.
    pub effective: &'a BTreeMap<String, String>,
    /// The workload parameters this arm ran with.
    pub workload: &'a Value,
}

impl ArmObservation<'_> {
    /// Sessions that were classified, whatever their class.
    pub(crate) fn classified(&self) -> u64 {
        self.stats.sessions()
    }

    /// Sessions that could show corruption: the denominator of every rate
    /// ([`crate::session::Counts::judged`]).
    pub(crate) fn judged(&self) -> u64 {
        self.stats.judged()
    }

    pub(crate) fn corrupted(&self) -> u64 {
        self.stats.counts.corrupted()
    }

    /// `on (=1)`: the label with the value it stands for.
    pub(crate) fn name(&self) -> String {
        format!("{} (={})", self.label, self.value)
    }

    /// `arm on`, or `block on-r1` for one block of several: who a reason is about.
    pub(crate) fn subject(&self) -> String {
        match self.block {
            Some(repeat) => format!("block {}-r{repeat}", self.label),
            None => format!("arm {}", self.label),
        }
    }

    /// `14/80 (17.5%, 95% CI 10.7-27.3%)`, or without the "95% CI" words.
    pub(crate) fn rate_text(&self, with_ci_words: bool) -> String {
        let (k, n) = (self.corrupted(), self.judged());
        let (lo, hi) = stats::wilson(k, n, CONFIDENCE);
        format!(
            "{k}/{n} ({}%, {}{}-{}%)",
            percent_digits(stats::rate(k, n)),
            if with_ci_words { "95% CI " } else { "" },
            percent_digits(lo),
            percent_digits(hi)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Voids the comparison: the verdict cannot be implicated or cleared.
    Blocking,
    /// Recorded and differing by more than `warn_ratio`.
    Warning,
    /// Recorded, within bounds.
    Info,
}

impl Severity {
    /// The contract name (`blocking`, `warning`, `info`), also the CSS class of its row.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Blocking => "blocking",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One entry of `confounds` in run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Confound {
    pub name: String,
    pub on: Value,
    pub off: Value,
    pub severity: Severity,
    pub note: String,
}
