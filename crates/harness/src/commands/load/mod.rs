//! `bisect load [--flag NAME] [--levels 1,8,16,32,64,80 | --max C] [--adaptive]`: the
//! corruption rate as a function of sessions in flight, and the lowest load at which
//! the bug appears (docs/load.md). Orchestration only: the sweep is
//! [`crate::core::load`] (a sans-IO state machine, driven by
//! [`crate::commands::blocks::drive`]); this module opens the
//! [`Testbed`] (journal, pins), runs every block through the culprit search's real block
//! runner (write the flag's value and read it back, restart, check what the engines
//! report against the values and the pins, drive the block's sessions at its level into
//! `blocks/bNNN/`, stop, refuse a replaced engine), writes `load.json`, `summary.md` and
//! `report.html` after every block, and closes the testbed (configs restored byte for
//! byte) on every path.
//!
//! A matrix's load cell (`kind = "load"`, docs/load.md) runs the same sweep through
//! [`sweep_on`] on the matrix's testbed, its record in the cell's directory.
//!
//! Exit codes as `bisect run`: 0 finished (whatever the answer), 2 bad usage or input,
//! 3 the sweep could not run, 130 interrupted.

mod lanes;

pub use lanes::run_on_replicas;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::arm::{lifecycle, settle, Progress, Testbed, TestbedOptions};
use crate::commands::blocks::{drive, BlockRunner, EventSink};
use crate::commands::culprit::runner::TestbedRunner;
use crate::commands::run::now;
use crate::config::Pin;
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::culprit::{BlockOutcome, BlockRequest};
use crate::core::load::{sweep, Arm, Axis, LevelBlock, LoadParams, LoadReport};
use crate::core::solo::SoloOracle;
use crate::results::load::{LoadRecord, SCHEMA};
use crate::results::run_record::TargetInfo;

/// Everything `bisect load` needs, validated.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub id: String,
    pub command: String,
    /// `results/<id>/`.
    pub dir: PathBuf,
    pub target: TargetProfile,
    pub api_key: Option<String>,
    /// The base workload (its concurrency and sessions are set per block).
    pub workload: Workload,
    pub params: LoadParams,
    /// The flag each level is an A/B of; `None`: the configuration as it is.
    pub flag: Option<FlagSpec>,
    /// Pinned for every block.
    pub pins: Vec<Pin>,
    pub testbed: TestbedOptions,
    /// `--oracle solo`: every block's sessions are also run alone and compared.
    pub oracle: Option<SoloOracle>,
}

impl crate::commands::EnginePlan for LoadPlan {
    fn engines(&self) -> crate::commands::Engines<'_> {
        crate::commands::Engines::new(&self.target, &self.dir, self.api_key.as_deref())
    }

    fn uses_replicas(&self) -> bool {
        self.on_replicas()
    }

    fn first_set_reason(&self) -> Option<&'static str> {
        self.why_first_set()
    }
}

/// One sweep on an open testbed whose pins are written: what `bisect load` runs, and
/// what a matrix's load cell runs.
pub(crate) struct Sweep<'p> {
    /// The flag each level is an A/B of; `None`: the configuration as it is.
    pub(crate) flag: Option<&'p FlagSpec>,
    /// Other flags every block writes at one value (a matrix cell's configuration).
    pub(crate) fixed: &'p [Pin],
    /// The pins, checked against what the engines report after every restart.
    pub(crate) pins: &'p [Pin],
    pub(crate) workload: &'p Workload,
    pub(crate) params: &'p LoadParams,
    /// Where `blocks/bNNN/` and the record's files go.
    pub(crate) dir: &'p Path,
    /// The solo oracle, when every block is judged against its sessions alone too.
    pub(crate) oracle: Option<SoloOracle>,
}

impl Sweep<'_> {
    /// The runner of this sweep's blocks on `bed`, judged by `classifier`, a pressure
    /// sweep's filler per level in `ctx`.
    fn blocks<'t, 'a>(
        &self,
        bed: &'t mut Testbed<'a>,
        classifier: Arc<crate::core::classify::Classifier>,
        ctx: BTreeMap<u32, u32>,
    ) -> Blocks<'t, 'a> {
        let flags = self
            .flag
            .into_iter()
            .chain(self.fixed.iter().map(|p| &p.flag))
            .cloned()
            .collect();
        Blocks {
            runner: TestbedRunner {
                bed,
                flags,
                pins: self.pins.to_vec(),
                warned: Vec::new(),
                workload: self.workload.clone(),
                classifier,
                dir: self.dir.to_path_buf(),
                announce: false,
                oracle: self.oracle,
                share: None,
            },
            flag: self.flag.cloned(),
            fixed: self.fixed.to_vec(),
            ctx,
        }
    }
}

