//! `bisect commits --repo DIR GOOD BAD --build CMD [...]`: which commit of the engine
//! introduced a load-dependent corruption (docs/commits.md). Orchestration only: the
//! search is [`crate::core::commits`] (pure, a state machine fed observations); this
//! module lists the first-parent range ([`git`]), checks each tested commit out into a
//! worktree of its own and builds it ([`build`], cached per commit id), runs one block of
//! sessions on the commit's build through the arm lifecycle and judges it with every check
//! `run` makes ([`block`]; with `--flag`, the flag's on and off blocks judged as a pair,
//! `step`; `--set` pins written into every block), and writes commits.json, steps.jsonl,
//! summary.md and report.html after every step ([`record`], [`report`]). With
//! `--parallel K` a round's steps run as one Slurm job array ([`slurm`]), each task a
//! `bisect commits --round-task` ([`task`]) that builds and runs one step. `--resume DIR` replays DIR's
//! steps.jsonl through the search (nothing it logged runs again) and carries on.
//!
//! The worktrees are removed when the search ends, on every path; the user's working
//! tree, branches and launch configs are never written.

pub mod block;
pub mod build;
pub mod export;
pub mod git;
mod lanes;
pub mod range;
pub mod record;
mod report;
pub mod slurm;
mod step;
pub mod task;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::arm::{settle, Progress, TestbedOptions};
use crate::commands::answer::SearchAnswer;
use crate::commands::run::now;
use crate::config::Pin;
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::core::commits::{Action, Answer, Observation, Params, Search, Spent, Test};
use crate::core::evidence::Policy;
use crate::exit::Failure;
use crate::results::run_record::{FlagInfo, TargetInfo};
use block::{BlockContext, ControlFactory, Writes};
use build::{BuildStep, Builder, Built};
use git::{CommitInfo, Worktrees};
use range::{Find, RangeSpec};
use record::{CommitsRecord, Header, StepEntry, StepLog};
use slurm::Rounds;
use task::Planned;

/// Sessions the search may spend when `--max-sessions` is not given: 100 blocks of 80.
pub const DEFAULT_MAX_SESSIONS: u64 = 8000;

/// Everything `bisect commits` needs, validated.
#[derive(Debug, Clone)]
pub struct CommitsPlan {
    pub id: String,
    pub command: String,
    /// The repository's range, or the releases.
    pub range: RangeSpec,
    /// The first commit that corrupts, or the first that no longer does.
    pub find: Find,
    pub build: BuildStep,
    pub target: TargetProfile,
    /// One block: its sessions at its concurrency.
    pub workload: Workload,
    pub policy: Policy,
    pub max_sessions: u64,
    /// `results/<id>/` (on `--resume`, the folder resumed).
    pub dir: PathBuf,
    pub api_key: Option<String>,
    pub resume: bool,
    /// `--flag NAME`: every step is NAME's A/B at the commit, the on arm counted.
    pub flag: Option<FlagSpec>,
    /// With `flag`: the rate above which the off arm's corruption is not the flag's.
    pub background: f64,
    /// `--set NAME=VALUE` pins, written into every block's launch configs.
    pub pins: Vec<Pin>,
    /// How every block's testbed journals, keeps its state and polls the metrics.
    pub testbed: TestbedOptions,
    /// `--parallel K`: blocks per round (1: one at a time, here).
    pub parallel: u32,
    /// Where a round's blocks run: here, one after another, or as a Slurm job array.
    pub rounds: Rounds,
    /// `--oracle solo`: each block's sessions also run alone and are compared.
    pub oracle: Option<crate::core::solo::SoloOracle>,
}

impl CommitsPlan {
    /// The search's parameters for a range of `commits`.
    pub fn params(&self, commits: usize) -> Params {
        let mut p = Params::new(
            commits,
            u64::from(self.workload.sessions),
            self.workload.target_concurrency(),
        );
        p.alpha = self.policy.alpha;
        p.min_effect = self.policy.min_effect;
        p.max_sessions = self.max_sessions;
        p.flag = self.flag.as_ref().map(|f| f.name.clone());
        p.background = self.background;
        p.parallel = self.parallel;
        p
    }

