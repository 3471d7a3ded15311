//! Command line: clap types live here and only here. Each subcommand converts its
//! arguments into the validated structs the core runs on.

mod culprit;
pub mod engine;
pub mod matrix;
mod progress;
mod report_cmds;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use bisect_harness::commands::run::{self as experiment, RunPlan};
use bisect_harness::config::{ConfigError, FlagCatalog, TargetProfile, Workload};
use bisect_harness::core::verdict::Policy;
use bisect_harness::exit::{self, Failure};

#[derive(Debug, Parser)]
#[command(
    name = "bisect",
    version,
    about = "Reproduce and bisect load-dependent corruption bugs in LLM serving engines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Controlled A/B of one flag: arms on and off, verdict implicated / cleared / inconclusive.
    Run(RunArgs),
    /// One arm with the launch configs as they are: exit 0 clean, 1 corrupted, 125 could not tell.
    Probe(ProbeArgs),
    /// List the flag catalog with docs.
    Flags(FlagsArgs),
    /// Compile every CUDA kernel with NVRTC (needs libnvrtc, not a GPU) and probe for a GPU.
    Kernels,
    /// Re-render a results directory's summary and print its table.
    Report(ReportArgs),
    /// Two results directories (runs or matrices) side by side: rates, deltas, confounds.
    Diff(report_cmds::DiffArgs),
    /// Re-run the classifier over a run's stored transcripts; rewrite counts and verdict.
    Reclassify(report_cmds::ReclassifyArgs),
    /// Nightly regression matrix: cross flag values and loads, compare with the last night.
    Matrix(matrix::MatrixArgs),
    /// Join the shard directories of one matrix into one.
    Merge(matrix::MergeArgs),
    /// Restore launch configs left edited by an interrupted (kill -9) run.
    Restore(RestoreArgs),
    /// Which of many flags corrupts: screen each, then spend the budget on the most promising.
    Culprit(culprit::CulpritArgs),
    /// Run one role of the embedded prefill/decode engine.
    Engine(engine::EngineArgs),
    /// Serve the zero-work mock chat engine (benchmarks only).
    #[command(hide = true)]
    MockEngine(engine::MockEngineArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Flag to test, by catalog name (e.g. BF16_INDEX_K) or by its env/arg name.
    #[arg(long)]
    flag: String,
    /// Target profile (TOML). Without it, the embedded engine is started.
    #[arg(long)]
    target: Option<PathBuf>,
    /// Extra flag catalog directories (later ones override).
    #[arg(long = "flags-dir")]
    flags_dir: Vec<PathBuf>,
    #[command(flatten)]
    load: WorkloadArgs,
    /// Arm pairs, interleaved on, off, off, on, ...
    #[arg(long, default_value_t = 1)]
    repeats: u32,
    /// Pin another flag for both arms: NAME=VALUE (repeatable).
    #[arg(long = "set")]
    set: Vec<String>,
    /// Appended to the run id.
    #[arg(long)]
    tag: Option<String>,
    /// Results root; the run goes to DIR/<run-id>/.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Print run.json instead of the table.
    #[arg(long)]
    json: bool,
    /// Allow a flag whose setting also appears in a role it does not list.
    #[arg(long = "allow-partial")]
    allow_partial: bool,
    #[command(flatten)]
    decision: DecisionArgs,
}

