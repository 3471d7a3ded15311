//! HTTP side of both roles (axum): decode's OpenAI `POST /v1/chat/completions`, prefill's
//! `POST /internal/prefill`, and on both `/health`, `/metrics` (Prometheus text) and
//! `/server_info`. Compute runs on dedicated threads; handlers only queue work and
//! wait. A handler dropped by a disconnecting client cancels its work.

use super::backend::Backend;
use super::decode::{DecodeEngine, DecodeJob};
use super::model::{self, Finish, SequenceKv};
use super::prefill::{PrefillCore, PrefillCounters, PrefillGauges};
use super::template::ChatRequest;
use super::tokenizer::Vocab;
use super::transfer::{self, PrefillRequest};
use super::{dsml, EngineConfig, Role};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    (
        status,
        Json(json!({"error": {"message": message.into(), "type": kind, "code": status.as_u16()}})),
    )
        .into_response()
}

/// Sets a flag when dropped (the handler future was dropped: client gone).
struct CancelOnDrop(Arc<AtomicBool>, bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

// ---------------------------------------------------------------- prefill role

type PrefillReply = oneshot::Sender<Result<Vec<u8>, String>>;
/// A queued prefill request: id, prompt tokens, reply channel, cancellation flag.
type PrefillSubmission = (u64, Vec<u32>, PrefillReply, Arc<AtomicBool>);

struct PrefillShared {
    incoming: Mutex<Vec<PrefillSubmission>>,
    wake: Condvar,
    gauges: Mutex<PrefillGauges>,
    counters: Mutex<PrefillCounters>,
    next_id: AtomicU64,
    checksum: bool,
    ready: AtomicBool,
}

fn prefill_loop(
    shared: Arc<PrefillShared>,
    mut core: PrefillCore,
    backend: Box<dyn Backend>,
    floor: Duration,
) {
    let mut waiting: HashMap<u64, (PrefillReply, Arc<AtomicBool>)> = HashMap::new();
    loop {
        {
            let mut incoming = shared.incoming.lock();
            while incoming.is_empty() && !core.has_work() {
                shared.wake.wait(&mut incoming);
            }
            for (id, tokens, reply, cancelled) in incoming.drain(..) {
                core.submit(id, tokens);
                waiting.insert(id, (reply, cancelled));
            }
        }
        let gone: Vec<u64> = waiting
            .iter()
            .filter(|(_, (reply, cancelled))| {
                cancelled.load(Ordering::Relaxed) || reply.is_closed()
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            core.cancel(id);
            waiting.remove(&id);
        }
        let started = Instant::now();
        match core.step(backend.as_ref()) {
            Ok(shipped) => {
                for (id, result) in shipped {
                    if let Some((reply, _)) = waiting.remove(&id) {
                        if let Ok(kv) = &result {
                            if kv.stale_index_pages > 0 {
                                tracing::debug!(
                                    request = id,
                                    pages = kv.stale_index_pages,
                                    "shipping index-K pages whose load-back is still running"
                                );
                            }
                        }
                        let _ = reply.send(result.map(|kv| transfer::encode(&kv, shared.checksum)));
                    }
                }
            }
            Err(error) => {
                tracing::error!("prefill step failed: {error:#}");
                for (_, (reply, _)) in waiting.drain() {
                    let _ = reply.send(Err(format!("prefill step failed: {error:#}")));
                }
            }
        }
        *shared.gauges.lock() = core.gauges();
        *shared.counters.lock() = core.counters.clone();
        let elapsed = started.elapsed();
        if elapsed < floor && core.has_work() {
            // Modelled forward duration (see EngineTuning::prefill_step_floor_us).
            std::thread::sleep(floor - elapsed);
        }
    }
}

async fn prefill_handler(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return error_response(rejection.status(), rejection.body_text()),
    };
    let Some(shared) = state.prefill.clone() else {
        return error_response(StatusCode::NOT_FOUND, "this is not a prefill server");
    };
    let request: PrefillRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("bad prefill request: {error}"),
            )
        }
    };
    if request.tokens.is_empty() {
        return error_response(StatusCode::BAD_REQUEST, "empty prompt");
    }
    if request.index_k_dtype != state.config.flags.dtype().name() {
        tracing::warn!(decode = %request.index_k_dtype, prefill = state.config.flags.dtype().name(), "index-K dtype differs from decode's; decode will refuse this payload");
    }
    let (reply, receive) = oneshot::channel();
    let cancelled = Arc::new(AtomicBool::new(false));
    let mut guard = CancelOnDrop(cancelled.clone(), false);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared
        .incoming
        .lock()
        .push((id, request.tokens, reply, cancelled));
    shared.wake.notify_one();
    let result = receive.await;
    guard.1 = true;
    match result {
        Ok(Ok(payload)) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            payload,
        )
            .into_response(),
        Ok(Err(message)) => error_response(StatusCode::SERVICE_UNAVAILABLE, message),
        Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "prefill worker stopped"),
    }
}

