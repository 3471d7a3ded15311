//! `bisect reclassify DIR`: re-run the current classifier over the transcripts stored in a
//! run's sessions.jsonl (after a markup pattern or rule changed) and rewrite the session
//! classes, the arm counts, the comparison and the verdict, keeping the old ones.
//!
//! The classifier needs what the driver had: the workload's tools and each session's
//! expected steps. Both are regenerated deterministically from run.json's workload
//! parameters (the workload is loaded by name, or from `--workload FILE`, then overridden
//! with the recorded sessions/rounds/seed/...); every session's stored task message must
//! equal the regenerated one, so a changed workload file is refused, not silently used.
//!
//! A session is replayed round by round through the [`SessionProgress`] the live driver
//! uses (`core::ending`): the first non-ok round ends it. Transport rounds (error,
//! timeout) have no reply to judge and keep their class, except an error reply whose
//! status and body were kept (`RoundRecord::http`): it is judged again against the
//! run's recorded rejection patterns (`rejected` or `error`), as is a `rejected` round.
//! A session whose last stored round was non-ok and is now ok would have gone on; those
//! rounds were never run, so it becomes `maxrounds` and is counted as incomplete.
//!
//! Kept: `sessions.jsonl.orig-<stamp>`, `run.json.orig-<stamp>`, and a `reclassified`
//! entry in run.json holding the previous arms, runs, comparison and verdict.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Value};

use crate::config::Workload;
use crate::core::arm_stats::ArmLabel;
use crate::core::classify::{account_for_truncation, Classifier, RoundOutcome};
use crate::core::ending::{Ending, Flow, SessionProgress};
use crate::core::evidence::Policy;
use crate::core::session::{
    ChatMessage, HttpReply, RoundClass, RoundRecord, SessionClass, SessionResult,
};
use crate::core::task::{initial_conversation, Task};
use crate::core::verdict::decide;
use crate::core::workload::WorkloadParams;
use crate::exit::{Failure, Problem};
use crate::results::run_record::{ArmRecord, RunRecord};
use crate::results::{write_atomic, ResultsDir};

/// What a reclassification changed.
#[derive(Debug, Clone)]
pub struct Summary {
    pub record: RunRecord,
    /// (label, repeat, index, old class, new class) of every session whose class changed.
    pub changed: Vec<(String, u32, u32, SessionClass, SessionClass)>,
    /// Sessions that ended on a round now judged ok: their later rounds were never run.
    pub incomplete: usize,
    pub sessions_backup: PathBuf,
    pub run_json_backup: PathBuf,
    pub previous_verdict: Option<String>,
    /// A caveat on how the sessions were judged (an older record's missing markup).
    pub markup_note: Option<String>,
}

/// The workload the run used: loaded by `name_or_file` (else the recorded name) and
/// overridden with run.json's recorded parameters.
pub fn recorded_workload(params: &Value, name_or_file: Option<&str>) -> anyhow::Result<Workload> {
    let recorded = WorkloadParams::read(params);
    let name = name_or_file.or(recorded.name.as_deref()).ok_or_else(|| {
        Failure::bad_input(
            "run.json records no workload name",
            "pass --workload NAME|FILE",
        )
    })?;
    let mut w = crate::config::load_workload(name).map_err(|e| {
        Failure::bad_input(
            format!("loading workload `{name}`: {e}"),
            "pass --workload FILE naming the workload file the run used",
        )
    })?;
    w.sessions = recorded.sessions.unwrap_or(w.sessions);
    w.rounds = recorded.rounds.unwrap_or(w.rounds);
    w.ctx = recorded.ctx.unwrap_or(w.ctx);
    w.max_tokens = recorded.max_tokens.unwrap_or(w.max_tokens);
    w.task.steps = recorded.steps.unwrap_or(w.task.steps);
    w.timeout_s = recorded.timeout_s.unwrap_or(w.timeout_s);
    w.temperature = recorded.temperature.unwrap_or(w.temperature);
    w.seed = recorded.seed.unwrap_or(w.seed);
    w.barrier = recorded.barrier.unwrap_or(w.barrier);
    w.check_args = recorded.check_args.unwrap_or(w.check_args);
    Ok(w)
}

