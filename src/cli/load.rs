//! `bisect load [--flag NAME] [--levels 1,8,16,32,64,80 | --max C | --pressures
//! 10,50,100 [--concurrency C]] [--adaptive [--max-sessions N]] [--set NAME=VALUE]...`: clap arguments and their conversion into
//! a [`LoadPlan`].

use clap::Args;

use super::{command_line, parse_pins, run_id, usage, BlockArgs, ExperimentArgs, OracleArgs};
use bisect_harness::commands::load::LoadPlan;
use bisect_harness::core::load::{Allocation, Axis, LoadParams, DEFAULT_LEVELS};

/// The highest `--pressures` level, in percent: past it the sessions' filler is many
/// times the cache (and built in memory whole).
const MAX_PRESSURE: u32 = 1000;

/// `--max-sessions` without a value: the cap per arm at each level of an adaptive sweep.
pub(crate) const DEFAULT_MAX_SESSIONS: u64 = 480;

#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// Levels of sessions in flight, comma-separated, ascending (default 1,8,16,32,64,80).
    #[arg(long, value_delimiter = ',', conflicts_with = "max")]
    levels: Vec<u32>,
    /// Levels 1, 8, 16, ... doubling below C, then C.
    #[arg(long, value_name = "C")]
    max: Option<u32>,
    /// Sweep the KV cache's pressure instead of the load: levels in percent of the
    /// engine's KV cache, ascending (e.g. 10,25,50,100,150), every block at --concurrency
    /// sessions in flight (default: the workload's); each level's filler is sized as
    /// `run --pressure` sizes it, and the answer names the lowest pressure at which the
    /// flag's mechanism runs and the lowest at which corruption appears.
    #[arg(long, value_delimiter = ',', value_name = "PERCENT", conflicts_with_all = ["levels", "max"])]
    pressures: Vec<u32>,
    /// Make each level an A/B of this flag (on vs off at that load); without it, every
    /// level runs the configuration as it is and is compared with the lowest.
    #[arg(long)]
    flag: Option<String>,
    // Without --adaptive every level runs --sessions once.
    #[command(flatten)]
    blocks: BlockArgs,
    #[command(flatten)]
    oracle: OracleArgs,
    #[command(flatten)]
    pub(crate) cost: super::CostArgs,
    #[command(flatten)]
    pub(crate) common: ExperimentArgs,
}

impl LoadArgs {
    /// Validate the arguments into a plan; the embedded engine's launch scripts are
    /// the only thing written.
    pub(crate) fn plan(&self) -> anyhow::Result<LoadPlan> {
        let common = &self.common;
        let catalog = common.target.catalog()?;
        let flag = match &self.flag {
            Some(name) => Some(catalog.get(name)?.clone()),
            None => None,
        };
        let mut workload = common.load.load()?;
        let oracle = self.oracle.solo(&mut workload)?;
        let axis = if self.pressures.is_empty() {
            if common.load.concurrency.is_some() {
                return Err(usage(
                    "--concurrency does not apply to `bisect load`: the levels are the loads",
                    "drop --concurrency; pass the loads with --levels 1,8,16,32,64,80 or --max 80 \
                     (or sweep pressure at one load with --pressures and --concurrency)",
                ));
            }
            Axis::InFlight
        } else {
            if common.load.ctx.is_some() {
                return Err(usage(
                    "--pressures sizes each level's filler context itself: it cannot be given with --ctx",
                    "drop one of --pressures and --ctx",
                ));
            }
            Axis::Pressure {
                in_flight: workload.target_concurrency(),
            }
        };
        if let Some(&p) = self.pressures.iter().find(|&&p| p > MAX_PRESSURE) {
            return Err(usage(
                format!(
                    "--pressures: {p}% is more than {MAX_PRESSURE}% of the KV cache: the sessions' filler alone would be {}x the cache",
                    p / 100
                ),
                "the levels are percent of the KV cache: e.g. --pressures 10,25,50,100,150",
            ));
        }
        let levels = match (self.max, self.levels.is_empty(), &axis) {
            (_, _, Axis::Pressure { .. }) => self.pressures.clone(),
            (Some(c), _, _) => LoadParams::levels_up_to(c),
            (None, true, _) => DEFAULT_LEVELS.to_vec(),
            (None, false, _) => self.levels.clone(),
        };
        LoadParams::check_levels(&levels, flag.is_some()).map_err(|e| match axis {
            Axis::InFlight => usage(format!("--levels: {e}"), "e.g. --levels 1,8,16,32,64,80"),
            Axis::Pressure { .. } => usage(
                format!(
                    "--pressures: {}",
                    e.replace("sessions in flight", "percent of the cache")
                ),
                "e.g. --pressures 10,25,50,100,150",
            ),
        })?;
        let allocation = if self.blocks.adaptive {
            let cap = self.blocks.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS);
            let top = u64::from(axis.in_flight(*levels.last().expect("checked levels")));
            if cap < top {
                return Err(usage(
                    format!("--max-sessions {cap} is below the highest level {top}: not one block at that load fits"),
                    format!("pass --max-sessions {top} or more, or lower the levels"),
                ));
            }
            Allocation::Adaptive { max_sessions: cap }
        } else {
            Allocation::Fixed {
                sessions: u64::from(workload.sessions),
            }
        };
        let policy = common.decision.policy()?;
        let pins = parse_pins(
            &catalog,
            &self.blocks.set,
            flag.as_ref().map(|f| f.name.as_str()),
        )?;
        let id = run_id("load", common.tag.as_deref());
        let dir = common.output.results.join(&id);
        let (target, api_key) = common.target.resolve(&dir)?;
        Ok(LoadPlan {
            id,
            command: command_line(),
            dir,
            target,
            api_key,
            params: LoadParams {
                axis,
                ..LoadParams::new(levels, flag.is_some(), allocation, &policy, workload.seed)
            },
            workload,
            flag,
            pins,
            testbed: common.testbed(),
            oracle,
        })
    }
}
