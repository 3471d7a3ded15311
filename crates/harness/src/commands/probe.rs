//! `bisect probe`: one arm with the launch configs exactly as they are, for
//! `git bisect run`. Exit 0 clean, 1 corrupted, 125 could not tell (docs/design.md 3.8).
//!
//! Decision (Wilson 95% interval of the corruption rate, Wilson 1927):
//! corrupted when the lower bound exceeds `background` (the rate a good build may show);
//! clean when the upper bound is below `bug_rate` (the rate the bad build showed), so
//! the bug, had it been present, would have been seen; otherwise, and whenever more
//! than 10% of sessions errored or timed out, "could not tell" (git bisect skips it).
//! The rate's denominator is the judged sessions: neither failed nor truncated at
//! max_tokens (`Counts::judged`), so replies cut off before they could go wrong never
//! make a build look clean.
//!
//! The checks `bisect run` makes on an arm hold here too, each voiding what it
//! undermines (git bisect trusts the exit code alone):
//! - an engine that was another process at the end than after the restart
//!   (`ArmStats::engine_replaced`, a crash its supervisor recovered) voids both answers:
//!   part of the sessions did not run on the engine the probe started for this build;
//! - the load (`core::confounds::load_shortfall`, run's rule for `cleared`: the busiest
//!   engine role's peak running requests at least 90% of the target concurrency, and
//!   measured at all) voids only "clean": a load-dependent bug cannot be ruled out at a
//!   lower load, but corruption seen at a lower load is still the bug seen. Roles whose
//!   metrics failed (`ArmStats::metrics_failed`) count through this rule: named when they
//!   leave the load unmeasured, a warning when another role measured it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::arm::{lifecycle, BlockDrive, BlockName, Progress, Testbed, TestbedSpec};
use crate::commands::run::now;
use crate::config::{FlagCatalog, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::ArmLabel;
use crate::core::evidence::Policy;
use crate::core::format;
use crate::core::judgement::{judge_block, Judged, Void};
use crate::results::json::JsonFile;
use crate::results::run_record::{ArmRecord, TargetInfo};
use crate::results::{export, RecordHeader, ResultsDir};

/// Which reader understands probe.json.
const SCHEMA: &str = "bisect.probe/1";

/// probe.json: the record, rewritten when the probe starts and when it ends.
const RECORD: JsonFile = JsonFile("probe.json");

#[derive(Debug, Clone)]
pub struct ProbePlan {
    pub id: String,
    /// The command line as typed, for the record.
    pub command: String,
    pub target: TargetProfile,
    pub workload: Workload,
    pub catalog: FlagCatalog,
    pub run_dir: PathBuf,
    pub api_key: Option<String>,
    pub background: f64,
    pub bug_rate: f64,
    pub degraded_fraction: f64,
    pub metrics_period: Duration,
    /// The flag whose mechanism "clean" needs to have run (`--mechanism`), at the value
    /// the launch configs hold (the flag's `on`, the engine's default, where they hold
    /// none).
    pub mechanism: Option<crate::config::FlagSpec>,
}

impl crate::commands::EnginePlan for ProbePlan {
    fn engines(&self) -> crate::commands::Engines<'_> {
        crate::commands::Engines::new(&self.target, &self.run_dir, self.api_key.as_deref())
    }

    fn first_set_reason(&self) -> Option<&'static str> {
        Some("a probe is one block on one build")
    }
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
    /// schema, id, command, times, status, target: the header every record opens with.
    #[serde(flatten)]
    pub header: crate::results::RecordHeader,
    pub workload: serde_json::Value,
    /// Every catalog flag found in the launch configs: flag -> role -> value.
    pub flags: BTreeMap<String, BTreeMap<String, String>>,
    pub arm: Option<ArmRecord>,
    pub outcome: Option<Outcome>,
    pub reason: String,
}

impl ProbePlan {
    /// The thresholds `bisect run` decides with, at this probe's degraded fraction: the
    /// load rule (`min_load_fraction`) is run's.
    pub fn policy(&self) -> Policy {
        Policy {
            degraded_fraction: self.degraded_fraction,
            ..Policy::default()
        }
    }
}