    /// The steps.jsonl header of this search over `commits` (the range in the search's
    /// order): what `--resume` and every array task check they run.
    pub(crate) fn header(&self, commits: &[CommitInfo]) -> Header {
        Header {
            good: commits[0].sha.clone(),
            bad: commits[commits.len() - 1].sha.clone(),
            build: self.build_words(),
            commits: commits.len(),
            params: self.params(commits.len()),
            pinned: self.pinned(),
            find: self.find,
        }
    }

    /// The worktrees of this search under `root`: a git range's repository (`kept` for
    /// an array task's), none for releases.
    pub(crate) fn worktrees(&self, kept: bool) -> Worktrees {
        let root = self.dir.join("worktrees");
        match (self.range.repo(), kept) {
            (Some(repo), false) => Worktrees::new(repo, &root),
            (Some(repo), true) => Worktrees::kept(repo, &root),
            (None, _) => Worktrees::none(&root),
        }
    }

    /// The pins as `NAME=VALUE`.
    fn pinned(&self) -> Vec<String> {
        self.pins.iter().map(Pin::words).collect()
    }

    /// What every block of the search runs with.
    pub(crate) fn block_context<'c>(
        &'c self,
        controls: &'c ControlFactory<'c>,
        progress: &'c dyn Progress,
        cancel: CancellationToken,
    ) -> BlockContext<'c> {
        BlockContext {
            workload: &self.workload,
            policy: &self.policy,
            api_key: self.api_key.clone(),
            progress,
            cancel,
            controls,
            writes: Writes {
                pins: &self.pins,
                testbed: &self.testbed,
            },
            oracle: self.oracle,
        }
    }

    fn build_words(&self) -> String {
        match &self.build {
            BuildStep::Build(cmd) => format!("--build {cmd}"),
            BuildStep::Artifact(cmd) => format!("--artifact {cmd}"),
        }
    }
}

/// The exit code of a finished search: 0 culprit found and verified, 1 no culprit (or
/// the bad end does not reproduce), 3 inconclusive (or the culprit's verification failed).
pub fn exit_code(record: &CommitsRecord) -> u8 {
    record
        .answer
        .map_or(crate::exit::COULD_NOT_RUN, SearchAnswer::exit_code)
}