/// The culprit runner behind the sweep's seam: a level's block is a culprit block with
/// the flag (if any) at its arm's value and the fixed flags at theirs, at the level's
/// concurrency.
struct Blocks<'t, 'a> {
    runner: TestbedRunner<'t, 'a>,
    flag: Option<FlagSpec>,
    fixed: Vec<Pin>,
    /// A pressure sweep's filler per level.
    ctx: BTreeMap<u32, u32>,
}

impl BlockRunner<LevelBlock, BlockOutcome> for Blocks<'_, '_> {
    async fn run_block(&mut self, block: &LevelBlock) -> anyhow::Result<BlockOutcome> {
        let mut config: BTreeMap<String, String> = self
            .fixed
            .iter()
            .map(|p| (p.flag.name.clone(), p.value.clone()))
            .collect();
        let mut failing = Vec::new();
        if let Some(flag) = &self.flag {
            let on = block.arm == Arm::On;
            config.insert(flag.name.clone(), flag.value_for(on).to_string());
            if on {
                failing.push(flag.name.clone());
            }
        }
        let pressure = match (block.pressure, self.ctx.get(&block.level)) {
            (Some(p), Some(&ctx)) => {
                self.runner.workload.ctx = ctx;
                format!(" at {}% of the KV cache (--ctx {ctx})", (100.0 * p).round())
            }
            _ => String::new(),
        };
        self.runner.bed.progress().note(&format!(
            "load block {}: {} in flight{pressure}, {} ({} sessions)",
            block.block,
            block.in_flight,
            block.arm.as_str(),
            block.sessions
        ));
        let request = BlockRequest {
            block: block.block,
            config,
            failing,
            sessions: block.sessions,
            concurrency: block.in_flight,
            seed: block.seed,
        };
        self.runner.run_block(&request).await
    }
}

impl LoadPlan {
    /// The record of this sweep as it starts, its directory made (not written yet).
    pub(crate) fn started(&self) -> anyhow::Result<LoadRecord> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        Ok(started_record(
            self.id.clone(),
            self.command.clone(),
            &self.target,
            self.flag.as_ref(),
            &self.pins,
            &self.workload,
            &self.params,
        ))
    }

    /// The flags every block writes: the flag under test and the pins.
    pub(crate) fn written(&self) -> Vec<&FlagSpec> {
        self.flag
            .iter()
            .chain(self.pins.iter().map(|p| &p.flag))
            .collect()
    }

    /// The sweep this plan runs on its testbed(s).
    pub(crate) fn sweep(&self) -> Sweep<'_> {
        Sweep {
            flag: self.flag.as_ref(),
            fixed: &[],
            pins: &self.pins,
            workload: &self.workload,
            params: &self.params,
            dir: &self.dir,
            oracle: self.oracle,
        }
    }

    /// The command's end, its testbeds closed: its cost, the target's rates, the record
    /// settled and written.
    pub(crate) fn end(
        &self,
        record: &mut LoadRecord,
        outcome: &anyhow::Result<LoadReport>,
        ending: &crate::arm::Ending,
        started: Instant,
    ) -> anyhow::Result<()> {
        record.cost = Some(ending.cost(started.elapsed().as_secs_f64()));
        ending.keep_rates(&self.testbed.state_dir(), &self.target.name);
        finish(record, outcome, started, &self.dir)
    }

    /// What the sweep is planned to cost (`load --dry-run`): a fixed sweep exactly, an
    /// adaptive one at its fewest blocks (one step) and its most (every level's cap).
    pub fn planned_cost(&self, given: crate::core::cost::CostUnits) -> crate::core::cost::Planned {
        let (fewest, most) = self.params.planned_blocks();
        let (restart, wave) = crate::commands::cost_units(&self.testbed, &self.target.name, given);
        crate::core::cost::plan_between(&fewest, &most, self.sets(), &restart, &wave)
    }
}

/// Rewrites the record after every block.
struct Recorder<'r> {
    record: &'r mut LoadRecord,
    dir: PathBuf,
    started: Instant,
}

impl EventSink<LoadReport> for Recorder<'_> {
    fn event(&mut self, report: LoadReport) -> anyhow::Result<()> {
        self.record.report = Some(report);
        self.record.wall_s = self.started.elapsed().as_secs_f64();
        crate::results::load::write(&self.dir, self.record)
    }
}

