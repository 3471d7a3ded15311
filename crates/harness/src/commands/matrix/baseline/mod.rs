//! Baselines and the per-cell regression rule of the nightly matrix.
//!
//! The baseline is `--baseline DIR`, or else the newest earlier complete matrix of the
//! same plan name under the results root. Cells are matched by id. A cell is comparable
//! only when both sides finished and its configuration hash (flag settings and values,
//! sessions, rounds) and workload hash agree; otherwise it is "not comparable", never a
//! regression. A blocked cell (its engine reported another configuration than the
//! cell's) is "blocked": never compared. A comparable cell regresses when any of these holds:
//!
//! - corruption significantly higher: Fisher's exact test, **one-sided** (H1: this
//!   night's corruption rate is greater than the baseline's; a drop is an improvement,
//!   not a regression), p-values Holm-adjusted across the comparable cells (Holm 1979,
//!   Scand. J. Statist. 6:65-70, via [`crate::core::stats::holm`]); regressed when the
//!   adjusted p < alpha **and** the rate rose by at least min_effect (absolute), so a
//!   huge night cannot flag a negligible rise;
//! - tokens/s lower beyond noise: below (1 - tokens_per_s_noise) x the baseline's
//!   (relative drop; default 25%, the confound threshold of docs/design.md 3.7);
//! - newly degraded: more than degraded_fraction (10%) error+timeout sessions where
//!   the baseline had at most that (a toggle that made the engine time out).
//!
//! A comparable cell that does not regress is "ok" only when its measurement can show
//! it; otherwise it is **inconclusive**, with the reasons ([`unconfirmed_reasons`]),
//! and a whole matrix with one is no pass (exit 3):
//!
//! - either night judged fewer than half its sessions (`Counts::judged`: not failed, not
//!   truncated at max_tokens): a rate over the few judged, or over none (Fisher p = 1
//!   on an empty row), says nothing about the cell;
//! - replies truncated at max_tokens rose by at least min_effect, one-sided Fisher
//!   p < 0.05 (the screening level at which `bisect run` warns about truncation): a
//!   truncated session cannot show corruption, so a wordier model looks cleaner;
//! - this night's load short of the target, by `bisect run`'s rule for `cleared`
//!   (`core::confounds::load_shortfall`: the busiest engine role's peak running
//!   requests at least 90% of the cell's target concurrency, and measured at all; roles
//!   whose metrics failed are named). A build that caps the engine's running requests
//!   cannot show a load-dependent bug. Not for a target of one session in flight, which
//!   has no lower load, and whose requests the sampling poller mostly misses.
//!
//! A regression found despite these stands (corruption seen at a lower load is still
//! corruption; a throughput drop is one), so they only decide between "ok" and
//! "inconclusive".
//!
//! The one-sided p is the upper hypergeometric tail P(X >= a) with margins fixed
//! (Fisher 1935; Agresti, "Categorical Data Analysis", 3rd ed., sec. 3.5.1).

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::plan::RegressionPolicy;
use super::record::{BaselineInfo, CellComparison, CellRecord, CellStatus, MatrixRecord};
use crate::core::arm_stats::ArmStats;
use crate::core::confounds::engine_load_shortfall;
use crate::core::evidence::Policy;
use crate::core::format;
use crate::core::session::SessionClass;
pub(crate) use crate::core::stats::fisher_one_sided_greater;

pub(crate) const TEST_NAME: &str = "fisher_exact_one_sided_greater";
pub(crate) const CORRECTION: &str = "holm";

/// Significance below which a rise in truncated replies makes a cell inconclusive: a
/// screening level (as `bisect run`'s truncation warning), not the regression alpha,
/// because it can only withhold "ok", never report a regression.
const TRUNCATED_ALPHA: f64 = 0.05;

/// A baseline matrix and where it came from.
pub struct Baseline {
    pub dir: PathBuf,
    pub record: MatrixRecord,
    /// `explicit` or `newest`.
    pub chosen: &'static str,
}