// ---------------------------------------------------------------- decode role

struct DecodeShared {
    engine: Arc<DecodeEngine>,
    vocab: Vocab,
    client: reqwest::Client,
    prefill_url: String,
    /// Last health probe of prefill: None = reachable, Some(reason) otherwise.
    prefill_down: Mutex<Option<String>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    requests: AtomicU64,
    checksum_mismatches: AtomicU64,
    checksum_matches: AtomicU64,
    stale_pages_received: AtomicU64,
    transfer_errors: AtomicU64,
    next_id: AtomicU64,
}

async fn fetch_prompt_kv(
    shared: &DecodeShared,
    tokens: &[u32],
    dtype: super::backend::IndexKDtype,
) -> Result<transfer::Received, Response> {
    let url = format!("{}/internal/prefill", shared.prefill_url);
    let request = PrefillRequest {
        tokens: tokens.to_vec(),
        index_k_dtype: dtype.name().to_string(),
    };
    let response = shared
        .client
        .post(&url)
        .json(&request)
        .send()
        .await
        .map_err(|error| {
            shared.transfer_errors.fetch_add(1, Ordering::Relaxed);
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("prefill at {} is unreachable: {error}", shared.prefill_url),
            )
        })?;
    let status = response.status();
    let body = response.bytes().await.map_err(|error| {
        error_response(
            StatusCode::BAD_GATEWAY,
            format!("reading the KV transfer from {url} failed: {error}"),
        )
    })?;
    if !status.is_success() {
        shared.transfer_errors.fetch_add(1, Ordering::Relaxed);
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(error_response(
            StatusCode::BAD_GATEWAY,
            format!("prefill returned {status}: {message}"),
        ));
    }
    transfer::decode(&body, dtype).map_err(|error| {
        shared.transfer_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!("{error}");
        error_response(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    })
}

