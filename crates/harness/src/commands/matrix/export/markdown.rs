//! `summary.md`: the night as people paste it into a PR or a channel: one table row per
//! cell (a load cell's threshold where the counts go, its move where the change goes),
//! regressed cells in bold and listed with their reasons, cells that cannot be compared
//! listed apart (they are never regressions), load sweeps with their verdicts.

use std::collections::BTreeSet;

use crate::commands::matrix::baseline::load as load_cell;
use crate::commands::matrix::record::{CellRecord, CellStatus, MatrixRecord};
use crate::core::format;
use crate::core::session::SessionClass;
use crate::results::cells::{compact, peaks};
use crate::results::markdown::target_words;
use crate::results::markup::table_header;
use crate::results::Exporter;

pub struct MatrixSummary;

impl Exporter<MatrixRecord> for MatrixSummary {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }

    fn render(&self, r: &MatrixRecord) -> anyhow::Result<String> {
        let mut s = String::new();
        header(&mut s, r);
        cell_table(&mut s, r);
        listed_cells(&mut s, r);
        Ok(s)
    }
}

/// Title, the plan, target, workload, baseline and the regressions line.
fn header(s: &mut String, r: &MatrixRecord) {
    s.push_str(&format!(
        "# bisect matrix `{}`: {}\n\n",
        r.plan.name, r.header.id
    ));
    let groups: BTreeSet<usize> = r.cells.iter().map(|c| c.group).collect();
    s.push_str(&format!(
        "- plan: `{}` (hash `{}`): {} cells here in {} restart groups, repeats {}\n",
        r.plan.path,
        r.plan.hash,
        r.cells.len(),
        groups.len(),
        r.plan.repeats
    ));
    if let Some(shard) = &r.shard {
        s.push_str(&format!(
            "- shard {shard} of a {}-cell plan: a partial matrix; join the shards with `bisect merge`\n",
            r.plan.cells.len()
        ));
    }
    if !r.merged_from.is_empty() {
        s.push_str(&format!("- merged from {} shards\n", r.merged_from.len()));
    }
    s.push_str(&format!("- target: {}\n", target_words(&r.header.target)));
    let workload: Vec<String> = r
        .workload
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| *k != "sessions" && *k != "rounds")
                .map(|(k, v)| format!("{k}={}", compact(v)))
                .collect()
        })
        .unwrap_or_default();
    s.push_str(&format!(
        "- workload: `{}` (hash `{}`)\n",
        workload.join(" "),
        r.workload_hash
    ));
    if !r.plan.set.is_empty() {
        let sets: Vec<String> = r.plan.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!("- pinned in every cell: {}\n", sets.join(", ")));
    }
    s.push_str(&format!("- status: {}\n", r.header.status));
    if let Some(cost) = &r.cost {
        s.push_str(&format!("- {}\n", cost.line()));
    }
    match &r.baseline {
        Some(b) => s.push_str(&format!(
            "- baseline: `{}` ({}, started {}): {} compared ({}, {}-corrected, alpha {}, min effect {}, tokens/s noise {}){}, {} not comparable, {} new, {} missing here\n",
            b.id,
            b.chosen,
            b.started_at,
            b.compared,
            b.test,
            b.correction,
            r.plan.policy.alpha,
            format::percent(r.plan.policy.min_effect),
            format::percent(r.plan.policy.tokens_per_s_noise),
            inconclusive_words(b.inconclusive),
            b.not_comparable,
            b.new,
            b.missing.len()
        )),
        None if r.shard.is_some() => {
            s.push_str("- baseline: compared when the shards are merged\n")
        }
        None => s.push_str("- baseline: none (no earlier matrix of this plan)\n"),
    }
    if let Some(e) = &r.error {
        s.push_str(&format!("- error: {e}\n"));
    }
    s.push('\n');
    if let Some(b) = &r.baseline {
        if r.regressions.is_empty() && b.inconclusive > 0 {
            s.push_str(&format!(
                "**No regressions found, but {} cell{} inconclusive** (listed below): not a pass.\n\n",
                b.inconclusive,
                if b.inconclusive == 1 { "" } else { "s" }
            ));
        } else if r.regressions.is_empty() {
            s.push_str("**No regressions.**\n\n");
        } else {
            s.push_str(&format!(
                "**Regressions in {} cell{}: {}**\n\n",
                r.regressions.len(),
                if r.regressions.len() == 1 { "" } else { "s" },
                r.regressions
                    .iter()
                    .map(|id| format!("`{id}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
}

/// One row per cell, flag values in columns.
fn cell_table(s: &mut String, r: &MatrixRecord) {
    let flags: BTreeSet<&str> = r
        .cells
        .iter()
        .flat_map(|c| c.flags.keys().map(String::as_str))
        .collect();
    let mut header: Vec<String> = vec!["cell".into()];
    header.extend(flags.iter().map(|f| f.to_string()));
    header.extend(
        [
            "sessions",
            "rounds",
            "corrupted",
            "rate [95% CI]",
            "error/timeout",
            "peak running",
            "tok/s",
            "wall",
            "baseline",
            "change",
        ]
        .map(String::from),
    );
    s.push_str(&table_header(&header));
    for c in &r.cells {
        let regressed = c.verdict() == Some(CellStatus::Regressed);
        let mut row = vec![if regressed {
            format!("**`{}` REGRESSED**", c.id)
        } else {
            format!("`{}`", c.id)
        }];
        row.extend(
            flags
                .iter()
                .map(|f| c.flags.get(*f).cloned().unwrap_or_default()),
        );
        if let Some(load) = &c.load {
            // A load sweep: its threshold where the counts go, the move where the change goes.
            row.extend([
                load.sessions_spent.to_string(),
                c.rounds.to_string(),
                format!("threshold {}", load.threshold),
                load.sweep_words(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("{:.1}s", c.stats.wall_s),
                load_cell::baseline_words(c),
                load_cell::change_words(c),
            ]);
            s.push_str(&format!("| {} |\n", row.join(" | ")));
            continue;
        }
        row.extend([
            c.sessions.to_string(),
            c.rounds.to_string(),
            if c.is_finished() {
                format!("{}/{}", c.stats.corrupted, c.stats.judged())
            } else {
                c.status.to_string()
            },
            format::percent_interval(c.stats.corruption_rate, c.stats.ci95),
            format!(
                "{}/{}",
                c.stats.counts[SessionClass::Error],
                c.stats.counts[SessionClass::Timeout]
            ),
            peaks(&c.stats.peak_running),
            format!("{:.0}", c.stats.tokens_per_s),
            format!("{:.1}s", c.stats.wall_s),
            baseline_cell(c),
            change_cell(c),
        ]);
        s.push_str(&format!("| {} |\n", row.join(" | ")));
    }
}

/// The regressed, inconclusive and not-comparable cells with their reasons, and
/// baseline cells this matrix lacks.
fn listed_cells(s: &mut String, r: &MatrixRecord) {
    let listed = |status: CellStatus| -> Vec<&CellRecord> {
        r.cells
            .iter()
            .filter(|c| c.verdict() == Some(status))
            .collect()
    };
    for (status, title) in [
        (CellStatus::Regressed, "Regressed cells"),
        (
            CellStatus::Inconclusive,
            "Inconclusive (no regression found, but not shown ok)",
        ),
        (
            CellStatus::NotComparable,
            "Not comparable (never regressions)",
        ),
    ] {
        let cells = listed(status);
        if cells.is_empty() {
            continue;
        }
        s.push_str(&format!("\n## {title}\n\n"));
        for c in cells {
            let reasons = c
                .comparison
                .as_ref()
                .map(|x| x.reasons.join("; "))
                .unwrap_or_default();
            s.push_str(&format!("- `{}`: {reasons}\n", c.id));
        }
    }
    let sweeps: Vec<&CellRecord> = r.cells.iter().filter(|c| c.load.is_some()).collect();
    if !sweeps.is_empty() {
        s.push_str("\n## Load sweeps\n\n");
        for c in sweeps {
            let load = c.load.as_ref().expect("filtered");
            let verdict = if load.verdict.is_empty() {
                c.status.to_string()
            } else {
                load.verdict.clone()
            };
            s.push_str(&format!(
                "- `{}` ({}): threshold {}; {verdict} ({}/summary.md)\n",
                c.id,
                load.sweep_words(),
                load.threshold,
                c.dir
            ));
        }
    }
    // Blocked cells are listed with or without a baseline: they were never measured.
    let blocked: Vec<&CellRecord> = r.cells.iter().filter(|c| c.is_blocked()).collect();
    if !blocked.is_empty() {
        s.push_str("\n## Blocked cells (not driven, never compared)\n\n");
        for c in blocked {
            s.push_str(&format!("- `{}`: {}\n", c.id, c.blocked.join("; ")));
        }
    }
    let mut warnings: Vec<&String> = r.cells.iter().flat_map(|c| &c.warnings).collect();
    warnings.sort();
    warnings.dedup();
    if !warnings.is_empty() {
        s.push_str("\n## Warnings\n\n");
        for w in warnings {
            s.push_str(&format!("- {w}\n"));
        }
    }
    if let Some(b) = &r.baseline {
        if !b.missing.is_empty() {
            s.push_str("\n## Baseline cells missing from this matrix\n\n");
            for id in &b.missing {
                s.push_str(&format!("- `{id}`\n"));
            }
        }
    }
}

/// `, N of them inconclusive` when there are any (a night without them reads as before).
pub(super) fn inconclusive_words(n: usize) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {n} of them inconclusive")
    }
}

fn baseline_cell(c: &CellRecord) -> String {
    match &c.comparison {
        None => String::new(),
        Some(x) if x.status == CellStatus::New => "new".into(),
        Some(x) => format!(
            "{}/{} = {}",
            x.baseline_corrupted,
            x.baseline_sessions,
            format::percent(x.baseline_rate)
        ),
    }
}

fn change_cell(c: &CellRecord) -> String {
    match &c.comparison {
        None => String::new(),
        Some(x) => match x.status {
            CellStatus::New => "-".into(),
            CellStatus::NotComparable => "not comparable".into(),
            CellStatus::Blocked => "blocked".into(),
            CellStatus::Inconclusive => "inconclusive".into(),
            CellStatus::Ok | CellStatus::Regressed => {
                let mut parts = vec![format::signed_percent(x.rate_diff)];
                if let Some(p) = x.p_adjusted {
                    parts.push(format!("p_holm {}", format::p_value(p)));
                }
                if let Some(ratio) = x.tokens_per_s_ratio {
                    parts.push(format!("tok/s {}", format::signed_percent(ratio - 1.0)));
                }
                let text = parts.join(", ");
                if x.status == CellStatus::Regressed {
                    format!("**{text}**")
                } else {
                    text
                }
            }
        },
    }
}