/// Run the search. The worktrees are removed before this returns, on every path;
/// commits.json says how far it got.
pub async fn run(
    plan: &CommitsPlan,
    controls: &ControlFactory<'_>,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<CommitsRecord> {
    let started = Instant::now();
    match (&plan.build, plan.range.repo()) {
        (BuildStep::Build(_), Some(repo)) if !block::runs_the_commit(&plan.target, repo) => {
            return Err(Failure::bad_input(
                format!(
                    "no role of target {} launches from {} and no restart command names {{commit}} or {{commit_dir}}: every commit would be measured on the same engine",
                    plan.target.name,
                    repo.display()
                ),
                "point the roles' launch configs into the repository, name {commit_dir} in their restart commands, or use --artifact",
            )
            .into());
        }
        (BuildStep::Build(_), None) => {
            return Err(Failure::bad_input(
                "--releases has no repository to build in",
                "pass --artifact with a command over {release} that installs or points to that release",
            )
            .into());
        }
        _ => {}
    }
    if matches!(plan.rounds, Rounds::Slurm(_)) {
        let writes = plan.flag.is_some() || !plan.pins.is_empty();
        slurm::refuse_shared_writes(&plan.target, plan.range.repo(), &plan.build, writes)?;
        slurm::refuse_shared_artifacts(&plan.target, &plan.build)?;
    }
    let commits = plan.range.list(plan.find)?;
    let params = plan.params(commits.len());
    params
        .validate()
        .map_err(|e| Failure::bad_input(e.to_string(), "adjust the option named"))?;
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("creating {}", plan.dir.display()))?;
    let header = plan.header(&commits);
    let log_path = plan.dir.join("steps.jsonl");
    let logged = if plan.resume {
        logged_steps(&log_path, &header)?
    } else {
        Vec::new()
    };
    let mut record = started_record(plan, &params, commits.clone());
    export::write(&plan.dir, &record)?;
    let mut log = StepLog::open(&log_path, &header, plan.resume)?;
    let mut worktrees = plan.worktrees(false);
    if matches!(plan.rounds, Rounds::Slurm(_)) {
        // Array tasks leave their worktrees for later rounds; any found now are a killed
        // search's, not to be trusted: its arrays are cancelled, the worktrees removed
        // with their build markers.
        slurm::cancel_leftovers(&plan.dir).await;
        worktrees.adopt_found();
        worktrees.remove_all()?;
        build::forget_shared(&plan.dir);
    }
    let mut search = Search::new(params);
    let ctx = plan.block_context(controls, progress, cancel.clone());
    let mut state = Driving {
        plan,
        commits: &commits,
        search: &mut search,
        record: &mut record,
        log: &mut log,
        builder: Builder::new(plan.build.clone(), &plan.dir),
        started,
        spent: Default::default(),
    };
    let outcome = state.drive(logged, &ctx, &mut worktrees).await;
    let spent = state.spent;
    worktrees.adopt_found();
    let removed = worktrees.remove_all();
    let outcome = match (outcome, removed) {
        (Ok(a), Ok(())) => Ok(a),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), _) => Err(e),
    };
    if let Ok(answer) = &outcome {
        record_answer(&mut record, &search, answer);
    }
    record.wall_s = started.elapsed().as_secs_f64();
    record.cost = Some(search_cost(plan, &spent, record.wall_s));
    crate::results::rates::update(&plan.testbed.state_dir(), &plan.target.name, |r| {
        r.take(&spent)
    });
    record.header.finished_at = Some(now());
    (record.header.status, record.error) = settle(&outcome);
    let written = export::write(&plan.dir, &record);
    crate::arm::record_written(outcome, written)?;
    Ok(record)
}

impl CommitsPlan {
    /// The sets of engines the search holds: `--parallel` on a Slurm cluster, as many of
    /// the target's replica sets as a round has steps, else one.
    pub fn sets(&self) -> u32 {
        match self.rounds {
            Rounds::Local => 1,
            Rounds::Slurm(_) => self.parallel.max(1),
            Rounds::Replicas => self
                .parallel
                .clamp(1, self.target.replicas.len() as u32 + 1),
        }
    }

    /// What the search is planned to cost (`commits --dry-run`), builds not counted:
    /// at its fewest blocks (both ends verified: two steps) and its most (the
    /// `--max-sessions` cap), a step one block, or with `--flag` an on and an off
    /// block; `--parallel` steps at once on engines of their own.
    pub fn planned_cost(&self, given: crate::core::cost::CostUnits) -> crate::core::cost::Planned {
        use crate::core::cost::Blocks;
        let sessions = u64::from(self.workload.sessions);
        let block = (sessions, self.workload.target_concurrency());
        let per_step = if self.flag.is_some() { 2 } else { 1 };
        let blocks = |n: u64| Blocks {
            restarts: n,
            blocks: vec![block; n as usize],
        };
        let most = (self.max_sessions / sessions.max(1)).max(2 * per_step);
        let (restart, wave) = crate::commands::cost_units(&self.testbed, &self.target.name, given);
        crate::core::cost::plan_between(
            &blocks(2 * per_step),
            &blocks(most),
            self.sets(),
            &restart,
            &wave,
        )
    }
}

