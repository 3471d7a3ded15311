//! The search between a regression's builds (docs/history.md, "Bisected by itself"): the
//! last good night's build and the first bad night's, searched by `bisect commits` at the
//! regressed cell's configuration (its flags and the plan's pins as `--set`, its
//! sessions in flight, its rounds, the plan's workload), with the repository and build
//! command of the plan's `[commits]`. `prepare` says the search (or why there is none);
//! `--auto-bisect` runs it in-process through the commits lifecycle into
//! `DIR/bisects/<cell>@<last good>-<build>..<first bad>-<build>/`, where `landed` finds its answer on
//! every later reading of the history.

use std::path::{Path, PathBuf};

use super::read::Night;
use super::record::{LandedSearch, SearchPlan};
use crate::arm::TestbedOptions;
use crate::commands::commits::build::BuildStep;
use crate::commands::commits::range::{Find, RangeSpec};
use crate::commands::commits::record::CommitsRecord;
use crate::commands::commits::slurm::Rounds;
use crate::commands::commits::{CommitsPlan, DEFAULT_MAX_SESSIONS};
use crate::commands::matrix::plan::{CommitsSpec, Plan};
use crate::commands::matrix::Cell;
use crate::config::TargetProfile;
use crate::core::evidence::Policy;
use crate::core::history::RegressionEvent;

/// Where searches land, under the history's directory.
pub const BISECTS: &str = "bisects";

/// Everything a search between two nights needs, found.
struct Searchable {
    plan: Plan,
    spec: CommitsSpec,
    cell: Cell,
    target: PathBuf,
    good: String,
    bad: String,
    /// The search's directory, relative to the history's.
    dir: String,
    /// The smallest rise the search looks for: half the regression's, within 1-5 points.
    min_effect: f64,
}

/// The search for `event` of `cell`, or why there is none.
pub(crate) fn prepare(nights: &[Night], cell: &str, event: &RegressionEvent) -> SearchPlan {
    match searchable(nights, cell, event) {
        Ok(s) => SearchPlan::Prepared {
            command: command_line(&s),
            dir: s.dir,
            good: s.good,
            bad: s.bad,
        },
        Err(why) => SearchPlan::Unavailable { why },
    }
}

fn searchable(
    nights: &[Night],
    cell_id: &str,
    event: &RegressionEvent,
) -> Result<Searchable, String> {
    let (good_night, bad_night) = (
        &nights[event.last_good_night],
        &nights[event.first_bad_night],
    );
    let (Some(good), Some(bad)) = (&good_night.entry.build, &bad_night.entry.build) else {
        return Err(format!(
            "night {} or {} names no build (run each night's matrix with --build ID, the commit or release it ran)",
            good_night.entry.label, bad_night.entry.label
        ));
    };
    if good == bad {
        return Err(format!(
            "nights {} and {} ran the same build {good}: the change is not in the engine's commits (a machine, a driver, a dependency)",
            good_night.entry.label, bad_night.entry.label
        ));
    }
    let record = bad_night
        .record
        .as_ref()
        .ok_or("the first bad night has no record")?;
    let plan_path = PathBuf::from(&record.plan.path);
    let plan = Plan::load(&plan_path).map_err(|e| {
        format!(
            "the first bad night's plan {} cannot be read ({e}): the search needs its [commits] table",
            plan_path.display()
        )
    })?;
    if plan.hash() != record.plan.hash {
        return Err(format!(
            "the plan {} changed since night {} (hash {} then, {} now): restore it, or search by hand with `bisect commits`",
            plan_path.display(),
            bad_night.entry.label,
            record.plan.hash,
            plan.hash()
        ));
    }
    let spec = plan.commits.clone().ok_or_else(|| {
        format!(
            "the plan {} has no [commits] table (repo, build or artifact): add one to search the builds",
            plan_path.display()
        )
    })?;
    // The plan's own target (resolved against the plan's folder), not the path as the
    // night's command line typed it: the history may be read from anywhere.
    let target = plan.target.clone().ok_or(
        "the nights ran the embedded engine from generated launch scripts, which no commit builds: give the plan a target whose launch configs lie in [commits] repo",
    )?;
    let cell = plan
        .cells
        .iter()
        .find(|c| c.id == cell_id)
        .cloned()
        .ok_or_else(|| format!("the plan no longer has cell {cell_id}"))?;
    let (before, after) = (event.before, event.after);
    let rise =
        crate::core::stats::rate(after.0, after.1) - crate::core::stats::rate(before.0, before.1);
    let slug: String = cell_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Named by the nights and their builds: a rerun night with another build is another
    // search.
    let short = |b: &str| b.chars().take(10).collect::<String>();
    let dir = format!(
        "{BISECTS}/{slug}@{}-{}..{}-{}",
        good_night.entry.label,
        short(good),
        bad_night.entry.label,
        short(bad)
    );
    Ok(Searchable {
        plan,
        spec,
        cell,
        target,
        good: good.clone(),
        bad: bad.clone(),
        dir,
        min_effect: (rise / 2.0).clamp(0.01, 0.05),
    })
}