/// Read `DIR/matrix.json` as a baseline; it must be a whole matrix of the same plan name.
pub fn load_explicit(dir: &Path, plan_name: &str) -> anyhow::Result<Baseline> {
    let record = super::record::read_matrix(dir)?;
    if record.plan.name != plan_name {
        return Err(crate::exit::Failure::bad_input(
            format!(
                "{}: baseline is a matrix of plan {:?}, this is plan {plan_name:?}",
                dir.display(),
                record.plan.name
            ),
            "pass a baseline of the same plan",
        )
        .into());
    }
    if record.shard.is_some() {
        return Err(crate::exit::Failure::bad_input(
            format!(
                "{}: baseline is one shard, not a whole matrix",
                dir.display()
            ),
            "merge the night's shards (`bisect merge`) and pass the merged directory",
        )
        .into());
    }
    Ok(Baseline {
        dir: dir.to_path_buf(),
        record,
        chosen: "explicit",
    })
}

/// The newest complete matrix of `plan_name` under `root` that started before
/// `started_at` (RFC 3339 UTC strings order by time), other than `exclude`.
pub fn find_newest(
    root: &Path,
    plan_name: &str,
    started_at: &str,
    exclude: &Path,
) -> anyhow::Result<Option<Baseline>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("listing {}", root.display())),
    };
    let exclude = exclude.canonicalize().unwrap_or(exclude.to_path_buf());
    let mut best: Option<Baseline> = None;
    for entry in entries {
        let dir = entry
            .with_context(|| format!("listing {}", root.display()))?
            .path();
        if !dir.join("matrix.json").is_file()
            || dir.canonicalize().unwrap_or(dir.clone()) == exclude
        {
            continue;
        }
        // A directory another tool left half-written is not a baseline; skip it.
        let Ok(record) = super::record::read_matrix(&dir) else {
            continue;
        };
        if record.plan.name != plan_name
            || !record.is_complete()
            || record.header.started_at.as_str() >= started_at
        {
            continue;
        }
        let newer = match &best {
            None => true,
            Some(b) => {
                (record.header.started_at.as_str(), record.header.id.as_str())
                    > (
                        b.record.header.started_at.as_str(),
                        b.record.header.id.as_str(),
                    )
            }
        };
        if newer {
            best = Some(Baseline {
                dir,
                record,
                chosen: "newest",
            });
        }
    }
    Ok(best)
}

/// Compare every cell of `night` with `baseline`, fill each cell's comparison, the
/// record's baseline summary and its list of regressions.
pub fn compare(night: &mut MatrixRecord, baseline: &Baseline, policy: &RegressionPolicy) {
    let base = &baseline.record;
    let mut comparable: Vec<(usize, f64)> = Vec::new();
    for (i, cell) in night.cells.iter_mut().enumerate() {
        if let Some(p) = compare_cell(cell, base, policy.alpha) {
            comparable.push((i, p));
        }
    }
    judge_comparable(night, base, &comparable, policy);

    let count = |s: CellStatus| {
        night
            .cells
            .iter()
            .filter(|c| c.verdict() == Some(s))
            .count()
    };
    night.regressions = night
        .cells
        .iter()
        .filter(|c| c.verdict() == Some(CellStatus::Regressed))
        .map(|c| c.id.clone())
        .collect();
    night.baseline = Some(BaselineInfo {
        dir: baseline.dir.display().to_string(),
        id: base.header.id.clone(),
        started_at: base.header.started_at.clone(),
        chosen: baseline.chosen.to_string(),
        test: TEST_NAME.into(),
        correction: CORRECTION.into(),
        // The Fisher family and the load cells whose thresholds were compared.
        compared: comparable.len()
            + night
                .cells
                .iter()
                .filter(|c| {
                    c.load.is_some() && c.comparison.as_ref().is_some_and(|x| x.threshold.is_some())
                })
                .count(),
        regressed: count(CellStatus::Regressed),
        not_comparable: count(CellStatus::NotComparable),
        new: count(CellStatus::New),
        blocked: count(CellStatus::Blocked),
        inconclusive: count(CellStatus::Inconclusive),
        missing: base
            .cells
            .iter()
            .filter(|b| !night.plan.cells.contains(&b.id))
            .map(|b| b.id.clone())
            .collect(),
    });
}