/// What a search cost: its blocks' restarts and driving, on `--parallel` sets of engines
/// held for the wall time (a round's blocks run at once, each on engines of its own, so
/// its restarting and driving are each set's share, as `Cost::spent` takes a lane's).
fn search_cost(
    plan: &CommitsPlan,
    spent: &crate::core::cost::Spent,
    wall_s: f64,
) -> crate::core::cost::Cost {
    let sets = plan.sets();
    let per_set = crate::core::cost::Spent {
        restart_s: spent.restart_s / f64::from(sets),
        drive_s: spent.drive_s / f64::from(sets),
        ..*spent
    };
    let mut cost = crate::core::cost::Cost::spent(std::slice::from_ref(&per_set), wall_s);
    cost.replicas = sets;
    cost.engine_hours = f64::from(sets) * wall_s / 3600.0;
    cost
}

/// The steps of `log_path` for `--resume`, refused when the search it logged is not this.
fn logged_steps(log_path: &std::path::Path, header: &Header) -> anyhow::Result<Vec<StepEntry>> {
    let (logged, steps) = record::read_log(log_path)?;
    if logged != *header {
        return Err(Failure::bad_input(
            format!(
                "{}: the search it logged differs from this one (logged {:?}; now {:?})",
                log_path.display(),
                logged,
                header
            ),
            "resume with the same --repo, GOOD, BAD (or --releases), --find, --build/--artifact, --sessions, --concurrency, --alpha, --min-effect, --max-sessions, --flag, --background, --set and --parallel",
        )
        .into());
    }
    Ok(steps)
}

struct Driving<'d> {
    plan: &'d CommitsPlan,
    commits: &'d [CommitInfo],
    search: &'d mut Search,
    record: &'d mut CommitsRecord,
    log: &'d mut StepLog,
    builder: Builder,
    started: Instant,
    /// What the blocks run now (not replayed) spent: the search's cost.
    spent: crate::core::cost::Spent,
}

impl Driving<'_> {
    /// Ask for a round, run it (what the log holds is replayed, not run), observe its
    /// steps in order, until the search answers.
    async fn drive(
        &mut self,
        logged: Vec<StepEntry>,
        ctx: &BlockContext<'_>,
        worktrees: &mut Worktrees,
    ) -> anyhow::Result<Answer> {
        let mut replay = logged.into_iter();
        loop {
            if ctx.cancel.is_cancelled() {
                return Err(Failure::Interrupted.into());
            }
            let round = match self.search.next_round() {
                Action::Done(answer) => return Ok(answer),
                Action::Round(round) => round,
            };
            let mut fresh = Vec::new();
            for test in round {
                let Some(step) = replay.next() else {
                    fresh.push(test);
                    continue;
                };
                if step.commit != test.commit || step.purpose != test.purpose {
                    return Err(Failure::bad_input(
                        format!(
                            "steps.jsonl step {}: the log tested commit {} ({:?}), the search now asks for {} ({:?})",
                            step.step, step.commit, step.purpose, test.commit, test.purpose
                        ),
                        "resume with the options the search was started with",
                    )
                    .into());
                }
                self.search.observe(test, &step.observation, step.spent);
                self.record.replayed_steps += 1;
                self.push(step, false)?;
            }
            if fresh.is_empty() {
                continue;
            }
            let first = self.record.steps.len() as u64 + 1;
            let planned: Vec<Planned> = fresh
                .iter()
                .zip(first..)
                .map(|(test, step)| Planned::new(step, *test, &self.commits[test.commit]))
                .collect();
            match &self.plan.rounds {
                Rounds::Slurm(slurm) => {
                    let steps = slurm.run_round(&self.plan.dir, &planned, ctx).await?;
                    for step in steps {
                        self.observe_and_push(step)?;
                    }
                }
                Rounds::Replicas => {
                    let steps =
                        lanes::run_round(self.plan, &planned, &mut self.builder, ctx, worktrees)
                            .await?;
                    for step in steps {
                        self.observe_and_push(step)?;
                    }
                }
                Rounds::Local => {
                    for p in planned {
                        let step =
                            run_step(self.plan, &p, &mut self.builder, ctx, worktrees).await?;
                        self.observe_and_push(step)?;
                    }
                }
            }
        }
    }

    fn observe_and_push(&mut self, step: StepEntry) -> anyhow::Result<()> {
        let test = Test {
            commit: step.commit,
            purpose: step.purpose,
        };
        self.search.observe(test, &step.observation, step.spent);
        self.push(step, true)
    }

    /// The step into the log (when run now) and the record, which is rewritten.
    fn push(&mut self, step: StepEntry, live: bool) -> anyhow::Result<()> {
        if live {
            self.log.append(&step)?;
            if let Some(engine) = &step.engine {
                self.spent.add(engine);
            }
        }
        let r = &mut *self.record;
        r.sessions_spent += step.spent.sessions;
        if let Some(b) = &step.build {
            r.builds_run += 1;
            r.build_s += b.seconds;
        }
        r.steps.push(step);
        r.wall_s = self.started.elapsed().as_secs_f64();
        r.untestable = untestable_refs(r, self.search);
        export::write(&self.plan.dir, r)
    }
}

