//! `bisect culprit --flags A,B,C [--budget SESSIONS]`: clap arguments and the glue that
//! turns them into a [`CulpritPlan`], runs the search and prints its table or culprit.json.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{api_key, progress, run_id, spawn_signal_handler, target_or_embedded, usage};
use super::{DecisionArgs, WorkloadArgs};
use bisect_harness::commands::culprit::{self, CulpritPlan};
use bisect_harness::commands::run as experiment;
use bisect_harness::config::FlagCatalog;

#[derive(Debug, Args)]
pub struct CulpritArgs {
    /// Flags to search, comma-separated catalog names (at least two), each flipped alone.
    #[arg(long, value_delimiter = ',', required = true)]
    flags: Vec<String>,
    /// Total sessions (both arms, all flags): half screens every flag, the rest goes to
    /// the most promising undecided ones.
    #[arg(long, default_value_t = culprit::DEFAULT_BUDGET)]
    budget: u64,
    /// Target profile (TOML). Without it, the embedded engine is started.
    #[arg(long)]
    target: Option<PathBuf>,
    /// Extra flag catalog directories (later ones override).
    #[arg(long = "flags-dir")]
    flags_dir: Vec<PathBuf>,
    #[command(flatten)]
    load: WorkloadArgs,
    /// Appended to the search id.
    #[arg(long)]
    tag: Option<String>,
    /// Results root; the search goes to DIR/<id>/, each A/B pair to DIR/<id>/flags/<FLAG>/.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Print culprit.json instead of the table.
    #[arg(long)]
    json: bool,
    /// Allow a flag whose setting also appears in a role it does not list.
    #[arg(long = "allow-partial")]
    allow_partial: bool,
    #[command(flatten)]
    decision: DecisionArgs,
}

/// Validate the arguments into a plan; nothing is touched yet.
fn plan(args: &CulpritArgs) -> anyhow::Result<CulpritPlan> {
    let catalog = FlagCatalog::load(&args.flags_dir)?;
    let flags = args
        .flags
        .iter()
        .filter(|name| !name.trim().is_empty())
        .map(|name| catalog.get(name).cloned())
        .collect::<Result<Vec<_>, _>>()?;
    culprit::check_request(&flags, args.budget)?;
    if args.load.sessions.is_some() {
        return Err(usage(
            "--sessions does not apply to `bisect culprit`: each pair's size comes from --budget",
            "drop --sessions and set --budget SESSIONS (both arms, all flags)",
        ));
    }
    let workload = args.load.load()?;
    let policy = args.decision.policy()?;
    let id = run_id("culprit", args.tag.as_deref());
    let dir = args.results.join(&id);
    let target = target_or_embedded(&args.target, &dir)?;
    let plan = CulpritPlan {
        id,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        flags,
        api_key: api_key(&target)?,
        target,
        workload,
        budget: args.budget,
        policy,
        dir,
        journal_dir: args.results.join(".bisect-journal"),
        allow_partial: args.allow_partial,
        metrics_period: Duration::from_millis(250),
    };
    plan.validate()?;
    Ok(plan)
}

pub async fn culprit_cmd(args: CulpritArgs) -> anyhow::Result<ExitCode> {
    // A journal left by a run that died (kill -9) is replayed before anything else.
    for p in bisect_harness::launch::recover(&args.results.join(".bisect-journal"))? {
        eprintln!(
            "restored {} left edited by an earlier run that did not finish",
            p.display()
        );
    }
    let plan = plan(&args)?;
    let cancel = CancellationToken::new();
    spawn_signal_handler(cancel.clone());
    let mut control =
        bisect_harness::control::ProcessControl::new(&plan.target, &plan.dir.join("logs"))?;
    let progress: Box<dyn experiment::Progress> = if args.json {
        Box::new(progress::Lines::new(false))
    } else if std::io::stderr().is_terminal() {
        Box::new(progress::Bar::new(0))
    } else {
        Box::new(progress::Lines::new(true))
    };
    eprintln!("results: {}", plan.dir.display());
    let record = culprit::run(&plan, &mut control, progress.as_ref(), cancel).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!("{}", culprit::record::render_table(&record));
        println!("results: {}", plan.dir.display());
    }
    Ok(ExitCode::SUCCESS)
}