/// Fills `cell`'s comparison with its baseline cell as far as one cell can say (blocked,
/// new, not comparable, or the one-sided Fisher p of its rate against the baseline's);
/// the raw p where the two are comparable.
fn compare_cell(cell: &mut CellRecord, base: &MatrixRecord, alpha: f64) -> Option<f64> {
    // A cell whose engine ran another configuration says nothing about this one.
    if cell.is_blocked() {
        let old = base.cells.iter().find(|c| c.id == cell.id);
        cell.comparison = Some(empty(CellStatus::Blocked, old, cell.blocked.clone()));
        return None;
    }
    let Some(old) = base.cells.iter().find(|c| c.id == cell.id) else {
        cell.comparison = Some(empty(
            CellStatus::New,
            None,
            vec![format!("the baseline has no cell {}", cell.id)],
        ));
        return None;
    };
    let reasons = not_comparable_reasons(cell, old);
    if !reasons.is_empty() {
        cell.comparison = Some(empty(CellStatus::NotComparable, Some(old), reasons));
        return None;
    }
    // A load cell's tests are its sweep's own: its threshold is compared, outside the
    // Fisher family of the other cells.
    if cell.load.is_some() {
        cell.comparison = Some(load::compare(cell, old, alpha));
        return None;
    }
    // Judged sessions only (`Counts::judged`), as every rate.
    let p = fisher_one_sided_greater(
        cell.stats.corrupted,
        cell.stats.judged().saturating_sub(cell.stats.corrupted),
        old.stats.corrupted,
        old.stats.judged().saturating_sub(old.stats.corrupted),
    );
    let mut cmp = empty(CellStatus::Ok, Some(old), Vec::new());
    cmp.p_value = Some(p);
    cmp.rate_diff = cell.stats.corruption_rate - old.stats.corruption_rate;
    cmp.tokens_per_s_ratio =
        (old.stats.tokens_per_s > 0.0).then(|| cell.stats.tokens_per_s / old.stats.tokens_per_s);
    cell.comparison = Some(cmp);
    Some(p)
}

/// Why `cell` cannot be compared with its baseline cell `old`: either did not finish,
/// the baseline cell was blocked, or the configuration or workload changed.
fn not_comparable_reasons(cell: &CellRecord, old: &CellRecord) -> Vec<String> {
    let mut reasons = Vec::new();
    if !cell.is_finished() {
        reasons.push(format!("this cell did not finish ({})", cell.status));
    }
    if old.is_blocked() {
        reasons.push(format!(
            "the baseline cell was blocked: {}",
            old.blocked.join("; ")
        ));
    } else if !old.is_finished() {
        reasons.push(format!("the baseline cell did not finish ({})", old.status));
    }
    if cell.config_hash != old.config_hash {
        reasons.push(format!(
            "configuration changed (flag settings, sessions or rounds; hash {} -> {})",
            old.config_hash, cell.config_hash
        ));
    }
    if cell.workload_hash != old.workload_hash {
        reasons.push(format!(
            "workload changed (hash {} -> {})",
            old.workload_hash, cell.workload_hash
        ));
    }
    reasons
}

/// The comparable cells' p values Holm-adjusted together, then each cell `regressed`
/// (by the policy's regression reasons) or `inconclusive` (a clean result the load or
/// sessions cannot back).
fn judge_comparable(
    night: &mut MatrixRecord,
    base: &MatrixRecord,
    comparable: &[(usize, f64)],
    policy: &RegressionPolicy,
) {
    let adjusted =
        crate::core::stats::holm(&comparable.iter().map(|(_, p)| *p).collect::<Vec<_>>());
    for ((i, _), p_adj) in comparable.iter().zip(adjusted) {
        let cell = &mut night.cells[*i];
        let old = base
            .cells
            .iter()
            .find(|c| c.id == cell.id)
            .expect("comparable cells have a baseline cell");
        let reasons = regression_reasons(cell, old, p_adj, policy);
        let unconfirmed = if reasons.is_empty() {
            unconfirmed_reasons(cell, old, &night.workload, policy)
        } else {
            Vec::new()
        };
        let cmp = cell.comparison.as_mut().expect("filled above");
        cmp.p_adjusted = Some(p_adj);
        if !reasons.is_empty() {
            cmp.status = CellStatus::Regressed;
            cmp.reasons = reasons;
        } else if !unconfirmed.is_empty() {
            cmp.status = CellStatus::Inconclusive;
            cmp.reasons = unconfirmed;
        }
    }
}

