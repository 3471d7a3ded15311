//! The controlled A/B protocol of `bisect run` (DESIGN.md 3.1, 3.6, 3.7).
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
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::classify::Classifier;
use crate::core::session::SessionResult;
use crate::core::verdict::{decide, ArmObservation, Policy};
use crate::driver::metrics;
use crate::driver::{drive, DrivePlan, InFlight};
use crate::exit::Failure;
use crate::launch::Editor;
use crate::results::run_record::{ArmRecord, FlagInfo, RoleInfo, RunRecord, TargetInfo, SCHEMA};
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

/// Where progress goes: a bar on a TTY, plain lines otherwise, nothing in tests.
pub trait Progress: Send + Sync {
    fn arm_started(&self, label: &str, value: &str, repeat: u32, sessions: u64);
    fn session_done(&self, result: &SessionResult);
    fn arm_finished(&self, arm: &ArmRecord);
    fn note(&self, message: &str);
}

/// Progress sink that says nothing.
pub struct Quiet;
impl Progress for Quiet {
    fn arm_started(&self, _: &str, _: &str, _: u32, _: u64) {}
    fn session_done(&self, _: &SessionResult) {}
    fn arm_finished(&self, _: &ArmRecord) {}
    fn note(&self, _: &str) {}
}

/// The order of arm blocks: on, off, then off, on, ... (ABBA), `repeats` pairs.
pub fn arm_order(repeats: u32) -> Vec<(&'static str, u32)> {
    let mut order = Vec::new();
    for r in 0..repeats.max(1) {
        if r % 2 == 0 {
            order.push(("on", r));
            order.push(("off", r));
        } else {
            order.push(("off", r));
            order.push(("on", r));
        }
    }
    order
}

