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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::arm::{
    fmt_readback, lifecycle, settle, BlockDrive, BlockName, Restarted, Testbed, TestbedOptions,
    TestbedSpec, NO_EFFECTIVE_WARNING,
};
pub use crate::arm::{Progress, Quiet};
use crate::config::Pin;
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::ArmLabel;
use crate::core::classify::Classifier;
use crate::core::cost::{plan as plan_cost, Blocks, Cost, CostUnits, Planned};
use crate::core::evidence::Policy;
use crate::core::phases::Phases;
use crate::core::pressure::{size, Tokens};
use crate::core::solo::SoloOracle;
use crate::core::verdict::decide;
use crate::exit::{Failure, Problem};
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
    pub pins: Vec<Pin>,
    pub run_dir: PathBuf,
    pub policy: Policy,
    pub api_key: Option<String>,
    pub testbed: TestbedOptions,
    /// `--oracle solo`: each block's sessions are also run alone and compared.
    pub oracle: Option<SoloOracle>,
    /// `--adaptive`: blocks alternate until the sequential test decides.
    pub adaptive: Option<AdaptiveOptions>,
    /// `--pressure`: size the filler context to this share of the engine's KV cache
    /// (core::pressure) instead of the workload's `ctx`.
    pub pressure: Option<f64>,
    /// `--restart-cost` / `--session-cost`: the units its planned cost is priced in
    /// where the target has no measured rates (core::cost).
    pub costs: CostUnits,
}

/// What `--adaptive` adds to a run plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdaptiveOptions {
    /// `--max-sessions`: the cap per arm instead of the planned one.
    pub max_sessions: Option<u64>,
}

impl crate::commands::EnginePlan for RunPlan {
    fn engines(&self) -> crate::commands::Engines<'_> {
        crate::commands::Engines::new(&self.target, &self.run_dir, self.api_key.as_deref())
    }

    fn uses_replicas(&self) -> bool {
        true
    }
}

/// The order of arm blocks: on, off, then off, on, ... (ABBA), `repeats` pairs.
pub(crate) fn arm_order(repeats: u32) -> Vec<(ArmLabel, u32)> {
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
    let started = Instant::now();
    let mut phases = Phases::default();
    progress.note(&planned_cost(plan).words);
    let results = ResultsDir::create(&plan.run_dir)?;
    let record = initial_record(plan);
    write_timed(&results, &record, &mut phases)?;

    let mut state = (record, phases);
    let bed = Testbed::open(testbed_spec(plan), control, progress, cancel)?;
    lifecycle(
        bed,
        &mut state,
        async |bed, (record, phases)| run_blocks(plan, bed, &results, record, phases).await,
        |(record, phases), outcome, ending| {
            phases.close_s = ending.close_s;
            if outcome.is_ok() {
                finish_verdict(plan, record);
            }
            end_record(plan, record, phases, started, outcome);
            results.write_record(record)
        },
    )
    .await?;
    Ok(state.0)
}

/// A run's record as it ends, fixed or adaptive: its phases, cost, status, error and end
/// time; the target's measured rates (core::cost::Rates) take in its restarts and waves.
pub(crate) fn end_record(
    plan: &RunPlan,
    record: &mut RunRecord,
    phases: &mut Phases,
    started: Instant,
    outcome: &anyhow::Result<()>,
) {
    end_record_on(plan, record, phases, None, started, outcome)
}

/// [`end_record`] of a run whose blocks ran on several replica sets at once: `lanes` is
/// (the sets, what every set spent: what the target's rates take in, per restart and
/// per wave) while `phases` holds each phase's wall-clock time; `None` on one replica.
pub(crate) fn end_record_on(
    plan: &RunPlan,
    record: &mut RunRecord,
    phases: &mut Phases,
    lanes: Option<(u32, &Phases)>,
    started: Instant,
    outcome: &anyhow::Result<()>,
) {
    phases.finish(started.elapsed().as_secs_f64());
    record.phases = Some(phases.clone());
    let (replicas, serial) = lanes.unwrap_or((1, phases));
    record.cost = Some(Cost::of(phases, replicas));
    (record.header.status, record.error) = settle(outcome);
    record.header.finished_at = Some(now());
    let sessions = record.runs.iter().map(|r| r.sessions).sum();
    let concurrency = plan.workload.target_concurrency();
    crate::results::rates::update(&rates_root(plan), &plan.target.name, |r| {
        r.observe(serial, sessions, concurrency)
    });
}

/// Where the target's measured rates are kept (bisect's state directory).
fn rates_root(plan: &RunPlan) -> PathBuf {
    plan.testbed.state_dir()
}