fn regression_reasons(
    cell: &CellRecord,
    old: &CellRecord,
    p_adjusted: f64,
    policy: &RegressionPolicy,
) -> Vec<String> {
    let mut reasons = Vec::new();
    let (n, m) = (cell.stats.judged(), old.stats.judged());
    let diff = cell.stats.corruption_rate - old.stats.corruption_rate;
    if p_adjusted < policy.alpha && diff >= policy.min_effect {
        reasons.push(format!(
            "corruption rose from {} to {}: one-sided Fisher p = {}, Holm-adjusted {} < alpha {}",
            format::rate(old.stats.corrupted, m),
            format::rate(cell.stats.corrupted, n),
            format::p_value(fisher_one_sided_greater(
                cell.stats.corrupted,
                n - cell.stats.corrupted,
                old.stats.corrupted,
                m - old.stats.corrupted
            )),
            format::p_value(p_adjusted),
            policy.alpha
        ));
    }
    if old.stats.tokens_per_s > 0.0
        && cell.stats.tokens_per_s < (1.0 - policy.tokens_per_s_noise) * old.stats.tokens_per_s
    {
        reasons.push(format!(
            "tokens/s fell from {:.1} to {:.1} ({}), beyond the noise threshold of -{}",
            old.stats.tokens_per_s,
            cell.stats.tokens_per_s,
            format::signed_percent(cell.stats.tokens_per_s / old.stats.tokens_per_s - 1.0),
            format::percent(policy.tokens_per_s_noise)
        ));
    }
    let degraded = |c: &CellRecord| {
        let total = c.stats.counts.total();
        total > 0 && c.stats.counts.failed() as f64 > policy.degraded_fraction * total as f64
    };
    if degraded(cell) && !degraded(old) {
        reasons.push(format!(
            "degraded: {} of {} sessions error/timeout (baseline {} of {})",
            cell.stats.counts.failed(),
            cell.stats.counts.total(),
            old.stats.counts.failed(),
            old.stats.counts.total()
        ));
    }
    // An engine that dies is evidence (core::deaths): a cell whose engine now dies where
    // the baseline's never did regressed, whatever its surviving sessions say.
    if !cell.stats.deaths.is_empty() && old.stats.deaths.is_empty() {
        let kinds: std::collections::BTreeSet<String> =
            cell.stats.deaths.iter().map(|d| d.short()).collect();
        reasons.push(format!(
            "the engine died {} time{} ({}) where the baseline's never did: {}",
            cell.stats.deaths.len(),
            if cell.stats.deaths.len() == 1 {
                ""
            } else {
                "s"
            },
            kinds.into_iter().collect::<Vec<_>>().join(", "),
            cell.stats.deaths[0].describe()
        ));
    }
    reasons
}

/// Why a comparable cell without a regression cannot be called "ok" (the module's
/// rules): empty when it can.
fn unconfirmed_reasons(
    cell: &CellRecord,
    old: &CellRecord,
    workload: &serde_json::Value,
    policy: &RegressionPolicy,
) -> Vec<String> {
    let mut reasons = Vec::new();
    reasons.extend(mechanism_reason(cell));
    // Deaths in both nights: neither cell is whole, and an engine that dies is never ok.
    if !cell.stats.deaths.is_empty() {
        reasons.push(format!(
            "{} (the baseline's {} times): an engine that dies is never ok",
            deaths_words(cell),
            old.stats.deaths.len()
        ));
    }
    for (side, stats) in [
        ("this night's cell", &cell.stats),
        ("the baseline cell", &old.stats),
    ] {
        reasons.extend(judged_reason(side, stats));
    }
    let (t, n) = (
        cell.stats.counts[SessionClass::Truncated],
        cell.stats.sessions(),
    );
    let (t0, n0) = (
        old.stats.counts[SessionClass::Truncated],
        old.stats.sessions(),
    );
    let rise = crate::core::stats::rate(t, n) - crate::core::stats::rate(t0, n0);
    let p = fisher_one_sided_greater(t, n - t, t0, n0 - t0);
    if rise >= policy.min_effect && p < TRUNCATED_ALPHA {
        reasons.push(format!(
            "replies truncated at max_tokens rose from {} to {} (one-sided Fisher p = {}): \
             truncated sessions cannot show corruption, so the cell can look cleaner for that \
             alone; raise max_tokens",
            format::rate(t0, n0),
            format::rate(t, n),
            format::p_value(p)
        ));
    }
    reasons.extend(load_reason(cell, workload));
    reasons
}