impl Searchable {
    /// Sessions per block: `[commits] sessions`, else one of the cell's blocks (its
    /// sessions, all in flight, on a freshly started engine, as a night's first repeat).
    fn sessions(&self) -> u32 {
        self.spec.sessions.unwrap_or(self.cell.sessions)
    }

    /// The cell's sessions in flight.
    fn concurrency(&self) -> u32 {
        self.plan
            .workload
            .concurrency
            .unwrap_or(self.cell.sessions)
            .min(self.cell.sessions)
    }

    fn pins(&self) -> Vec<crate::config::Pin> {
        self.cell
            .flags
            .iter()
            .chain(&self.plan.pins)
            .cloned()
            .collect()
    }
}

/// The equivalent `bisect commits` command line.
fn command_line(s: &Searchable) -> String {
    let quote = |t: &str| format!("'{}'", t.replace('\'', r"'\''"));
    let build = match &s.spec.build {
        BuildStep::Build(cmd) => format!("--build {}", quote(cmd)),
        BuildStep::Artifact(cmd) => format!("--artifact {}", quote(cmd)),
    };
    let w = &s.plan.workload;
    let workload = w
        .source
        .as_ref()
        .map_or(w.name.clone(), |p| p.display().to_string());
    let mut line = format!(
        "bisect commits --repo {} {} {} {build} --target {} --workload {} --ctx {} --max-tokens {} --timeout {} --seed {} --sessions {} --concurrency {} --rounds {} --min-effect {} --max-sessions {}",
        quote(&s.spec.repo.display().to_string()),
        s.good,
        s.bad,
        quote(&s.target.display().to_string()),
        quote(&workload),
        w.ctx,
        w.max_tokens,
        w.timeout_s,
        w.seed,
        s.sessions(),
        s.concurrency(),
        s.cell.rounds,
        s.min_effect,
        s.spec.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS),
    );
    for pin in s.pins() {
        line.push_str(&format!(" --set {}", pin.words()));
    }
    line
}

/// The search's answer, when it ran: commits.json in its directory.
pub(crate) fn landed(root: &Path, search: &SearchPlan) -> Option<LandedSearch> {
    let SearchPlan::Prepared { dir, good, bad, .. } = search else {
        return None;
    };
    let text = std::fs::read_to_string(root.join(dir).join("commits.json")).ok()?;
    let record: CommitsRecord = serde_json::from_str(&text).ok()?;
    // A search still under way (or killed) has no answer yet: not landed. Nor has one
    // of another range (the ends as the search resolved them: full commit ids).
    record.answer?;
    let ends = (record.commits.first()?, record.commits.last()?);
    if !(ends.0.sha.starts_with(good.as_str()) || good.starts_with(&ends.0.sha))
        || !(ends.1.sha.starts_with(bad.as_str()) || bad.starts_with(&ends.1.sha))
    {
        return None;
    }
    Some(LandedSearch {
        dir: dir.clone(),
        answer: record.answer,
        words: record.verdict.clone().unwrap_or_default(),
        culprit: record.culprit.as_ref().map(|c| c.sha.clone()),
        subject: record.culprit.as_ref().map(|c| c.subject.clone()),
    })
}

/// The `bisect commits` plan of a prepared search, to run in-process.
pub fn commits_plan(
    root: &Path,
    nights: &[Night],
    cell: &str,
    event: &RegressionEvent,
    testbed: TestbedOptions,
    command: &str,
) -> anyhow::Result<CommitsPlan> {
    let s = searchable(nights, cell, event).map_err(|why| anyhow::anyhow!(why))?;
    let target = TargetProfile::load(&s.target)?;
    let api_key = match &target.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            anyhow::anyhow!("the target's api_key_env names ${var}, which is not set")
        })?),
        None => None,
    };
    let mut workload = s.plan.workload.clone();
    workload.sessions = s.sessions();
    workload.concurrency = Some(s.concurrency());
    workload.rounds = s.cell.rounds;
    let policy = Policy {
        min_effect: s.min_effect,
        ..Policy::default()
    };
    // Absolute: the search runs builds in worktrees below it, from their own folders.
    let dir = std::path::absolute(root.join(&s.dir))?;
    // A search a killed reading left behind carries on from its steps.
    let resume = dir.join("steps.jsonl").is_file();
    let pins = s.pins();
    Ok(CommitsPlan {
        id: dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "commits".into()),
        command: format!("{command} (auto-bisect: {})", command_line(&s)),
        range: RangeSpec::Git {
            repo: s.spec.repo.clone(),
            good: s.good.clone(),
            bad: s.bad.clone(),
        },
        find: Find::Break,
        build: s.spec.build.clone(),
        target,
        workload,
        policy,
        max_sessions: s.spec.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS),
        dir,
        api_key,
        resume,
        flag: None,
        background: 0.02,
        pins,
        testbed,
        parallel: 1,
        rounds: Rounds::Local,
        oracle: None,
    })
}
