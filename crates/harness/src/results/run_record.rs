//! The run record: everything `run.json` holds (docs/design.md 3.6). Field names are a
//! contract; extend, never rename.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{RoleSpec, TargetProfile};

use crate::core::adaptive::AdaptiveRecord;
use crate::core::effective;
use crate::core::phases::Phases;

use crate::core::arm_stats::{pool_readback, ArmLabel, ArmStats};
use crate::core::classify::{MarkupFamily, RejectionPattern};
use crate::core::evidence::{ArmObservation, Confound};
use crate::core::verdict::{Comparison, Verdict};

pub(crate) const SCHEMA: &str = "bisect.run/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// schema, id, command, times, status, target: the header every record opens with.
    #[serde(flatten)]
    pub header: crate::results::RecordHeader,
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
    /// What the run cost: restarts, driving, engine-hours, wall (core::cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::core::cost::Cost>,
    /// `--pressure`: the capacity read and the filler context chosen for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<crate::core::pressure::Sizing>,
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
    /// The tool-call markup families the run counted as leaks (the profile's `markup`),
    /// so `bisect reclassify` judges with the same ones; absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markup: Option<Vec<MarkupFamily>>,
    /// The rejection patterns the run judged error replies with (docs/design.md 3.5,
    /// `rejected`), so `bisect reclassify` judges them again with the same ones;
    /// absent when there were none and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejections: Option<Vec<RejectionPattern>>,
}

impl TargetInfo {
    /// A bare target for test records: a name and an API URL, nothing else known.
    #[cfg(test)]
    pub(crate) fn bare(name: &str, api: &str) -> TargetInfo {
        TargetInfo {
            name: name.into(),
            api: api.into(),
            model: "m".into(),
            profile: None,
            roles: Vec::new(),
            engine: None,
            markup: None,
            rejections: None,
        }
    }

