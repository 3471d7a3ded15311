//! `bisect check`'s tool-call rows (docs/design.md 3.13): the probe through the target's
//! API (the first round of the workload's sessions, which must come back as parsed
//! `tool_calls`: [`crate::core::toolprobe`], the rule a run applies: one parsed call
//! among the sessions asked passes, with a note for the rest), and, where an engine
//! reports its parser, what it says: SGLang's `tool_call_parser` in `/server_info`
//! (null: SGLang parses no tool calls at all).

use std::sync::Arc;

use super::{CheckPlan, Problem, UrlCheck};
use crate::config::{Engine, RoleSpec, Workload};
use crate::core::toolprobe::{self, ProbeFinding};
use crate::driver::DrivePlan;

/// The probe's row and, when it fails, its problem; when it passes although some first
/// rounds came back as text or without a call, the note a run prints.
pub(super) async fn probe_row(
    plan: &CheckPlan<'_>,
    workload: &Workload,
    urls: &mut Vec<UrlCheck>,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    let target = plan.target;
    let url = format!("{}/chat/completions", target.api.trim_end_matches('/'));
    let drive = DrivePlan {
        api: target.api.clone(),
        model: target.model.clone(),
        api_key: plan.api_key.clone(),
        workload: workload.clone(),
        label: "check".into(),
        repeat: 0,
        sessions: toolprobe::TRIES,
        concurrency: 1,
        oracle: None,
    };
    let replies = match target.classifier(workload) {
        Ok(classifier) => crate::driver::toolprobe::ask(&drive, Arc::new(classifier))
            .await
            .map_err(|e| format!("{e:#}")),
        Err(e) => Err(format!("{e:#}")),
    };
    let (ok, detail) = match replies {
        Ok(replies) => {
            let tally = toolprobe::Tally::of(&replies);
            let finding = tally.finding();
            let quoted = toolprobe::evidence(&replies, finding);
            let reply = if finding.proves_parsing() || finding.refuses_a_run() {
                "reply"
            } else {
                "last reply"
            };
            let detail = format!(
                "{} (the first rounds of workload `{}`'s sessions, one at a time, {}; {reply}: \
                 {quoted})",
                finding.describe(),
                workload.name,
                tally.in_words(),
            );
            notes.extend(toolprobe::tolerated(&replies));
            if !finding.proves_parsing() {
                let fix = match finding {
                    ProbeFinding::Unanswered => {
                        // A slow engine (a CPU vLLM: 20-60 s a reply) times out where a
                        // broken one errors: say which wait ran out.
                        let timed_out = replies
                            .iter()
                            .any(|r| r.class == crate::core::session::RoundClass::Timeout);
                        let slow = if timed_out {
                            format!(
                                "; a reply timed out after the workload's timeout_s = {} s: a slow engine needs a workload with a longer timeout_s (--workload FILE)",
                                workload.timeout_s
                            )
                        } else {
                            String::new()
                        };
                        format!(
                            "make the chat endpoint answer (the target's api, model and key; the engine's log says why it failed){slow}; then: {}",
                            target.engine.tool_call_fix()
                        )
                    }
                    _ => target.engine.tool_call_fix().to_string(),
                };
                problems.push(Problem {
                    subject: "tool calls".into(),
                    message: format!("{url}: {detail}"),
                    fix,
                });
            }
            (finding.proves_parsing(), detail)
        }
        Err(why) => {
            problems.push(Problem {
                subject: "tool calls".into(),
                message: format!("{url}: the probe could not be sent: {why}"),
                fix: "check the target's api URL".into(),
            });
            (false, why)
        }
    };
    urls.push(UrlCheck {
        role: "api".into(),
        kind: "tool_calls".into(),
        url,
        ok,
        detail,
    });
}

/// What `--oracle solo` can judge with on this target: one first round asking for
/// log-probabilities (with [`crate::core::solo::TOP_LOGPROBS`] alternatives), and
/// whether the engine is batch-invariant. `ok` when log-probabilities came back with
/// alternatives (margins known); otherwise the detail says what the oracle falls back to.
/// The second result is the warning `bisect check` notes where the engines are not all
/// batch-invariant (the fix names the engine's deterministic mode).
pub(super) async fn logprobs_row(
    plan: &CheckPlan<'_>,
    workload: &Workload,
    http: &reqwest::Client,
) -> (UrlCheck, Option<String>) {
    let target = plan.target;
    let url = format!("{}/chat/completions", target.api.trim_end_matches('/'));
    let mut asking = workload.clone();
    let extra = &mut asking.request.extra;
    extra.insert("logprobs".into(), true.into());
    extra.insert(
        "top_logprobs".into(),
        crate::core::solo::TOP_LOGPROBS.into(),
    );
    let drive = DrivePlan {
        api: target.api.clone(),
        model: target.model.clone(),
        api_key: plan.api_key.clone(),
        workload: asking.clone(),
        label: "check".into(),
        repeat: 0,
        sessions: 1,
        concurrency: 1,
        oracle: None,
    };
    let tokens = match target.classifier(&asking) {
        Ok(classifier) => {
            crate::driver::toolprobe::first_round_tokens(&drive, Arc::new(classifier))
                .await
                .map_err(|e| format!("{e:#}"))
        }
        Err(e) => Err(format!("{e:#}")),
    };
    let mut reports = std::collections::BTreeMap::new();
    for role in &target.roles {
        if let Some(doc) =
            crate::control::fetch_server_info(http, role, plan.api_key.as_deref()).await
        {
            reports.insert(role.name.clone(), doc);
        }
    }
    let determinism = crate::control::determinism::read(target, &reports);
    let deterministic = determinism.describe();
    let warning = (!determinism.batch_invariant()).then(|| {
        format!(
            "warning: --oracle solo: the engine is {deterministic}\n  fix: {}",
            target.engine.deterministic_fix()
        )
    });
    let (ok, served) = match tokens {
        Ok(Some(tokens)) if tokens.iter().any(|t| t.margin().is_some()) => (
            true,
            format!("served ({} tokens with alternatives): --oracle solo compares tokens and margins", tokens.len()),
        ),
        Ok(Some(_)) => (
            false,
            "served without alternatives: --oracle solo knows no margins, so every parting diverges".to_string(),
        ),
        Ok(None) => (
            false,
            "not served: --oracle solo compares texts only (exact match), every difference diverges".to_string(),
        ),
        Err(why) => (false, format!("not asked: {why}")),
    };
    let row = UrlCheck {
        role: "api".into(),
        kind: "logprobs".into(),
        url,
        ok,
        detail: format!("log-probabilities {served}; the engine is {deterministic}"),
    };
    (row, warning)
}

/// SGLang's own word on its tool-call parser: `tool_call_parser` in its server info.
/// `None` for other engines and documents without the key.
pub(super) fn sglang_parser(
    engine: Engine,
    role: &RoleSpec,
    doc: &serde_json::Value,
) -> Option<Result<String, (String, String)>> {
    if engine != Engine::Sglang {
        return None;
    }
    let reported = doc.get("tool_call_parser")?;
    Some(match reported.as_str() {
        Some(name) if !name.is_empty() => Ok(format!("tool_call_parser = {name}")),
        _ => Err((
            format!(
                "tool_call_parser = {reported}: SGLang parses no tool call without one, so every DSML call comes back as content (leak) in both arms and no flag could be implicated"
            ),
            format!(
                "add --tool-call-parser to {} (DeepSeek V4: deepseekv4; V3.2: deepseekv32), restart the role",
                role.launch.display()
            ),
        )),
    })
}
