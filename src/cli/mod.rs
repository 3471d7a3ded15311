//! The command line: clap types, and their conversion into the validated plans the
//! harness runs on (nothing is touched while converting). Running a command is
//! `handlers`' job; the argument groups several commands share are flattened structs
//! here, so one option means one thing everywhere.

mod commits;
mod culprit;
pub(crate) mod engine;
mod history;
mod load;
pub(crate) mod matrix;
mod results;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use bisect_harness::arm::TestbedOptions;
use bisect_harness::commands::probe::ProbePlan;
use bisect_harness::commands::run::AdaptiveOptions;
use bisect_harness::commands::run::RunPlan;
use bisect_harness::config::{ConfigError, FlagCatalog, TargetProfile, Workload};
use bisect_harness::core::evidence::Policy;
use bisect_harness::core::solo::{self, SoloOracle};
use bisect_harness::exit;

pub(crate) use commits::CommitsArgs;
pub(crate) use culprit::CulpritArgs;
pub(crate) use history::HistoryArgs;
pub(crate) use load::LoadArgs;
pub(crate) use matrix::{MatrixArgs, MergeArgs};
pub(crate) use results::{DiffArgs, ReclassifyArgs};

/// How often engine metrics are sampled while sessions run.
pub(crate) const METRICS_PERIOD: Duration = Duration::from_millis(250);

#[derive(Debug, Parser)]
#[command(
    name = "bisect",
    version,
    about = "Reproduce and bisect load-dependent corruption bugs in LLM serving engines"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Controlled A/B of one flag: arms on and off, verdict implicated / cleared / inconclusive.
    Run(RunArgs),
    /// One arm with the launch configs as they are: exit 0 clean, 1 corrupted, 125 could not tell.
    Probe(ProbeArgs),
    /// List the flag catalog with docs.
    Flags(FlagsArgs),
    /// Validate a target profile without touching anything: each flag's edit as lines,
    /// the URLs (unless --offline); exit 0 when every check passes, 1 when one fails.
    Check(CheckArgs),
    /// Compile every CUDA kernel with NVRTC (needs libnvrtc, not a GPU) and probe for a GPU.
    Kernels,
    /// Re-render a results directory's summary and print its table.
    Report(ReportArgs),
    /// Two results directories (runs or matrices) side by side: rates, deltas, confounds.
    Diff(DiffArgs),
    /// Re-run the classifier over a run's stored transcripts; rewrite counts and verdict.
    Reclassify(ReclassifyArgs),
    /// Nightly regression matrix: cross flag values and loads, compare with the last night.
    Matrix(MatrixArgs),
    /// Join the shard directories of one matrix into one.
    Merge(MergeArgs),
    /// The nightly matrices of a results directory as a history: per cell its series and
    /// states, evidence across nights, regressions with their builds (docs/history.md).
    History(HistoryArgs),
    /// Restore launch configs left edited by an interrupted (kill -9) run.
    Restore(RestoreArgs),
    /// Which values of the listed flags, as configured, make the engine fail: the minimal set (delta debugging, docs/culprit.md).
    Culprit(CulpritArgs),
    /// The corruption rate as a function of sessions in flight, and the lowest load at which the bug appears (docs/load.md).
    Load(LoadArgs),
    /// Which commit of the engine introduced a load-dependent corruption: a noisy-oracle
    /// Bayesian search over a first-parent range or a list of releases (`--find fix`: the
    /// first without it), the answer verified (docs/commits.md).
    Commits(Box<CommitsArgs>),
    /// Run one role of the embedded prefill/decode engine.
    Engine(engine::EngineArgs),
    /// Serve the zero-work mock chat engine (benchmarks only).
    #[command(hide = true)]
    MockEngine(engine::MockEngineArgs),
}

impl Command {
    /// The cost options of a command that drives engines (run, culprit, load, matrix,
    /// commits): checked before anything runs, whether or not `--dry-run` uses them.
    pub(crate) fn cost_args(&self) -> Option<&CostArgs> {
        match self {
            Command::Run(a) => Some(&a.cost),
            Command::Culprit(a) => Some(&a.cost),
            Command::Load(a) => Some(&a.cost),
            Command::Matrix(a) => Some(&a.cost),
            Command::Commits(a) => Some(&a.cost),
            _ => None,
        }
    }
}