/// One session replayed under the current rules; `bool` is true when it is incomplete.
pub fn reclassify_session(
    classifier: &Classifier,
    workload: &Workload,
    old: &SessionResult,
) -> anyhow::Result<(SessionResult, bool)> {
    let who = format!("session {} r{} #{}", old.label, old.repeat, old.index);
    let (task, prefix) = initial_conversation(workload, old.index);
    check_task_message(&who, workload, old, &prefix)?;
    let progress = replay_rounds(classifier, workload, old, &task, prefix.len(), &who)?;
    Ok(replayed_session(old, progress.finish(workload.rounds)))
}

/// Refuse a session whose stored task message is not the regenerated one: the workload
/// changed since the run, and judging against it would be silently wrong.
fn check_task_message(
    who: &str,
    workload: &Workload,
    old: &SessionResult,
    prefix: &[ChatMessage],
) -> anyhow::Result<()> {
    let task_message = prefix.last().and_then(|m| m.content.as_deref());
    let stored = old
        .transcript
        .get(prefix.len().saturating_sub(1))
        .and_then(|m| m.content.as_deref());
    if task_message != stored {
        return Err(Failure::bad_input(
            format!(
                "{who}: its stored task message differs from workload `{}` regenerated with the recorded parameters (seed {})",
                workload.name, workload.seed
            ),
            "pass --workload FILE naming the workload file the run used",
        )
        .into());
    }
    Ok(())
}

/// The stored rounds judged again, in order, through the live driver's
/// [`SessionProgress`]; `pos` walks the transcript past each round's reply and tool
/// results.
fn replay_rounds(
    classifier: &Classifier,
    workload: &Workload,
    old: &SessionResult,
    task: &Task,
    mut pos: usize,
    who: &str,
) -> anyhow::Result<SessionProgress> {
    let mut progress = SessionProgress::new(task.steps.len());
    for stored_round in &old.rounds {
        // An error reply kept whole enough to judge: rejected or error, by the patterns.
        if let Some(http) = &stored_round.http {
            let round = rejudge_status(classifier, workload, task, &progress, stored_round, http);
            progress.record(round, None);
            break;
        }
        // Other transport rounds have no reply to judge: they keep their stored class
        // (a rejected round without its reply, which this build never writes, too).
        if matches!(
            stored_round.class,
            RoundClass::Error | RoundClass::Timeout | RoundClass::Rejected
        ) {
            progress.record(stored_round.clone(), None);
            break;
        }
        let reply = old.transcript[pos.min(old.transcript.len())..]
            .first()
            .filter(|m| m.role == "assistant")
            .ok_or_else(|| {
                Failure::BadInput(Problem::message_only(format!(
                    "{who}: the transcript has no assistant reply for round {}",
                    stored_round.round
                )))
            })?;
        pos += 1;
        while old.transcript.get(pos).is_some_and(|m| m.role == "tool") {
            pos += 1;
        }
        let verdict = account_for_truncation(
            classifier.classify(
                &RoundOutcome::Reply(reply),
                task.expected(progress.step()).as_ref(),
                workload.check_args,
            ),
            stored_round.finish_reason.as_deref(),
        );
        let round = RoundRecord {
            class: verdict.class,
            evidence: verdict.evidence,
            ..stored_round.clone()
        };
        if progress.record(round, Some(reply)) == Flow::Stop {
            break;
        }
    }
    Ok(progress)
}

/// A kept error reply judged again against the run's rejection patterns.
fn rejudge_status(
    classifier: &Classifier,
    workload: &Workload,
    task: &Task,
    progress: &SessionProgress,
    stored_round: &RoundRecord,
    http: &HttpReply,
) -> RoundRecord {
    let verdict = classifier.classify(
        &RoundOutcome::Status {
            status: http.status,
            body: &http.body,
            error: status_error(http.status, &http.body),
            partial: http.partial.as_deref(),
        },
        task.expected(progress.step()).as_ref(),
        workload.check_args,
    );
    RoundRecord {
        class: verdict.class,
        evidence: verdict.evidence,
        ..stored_round.clone()
    }
}