/// Build the planned step's commit (cached) and run the step's blocks on it: here, or in
/// a Slurm array task ([`task`]).
pub(crate) async fn run_step(
    plan: &CommitsPlan,
    p: &Planned,
    builder: &mut Builder,
    ctx: &BlockContext<'_>,
    worktrees: &mut Worktrees,
) -> anyhow::Result<StepEntry> {
    match build_step(plan, p, builder, ctx, worktrees).await? {
        Prepared::Done(step) => Ok(step),
        Prepared::Ready(ready) => run_built(plan, &plan.target, ready, ctx).await,
    }
}

/// A planned step after its build: untestable (the step is whole), or ready to run.
pub(crate) enum Prepared {
    Done(StepEntry),
    Ready(Ready),
}

/// A step whose commit is built: its entry so far, where the build is, and how the
/// progress names it.
pub(crate) struct Ready {
    step: StepEntry,
    folder: Option<PathBuf>,
    what: String,
}

/// How the progress names the planned step's commit or release.
fn step_words(plan: &CommitsPlan, p: &Planned) -> (String, String) {
    let short = git::short_id(&p.sha);
    match plan.range {
        RangeSpec::Releases(_) => (
            format!("release {short} (number {})", p.commit),
            String::new(),
        ),
        RangeSpec::Git { .. } => (
            format!("commit {} {short}", p.commit),
            format!(" {}", p.subject),
        ),
    }
}

/// Build the planned step's commit (cached): an untestable build ends the step here.
pub(crate) async fn build_step(
    plan: &CommitsPlan,
    p: &Planned,
    builder: &mut Builder,
    ctx: &BlockContext<'_>,
    worktrees: &mut Worktrees,
) -> anyhow::Result<Prepared> {
    let (what, subject) = step_words(plan, p);
    ctx.progress.note(&format!(
        "step {}: {what}{subject} ({:?})",
        p.step, p.purpose
    ));
    let (built, build) = builder
        .build(p.commit, &p.sha, worktrees, &ctx.cancel)
        .await?;
    let spent = Spent {
        build_s: build.as_ref().map(|b| b.seconds),
        ..Spent::default()
    };
    let untold = Observation::Untestable {
        reason: String::new(),
    };
    let mut step = StepEntry {
        build,
        ..p.step_entry(untold, spent)
    };
    match built {
        Built::Untestable(reason) => {
            ctx.progress
                .note(&format!("{what} is untestable: {reason}"));
            step.observation = Observation::Untestable { reason };
            Ok(Prepared::Done(step))
        }
        Built::Ready(folder) => Ok(Prepared::Ready(Ready { step, folder, what })),
    }
}

/// Run a built step's blocks on `set` (the plan's target, or one of its replica sets).
pub(crate) async fn run_built(
    plan: &CommitsPlan,
    set: &TargetProfile,
    ready: Ready,
    ctx: &BlockContext<'_>,
) -> anyhow::Result<StepEntry> {
    let Ready {
        mut step,
        folder,
        what,
    } = ready;
    let target = block::commit_target(
        set,
        plan.range.repo(),
        folder.as_deref(),
        &step.sha,
        &plan.dir,
    );
    let ab = plan.flag.as_ref().map(|flag| step::Ab {
        flag,
        background: plan.background,
    });
    step::run_blocks(ctx, &target, ab, &plan.dir, &mut step).await?;
    ctx.progress.note(&format!(
        "{what}: {}",
        record::observation_words(&step.observation)
    ));
    Ok(step)
}