/// What `plan` is expected to cost (`run --dry-run` prints it; every run says it as it
/// starts): its restarts and blocks priced at `--restart-cost` / `--session-cost`, else
/// at this target's measured rates. An adaptive run's blocks depend on its data: it is
/// priced for its first pair of blocks, and says so.
pub fn planned_cost(plan: &RunPlan) -> Planned {
    let (restart, wave) = super::cost_units(&plan.testbed, &plan.target.name, plan.costs);
    let c = plan.workload.target_concurrency();
    // Blocks at once: a fixed run's sets in pairs (an odd one sits idle), an adaptive
    // run's every set (a pair each).
    let sets = plan.target.replicas.len() as u32 + 1;
    let lanes: u32 = match plan.adaptive {
        Some(_) => sets,
        None => (sets / 2 * 2).max(1),
    };
    let (pairs, sessions) = match &plan.adaptive {
        // The first pair on each set.
        Some(_) => (u64::from(lanes), u64::from(c)),
        None => (u64::from(plan.repeats), u64::from(plan.workload.sessions)),
    };
    let blocks = Blocks {
        restarts: 2 * pairs + u64::from(plan.pressure.is_some()),
        blocks: vec![(sessions, c); 2 * pairs as usize],
    };
    let mut planned = plan_cost(&blocks, lanes, &restart, &wave);
    if plan.adaptive.is_some() {
        planned.words.push_str(&format!(
            " for the first pair of blocks{}; the sequential design adds pairs until its test \
             decides (up to its cap)",
            if lanes > 1 {
                " on each replica set"
            } else {
                ""
            }
        ));
    }
    planned
}

/// How `run` (fixed or adaptive) opens its testbed: the flag under test and the pins.
pub(crate) fn testbed_spec(plan: &RunPlan) -> TestbedSpec<'_> {
    testbed_spec_on(plan, &plan.target)
}

/// [`testbed_spec`] over one replica set of the plan's target.
pub(crate) fn testbed_spec_on<'a>(plan: &'a RunPlan, set: &'a TargetProfile) -> TestbedSpec<'a> {
    let mut flags = vec![&plan.flag];
    flags.extend(plan.pins.iter().map(|p| &p.flag));
    plan.testbed.spec(set, plan.api_key.clone(), flags)
}

/// Rewrite the record's files, counting the time as writing.
pub(crate) fn write_timed(
    results: &ResultsDir,
    record: &RunRecord,
    phases: &mut Phases,
) -> anyhow::Result<()> {
    let started = Instant::now();
    results.write_record(record)?;
    phases.write_s += started.elapsed().as_secs_f64();
    Ok(())
}

async fn run_blocks(
    plan: &RunPlan,
    bed: &mut Testbed<'_>,
    results: &ResultsDir,
    record: &mut RunRecord,
    phases: &mut Phases,
) -> anyhow::Result<()> {
    let editing = Instant::now();
    bed.pin(&plan.pins)?;
    phases.edit_s += editing.elapsed().as_secs_f64();
    let workload = sized_workload(plan, &plan.workload, bed, record, phases).await?;
    let classifier = Arc::new(plan.target.classifier(&workload)?);
    for (label, repeat) in arm_order(plan.repeats) {
        bed.check_cancelled()?;
        let block = BlockSpec {
            label,
            repeat,
            workload: &workload,
        };
        let ran = run_block(plan, bed, results, record, &classifier, block, phases).await?;
        record.runs.push(ran.arm);
        record.arms = pooled_arms(plan, &record.runs);
        write_timed(results, record, phases)?;
    }
    Ok(())
}

/// The workload both arms run: `workload`, or with `--pressure` its filler context
/// sized to that share of the engine's KV cache (core::pressure), read on engines
/// restarted at the value that lets the flag's mechanism run (its `on`, or its `off`
/// for a flag that disables a path), with the pins in place. Recorded in run.json
/// (`pressure`, and the workload's `ctx`).
pub(crate) async fn sized_workload(
    plan: &RunPlan,
    workload: &Workload,
    bed: &mut Testbed<'_>,
    record: &mut RunRecord,
    phases: &mut Phases,
) -> anyhow::Result<Workload> {
    let mut workload = workload.clone();
    let Some(pressure) = plan.pressure else {
        return Ok(workload);
    };
    let (capacity, restarted) = capacity_for_pressure(bed, Some(&plan.flag)).await?;
    count_restart(phases, &restarted);
    let in_flight = u64::from(workload.target_concurrency());
    let tokens = count_tokens(bed, &workload, &capacity, pressure, in_flight).await;
    let sizing = size(&capacity, pressure, in_flight, &tokens);
    workload.ctx = sizing.ctx;
    bed.progress().note(&format!(
        "{}={}: {}",
        plan.flag.name,
        enabling_value(&plan.flag),
        sizing.words()
    ));
    record.workload = workload.params_json();
    record.pressure = Some(sizing);
    Ok(workload)
}