/// Run the sweep. Launch configs are restored before this returns, on every path;
/// load.json says how far it got.
pub async fn run(
    plan: &LoadPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<LoadRecord> {
    let mut record = plan.started()?;
    crate::results::load::write(&plan.dir, &record)?;
    let spec = plan
        .testbed
        .spec(&plan.target, plan.api_key.clone(), plan.written());
    let started = Instant::now();
    let job = plan.sweep();
    let bed = Testbed::open(spec, control, progress, cancel)?;
    lifecycle(
        bed,
        &mut record,
        async |bed, record| {
            bed.pin(&plan.pins)?;
            sweep_on(bed, &job, record, started).await
        },
        |record, outcome, ending| plan.end(record, outcome, ending, started),
    )
    .await?;
    Ok(record)
}

/// Run `job`'s blocks on `bed` (open, the pins written), rewriting `record` in the
/// job's directory after every block.
pub(crate) async fn sweep_on(
    bed: &mut Testbed<'_>,
    job: &Sweep<'_>,
    record: &mut LoadRecord,
    started: Instant,
) -> anyhow::Result<LoadReport> {
    let classifier = Arc::new(bed.target().classifier(job.workload)?);
    let ctx = pressure_levels(bed, job, record).await?;
    let mut blocks = job.blocks(bed, classifier, ctx);
    let mut recorder = Recorder {
        record,
        dir: job.dir.to_path_buf(),
        started,
    };
    let flag = job.flag.map(|f| f.name.clone());
    drive(sweep(job.params.clone(), flag), &mut blocks, &mut recorder).await
}

/// A pressure sweep's filler per level (core::pressure), sized once before its first
/// block: on engines restarted at the value that lets the flag's mechanism run, their
/// capacity read and a session's tokens counted by the engine; recorded in load.json
/// (`pressure`, one sizing per level). Empty for a sweep of sessions in flight.
async fn pressure_levels(
    bed: &mut Testbed<'_>,
    job: &Sweep<'_>,
    record: &mut LoadRecord,
) -> anyhow::Result<BTreeMap<u32, u32>> {
    use crate::commands::run::{capacity_for_pressure, count_tokens};
    use crate::core::pressure::size;
    let Axis::Pressure { in_flight } = job.params.axis else {
        return Ok(BTreeMap::new());
    };
    let in_flight = u64::from(in_flight);
    let (capacity, _) = capacity_for_pressure(bed, job.flag).await?;
    // Counted at the highest level's filler (at most 2048, count_tokens): the filler's
    // tokens are not quite a line (a sentence's overshoot weighs more in a short one),
    // and the high levels are where a sweep's answer is.
    let top = job
        .params
        .levels
        .last()
        .map_or(1.0, |&l| f64::from(l) / 100.0);
    let tokens = count_tokens(bed, job.workload, &capacity, top, in_flight).await;
    let mut ctx = BTreeMap::new();
    record.pressure.clear();
    let mut unreachable = Vec::new();
    for &level in &job.params.levels {
        let sizing = size(&capacity, f64::from(level) / 100.0, in_flight, &tokens);
        bed.progress()
            .note(&format!("level {level}: {}", sizing.words()));
        // A level sized short runs another pressure than its own (ctx 0 already above
        // it, or a slot's cap below it): reported as that level, its answer would be
        // wrong. Refused before any block, with what each reaches.
        if let Some(why) = &sizing.short {
            unreachable.push(format!(
                "{level}% (sized to {:.0}%: {why})",
                100.0 * sizing.aimed
            ));
        }
        ctx.insert(level, sizing.ctx);
        record.pressure.push(sizing);
    }
    crate::results::load::write(job.dir, record)?;
    if !unreachable.is_empty() {
        return Err(crate::exit::Failure::bad_input(
            format!(
                "--pressures: at {in_flight} in flight these levels cannot be reached: {}",
                unreachable.join("; ")
            ),
            "drop them (the levels are percent of the KV cache; load.json `pressure` has \
             each level's sizing), or change --concurrency: fewer sessions in flight reach \
             a lower pressure, more (up to the slots) a higher one",
        )
        .into());
    }
    Ok(ctx)
}

/// The record once the sweep ended (finished, failed or interrupted), written into
/// `dir`; the sweep's error, if any, comes back after the write (which never hides it).
pub(crate) fn finish(
    record: &mut LoadRecord,
    outcome: &anyhow::Result<LoadReport>,
    started: Instant,
    dir: &Path,
) -> anyhow::Result<()> {
    if let Ok(report) = outcome {
        record.report = Some(report.clone());
    }
    record.wall_s = started.elapsed().as_secs_f64();
    record.header.finished_at = Some(now());
    (record.header.status, record.error) = settle(outcome);
    crate::results::load::write(dir, record)
}

/// A sweep's record as it starts: nothing measured yet.
pub(crate) fn started_record(
    id: String,
    command: String,
    target: &TargetProfile,
    flag: Option<&FlagSpec>,
    sets: &[Pin],
    workload: &Workload,
    params: &LoadParams,
) -> LoadRecord {
    LoadRecord {
        header: crate::results::RecordHeader::running(
            SCHEMA,
            &id,
            &command,
            now(),
            TargetInfo::of(target),
        ),
        flag: flag.map(|f| f.name.clone()),
        pinned: sets.iter().map(Pin::words).collect(),
        workload: workload.params_json(),
        params: params.clone(),
        report: None,
        pressure: Vec::new(),
        wall_s: 0.0,
        replicas: Default::default(),
        cost: None,
        error: None,
    }
}
