//! What `bisect commits` leaves in its folder: `commits.json` (the range, the answer, every
//! block with its commit, counts and checks, every build and its seconds), `steps.jsonl`
//! (one line per observation, what `--resume` replays), `summary.md` and `report.html`
//! (the posterior over the range after each step). Rewritten after every step.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::build::BuildEntry;
use super::git::CommitInfo;
use super::range::Find;
use crate::core::commits::search::Search;
use crate::core::commits::{Action, Counts, Observation, Params, Purpose, Spent, Test};
use crate::core::sequential::LookRecord;
use crate::results::run_record::FlagInfo;

pub(crate) const SCHEMA: &str = "bisect.commits/1";

/// One block (or build failure) as the record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEntry {
    /// 1-based.
    pub step: u64,
    pub commit: usize,
    pub sha: String,
    pub(crate) purpose: Purpose,
    pub(crate) observation: Observation,
    pub spent: Spent,
    /// `blocks/bNNN` when a block ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_engine: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// The build this step needed, when it ran one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildEntry>,
    /// What the engines reported about themselves after the restart.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub engine_info: serde_json::Map<String, serde_json::Value>,
    /// With `--flag`: the A/B's blocks, on then off (`observation` is the pair's); the
    /// fields above that describe one block are then empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arms: Vec<ArmStep>,
    /// With `--parallel`/`--sbatch`: the first step of the round (the job array) it ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u64>,
    /// On a target with replica sets: the set the step's blocks ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// What the step's blocks' testbeds spent (restarts, driving); absent in steps
    /// logged before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<crate::core::cost::Spent>,
}

impl StepEntry {
    /// The folders of the step's blocks: its one block's, or each arm's.
    pub fn dirs(&self) -> Vec<&str> {
        self.dir
            .as_deref()
            .into_iter()
            .chain(self.arms.iter().map(|a| a.dir.as_str()))
            .collect()
    }
}

/// One arm's block of a step under `--flag`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmStep {
    /// `on` or `off`.
    pub arm: String,
    /// The flag's value in this arm.
    pub value: String,
    /// The block's own observation (the step's is the pair's).
    pub(crate) observation: Observation,
    /// `blocks/bNNN-on`.
    pub dir: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_engine: Option<u64>,
    pub wall_s: f64,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub engine_info: serde_json::Map<String, serde_json::Value>,
}

/// The first line of steps.jsonl: the search it logged, refused on `--resume` when not
/// this one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub good: String,
    pub bad: String,
    pub build: String,
    pub commits: usize,
    pub params: Params,
    /// `--set` pins, `NAME=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<String>,
    /// `--find fix`: a fix search (the range newest first).
    #[serde(default, skip_serializing_if = "Find::is_break")]
    pub find: Find,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitRef {
    pub commit: usize,
    pub sha: String,
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) posterior: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// commits.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommitsRecord {
    /// schema, id, command, times, status, target: the header every record opens with.
    #[serde(flatten)]
    pub header: crate::results::RecordHeader,
    /// The repository, or `releases A,B,C`.
    pub repo: String,
    /// `--find fix`: the search looked for the first commit (release) without the
    /// corruption; `commits` is then newest first, `culprit` the last that corrupts and
    /// `first_fixed` (its parent in that order) the fix.
    #[serde(default, skip_serializing_if = "Find::is_break")]
    pub find: Find,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_fixed: Option<CommitRef>,
    /// `--releases`: `commits` are release names, not a repository's commits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub releases: bool,
    pub build: String,
    pub workload: serde_json::Value,
    pub params: Params,
    /// `--flag`: the flag whose A/B every step runs (`params.flag` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<FlagInfo>,
    /// `--set` pins written into every block's launch configs, `NAME=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<String>,
    /// The range in the search's order, its good end first (a fix search: newest first).
    pub commits: Vec<CommitInfo>,
    /// culprit / unverified / no_culprit / could_not_reproduce / inconclusive.
    pub answer: Option<crate::commands::answer::SearchAnswer>,
    pub culprit: Option<CommitRef>,
    /// The commits the answer spans when untestable commits widen it (first..=last).
    pub range: Vec<CommitRef>,
    pub parent: Option<CommitRef>,
    pub(crate) posterior: Option<f64>,
    pub verdict: Option<String>,
    /// The posterior's most probable culprits at the end.
    pub top: Vec<CommitRef>,
    pub untestable: Vec<CommitRef>,
    /// The verification A/B's looks (culprit = on, parent = off).
    pub verification: Vec<LookRecord>,
    /// With `--flag`: the off arm's counts at the culprit, every pair there pooled (the
    /// verification needs them clean).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_at_culprit: Option<Counts>,
    pub steps: Vec<StepEntry>,
    pub sessions_spent: u64,
    pub(crate) builds_run: u64,
    pub(crate) build_s: f64,
    pub replayed_steps: usize,
    pub wall_s: f64,
    /// What the search cost: restarts, driving, engine-hours, wall (core::cost): its
    /// steps' blocks, a round's `--parallel` blocks on engines of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::core::cost::Cost>,
    pub error: Option<String>,
}

