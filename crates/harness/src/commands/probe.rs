//! `bisect probe`: one arm with the launch configs exactly as they are, for
//! `git bisect run`. Exit 0 clean, 1 corrupted, 125 could not tell (docs/design.md 3.1).
//!
//! Decision (Wilson 95% interval of the corruption rate, Wilson 1927):
//! corrupted when the lower bound exceeds `background` (the rate a good build may show);
//! clean when the upper bound is below `bug_rate` (the rate the bad build showed), so
//! the bug, had it been present, would have been seen; otherwise, and whenever more
//! than 10% of sessions errored or timed out, "could not tell" (git bisect skips it).
//! The rate's denominator is the judged sessions: neither failed nor truncated at
//! max_tokens (`Counts::judged`), so replies cut off before they could go wrong never
//! make a build look clean.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::arm::{BlockName, Progress, Testbed, TestbedSpec};
use crate::commands::run::now;
use crate::config::{FlagCatalog, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::ArmLabel;
use crate::core::classify::Classifier;
use crate::core::format;
use crate::core::session::Counts;
use crate::results::run_record::{ArmRecord, TargetInfo};
use crate::results::{write_atomic, ResultsDir};

#[derive(Debug, Clone)]
pub struct ProbePlan {
    pub id: String,
    pub target: TargetProfile,
    pub workload: Workload,
    pub catalog: FlagCatalog,
    pub run_dir: PathBuf,
    pub api_key: Option<String>,
    pub background: f64,
    pub bug_rate: f64,
    pub degraded_fraction: f64,
    pub metrics_period: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Clean,
    Corrupted,
    Unknown,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Clean => crate::exit::OK,
            Outcome::Corrupted => crate::exit::PROBE_CORRUPTED,
            Outcome::Unknown => crate::exit::PROBE_UNKNOWN,
        }
    }
}

/// `probe.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub schema: String,
    pub id: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub target: TargetInfo,
    pub workload: serde_json::Value,
    /// Every catalog flag found in the launch configs: flag -> role -> value.
    pub flags: BTreeMap<String, BTreeMap<String, String>>,
    pub arm: Option<ArmRecord>,
    pub outcome: Option<Outcome>,
    pub reason: String,
}

/// The decision rule of this module's header, as a pure function of the counts.
pub fn decide(counts: &Counts, background: f64, bug_rate: f64, degraded: f64) -> (Outcome, String) {
    let (corrupted, failed, sessions) = (counts.corrupted(), counts.failed(), counts.total());
    if sessions == 0 {
        return (Outcome::Unknown, "no session finished".into());
    }
    if failed as f64 > degraded * sessions as f64 {
        return (
            Outcome::Unknown,
            format!("degraded: {failed}/{sessions} sessions errored or timed out; corruption cannot be judged"),
        );
    }
    let judged = counts.judged();
    if judged == 0 {
        return (
            Outcome::Unknown,
            format!(
                "no session could show corruption: {} of {sessions} were truncated at max_tokens \
                 and {failed} failed; raise --max-tokens",
                counts.truncated
            ),
        );
    }
    let (lo, hi) = crate::core::stats::wilson(corrupted, judged, 0.95);
    let unjudged = if judged < sessions {
        format!(
            " of {judged} judged ({} truncated, {failed} failed, not counted)",
            counts.truncated
        )
    } else {
        String::new()
    };
    let rate = format!(
        "{corrupted}/{judged} corrupted{unjudged} (95% CI {}-{}%)",
        format::percent_digits(lo),
        format::percent_digits(hi)
    );
    if lo > background {
        (
            Outcome::Corrupted,
            format!(
                "{rate}: above the background rate {}",
                format::percent(background)
            ),
        )
    } else if hi < bug_rate {
        (
            Outcome::Clean,
            format!(
                "{rate}: rules out the bug rate {}",
                format::percent(bug_rate)
            ),
        )
    } else {
        (
            Outcome::Unknown,
            format!(
                "{rate}: neither above the background {} nor below the bug rate {}; run more sessions",
                format::percent(background),
                format::percent(bug_rate)
            ),
        )
    }
}

fn effective_flags(plan: &ProbePlan) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for role in &plan.target.roles {
        let Ok(text) = std::fs::read_to_string(&role.launch) else {
            continue;
        };
        for flag in &plan.catalog.flags {
            if !flag.roles.contains(&role.name) {
                continue;
            }
            if let Some(v) = crate::launch::read_setting(&text, &flag.setting, flag) {
                out.entry(flag.name.clone())
                    .or_insert_with(BTreeMap::new)
                    .insert(role.name.clone(), v);
            }
        }
    }
    out
}

