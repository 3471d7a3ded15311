//! `bisect culprit --flags A,B,C [--budget SESSIONS] [--set NAME=VALUE]... [--resume DIR]`:
//! which values of the listed flags, in the configuration as it is, make the engine fail
//! (docs/culprit.md). Orchestration only: the search itself is [`crate::core::culprit`]
//! (pure: a sans-IO state machine, driven by [`crate::commands::blocks::drive`]); this
//! module reads each flag's failing value from the launch
//! configs, opens the [`crate::arm::Testbed`] (journal, pins), runs the search with the
//! real [`runner::TestbedRunner`] (or replays `steps.jsonl` first on `--resume`), writes
//! `culprit.json`, `summary.md` and `report.html` after every block, and closes the
//! testbed (configs restored byte for byte) on every path.
//!
//! Refused before any edit (exit 2): fewer than two flags, a flag given twice, a flag
//! both listed and pinned, a half-applied flag, a flag whose value in the launch configs
//! differs between its roles, and a budget below the two blocks that the ends need.
//!
//! Results: `<results>/<id>/` holds culprit.json, summary.md, report.html, steps.jsonl
//! and `blocks/bNNN/` (each block's sessions.jsonl, metrics.csv and launch configs).

pub mod export;
mod lanes;
pub mod record;
pub(crate) mod runner;
mod steplog;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::arm::{lifecycle_lanes, open_lanes, settle, Progress, Testbed, TestbedOptions};
use crate::commands::answer::SearchAnswer;
use crate::commands::blocks::{drive, EventSink};
use crate::config::Pin;
use crate::config::{FlagSpec, Setting, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::classify::Classifier;
use crate::core::cost::{plan_between, Blocks, Planned};
use crate::core::culprit::{
    navigate_alpha, search, Answer, BlockOutcome, BlockRequest, Event, FlagValues, SearchParams,
    SearchReport, StepRecord, MIN_BLOCK,
};
use crate::core::evidence::Policy;
use crate::exit::Failure;
use crate::launch::read_setting;
use crate::results::run_record::TargetInfo;
use record::{BlockSummary, CulpritRecord, FlagValue, UntestableFlag, SCHEMA};

/// The budget when `--budget` is not given: sessions, all blocks together. Sized by the
/// simulation (`cargo bench --bench culprit`): the 95th percentile of the costliest
/// scenario with six flags, a flaky background, stays under it.
pub const DEFAULT_BUDGET: u64 = 2400;

/// Everything `bisect culprit` needs, validated by [`CulpritPlan::validate`].
#[derive(Debug, Clone)]
pub struct CulpritPlan {
    pub id: String,
    pub command: String,
    pub flags: Vec<FlagSpec>,
    /// Pinned for every block.
    pub pins: Vec<Pin>,
    pub target: TargetProfile,
    /// The base workload: its concurrency is the load every block runs at.
    pub workload: Workload,
    pub budget: u64,
    pub policy: Policy,
    /// `results/<id>/` (on `--resume`, the directory resumed).
    pub dir: PathBuf,
    pub testbed: TestbedOptions,
    pub api_key: Option<String>,
    /// Replay `dir/steps.jsonl` before running anything.
    pub resume: bool,
    /// `--oracle solo`: every block's sessions are also run alone and compared.
    pub oracle: Option<crate::core::solo::SoloOracle>,
}

impl crate::commands::EnginePlan for CulpritPlan {
    fn engines(&self) -> crate::commands::Engines<'_> {
        crate::commands::Engines::new(&self.target, &self.dir, self.api_key.as_deref())
    }

    fn uses_replicas(&self) -> bool {
        self.sets() > 1
    }

    fn first_set_reason(&self) -> Option<&'static str> {
        Some(
            "a block is under four waves at the load: split over the sets, a set's share \
             would hold the load for less than two waves, and different configurations on \
             different sets would split the search's comparisons",
        )
    }
}

impl CulpritPlan {
    /// The replica sets every block is split over: as many of the target's as give each
    /// share two waves at the load (core::culprit::split_sets); one on a single replica.
    pub fn sets(&self) -> usize {
        let sets = self.target.replicas.len() + 1;
        if sets < 2 {
            return 1;
        }
        let c = self.workload.target_concurrency();
        crate::core::culprit::split_sets(u64::from(c).max(MIN_BLOCK), c, sets)
    }
}