/// Run the experiment. Launch configs are restored before this returns, on every path.
pub async fn run(
    plan: &RunPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<RunRecord> {
    let results = ResultsDir::create(&plan.run_dir)?;
    let mut record = initial_record(plan);
    results.write_record(&record)?;

    refuse_partial(plan)?;

    let files: Vec<PathBuf> = plan.target.roles.iter().map(|r| r.launch.clone()).collect();
    let mut editor = Editor::begin(&plan.journal_dir, &files).with_context(|| {
        format!(
            "journaling launch configs in {}",
            plan.journal_dir.display()
        )
    })?;

    let outcome = run_blocks(
        plan,
        control,
        progress,
        &cancel,
        &mut editor,
        &results,
        &mut record,
    )
    .await;
    let stopped = control.stop().await;
    let restored = editor.restore();

    match outcome {
        Ok(()) => {
            finish_verdict(plan, &mut record);
            record.status = "finished".into();
        }
        Err(ref e) => {
            record.status = if matches!(e.downcast_ref::<Failure>(), Some(Failure::Interrupted)) {
                "interrupted".into()
            } else {
                "failed".into()
            };
            record.error = Some(format!("{e:#}"));
        }
    }
    record.finished_at = Some(now());
    results.write_record(&record)?;
    restored.context("restoring the original launch configs")?;
    outcome?;
    stopped.context("stopping the engines")?;
    Ok(record)
}

fn refuse_partial(plan: &RunPlan) -> anyhow::Result<()> {
    if plan.allow_partial {
        return Ok(());
    }
    let mut flags = vec![&plan.flag];
    flags.extend(plan.sets.iter().map(|(f, _)| f));
    refuse_half_applied(&plan.target, &flags)
}

/// Refuse, before any edit, a flag whose setting also appears in the launch config of a
/// role it does not list (DESIGN.md 3.3): flipping it would half-apply it.
pub fn refuse_half_applied(target: &TargetProfile, flags: &[&FlagSpec]) -> anyhow::Result<()> {
    let mut texts = Vec::new();
    for role in &target.roles {
        let text = std::fs::read_to_string(&role.launch).map_err(|e| {
            Failure::BadInput(format!(
                "{}: cannot read launch config of role {}: {e}",
                role.launch.display(),
                role.name
            ))
        })?;
        texts.push((role.name.clone(), role.launch.clone(), text));
    }
    for flag in flags {
        crate::launch::check_partial(flag, &texts)?;
    }
    Ok(())
}

async fn run_blocks(
    plan: &RunPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: &CancellationToken,
    editor: &mut Editor,
    results: &ResultsDir,
    record: &mut RunRecord,
) -> anyhow::Result<()> {
    for (flag, value) in &plan.sets {
        let readback = editor.apply(flag, value, &plan.target.roles)?;
        progress.note(&format!(
            "pinned {}={} (read back: {})",
            flag.name,
            value,
            fmt_map(&readback)
        ));
    }
    let classifier = Arc::new(Classifier::with_defaults(&plan.workload.tools)?);
    for (label, repeat) in arm_order(plan.repeats) {
        if cancel.is_cancelled() {
            return Err(Failure::Interrupted.into());
        }
        let value = if label == "on" {
            &plan.flag.on
        } else {
            &plan.flag.off
        };
        let readback = editor.apply(&plan.flag, value, &plan.target.roles)?;
        results.snapshot_launch(label, repeat, &plan.target)?;
        let block_name = format!("{label}-r{repeat}");
        progress.note(&format!(
            "arm {label} ({}={value}): configs written and read back ({}), restarting",
            plan.flag.name,
            fmt_map(&readback)
        ));
        let waits = control.restart(&block_name, cancel).await?;
        for role in &plan.target.roles {
            if let Some(info) = fetch_server_info(&role.health).await {
                record
                    .engine_info
                    .insert(format!("{block_name}/{}", role.name), info);
            }
        }
        let mut arm = ArmRecord::new(label, value, Some(repeat));
        arm.readback = readback;
        arm.health_wait_s = waits.values().sum();
        progress.arm_started(label, value, repeat, plan.workload.sessions as u64);
        let spec = BlockSpec {
            target: &plan.target,
            workload: &plan.workload,
            api_key: plan.api_key.clone(),
            metrics_period: plan.metrics_period,
        };
        drive_block(
            &spec,
            &classifier,
            progress,
            cancel,
            results,
            &mut arm,
            repeat,
        )
        .await?;
        control.stop().await?;
        arm.finish();
        progress.arm_finished(&arm);
        record.runs.push(arm);
        record.arms = pooled_arms(plan, &record.runs);
        results.write_record(record)?;
    }
    Ok(())
}

/// What one arm block drives: shared by `bisect run` and the matrix.
pub struct BlockSpec<'a> {
    pub target: &'a TargetProfile,
    pub workload: &'a Workload,
    pub api_key: Option<String>,
    pub metrics_period: Duration,
}