/// The decision rule of this module's header, as a pure function of the arm and the
/// workload it ran (whose `concurrency`, else `sessions`, is the target load): the core's
/// one judgement of a block ([`crate::core::judgement`]), then the Wilson rule.
pub fn decide(
    arm: &ArmRecord,
    workload: &serde_json::Value,
    background: f64,
    bug_rate: f64,
    policy: &Policy,
) -> (Outcome, String) {
    let facts = crate::commands::judge::block_facts(arm, workload, policy);
    let Judged {
        corrupted,
        judged,
        sessions,
        failed,
        truncated,
        load_shortfall,
    } = match judge_block(&facts, policy.degraded_fraction) {
        Ok(judged) => judged,
        Err(void) => return (Outcome::Unknown, void_words(&void)),
    };
    let (lo, hi) = crate::core::stats::wilson(corrupted, judged, 0.95);
    let unjudged = if judged < sessions {
        format!(" of {judged} judged ({truncated} truncated, {failed} failed, not counted)")
    } else {
        String::new()
    };
    let rate = format!(
        "{corrupted}/{judged} corrupted{unjudged} (95% CI {}-{}%)",
        format::percent_digits(lo),
        format::percent_digits(hi)
    );
    let load = load_shortfall.map(|why| with_failed_metrics(arm, why));
    if lo > background {
        // Corruption seen at a lower load than targeted is still the bug seen.
        let note = load
            .map(|why| format!(" (seen although {why})"))
            .unwrap_or_default();
        (
            Outcome::Corrupted,
            format!(
                "{rate}: above the background rate {}{note}",
                format::percent(background)
            ),
        )
    } else if hi < bug_rate {
        if let Some(why) = load {
            return (
                Outcome::Unknown,
                format!(
                    "{rate} would rule out the bug rate {}, but {why}: a bug that needs load \
                     is not ruled out at a lower one; check what limits the engine's running \
                     requests (a lower max running requests, a smaller pool) or give its roles \
                     working metrics, and probe again",
                    format::percent(bug_rate)
                ),
            );
        }
        // No clean answer for a path that never ran (core::mechanism).
        let coverage = crate::core::mechanism::coverage(&[("probe", &arm.stats.mechanisms)]);
        if let Some(refusal) = coverage.as_ref().and_then(|c| c.refusal()) {
            return (
                Outcome::Unknown,
                format!(
                    "{rate} would rule out the bug rate {}, but {refusal}",
                    format::percent(bug_rate)
                ),
            );
        }
        let ran = coverage
            .map(|c| format!("; {}", c.words()))
            .unwrap_or_default();
        (
            Outcome::Clean,
            format!(
                "{rate}: rules out the bug rate {}{ran}{}",
                format::percent(bug_rate),
                metrics_warnings(arm)
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

/// A void block in the probe's words, each with what to do.
fn void_words(void: &Void) -> String {
    match void {
        Void::EngineReplaced(lines) => format!(
            "an engine changed during the probe: {lines}; part of the sessions ran on an \
             engine the probe did not start for this build (cold, at a lower load), so \
             neither clean nor corrupted can be told; find why it restarted (its logs, \
             `journalctl -u`, `kubectl describe pod`) and probe again"
        ),
        Void::NoSession => "no session finished".into(),
        Void::Degraded { failed, sessions } => format!(
            "degraded: {failed}/{sessions} sessions errored or timed out; corruption cannot be judged"
        ),
        Void::NothingJudged {
            truncated,
            failed,
            sessions,
        } => format!(
            "no session could show corruption: {truncated} of {sessions} were truncated at \
             max_tokens and {failed} failed; raise --max-tokens"
        ),
        Void::EngineDied(_) => format!(
            "{void}; this build crashes the engine: look at the deaths' log lines (run.json              `deaths`), or mark it bad by hand if a crash is the bug"
        ),
    }
}

/// Why the probe's load does not support "clean" (`bisect run`'s rule), with the
/// metrics failures behind an unmeasured load.
fn with_failed_metrics(arm: &ArmRecord, why: String) -> String {
    let failed = &arm.stats.metrics_failed;
    if failed.is_empty() {
        return why;
    }
    let scrapes: Vec<String> = failed
        .iter()
        .map(|(role, reason)| format!("{role}: {reason}"))
        .collect();
    format!("{why} (metrics failed for {})", scrapes.join("; "))
}

/// `; warning: no load measured for role R: why` for each role whose metrics failed
/// while another role measured the load (`bisect run` warns the same).
fn metrics_warnings(arm: &ArmRecord) -> String {
    arm.stats
        .metrics_failed
        .iter()
        .map(|(role, why)| format!("; warning: no load measured for role {role}: {why}"))
        .collect()
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
        header: RecordHeader::running(
            SCHEMA,
            &plan.id,
            &plan.command,
            now(),
            TargetInfo::of(&plan.target),
        ),
        workload: plan.workload.params_json(),
        flags: effective_flags(plan),
        arm: None,
        outcome: None,
        reason: String::new(),
    };
    let write = |r: &ProbeRecord| export::write_all(&plan.run_dir, r, &[&RECORD]);
    write(&record)?;
    let spec = TestbedSpec::read_only(&plan.target, plan.api_key.clone(), plan.metrics_period);
    let watched = plan.mechanism.as_ref().map(|flag| {
        let value = record
            .flags
            .get(&flag.name)
            .and_then(|roles| roles.values().next().cloned())
            .unwrap_or_else(|| flag.on.clone());
        (flag.clone(), value)
    });
    let body = async |bed: &mut Testbed<'_>, _: &mut ProbeRecord| {
        if let Some((flag, value)) = &watched {
            bed.watch_mechanism(flag, value);
        }
        let restarted = bed.restart("probe").await?;
        // The profile's markup families decide what a leak is, as in `bisect run`.
        let classifier = Arc::new(plan.target.classifier(&plan.workload)?);
        let block = BlockName {
            label: ArmLabel::Probe.as_str(),
            value: "as-is",
            repeat: 0,
        };
        let mut arm = ArmRecord::new(ArmLabel::Probe, "as-is", Some(0));
        arm.stats = bed
            .drive(BlockDrive {
                block,
                workload: &plan.workload,
                classifier: &classifier,
                results: &results,
            })
            .await?;
        arm.stats.health_wait_s = restarted.health_wait_s;
        arm.finish();
        anyhow::Ok(arm)
    };
    let bed = Testbed::open(spec, control, progress, cancel)?;
    lifecycle(bed, &mut record, body, |record, outcome, _| {
        match outcome {
            Ok(arm) => {
                let (o, reason) = decide(
                    arm,
                    &record.workload,
                    plan.background,
                    plan.bug_rate,
                    &plan.policy(),
                );
                record.outcome = Some(o);
                record.reason = reason;
                record.arm = Some(arm.clone());
            }
            Err(e) => record.reason = format!("could not run: {e:#}"),
        }
        record.header.finished_at = Some(now());
        record.header.status = crate::arm::settle(outcome).0;
        write(record)
    })
    .await?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::{Counts, SessionClass};

    /// The probe's arm: `corrupted` bad_args, `failed` timeouts, `truncated`, and done
    /// sessions filling up to `sessions`; decode peaked at the full load (`sessions`).
    fn arm(corrupted: u64, failed: u64, truncated: u64, sessions: u64) -> ArmRecord {
        let mut arm = ArmRecord::new(ArmLabel::Probe, "as-is", Some(0));
        arm.stats.counts = Counts::from([
            (SessionClass::BadArgs, corrupted),
            (SessionClass::Timeout, failed),
            (SessionClass::Truncated, truncated),
            (
                SessionClass::Done,
                sessions - corrupted - failed - truncated,
            ),
        ]);
        arm.stats.peak_running = [("client".into(), sessions), ("decode".into(), sessions)].into();
        arm.finish();
        arm
    }

    /// A workload of `sessions` sessions, all in flight at once (the target load).
    fn workload(sessions: u64) -> serde_json::Value {
        serde_json::json!({ "sessions": sessions })
    }

    fn probe(arm: &ArmRecord) -> (Outcome, String) {
        let policy = Policy {
            degraded_fraction: 0.10,
            ..Policy::default()
        };
        decide(arm, &workload(arm.stats.sessions()), 0.02, 0.10, &policy)
    }

    fn outcome(c: u64, f: u64, t: u64, n: u64) -> Outcome {
        probe(&arm(c, f, t, n)).0
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
        let (o, why) = probe(&arm(14, 40, 0, 80));
        assert_eq!(o, Outcome::Unknown);
        assert!(why.contains("degraded"));
        assert_eq!(Outcome::Corrupted.exit_code(), 1);
        assert_eq!(Outcome::Unknown.exit_code(), 125);
        assert_eq!(Outcome::Clean.exit_code(), 0);
    }

    /// `--mechanism DEFRAG`: 0/80 rules the bug rate out only where defrag ran; with
    /// no defrag logged the build is "could not tell" (git bisect skips it), not good.
    #[test]
    fn clean_needs_the_watched_mechanism_to_have_run() {
        let watched = |count: u64| {
            let mut a = arm(0, 0, 0, 80);
            a.stats.mechanisms = vec![crate::core::testing::witnessed(
                ("DEFRAG", "defrag"),
                ("0.1", true),
                "log /requesting defrag/",
                count,
            )];
            a
        };
        let (o, why) = probe(&watched(0));
        assert_eq!(o, Outcome::Unknown);
        assert!(
            why.contains("but the mechanism never ran: defrag (log /requesting defrag/): probe 0"),
            "{why}"
        );
        let (o, why) = probe(&watched(3));
        assert_eq!(o, Outcome::Clean);
        assert!(why.contains("the mechanism ran: defrag"), "{why}");
    }

    #[test]
    fn truncated_sessions_never_make_a_build_clean() {
        // 80 sessions all cut off at max_tokens: nothing was judged. Counted as clean
        // they would give 0/80 and "clean" (git bisect good) for a build never tested.
        let (o, why) = probe(&arm(0, 0, 80, 80));
        assert_eq!(o, Outcome::Unknown);
        assert!(why.contains("no session could show corruption"), "{why}");
        assert!(why.contains("raise --max-tokens"), "{why}");
        // 0 of 10 judged (70 truncated): the upper bound 27.8% cannot rule out 10%.
        let (o, why) = probe(&arm(0, 0, 70, 80));
        assert_eq!(o, Outcome::Unknown, "{why}");
        assert!(
            why.contains("0/10 corrupted of 10 judged (70 truncated"),
            "{why}"
        );
        // Failures within the degraded limit are left out of the rate too: 2/72 judged.
        assert_eq!(outcome(2, 8, 0, 80), Outcome::Clean);
    }

    #[test]
    fn a_replaced_engine_voids_clean_and_corrupted() {
        // Decode crashed and its supervisor restarted it mid-probe: a cold engine at a
        // lower load answered part of the sessions. Neither 0/80 nor 14/80 is this build's.
        for corrupted in [0, 14] {
            let mut a = arm(corrupted, 0, 0, 80);
            a.stats
                .engine_replaced
                .push("role decode is another process (pid 11 -> 12)".into());
            let (o, why) = probe(&a);
            assert_eq!(o, Outcome::Unknown, "{corrupted}: {why}");
            assert!(why.contains("an engine changed during the probe"), "{why}");
            assert!(why.contains("pid 11 -> 12"), "{why}");
        }
    }

    #[test]
    fn clean_needs_the_target_load_and_corrupted_does_not() {
        // The build under test caps decode at 10 running requests at a target of 80: the
        // load-dependent bug cannot fire, so 0/80 says nothing about it.
        let mut low = arm(0, 0, 0, 80);
        low.stats.peak_running.insert("decode".into(), 10);
        let (o, why) = probe(&low);
        assert_eq!(o, Outcome::Unknown, "{why}");
        assert!(
            why.contains("reached at most 10 running requests (decode), below 72"),
            "{why}"
        );
        assert!(why.contains("not ruled out at a lower one"), "{why}");
        // 72 of 80 is enough (90%).
        low.stats.peak_running.insert("decode".into(), 72);
        assert_eq!(probe(&low).0, Outcome::Clean);
        // Corruption seen at a low load is still the bug seen; the reason says the load.
        let mut bad = arm(14, 0, 0, 80);
        bad.stats.peak_running.insert("decode".into(), 10);
        let (o, why) = probe(&bad);
        assert_eq!(o, Outcome::Corrupted, "{why}");
        assert!(why.contains("seen although"), "{why}");
    }

    #[test]
    fn an_unmeasured_load_is_no_clean_and_names_the_failed_metrics() {
        // No engine role's metrics answered: only the client's own count, which says
        // nothing about what the engine ran at once.
        let mut blind = arm(0, 0, 0, 80);
        blind.stats.peak_running.remove("decode");
        blind
            .stats
            .metrics_failed
            .insert("decode".into(), "connection refused".into());
        let (o, why) = probe(&blind);
        assert_eq!(o, Outcome::Unknown, "{why}");
        assert!(why.contains("no engine-side load measurement"), "{why}");
        assert!(
            why.contains("metrics failed for decode: connection refused"),
            "{why}"
        );
        // Another role measured the full load: clean, with the blind role named.
        let mut half = arm(0, 0, 0, 80);
        half.stats
            .metrics_failed
            .insert("prefill".into(), "404".into());
        let (o, why) = probe(&half);
        assert_eq!(o, Outcome::Clean, "{why}");
        assert!(
            why.contains("warning: no load measured for role prefill: 404"),
            "{why}"
        );
    }
}