/// Parse the command line. `Err` carries the exit code when there is nothing to run:
/// `--help` / `--version` (printed to stdout, 0) or a usage error (printed, 2).
pub(crate) fn parse() -> Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        let _ = e.print();
        ExitCode::from(if e.use_stderr() {
            exit::BAD_INPUT
        } else {
            exit::OK
        })
    })
}

/// Where the engines come from, and the flag catalogs naming their settings.
#[derive(Debug, Args)]
pub(crate) struct TargetArgs {
    /// Target profile (TOML). Without it, the embedded engine is started.
    #[arg(long)]
    pub(crate) target: Option<PathBuf>,
    /// Extra flag catalog directories of *.toml flag files, loaded after the built-in
    /// flags and the target's own `flags_dir` (a later file with the same name overrides).
    #[arg(long = "flags-dir", value_name = "DIR")]
    pub(crate) flags_dir: Vec<PathBuf>,
}

impl TargetArgs {
    /// The built-in flags, the target profile's `flags_dir`, then `--flags-dir`.
    pub(crate) fn catalog(&self) -> Result<FlagCatalog, ConfigError> {
        catalog_for(self.target.as_deref(), &self.flags_dir)
    }

    /// The target profile (or the embedded engine's, its launch scripts to be written
    /// under `dir`) and its API key.
    pub(crate) fn resolve(&self, dir: &Path) -> anyhow::Result<(TargetProfile, Option<String>)> {
        resolve_target(self.target.as_deref(), dir)
    }
}

/// The target profile at `path`, or the embedded engine's with its launch scripts
/// to be written under `dir/launch` when the command starts (parsing writes nothing);
/// with the API key its `api_key_env` names.
pub(crate) fn resolve_target(
    path: Option<&Path>,
    dir: &Path,
) -> anyhow::Result<(TargetProfile, Option<String>)> {
    let target = match path {
        Some(path) => TargetProfile::load(path)?,
        None => {
            let exe = std::env::current_exe().context("locating the bisect executable")?;
            bisect_harness::config::embedded::profile(&dir.join("launch"), &exe)?
        }
    };
    let api_key = match &target.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            usage(
                format!("the target's api_key_env names ${var}, which is not set"),
                format!("export {var}=... before running, or remove api_key_env from the profile"),
            )
        })?),
        None => None,
    };
    if let Some(key) = &api_key {
        bisect_harness::redact::register(key);
    }
    Ok((target, api_key))
}

/// Where results go and how they are printed.
#[derive(Debug, Args)]
pub(crate) struct OutputArgs {
    /// Results root: each run, search or matrix goes to DIR/<id>/.
    #[arg(long, default_value = "results")]
    pub(crate) results: PathBuf,
    /// Print the JSON record (run.json, culprit.json, matrix.json) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl OutputArgs {
    /// The journal of launch-config edits under the results root.
    pub(crate) fn journal_dir(&self) -> PathBuf {
        self.results.join(".bisect-journal")
    }

    /// Where the solo oracle keeps its references for later blocks and runs.
    pub(crate) fn reference_cache(&self) -> PathBuf {
        self.results.join("reference-cache")
    }
}

/// The significance level and smallest effect of a verdict, shared by run and culprit.
#[derive(Debug, Args)]
pub(crate) struct DecisionArgs {
    /// Significance level for `implicated` (culprit: family-wise, split across looks).
    #[arg(long, default_value_t = 0.01)]
    alpha: f64,
    /// Smallest difference in corruption rate worth finding (for `cleared` and power).
    #[arg(long = "min-effect", default_value_t = 0.05)]
    min_effect: f64,
}

