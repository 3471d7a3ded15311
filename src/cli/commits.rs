//! `bisect commits --repo DIR GOOD BAD --build CMD [--flag NAME] [--set NAME=VALUE]...
//! [...]`, `bisect commits --releases A,B,C --artifact CMD [--find fix] [...]` (and
//! `--simulate`): clap arguments and their conversion into a [`CommitsPlan`].

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{command_line, parse_pins, run_id, usage, ExperimentArgs, OracleArgs};
use bisect_harness::commands::commits::build::BuildStep;
use bisect_harness::commands::commits::range::{parse_releases, Find, RangeSpec};
use bisect_harness::commands::commits::slurm::{Rounds, SlurmRounds};
use bisect_harness::commands::commits::task;
use bisect_harness::commands::commits::{CommitsPlan, DEFAULT_MAX_SESSIONS};
use bisect_harness::config::TargetProfile;

#[derive(Debug, Args)]
pub(crate) struct CommitsArgs {
    /// The older end: the last commit known good (with --find fix: the last known to
    /// corrupt). A commit id, tag or branch of --repo.
    #[arg(required_unless_present_any = ["simulate", "releases"], conflicts_with = "releases")]
    good: Option<String>,
    /// The newer end: the first commit known bad (with --find fix: known fixed); the
    /// range is the older end's first-parent descendants up to it.
    #[arg(required_unless_present_any = ["simulate", "releases"], conflicts_with = "releases")]
    bad: Option<String>,
    /// The engine's git repository. Its working tree and branches are never touched:
    /// each tested commit is checked out into a worktree of the search's own.
    #[arg(long, required_unless_present_any = ["simulate", "releases"], conflicts_with = "releases")]
    repo: Option<PathBuf>,
    /// Search an ordered list of releases instead of a repository's commits: names
    /// oldest first, comma-separated (e.g. 0.3.7,0.3.8,0.3.9). Needs --artifact, whose
    /// command `{release}` makes that release the one the target's roles run (a build,
    /// a pip install, a symlink).
    #[arg(long, value_delimiter = ',', num_args = 1.., requires = "artifact", conflicts_with = "build")]
    releases: Vec<String>,
    /// What to find: the first commit (release) that corrupts (break, after one that
    /// does not), or the first that no longer does (fix, after one that does).
    #[arg(long, value_enum, default_value_t = FindArg::Break)]
    find: FindArg,
    /// Build command, run (`sh -c`) in the commit's worktree with BISECT_COMMIT and
    /// BISECT_COMMIT_DIR set; exit 125 or a failure makes the commit untestable.
    #[arg(long, conflicts_with = "artifact", required_unless_present_any = ["artifact", "simulate"])]
    build: Option<String>,
    /// Instead of building: a command over `{commit}` (with --releases, `{release}`) that
    /// fetches or installs that commit's prebuilt artifact (a wheel, an image), run without
    /// a checkout, in the search's folder.
    #[arg(long)]
    artifact: Option<String>,
    /// Judge each commit by an A/B of this flag (catalog name, or its env/arg name): the
    /// commit since which the flag on corrupts. Each step runs an on and an off block;
    /// the search counts the on arm, the off arm must stay clean (docs/commits.md).
    #[arg(long)]
    flag: Option<String>,
    /// With --flag: the corruption rate the off arm may show (background flakes); a step
    /// whose off arm corrupts above it (95% Wilson lower bound) could not tell.
    #[arg(long, default_value_t = 0.02, requires = "flag")]
    background: f64,
    /// Pin a flag in every block at every commit: NAME=VALUE (repeatable), written into
    /// the launch configs each commit's engines start from.
    #[arg(long = "set")]
    set: Vec<String>,
    /// Most sessions the search may spend, all blocks together.
    #[arg(long = "max-sessions", default_value_t = DEFAULT_MAX_SESSIONS)]
    max_sessions: u64,
    /// Carry on a search that stopped: replay DIR/steps.jsonl and continue in DIR. Pass
    /// the same arguments.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// Blocks per round: with K > 1 each round's K commits, chosen together by their
    /// joint information, run side by side: on a target with replica sets, one commit per
    /// set in this process (docs/commits.md, "Replica sets"; K defaults to the number of
    /// sets there, else to 1); otherwise, or with --sbatch, as a Slurm job array, one task
    /// each (the search's folder, --repo and this binary at the same paths on every node;
    /// docs/commits.md, "Slurm").
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=8))]
    parallel: Option<u32>,
    /// An sbatch option for every round's job array (repeatable), e.g.
    /// --sbatch=--partition=gpu --sbatch=--exclusive. Given without --parallel, rounds of
    /// one block still run on the cluster.
    #[arg(long = "sbatch", value_name = "OPTION", allow_hyphen_values = true)]
    sbatch: Vec<String>,
    /// Run one array task of a round: written by --parallel into its job scripts.
    #[arg(long, hide = true, value_name = "ROUND")]
    pub(crate) round_task: Option<PathBuf>,
    /// Run the simulation benchmark instead (no repository, no engine): the search
    /// beside plain and repeated bisection on scripted ranges (docs/commits.md); with
    /// --parallel K, the search at K blocks a round beside one.
    #[arg(long)]
    pub(crate) simulate: bool,
    /// With --simulate: ranges per scenario and size.
    #[arg(long, default_value_t = 1000, requires = "simulate")]
    pub(crate) searches: usize,
    /// With --simulate: range sizes (commits after the good end).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,1024",
        requires = "simulate"
    )]
    pub(crate) sizes: Vec<usize>,
    #[command(flatten)]
    oracle: OracleArgs,
    #[command(flatten)]
    pub(crate) cost: super::CostArgs,
    #[command(flatten)]
    pub(crate) common: ExperimentArgs,
}