fn untestable_refs(r: &CommitsRecord, search: &Search) -> Vec<record::CommitRef> {
    search
        .untestable()
        .iter()
        .enumerate()
        .filter_map(|(i, why)| {
            let mut c = r.commit_ref(i, None);
            c.reason = Some(why.clone()?);
            Some(c)
        })
        .collect()
}

fn started_record(plan: &CommitsPlan, params: &Params, commits: Vec<CommitInfo>) -> CommitsRecord {
    CommitsRecord {
        header: crate::results::RecordHeader::running(
            record::SCHEMA,
            &plan.id,
            &plan.command,
            now(),
            TargetInfo::of(&plan.target),
        ),
        repo: plan.range.words(),
        find: plan.find,
        first_fixed: None,
        releases: matches!(plan.range, RangeSpec::Releases(_)),
        build: plan.build_words(),
        workload: plan.workload.params_json(),
        params: params.clone(),
        flag: plan.flag.as_ref().map(FlagInfo::of),
        pinned: plan.pinned(),
        commits,
        answer: None,
        culprit: None,
        range: Vec::new(),
        parent: None,
        posterior: None,
        verdict: None,
        top: Vec::new(),
        untestable: Vec::new(),
        verification: Vec::new(),
        off_at_culprit: None,
        steps: Vec::new(),
        sessions_spent: 0,
        builds_run: 0,
        build_s: 0.0,
        replayed_steps: 0,
        wall_s: 0.0,
        cost: None,
        error: None,
    }
}

/// The search's answer into the record.
fn record_answer(r: &mut CommitsRecord, search: &Search, answer: &Answer) {
    r.verdict = Some(answer.words().to_string());
    r.untestable = untestable_refs(r, search);
    let post = search.posterior();
    let mut top: Vec<(usize, f64)> = post.culprit.iter().copied().enumerate().skip(1).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    r.top = top
        .iter()
        .take(3)
        .map(|&(c, p)| r.commit_ref(c, Some(p)))
        .collect();
    r.answer = Some(match answer {
        Answer::Culprit { verified: true, .. } => SearchAnswer::Culprit,
        Answer::Culprit { .. } => SearchAnswer::Unverified,
        Answer::NoCulprit { .. } => SearchAnswer::NoCulprit,
        Answer::CouldNotReproduce { .. } => SearchAnswer::CouldNotReproduce,
        Answer::Inconclusive { .. } => SearchAnswer::Inconclusive,
    });
    if let Answer::Culprit {
        first,
        last,
        parent,
        posterior,
        ..
    } = answer
    {
        r.culprit = Some(r.commit_ref(*last, Some(*posterior)));
        r.parent = Some(r.commit_ref(*parent, None));
        if r.find == Find::Fix {
            // Newest first: the culprit is the last that corrupts, its parent the fix.
            r.first_fixed = r.parent.clone();
            // The search's own words number the list newest first ("commit 1 raises
            // corruption"): said first in the user's terms.
            if let (Some(fix), Some(broken)) = (&r.first_fixed, &r.culprit) {
                r.verdict = Some(format!(
                    "{} is the first fixed, {} the last that corrupts; in the search's numbering \
                     (newest first): {}",
                    fix.subject,
                    broken.subject,
                    answer.words()
                ));
            }
        }
        r.posterior = Some(*posterior);
        if first != last {
            r.range = (*first..=*last)
                .map(|c| r.commit_ref(c, Some(post.culprit[c])))
                .collect();
        }
        r.verification = search.ab().looks().to_vec();
        if search.params().flag.is_some() {
            r.off_at_culprit = Some(search.off_counts()[*last]);
        }
    }
}
