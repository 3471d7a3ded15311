//! What `bisect culprit` writes and prints: `culprit.json` (the record below; field names
//! are a contract, extend, never rename), `summary.md`, and the terminal table sorted by
//! Holm-adjusted p.

use std::path::Path;

use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};
use serde::{Deserialize, Serialize};

use crate::core::arm_stats::{ArmLabel, ArmStats, RecordStatus};
use crate::core::format;
use crate::core::verdict::Status;
use crate::results::run_record::TargetInfo;
use crate::results::write_atomic;

pub const SCHEMA: &str = "bisect.culprit/1";

/// `culprit.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CulpritRecord {
    pub schema: String,
    pub id: String,
    pub command: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: RecordStatus,
    pub target: TargetInfo,
    /// The base workload; look j of a flag runs it with seed + j - 1 and its own size.
    pub workload: serde_json::Value,
    /// Sessions (both arms, all flags) the search may spend, and has spent.
    pub budget: u64,
    pub sessions_spent: u64,
    pub screening_sessions_per_arm: u64,
    /// L: screening plus the extra looks the budget allows; alpha is split across them.
    pub max_looks: u32,
    pub alpha: f64,
    pub alpha_per_look: f64,
    pub min_effect: f64,
    /// In the order given on the command line.
    pub flags: Vec<FlagResult>,
    /// The implicated flags.
    pub culprits: Vec<Culprit>,
    /// Every A/B pair run, in execution order.
    pub looks: Vec<Look>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlagResult {
    pub name: String,
    pub on: String,
    pub off: String,
    /// `on` and `off`, pooled over this flag's looks.
    pub arms: Vec<PooledArm>,
    pub looks: u32,
    /// Both arms, all looks.
    pub sessions: u64,
    /// Fisher exact two-sided on the pooled counts.
    pub p_value: f64,
    /// Holm-adjusted across all flags; compared with `alpha_per_look`.
    pub p_adjusted: f64,
    pub rate_diff: f64,
    pub diff_ci95: [f64; 2],
    pub status: Status,
    pub direction: Option<String>,
    pub degraded: bool,
    pub reasons: Vec<String>,
    /// Run directories of this flag's looks, relative to the culprit directory.
    pub runs: Vec<String>,
}

/// One arm of a flag, pooled over that flag's looks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PooledArm {
    pub label: ArmLabel,
    pub value: String,
    pub sessions: u64,
    #[serde(flatten)]
    pub stats: ArmStats,
}

impl PooledArm {
    pub fn new(label: ArmLabel, value: &str, stats: ArmStats) -> PooledArm {
        PooledArm {
            label,
            value: value.to_string(),
            sessions: stats.sessions(),
            stats,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Culprit {
    pub flag: String,
    pub direction: String,
}

/// One A/B pair: a normal `bisect run` directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Look {
    pub flag: String,
    /// 1 = screening.
    pub look: u32,
    pub sessions_per_arm: u64,
    pub seed: u64,
    pub run_dir: String,
    /// The verdict of this pair alone (`bisect run`'s rule, uncorrected).
    pub run_status: Option<Status>,
}

impl CulpritRecord {
    /// Rewrite culprit.json and summary.md atomically.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        write_atomic(
            &dir.join("culprit.json"),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )?;
        write_atomic(&dir.join("summary.md"), render_markdown(self).as_bytes())
    }

    /// Flags by Holm-adjusted p, smallest first (NaN last), ties in the order given.
    fn ranked(&self) -> Vec<&FlagResult> {
        let mut flags: Vec<&FlagResult> = self.flags.iter().collect();
        flags.sort_by(|a, b| a.p_adjusted.total_cmp(&b.p_adjusted));
        flags
    }
}

const HEADER: [&str; 8] = [
    "flag",
    "status",
    "on: corrupted",
    "off: corrupted",
    "on - off [95%]",
    "p",
    "p Holm",
    "looks / sessions",
];