/// The value of `flag` that lets its mechanism run: its `on`, or its `off` for a flag
/// that disables a path.
fn enabling_value(flag: &FlagSpec) -> &str {
    match flag.mechanism.as_ref().map(|m| m.arms) {
        Some(crate::core::mechanism::Arms::Off) => &flag.off,
        _ => &flag.on,
    }
}

/// The engines' KV capacity for `--pressure`, read after a restart at the value of
/// `flag` that lets its mechanism run (as the configs hold it, without a flag), with
/// the pins in place: the restart's time is the caller's to count.
pub(crate) async fn capacity_for_pressure(
    bed: &mut Testbed<'_>,
    flag: Option<&FlagSpec>,
) -> anyhow::Result<(crate::core::pressure::Capacity, crate::arm::Restarted)> {
    if let Some(flag) = flag {
        bed.set(flag, enabling_value(flag))?;
    }
    let restarted = bed.restart("pressure").await?;
    let capacity = bed.capacity().await.map_err(|why| {
        crate::exit::Failure::could_not_run(
            format!("--pressure: could not read the engine's KV capacity: {why}"),
            "pass --ctx instead, sized by hand",
        )
    })?;
    Ok((capacity, restarted))
}

/// A session's tokens against its filler, in the engine's own tokens where it counts
/// them: session 0's opening request counted by the engine at ctx 0 and at the filler
/// the estimate gives `pressure` of `capacity` at `in_flight` (at least 256 so the rise
/// is measurable, at most 2048 so the request fits a small model's context). An engine
/// that counts nothing (or a count that does not rise with the filler) gives the
/// workload's estimate, and the sizing's words say why.
pub(crate) async fn count_tokens(
    bed: &Testbed<'_>,
    workload: &Workload,
    capacity: &crate::core::pressure::Capacity,
    pressure: f64,
    in_flight: u64,
) -> Tokens {
    let estimate = |why: String| Tokens::estimated(workload, why);
    let hint = size(capacity, pressure, in_flight, &estimate(String::new())).ctx;
    match bed.count_prompt(workload, hint.clamp(256, 2048)).await {
        Ok(counted) => Tokens::counted(workload, counted).unwrap_or_else(estimate),
        Err(why) => estimate(why),
    }
}

/// One restart's time into the run's phases.
pub(crate) fn count_restart(phases: &mut Phases, restarted: &crate::arm::Restarted) {
    phases.restarts += 1;
    phases.restart_s += restarted.restart_s;
    phases.health_wait_s += restarted.health_wait_s;
    phases.health_padding_s += restarted.health_padding_s;
}

/// Whether run.json's `warnings` already holds `warning`.
fn has_warning(record: &RunRecord, warning: &str) -> bool {
    record
        .extra
        .get("warnings")
        .and_then(|w| w.as_array())
        .is_some_and(|items| items.iter().any(|w| w == warning))
}

/// Adds `warning` (once) to run.json's `warnings`: what the run could not check.
pub(crate) fn push_warning(record: &mut RunRecord, warning: &str) {
    let list = record
        .extra
        .entry("warnings")
        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    if let serde_json::Value::Array(items) = list {
        if !items.iter().any(|w| w == warning) {
            items.push(warning.into());
        }
    }
}

/// One arm block to run: its arm, its repeat (pair) index, its sessions and load.
pub(crate) struct BlockSpec<'w> {
    pub label: ArmLabel,
    pub repeat: u32,
    pub workload: &'w Workload,
}

/// What one arm block produced.
pub(crate) struct BlockRun {
    pub arm: ArmRecord,
    /// Per session index: `Some(corrupted)` when classified, `None` when it failed
    /// (error, timeout) or never finished.
    pub outcomes: Vec<Option<bool>>,
    /// Stop + restart + health wait, seconds.
    pub restart_s: f64,
    /// Driving, seconds.
    pub drive_s: f64,
}