impl CommitsRecord {
    pub(crate) fn commit_ref(&self, commit: usize, posterior: Option<f64>) -> CommitRef {
        let info = &self.commits[commit];
        CommitRef {
            commit,
            sha: info.sha.clone(),
            subject: info.subject.clone(),
            posterior,
            reason: None,
        }
    }
}

/// The posterior after each step, as the search held it (the steps replayed through
/// [`Search`], so blocks a failed verification sent back leave it as they did live):
/// what the report draws.
pub(crate) fn posterior_history(record: &CommitsRecord) -> Vec<Vec<f64>> {
    let mut search = Search::new(record.params.clone());
    let mut steps = record.steps.iter();
    let mut out = Vec::new();
    let row = |search: &Search| {
        let post = search.posterior();
        let mut row = post.culprit.clone();
        row.push(post.none);
        row
    };
    // The live loop asks once per round, then observes the round's steps in order;
    // asking moves the budget and end phases.
    'rounds: loop {
        let round_len = match search.next_round() {
            Action::Round(round) => round.len(),
            Action::Done(_) => 0,
        };
        for _ in 0..round_len.max(1) {
            let Some(step) = steps.next() else {
                break 'rounds;
            };
            let test = Test {
                commit: step.commit,
                purpose: step.purpose,
            };
            search.observe(test, &step.observation, step.spent);
            out.push(row(&search));
        }
    }
    out
}

fn short(sha: &str) -> &str {
    super::git::short_id(sha)
}

/// What the search ran over, in a sentence's first half.
pub(crate) fn range_words(r: &CommitsRecord) -> String {
    let (first, last) = (
        r.commits.first().map_or("-", |c| short(&c.sha)),
        r.commits.last().map_or("-", |c| short(&c.sha)),
    );
    match (r.find, r.releases) {
        (Find::Break, false) => format!(
            "Range: {} commits after {first} up to {last} (first parent)",
            r.commits.len().saturating_sub(1)
        ),
        (Find::Break, true) => format!(
            "Releases: {} after {first} up to {last}, searched for the first that corrupts",
            r.commits.len().saturating_sub(1)
        ),
        (Find::Fix, releases) => format!(
            "{}: {} before {first} back to {last}, searched for the first without the corruption \
             (numbered newest first: the search's good end is the fixed one, its bad end the oldest)",
            if releases { "Releases" } else { "Range" },
            r.commits.len().saturating_sub(1)
        ),
    }
}

/// The answer's commit (or release) in a line: the culprit, or with `--find fix` the
/// first fixed and the last that corrupts.
pub(crate) fn answer_line(r: &CommitsRecord) -> Option<String> {
    let c = r.culprit.as_ref()?;
    Some(match (&r.find, &r.first_fixed) {
        (Find::Fix, Some(fix)) => format!(
            "First fixed: `{}` {} (number {}); the last that corrupts: `{}` {} (number {})",
            short(&fix.sha),
            fix.subject,
            fix.commit,
            short(&c.sha),
            c.subject,
            c.commit
        ),
        _ => format!(
            "Culprit: `{}` {} (commit {} of the range)",
            short(&c.sha),
            c.subject,
            c.commit
        ),
    })
}

/// What every block ran with besides the commit: the flag's A/B and the pins, a
/// sentence each (summary.md and report.html).
pub(crate) fn setup_lines(r: &CommitsRecord) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(f) = &r.flag {
        lines.push(format!(
            "Every step is an A/B of {} (on {}, off {}); the search counts the on arm.",
            f.name, f.on, f.off
        ));
    }
    if !r.pinned.is_empty() {
        lines.push(format!("Pinned in every block: {}.", r.pinned.join(", ")));
    }
    if let Some(rounds) = step_labels(r).iter().filter_map(|(_, round)| *round).max() {
        let mut sets: Vec<&str> = r
            .steps
            .iter()
            .filter_map(|s| s.replica.as_deref())
            .collect();
        sets.sort_unstable();
        sets.dedup();
        let how = if sets.is_empty() {
            "as Slurm job arrays".to_string()
        } else {
            format!(
                "one per replica set ({}; the ends and the verifying A/B on the first)",
                sets.join(", ")
            )
        };
        lines.push(format!(
            "Up to {} blocks a round, side by side {how}: {} steps in {} rounds.",
            r.params.parallel,
            r.steps.len(),
            rounds
        ));
    }
    lines
}