async fn chat_handler(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return error_response(rejection.status(), rejection.body_text()),
    };
    let Some(shared) = state.decode.clone() else {
        return error_response(
            StatusCode::NOT_FOUND,
            "this is the prefill role: send chat requests to decode",
        );
    };
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("malformed request body: {error}"),
            )
        }
    };
    let conversation = match request.validate() {
        Ok(conversation) => conversation,
        Err(error) => return error_response(StatusCode::BAD_REQUEST, error.to_string()),
    };
    let (prompt, generation) = model::prepare(&conversation, &shared.vocab);
    let dtype = state.config.flags.dtype();
    let received = match fetch_prompt_kv(&shared, &prompt, dtype).await {
        Ok(received) => received,
        Err(response) => return response,
    };
    if let Some(mismatch) = received.checksum_mismatch() {
        let counter = if mismatch {
            &shared.checksum_mismatches
        } else {
            &shared.checksum_matches
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!(sent = ?received.header.index_k_crc32, received = ?received.received_crc32, tokens = prompt.len(), "index-K transfer checksum");
    }
    shared
        .stale_pages_received
        .fetch_add(received.kv.stale_index_pages as u64, Ordering::Relaxed);
    if received.kv.tokens.len() != prompt.len() {
        return error_response(
            StatusCode::BAD_GATEWAY,
            "prefill returned KV for a different prompt length",
        );
    }
    let sequence = SequenceKv {
        truth: prompt.clone(),
        stored_tokens: received.kv.tokens,
        main: received.kv.main,
        index_k: received.kv.index_k,
    };
    let cancelled = Arc::new(AtomicBool::new(false));
    let mut guard = CancelOnDrop(cancelled.clone(), false);
    let (reply, receive) = oneshot::channel();
    let streaming = request.stream == Some(true);
    let (tokens, token_stream) = if streaming {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    shared.engine.submit(DecodeJob {
        generation,
        sequence,
        cancelled,
        reply,
        tokens,
        streamed: 0,
    });
    if let Some(token_stream) = token_stream {
        let model_name = request
            .model
            .clone()
            .unwrap_or_else(|| "bisect-mini-dsv4".to_string());
        return stream_completion(
            shared,
            model_name,
            prompt.len(),
            token_stream,
            receive,
            guard,
        );
    }
    let result = receive.await;
    guard.1 = true;
    let generation = match result {
        Ok(Ok(generation)) => generation,
        Ok(Err(error)) => {
            return error_response(StatusCode::INTERNAL_SERVER_ERROR, format!("{error:#}"))
        }
        Err(_) => {
            return error_response(StatusCode::INTERNAL_SERVER_ERROR, "decode worker stopped")
        }
    };
    let text = shared.vocab.decode(&generation.emitted);
    let parsed = dsml::parse(&text);
    let finish_reason = finish_reason(&generation, &parsed);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared.requests.fetch_add(1, Ordering::Relaxed);
    shared
        .prompt_tokens
        .fetch_add(prompt.len() as u64, Ordering::Relaxed);
    shared
        .completion_tokens
        .fetch_add(generation.emitted.len() as u64, Ordering::Relaxed);
    let tool_calls = (!parsed.tool_calls.is_empty()).then(|| tool_calls_json(&parsed));
    let message = json!({"role": "assistant", "content": parsed.content, "tool_calls": tool_calls, "reasoning_content": null});
    let usage = json!({"prompt_tokens": prompt.len(), "completion_tokens": generation.emitted.len(), "total_tokens": prompt.len() + generation.emitted.len()});
    let created = chrono::Utc::now().timestamp();
    let model_name = request
        .model
        .clone()
        .unwrap_or_else(|| "bisect-mini-dsv4".to_string());
    Json(json!({
        "id": format!("chatcmpl-{id}"),
        "object": "chat.completion",
        "created": created,
        "model": model_name,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }))
    .into_response()
}

/// OpenAI `finish_reason` of a finished generation.
fn finish_reason(generation: &model::Generation, parsed: &dsml::ParsedOutput) -> &'static str {
    match (generation.finish, parsed.tool_calls.is_empty()) {
        (Some(Finish::Length), _) => "length",
        (_, false) => "tool_calls",
        _ => "stop",
    }
}

/// OpenAI `tool_calls` of a parsed reply (the `index` key serves streaming deltas and is
/// ignored by non-streaming clients).
fn tool_calls_json(parsed: &dsml::ParsedOutput) -> Vec<Value> {
    parsed
        .tool_calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            json!({"index": index, "id": format!("call_{index}"), "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}})
        })
        .collect()
}

/// Where DSML markup starts in streamed text: content before it streams token by token,
/// the markup is held back and sent as `tool_calls` once the whole reply is parsed (as
/// sglang's streaming detector does); markup that never parses goes out as content.
const DSML_START: &str = "<｜DSML｜";

