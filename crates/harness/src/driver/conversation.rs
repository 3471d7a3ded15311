//! One session against a live server (docs/design.md 3.4/3.5): filler + task message, then up
//! to `rounds` requests. Each reply is classified against the current step and recorded
//! in [`SessionProgress`], which decides how the session ends (shared with `bisect
//! reclassify`); an ok tool call gets its simulated result and the session goes on.
//!
//! When one ok reply carries several calls, every call gets its tool message (the chat
//! API requires an answer per call id) but the task advances one step: the classifier
//! judges a round against one expected call.

use super::barrier::BarrierSeat;
use super::body::Transcript;
use super::client::{ChatClient, ChatOutcome, Connection, InFlight, WaveSeat};
use crate::config::Workload;
use crate::core::classify::{account_for_truncation, Classifier, RoundOutcome};
use crate::core::ending::{Flow, SessionProgress};
use crate::core::session::{
    ChatMessage, HttpReply, RoundClass, RoundRecord, SessionResult, SessionTiming, ToolCall,
};
use crate::core::task::{initial_conversation, Task};
use crate::core::tools::{simulate, tool_message};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything the sessions of one arm block share.
pub(crate) struct SessionContext {
    pub workload: Arc<Workload>,
    /// The chat endpoint, with the workload's tools, sampling and request options.
    pub client: ChatClient,
    pub classifier: Arc<Classifier>,
    pub inflight: Arc<InFlight>,
    pub label: String,
    pub repeat: u32,
    /// Nanoseconds spent classifying replies, all sessions of the block together (the
    /// run's phase accounting).
    pub(crate) classify_ns: std::sync::atomic::AtomicU64,
    /// The solo oracle: each finished session is compared with the same session alone.
    pub oracle: Option<Arc<Oracle>>,
    /// The clocks each session's timing is read against.
    pub timeline: Timeline,
}

/// The block's and the engine life's start, and which life this is: what a session's
/// [`SessionTiming`] is measured from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeline {
    pub life: u32,
    pub block_started: Instant,
    pub life_started: Instant,
}

impl Timeline {
    /// Life 0 of a block starting now.
    pub(crate) fn now() -> Self {
        let now = Instant::now();
        Timeline {
            life: 0,
            block_started: now,
            life_started: now,
        }
    }

    /// The timing of a session whose first request was the `request_seq`-th sent to
    /// this life, at `started`, and that ended now.
    fn of(&self, started: Instant, request_seq: u64) -> SessionTiming {
        SessionTiming {
            life: self.life,
            started_s: started
                .saturating_duration_since(self.block_started)
                .as_secs_f64(),
            uptime_s: started
                .saturating_duration_since(self.life_started)
                .as_secs_f64(),
            request_seq,
            ended_s: self.block_started.elapsed().as_secs_f64(),
        }
    }
}

/// The solo oracle of one block: every session's reference (the same session run alone
/// on the same configuration), by index, and the near-tie threshold.
#[derive(Debug)]
pub struct Oracle {
    pub references: std::collections::HashMap<u32, SessionResult>,
    pub threshold: f64,
}

impl Oracle {
    /// Judge `session` against its reference (core::solo::judge); a session with no
    /// reference (the reference failed there) is left as the classifier judged it.
    pub fn judge(&self, session: &mut SessionResult) {
        if let Some(reference) = self.references.get(&session.index) {
            crate::core::solo::judge(session, reference, self.threshold);
        }
    }
}

/// A finished session plus the per-round client latency at microsecond resolution
/// (the driver's percentiles; `SessionResult` keeps milliseconds), and the harness's
/// own turn-around between rounds: from a reply's arrival to the next request's send
/// (classifying, answering the tool calls, waiting at the barrier if any).
#[derive(Debug, Clone)]
pub(crate) struct SessionRun {
    pub result: SessionResult,
    pub(crate) round_latency_us: Vec<u64>,
    pub(crate) send_lag_us: Vec<u64>,
}

/// A session ready for its first round: its task and opening messages, serialised.
pub(crate) struct Prepared {
    index: u32,
    task: Task,
    transcript: Transcript,
}

impl Prepared {
    /// Session `index` of `workload` (the same task in every arm and repeat).
    pub fn new(workload: &Workload, index: u32) -> Self {
        let (task, messages) = initial_conversation(workload, index);
        Prepared {
            index,
            task,
            transcript: Transcript::new(messages),
        }
    }
}