/// Run the probe. Launch configs are only read, never written.
pub async fn run_probe(
    plan: &ProbePlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<ProbeRecord> {
    // Before the configs are read: another bisect's edits are not this commit's "as-is",
    // and no other bisect may edit them or start engines while the probe runs.
    for line in control.claim()? {
        progress.note(&line);
    }
    let results = ResultsDir::create(&plan.run_dir)?;
    let mut record = ProbeRecord {
        schema: "bisect.probe/1".into(),
        id: plan.id.clone(),
        started_at: now(),
        finished_at: None,
        target: TargetInfo::of(&plan.target),
        workload: plan.workload.params_json(),
        flags: effective_flags(plan),
        arm: None,
        outcome: None,
        reason: String::new(),
    };
    let write = |r: &ProbeRecord| -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(r)?;
        text.push('\n');
        write_atomic(&plan.run_dir.join("probe.json"), text.as_bytes())
    };
    write(&record)?;
    let spec = TestbedSpec::read_only(&plan.target, plan.api_key.clone(), plan.metrics_period);
    let mut bed = Testbed::open(spec, control, progress, cancel)?;
    let outcome = async {
        let restarted = bed.restart("probe").await?;
        let classifier = Arc::new(Classifier::with_defaults(&plan.workload.tools)?);
        let block = BlockName {
            label: ArmLabel::Probe.as_str(),
            value: "as-is",
            repeat: 0,
        };
        let mut arm = ArmRecord::new(ArmLabel::Probe, "as-is", Some(0));
        arm.stats = bed
            .drive(block, &plan.workload, &classifier, &results)
            .await?;
        arm.stats.health_wait_s = restarted.health_wait_s;
        arm.finish();
        anyhow::Ok(arm)
    }
    .await;
    let closed = bed.close().await;
    match &outcome {
        Ok(arm) => {
            let (o, reason) = decide(
                &arm.stats.counts,
                plan.background,
                plan.bug_rate,
                plan.degraded_fraction,
            );
            record.outcome = Some(o);
            record.reason = reason;
            record.arm = Some(arm.clone());
        }
        Err(e) => record.reason = format!("could not run: {e:#}"),
    }
    record.finished_at = Some(now());
    write(&record)?;
    closed.combine(outcome)?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts of an arm: `corrupted` bad_args, `failed` timeouts, `truncated`, and
    /// done sessions filling up to `sessions`.
    fn counts(corrupted: u64, failed: u64, truncated: u64, sessions: u64) -> Counts {
        Counts {
            bad_args: corrupted,
            timeout: failed,
            truncated,
            done: sessions - corrupted - failed - truncated,
            ..Counts::default()
        }
    }

    fn outcome(c: u64, f: u64, t: u64, n: u64) -> Outcome {
        decide(&counts(c, f, t, n), 0.02, 0.10, 0.10).0
    }

    #[test]
    fn decision_table() {
        // 14/80: Wilson lower bound 10.7% > 2% background.
        assert_eq!(outcome(14, 0, 0, 80), Outcome::Corrupted);
        // 0/80: upper bound 4.6% < 10% bug rate.
        assert_eq!(outcome(0, 0, 0, 80), Outcome::Clean);
        // 2/80: upper 8.7%.
        assert_eq!(outcome(2, 0, 0, 80), Outcome::Clean);
        // 3/80: lower 1.3% <= 2%, upper 10.5% >= 10%: cannot tell.
        assert_eq!(outcome(3, 0, 0, 80), Outcome::Unknown);
        // 0/10: upper 27.8%: too few sessions to rule the bug out.
        assert_eq!(outcome(0, 0, 0, 10), Outcome::Unknown);
        // Degraded beats everything.
        let (o, why) = decide(&counts(14, 40, 0, 80), 0.02, 0.10, 0.10);
        assert_eq!(o, Outcome::Unknown);
        assert!(why.contains("degraded"));
        assert_eq!(Outcome::Corrupted.exit_code(), 1);
        assert_eq!(Outcome::Unknown.exit_code(), 125);
        assert_eq!(Outcome::Clean.exit_code(), 0);
    }

    #[test]
    fn truncated_sessions_never_make_a_build_clean() {
        // 80 sessions all cut off at max_tokens: nothing was judged. Counted as clean
        // they would give 0/80 and "clean" (git bisect good) for a build never tested.
        let (o, why) = decide(&counts(0, 0, 80, 80), 0.02, 0.10, 0.10);
        assert_eq!(o, Outcome::Unknown);
        assert!(why.contains("no session could show corruption"), "{why}");
        assert!(why.contains("raise --max-tokens"), "{why}");
        // 0 of 10 judged (70 truncated): the upper bound 27.8% cannot rule out 10%.
        let (o, why) = decide(&counts(0, 0, 70, 80), 0.02, 0.10, 0.10);
        assert_eq!(o, Outcome::Unknown, "{why}");
        assert!(
            why.contains("0/10 corrupted of 10 judged (70 truncated"),
            "{why}"
        );
        // Failures within the degraded limit are left out of the rate too: 2/72 judged.
        assert_eq!(outcome(2, 8, 0, 80), Outcome::Clean);
    }
}