/// Length of the longest suffix of `text` that could still grow into [`DSML_START`].
fn pending_markup_prefix(text: &str) -> usize {
    (1..DSML_START.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && DSML_START.is_char_boundary(n)
                && DSML_START.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// SSE body of a streaming chat completion: one `chat.completion.chunk` per generated
/// token of plain text, the tool calls in one delta at the end, then the finish reason
/// with usage, then `[DONE]`. A client that disconnects drops the body, which cancels
/// the request in the decode loop.
fn stream_completion(
    shared: Arc<DecodeShared>,
    model_name: String,
    prompt_tokens: usize,
    mut token_stream: tokio::sync::mpsc::UnboundedReceiver<u32>,
    receive: oneshot::Receiver<anyhow::Result<model::Generation>>,
    guard: CancelOnDrop,
) -> Response {
    let (events, body) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(64);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        // The whole guard moves into the task (not just the field it sets): dropping it
        // early, with the task, is what cancels the request when the client goes away.
        let mut guard = guard;
        let created = chrono::Utc::now().timestamp();
        let chunk = |delta: Value, finish: Option<&str>| {
            let chunk = json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk", "created": created,
                "model": model_name, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            format!("data: {chunk}\n\n")
        };
        if events
            .send(Ok(chunk(json!({"role": "assistant"}), None)))
            .await
            .is_err()
        {
            return;
        }
        let mut emitted = Vec::new();
        let mut sent = 0usize;
        let mut markup = false;
        while let Some(token) = token_stream.recv().await {
            emitted.push(token);
            let text = shared.vocab.decode(&emitted);
            if !markup {
                let safe = match text.find(DSML_START) {
                    Some(at) => {
                        markup = true;
                        at
                    }
                    None => text.len() - pending_markup_prefix(&text),
                };
                if safe > sent {
                    let delta = json!({"content": &text[sent..safe]});
                    sent = safe;
                    if events.send(Ok(chunk(delta, None))).await.is_err() {
                        return; // client gone: dropping the guard cancels the request
                    }
                }
            }
        }
        let generation = match receive.await {
            Ok(Ok(generation)) => generation,
            Ok(Err(error)) => {
                let error = json!({"error": {"message": format!("{error:#}")}});
                let _ = events
                    .send(Ok(format!("data: {error}\n\ndata: [DONE]\n\n")))
                    .await;
                return;
            }
            Err(_) => {
                let error = json!({"error": {"message": "decode worker stopped"}});
                let _ = events
                    .send(Ok(format!("data: {error}\n\ndata: [DONE]\n\n")))
                    .await;
                return;
            }
        };
        guard.1 = true;
        let text = shared.vocab.decode(&generation.emitted);
        let parsed = dsml::parse(&text);
        let mut deltas = Vec::new();
        if parsed.tool_calls.is_empty() {
            if text.len() > sent {
                deltas.push(json!({"content": &text[sent..]}));
            }
        } else {
            deltas.push(json!({"tool_calls": tool_calls_json(&parsed)}));
            // Text after the block (the parser's content past what already streamed).
            if let Some(rest) = parsed.content.as_deref().and_then(|c| c.get(sent..)) {
                if !rest.is_empty() {
                    deltas.push(json!({"content": rest}));
                }
            }
        }
        let finish = finish_reason(&generation, &parsed);
        shared.requests.fetch_add(1, Ordering::Relaxed);
        shared
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        shared
            .completion_tokens
            .fetch_add(generation.emitted.len() as u64, Ordering::Relaxed);
        for delta in deltas {
            if events.send(Ok(chunk(delta, None))).await.is_err() {
                return;
            }
        }
        let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": generation.emitted.len(),
            "total_tokens": prompt_tokens + generation.emitted.len()});
        let last = json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk", "created": created,
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage});
        let _ = events
            .send(Ok(format!("data: {last}\n\ndata: [DONE]\n\n")))
            .await;
    });
    let body = futures::stream::unfold(body, |mut body| async move {
        body.recv().await.map(|event| (event, body))
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

async fn watch_prefill(shared: Arc<DecodeShared>) {
    loop {
        let url = format!("{}/health", shared.prefill_url);
        let state = match shared
            .client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!(
                "prefill at {} is not ready (HTTP {})",
                shared.prefill_url,
                response.status()
            )),
            Err(error) => Some(format!(
                "prefill at {} is unreachable: {error}",
                shared.prefill_url
            )),
        };
        *shared.prefill_down.lock() = state;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ---------------------------------------------------------------- both roles

struct AppState {
    config: EngineConfig,
    device: String,
    prefill: Option<Arc<PrefillShared>>,
    decode: Option<Arc<DecodeShared>>,
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if let Some(prefill) = &state.prefill {
        if !prefill.ready.load(Ordering::Relaxed) {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "starting", "reason": "prefill worker not started"})),
            )
                .into_response();
        }
    }
    if let Some(decode) = &state.decode {
        if let Some(reason) = decode.prefill_down.lock().clone() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "reason": reason})),
            )
                .into_response();
        }
    }
    Json(json!({"status": "ok", "role": state.config.role})).into_response()
}