impl CulpritPlan {
    /// Refuse, before any edit, what cannot give a meaningful search (exit 2).
    pub fn validate(&self) -> anyhow::Result<()> {
        check_request(&self.flags, self.budget, &self.workload)?;
        for Pin {
            flag: pinned,
            value: _,
        } in &self.pins
        {
            if self.flags.iter().any(|f| f.name == pinned.name) {
                return Err(Failure::bad_input(
                    format!("--set {}: the flag is also listed in --flags", pinned.name),
                    "list it or pin it, not both",
                )
                .into());
            }
        }
        if !self.testbed.allow_partial {
            let flags: Vec<&FlagSpec> = self
                .flags
                .iter()
                .chain(self.pins.iter().map(|p| &p.flag))
                .collect();
            crate::arm::refuse_half_applied(&self.target, &flags)?;
        }
        failing_values(&self.target, &self.flags)?;
        Ok(())
    }

    /// The classifier every block uses: the workload's tools, and the target profile's
    /// markup families (what counts as a leak) and rejection patterns (which error
    /// replies are the engine refusing a tool call), as `bisect run` classifies.
    fn classifier(&self) -> anyhow::Result<Classifier> {
        self.target.classifier(&self.workload)
    }

    /// The `--set` pins as `NAME=VALUE`, as the step log and the record name them.
    fn pinned(&self) -> Vec<String> {
        self.pins.iter().map(Pin::words).collect()
    }

    fn search_params(&self, flags: Vec<FlagValues>) -> SearchParams {
        let mut p = SearchParams::new(
            flags,
            self.workload.target_concurrency(),
            self.budget,
            self.workload.seed,
        );
        p.alpha = self.policy.alpha;
        p.navigate_alpha = navigate_alpha(self.policy.alpha);
        p.min_effect = self.policy.min_effect;
        p.degraded_fraction = self.policy.degraded_fraction;
        p.min_load_fraction = self.policy.min_load_fraction;
        p
    }
}

impl CulpritPlan {
    /// What the search is planned to cost (`culprit --dry-run`): its blocks depend on
    /// what it finds, so it is priced at its fewest (a failing end that is degraded or
    /// cannot fail ends it after one block) and at its most (the budget in blocks).
    pub fn planned_cost(&self, given: crate::core::cost::CostUnits) -> Planned {
        let p = self.search_params(Vec::new());
        let most = (self.budget / p.block.max(1)).max(1);
        // On replica sets every block restarts every set, and its waves are spread over
        // them (each set drives its share at the block's load): core::cost::plan's lanes.
        let sets = self.sets() as u64;
        let block = (p.block, p.concurrency);
        let blocks = |n: u64| Blocks {
            restarts: n * sets,
            blocks: vec![block; n as usize],
        };
        let (restart, wave) = crate::commands::cost_units(&self.testbed, &self.target.name, given);
        plan_between(&blocks(1), &blocks(most), sets as u32, &restart, &wave)
    }
}

/// The checks that need no launch config: at least two flags, none twice, and a budget
/// that pays for both ends.
pub fn check_request(flags: &[FlagSpec], budget: u64, workload: &Workload) -> Result<(), Failure> {
    let k = flags.len();
    if k < 2 {
        return Err(Failure::bad_input(
            format!("culprit search needs at least 2 flags, got {k}"),
            "pass --flags A,B[,C...], or use `bisect run --flag NAME` for one flag",
        ));
    }
    for (i, f) in flags.iter().enumerate() {
        if flags[..i].iter().any(|g| g.name == f.name) {
            return Err(Failure::bad_input(
                format!("flag {} is given twice in --flags", f.name),
                "name each flag once",
            ));
        }
    }
    let block = u64::from(workload.target_concurrency()).max(MIN_BLOCK);
    if budget < 2 * block {
        return Err(Failure::bad_input(
            format!(
                "--budget {budget} cannot pay for the two ends of the search (a block of {block} sessions each, at {} in flight)",
                workload.target_concurrency()
            ),
            format!(
                "pass --budget {} or more (the default is {DEFAULT_BUDGET})",
                2 * block
            ),
        ));
    }
    Ok(())
}

/// How the launch config spells `flag` at `value`.
fn setting_words(flag: &FlagSpec, value: &str) -> String {
    match &flag.setting {
        Setting::Env(var) => format!("{var}={value}"),
        Setting::Arg(arg) => format!("{arg} {value}"),
        Setting::Switch(sw) if value == flag.on => sw.clone(),
        Setting::Switch(sw) => format!("no {sw}"),
    }
}

