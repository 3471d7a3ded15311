//! The run record: everything `run.json` holds (DESIGN.md 3.6). Field names are a
//! contract; extend, never rename.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::session::Counts;
use crate::core::verdict::{Comparison, Confound, Verdict};

pub const SCHEMA: &str = "bisect.run/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub schema: String,
    pub id: String,
    pub command: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// running | finished | interrupted | failed
    pub status: String,
    pub target: TargetInfo,
    pub flag: FlagInfo,
    pub workload: serde_json::Value,
    /// Flags pinned with --set, as written.
    #[serde(default)]
    pub sets: BTreeMap<String, String>,
    /// Exactly two once finished: `on` and `off`, pooled over repeats.
    pub arms: Vec<ArmRecord>,
    /// One per executed arm block, in execution order.
    pub runs: Vec<ArmRecord>,
    pub comparison: Option<Comparison>,
    #[serde(default)]
    pub confounds: Vec<Confound>,
    pub verdict: Option<Verdict>,
    /// `/server_info` per role and arm block, where the engine serves it.
    #[serde(default)]
    pub engine_info: BTreeMap<String, serde_json::Value>,
    pub error: Option<String>,
    /// Keys written by other commands (e.g. `reclassified` history), kept on rewrite.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetInfo {
    pub name: String,
    pub api: String,
    pub model: String,
    pub profile: Option<String>,
    pub roles: Vec<RoleInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoleInfo {
    pub name: String,
    pub launch: String,
    pub restart: Option<String>,
    pub health: String,
}

/// `{name, env|arg|switch, roles, on, off}`: exactly one of env/arg/switch is present.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlagInfo {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
    pub roles: Vec<String>,
    pub on: String,
    pub off: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArmRecord {
    pub label: String,
    pub value: String,
    /// Repeat index for a block in `runs`; absent for pooled arms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    pub readback: BTreeMap<String, String>,
    pub sessions: u64,
    pub counts: Counts,
    pub corrupted: u64,
    pub corruption_rate: f64,
    pub ci95: [f64; 2],
    pub peak_running: BTreeMap<String, u64>,
    pub wall_s: f64,
    pub completion_tokens: u64,
    pub tokens_per_s: f64,
    pub health_wait_s: f64,
    /// Per round (1-based index - 1): sessions whose first bad round this was.
    #[serde(default)]
    pub first_bad_round: Vec<u64>,
}

impl ArmRecord {
    pub fn new(label: &str, value: &str, repeat: Option<u32>) -> Self {
        ArmRecord {
            label: label.to_string(),
            value: value.to_string(),
            repeat,
            readback: BTreeMap::new(),
            sessions: 0,
            counts: Counts::default(),
            corrupted: 0,
            corruption_rate: 0.0,
            ci95: [0.0, 1.0],
            peak_running: BTreeMap::new(),
            wall_s: 0.0,
            completion_tokens: 0,
            tokens_per_s: 0.0,
            health_wait_s: 0.0,
            first_bad_round: Vec::new(),
        }
    }

    /// Recompute the derived fields (corrupted, rate, interval, tokens/s) from counts.
    pub fn finish(&mut self) {
        self.sessions = self.counts.total();
        self.corrupted = self.counts.corrupted();
        self.corruption_rate = if self.sessions == 0 {
            0.0
        } else {
            self.corrupted as f64 / self.sessions as f64
        };
        let (lo, hi) = crate::core::stats::wilson(self.corrupted, self.sessions, 0.95);
        self.ci95 = [lo, hi];
        self.tokens_per_s = if self.wall_s > 0.0 {
            self.completion_tokens as f64 / self.wall_s
        } else {
            0.0
        };
    }

    /// Pool several blocks of the same arm (repeats) into one.
    pub fn pool(label: &str, value: &str, blocks: &[&ArmRecord]) -> ArmRecord {
        let mut arm = ArmRecord::new(label, value, None);
        for b in blocks {
            arm.counts.merge(&b.counts);
            for (role, v) in &b.readback {
                // A mismatch in any block must survive pooling, so keep the first differing value.
                let slot = arm
                    .readback
                    .entry(role.clone())
                    .or_insert_with(|| v.clone());
                if v != value {
                    *slot = v.clone();
                }
            }
            for (k, v) in &b.peak_running {
                let slot = arm.peak_running.entry(k.clone()).or_insert(0);
                *slot = (*slot).max(*v);
            }
            arm.wall_s += b.wall_s;
            arm.completion_tokens += b.completion_tokens;
            arm.health_wait_s += b.health_wait_s;
            if arm.first_bad_round.len() < b.first_bad_round.len() {
                arm.first_bad_round.resize(b.first_bad_round.len(), 0);
            }
            for (i, n) in b.first_bad_round.iter().enumerate() {
                arm.first_bad_round[i] += n;
            }
        }
        arm.finish();
        arm
    }
}