fn metrics_text(state: &AppState) -> String {
    let mut out = String::new();
    let mut line = |name: &str, kind: &str, value: f64| {
        out.push_str(&format!("# TYPE {name} {kind}\n{name} {value}\n"));
    };
    if let Some(prefill) = &state.prefill {
        let gauges = *prefill.gauges.lock();
        let counters = prefill.counters.lock().clone();
        line("sglang:num_running_reqs", "gauge", gauges.running as f64);
        line("sglang:num_queue_reqs", "gauge", gauges.queued as f64);
        line(
            "sglang:token_usage",
            "gauge",
            gauges.used_pages as f64 / gauges.total_pages.max(1) as f64,
        );
        line(
            "sglang:cache_hit_rate",
            "gauge",
            counters.cached_tokens as f64 / counters.prompt_tokens.max(1) as f64,
        );
        line("sglang:gen_throughput", "gauge", 0.0);
        line(
            "bisect_engine_prompt_tokens_total",
            "counter",
            counters.prompt_tokens as f64,
        );
        line(
            "bisect_engine_cached_tokens_total",
            "counter",
            counters.cached_tokens as f64,
        );
        line(
            "bisect_engine_computed_tokens_total",
            "counter",
            counters.computed_tokens as f64,
        );
        line(
            "bisect_engine_hicache_loadbacks_total",
            "counter",
            counters.loadback_requests as f64,
        );
        line(
            "bisect_engine_hicache_loadback_pages_total",
            "counter",
            counters.loadback_pages as f64,
        );
        line(
            "bisect_engine_evicted_pages_total",
            "counter",
            counters.evicted_pages as f64,
        );
        line(
            "bisect_engine_dropped_pages_total",
            "counter",
            counters.dropped_pages as f64,
        );
        line(
            "bisect_engine_stale_index_k_reads_total",
            "counter",
            counters.stale_index_k_pages as f64,
        );
        line(
            "bisect_engine_stale_index_k_requests_total",
            "counter",
            counters.stale_index_k_requests as f64,
        );
        line(
            "bisect_engine_loader_bytes_total",
            "counter",
            counters.loader_bytes as f64,
        );
        line(
            "bisect_engine_host_pages",
            "gauge",
            gauges.host_pages as f64,
        );
        line(
            "bisect_engine_loader_jobs",
            "gauge",
            gauges.loader_jobs as f64,
        );
    }
    if let Some(decode) = &state.decode {
        let stats = &decode.engine.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        line("sglang:num_running_reqs", "gauge", load(&stats.running));
        line("sglang:num_queue_reqs", "gauge", load(&stats.queued));
        line(
            "sglang:token_usage",
            "gauge",
            load(&stats.used_tokens) / decode.engine.pool_tokens.max(1) as f64,
        );
        line("sglang:cache_hit_rate", "gauge", 0.0);
        line(
            "sglang:gen_throughput",
            "gauge",
            f64::from_bits(stats.throughput_bits.load(Ordering::Relaxed)),
        );
        line(
            "bisect_engine_requests_total",
            "counter",
            load(&decode.requests),
        );
        line(
            "bisect_engine_prompt_tokens_total",
            "counter",
            load(&decode.prompt_tokens),
        );
        line(
            "bisect_engine_completion_tokens_total",
            "counter",
            load(&decode.completion_tokens),
        );
        line(
            "bisect_engine_aborted_requests_total",
            "counter",
            load(&stats.aborted),
        );
        line(
            "bisect_engine_eager_decode_steps_total",
            "counter",
            load(&stats.eager_steps),
        );
        line(
            "bisect_engine_graph_decode_steps_total",
            "counter",
            load(&stats.graph_steps),
        );
        line(
            "bisect_engine_index_k_checksum_match_total",
            "counter",
            load(&decode.checksum_matches),
        );
        line(
            "bisect_engine_index_k_checksum_mismatch_total",
            "counter",
            load(&decode.checksum_mismatches),
        );
        line(
            "bisect_engine_stale_index_k_pages_received_total",
            "counter",
            load(&decode.stale_pages_received),
        );
        line(
            "bisect_engine_transfer_errors_total",
            "counter",
            load(&decode.transfer_errors),
        );
    }
    out
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics_text(&state),
    )
        .into_response()
}