/// Each flag's value in the launch configs as they are (the failing configuration), and
/// the value that flips it: `off` for a flag at `on`, else `on`. A flag absent from the
/// configs runs at the engine's default, which the catalog's `on` names.
fn failing_values(target: &TargetProfile, flags: &[FlagSpec]) -> anyhow::Result<Vec<FlagValues>> {
    let mut out = Vec::new();
    for flag in flags {
        let mut seen: Vec<(String, String)> = Vec::new();
        for role in target.roles.iter().filter(|r| flag.roles.contains(&r.name)) {
            let text = crate::arm::read_launch(role)?;
            let value = read_setting(&text, &flag.setting, flag).unwrap_or_else(|| flag.on.clone());
            seen.push((role.name.clone(), value));
        }
        let Some((_, failing)) = seen.first().cloned() else {
            return Err(Failure::bad_input(
                format!(
                    "flag {} lists roles {:?}, none of which the target has",
                    flag.name, flag.roles
                ),
                format!("correct the flag's roles in {}", flag.source.display()),
            )
            .into());
        };
        if let Some((role, other)) = seen.iter().find(|(_, v)| *v != failing) {
            return Err(Failure::bad_input(
                format!(
                    "flag {} is {failing} in role {}'s launch config but {other} in role {role}'s: the configuration as it is is half-applied",
                    flag.name, seen[0].0
                ),
                "make the roles agree, or pin the flag with --set",
            )
            .into());
        }
        let passing = if failing == flag.on {
            flag.off.clone()
        } else {
            flag.on.clone()
        };
        out.push(FlagValues {
            name: flag.name.clone(),
            failing,
            passing,
        });
    }
    Ok(out)
}

