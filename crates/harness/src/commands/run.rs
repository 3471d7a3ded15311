//! The controlled A/B protocol of `bisect run` (docs/design.md 3.1, 3.6, 3.7).
//!
//! Owns the order of operations that the seed articles got wrong by hand: refuse a
//! half-applied flag before touching anything, journal the launch configs, write the flag
//! into every role and read it back, restart, wait for health, drive the workload, and
//! restore the originals byte-for-byte whatever happens. Arms are interleaved over
//! repeats (on, off, off, on, ...) so drift in the machine does not line up with an arm.
//! Results are rewritten after every arm block, so a crash loses at most the sessions
//! in flight.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::arm::{effective_values, fmt_readback, settle, BlockName, Testbed, TestbedSpec};
pub use crate::arm::{Progress, Quiet};
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::{ArmLabel, RecordStatus};
use crate::core::classify::Classifier;
use crate::core::verdict::{decide, Policy};
use crate::exit::Failure;
use crate::results::run_record::{ArmRecord, FlagInfo, RunRecord, TargetInfo, SCHEMA};
use crate::results::ResultsDir;

/// Everything `bisect run` needs, validated.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub id: String,
    pub command: String,
    pub flag: FlagSpec,
    pub target: TargetProfile,
    pub workload: Workload,
    pub repeats: u32,
    /// Other flags pinned for both arms (`--set`).
    pub sets: Vec<(FlagSpec, String)>,
    pub run_dir: PathBuf,
    pub journal_dir: PathBuf,
    pub policy: Policy,
    pub allow_partial: bool,
    pub api_key: Option<String>,
    pub metrics_period: Duration,
}

/// The order of arm blocks: on, off, then off, on, ... (ABBA), `repeats` pairs.
pub fn arm_order(repeats: u32) -> Vec<(ArmLabel, u32)> {
    let mut order = Vec::new();
    for r in 0..repeats.max(1) {
        if r % 2 == 0 {
            order.push((ArmLabel::On, r));
            order.push((ArmLabel::Off, r));
        } else {
            order.push((ArmLabel::Off, r));
            order.push((ArmLabel::On, r));
        }
    }
    order
}

/// Run the experiment. Launch configs are restored before this returns, on every path.
pub async fn run_experiment(
    plan: &RunPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<RunRecord> {
    let results = ResultsDir::create(&plan.run_dir)?;
    let mut record = initial_record(plan);
    results.write_record(&record)?;

    let mut flags = vec![&plan.flag];
    flags.extend(plan.sets.iter().map(|(f, _)| f));
    let spec = TestbedSpec {
        target: &plan.target,
        journal_dir: Some(&plan.journal_dir),
        flags,
        allow_partial: plan.allow_partial,
        api_key: plan.api_key.clone(),
        metrics_period: plan.metrics_period,
    };
    let mut bed = Testbed::open(spec, control, progress, cancel)?;
    let outcome = run_blocks(plan, &mut bed, &results, &mut record).await;
    let closed = bed.close().await;

    if outcome.is_ok() {
        finish_verdict(plan, &mut record);
    }
    (record.status, record.error) = settle(&outcome);
    record.finished_at = Some(now());
    results.write_record(&record)?;
    closed.combine(outcome)?;
    Ok(record)
}

async fn run_blocks(
    plan: &RunPlan,
    bed: &mut Testbed<'_>,
    results: &ResultsDir,
    record: &mut RunRecord,
) -> anyhow::Result<()> {
    bed.pin(&plan.sets)?;
    let classifier = Arc::new(Classifier::new(&plan.workload.tools, &plan.target.markup)?);
    for (label, repeat) in arm_order(plan.repeats) {
        bed.check_cancelled()?;
        let value = plan.flag.value_for(label == ArmLabel::On);
        let readback = bed.set(&plan.flag, value)?;
        results.snapshot_launch(label.as_str(), repeat, &plan.target)?;
        let block_name = format!("{label}-r{repeat}");
        bed.progress().note(&format!(
            "arm {label} ({}={value}): configs written and read back ({}), restarting",
            plan.flag.name,
            fmt_readback(&readback)
        ));
        let restarted = bed.restart(&block_name).await?;
        let effective = effective_values(&plan.flag, &restarted.engine_info);
        for (flag, value) in &plan.sets {
            for (role, ran) in effective_values(flag, &restarted.engine_info) {
                if !crate::core::effective::agrees(value, &ran) {
                    return Err(Failure::CouldNotRun(format!(
                        "pinned {}={value}, but the {role} engine reports it runs with {ran:?}: \
                         the launch config does not take effect\n  fix: check how role {role}'s \
                         launch config sets {} (a conditional, an overriding later line)",
                        flag.name,
                        flag.setting.key()
                    ))
                    .into());
                }
            }
        }
        for (role, info) in restarted.engine_info {
            record
                .engine_info
                .insert(format!("{block_name}/{role}"), info);
        }
        let block = BlockName {
            label: label.as_str(),
            value,
            repeat,
        };
        let mut arm = ArmRecord::new(label, value, Some(repeat));
        arm.readback = readback;
        arm.effective = effective;
        arm.stats = bed
            .drive(block, &plan.workload, &classifier, results)
            .await?;
        arm.stats.health_wait_s = restarted.health_wait_s;
        arm.finish();
        bed.stop().await?;
        record.runs.push(arm);
        record.arms = pooled_arms(plan, &record.runs);
        results.write_record(record)?;
    }
    Ok(())
}

fn pooled_arms(plan: &RunPlan, runs: &[ArmRecord]) -> Vec<ArmRecord> {
    ArmLabel::AB
        .iter()
        .filter_map(|&label| {
            let blocks: Vec<&ArmRecord> = runs.iter().filter(|r| r.label == label).collect();
            if blocks.is_empty() {
                return None;
            }
            Some(ArmRecord::pool(
                label,
                plan.flag.value_for(label == ArmLabel::On),
                &blocks,
            ))
        })
        .collect()
}

fn finish_verdict(plan: &RunPlan, record: &mut RunRecord) {
    let (Some(on), Some(off)) = (record.arm(ArmLabel::On), record.arm(ArmLabel::Off)) else {
        return;
    };
    let params = plan.workload.params_json();
    let (comparison, confounds, verdict) = decide(
        &on.observe(&params),
        &off.observe(&params),
        &plan.policy,
        &plan.flag.name,
    );
    record.comparison = Some(comparison);
    record.confounds = confounds;
    record.verdict = Some(verdict);
}

fn initial_record(plan: &RunPlan) -> RunRecord {
    let f = &plan.flag;
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
    RunRecord {
        schema: SCHEMA.into(),
        id: plan.id.clone(),
        command: plan.command.clone(),
        started_at: now(),
        finished_at: None,
        status: RecordStatus::Running,
        target: TargetInfo::of(&plan.target),
        flag,
        workload: plan.workload.params_json(),
        sets: plan
            .sets
            .iter()
            .map(|(f, v)| (f.name.clone(), v.clone()))
            .collect(),
        arms: Vec::new(),
        runs: Vec::new(),
        comparison: None,
        confounds: Vec::new(),
        verdict: None,
        engine_info: BTreeMap::new(),
        error: None,
        extra: serde_json::Map::new(),
    }
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Directory helpers used by callers that need a path relative to the run.
pub fn launch_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("launch")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_interleave_abba() {
        let order: Vec<String> = arm_order(3)
            .iter()
            .map(|(l, r)| format!("{l}{r}"))
            .collect();
        assert_eq!(order, ["on0", "off0", "off1", "on1", "on2", "off2"]);
        assert_eq!(arm_order(0).len(), 2);
    }
}