/// Why one night's cell was not measured under its own condition, one sentence each
/// (`bisect history`'s unfit nights, whose sessions do not count): an engine died, too
/// few sessions were judged, the load fell short. Empty when it was. (A mechanism that
/// never ran is [`mechanism_reason`]: the rate was measured, the path was not.)
pub(crate) fn night_condition(cell: &CellRecord, workload: &serde_json::Value) -> Vec<String> {
    let mut reasons = Vec::new();
    if !cell.stats.deaths.is_empty() {
        reasons.push(format!(
            "{}: an engine that dies is never ok",
            deaths_words(cell)
        ));
    }
    reasons.extend(judged_reason("this night's cell", &cell.stats));
    reasons.extend(load_reason(cell, workload));
    reasons
}

/// A path that never ran is never ok (core::mechanism).
pub(crate) fn mechanism_reason(cell: &CellRecord) -> Option<String> {
    let refusal =
        crate::core::mechanism::coverage(&[("this night's cell", &cell.stats.mechanisms)])
            .and_then(|c| c.refusal())?;
    Some(format!(
        "{refusal}: a cell whose path never ran is never ok"
    ))
}

fn deaths_words(cell: &CellRecord) -> String {
    format!(
        "the engine died {} time{} in this night's cell",
        cell.stats.deaths.len(),
        if cell.stats.deaths.len() == 1 {
            ""
        } else {
            "s"
        },
    )
}

/// Fewer than half the sessions judged: a rate over the few says nothing.
fn judged_reason(side: &str, stats: &ArmStats) -> Option<String> {
    let (judged, total) = (stats.judged(), stats.sessions());
    (total == 0 || judged * 2 < total).then(|| {
        format!(
            "{side} judged only {judged} of {total} sessions ({} truncated at max_tokens, \
             {} error/timeout): too few could show corruption to call the cell ok; raise \
             max_tokens (or find why sessions fail)",
            stats.counts[SessionClass::Truncated],
            stats.counts.failed()
        )
    })
}

/// The night's load short of the cell's target. A cell of one session in flight has no
/// lower load to fall to: an engine that answered ran it. And its requests come one at a
/// time, so the metrics poller, which samples, mostly sees none running (the shipped
/// nightly's 1-session cells peak at 0).
fn load_reason(cell: &CellRecord, workload: &serde_json::Value) -> Option<String> {
    let target = target_concurrency(cell, workload);
    if target <= 1 {
        return None;
    }
    let why = cell_load_shortfall(&cell.stats, target)?;
    Some(format!(
        "{why}: a load-dependent regression is not ruled out at a lower load"
    ))
}

/// The sessions a cell kept in flight: the workload's `concurrency`, capped at the
/// cell's sessions, else all of them (`Workload::target_concurrency`).
fn target_concurrency(cell: &CellRecord, workload: &serde_json::Value) -> u64 {
    let sessions = u64::from(cell.sessions);
    crate::core::workload::WorkloadParams::read(workload)
        .concurrency
        .map_or(sessions, |c| u64::from(c).min(sessions))
}

/// `bisect run`'s load rule (`engine_load_shortfall`, at its default fraction) on one
/// cell's measurements, worded for a cell, with the roles whose metrics failed when they
/// left the load unmeasured.
fn cell_load_shortfall(stats: &ArmStats, target: u64) -> Option<String> {
    let rule = Policy::default().min_load_fraction;
    let why = format!(
        "this night's cell {}",
        engine_load_shortfall(&stats.peak_running, target, rule)?
    );
    if stats.metrics_failed.is_empty() {
        return Some(why);
    }
    let failed: Vec<String> = stats
        .metrics_failed
        .iter()
        .map(|(role, reason)| format!("{role}: {reason}"))
        .collect();
    Some(format!("{why} (metrics failed for {})", failed.join("; ")))
}

pub(super) fn empty(
    status: CellStatus,
    old: Option<&CellRecord>,
    reasons: Vec<String>,
) -> CellComparison {
    CellComparison {
        status,
        baseline_sessions: old.map(|o| o.stats.counts.total()).unwrap_or(0),
        baseline_corrupted: old.map(|o| o.stats.corrupted).unwrap_or(0),
        baseline_rate: old.map(|o| o.stats.corruption_rate).unwrap_or(0.0),
        baseline_ci95: old.map(|o| o.stats.ci95).unwrap_or([0.0, 1.0]),
        rate_diff: 0.0,
        p_value: None,
        p_adjusted: None,
        baseline_tokens_per_s: old.map(|o| o.stats.tokens_per_s).unwrap_or(0.0),
        tokens_per_s_ratio: None,
        reasons,
        threshold: None,
    }
}

pub(crate) mod load;
#[cfg(test)]
mod tests;