/// The significance level and smallest effect of a verdict, shared by run and culprit.
#[derive(Debug, Args)]
struct DecisionArgs {
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

/// Workload selection and overrides, shared by run and probe.
#[derive(Debug, Args)]
struct WorkloadArgs {
    /// Workload name (built-in) or TOML file.
    #[arg(long, default_value = "agentic")]
    workload: String,
    #[arg(long)]
    sessions: Option<u32>,
    #[arg(long)]
    rounds: Option<u32>,
    /// Filler tokens of earlier conversation per session.
    #[arg(long)]
    ctx: Option<u32>,
    #[arg(long = "max-tokens")]
    max_tokens: Option<u32>,
    /// Per-request timeout in seconds.
    #[arg(long)]
    timeout: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
}

impl WorkloadArgs {
    fn load(&self) -> anyhow::Result<Workload> {
        let mut workload = Workload::load(&self.workload)?;
        if let Some(n) = self.sessions {
            workload.sessions = n;
        }
        if let Some(n) = self.rounds {
            workload.rounds = n;
        }
        if let Some(n) = self.ctx {
            workload.ctx = n;
        }
        if let Some(n) = self.max_tokens {
            workload.max_tokens = n;
        }
        if let Some(t) = self.timeout {
            workload.timeout_s = t;
        }
        if let Some(s) = self.seed {
            workload.seed = s;
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

#[derive(Debug, Args)]
struct ProbeArgs {
    /// Target profile (TOML). Without it, the embedded engine with its default flags.
    #[arg(long)]
    target: Option<PathBuf>,
    #[arg(long = "flags-dir")]
    flags_dir: Vec<PathBuf>,
    #[command(flatten)]
    load: WorkloadArgs,
    /// Corruption rate a good build may show; above it (95% lower bound) = corrupted.
    #[arg(long, default_value_t = 0.02)]
    background: f64,
    /// Corruption rate the bad build showed; clean needs the 95% upper bound below it.
    #[arg(long = "bug-rate", default_value_t = 0.10)]
    bug_rate: f64,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct FlagsArgs {
    #[arg(long = "flags-dir")]
    flags_dir: Vec<PathBuf>,
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// A results directory (holding run.json).
    dir: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RestoreArgs {
    /// Results root whose journal to replay.
    #[arg(long, default_value = "results")]
    results: PathBuf,
}

/// Parse the command line and run it; the exit code of a finished command.
pub fn run() -> anyhow::Result<ExitCode> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help / --version print to stdout and succeed; usage errors are exit 2.
            let _ = e.print();
            return Ok(ExitCode::from(if e.use_stderr() {
                exit::BAD_INPUT
            } else {
                exit::OK
            }));
        }
    };
    match cli.command {
        Command::Engine(args) => {
            let config = args
                .into_config()
                .map_err(|e| Failure::BadInput(format!("{e:#}")))?;
            bisect_engine::run(config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::MockEngine(args) => {
            engine::run_mock(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Flags(args) => flags(args),
        Command::Kernels => kernels(),
        Command::Report(args) => report_cmds::report(&args.dir, args.json),
        Command::Diff(args) => report_cmds::diff(args),
        Command::Reclassify(args) => report_cmds::reclassify(args),
        Command::Restore(args) => restore(args),
        Command::Matrix(args) => matrix::matrix(args),
        Command::Merge(args) => matrix::merge(args),
        Command::Run(args) => runtime()?.block_on(run_cmd(args)),
        Command::Probe(args) => runtime()?.block_on(probe_cmd(args)),
        Command::Culprit(args) => runtime()?.block_on(culprit::culprit_cmd(args)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn flags(args: FlagsArgs) -> anyhow::Result<ExitCode> {
    let catalog = FlagCatalog::load(&args.flags_dir)?;
    for f in &catalog.flags {
        println!(
            "{:<22} {} {:<36} roles={} on={} off={}",
            f.name,
            f.setting.kind(),
            f.setting.key(),
            f.roles.join(","),
            f.on,
            f.off
        );
        println!("{:<22} {}\n", "", f.doc.trim());
    }
    Ok(ExitCode::SUCCESS)
}

fn kernels() -> anyhow::Result<ExitCode> {
    use bisect_engine::backend::cuda;
    match cuda::probe() {
        Some(gpu) => println!("GPU: {gpu}"),
        None => println!("GPU: none found (the engine runs on the CPU backend)"),
    }
    let compiled = cuda::compile_check_all()
        .map_err(|e| Failure::CouldNotRun(format!("NVRTC compile check failed: {e:#}")))?;
    for (file, ptx) in compiled {
        println!("compiled {file}: {ptx} bytes of PTX");
    }
    Ok(ExitCode::SUCCESS)
}

fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    let restored = bisect_harness::launch::recover(&args.results.join(".bisect-journal"))?;
    if restored.is_empty() {
        println!("nothing to restore");
    }
    for p in restored {
        println!("restored {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn usage(message: impl Into<String>, fix: impl Into<String>) -> anyhow::Error {
    ConfigError::Usage {
        message: message.into(),
        fix: fix.into(),
    }
    .into()
}

/// Validate `bisect run` arguments into a plan (nothing is touched yet).
fn plan_run(args: &RunArgs) -> anyhow::Result<(RunPlan, bool)> {
    let catalog = FlagCatalog::load(&args.flags_dir)?;
    let flag = catalog.get(&args.flag)?.clone();
    let workload = args.load.load()?;
    if args.repeats == 0 {
        return Err(usage(
            "--repeats must be at least 1",
            "pass --repeats 1 or more",
        ));
    }
    let policy = args.decision.policy()?;
    let mut sets = Vec::new();
    for s in &args.set {
        let Some((name, value)) = s.split_once('=') else {
            return Err(usage(
                format!("--set {s}: expected NAME=VALUE"),
                "e.g. --set HICACHE=off",
            ));
        };
        let f = catalog.get(name)?.clone();
        if f.name == flag.name {
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
        sets.push((f, value.to_string()));
    }
    let id = run_id(&flag.name, args.tag.as_deref());
    let run_dir = args.results.join(&id);
    let embedded = args.target.is_none();
    let target = target_or_embedded(&args.target, &run_dir)?;
    let api_key = api_key(&target)?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let plan = RunPlan {
        id,
        command,
        flag,
        target,
        workload,
        repeats: args.repeats,
        sets,
        journal_dir: args.results.join(".bisect-journal"),
        run_dir,
        policy,
        allow_partial: args.allow_partial,
        api_key,
        metrics_period: Duration::from_millis(250),
    };
    Ok((plan, embedded))
}

fn run_id(flag: &str, tag: Option<&str>) -> String {
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S%.3f");
    let mut id = format!("{stamp}-{flag}");
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

async fn run_cmd(args: RunArgs) -> anyhow::Result<ExitCode> {
    // A journal left by a run that died (kill -9) is replayed before anything else.
    let journal = args.results.join(".bisect-journal");
    for p in bisect_harness::launch::recover(&journal)? {
        eprintln!(
            "restored {} left edited by an earlier run that did not finish",
            p.display()
        );
    }
    let (plan, _embedded) = plan_run(&args)?;
    let cancel = CancellationToken::new();
    spawn_signal_handler(cancel.clone());
    let mut control =
        bisect_harness::control::ProcessControl::new(&plan.target, &plan.run_dir.join("logs"))?;
    let progress: Box<dyn experiment::Progress> = if args.json {
        Box::new(progress::Lines::new(false))
    } else if std::io::stderr().is_terminal() {
        Box::new(progress::Bar::new(plan.workload.sessions as u64))
    } else {
        Box::new(progress::Lines::new(true))
    };
    eprintln!("results: {}", plan.run_dir.display());
    let record = experiment::run(&plan, &mut control, progress.as_ref(), cancel).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!("{}", bisect_harness::results::table::render(&record));
        println!("results: {}", plan.run_dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn target_or_embedded(
    target: &Option<PathBuf>,
    run_dir: &std::path::Path,
) -> anyhow::Result<TargetProfile> {
    match target {
        Some(path) => Ok(TargetProfile::load(path)?),
        None => {
            let exe = std::env::current_exe().context("locating the bisect executable")?;
            bisect_harness::config::embedded::prepare(&run_dir.join("launch"), &exe)
        }
    }
}

fn api_key(target: &TargetProfile) -> anyhow::Result<Option<String>> {
    match &target.api_key_env {
        Some(var) => Ok(Some(std::env::var(var).map_err(|_| {
            usage(
                format!("the target's api_key_env names ${var}, which is not set"),
                format!("export {var}=... before running, or remove api_key_env from the profile"),
            )
        })?)),
        None => Ok(None),
    }
}

async fn probe_cmd(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    for p in bisect_harness::launch::recover(&args.results.join(".bisect-journal"))? {
        eprintln!(
            "restored {} left edited by an earlier run that did not finish",
            p.display()
        );
    }
    let catalog = FlagCatalog::load(&args.flags_dir)?;
    let workload = args.load.load()?;
    for (name, v) in [
        ("--background", args.background),
        ("--bug-rate", args.bug_rate),
    ] {
        if !(v > 0.0 && v < 1.0) {
            return Err(usage(
                format!("{name} must lie in (0, 1)"),
                "e.g. --background 0.02 --bug-rate 0.10",
            ));
        }
    }
    let id = run_id("probe", None);
    let run_dir = args.results.join(&id);
    let target = target_or_embedded(&args.target, &run_dir)?;
    let plan = bisect_harness::commands::probe::ProbePlan {
        id,
        api_key: api_key(&target)?,
        target,
        workload,
        catalog,
        run_dir,
        background: args.background,
        bug_rate: args.bug_rate,
        degraded_fraction: Policy::default().degraded_fraction,
        metrics_period: Duration::from_millis(250),
    };
    let cancel = CancellationToken::new();
    spawn_signal_handler(cancel.clone());
    let mut control =
        bisect_harness::control::ProcessControl::new(&plan.target, &plan.run_dir.join("logs"))?;
    let progress = progress::Lines::new(!args.json);
    let record =
        match bisect_harness::commands::probe::run(&plan, &mut control, &progress, cancel).await {
            Ok(r) => r,
            Err(e) if matches!(e.downcast_ref::<Failure>(), Some(Failure::Interrupted)) => {
                return Err(e)
            }
            Err(e) => {
                // git bisect treats 125 as "skip this commit": a build that cannot serve.
                eprintln!("probe could not run: {e:#}");
                return Ok(ExitCode::from(exit::PROBE_UNKNOWN));
            }
        };
    let outcome = record
        .outcome
        .unwrap_or(bisect_harness::commands::probe::Outcome::Unknown);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        println!("probe: {:?}: {}", outcome, record.reason);
        println!("results: {}", plan.run_dir.display());
    }
    Ok(ExitCode::from(outcome.exit_code()))
}

fn spawn_signal_handler(cancel: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("interrupted: stopping engines and restoring launch configs");
        cancel.cancel();
    });
}