impl CommitsArgs {
    /// Validate the arguments into a plan (nothing is touched).
    pub(crate) fn plan(&self) -> anyhow::Result<CommitsPlan> {
        let common = &self.common;
        let range = self.range()?;
        let build =
            match (&self.build, &self.artifact) {
                (Some(cmd), None) => BuildStep::Build(cmd.clone()),
                (None, Some(cmd)) => BuildStep::Artifact(cmd.clone()),
                _ => return Err(usage(
                    "pass one of --build and --artifact",
                    "e.g. --build 'make' or --artifact 'pip install wheels/engine-{commit}.whl'",
                )),
            };
        let mut workload = common.load.load()?;
        let oracle = self.oracle.solo(&mut workload)?;
        let policy = common.decision.policy()?;
        // The catalog only where a flag is named: a plain search reads no flag files.
        let (flag, pins) = if self.flag.is_none() && self.set.is_empty() {
            (None, Vec::new())
        } else {
            let catalog = common.target.catalog()?;
            let flag = match &self.flag {
                Some(name) => Some(catalog.get(name)?.clone()),
                None => None,
            };
            let pins = parse_pins(&catalog, &self.set, flag.as_ref().map(|f| f.name.as_str()))?;
            (flag, pins)
        };
        let search_dir = match &self.round_task {
            Some(round) => Some(task::search_dir(round)?),
            None => self.resume.clone(),
        };
        let (id, dir) = match &search_dir {
            Some(dir) => (
                dir.file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_else(|| "commits".into()),
                dir.clone(),
            ),
            None => {
                let id = run_id("commits", common.tag.as_deref());
                let dir = common.output.results.join(&id);
                (id, dir)
            }
        };
        let (target, api_key) = common.target.resolve(&dir)?;
        let (parallel, rounds) = (self.parallel_on(&target), self.rounds(&target)?);
        let plan = CommitsPlan {
            id,
            command: command_line(),
            range,
            find: match self.find {
                FindArg::Break => Find::Break,
                FindArg::Fix => Find::Fix,
            },
            build,
            target,
            workload,
            policy,
            max_sessions: self.max_sessions,
            dir,
            api_key,
            resume: self.resume.is_some(),
            parallel,
            rounds,
            flag,
            background: self.background,
            pins,
            testbed: common.testbed(),
            oracle,
        };
        plan.params(2)
            .validate()
            .map_err(|e| usage(e, "adjust the option named"))?;
        Ok(plan)
    }

    /// The repository's range or the releases, checked.
    fn range(&self) -> anyhow::Result<RangeSpec> {
        if !self.releases.is_empty() {
            return Ok(RangeSpec::Releases(parse_releases(&self.releases)?));
        }
        let (Some(good), Some(bad), Some(repo)) = (&self.good, &self.bad, &self.repo) else {
            return Err(usage(
                "GOOD, BAD and --repo are needed",
                "pass --repo DIR GOOD BAD, --releases A,B,C, or --simulate",
            ));
        };
        if !repo.join(".git").exists() {
            return Err(usage(
                format!(
                    "--repo {}: not a git repository (no .git there)",
                    repo.display()
                ),
                "pass the root of the engine's git checkout",
            ));
        }
        Ok(RangeSpec::Git {
            repo: repo.clone(),
            good: good.clone(),
            bad: bad.clone(),
        })
    }

    /// `--parallel`, 1 when not given (`--simulate`).
    pub(crate) fn parallel(&self) -> u32 {
        self.parallel.unwrap_or(1)
    }

    /// `--parallel` on `target`: when not given, one block a round per replica set where
    /// the rounds run on them (no `--sbatch`), else 1.
    fn parallel_on(&self, target: &TargetProfile) -> u32 {
        match self.parallel {
            Some(k) => k,
            None if self.sbatch.is_empty() => (target.replicas.len() as u32 + 1).min(8),
            None => 1,
        }
    }

    /// Where rounds run: on the target's replica sets when it lists several and no
    /// --sbatch is given; else as Slurm job arrays with --parallel K > 1 or --sbatch (an
    /// array task runs its own step here).
    fn rounds(&self, target: &TargetProfile) -> anyhow::Result<Rounds> {
        let parallel = self.parallel_on(target);
        if self.round_task.is_some() || (parallel == 1 && self.sbatch.is_empty()) {
            return Ok(Rounds::Local);
        }
        if !target.replicas.is_empty() && self.sbatch.is_empty() {
            return Ok(Rounds::Replicas);
        }
        if !bisect_harness::commands::check::on_path("sbatch") {
            return Err(usage(
                format!(
                    "--parallel {parallel} runs each round as a Slurm job array, and sbatch is not on PATH",
                ),
                "run the search on a Slurm login node, list the target's replica sets ([[replica]]) to run rounds on them here, or drop --parallel and --sbatch",
            ));
        }
        let exe = std::env::current_exe()?;
        let mut task_command = vec![exe.display().to_string()];
        for arg in std::env::args_os().skip(1) {
            task_command.push(arg.into_string().map_err(|arg| {
                usage(
                    format!("--parallel: the argument {arg:?} is not UTF-8, and the round's job script names every argument"),
                    "rename the path or value so it is UTF-8",
                )
            })?);
        }
        Ok(Rounds::Slurm(SlurmRounds {
            task_command,
            sbatch_args: self.sbatch.clone(),
            workdir: std::env::current_dir()?,
            poll: SQUEUE_POLL,
        }))
    }
}

/// `--find`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FindArg {
    Break,
    Fix,
}

/// How often a waiting search asks squeue about its round.
const SQUEUE_POLL: std::time::Duration = std::time::Duration::from_secs(2);
