//! The matrix record: everything `matrix.json` holds. Field names are a contract
//! (read back by `bisect merge`, baselines and other tools); extend, never rename.
//!
//! Timing fields (`started_at`, `finished_at`, and per cell `wall_s`, `tokens_per_s`,
//! `health_wait_s`, `peak_running`) are measurements of one execution; everything else
//! about a finished cell is determined by the plan and the engine's behaviour, which is
//! what makes a merged matrix comparable with an unsharded one.

use std::collections::BTreeMap;

use anyhow::Context;

use serde::{Deserialize, Serialize};

use super::cells::{Cell, Shard};
use super::plan::{LoadSweep, Plan, RegressionPolicy};
use crate::core::arm_stats::{ArmStats, RecordStatus};
use crate::core::load::compare::{shown, threshold_words, LevelShown, Moved};
use crate::core::load::{Allocation, Answer, LoadReport};

pub(crate) const SCHEMA: &str = "bisect.matrix/1";

/// The record's file in a matrix's directory (the contract other tools read).
pub const FILE: &str = "matrix.json";

/// Read `DIR/matrix.json`.
pub fn read_matrix(dir: &std::path::Path) -> anyhow::Result<MatrixRecord> {
    let path = dir.join(FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Timestamps with milliseconds: baselines are "earlier matrices", and two nights (or a
/// test's two runs) can start within one second. Fixed width, so strings order by time.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatrixRecord {
    /// schema, id, command, times, status, target: the header every record opens with.
    #[serde(flatten)]
    pub header: crate::results::RecordHeader,
    pub plan: PlanInfo,
    /// The shard this directory holds; `None` for a whole matrix (unsharded or merged).
    pub shard: Option<Shard>,
    /// For a merged matrix: the shard directories it was joined from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<MergedShard>,
    pub workload: serde_json::Value,
    pub workload_hash: String,
    /// The cells this directory ran (a shard's subset), in plan order.
    pub cells: Vec<CellRecord>,
    pub baseline: Option<BaselineInfo>,
    /// Ids of regressed cells, in plan order.
    #[serde(default)]
    pub regressions: Vec<String>,
    /// `/server_info` per restart group and role, where the engine serves it.
    #[serde(default)]
    pub engine_info: BTreeMap<String, serde_json::Value>,
    /// What the matrix cost: restarts, driving, engine-hours, wall (core::cost; a merged
    /// matrix: its shards' together, each shard a replica set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::core::cost::Cost>,
    pub error: Option<String>,
    /// Which night of a history this is: its label, the build it ran, bisect's version
    /// (`bisect history` reads them; absent in records written before it).
    #[serde(default)]
    pub night: NightInfo,
}

/// What makes a matrix a night of a history (docs/history.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NightInfo {
    /// `--night LABEL` (the nightly's scheduled date, `2026-12-05`); absent: the history
    /// takes the UTC date the matrix started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `--build ID`: the engine build the night ran (a commit, a release), what an
    /// automatic `bisect commits` searches between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// The bisect that ran the night.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bisect_version: Option<String>,
}

impl NightInfo {
    /// This bisect's night, labelled and built as given.
    pub fn now(label: Option<String>, build: Option<String>) -> NightInfo {
        NightInfo {
            label,
            build,
            bisect_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanInfo {
    pub name: String,
    pub path: String,
    pub hash: String,
    pub repeats: u32,
    pub policy: RegressionPolicy,
    /// Flags pinned in every cell (`[set]`). Not part of a cell's configuration hash:
    /// a pinned flag is the deployment under test, like the engine build.
    pub set: BTreeMap<String, String>,
    /// Every cell id of the plan in plan order, whichever shard runs it: merge checks
    /// the shards against this list.
    pub cells: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MergedShard {
    pub dir: String,
    pub id: String,
    pub shard: Option<Shard>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellRecord {
    pub id: String,
    pub group: usize,
    pub flags: BTreeMap<String, String>,
    pub sessions: u32,
    pub rounds: u32,
    pub config_hash: String,
    pub workload_hash: String,
    pub status: RecordStatus,
    /// Per flag, per role: the value read back after writing.
    pub readback: BTreeMap<String, BTreeMap<String, String>>,
    /// Per flag (the cell's and the pinned ones), per role: the value the running engine
    /// reports after the group's restart, for the roles whose engine reports it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub effective: BTreeMap<String, BTreeMap<String, String>>,
    /// Why the cell is blocked (status `blocked`): an engine reports a value other than
    /// the cell's configuration. A blocked cell is not driven and never compared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<String>,
    /// What the cell could not check (a flag no engine reports), one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The cell's measurements, pooled over its repeats.
    #[serde(flatten)]
    pub stats: ArmStats,
    /// Sessions directory relative to the matrix directory (a load cell: its load.json,
    /// summary.md, report.html and blocks/).
    pub dir: String,
    pub comparison: Option<CellComparison>,
    /// A load cell (`kind = "load"`): its sweep and answer. Its `stats` stay empty (a
    /// rate pooled over levels would say nothing) but for `wall_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadCellRecord>,
}

/// Per-cell outcome of the baseline comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// Compared, no regression.
    Ok,
    Regressed,
    /// Configuration or workload changed (hash differs), or a side did not finish.
    NotComparable,
    /// The baseline has no cell with this id.
    New,
    /// The cell's engine did not run the cell's configuration: not compared.
    Blocked,
    /// Compared, no regression found, but the measurement cannot show the cell is ok:
    /// too few judged sessions (either night), replies truncated far more than the
    /// baseline's, or this night's load below the target or unmeasured (reasons in
    /// words). No pass: a whole matrix with one exits 3.
    Inconclusive,
}

impl CellStatus {
    pub fn name(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Regressed => "regressed",
            CellStatus::NotComparable => "not comparable",
            CellStatus::New => "new",
            CellStatus::Blocked => "blocked",
            CellStatus::Inconclusive => "inconclusive",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellComparison {
    pub status: CellStatus,
    pub(crate) baseline_sessions: u64,
    pub(crate) baseline_corrupted: u64,
    pub(crate) baseline_rate: f64,
    pub(crate) baseline_ci95: [f64; 2],
    pub(crate) rate_diff: f64,
    /// One-sided Fisher exact p (this night's rate greater than the baseline's).
    pub p_value: Option<f64>,
    /// Holm-adjusted across the comparable cells.
    pub p_adjusted: Option<f64>,
    pub baseline_tokens_per_s: f64,
    /// tokens/s of this night over the baseline's.
    pub tokens_per_s_ratio: Option<f64>,
    /// Why the cell regressed, is not comparable or is inconclusive, one sentence each.
    pub reasons: Vec<String>,
    /// A load cell: its threshold against the baseline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<ThresholdComparison>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BaselineInfo {
    pub dir: String,
    pub id: String,
    pub started_at: String,
    /// `explicit` (--baseline) or `newest` (found under the results root).
    pub chosen: String,
    pub test: String,
    pub(crate) correction: String,
    pub compared: usize,
    pub regressed: usize,
    pub not_comparable: usize,
    pub new: usize,
    /// Cells blocked by the effective-config check, not compared.
    #[serde(default)]
    pub blocked: usize,
    /// Compared cells whose measurement cannot show them ok ([`CellStatus::Inconclusive`]).
    #[serde(default)]
    pub inconclusive: usize,
    /// Baseline cells this matrix does not have.
    pub missing: Vec<String>,
}

impl CellRecord {
    /// A cell not run yet.
    pub fn pending(cell: &Cell, workload_hash: &str) -> CellRecord {
        CellRecord {
            id: cell.id.clone(),
            group: cell.group,
            flags: cell.flag_values(),
            sessions: cell.sessions,
            rounds: cell.rounds,
            config_hash: cell.config_hash.clone(),
            workload_hash: workload_hash.to_string(),
            status: RecordStatus::Pending,
            readback: BTreeMap::new(),
            effective: BTreeMap::new(),
            blocked: Vec::new(),
            warnings: Vec::new(),
            stats: ArmStats::default(),
            dir: format!("cells/{}", cell.id),
            comparison: None,
            load: cell.load.as_ref().map(LoadCellRecord::pending),
        }
    }

    /// Recompute the fields derived from counts (rate, interval), exactly as a run does:
    /// a merged cell then serialises to the same digits as the unsharded one, even
    /// though reading matrix.json back rounds floats in the last place.
    pub(crate) fn rederive(&mut self) {
        let tokens_per_s = self.stats.tokens_per_s;
        self.stats.finish();
        // tokens/s is a measurement, not derived from counts: keep it as recorded.
        self.stats.tokens_per_s = tokens_per_s;
    }

    pub fn is_finished(&self) -> bool {
        self.status == RecordStatus::Finished
    }

    pub fn is_blocked(&self) -> bool {
        self.status == RecordStatus::Blocked
    }

    /// Finished or blocked: the cell's outcome is settled (a rerun of the same engines
    /// would settle it the same way), so merge takes it from its shard.
    pub(crate) fn is_settled(&self) -> bool {
        self.is_finished() || self.is_blocked()
    }

    /// The comparison status, `None` when no baseline was compared.
    pub fn verdict(&self) -> Option<CellStatus> {
        self.comparison.as_ref().map(|c| c.status)
    }
}

impl PlanInfo {
    pub fn of(plan: &Plan) -> PlanInfo {
        PlanInfo {
            name: plan.name.clone(),
            // Absolute: `bisect history` loads it again, from wherever it is run.
            path: std::path::absolute(&plan.source)
                .unwrap_or_else(|_| plan.source.clone())
                .display()
                .to_string(),
            hash: plan.hash(),
            repeats: plan.repeats,
            policy: plan.policy,
            set: plan
                .pins
                .iter()
                .map(|p| (p.flag.name.clone(), p.value.clone()))
                .collect(),
            cells: plan.cells.iter().map(|c| c.id.clone()).collect(),
        }
    }
}

impl MatrixRecord {
    /// Whole (not a shard) and finished: what a later night may use as its baseline.
    pub fn is_complete(&self) -> bool {
        self.shard.is_none()
            && self.header.status == RecordStatus::Finished
            && self.cells.len() == self.plan.cells.len()
    }
}

/// What `matrix.json` keeps of a load cell; the whole sweep is the cell's load.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadCellRecord {
    /// Sessions in flight, ascending.
    pub levels: Vec<u32>,
    /// Each level an A/B of this flag; `None`: every level against the lowest.
    pub flag: Option<String>,
    pub allocation: Allocation,
    /// The sweep's answer; `None` until a block finished.
    pub answer: Option<Answer>,
    /// The answer as the tables show it: the level, "rises at lowest (L)", "none shown".
    pub threshold: String,
    /// What each level showed: what the next night's comparison reads.
    #[serde(default)]
    pub shown: Vec<LevelShown>,
    /// The sweep's verdict in words.
    pub verdict: String,
    pub sessions_spent: u64,
}

impl LoadCellRecord {
    /// A load cell not run yet.
    pub(super) fn pending(sweep: &LoadSweep) -> LoadCellRecord {
        LoadCellRecord::of(sweep, None)
    }

    pub(super) fn of(sweep: &LoadSweep, report: Option<&LoadReport>) -> LoadCellRecord {
        LoadCellRecord {
            levels: sweep.levels.clone(),
            flag: sweep.flag.as_ref().map(|f| f.name.clone()),
            allocation: sweep.allocation,
            answer: report.map(|r| r.answer.clone()),
            threshold: threshold_words(report.map(|r| &r.answer)),
            shown: report.map(shown).unwrap_or_default(),
            verdict: report.map_or_else(String::new, |r| r.verdict.clone()),
            sessions_spent: report.map_or(0, |r| r.sessions_spent),
        }
    }

    /// `levels 1+16+64, 80 per level` (`A/B of FLAG at ...`, `... up to 480 per level`).
    pub(crate) fn sweep_words(&self) -> String {
        let levels: Vec<String> = self.levels.iter().map(u32::to_string).collect();
        let allocation = match self.allocation {
            Allocation::Fixed { sessions } => format!("{sessions} per level"),
            Allocation::Adaptive { max_sessions } => {
                format!("adaptive, up to {max_sessions} per level")
            }
        };
        match &self.flag {
            Some(f) => format!("A/B of {f} at {}, {allocation}", levels.join("+")),
            None => format!("levels {}, {allocation}", levels.join("+")),
        }
    }
}

/// A load cell's threshold against the baseline night's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThresholdComparison {
    /// The baseline night's threshold in words.
    pub baseline: String,
    /// Which way it moved; `None` when either night's sweep gave no answer.
    pub moved: Option<Moved>,
    /// The move is backed by the tests: a lower threshold on a level the baseline
    /// showed flat.
    pub shown: bool,
}