    /// What a record says about the target it ran against.
    pub fn of(t: &TargetProfile) -> TargetInfo {
        TargetInfo {
            name: t.name.clone(),
            api: t.api.clone(),
            model: t.model.clone(),
            profile: t.source.as_ref().map(|p| p.display().to_string()),
            roles: t.roles.iter().map(RoleInfo::of).collect(),
            engine: Some(t.engine.name().to_string()),
            markup: Some(t.markup.clone()),
            rejections: (!t.rejections.is_empty()).then(|| t.rejections.clone()),
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
    pub(crate) switch: Option<String>,
    pub roles: Vec<String>,
    pub on: String,
    pub off: String,
}

impl FlagInfo {
    /// The record's view of a catalog flag: its name, where it lives, its roles and values.
    pub(crate) fn of(f: &crate::config::FlagSpec) -> Self {
        let mut flag = FlagInfo {
            name: f.name.clone(),
            env: None,
            arg: None,
            switch: None,
            roles: f.roles.clone(),
            on: f.on.clone(),
            off: f.off.clone(),
        };
        match &f.setting {
            crate::config::Setting::Env(v) => flag.env = Some(v.clone()),
            crate::config::Setting::Arg(v) => flag.arg = Some(v.clone()),
            crate::config::Setting::Switch(v) => flag.switch = Some(v.clone()),
        }
        flag
    }
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
    /// The replica set a block ran on, for a target with several (`[[replica]]`);
    /// absent on a single replica and for pooled arms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Role -> the value read back from its launch config after the edit.
    pub readback: BTreeMap<String, String>,
    /// Role -> the flag's value as the running engine reports it (its `/server_info`),
    /// for the roles whose engine reports it; empty when no engine does.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub effective: BTreeMap<String, String>,
    /// Role -> which process served the block and where that was read (the engine's
    /// report, a metrics header, the listening socket, or `none`); blocks only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub identity: BTreeMap<String, effective::Identity>,
    /// Sessions classified (`counts` summed), kept as its own key for readers of run.json.
    pub sessions: u64,
    #[serde(flatten)]
    pub stats: ArmStats,
    /// The solo oracle's reference pass and findings (`--oracle solo`); absent without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle: Option<crate::core::solo::ReferencePass>,
}

impl RunRecord {
    /// Every engine death of the run, one line per death in execution order: the block,
    /// how and when the role died, and the last line its log wrote before (summary.md,
    /// report.html).
    pub(crate) fn death_lines(&self) -> Vec<(String, Vec<String>)> {
        self.runs
            .iter()
            .flat_map(|b| {
                b.stats.deaths.iter().map(move |d| {
                    (
                        format!(
                            "block {} r{}: {}",
                            b.label,
                            b.repeat.unwrap_or(0),
                            d.describe()
                        ),
                        d.log_tail.clone(),
                    )
                })
            })
            .collect()
    }

    /// What the flag's witnesses counted per arm (core::mechanism): whether the path it
    /// controls ran, then each witness's count per arm with its failed reads
    /// (summary.md, report.html). Empty for records without witness counts.
    pub(crate) fn mechanism_lines(&self) -> Vec<String> {
        let arms: Vec<(&str, &[crate::core::mechanism::MechanismRecord])> = self
            .arms
            .iter()
            .map(|a| (a.label.as_str(), a.stats.mechanisms.as_slice()))
            .collect();
        let Some(coverage) = crate::core::mechanism::coverage(&arms) else {
            return Vec::new();
        };
        let mut lines = vec![coverage.words()];
        for a in &self.arms {
            for r in &a.stats.mechanisms {
                for w in &r.witnesses {
                    let mut line = format!(
                        "{} ({}={}{}): {} counted {} (at least {} means it ran)",
                        a.label.as_str(),
                        r.flag,
                        r.value,
                        if r.needed { ", enables it" } else { "" },
                        w.witness,
                        w.count,
                        w.min
                    );
                    if !w.unread.is_empty() {
                        line.push_str(&format!("; reads failed: {}", w.unread.join("; ")));
                    }
                    lines.push(line);
                }
            }
        }
        lines
    }

    /// What happened to each block's engine lives, in execution order: each restart
    /// after a death, sessions left unrun at the death budget, and each canary that came
    /// back corrupted alone (summary.md, report.html).
    pub(crate) fn life_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for b in &self.runs {
            let block = format!("block {} r{}", b.label, b.repeat.unwrap_or(0));
            for r in &b.stats.restarts {
                lines.push(format!(
                    "{block}: engines restarted after a death at {:.1} s, in {:.1} s; {} session{} went on on the new engine life",
                    r.at_s,
                    r.restart_s,
                    r.sessions,
                    if r.sessions == 1 { "" } else { "s" }
                ));
            }
            if b.stats.unrun > 0 {
                lines.push(format!(
                    "{block}: {} session{} not run: the block stopped at the death budget ({} deaths)",
                    b.stats.unrun,
                    if b.stats.unrun == 1 { "" } else { "s" },
                    crate::core::deaths::DEATH_BUDGET
                ));
            }
            // A canary that came back clean alone only says the engine was not
            // poisoned: run.json keeps it; the pages list the ones that corrupted alone.
            for c in b.stats.canaries.iter().filter(|c| c.class.is_corrupted()) {
                lines.push(format!("{block}: {}", c.describe()));
            }
        }
        lines
    }
}

impl ArmRecord {
    pub fn new(label: ArmLabel, value: &str, repeat: Option<u32>) -> Self {
        ArmRecord {
            label,
            value: value.to_string(),
            repeat,
            replica: None,
            readback: BTreeMap::new(),
            effective: BTreeMap::new(),
            identity: BTreeMap::new(),
            sessions: 0,
            stats: ArmStats::default(),
            oracle: None,
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
        arm.readback = pool_readback(value, blocks.iter().map(|b| &b.readback), |a, b| a == b);
        arm.effective = pool_readback(
            value,
            blocks.iter().map(|b| &b.effective),
            effective::agrees,
        );
        arm.stats = ArmStats::pool(blocks.iter().map(|b| &b.stats));
        arm.sessions = arm.stats.sessions();
        arm.oracle = crate::core::solo::ReferencePass::pooled(
            blocks.iter().filter_map(|b| b.oracle.as_ref()),
        );
        arm
    }

    /// This arm as the verdict sees it, borrowed.
    pub(crate) fn observe<'a>(&'a self, workload: &'a serde_json::Value) -> ArmObservation<'a> {
        ArmObservation {
            label: self.label,
            value: &self.value,
            block: None,
            replica: None,
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

    /// Every arm block (`runs`) as the verdict checks it on its own
    /// ([`crate::core::verdict::decide`]'s `blocks`): a block of an arm that pooled
    /// several is named by its repeat (`on-r1`); the only block of its arm is the arm.
    pub(crate) fn block_observations<'a>(
        &'a self,
        workload: &'a serde_json::Value,
    ) -> Vec<ArmObservation<'a>> {
        self.runs
            .iter()
            .map(|run| {
                let several = self.runs.iter().filter(|r| r.label == run.label).count() > 1;
                ArmObservation {
                    block: run.repeat.filter(|_| several),
                    replica: run.replica.as_deref(),
                    ..run.observe(workload)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::evidence::{Policy, Severity};
    use crate::core::session::SessionClass;
    use crate::core::verdict::{decide, Status};

    /// A finished block of the switch `HICACHE` (on = "on"): 200 clean sessions, its
    /// engine reporting `reported` for prefill and peaking at `peak` running requests.
    fn block(label: ArmLabel, repeat: u32, reported: &str, peak: u64) -> ArmRecord {
        let value = if label == ArmLabel::On { "on" } else { "off" };
        let mut b = ArmRecord::new(label, value, Some(repeat));
        b.readback.insert("prefill".into(), value.into());
        b.effective.insert("prefill".into(), reported.into());
        b.stats.counts[SessionClass::Done] = 200;
        b.stats.peak_running.insert("prefill".into(), peak);
        b.finish();
        b
    }

    fn record(runs: Vec<ArmRecord>) -> RunRecord {
        let mut record: RunRecord = serde_json::from_value(json!({
            "schema": SCHEMA, "id": "t", "command": "bisect run", "started_at": "t",
            "finished_at": null, "status": "finished",
            "target": {"name": "t", "api": "http://h/v1", "model": "m", "profile": null,
                       "roles": []},
            "flag": {"name": "HICACHE", "switch": "--enable-hierarchical-cache",
                     "roles": ["prefill"], "on": "on", "off": "off"},
            "workload": {"sessions": 200, "concurrency": 80},
            "arms": [], "runs": [], "comparison": null, "verdict": null, "error": null
        }))
        .unwrap();
        for (label, value) in [(ArmLabel::On, "on"), (ArmLabel::Off, "off")] {
            let blocks: Vec<&ArmRecord> = runs.iter().filter(|r| r.label == label).collect();
            record.arms.push(ArmRecord::pool(label, value, &blocks));
        }
        record.runs = runs;
        record
    }

    fn verdict(record: &RunRecord) -> (Vec<crate::core::evidence::Confound>, Status, String) {
        let (on, off) = (
            record.arm(ArmLabel::On).unwrap(),
            record.arm(ArmLabel::Off).unwrap(),
        );
        let (_, confounds, verdict) = decide(
            &on.observe(&record.workload),
            &off.observe(&record.workload),
            &record.block_observations(&record.workload),
            &Policy::default(),
            "HICACHE",
        );
        (confounds, verdict.status, verdict.reasons.join("\n"))
    }

    /// `--repeats 2`: the second `on` block's engine did not take the config. Its report
    /// survives pooling and the reason names the block.
    #[test]
    fn a_repeated_arm_with_one_bad_engine_report_is_not_judged_on_the_pool() {
        let good = [
            block(ArmLabel::On, 0, "true", 80),
            block(ArmLabel::Off, 0, "false", 80),
            block(ArmLabel::Off, 1, "false", 80),
            block(ArmLabel::On, 1, "true", 80),
        ];
        let (_, status, reasons) = verdict(&record(good.to_vec()));
        assert_eq!(status, Status::Cleared, "{reasons}");

        let mut bad = good.to_vec();
        bad[3] = block(ArmLabel::On, 1, "false", 80);
        let record = record(bad);
        assert_eq!(
            record.arm(ArmLabel::On).unwrap().effective["prefill"],
            "false"
        );
        let (confounds, status, reasons) = verdict(&record);
        assert_eq!(status, Status::Inconclusive);
        let blocking: Vec<&str> = confounds
            .iter()
            .filter(|c| c.severity == Severity::Blocking)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(blocking, ["effective.prefill"]);
        assert!(
            reasons.contains(
                "block on-r1 set on but the prefill engine reports it runs with \"false\""
            ),
            "{reasons}"
        );
    }

    /// Peaks 80 and 20 in the two `on` blocks: the pooled peak is 80, the short block
    /// still stops `cleared`.
    #[test]
    fn a_repeated_arm_with_one_block_short_of_the_load_is_not_cleared() {
        let record = record(vec![
            block(ArmLabel::On, 0, "true", 80),
            block(ArmLabel::Off, 0, "false", 80),
            block(ArmLabel::Off, 1, "false", 80),
            block(ArmLabel::On, 1, "true", 20),
        ]);
        assert_eq!(
            record.arm(ArmLabel::On).unwrap().stats.peak_running["prefill"],
            80
        );
        let (_, status, reasons) = verdict(&record);
        assert_eq!(status, Status::Inconclusive);
        assert!(
            reasons.contains("block on-r1 reached at most 20 running requests (prefill)"),
            "{reasons}"
        );
    }
}