/// One arm block through the lifecycle: write the flag and read it back, snapshot the
/// configs, restart, refuse a pinned flag the engine does not run with, drive, stop.
/// Each step's time is added to `phases`; engine self-reports go into `record`.
pub(crate) async fn run_block(
    plan: &RunPlan,
    bed: &mut Testbed<'_>,
    results: &ResultsDir,
    record: &mut RunRecord,
    classifier: &Arc<Classifier>,
    spec: BlockSpec<'_>,
    phases: &mut Phases,
) -> anyhow::Result<BlockRun> {
    let BlockSpec {
        label,
        repeat,
        workload,
    } = spec;
    let value = plan.flag.value_for(label == ArmLabel::On);
    let editing = Instant::now();
    let readback = bed.set(&plan.flag, value)?;
    phases.edit_s += editing.elapsed().as_secs_f64();
    let writing = Instant::now();
    results.snapshot_launch(label.as_str(), repeat, bed.target())?;
    phases.write_s += writing.elapsed().as_secs_f64();
    let block_name = format!("{label}-r{repeat}");
    bed.progress().note(&format!(
        "arm {label} ({}={value}): configs written and read back ({}), restarting",
        plan.flag.name,
        fmt_readback(&readback)
    ));
    let mut restarted = bed.restart(&block_name).await?;
    count_restart(phases, &restarted);
    let effective = check_restarted(plan, bed, record, label, &block_name, &mut restarted)?;
    let identity = restarted.identities.clone();
    let block = BlockName {
        label: label.as_str(),
        value,
        repeat,
    };
    let mut arm = ArmRecord::new(label, value, Some(repeat));
    arm.readback = readback;
    arm.effective = effective;
    arm.identity = identity;
    let mut outcomes = vec![None; workload.sessions as usize];
    let driving = Instant::now();
    // With the oracle, the drive's time includes the block's reference pass.
    let (stats, driven, pass) = bed
        .drive_judged_observed(
            BlockDrive {
                block,
                workload,
                classifier,
                results,
            },
            plan.oracle,
            &mut |session| {
                if let Some(slot) = outcomes.get_mut(session.index as usize) {
                    *slot = session
                        .class
                        .is_judged()
                        .then(|| session.class.is_corrupted());
                }
            },
        )
        .await?;
    arm.oracle = pass;
    let drive_s = driving.elapsed().as_secs_f64();
    phases.drive_s += drive_s;
    phases.classify_s += driven.classify_s;
    arm.stats = stats;
    arm.stats.health_wait_s = restarted.health_wait_s;
    arm.finish();
    let stopping = Instant::now();
    bed.stop().await?;
    let stop_s = stopping.elapsed().as_secs_f64();
    phases.restart_s += stop_s;
    Ok(BlockRun {
        arm,
        outcomes,
        restart_s: restarted.restart_s + restarted.health_wait_s + stop_s,
        drive_s,
    })
}

/// What the engines reported after the block's restart, checked: the flag's effective
/// value (warned once in the record when no engine reports it), a pin or the flag that
/// did not take effect refused, and the engines' self-reports kept in `record` under
/// the block's name. Returns the flag's effective value by role.
fn check_restarted(
    plan: &RunPlan,
    bed: &Testbed<'_>,
    record: &mut RunRecord,
    label: ArmLabel,
    block_name: &str,
    restarted: &mut Restarted,
) -> anyhow::Result<BTreeMap<String, String>> {
    let effective = restarted
        .effective
        .get(&plan.flag.name)
        .cloned()
        .unwrap_or_default();
    let unreported = format!("{}: {NO_EFFECTIVE_WARNING}", plan.flag.name);
    if effective.is_empty() && !has_warning(record, &unreported) {
        bed.progress().note(&format!("warning: {unreported}"));
        push_warning(record, &unreported);
    }
    restarted.refuse_pins(None)?;
    if let Some(found) = restarted
        .disagreements
        .iter()
        .find(|d| !d.pinned && d.flag == plan.flag.name)
    {
        return Err(Failure::CouldNotRun(not_taking_effect(
            &plan.flag,
            label,
            &found.disagreement,
        ))
        .into());
    }
    for (role, info) in std::mem::take(&mut restarted.engine_info) {
        record
            .engine_info
            .insert(format!("{block_name}/{role}"), info);
    }
    Ok(effective)
}