/// Runs a session to its end on `connection` (its slot's). `seat` is its place at the
/// round barrier, if the workload has one; dropping the future (cancellation) leaves
/// the barrier.
pub(crate) async fn run_session(
    ctx: &SessionContext,
    session: Prepared,
    seat: Option<BarrierSeat<'_>>,
    connection: &mut Connection,
    mut wave: Option<WaveSeat>,
) -> SessionRun {
    let workload = &*ctx.workload;
    let Prepared {
        index,
        task,
        mut transcript,
    } = session;
    let mut progress = SessionProgress::new(task.steps.len());
    let mut round_latency_us = Vec::new();
    let mut send_lag_us = Vec::new();
    let mut replied_at: Option<Instant> = None;
    let mut completion_tokens = 0u64;
    let mut error = None;
    // Requests this life had been sent before the session's first, and when it began.
    let (first_seq, began) = (ctx.inflight.sent(), Instant::now());

    for round in 1..=workload.rounds {
        let started = Instant::now();
        if let Some(replied) = replied_at {
            send_lag_us.push(started.duration_since(replied).as_micros() as u64);
        }
        let outcome = ctx
            .client
            .complete(connection, &transcript, &ctx.inflight, wave.take())
            .await;
        let replied = Instant::now();
        replied_at = Some(replied);
        let elapsed = replied.duration_since(started);
        round_latency_us.push(elapsed.as_micros() as u64);

        let step = progress.step();
        let judged = judge_round(ctx, &task, step, round, outcome, elapsed);
        if judged.error.is_some() {
            error = judged.error;
        }
        completion_tokens += judged.record.completion_tokens;
        let (record, reply) = (judged.record, judged.reply);
        if progress.record(record, reply.as_ref()) == Flow::Stop {
            transcript.extend(reply);
            break;
        }
        // The session goes on only after an ok reply with tool calls.
        let mut reply = reply.expect("a session goes on only after a reply");
        let calls = reply.tool_calls.as_deref_mut().unwrap_or_default();
        let answers = answer_calls(workload, &task, index, step, round, calls);
        transcript.push(reply);
        transcript.extend(answers);
        if round < workload.rounds {
            if let Some(seat) = &seat {
                seat.wait().await;
            }
        }
    }
    drop(seat);

    let ending = progress.finish(workload.rounds);
    let latency_ms = ending.latency_ms();
    let mut result = SessionResult {
        label: ctx.label.clone(),
        repeat: ctx.repeat,
        index,
        class: ending.class,
        rounds_used: ending.rounds.len() as u32,
        first_bad_round: ending.first_bad_round,
        evidence: ending.evidence,
        transcript: transcript.into_messages(),
        latency_ms,
        rounds: ending.rounds,
        completion_tokens,
        error,
        oracle: None,
        timing: Some(ctx.timeline.of(began, first_seq)),
    };
    if let Some(oracle) = &ctx.oracle {
        oracle.judge(&mut result);
    }
    SessionRun {
        result,
        round_latency_us,
        send_lag_us,
    }
}

/// Session `index`'s first round alone, judged as a session's is (the tool-call probe,
/// docs/design.md 3.13): the same request, tools and classifier, on a connection of its
/// own, counted in `ctx.inflight`.
pub(crate) async fn first_round(ctx: &SessionContext, index: u32) -> RoundRecord {
    let Prepared {
        task, transcript, ..
    } = Prepared::new(&ctx.workload, index);
    let mut connection = Connection::new();
    let started = Instant::now();
    let outcome = ctx
        .client
        .complete(&mut connection, &transcript, &ctx.inflight, None)
        .await;
    judge_round(ctx, &task, 0, 1, outcome, started.elapsed()).record
}

/// One round's reply judged: its record, the reply message if one came, and the error
/// text of a failed round (a rejection is evidence, not an error).
struct Judged {
    record: RoundRecord,
    reply: Option<ChatMessage>,
    error: Option<String>,
}

/// Classifies round `round`'s `outcome` against the task's `step` (the time it takes
/// counted in `ctx.classify_ns`) and records it.
fn judge_round(
    ctx: &SessionContext,
    task: &Task,
    step: usize,
    round: u32,
    outcome: ChatOutcome,
    elapsed: Duration,
) -> Judged {
    let workload = &*ctx.workload;
    let judged = match &outcome {
        ChatOutcome::Reply(reply) => RoundOutcome::Reply(&reply.message),
        ChatOutcome::Error(text) => RoundOutcome::Error(text.clone()),
        ChatOutcome::Status {
            status,
            body,
            partial,
        } => RoundOutcome::Status {
            status: status.as_u16(),
            body,
            error: status_error(*status, body),
            partial: partial.as_deref(),
        },
        ChatOutcome::Timeout => RoundOutcome::Timeout,
    };
    let classify_started = Instant::now();
    let verdict =
        ctx.classifier
            .classify(&judged, task.expected(step).as_ref(), workload.check_args);
    ctx.classify_ns.fetch_add(
        classify_started.elapsed().as_nanos() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    let mut http = None;
    let mut error = None;
    let mut logprobs = None;
    let (reply, tokens, finish_reason) = match outcome {
        ChatOutcome::Reply(reply) => {
            logprobs = reply.tokens;
            (
                Some(reply.message),
                reply.completion_tokens,
                reply.finish_reason,
            )
        }
        ChatOutcome::Error(text) => {
            error = Some(text);
            (None, 0, None)
        }
        ChatOutcome::Status {
            status,
            body,
            partial,
        } => {
            // A rejection is evidence, not a failure: its body is the round's
            // evidence, and the session keeps no error text.
            if verdict.class == RoundClass::Error {
                error = Some(status_error(status, &body));
            }
            http = Some(HttpReply {
                status: status.as_u16(),
                body,
                partial,
            });
            (None, 0, None)
        }
        ChatOutcome::Timeout => {
            error = Some(format!("no response within {} s", workload.timeout_s));
            (None, 0, None)
        }
    };
    let verdict = account_for_truncation(verdict, finish_reason.as_deref());
    Judged {
        record: RoundRecord {
            round,
            class: verdict.class,
            latency_ms: elapsed.as_millis() as u64,
            completion_tokens: tokens,
            evidence: verdict.evidence,
            finish_reason,
            http,
            logprobs,
        },
        reply,
        error,
    }
}

/// A non-2xx reply as an error text: the status and the body's first 200 characters,
/// as the client has always reported it.
pub(crate) fn status_error(status: hyper::StatusCode, body: &str) -> String {
    let head = match body.char_indices().nth(200) {
        Some((end, _)) => &body[..end],
        None => body,
    };
    format!("HTTP {status}: {head}")
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