impl DecisionArgs {
    /// The verdict policy, with both values checked to lie in (0, 1).
    fn policy(&self) -> anyhow::Result<Policy> {
        let inside = |v: f64| v > 0.0 && v < 1.0;
        if !inside(self.alpha) || !inside(self.min_effect) {
            return Err(usage(
                "--alpha and --min-effect must lie in (0, 1)",
                "e.g. --alpha 0.01 --min-effect 0.05",
            ));
        }
        Ok(Policy {
            alpha: self.alpha,
            min_effect: self.min_effect,
            ..Policy::default()
        })
    }
}

/// Workload selection and overrides, shared by run, probe and culprit.
#[derive(Debug, Args)]
pub(crate) struct WorkloadArgs {
    /// Workload name (built-in) or TOML file.
    #[arg(long, default_value = "agentic")]
    workload: String,
    /// Sessions per arm: the sample size.
    #[arg(long)]
    sessions: Option<u32>,
    /// Sessions in flight at once: the load, held constant (closed loop: when one
    /// ends the next starts) until --sessions are done. Default: all sessions at once.
    #[arg(long)]
    concurrency: Option<u32>,
    #[arg(long)]
    rounds: Option<u32>,
    /// Filler tokens of earlier conversation per session.
    #[arg(long)]
    pub(crate) ctx: Option<u32>,
    #[arg(long = "max-tokens")]
    max_tokens: Option<u32>,
    /// Per-request timeout in seconds.
    #[arg(long)]
    timeout: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
}

impl WorkloadArgs {
    /// The workload with the arguments applied, its sessions an arm's: `--concurrency`
    /// above them is refused (the load could never be reached).
    fn load(&self) -> anyhow::Result<Workload> {
        self.load_sized(true)
    }

    /// [`Self::load`] for a command whose blocks size themselves (`bisect culprit`: a
    /// block is max(--concurrency, 80) sessions), where the workload's sessions are no
    /// limit on `--concurrency`.
    fn load_sized(&self, arm_sized: bool) -> anyhow::Result<Workload> {
        let mut workload = bisect_harness::config::load_workload(&self.workload)?;
        for (given, field) in [
            (self.sessions, &mut workload.sessions),
            (self.rounds, &mut workload.rounds),
            (self.ctx, &mut workload.ctx),
            (self.max_tokens, &mut workload.max_tokens),
        ] {
            if let Some(n) = given {
                *field = n;
            }
        }
        if let Some(t) = self.timeout {
            workload.timeout_s = t;
        }
        if let Some(s) = self.seed {
            workload.seed = s;
        }
        if let Some(c) = self.concurrency {
            if c == 0 {
                return Err(usage(
                    "--concurrency must be positive",
                    "pass the number of sessions to keep in flight, e.g. --concurrency 80",
                ));
            }
            if arm_sized && c > workload.sessions {
                return Err(usage(
                    format!(
                        "--concurrency {c} is more than the {} sessions of an arm: the load could never be reached",
                        workload.sessions
                    ),
                    "raise --sessions to at least --concurrency, or lower --concurrency",
                ));
            }
            if workload.barrier && c < workload.sessions {
                return Err(usage(
                    "the workload's round barrier needs every session in flight at once",
                    "drop --concurrency, or use a workload without `barrier`",
                ));
            }
            workload.concurrency = Some(c);
        }
        if workload.sessions == 0
            || workload.rounds == 0
            || workload.max_tokens == 0
            || workload.timeout_s <= 0.0
        {
            return Err(usage(
                "--sessions, --rounds, --max-tokens and --timeout must be positive",
                "pass values greater than zero",
            ));
        }
        Ok(workload)
    }
}

/// What an A/B experiment (`run`, `culprit`) needs besides the flags it tests.
#[derive(Debug, Args)]
pub(crate) struct ExperimentArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    #[command(flatten)]
    pub(crate) load: WorkloadArgs,
    /// Appended to the id (the results directory's name).
    #[arg(long)]
    tag: Option<String>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
    /// Allow a flag whose setting also appears in a role it does not list.
    #[arg(long = "allow-partial")]
    allow_partial: bool,
    #[command(flatten)]
    decision: DecisionArgs,
}