/// Why an arm is refused before its sessions: its engine reports running the flag with
/// another value than the arm wrote. Either the other arm's value (the engine ran the
/// same setting in both arms: vLLM on CPU replaces the attention backend with its own and
/// turns async scheduling off, whatever the launch says) or neither (the engine put its
/// own in place): an A/B of it could only clear a setting that never took effect.
fn not_taking_effect(
    flag: &FlagSpec,
    label: ArmLabel,
    d: &crate::core::effective::Disagreement,
) -> Problem {
    let other = flag.value_for(label != ArmLabel::On);
    let other_label = if label == ArmLabel::On { "off" } else { "on" };
    let what = if crate::core::effective::agrees(other, &d.reported) {
        format!(
            "the value arm {other_label} sets: the engine ran the same {} in both arms",
            flag.name
        )
    } else {
        format!(
            "neither arm's value (on {}, off {}): the engine put its own value of {} in place",
            flag.on, flag.off, flag.name
        )
    };
    Problem::new(
        format!(
            "arm {label} set {}={} but the {} engine reports it runs with {:?}, {what}; an A/B \
             could only clear a setting that never took effect, so it is refused before this \
             arm's sessions",
            flag.name, d.expected, d.role, d.reported
        ),
        "check that the launch config applies the flag (a dead conditional, an overriding \
         later line, an ignored variable) and that this engine build honours it at all (vLLM \
         on CPU replaces the attention backend and turns async scheduling off); `bisect \
         check` shows what the running engine reports",
    )
}

pub(crate) fn pooled_arms(plan: &RunPlan, runs: &[ArmRecord]) -> Vec<ArmRecord> {
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

pub(crate) fn finish_verdict(plan: &RunPlan, record: &mut RunRecord) {
    let (Some(on), Some(off)) = (record.arm(ArmLabel::On), record.arm(ArmLabel::Off)) else {
        return;
    };
    // The workload the arms ran (its ctx sized by --pressure where asked).
    let params = record.workload.clone();
    let (comparison, confounds, verdict) = decide(
        &on.observe(&params),
        &off.observe(&params),
        &record.block_observations(&params),
        &plan.policy,
        &plan.flag.name,
    );
    record.comparison = Some(comparison);
    record.confounds = confounds;
    record.verdict = Some(verdict);
}

pub(crate) fn initial_record(plan: &RunPlan) -> RunRecord {
    let flag = FlagInfo::of(&plan.flag);
    RunRecord {
        header: crate::results::RecordHeader::running(
            SCHEMA,
            &plan.id,
            &plan.command,
            now(),
            TargetInfo::of(&plan.target),
        ),
        flag,
        workload: plan.workload.params_json(),
        sets: plan
            .pins
            .iter()
            .map(|p| (p.flag.name.clone(), p.value.clone()))
            .collect(),
        arms: Vec::new(),
        runs: Vec::new(),
        comparison: None,
        confounds: Vec::new(),
        verdict: None,
        engine_info: BTreeMap::new(),
        error: None,
        adaptive: None,
        phases: None,
        cost: None,
        pressure: None,
        extra: serde_json::Map::new(),
    }
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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

    /// An engine that runs a value of its own (neither arm's) is named so, with both
    /// arms' values; one that runs the other arm's value is "the same in both arms".
    #[test]
    fn an_arm_whose_engine_runs_another_value_is_refused_in_words() {
        let flag = FlagSpec {
            name: "ATTENTION_BACKEND".into(),
            doc: String::new(),
            setting: crate::core::flag::Setting::Env("VLLM_ATTENTION_BACKEND".into()),
            roles: vec!["server".into()],
            on: "TRITON_ATTN".into(),
            off: "FLASH_ATTN".into(),
            source: "flags/ATTENTION_BACKEND.toml".into(),
            mechanism: None,
        };
        let ran = |reported: &str| crate::core::effective::Disagreement {
            role: "server".into(),
            expected: "TRITON_ATTN".into(),
            reported: reported.into(),
        };
        let own = not_taking_effect(&flag, ArmLabel::On, &ran("CPU_ATTN"));
        assert!(
            own.fix.as_deref().is_some_and(|fix| fix
                .starts_with("check that the launch config applies the flag (a dead conditional")),
            "{own}"
        );
        let own = own.to_string();
        assert!(
            own.starts_with(
                "arm on set ATTENTION_BACKEND=TRITON_ATTN but the server engine reports it runs \
                 with \"CPU_ATTN\", neither arm's value (on TRITON_ATTN, off FLASH_ATTN): the \
                 engine put its own value of ATTENTION_BACKEND in place; an A/B could only clear"
            ),
            "{own}"
        );
        let same = not_taking_effect(&flag, ArmLabel::On, &ran("FLASH_ATTN")).message;
        assert!(
            same.contains(
                "the value arm off sets: the engine ran the same ATTENTION_BACKEND in both arms"
            ),
            "{same}"
        );
    }
}