async fn server_info(State(state): State<Arc<AppState>>) -> Response {
    let config = &state.config;
    let mut info = json!({
        "role": config.role,
        "device": state.device,
        "index_k_dtype": config.flags.dtype().name(),
        "index_k_bytes_per_token": config.flags.dtype().bytes_per_token(),
        "flags": {
            super::ENV_BF16_INDEX_K: config.flags.bf16_index_k as u8,
            super::ENV_INDEX_K_HICACHE_SYNC: config.flags.index_k_hicache_sync as u8,
            super::ENV_MMA_FLASHMLA: config.flags.mma_flashmla as u8,
            super::ENV_TOPK_V2: config.flags.topk_v2 as u8,
            "enable_hierarchical_cache": config.flags.hierarchical_cache,
            "cuda_graph_max_bs": config.flags.cuda_graph_max_bs,
            "index_k_checksum": config.flags.index_k_checksum,
        },
        "tuning": config.tuning,
        "prefill_url": config.prefill_url,
    });
    if let Some(prefill) = &state.prefill {
        let gauges = *prefill.gauges.lock();
        info["pool"] = json!({"device_pages": gauges.total_pages, "page_tokens": config.tuning.page_tokens, "pool_bytes": config.tuning.pool_bytes});
    }
    if let Some(decode) = &state.decode {
        info["pool"] = json!({"decode_pool_tokens": decode.engine.pool_tokens, "page_tokens": decode.engine.page_tokens});
    }
    Json(info).into_response()
}

/// Serve one role until the process is killed.
pub async fn serve(config: EngineConfig, backend: Box<dyn Backend>) -> anyhow::Result<()> {
    let address = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("binding {address}"))?;
    tracing::info!("{:?} role listening on http://{address}", config.role);
    serve_listener(config, backend, listener).await
}