impl ExperimentArgs {
    /// Where the testbed journals and keeps its state, and how it polls the metrics.
    pub(crate) fn testbed(&self) -> TestbedOptions {
        TestbedOptions {
            journal_dir: self.output.journal_dir(),
            state_root: None,
            allow_partial: self.allow_partial,
            metrics_period: METRICS_PERIOD,
            reference_cache: Some(self.output.reference_cache()),
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Flag to test, by catalog name (e.g. BF16_INDEX_K) or by its env/arg name.
    #[arg(long)]
    flag: String,
    /// Arm pairs, interleaved on, off, off, on, ... On a target with replica sets each
    /// pair runs at once, on and off on two sets, crossing over every pair (default 2
    /// there, so every arm runs as much on each set; 1 elsewhere).
    #[arg(long)]
    repeats: Option<u32>,
    /// Size each session's filler context (instead of --ctx) so the sessions in flight
    /// fill this share of the engine's KV cache at their last round, as the engine
    /// reports its capacity on a restart at the value that lets the flag's path run
    /// (docs/design.md 3.4 "Pressure"); e.g. 0.5. Above 1 oversubscribes it.
    #[arg(long, value_name = "FRACTION")]
    pressure: Option<f64>,
    #[command(flatten)]
    pub(crate) cost: CostArgs,
    #[command(flatten)]
    blocks: BlockArgs,
    #[command(flatten)]
    oracle: OracleArgs,
    #[command(flatten)]
    pub(crate) common: ExperimentArgs,
}

/// `[--oracle solo [--oracle-threshold NATS]]`: judge every session also against the
/// same session run alone (docs/oracle.md).
#[derive(Debug, Args)]
pub(crate) struct OracleArgs {
    /// `solo`: run each arm block's sessions also one at a time, and call a session
    /// whose well-formed reply differs from its reply alone `diverged` (corruption) or,
    /// at a near-tie, `drifted`. Needs temperature 0; asks for log-probabilities.
    #[arg(long, value_enum)]
    oracle: Option<OracleKind>,
    /// With --oracle: the margin (nats, top-1 minus top-2 log-probability alone) at or
    /// below which a parting is a near-tie.
    #[arg(long = "oracle-threshold", requires = "oracle", default_value_t = bisect_harness::core::solo::DEFAULT_THRESHOLD)]
    threshold: f64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OracleKind {
    Solo,
}

impl OracleArgs {
    /// The oracle's parameters, with `workload` asking for what it needs (the
    /// log-probabilities, where the workload does not set them); a workload the oracle
    /// cannot judge is refused naming the fix.
    pub(crate) fn solo(&self, workload: &mut Workload) -> anyhow::Result<Option<SoloOracle>> {
        let Some(OracleKind::Solo) = self.oracle else {
            return Ok(None);
        };
        if !(self.threshold >= 0.0 && self.threshold.is_finite()) {
            return Err(usage(
                format!("--oracle-threshold {} is not a margin", self.threshold),
                "pass a number of nats of 0 or more, e.g. --oracle-threshold 1.0",
            ));
        }
        if workload.temperature != 0.0 {
            return Err(usage(
                format!(
                    "--oracle solo needs temperature 0, the workload has {}: a sampled reply differs from itself alone",
                    workload.temperature
                ),
                "set temperature = 0.0 in the workload (or pass a built-in one)",
            ));
        }
        let extra = &mut workload.request.extra;
        extra
            .entry("logprobs")
            .or_insert(serde_json::Value::Bool(true));
        extra
            .entry("top_logprobs")
            .or_insert(solo::TOP_LOGPROBS.into());
        Ok(Some(SoloOracle {
            threshold: self.threshold,
        }))
    }
}

/// `[--set NAME=VALUE]... [--adaptive [--max-sessions N]]`, shared by `run` and `load`:
/// what every block pins, and whether blocks go on until a test decides.
#[derive(Debug, Args)]
pub(crate) struct BlockArgs {
    /// Pin another flag in every block (both arms): NAME=VALUE (repeatable).
    #[arg(long = "set")]
    pub(crate) set: Vec<String>,
    /// Spend sessions until an always-valid test decides. run: arm blocks of at least
    /// --concurrency sessions (else the workload's sessions) alternate
    /// (docs/sequential.md); load: blocks go to the level next to the threshold
    /// (docs/load.md).
    #[arg(long)]
    pub(crate) adaptive: bool,
    /// With --adaptive: the cap, sessions per arm. run: default planned from --alpha,
    /// --min-effect, power 0.8 and the measured cost of sessions and restarts; load: per
    /// arm at each level, default 480.
    #[arg(long = "max-sessions", requires = "adaptive")]
    pub(crate) max_sessions: Option<u64>,
}

impl RunArgs {
    /// `Some` for a sequential run (`--adaptive`); checked by [`RunArgs::plan`].
    pub(crate) fn adaptive(&self) -> Option<AdaptiveOptions> {
        self.blocks.adaptive.then_some(AdaptiveOptions {
            max_sessions: self.blocks.max_sessions,
        })
    }

    /// Validate the arguments into a plan (nothing is written).
    pub(crate) fn plan(&self) -> anyhow::Result<RunPlan> {
        let common = &self.common;
        let catalog = common.target.catalog()?;
        let flag = catalog.get(&self.flag)?.clone();
        let mut workload = common.load.load()?;
        let oracle = self.oracle.solo(&mut workload)?;
        if self.repeats == Some(0) {
            return Err(usage(
                "--repeats must be at least 1",
                "pass --repeats 1 or more",
            ));
        }
        let costs = self.cost.units()?;
        let policy = common.decision.policy()?;
        if let Some(p) = self.pressure {
            if !(p > 0.0 && p.is_finite()) {
                return Err(usage(
                    "--pressure must be a positive share of the KV cache",
                    "e.g. --pressure 0.5 (half the cache at the last round), 1.2 to oversubscribe it",
                ));
            }
            if common.load.ctx.is_some() {
                return Err(usage(
                    "--pressure sizes the filler context itself: it cannot be given with --ctx",
                    "drop one of --pressure and --ctx",
                ));
            }
        }
        if self.blocks.adaptive && self.repeats.is_some_and(|r| r != 1) {
            return Err(usage(
                "--repeats does not apply to --adaptive: its blocks alternate until the test decides",
                "drop --repeats (or --adaptive)",
            ));
        }
        if let Some(cap) = self.blocks.max_sessions {
            let c = u64::from(workload.target_concurrency());
            if cap < c {
                return Err(usage(
                    format!(
                        "--max-sessions {cap} is below the concurrency {c}: not one block at the target load fits"
                    ),
                    format!("pass --max-sessions {c} or more, or lower --concurrency"),
                ));
            }
        }
        let pins = parse_pins(&catalog, &self.blocks.set, Some(&flag.name))?;
        let id = run_id(&flag.name, common.tag.as_deref());
        let run_dir = common.output.results.join(&id);
        let (target, api_key) = common.target.resolve(&run_dir)?;
        let crossover = !target.replicas.is_empty() && !self.blocks.adaptive;
        let repeats = self.repeats.unwrap_or(if crossover { 2 } else { 1 });
        Ok(RunPlan {
            id,
            command: command_line(),
            flag,
            target,
            workload,
            repeats,
            pins,
            testbed: common.testbed(),
            run_dir,
            policy,
            api_key,
            oracle,
            adaptive: self.adaptive(),
            pressure: self.pressure,
            costs,
        })
    }
}

/// `[--dry-run] [--restart-cost S] [--session-cost S]`: what a command that drives
/// engines is planned to cost, in the units a user of real engines pays.
#[derive(Debug, Args)]
pub(crate) struct CostArgs {
    /// Print what the command is planned to cost (restarts, sessions, wall time,
    /// engine-hours; a search at its fewest and its most blocks) and exit without
    /// touching an engine or writing a result.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Seconds one engine restart costs (health included), for the planned cost; by
    /// default this target's earlier commands' mean (kept in bisect's state directory).
    #[arg(long, value_name = "SECONDS")]
    restart_cost: Option<f64>,
    /// Seconds one wave of sessions costs (as many sessions as run at once, start to
    /// end), for the planned cost; by default this target's earlier commands' mean.
    #[arg(long, value_name = "SECONDS")]
    session_cost: Option<f64>,
}

impl CostArgs {
    /// The units as given, each refused unless seconds, 0 or more.
    pub(crate) fn units(&self) -> anyhow::Result<bisect_harness::core::cost::CostUnits> {
        for (name, v) in [
            ("--restart-cost", self.restart_cost),
            ("--session-cost", self.session_cost),
        ] {
            if v.is_some_and(|s| !(s >= 0.0 && s.is_finite())) {
                return Err(usage(
                    format!("{name} must be seconds, 0 or more"),
                    format!("e.g. {name} 900 (15 minutes)"),
                ));
            }
        }
        Ok(bisect_harness::core::cost::CostUnits {
            restart_s: self.restart_cost,
            session_s: self.session_cost,
        })
    }
}

#[derive(Debug, Args)]
pub(crate) struct ProbeArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    load: WorkloadArgs,
    /// Corruption rate a good build may show; above it (95% lower bound) = corrupted.
    #[arg(long, default_value_t = 0.02)]
    background: f64,
    /// Corruption rate the bad build showed; clean needs the 95% upper bound below it.
    #[arg(long = "bug-rate", default_value_t = 0.10)]
    bug_rate: f64,
    /// Catalog flag whose mechanism must have run for "clean" (its witnesses, at the
    /// value the launch configs hold): without it, a clean probe of a build whose code
    /// path never ran would mark that build good.
    #[arg(long, value_name = "FLAG")]
    mechanism: Option<String>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

impl ProbeArgs {
    /// Validate the arguments into a plan (nothing is written).
    pub(crate) fn plan(&self) -> anyhow::Result<ProbePlan> {
        let catalog = self.target.catalog()?;
        let workload = self.load.load()?;
        for (name, v) in [
            ("--background", self.background),
            ("--bug-rate", self.bug_rate),
        ] {
            if !(v > 0.0 && v < 1.0) {
                return Err(usage(
                    format!("{name} must lie in (0, 1)"),
                    "e.g. --background 0.02 --bug-rate 0.10",
                ));
            }
        }
        let mechanism = match &self.mechanism {
            Some(name) => Some(catalog.get(name)?.clone()),
            None => None,
        };
        let id = run_id("probe", None);
        let run_dir = self.output.results.join(&id);
        let (target, api_key) = self.target.resolve(&run_dir)?;
        Ok(ProbePlan {
            id,
            command: command_line(),
            api_key,
            target,
            workload,
            catalog,
            run_dir,
            background: self.background,
            bug_rate: self.bug_rate,
            degraded_fraction: Policy::default().degraded_fraction,
            metrics_period: METRICS_PERIOD,
            mechanism,
        })
    }
}

#[derive(Debug, Args)]
pub(crate) struct FlagsArgs {
    /// Target profile (TOML): list its own flags (`flags_dir`) and only the flags whose
    /// roles it has; the others are named as not applying.
    #[arg(long)]
    pub(crate) target: Option<PathBuf>,
    /// Extra flag catalog directories of *.toml flag files (later ones override).
    #[arg(long = "flags-dir", value_name = "DIR")]
    pub(crate) flags_dir: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// Target profile (TOML) to validate.
    #[arg(long)]
    pub(crate) target: PathBuf,
    /// Extra flag catalog directories of *.toml flag files (later ones override).
    #[arg(long = "flags-dir", value_name = "DIR")]
    pub(crate) flags_dir: Vec<PathBuf>,
    /// Skip the URL checks (health, metrics, effective config): for CI, or before the
    /// engines exist.
    #[arg(long)]
    pub(crate) offline: bool,
    /// Seconds to wait for each URL.
    #[arg(long, default_value_t = 3.0, value_name = "SECS")]
    pub(crate) timeout: f64,
    /// The workload whose first round the tool-call probe sends through the target's
    /// API (built-in name or TOML file): its reply must come back as parsed tool_calls.
    /// The probe waits the workload's per-request timeout.
    #[arg(long, default_value = "agentic")]
    pub(crate) workload: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What `bisect check` runs on, loaded and validated from [`CheckArgs`].
pub(crate) struct CheckInputs {
    pub(crate) target: TargetProfile,
    pub(crate) catalog: FlagCatalog,
    pub(crate) workload: Workload,
    /// The key `api_key_env` names, when that variable is set.
    pub(crate) api_key: Option<String>,
    /// `api_key_env`'s variable when it is not set.
    pub(crate) api_key_missing: Option<String>,
    pub(crate) timeout: Duration,
}

impl CheckArgs {
    /// The profile, its catalog, and the plan options (the API key read, never printed).
    pub(crate) fn inputs(&self) -> anyhow::Result<CheckInputs> {
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return Err(usage(
                format!(
                    "--timeout {} must be a positive number of seconds",
                    self.timeout
                ),
                "pass --timeout 3 (the default) or more for a slow network",
            ));
        }
        let target = TargetProfile::load(&self.target)?;
        let catalog = catalog_for(Some(&self.target), &self.flags_dir)?;
        let (api_key, api_key_missing) = match &target.api_key_env {
            Some(var) => match std::env::var(var) {
                Ok(key) => {
                    bisect_harness::redact::register(&key);
                    (Some(key), None)
                }
                Err(_) => (None, Some(var.clone())),
            },
            None => (None, None),
        };
        let workload = bisect_harness::config::load_workload(&self.workload)?;
        Ok(CheckInputs {
            target,
            catalog,
            workload,
            api_key,
            api_key_missing,
            timeout: Duration::from_secs_f64(self.timeout),
        })
    }
}

/// The catalog a command sees: the built-in flags, the profile's `flags_dir` (when a
/// profile is given), then `dirs`.
pub(crate) fn catalog_for(
    target: Option<&Path>,
    dirs: &[PathBuf],
) -> Result<FlagCatalog, ConfigError> {
    let mut all = Vec::new();
    if let Some(path) = target {
        all.extend(TargetProfile::load(path)?.flags_dir);
    }
    all.extend(dirs.iter().cloned());
    FlagCatalog::load(&all)
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// A results directory (holding run.json, load.json or matrix.json).
    pub(crate) dir: PathBuf,
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// Results root whose journal to replay.
    #[arg(long, default_value = "results")]
    pub(crate) results: PathBuf,
}

/// `--set NAME=VALUE` pins, looked up in the catalog and their values checked;
/// `under_test` (the flag the run flips) cannot be pinned.
fn parse_pins(
    catalog: &FlagCatalog,
    pins: &[String],
    under_test: Option<&str>,
) -> anyhow::Result<Vec<bisect_harness::config::Pin>> {
    let mut out = Vec::new();
    for s in pins {
        let Some((name, value)) = s.split_once('=') else {
            return Err(usage(
                format!("--set {s}: expected NAME=VALUE"),
                "e.g. --set HICACHE=off",
            ));
        };
        let f = catalog.get(name)?.clone();
        if under_test == Some(f.name.as_str()) {
            return Err(usage(
                format!("--set {s}: {} is the flag under test", f.name),
                "pin only other flags",
            ));
        }
        bisect_harness::config::flags::validate_value(value).map_err(|e| {
            usage(
                format!("--set {s}: {e}"),
                "use only letters, digits and ._:/,=+-",
            )
        })?;
        out.push(bisect_harness::config::Pin::new(f, value));
    }
    Ok(out)
}

fn usage(message: impl Into<String>, fix: impl Into<String>) -> anyhow::Error {
    ConfigError::Usage {
        message: message.into(),
        fix: fix.into(),
    }
    .into()
}

/// The command line as typed, recorded in every result.
pub(crate) fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// `<UTC stamp>-<what>[-<tag>]`, the tag made directory-safe.
fn run_id(what: &str, tag: Option<&str>) -> String {
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S%.3f");
    let mut id = format!("{stamp}-{what}");
    if let Some(t) = tag {
        let clean: String = t
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        id.push('-');
        id.push_str(&clean);
    }
    id
}
