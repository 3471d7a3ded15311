//! One session's state machine (DESIGN.md 3.4/3.5): filler + task message, then up to
//! `rounds` requests. Each reply is classified against the current step; an ok tool
//! call gets its simulated result and advances the step, an ok text answer after the
//! last step ends the session `done`, the first non-ok round ends it with that class,
//! and running out of rounds ends it `maxrounds`.
//!
//! When one ok reply carries several calls, every call gets its tool message (the chat
//! API requires an answer per call id) but the task advances one step: the classifier
//! judges a round against one expected call.

use super::barrier::BarrierSeat;
use super::client::{ChatClient, ChatOutcome, InFlight, Sampling};
use crate::config::Workload;
use crate::core::classify::{Classifier, RoundOutcome};
use crate::core::session::{
    ChatMessage, RoundClass, RoundRecord, SessionClass, SessionResult, ToolCall,
};
use crate::core::task::{initial_conversation, Task};
use crate::core::tools::{simulate, tool_message};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Everything the sessions of one arm block share.
pub struct SessionContext {
    pub workload: Arc<Workload>,
    pub client: ChatClient,
    /// The OpenAI `tools` array, built once.
    pub tools_payload: Vec<Value>,
    pub classifier: Arc<Classifier>,
    pub inflight: Arc<InFlight>,
    pub label: String,
    pub repeat: u32,
}

/// A finished session plus the per-round client latency at microsecond resolution
/// (the driver's percentiles; `SessionResult` keeps milliseconds).
#[derive(Debug, Clone)]
pub struct SessionRun {
    pub result: SessionResult,
    pub round_latency_us: Vec<u64>,
}

/// Runs session `index` to its end. `seat` is its place at the round barrier, if the
/// workload has one; dropping the future (cancellation) leaves the barrier.
pub async fn run_session(
    ctx: &SessionContext,
    index: u32,
    seat: Option<BarrierSeat<'_>>,
) -> SessionRun {
    let workload = &*ctx.workload;
    let (task, mut messages) = initial_conversation(workload, index);
    let sampling = Sampling {
        max_tokens: workload.max_tokens,
        temperature: workload.temperature,
    };
    let mut step = 0usize;
    let mut rounds: Vec<RoundRecord> = Vec::new();
    let mut round_latency_us = Vec::new();
    let mut completion_tokens = 0u64;
    let mut ending: Option<(SessionClass, String, Option<String>)> = None;

    for round in 1..=workload.rounds {
        let started = Instant::now();
        let outcome = ctx
            .client
            .complete(&messages, &ctx.tools_payload, sampling, &ctx.inflight)
            .await;
        let elapsed = started.elapsed();
        round_latency_us.push(elapsed.as_micros() as u64);

        let expected = task.expected(step);
        let (verdict, reply, tokens, error) = match &outcome {
            ChatOutcome::Reply(reply) => (
                ctx.classifier.classify(
                    &RoundOutcome::Reply(&reply.message),
                    expected.as_ref(),
                    workload.check_args,
                ),
                Some(reply.message.clone()),
                reply.completion_tokens,
                None,
            ),
            ChatOutcome::Error(text) => (
                ctx.classifier.classify(
                    &RoundOutcome::Error(text.clone()),
                    expected.as_ref(),
                    workload.check_args,
                ),
                None,
                0,
                Some(text.clone()),
            ),
            ChatOutcome::Timeout => (
                ctx.classifier.classify(
                    &RoundOutcome::Timeout,
                    expected.as_ref(),
                    workload.check_args,
                ),
                None,
                0,
                Some(format!("no response within {} s", workload.timeout_s)),
            ),
        };
        completion_tokens += tokens;
        rounds.push(RoundRecord {
            round,
            class: verdict.class,
            latency_ms: elapsed.as_millis() as u64,
            completion_tokens: tokens,
            evidence: verdict.evidence.clone(),
        });

        if verdict.class != RoundClass::Ok {
            if let Some(reply) = reply {
                messages.push(reply);
            }
            let class = SessionClass::from_round(verdict.class).expect("non-ok round class");
            ending = Some((class, verdict.evidence, error));
            break;
        }
        let Some(mut reply) = reply else {
            // A classifier that calls a transport failure ok is a bug; never loop on it.
            ending = Some((SessionClass::Error, verdict.evidence, error));
            break;
        };
        match reply.tool_calls.as_mut().filter(|calls| !calls.is_empty()) {
            Some(calls) => {
                let answers = answer_calls(workload, &task, index, step, round, calls);
                messages.push(reply);
                messages.extend(answers);
                step = (step + 1).min(task.steps.len());
            }
            None => {
                messages.push(reply);
                ending = Some((SessionClass::Done, verdict.evidence, None));
                break;
            }
        }
        if round < workload.rounds {
            if let Some(seat) = &seat {
                seat.wait().await;
            }
        }
    }
    drop(seat);

    let (class, evidence, error) = ending.unwrap_or_else(|| {
        (
            SessionClass::Maxrounds,
            format!(
                "{} of {} steps done when the {} rounds ran out",
                step,
                task.steps.len(),
                workload.rounds
            ),
            None,
        )
    });
    let first_bad_round = rounds
        .iter()
        .find(|r| r.class != RoundClass::Ok)
        .map(|r| r.round);
    SessionRun {
        result: SessionResult {
            label: ctx.label.clone(),
            repeat: ctx.repeat,
            index,
            class,
            rounds_used: rounds.len() as u32,
            first_bad_round,
            evidence,
            transcript: messages,
            latency_ms: rounds.iter().map(|r| r.latency_ms).collect(),
            rounds,
            completion_tokens,
            error,
        },
        round_latency_us,
    }
}

/// Simulated tool messages for every call of an ok reply. Calls without an id get a
/// stable one, written into the reply too so the transcript stays consistent.
fn answer_calls(
    workload: &Workload,
    task: &Task,
    index: u32,
    step: usize,
    round: u32,
    calls: &mut [ToolCall],
) -> Vec<ChatMessage> {
    calls
        .iter_mut()
        .enumerate()
        .map(|(i, call)| {
            if call.id.is_empty() {
                call.id = format!("call_{index}_{round}_{i}");
            }
            let content = match workload.tools.iter().find(|t| t.name == call.function.name) {
                Some(tool) => {
                    let fallback = task
                        .steps
                        .get(step)
                        .map(|s| s.args.clone())
                        .unwrap_or_default();
                    simulate(tool, call, &fallback)
                }
                None => format!("error: no tool named {:?}", call.function.name),
            };
            tool_message(&call.id, content)
        })
        .collect()
}