/// Serve one role on an already bound listener.
pub async fn serve_listener(
    config: EngineConfig,
    backend: Box<dyn Backend>,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<()> {
    let device = backend.name().to_string();
    let mut state = AppState {
        config: config.clone(),
        device,
        prefill: None,
        decode: None,
    };
    match config.role {
        Role::Prefill => {
            let shared = Arc::new(PrefillShared {
                incoming: Mutex::new(Vec::new()),
                wake: Condvar::new(),
                gauges: Mutex::new(PrefillGauges::default()),
                counters: Mutex::new(PrefillCounters::default()),
                next_id: AtomicU64::new(0),
                checksum: config.flags.index_k_checksum,
                ready: AtomicBool::new(false),
            });
            let core = PrefillCore::new(config.prefill_options());
            *shared.gauges.lock() = core.gauges();
            let floor = Duration::from_micros(config.tuning.prefill_step_floor_us);
            let worker = shared.clone();
            std::thread::Builder::new()
                .name("prefill-compute".into())
                .spawn(move || prefill_loop(worker, core, backend, floor))
                .context("starting the prefill compute thread")?;
            shared.ready.store(true, Ordering::Relaxed);
            state.prefill = Some(shared);
        }
        Role::Decode => {
            let prefill_url = config
                .prefill_url
                .clone()
                .context("the decode role needs --prefill-url (where the prefill role listens)")?
                .trim_end_matches('/')
                .to_string();
            let engine =
                DecodeEngine::new(config.tuning.decode_pool_tokens, config.tuning.page_tokens);
            let worker = engine.clone();
            let path = config.read_path();
            let max_running = config.tuning.max_running;
            std::thread::Builder::new()
                .name("decode-compute".into())
                .spawn(move || worker.run(backend, path, max_running))
                .context("starting the decode compute thread")?;
            let shared = Arc::new(DecodeShared {
                engine,
                vocab: Vocab::new(),
                client: reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .context("building the HTTP client")?,
                prefill_down: Mutex::new(Some(format!("prefill at {prefill_url} not probed yet"))),
                prefill_url,
                prompt_tokens: AtomicU64::new(0),
                completion_tokens: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                checksum_mismatches: AtomicU64::new(0),
                checksum_matches: AtomicU64::new(0),
                stale_pages_received: AtomicU64::new(0),
                transfer_errors: AtomicU64::new(0),
                next_id: AtomicU64::new(0),
            });
            tokio::spawn(watch_prefill(shared.clone()));
            state.decode = Some(shared);
        }
    }
    let max_body = config.tuning.max_body_bytes;
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/server_info", get(server_info))
        .route("/v1/chat/completions", post(chat_handler))
        .route("/internal/prefill", post(prefill_handler))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(Arc::new(state));
    axum::serve(listener, app).await.context("serving HTTP")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::backend::cpu::CpuBackend;
    use super::super::sim;
    use super::super::{DeviceChoice, EngineFlags, EngineTuning};
    use super::*;

    fn config(role: Role, bf16: bool, prefill_url: Option<String>) -> EngineConfig {
        let env = move |name: &str| {
            (name == super::super::ENV_BF16_INDEX_K)
                .then(|| if bf16 { "1" } else { "0" }.to_string())
        };
        EngineConfig {
            role,
            host: "127.0.0.1".into(),
            port: 0,
            prefill_url,
            device: DeviceChoice::Cpu,
            flags: EngineFlags::from_env(&env, true, 32, true).unwrap(),
            tuning: EngineTuning {
                prefill_step_floor_us: 0,
                ..EngineTuning::default()
            },
        }
    }

    async fn start(config: EngineConfig) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve_listener(
            config,
            Box::new(CpuBackend::new()),
            listener,
        ));
        url
    }

    fn chat_body(max_tokens: i64) -> Value {
        let tools: Vec<Value> = sim::sim_tools()
            .into_iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
            .collect();
        json!({
            "model": "m", "max_tokens": max_tokens, "tools": tools,
            "messages": [{"role": "user", "content": "Do this:\n1. read_file(path=\"/srv/app/config.yaml\", max_lines=40)\nWhen every step is done, reply exactly: DONE: all steps completed."}]
        })
    }

    /// Reassemble an SSE chat stream into (content, tool_calls, finish_reason, events).
    fn assemble(sse: &str) -> (String, Vec<Value>, String, usize) {
        let (mut content, mut calls, mut finish, mut events) =
            (String::new(), Vec::new(), String::new(), 0);
        for line in sse.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            events += 1;
            let chunk: Value = serde_json::from_str(data).unwrap();
            let choice = &chunk["choices"][0];
            if let Some(text) = choice["delta"]["content"].as_str() {
                content.push_str(text);
            }
            if let Some(list) = choice["delta"]["tool_calls"].as_array() {
                calls.extend(list.iter().cloned());
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        (content, calls, finish, events)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streaming_matches_the_non_streaming_reply() {
        let prefill = start(config(Role::Prefill, true, None)).await;
        let decode = start(config(Role::Decode, true, Some(prefill.clone()))).await;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let chat = format!("{decode}/v1/chat/completions");
        let wait = std::time::Instant::now();
        while client
            .get(format!("{decode}/health"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
            != 200
        {
            assert!(wait.elapsed().as_secs() < 20, "decode never became healthy");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let plain: Value = client
            .post(&chat)
            .json(&chat_body(256))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let message = &plain["choices"][0]["message"];
        let mut body = chat_body(256);
        body["stream"] = json!(true);
        let response = client.post(&chat).json(&body).send().await.unwrap();
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let sse = response.text().await.unwrap();
        assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
        let (content, calls, finish, events) = assemble(&sse);
        assert_eq!(
            finish,
            plain["choices"][0]["finish_reason"].as_str().unwrap()
        );
        assert_eq!(content, message["content"].as_str().unwrap_or(""));
        let plain_calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(calls.len(), plain_calls.len(), "{sse}");
        for (streamed, whole) in calls.iter().zip(&plain_calls) {
            assert_eq!(streamed["function"], whole["function"]);
        }

        // A final text answer streams token by token: many content events.
        let mut done = chat_body(64);
        done["messages"] = json!([
            done["messages"][0],
            {"role": "assistant", "content": null, "tool_calls": plain_calls},
            {"role": "tool", "tool_call_id": "call_0", "content": "listen: 0.0.0.0:8080"}
        ]);
        let plain: Value = client
            .post(&chat)
            .json(&done)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        done["stream"] = json!(true);
        let sse = client
            .post(&chat)
            .json(&done)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let (content, calls, finish, events_text) = assemble(&sse);
        assert!(calls.is_empty());
        assert_eq!(finish, "stop");
        assert_eq!(
            content,
            plain["choices"][0]["message"]["content"].as_str().unwrap()
        );
        assert!(
            events_text > 4,
            "token by token, got {events_text} events: {sse}"
        );
        assert!(events >= 3);
    }

    #[test]
    fn markup_prefix_is_held_back() {
        assert_eq!(pending_markup_prefix("hello"), 0);
        assert_eq!(pending_markup_prefix("hello <"), 1);
        assert_eq!(pending_markup_prefix("x<｜"), "<｜".len());
        assert_eq!(pending_markup_prefix("x<｜D"), "<｜D".len());
        assert_eq!(pending_markup_prefix("x<y"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn end_to_end_over_http_with_bad_requests_and_dtype_mismatch() {
        let prefill = start(config(Role::Prefill, true, None)).await;
        let decode = start(config(Role::Decode, true, Some(prefill.clone()))).await;
        // No pooled connections: the 413 below makes the server drop its connection, and a
        // reused pooled one could race with that close.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let chat = format!("{decode}/v1/chat/completions");
        let response: Value = client
            .post(&chat)
            .json(&chat_body(256))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let message = &response["choices"][0]["message"];
        assert_eq!(
            response["choices"][0]["finish_reason"], "tool_calls",
            "{response}"
        );
        assert_eq!(message["tool_calls"][0]["function"]["name"], "read_file");
        let arguments: Value = serde_json::from_str(
            message["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            arguments,
            json!({"path": "/srv/app/config.yaml", "max_lines": 40})
        );
        assert!(message["content"].is_null());

        let truncated = client.post(&chat).json(&chat_body(3)).send().await.unwrap();
        let truncated: Value = truncated.json().await.unwrap();
        assert_eq!(truncated["choices"][0]["finish_reason"], "length");

        for (body, status) in [
            (b"{not json".to_vec(), 400u16),
            (serde_json::to_vec(&chat_body(0)).unwrap(), 400),
            (serde_json::to_vec(&json!({"messages": [{"role": "wizard", "content": "x"}], "tools": chat_body(1)["tools"]})).unwrap(), 400),
            (serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "x"}]})).unwrap(), 400),
            (vec![b' '; 10 << 20], 413),
        ] {
            let response = client.post(&chat).header("content-type", "application/json").body(body).send().await.unwrap();
            assert_eq!(response.status().as_u16(), status);
            let error: Value = response.json().await.unwrap();
            assert!(error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
        }

        let metrics = client
            .get(format!("{prefill}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("sglang:num_running_reqs")
                && metrics.contains("bisect_engine_stale_index_k_reads_total")
        );
        let decode_metrics = client
            .get(format!("{decode}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            decode_metrics.contains("bisect_engine_index_k_checksum_match_total 2"),
            "{decode_metrics}"
        );
        let info: Value = client
            .get(format!("{decode}/server_info"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(info["flags"]["SGLANG_DSV4_BF16_INDEX_K"], 1);

        // A decode configured for fp8 against a bf16 prefill refuses the transfer.
        let mismatched = start(config(Role::Decode, false, Some(prefill.clone()))).await;
        let response = client
            .post(format!("{mismatched}/v1/chat/completions"))
            .json(&chat_body(64))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 500);
        let error: Value = response.json().await.unwrap();
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("index-K dtype mismatch: prefill sends bf16, decode expects fp8_e4m3"));

        // Prefill unreachable: 503 naming it, and /health says so.
        let orphan = start(config(
            Role::Decode,
            true,
            Some("http://127.0.0.1:9".into()),
        ))
        .await;
        let response = client
            .post(format!("{orphan}/v1/chat/completions"))
            .json(&chat_body(64))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 503);
        let health = client.get(format!("{orphan}/health")).send().await.unwrap();
        assert_eq!(health.status().as_u16(), 503);
        let reason: Value = health.json().await.unwrap();
        assert!(reason["reason"]
            .as_str()
            .unwrap()
            .contains("prefill at http://127.0.0.1:9"));
    }
}