/// Every set a block is split over must hold the listed flags at the first set's values
/// (`flags`): else the sets would run different configurations under one block.
fn same_values_on_every_set(
    sets: &[TargetProfile],
    specs: &[FlagSpec],
    flags: &[FlagValues],
) -> anyhow::Result<()> {
    for set in sets.iter().skip(1) {
        for (spec, (found, first)) in specs
            .iter()
            .zip(failing_values(set, specs)?.iter().zip(flags))
        {
            if found.failing != first.failing {
                return Err(Failure::bad_input(
                    format!(
                        "flag {} is {} in replica {}'s launch configs but {} in replica {}'s: split over the sets, one block would run two configurations",
                        spec.name,
                        first.failing,
                        sets[0].replica_name(),
                        found.failing,
                        set.replica_name()
                    ),
                    "make the replica sets' launch configs agree on the listed flags",
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Rewrites the record after every block and step, and the step log.
struct Recorder<'a> {
    log: steplog::StepLog,
    record: &'a mut CulpritRecord,
    dir: PathBuf,
    started: Instant,
}

impl EventSink<Event> for Recorder<'_> {
    fn event(&mut self, event: Event) -> anyhow::Result<()> {
        match event {
            Event::Block(request, outcome) => self.block(&request, &outcome),
            Event::Step(step) => self.step(step),
        }
    }
}

impl Recorder<'_> {
    fn block(&mut self, request: &BlockRequest, outcome: &BlockOutcome) -> anyhow::Result<()> {
        self.log.block(request, outcome)?;
        for warning in &outcome.warnings {
            if !self.record.warnings.contains(warning) {
                self.record.warnings.push(warning.clone());
            }
        }
        self.record.blocks.push(summary(request, outcome));
        self.record.check_replicas();
        self.record.sessions_spent += request.sessions;
        // Every set restarts for its share.
        self.record.restarts += outcome.sets.len().max(1) as u64;
        self.record.wall_s = self.started.elapsed().as_secs_f64();
        export::write(&self.dir, self.record)
    }

    fn step(&mut self, step: StepRecord) -> anyhow::Result<()> {
        self.log.step(&step)?;
        self.record.steps.push(step);
        export::write(&self.dir, self.record)
    }
}

fn summary(request: &BlockRequest, outcome: &BlockOutcome) -> BlockSummary {
    BlockSummary {
        block: request.block,
        failing: request.failing.clone(),
        sessions: request.sessions,
        corrupted: outcome.classes.iter().filter(|c| c.is_corrupted()).count() as u64,
        error_timeout: outcome.classes.iter().filter(|c| c.is_failure()).count() as u64,
        peak_engine: outcome.peak_engine,
        seed: request.seed,
        wall_s: outcome.wall_s,
        dir: runner::block_dir(request.block),
        sets: outcome.sets.clone(),
    }
}

/// Run the search on the target's first set. Launch configs are restored before this
/// returns, on every path; culprit.json says how far it got.
pub async fn run(
    plan: &CulpritPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<CulpritRecord> {
    run_with(plan, 1, vec![control], progress, cancel).await
}

/// Run the search with every block split over [`CulpritPlan::sets`] replica sets (on
/// `--resume`, over the sets its step log names: one for a log that names none), one
/// control per set in the target's order. Every set's launch configs are restored
/// before this returns, on every path.
pub async fn run_on_sets(
    plan: &CulpritPlan,
    controls: Vec<&mut dyn EngineControl>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<CulpritRecord> {
    let sets = if plan.resume {
        steplog::read(&plan.dir.join("steps.jsonl"))?
            .header
            .sets
            .len()
            .max(1)
    } else {
        plan.sets()
    };
    run_with(plan, sets, controls, progress, cancel).await
}

/// The search with every block split over the target's first `split` sets.
async fn run_with(
    plan: &CulpritPlan,
    split: usize,
    controls: Vec<&mut dyn EngineControl>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<CulpritRecord> {
    plan.validate()?;
    let sets: Vec<TargetProfile> = match split {
        0 | 1 => vec![plan.target.clone()],
        n => plan.target.replica_sets().into_iter().take(n).collect(),
    };
    anyhow::ensure!(
        controls.len() >= sets.len(),
        "a culprit search on {} replica sets with {} engine controls",
        sets.len(),
        controls.len()
    );
    let names: Vec<String> = if sets.len() > 1 {
        sets.iter().map(|s| s.replica_name().to_string()).collect()
    } else {
        Vec::new()
    };
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("creating {}", plan.dir.display()))?;
    let flags = failing_values(&plan.target, &plan.flags)?;
    same_values_on_every_set(&sets, &plan.flags, &flags)?;
    let params = plan.search_params(flags.clone());
    let header = steplog::Header {
        flags: flags.clone(),
        concurrency: params.concurrency,
        block: params.block,
        look: params.look,
        seed: params.seed,
        budget: params.budget,
        pinned: plan.pinned(),
        sets: names.clone(),
    };
    let log_path = plan.dir.join("steps.jsonl");
    let logged = if plan.resume {
        logged_blocks(&log_path, &header)?
    } else {
        Vec::new()
    };
    let mut record = started_record(plan, &params);
    record.replica_sets = names.clone();
    export::write(&plan.dir, &record)?;
    if !names.is_empty() {
        let idle: Vec<String> = plan
            .target
            .replica_sets()
            .iter()
            .skip(sets.len())
            .map(|s| s.replica_name().to_string())
            .collect();
        progress.note(&format!(
            "replicas {}: every block split over the sets at once, {} sessions each at {} in flight{}",
            names.join(", "),
            params.block.div_ceil(sets.len() as u64),
            params.concurrency,
            if idle.is_empty() {
                String::new()
            } else {
                format!(
                    "; replica {} sits idle (a share over more sets would hold the load for less than two waves)",
                    idle.join(", ")
                )
            }
        ));
    }

    let written: Vec<&FlagSpec> = plan
        .flags
        .iter()
        .chain(plan.pins.iter().map(|p| &p.flag))
        .collect();
    let specs = plan
        .testbed
        .lane_specs(&sets, plan.api_key.as_deref(), &written);
    let lane_progress = crate::commands::replicas::lane_progress(&sets, progress);
    // A set that fails stops the others; Ctrl-C stops them all.
    let stop = cancel.child_token();
    let controls: Vec<&mut dyn EngineControl> = controls
        .into_iter()
        .take(sets.len())
        .map(|c| -> &mut dyn EngineControl { c })
        .collect();
    let started = Instant::now();
    let body = async |beds: &mut [Testbed<'_>], record: &mut CulpritRecord| {
        for bed in beds.iter_mut() {
            bed.pin(&plan.pins)?;
        }
        let classifier = Arc::new(plan.classifier()?);
        let split = beds.len() > 1;
        let runners = beds
            .iter_mut()
            .enumerate()
            .map(|(j, bed)| {
                let share = split.then(|| bed.target().replica_name().to_string());
                runner::TestbedRunner {
                    bed,
                    flags: plan.flags.clone(),
                    pins: plan.pins.clone(),
                    warned: Vec::new(),
                    workload: plan.workload.clone(),
                    classifier: classifier.clone(),
                    dir: plan.dir.clone(),
                    announce: j == 0,
                    oracle: plan.oracle,
                    share,
                }
            })
            .collect();
        let live = lanes::SplitRunner {
            sets: runners,
            stop: stop.clone(),
            cancel: cancel.clone(),
        };
        let mut runner = steplog::Replay::new(logged, live);
        let mut recorder = Recorder {
            log: steplog::StepLog::create(&log_path, &header)?,
            record,
            dir: plan.dir.clone(),
            started,
        };
        let report = drive(search(params.clone()), &mut runner, &mut recorder)
            .await
            .and_then(|report| Ok(report?));
        recorder.record.replayed_blocks = runner.replayed;
        report
    };
    let beds = open_lanes(specs, controls, &lane_progress, stop.clone()).await?;
    lifecycle_lanes(beds, &mut record, body, |record, outcome, ending| {
        if let Ok(report) = outcome {
            record_answer(record, plan, &flags, report);
        }
        record.wall_s = started.elapsed().as_secs_f64();
        record.cost = Some(ending.cost(record.wall_s));
        ending.keep_rates(&plan.testbed.state_dir(), &plan.target.name);
        record.header.finished_at = Some(crate::commands::run::now());
        (record.header.status, record.error) = settle(outcome);
        export::write(&plan.dir, record)
    })
    .await?;
    Ok(record)
}

/// The blocks of `log_path` for `--resume`, refused when the search it logged is not
/// this one (`header`).
fn logged_blocks(
    log_path: &Path,
    header: &steplog::Header,
) -> anyhow::Result<Vec<(BlockRequest, BlockOutcome)>> {
    let logged = steplog::read(log_path)?;
    if logged.header != *header {
        return Err(Failure::bad_input(
            format!(
                "{}: the search it logged differs from this one (logged {:?}; now {:?})",
                log_path.display(),
                logged.header,
                header
            ),
            "resume with the same --flags, --set, --concurrency, --seed and --budget, on a target with the same replica sets, and unchanged launch configs",
        )
        .into());
    }
    Ok(logged.blocks)
}

/// culprit.json as the search starts: what it was asked, nothing found yet.
fn started_record(plan: &CulpritPlan, params: &SearchParams) -> CulpritRecord {
    CulpritRecord {
        header: crate::results::RecordHeader::running(
            SCHEMA,
            &plan.id,
            &plan.command,
            crate::commands::run::now(),
            TargetInfo::of(&plan.target),
        ),
        workload: plan.workload.params_json(),
        concurrency: params.concurrency,
        block_sessions: params.block,
        look_sessions: params.look,
        budget: params.budget,
        alpha: params.alpha,
        navigate_alpha: params.navigate_alpha,
        min_effect: params.min_effect,
        pinned: plan.pinned(),
        markup: plan.target.markup.clone(),
        flags: params.flags.clone(),
        answer: None,
        verdict: None,
        culprit: Vec::new(),
        untestable: Vec::new(),
        other_failures: Vec::new(),
        warnings: Vec::new(),
        steps: Vec::new(),
        blocks: Vec::new(),
        sessions_spent: 0,
        restarts: 0,
        replayed_blocks: 0,
        wall_s: 0.0,
        replica_sets: Vec::new(),
        replica_check: None,
        cost: None,
        error: None,
    }
}

/// The search's answer into the record: the culprit and untestable flags as the catalog
/// names them and the launch config spells them.
fn record_answer(
    record: &mut CulpritRecord,
    plan: &CulpritPlan,
    flags: &[FlagValues],
    report: &SearchReport,
) {
    let show = |i: usize| {
        let spec = &plan.flags[i];
        FlagValue {
            flag: spec.name.clone(),
            value: flags[i].failing.clone(),
            setting: setting_words(spec, &flags[i].failing),
        }
    };
    record.answer = Some(match &report.answer {
        Answer::Culprit { .. } => SearchAnswer::Culprit,
        Answer::NoCulprit => SearchAnswer::NoCulprit,
        Answer::CouldNotReproduce => SearchAnswer::CouldNotReproduce,
        Answer::Inconclusive => SearchAnswer::Inconclusive,
    });
    if let Answer::Culprit { flags: set } = &report.answer {
        record.culprit = set.iter().map(|&i| show(i)).collect();
    }
    record.untestable = report
        .untestable
        .iter()
        .map(|u| {
            let v = show(u.flag);
            UntestableFlag {
                flag: v.flag,
                value: v.value,
                setting: v.setting,
                reason: u.reason.clone(),
            }
        })
        .collect();
    record.other_failures = report.other_failures.clone();
    record.verdict = Some(report.verdict.clone());
    record.sessions_spent = report.sessions_spent;
    // The search counts blocks; a block split over sets restarts every one of them.
    record.restarts = record
        .blocks
        .iter()
        .map(|b| b.sets.len().max(1) as u64)
        .sum();
}