/// Each step's label for the tables: its number, and with rounds (`--parallel`) the
/// round's (1-based, in order) and on replica sets the set's, e.g. "6 (round 3)" or
/// "6 (round 3, set b)"; and that round number.
pub(crate) fn step_labels(r: &CommitsRecord) -> Vec<(String, Option<usize>)> {
    let mut seen = 0;
    let mut last = None;
    r.steps
        .iter()
        .map(|st| match st.round {
            None => (st.step.to_string(), None),
            Some(round) => {
                if last != Some(round) {
                    seen += 1;
                    last = Some(round);
                }
                let set = st
                    .replica
                    .as_deref()
                    .map_or(String::new(), |name| format!(", set {name}"));
                (format!("{} (round {seen}{set})", st.step), Some(seen))
            }
        })
        .collect()
}

/// summary.md: the answer in words, then every step.
pub(crate) fn render_markdown(r: &CommitsRecord) -> String {
    let mut s = format!("# bisect commits {}\n\n", r.header.id);
    s += &format!("`{}`\n\n", r.header.command);
    s += &format!(
        "{}, {} sessions per block at {} in flight, build `{}`.\n\n",
        range_words(r),
        r.params.block,
        r.params.concurrency,
        r.build
    );
    for line in setup_lines(r) {
        s += &format!("{line}\n\n");
    }
    s += &format!(
        "**{}**: {}\n\n",
        r.answer.map_or("running", |a| a.name()),
        r.verdict.as_deref().unwrap_or("-")
    );
    if let Some(line) = answer_line(r) {
        s += &format!("{line}\n\n");
    }
    if !r.untestable.is_empty() {
        s += "Untestable:\n\n";
        for u in &r.untestable {
            s += &format!(
                "- `{}` {}: {}\n",
                short(&u.sha),
                u.subject,
                u.reason.as_deref().unwrap_or("")
            );
        }
        s.push('\n');
    }
    s += &format!(
        "{} steps, {} sessions, {} builds ({:.0} s), {:.0} s in all.\n\n",
        r.steps.len(),
        r.sessions_spent,
        r.builds_run,
        r.build_s,
        r.wall_s
    );
    if let Some(cost) = &r.cost {
        s += &format!("{}\n\n", cost.line());
    }
    s += "| step | commit | purpose | result | block |\n|---|---|---|---|---|\n";
    for (st, (label, _)) in r.steps.iter().zip(step_labels(r)) {
        s += &format!(
            "| {} | {} `{}` | {:?} | {} | {} |\n",
            label,
            st.commit,
            short(&st.sha),
            st.purpose,
            observation_words(&st.observation),
            match st.dirs() {
                dirs if dirs.is_empty() => "-".to_string(),
                dirs => dirs.join(", "),
            }
        );
    }
    if let Some(e) = &r.error {
        s += &format!("\nError: {e}\n");
    }
    s
}

pub(crate) fn observation_words(o: &Observation) -> String {
    match o {
        Observation::Block { corrupted, judged } => format!("{corrupted}/{judged} corrupted"),
        Observation::Pair { on, off } => format!(
            "on {}/{} corrupted, off {}/{}",
            on.corrupted, on.judged, off.corrupted, off.judged
        ),
        Observation::CouldNotTell { reason } => format!("could not tell: {reason}"),
        Observation::Untestable { reason } => format!("untestable: {reason}"),
    }
}

/// Appends steps to steps.jsonl, after its header.
pub(crate) struct StepLog {
    file: std::fs::File,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "line", rename_all = "snake_case")]
enum Line {
    Header(Box<Header>),
    Step(Box<StepEntry>),
}

impl StepLog {
    /// A new log with `header`, or, resuming, the log as it is (steps appended).
    pub fn open(path: &Path, header: &Header, resume: bool) -> anyhow::Result<Self> {
        let fresh = !resume || !path.exists();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(!fresh)
            .write(true)
            .truncate(fresh)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        if fresh {
            writeln!(
                file,
                "{}",
                serde_json::to_string(&Line::Header(Box::new(header.clone())))?
            )?;
        }
        Ok(StepLog { file })
    }