/// The session as its replay ended it; `bool` is true when it was cut short (a round
/// now ok whose successors were never run).
fn replayed_session(old: &SessionResult, mut ending: Ending) -> (SessionResult, bool) {
    let incomplete = ending.cut_short;
    if incomplete {
        ending.evidence = format!("reclassified: {}", ending.evidence);
    }
    // An error reply judged a rejection is evidence, not a failure: no error text, as
    // the live driver writes it; judged an error again, it gets its text back.
    let error = match (
        ending.class,
        ending.rounds.last().and_then(|r| r.http.as_ref()),
    ) {
        (SessionClass::Rejected, Some(_)) => None,
        (SessionClass::Error, Some(http)) => Some(status_error(http.status, &http.body)),
        _ => old.error.clone(),
    };
    let mut new = SessionResult {
        class: ending.class,
        rounds_used: ending.rounds.len() as u32,
        first_bad_round: ending.first_bad_round,
        latency_ms: ending.latency_ms(),
        evidence: ending.evidence,
        rounds: ending.rounds,
        error,
        oracle: None,
        ..old.clone()
    };
    // What the solo oracle saw does not depend on the classifier's rules: a session it
    // called diverged stays so unless a new rule finds its own corruption first.
    if let Some(comparison) = old.oracle.clone() {
        crate::core::solo::apply(&mut new, comparison);
    }
    (new, incomplete)
}

/// A kept error reply's text as the live client wrote it: `HTTP 500 Internal Server
/// Error: <the body's first 200 characters>`.
fn status_error(status: u16, body: &str) -> String {
    match hyper::StatusCode::from_u16(status) {
        Ok(code) => crate::driver::conversation::status_error(code, body),
        Err(_) => format!(
            "HTTP {status}: {}",
            body.chars().take(200).collect::<String>()
        ),
    }
}

/// Recount every arm block from the sessions, re-pool the arms and decide again.
pub fn recount(record: &mut RunRecord, sessions: &[SessionResult], policy: &Policy) {
    for block in &mut record.runs {
        let repeat = block.repeat.unwrap_or(0);
        // Tokens and timings were measured live; only the classes are decided again.
        let completion_tokens = block.stats.completion_tokens;
        block.stats.clear_sessions();
        for s in sessions
            .iter()
            .filter(|s| s.label == block.label.as_str() && s.repeat == repeat)
        {
            block.stats.add_session(s);
        }
        block.stats.completion_tokens = completion_tokens;
        block.finish();
    }
    let labels: Vec<(ArmLabel, String)> = record
        .arms
        .iter()
        .map(|a| (a.label, a.value.clone()))
        .collect();
    record.arms = labels
        .iter()
        .map(|(label, value)| {
            let blocks: Vec<&ArmRecord> =
                record.runs.iter().filter(|r| r.label == *label).collect();
            ArmRecord::pool(*label, value, &blocks)
        })
        .collect();
    let (Some(on), Some(off)) = (record.arm(ArmLabel::On), record.arm(ArmLabel::Off)) else {
        return;
    };
    let (comparison, confounds, verdict) = decide(
        &on.observe(&record.workload),
        &off.observe(&record.workload),
        &record.block_observations(&record.workload),
        policy,
        &record.flag.name,
    );
    record.comparison = Some(comparison);
    record.confounds = confounds;
    record.verdict = Some(verdict);
}

/// The policy the run was decided with: `--alpha` / `--min-effect` from its recorded
/// command line, the recorded comparison's min effect, else the defaults.
pub(crate) fn recorded_policy(record: &RunRecord) -> Policy {
    let mut policy = Policy::default();
    if let Some(c) = &record.comparison {
        policy.min_effect = c.min_effect;
    }
    let words: Vec<&str> = record.header.command.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        let (key, inline) = match w.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (*w, None),
        };
        let value = inline.or_else(|| words.get(i + 1).copied());
        let parsed = value.and_then(|v| v.parse::<f64>().ok());
        match (key, parsed) {
            ("--alpha", Some(v)) => policy.alpha = v,
            ("--min-effect", Some(v)) => policy.min_effect = v,
            _ => {}
        }
    }
    policy
}

