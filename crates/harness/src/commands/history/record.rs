//! The history record: everything `history.json` holds, what the dashboard, the JUnit
//! file and the summary render. Field names are a contract; extend, never rename.

use serde::{Deserialize, Serialize};

use crate::core::history::{Assessment, HistoryPolicy, RegressionEvent, State};

pub(crate) const SCHEMA: &str = "bisect.history/1";

/// The record's file in the history's directory.
pub const FILE: &str = "history.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub schema: String,
    /// The command line as typed.
    pub command: String,
    pub generated_at: String,
    /// The plan whose nights these are.
    pub plan: String,
    pub policy: HistoryPolicy,
    /// The e-BH family: the plan's rate cells.
    pub family: usize,
    /// Every night, oldest first, missing ones included.
    pub nights: Vec<NightEntry>,
    /// Every cell of the plan (the newest night's order, then cells only older nights had).
    pub cells: Vec<CellHistory>,
    /// Every regression found, in the order found.
    pub regressions: Vec<RegressionEntry>,
    /// Records under the directory that are not nights of this plan, and why (another
    /// plan, a shard, an unreadable file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl HistoryRecord {
    /// The cells that measure `kind`, in the record's order.
    pub fn cells_of(&self, kind: CellKind) -> Vec<&CellHistory> {
        self.cells.iter().filter(|c| c.kind == kind).collect()
    }
}

/// Whether a night has a record, and whether it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NightStatus {
    /// A finished whole matrix.
    Finished,
    /// A record that never finished (the night crashed, was cancelled, or still runs):
    /// its settled cells count, the rest are missing.
    Unfinished,
    /// No record at all: a date between the first and the last night that never ran.
    Absent,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NightEntry {
    /// The night's label (`--night`, else the UTC date it started).
    pub label: String,
    pub status: NightStatus,
    /// The matrix directory, relative to the history's directory (`None`: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// `--build` of the night.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// What the engines said they run (`core::effective::build_identity`, per role,
    /// distinct values joined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_build: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bisect_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_hash: Option<String>,
    /// Earlier records of the same night, replaced by this one (a rerun), by directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<String>,
}

impl NightEntry {
    /// The build to name: `--build`, else what the engines reported.
    pub fn build_words(&self) -> Option<&str> {
        self.build.as_deref().or(self.engine_build.as_deref())
    }
}

/// What a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellKind {
    /// A corruption rate at one load: evidence across nights.
    Rate,
    /// A load sweep: its threshold, judged night by night against the night before.
    Load,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellHistory {
    pub id: String,
    pub kind: CellKind,
    /// Not in the newest night's plan (removed, or its configuration renamed it): shown,
    /// never counted in the exit code.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
    /// One point per night, in the nights' order.
    pub series: Vec<CellPoint>,
}

impl CellHistory {
    /// The newest night's point.
    pub fn latest(&self) -> Option<&CellPoint> {
        self.series.last()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellPoint {
    /// Sessions run, judged, corrupted (0 when nothing was measured).
    pub sessions: u64,
    pub judged: u64,
    pub corrupted: u64,
    /// Rate of the judged sessions and its Wilson 95% interval (`None`: none judged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95: Option<[f64; 2]>,
    /// A load cell: its threshold in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<String>,
    /// The cell's directory relative to the history's (its report), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    pub assessment: Assessment,
}

impl CellPoint {
    pub fn state(&self) -> State {
        self.assessment.state
    }
}

/// A night and its build, named.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NightRef {
    /// Index into `nights`.
    pub night: usize,
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegressionEntry {
    pub cell: String,
    pub event: RegressionEvent,
    pub last_good: NightRef,
    pub first_bad: NightRef,
    pub flagged: NightRef,
    /// The `bisect commits` command that searches the builds between the two nights,
    /// when both name a build and the plan has `[commits]`; else why not.
    pub search: SearchPlan,
    /// The search's answer, once it ran (`--auto-bisect`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landed: Option<LandedSearch>,
}

/// Whether the builds between two nights can be searched, and how.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SearchPlan {
    /// The equivalent command line (what `--auto-bisect` runs in-process), its folder
    /// (relative to the history's) and the two builds it searches between.
    Prepared {
        command: String,
        dir: String,
        good: String,
        bad: String,
    },
    /// Why no search can be made (no build recorded, no `[commits]` in the plan, the same build).
    Unavailable { why: String },
}

/// A `bisect commits` search's answer, landed in the history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LandedSearch {
    /// The search's directory, relative to the history's.
    pub dir: String,
    /// commits.json's answer; `None` when the search stopped without one (an error).
    pub answer: Option<crate::commands::answer::SearchAnswer>,
    /// The answer in words, as `bisect commits` prints it.
    pub words: String,
    /// The culprit commit, when one was found and verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub culprit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}