    pub fn append(&mut self, step: &StepEntry) -> anyhow::Result<()> {
        writeln!(
            self.file,
            "{}",
            serde_json::to_string(&Line::Step(Box::new(step.clone())))?
        )?;
        self.file.sync_data()?;
        Ok(())
    }
}

/// The header and steps of a log; a torn last line (a kill mid-write) is dropped.
pub(crate) fn read_log(path: &Path) -> anyhow::Result<(Header, Vec<StepEntry>)> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (--resume needs the search's folder)",
            path.display()
        )
    })?;
    let mut header = None;
    let mut steps = Vec::new();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Header(h)) => header = Some(*h),
            Ok(Line::Step(s)) => steps.push(*s),
            Err(_) if i + 1 == lines.len() => break,
            Err(e) => {
                return Err(crate::exit::Failure::bad_input(
                    format!(
                        "{}:{}: not a step of bisect commits: {e}",
                        path.display(),
                        i + 1
                    ),
                    "resume from the folder the search wrote, unedited",
                )
                .into())
            }
        }
    }
    let header = header.ok_or_else(|| {
        crate::exit::Failure::bad_input(
            format!("{}: no header line", path.display()),
            "resume from the folder the search wrote",
        )
    })?;
    Ok((header, steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pinned: &[&str], flag: Option<&str>) -> Header {
        let mut params = Params::new(9, 80, 80);
        params.flag = flag.map(str::to_string);
        Header {
            good: "a".into(),
            bad: "b".into(),
            build: "--build true".into(),
            commits: 9,
            params,
            pinned: pinned.iter().map(|p| p.to_string()).collect(),
            find: Find::Break,
        }
    }

    fn pair_step() -> StepEntry {
        let c = |corrupted| Counts {
            corrupted,
            judged: 80,
        };
        let arm = |arm: &str, value: &str, corrupted| ArmStep {
            arm: arm.into(),
            value: value.into(),
            observation: Observation::Block {
                corrupted,
                judged: 80,
            },
            dir: format!("blocks/b001-{arm}"),
            peak_engine: Some(80),
            wall_s: 4.0,
            engine_info: Default::default(),
        };
        StepEntry {
            step: 1,
            commit: 8,
            sha: "b".into(),
            purpose: Purpose::Ends,
            observation: Observation::Pair {
                on: c(14),
                off: c(1),
            },
            spent: Spent {
                build_s: Some(1.0),
                block_s: Some(8.0),
                sessions: 160,
            },
            dir: None,
            peak_engine: None,
            wall_s: Some(8.0),
            build: None,
            engine_info: Default::default(),
            arms: vec![arm("on", "1", 14), arm("off", "0", 1)],
            round: None,
            replica: None,
            engine: None,
        }
    }

    #[test]
    fn a_flag_search_with_pins_logs_and_replays_both_arms() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.jsonl");
        let h = header(&["HICACHE=off"], Some("BF16_INDEX_K"));
        let mut log = StepLog::open(&path, &h, false).unwrap();
        log.append(&pair_step()).unwrap();
        let (read, steps) = read_log(&path).unwrap();
        assert_eq!(read, h);
        assert_eq!(steps, [pair_step()]);
        assert_eq!(steps[0].dirs(), ["blocks/b001-on", "blocks/b001-off"]);
        assert_eq!(
            observation_words(&steps[0].observation),
            "on 14/80 corrupted, off 1/80"
        );
        // Another set of pins, or no flag, is another search.
        assert_ne!(read, header(&[], Some("BF16_INDEX_K")));
        assert_ne!(read, header(&["HICACHE=off"], None));
        // A fix search over the same ends is another search.
        let fix = Header {
            find: Find::Fix,
            ..h.clone()
        };
        assert_ne!(read, fix);
        let line = serde_json::to_string(&Line::Header(Box::new(fix.clone()))).unwrap();
        assert!(line.contains("\"find\":\"fix\""), "{line}");
    }

    #[test]
    fn a_log_from_before_flags_and_pins_reads_as_a_search_without_them() {
        let h = header(&[], None);
        let mut line = serde_json::to_value(Line::Header(Box::new(h.clone()))).unwrap();
        let params = line["params"].as_object_mut().unwrap();
        assert!(params.remove("flag").is_none(), "not written when absent");
        params.remove("background").unwrap();
        assert!(line.get("pinned").is_none());
        assert!(
            line.get("find").is_none(),
            "a break search's header keeps its shape"
        );
        match serde_json::from_value::<Line>(line).unwrap() {
            Line::Header(read) => assert_eq!(*read, h),
            Line::Step(_) => panic!("a header"),
        }
    }
}
