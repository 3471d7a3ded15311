//! The run record: everything `run.json` holds (docs/design.md 3.6). Field names are a
//! contract; extend, never rename.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{RoleSpec, TargetProfile};

use crate::core::adaptive::AdaptiveRecord;
use crate::core::phases::Phases;

use crate::core::arm_stats::{pool_readback, ArmLabel, ArmStats, RecordStatus};
use crate::core::verdict::{ArmObservation, Comparison, Confound, Verdict};

pub const SCHEMA: &str = "bisect.run/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub schema: String,
    pub id: String,
    pub command: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: RecordStatus,
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
    /// `bisect run --adaptive`: the sequential design, every block and every look.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveRecord>,
    /// Where the run's wall time went (absent in records written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
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
    /// The engine preset (`sglang`, `vllm`, `llamacpp`, `embedded`, `custom`); absent
    /// in records written before presets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

impl TargetInfo {
    /// What a record says about the target it ran against.
    pub fn of(t: &TargetProfile) -> TargetInfo {
        TargetInfo {
            name: t.name.clone(),
            api: t.api.clone(),
            model: t.model.clone(),
            profile: t.source.as_ref().map(|p| p.display().to_string()),
            roles: t.roles.iter().map(RoleInfo::of).collect(),
            engine: Some(t.engine.name().to_string()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoleInfo {
    pub name: String,
    pub launch: String,
    pub restart: Option<String>,
    pub health: String,
    /// The Prometheus endpoint scraped for load, and the gauge read from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_metric: Option<String>,
    /// Where the engine's effective configuration was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_url: Option<String>,
}

impl RoleInfo {
    /// What a record (and `bisect check`'s report) says about a role of the target.
    pub fn of(r: &RoleSpec) -> RoleInfo {
        RoleInfo {
            name: r.name.clone(),
            launch: r.launch.display().to_string(),
            restart: r.restart.clone(),
            health: r.health.clone(),
            metrics: r.metrics.clone(),
            running_metric: r.metrics.as_ref().map(|_| r.running_metric.clone()),
            effective_url: r.effective_url.clone(),
        }
    }
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

/// One arm of a run: a block (`runs`, one per repeat) or the pool of an arm's blocks
/// (`arms`). The measurements are the shared [`ArmStats`], flattened into the same keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArmRecord {
    pub label: ArmLabel,
    pub value: String,
    /// Repeat index for a block in `runs`; absent for pooled arms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// Role -> the value read back from its launch config after the edit.
    pub readback: BTreeMap<String, String>,
    /// Role -> the flag's value as the running engine reports it (its `/server_info`),
    /// for the roles whose engine reports it; empty when no engine does.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub effective: BTreeMap<String, String>,
    /// Sessions classified (`counts` summed), kept as its own key for readers of run.json.
    pub sessions: u64,
    #[serde(flatten)]
    pub stats: ArmStats,
}

impl ArmRecord {
    pub fn new(label: ArmLabel, value: &str, repeat: Option<u32>) -> Self {
        ArmRecord {
            label,
            value: value.to_string(),
            repeat,
            readback: BTreeMap::new(),
            effective: BTreeMap::new(),
            sessions: 0,
            stats: ArmStats::default(),
        }
    }

    /// Recompute the derived fields from the counts.
    pub fn finish(&mut self) {
        self.stats.finish();
        self.sessions = self.stats.sessions();
    }

    /// Pool several blocks of the same arm (repeats) into one.
    pub fn pool(label: ArmLabel, value: &str, blocks: &[&ArmRecord]) -> ArmRecord {
        let mut arm = ArmRecord::new(label, value, None);
        arm.readback = pool_readback(value, blocks.iter().map(|b| &b.readback));
        arm.effective = pool_readback(value, blocks.iter().map(|b| &b.effective));
        arm.stats = ArmStats::pool(blocks.iter().map(|b| &b.stats));
        arm.sessions = arm.stats.sessions();
        arm
    }

    /// This arm as the verdict sees it, borrowed.
    pub fn observe<'a>(&'a self, workload: &'a serde_json::Value) -> ArmObservation<'a> {
        ArmObservation {
            label: self.label,
            value: &self.value,
            stats: &self.stats,
            readback: &self.readback,
            effective: &self.effective,
            workload,
        }
    }
}

impl RunRecord {
    /// The pooled arm with this label, once it has run.
    pub fn arm(&self, label: ArmLabel) -> Option<&ArmRecord> {
        self.arms.iter().find(|a| a.label == label)
    }
}