fn backup_path(path: &Path, stamp: &str) -> PathBuf {
    let base = format!("{}.orig-{stamp}", path.display());
    let mut candidate = PathBuf::from(&base);
    let mut n = 1;
    while candidate.exists() {
        candidate = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    candidate
}

fn arm_summary(arms: &[ArmRecord]) -> Value {
    Value::Array(
        arms.iter()
            .map(|a| {
                json!({
                    "label": a.label, "repeat": a.repeat, "sessions": a.sessions, "counts": a.stats.counts,
                    "corrupted": a.stats.corrupted, "corruption_rate": a.stats.corruption_rate, "ci95": a.stats.ci95,
                    "first_bad_round": a.stats.first_bad_round,
                })
            })
            .collect(),
    )
}

/// Reclassify the run in `dir`; `workload` names the workload (or its file) when the
/// recorded name does not load.
pub fn reclassify_dir(dir: &Path, workload: Option<&str>) -> anyhow::Result<Summary> {
    let results = ResultsDir::open(dir);
    let run_json = dir.join("run.json");
    let (raw_text, raw, mut record) = read_run_record(&run_json)?;
    let sessions = results
        .read_sessions()
        .map_err(|e| Failure::BadInput(Problem::message_only(format!("{e:#}"))))?;
    let workload = recorded_workload(&record.workload, workload)?;
    let (classifier, markup_note) = recorded_classifier(&record, &workload)?;
    let (new_sessions, changed, incomplete) = reclassify_all(&classifier, &workload, &sessions)?;

    let previous = json!({
        "at": crate::commands::run::now(),
        "arms": arm_summary(&record.arms),
        "runs": arm_summary(&record.runs),
        "comparison": record.comparison,
        "confounds": record.confounds,
        "verdict": record.verdict,
    });
    let previous_verdict = record
        .verdict
        .as_ref()
        .map(|v| v.status.as_str().to_string());
    let policy = recorded_policy(&record);
    recount(&mut record, &new_sessions, &policy);

    let (sessions_backup, run_json_backup) =
        replace_sessions(dir, &run_json, &raw_text, &new_sessions)?;

    let mut entry = previous;
    entry["sessions_backup"] = json!(file_name(&sessions_backup));
    entry["run_json_backup"] = json!(file_name(&run_json_backup));
    entry["changed_sessions"] = json!(changed.len());
    entry["incomplete_sessions"] = json!(incomplete);
    entry["policy"] = json!({"alpha": policy.alpha, "min_effect": policy.min_effect});
    let mut history = raw
        .get("reclassified")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    history.push(entry);
    let mut extras = serde_json::Map::new();
    extras.insert("reclassified".into(), Value::Array(history));
    write_record_keeping(&results, &record, &raw, extras)?;

    Ok(Summary {
        record,
        changed,
        incomplete,
        sessions_backup,
        run_json_backup,
        previous_verdict,
        markup_note,
    })
}

/// run.json as its text, its JSON and its record; a missing or unreadable one is bad
/// input.
fn read_run_record(run_json: &Path) -> anyhow::Result<(String, Value, RunRecord)> {
    if !run_json.is_file() {
        return Err(Failure::bad_input(
            format!("{}: no such file", run_json.display()),
            "pass a results directory written by `bisect run`",
        )
        .into());
    }
    let raw_text = std::fs::read_to_string(run_json)
        .with_context(|| format!("reading {}", run_json.display()))?;
    let raw: Value = serde_json::from_str(&raw_text).map_err(|e| {
        Failure::BadInput(Problem::message_only(format!(
            "{}: {e}",
            run_json.display()
        )))
    })?;
    let record: RunRecord = serde_json::from_value(raw.clone()).map_err(|e| {
        Failure::BadInput(Problem::message_only(format!(
            "{}: not a bisect run record: {e}",
            run_json.display()
        )))
    })?;
    Ok((raw_text, raw, record))
}

/// The classifier the run judged with: its markup families and rejection patterns, with
/// a note where the record is too old to say which families it counted.
fn recorded_classifier(
    record: &RunRecord,
    workload: &Workload,
) -> anyhow::Result<(Classifier, Option<String>)> {
    // The families the run counted as leaks; a record from before they were written
    // down is judged with every family, and says so.
    let (classifier, markup_note) = match &record.header.target.markup {
        Some(families) => (Classifier::new(&workload.tools, families), None),
        None => (
            Classifier::with_defaults(&workload.tools),
            Some(
                "run.json does not say which markup families the run counted as leaks (written \
                 before they were recorded): reclassified with all of them, so markup the \
                 profile left out can now count"
                    .to_string(),
            ),
        ),
    };
    // The rejection patterns the run judged error replies with (none in older records,
    // whose error rounds kept no body to judge).
    let rejections = record.header.target.rejections.clone().unwrap_or_default();
    let classifier = classifier
        .and_then(|c| c.with_rejections(&rejections))
        .with_context(|| format!("building the classifier for workload `{}`", workload.name))?;
    Ok((classifier, markup_note))
}

/// (label, repeat, index, old class, new class), as [`Summary::changed`] lists them.
type ChangedSession = (String, u32, u32, SessionClass, SessionClass);

/// Every session judged again: the new sessions, those whose class changed, and how
/// many ended on a round now judged ok.
fn reclassify_all(
    classifier: &Classifier,
    workload: &Workload,
    sessions: &[SessionResult],
) -> anyhow::Result<(Vec<SessionResult>, Vec<ChangedSession>, usize)> {
    let mut changed = Vec::new();
    let mut incomplete = 0;
    let mut new_sessions = Vec::with_capacity(sessions.len());
    for old in sessions {
        let (new, cut) = reclassify_session(classifier, workload, old)?;
        if new.class != old.class {
            changed.push((
                old.label.clone(),
                old.repeat,
                old.index,
                old.class,
                new.class,
            ));
        }
        incomplete += usize::from(cut);
        new_sessions.push(new);
    }
    Ok((new_sessions, changed, incomplete))
}

/// Keeps sessions.jsonl and run.json beside themselves under a time stamp, then writes
/// the new sessions; returns the two copies.
fn replace_sessions(
    dir: &Path,
    run_json: &Path,
    raw_text: &str,
    new_sessions: &[SessionResult],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let sessions_path = dir.join("sessions.jsonl");
    let sessions_backup = backup_path(&sessions_path, &stamp);
    let run_json_backup = backup_path(run_json, &stamp);
    std::fs::copy(&sessions_path, &sessions_backup).with_context(|| {
        format!(
            "keeping {} as {}",
            sessions_path.display(),
            sessions_backup.display()
        )
    })?;
    write_atomic(&run_json_backup, raw_text.as_bytes())?;

    let mut lines = String::new();
    for s in new_sessions {
        lines.push_str(&serde_json::to_string(s)?);
        lines.push('\n');
    }
    write_atomic(&sessions_path, lines.as_bytes())?;
    Ok((sessions_backup, run_json_backup))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Rewrite every exporter's file from `record`, but write run.json so that the keys the
/// record type does not know (`reclassified`, later extensions) survive from `raw`, with
/// `extras` set on top.
pub fn write_record_keeping(
    results: &ResultsDir,
    record: &RunRecord,
    raw: &Value,
    extras: serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    results.write_record(record)?;
    let mut merged = serde_json::to_value(record)?;
    if let (Some(out), Some(old)) = (merged.as_object_mut(), raw.as_object()) {
        for (k, v) in old {
            if !out.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
        for (k, v) in extras {
            out.insert(k, v);
        }
    }
    let mut text = serde_json::to_string_pretty(&merged)?;
    text.push('\n');
    write_atomic(&results.root().join("run.json"), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::{ChatMessage, FunctionCall, ToolCall};

    fn workload() -> Workload {
        let mut w = crate::config::load_workload("smoke").unwrap();
        w.rounds = 4;
        w
    }

    fn call_for(task: &crate::core::task::Task, step: usize, id: &str) -> ChatMessage {
        let s = &task.steps[step];
        ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(vec![ToolCall {
                id: id.into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: s.tool.clone(),
                    arguments: Value::Object(s.args.clone()).to_string(),
                },
            }]),
            ..Default::default()
        }
    }

    fn round(n: u32, class: RoundClass) -> RoundRecord {
        RoundRecord {
            round: n,
            class,
            latency_ms: 10 * n as u64,
            completion_tokens: 20,
            evidence: "old".into(),
            finish_reason: None,
            http: None,
            logprobs: None,
        }
    }

    /// Session 0 whose round 2 reply is DSML salad in content, stored as an old rule
    /// judged it (`done`, every round ok).
    fn salad_session(w: &Workload) -> SessionResult {
        let (task, mut transcript) = initial_conversation(w, 0);
        transcript.push(call_for(&task, 0, "c1"));
        transcript.push(ChatMessage {
            role: "tool".into(),
            content: Some("ok".into()),
            tool_call_id: Some("c1".into()),
            ..Default::default()
        });
        transcript.push(ChatMessage::new(
            "assistant",
            "<｜DSML｜parameter name=\"path\" string=\"true\">/srv</｜DSML｜parameter>",
        ));
        SessionResult {
            label: "on".into(),
            repeat: 0,
            index: 0,
            class: SessionClass::Done,
            rounds_used: 2,
            first_bad_round: None,
            evidence: "old rule: a text answer".into(),
            transcript,
            rounds: vec![round(1, RoundClass::Ok), round(2, RoundClass::Ok)],
            latency_ms: vec![10, 20],
            completion_tokens: 40,
            error: None,
            oracle: None,
            timing: None,
        }
    }

    #[test]
    fn markup_an_old_rule_missed_becomes_a_leak_at_its_round() {
        let w = workload();
        let c = Classifier::with_defaults(&w.tools).unwrap();
        let (new, incomplete) = reclassify_session(&c, &w, &salad_session(&w)).unwrap();
        assert!(!incomplete);
        assert_eq!(new.class, SessionClass::Leak);
        assert_eq!(new.first_bad_round, Some(2));
        assert_eq!(new.rounds[0].class, RoundClass::Ok);
        assert_eq!(new.rounds[1].latency_ms, 20, "timings are kept");
        assert!(new.evidence.contains("DSML"), "{}", new.evidence);
    }

    #[test]
    fn a_false_alarm_cleared_ends_incomplete_and_transport_rounds_stay() {
        let w = workload();
        let c = Classifier::with_defaults(&w.tools).unwrap();
        let (task, mut transcript) = initial_conversation(&w, 3);
        transcript.push(call_for(&task, 0, "c1"));
        let old = SessionResult {
            label: "off".into(),
            repeat: 1,
            index: 3,
            class: SessionClass::WrongArgs,
            rounds_used: 1,
            first_bad_round: Some(1),
            evidence: "old rule: wrong".into(),
            transcript: transcript.clone(),
            rounds: vec![round(1, RoundClass::WrongArgs)],
            latency_ms: vec![10],
            completion_tokens: 20,
            error: None,
            oracle: None,
            timing: None,
        };
        let (new, incomplete) = reclassify_session(&c, &w, &old).unwrap();
        assert!(incomplete);
        assert_eq!(new.class, SessionClass::Maxrounds);
        assert_eq!(new.first_bad_round, None);

        // What the solo oracle saw outlives the rule change: the same session, parted
        // from its reply alone, stays diverged with the oracle's evidence.
        let parted = SessionResult {
            oracle: Some(crate::core::oracle::Comparison::Diverged {
                parting: crate::core::oracle::Parting {
                    round: 1,
                    position: 9,
                    reference: Some("a".into()),
                    loaded: Some("b".into()),
                    margin: Some(4.0),
                },
                mode: crate::core::oracle::OracleMode::Logprobs,
            }),
            ..old.clone()
        };
        let (new, _) = reclassify_session(&c, &w, &parted).unwrap();
        assert_eq!(
            (new.class, new.first_bad_round),
            (SessionClass::Diverged, Some(1))
        );
        assert!(
            new.evidence.starts_with("round 1 at 9: alone"),
            "{}",
            new.evidence
        );

        transcript.push(ChatMessage::new("tool", "ok"));
        let timed_out = SessionResult {
            class: SessionClass::Timeout,
            first_bad_round: Some(2),
            rounds_used: 2,
            rounds: vec![round(1, RoundClass::Ok), round(2, RoundClass::Timeout)],
            transcript,
            ..old
        };
        let (new, incomplete) = reclassify_session(&c, &w, &timed_out).unwrap();
        assert!(!incomplete);
        assert_eq!(
            (new.class, new.first_bad_round),
            (SessionClass::Timeout, Some(2))
        );
    }

    #[test]
    fn a_different_workload_is_refused() {
        let w = workload();
        let c = Classifier::with_defaults(&w.tools).unwrap();
        let mut other = w.clone();
        other.seed += 1;
        let err = reclassify_session(&c, &other, &salad_session(&w)).unwrap_err();
        assert_eq!(
            crate::commands::code_for_error(&err),
            crate::exit::BAD_INPUT
        );
        assert!(format!("{err}").contains("--workload FILE"), "{err}");
    }

    #[test]
    fn policy_comes_from_the_recorded_command() {
        let record: RunRecord = serde_json::from_value(json!({
            "schema": "bisect.run/1", "id": "x", "command": "bisect run --flag X --alpha 0.05 --min-effect=0.1",
            "started_at": "t", "finished_at": null, "status": "finished",
            "target": {"name": "t", "api": "a", "model": "m", "profile": null, "roles": []},
            "flag": {"name": "X", "roles": [], "on": "1", "off": "0"},
            "workload": {}, "arms": [], "runs": [], "comparison": null, "verdict": null, "error": null
        }))
        .unwrap();
        let p = recorded_policy(&record);
        assert_eq!((p.alpha, p.min_effect), (0.05, 0.1));
    }
}