fn arm_cell(arm: Option<&PooledArm>) -> String {
    arm.map_or_else(
        || "-".to_string(),
        |a| {
            let failed = a.stats.counts.failed();
            let mut s = format!(
                "{}/{} = {} (={})",
                a.stats.corrupted,
                a.sessions,
                format::percent(a.stats.corruption_rate),
                a.value
            );
            if failed > 0 {
                s.push_str(&format!(", {failed} err/timeout"));
            }
            s
        },
    )
}

fn row(f: &FlagResult) -> [String; 8] {
    let arm = |label: ArmLabel| f.arms.iter().find(|a| a.label == label);
    [
        f.name.clone(),
        f.status.as_str().to_string() + if f.degraded { " (degraded)" } else { "" },
        arm_cell(arm(ArmLabel::On)),
        arm_cell(arm(ArmLabel::Off)),
        format!(
            "{} [{}, {}]",
            format::signed_percent(f.rate_diff),
            format::signed_percent(f.diff_ci95[0]),
            format::signed_percent(f.diff_ci95[1])
        ),
        format::p_value(f.p_value),
        format::p_value(f.p_adjusted),
        format!("{} / {}", f.looks, f.sessions),
    ]
}

fn headline(r: &CulpritRecord) -> String {
    let culprits = if r.culprits.is_empty() {
        "none implicated".to_string()
    } else {
        r.culprits
            .iter()
            .map(|c| format!("{}: {}", c.flag, c.direction))
            .collect::<Vec<_>>()
            .join("; ")
    };
    format!(
        "bisect culprit over {} flags: {} of {} sessions spent, alpha {} split over {} looks ({} each)\nculprit: {culprits}\n",
        r.flags.len(),
        r.sessions_spent,
        r.budget,
        r.alpha,
        r.max_looks,
        format::p_value(r.alpha_per_look)
    )
}

/// The terminal table, sorted by Holm-adjusted p, with every flag's reasons under it.
pub fn render_table(r: &CulpritRecord) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(HEADER.iter().map(Cell::new));
    for f in r.ranked() {
        table.add_row(row(f).into_iter().enumerate().map(|(i, s)| {
            let cell = Cell::new(s);
            if i >= 5 {
                cell.set_alignment(CellAlignment::Right)
            } else {
                cell
            }
        }));
    }
    let mut out = headline(r);
    out.push_str(&format!("{table}\n"));
    out.push_str(&reasons(r, "  "));
    if let Some(e) = &r.error {
        out.push_str(&format!("stopped ({}): {e}\n", r.status));
    }
    out
}

fn reasons(r: &CulpritRecord, indent: &str) -> String {
    let mut out = String::new();
    for f in r.ranked() {
        out.push_str(&format!("{}: {}\n", f.name, f.status.as_str()));
        for reason in &f.reasons {
            out.push_str(&format!("{indent}- {reason}\n"));
        }
    }
    out
}

/// `summary.md`.
pub fn render_markdown(r: &CulpritRecord) -> String {
    let mut out = format!("# bisect culprit {}\n\n", r.id);
    out.push_str(&format!("Status: {}\n\n", r.status));
    out.push_str(&headline(r).replace('\n', "\n\n"));
    out.push_str(&format!("| {} |\n", HEADER.join(" | ")));
    out.push_str(&format!("|{}\n", "---|".repeat(HEADER.len())));
    for f in r.ranked() {
        out.push_str(&format!("| {} |\n", row(f).join(" | ")));
    }
    out.push_str("\n## Reasons\n\n");
    out.push_str(&reasons(r, "  "));
    out.push_str("\n## Runs\n\n");
    for l in &r.looks {
        out.push_str(&format!(
            "- {} look {}: {} sessions per arm, seed {}, `{}` ({})\n",
            l.flag,
            l.look,
            l.sessions_per_arm,
            l.seed,
            l.run_dir,
            l.run_status.map_or("no verdict", |s| s.as_str())
        ));
    }
    if let Some(e) = &r.error {
        out.push_str(&format!("\nStopped ({}): {e}\n", r.status));
    }
    out
}