/// Drive one arm block against engines that are already up: all sessions, the metrics
/// poller, the one collector that aggregates into `arm` and streams `sessions.jsonl` and
/// `metrics.csv` into `results`. The caller restarts before and calls `arm.finish()` after.
pub async fn drive_block(
    spec: &BlockSpec<'_>,
    classifier: &Arc<Classifier>,
    progress: &dyn Progress,
    cancel: &CancellationToken,
    results: &ResultsDir,
    arm: &mut ArmRecord,
    repeat: u32,
) -> anyhow::Result<()> {
    let plan = spec;
    let drive_plan = DrivePlan {
        api: plan.target.api.clone(),
        model: plan.target.model.clone(),
        api_key: plan.api_key.clone(),
        workload: plan.workload.clone(),
        label: arm.label.clone(),
        repeat,
        sessions: plan.workload.sessions,
    };
    let inflight = Arc::new(InFlight::default());
    let endpoints: Vec<(String, String)> = plan
        .target
        .roles
        .iter()
        .filter_map(|r| r.metrics.clone().map(|m| (r.name.clone(), m)))
        .collect();
    let poll_cancel = cancel.child_token();
    let poller = tokio::spawn(metrics::poll(
        endpoints,
        inflight.clone(),
        plan.metrics_period,
        poll_cancel.clone(),
    ));
    let (tx, mut rx) = mpsc::channel::<SessionResult>(256);
    let started = Instant::now();
    let driver = {
        let classifier = classifier.clone();
        let inflight = inflight.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move { drive(&drive_plan, classifier, tx, inflight, cancel).await })
    };
    // The one collector: owns the arm's aggregate and the sessions.jsonl stream.
    let mut sessions_out = results.sessions_writer()?;
    while let Some(result) = rx.recv().await {
        arm.counts.add(result.class);
        arm.completion_tokens += result.completion_tokens;
        if let Some(r) = result.first_bad_round {
            let idx = r.saturating_sub(1) as usize;
            if arm.first_bad_round.len() <= idx {
                arm.first_bad_round.resize(idx + 1, 0);
            }
            arm.first_bad_round[idx] += 1;
        }
        sessions_out.append(&result)?;
        progress.session_done(&result);
    }
    let stats = driver.await.context("workload driver panicked")??;
    arm.wall_s = stats
        .wall_s
        .max(started.elapsed().as_secs_f64().min(stats.wall_s.max(1e-9)));
    poll_cancel.cancel();
    let log = poller.await.context("metrics poller panicked")?;
    arm.peak_running = log
        .peak_running
        .iter()
        .map(|(role, peak)| (role.clone(), peak.round() as u64))
        .collect();
    arm.peak_running.insert("client".into(), inflight.peak());
    let mut log = log;
    log.set_label(&format!("{}-r{repeat}", arm.label));
    results.append_metrics(&log)?;
    if cancel.is_cancelled() {
        return Err(Failure::Interrupted.into());
    }
    Ok(())
}

fn pooled_arms(plan: &RunPlan, runs: &[ArmRecord]) -> Vec<ArmRecord> {
    ["on", "off"]
        .iter()
        .filter_map(|label| {
            let blocks: Vec<&ArmRecord> = runs.iter().filter(|r| r.label == *label).collect();
            if blocks.is_empty() {
                return None;
            }
            let value = if *label == "on" {
                &plan.flag.on
            } else {
                &plan.flag.off
            };
            Some(ArmRecord::pool(label, value, &blocks))
        })
        .collect()
}

fn finish_verdict(plan: &RunPlan, record: &mut RunRecord) {
    let (Some(on), Some(off)) = (
        record.arms.iter().find(|a| a.label == "on"),
        record.arms.iter().find(|a| a.label == "off"),
    ) else {
        return;
    };
    let params = plan.workload.params_json();
    let observe = |a: &ArmRecord| ArmObservation {
        label: a.label.clone(),
        value: a.value.clone(),
        sessions: a.sessions,
        counts: a.counts,
        readback: a.readback.clone(),
        peak_running: a.peak_running.clone(),
        wall_s: a.wall_s,
        tokens_per_s: a.tokens_per_s,
        workload: params.clone(),
    };
    let (comparison, confounds, verdict) =
        decide(&observe(on), &observe(off), &plan.policy, &plan.flag.name);
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
        status: "running".into(),
        target: target_info(&plan.target),
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

pub fn target_info(t: &TargetProfile) -> TargetInfo {
    TargetInfo {
        name: t.name.clone(),
        api: t.api.clone(),
        model: t.model.clone(),
        profile: t.source.as_ref().map(|p| p.display().to_string()),
        roles: t
            .roles
            .iter()
            .map(|r| RoleInfo {
                name: r.name.clone(),
                launch: r.launch.display().to_string(),
                restart: r.restart.clone(),
                health: r.health.clone(),
            })
            .collect(),
    }
}

/// `/server_info` beside the health URL, if the engine serves one (sglang and ours do).
pub async fn fetch_server_info(health_url: &str) -> Option<serde_json::Value> {
    let base = health_url.strip_suffix("/health")?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?;
    let resp = client
        .get(format!("{base}/server_info"))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.json().await.ok()
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn fmt_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
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
