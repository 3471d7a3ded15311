//! The decode role over HTTP: OpenAI `POST /v1/chat/completions` (the prompt's KV
//! comes from prefill's `/internal/prefill`, generation runs on the `DecodeEngine`'s
//! compute thread; the reply is `reply`'s, streamed by `sse`), the watcher that keeps decode's
//! `/health` honest about whether its prefill is usable, and this role's `/metrics`
//! values.

use super::reply::{Reply, ReplyShared};
use super::{error_response, sse, CancelOnDrop};
use crate::backend::{Backend, IndexKDtype};
use crate::decode::{DecodeEngine, DecodeJob};
use crate::metrics::Metric;
use crate::model::{self, SequenceKv};
use crate::template::ChatRequest;
use crate::transfer::{self, PrefillRequest, TransferError};
use crate::EngineConfig;
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The `model` of a reply when the request names none.
const DEFAULT_MODEL: &str = "bisect-mini-dsv4";
/// How often decode re-checks its prefill, and how long one check may take.
const PREFILL_CHECK_PERIOD: Duration = Duration::from_millis(500);
const PREFILL_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the HTTP side of decode shares between requests.
pub(super) struct DecodeShared {
    engine: Arc<DecodeEngine>,
    /// Shared with every reply in flight, streamed ones included.
    replies: Arc<ReplyShared>,
    client: reqwest::Client,
    prefill_url: String,
    dtype: IndexKDtype,
    /// Why decode cannot use its prefill right now (latest check); None when it can.
    prefill_problem: Mutex<Option<String>>,
    checksum_mismatches: AtomicU64,
    checksum_matches: AtomicU64,
    stale_pages_received: AtomicU64,
    transfer_errors: AtomicU64,
}

/// Start the compute thread and the prefill watcher of the decode role.
pub(super) fn start(
    config: &EngineConfig,
    backend: Box<dyn Backend>,
) -> anyhow::Result<Arc<DecodeShared>> {
    let prefill_url = config
        .prefill_url
        .clone()
        .context("the decode role needs --prefill-url (where the prefill role listens)")?
        .trim_end_matches('/')
        .to_string();
    let engine = DecodeEngine::new(config.tuning.decode_pool_tokens, config.tuning.page_tokens);
    let worker = engine.clone();
    let path = config.read_path();
    let max_running = config.tuning.max_running;
    std::thread::Builder::new()
        .name("decode-compute".into())
        .spawn(move || worker.run(backend, path, max_running))
        .context("starting the decode compute thread")?;
    // Pooled connections to prefill are dropped well before prefill's idle timeout
    // closes them, so a request never goes out on a connection being closed.
    let idle = Duration::from_millis(config.http.idle_timeout_ms / 2);
    let shared = Arc::new(DecodeShared {
        engine,
        replies: Arc::new(ReplyShared::new()),
        client: reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(idle)
            .build()
            .context("building the HTTP client")?,
        prefill_problem: Mutex::new(Some(format!("prefill at {prefill_url} not checked yet"))),
        prefill_url,
        dtype: config.flags.dtype(),
        checksum_mismatches: AtomicU64::new(0),
        checksum_matches: AtomicU64::new(0),
        stale_pages_received: AtomicU64::new(0),
        transfer_errors: AtomicU64::new(0),
    });
    tokio::spawn(watch_prefill(shared.clone()));
    Ok(shared)
}

impl DecodeShared {
    /// Why decode cannot serve now, if it cannot.
    pub(super) fn problem(&self) -> Option<String> {
        self.prefill_problem.lock().clone()
    }

    pub(super) fn pool(&self) -> Value {
        json!({"decode_pool_tokens": self.engine.pool_tokens, "page_tokens": self.engine.page_tokens})
    }

    /// This role's `/metrics` values.
    pub(super) fn metrics(&self) -> Vec<(Metric, f64)> {
        let (stats, replies) = (&self.engine.stats, &self.replies);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        vec![
            (Metric::RunningRequests, load(&stats.running)),
            (Metric::QueuedRequests, load(&stats.queued)),
            (
                Metric::TokenUsage,
                load(&stats.used_tokens) / self.engine.pool_tokens.max(1) as f64,
            ),
            (Metric::CacheHitRate, 0.0),
            (
                Metric::GenThroughput,
                f64::from_bits(stats.throughput_bits.load(Ordering::Relaxed)),
            ),
            (Metric::Requests, load(&replies.requests)),
            (Metric::PromptTokens, load(&replies.prompt_tokens)),
            (Metric::CompletionTokens, load(&replies.completion_tokens)),
            (Metric::AbortedRequests, load(&stats.aborted)),
            (Metric::EagerDecodeSteps, load(&stats.eager_steps)),
            (Metric::GraphDecodeSteps, load(&stats.graph_steps)),
            (Metric::IndexKChecksumMatches, load(&self.checksum_matches)),
            (
                Metric::IndexKChecksumMismatches,
                load(&self.checksum_mismatches),
            ),
            (
                Metric::StaleIndexKPagesReceived,
                load(&self.stale_pages_received),
            ),
            (Metric::BusySeconds, stats.busy.seconds()),
            (Metric::TransferErrors, load(&self.transfer_errors)),
        ]
    }
}

/// Re-checks forever whether prefill is usable: reachable, healthy, the prefill role,
/// and storing index-K in decode's dtype (otherwise every transfer would be refused).
async fn watch_prefill(shared: Arc<DecodeShared>) {
    loop {
        let problem = prefill_problem(&shared).await;
        *shared.prefill_problem.lock() = problem;
        tokio::time::sleep(PREFILL_CHECK_PERIOD).await;
    }
}

async fn prefill_problem(shared: &DecodeShared) -> Option<String> {
    let base = &shared.prefill_url;
    let get = |path: &str| {
        shared
            .client
            .get(format!("{base}{path}"))
            .timeout(PREFILL_CHECK_TIMEOUT)
            .send()
    };
    match get("/health").await {
        Err(error) => return Some(format!("prefill at {base} is unreachable: {error}")),
        Ok(response) if !response.status().is_success() => {
            return Some(format!(
                "prefill at {base} is not ready (HTTP {})",
                response.status()
            ))
        }
        Ok(_) => {}
    }
    let info: Value = match get("/server_info").await {
        Ok(response) if response.status().is_success() => match response.json().await {
            Ok(info) => info,
            Err(error) => {
                return Some(format!(
                    "prefill at {base}: unreadable /server_info: {error}"
                ))
            }
        },
        Ok(response) => {
            return Some(format!(
                "prefill at {base}: /server_info answered HTTP {}",
                response.status()
            ))
        }
        Err(error) => return Some(format!("prefill at {base}: /server_info failed: {error}")),
    };
    if info["role"] != "prefill" {
        return Some(format!(
            "the server at {base} is not a prefill role (role {})",
            info["role"]
        ));
    }
    let sent = info["index_k_dtype"].as_str().unwrap_or("unknown");
    (sent != shared.dtype.name()).then(|| {
        let mismatch = TransferError::DtypeMismatch {
            sent: sent.to_string(),
            expected: shared.dtype.name().to_string(),
        };
        format!("prefill at {base}: {mismatch}")
    })
}

/// The prompt's KV from prefill, checked, as decode's sequence; an error response
/// (counted as a transfer error) otherwise.
async fn receive_prompt_kv(shared: &DecodeShared, prompt: &[u32]) -> Result<SequenceKv, Response> {
    let url = format!("{}/internal/prefill", shared.prefill_url);
    let request = PrefillRequest {
        tokens: prompt.to_vec(),
        index_k_dtype: shared.dtype.name().to_string(),
    };
    let failed = |status: StatusCode, message: String| {
        shared.transfer_errors.fetch_add(1, Ordering::Relaxed);
        error_response(status, message)
    };
    let response = shared.client.post(&url).json(&request).send().await;
    let response = response.map_err(|error| {
        let message = format!("prefill at {} is unreachable: {error}", shared.prefill_url);
        failed(StatusCode::SERVICE_UNAVAILABLE, message)
    })?;
    let status = response.status();
    let body = response.bytes().await.map_err(|error| {
        let message = format!("reading the KV transfer from {url} failed: {error}");
        failed(StatusCode::BAD_GATEWAY, message)
    })?;
    if !status.is_success() {
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        let message = format!("prefill returned {status}: {message}");
        return Err(failed(StatusCode::BAD_GATEWAY, message));
    }
    let received = transfer::decode(&body, shared.dtype).map_err(|error| {
        tracing::error!("{error}");
        failed(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    })?;
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
        return Err(error_response(
            StatusCode::BAD_GATEWAY,
            "prefill returned KV for a different prompt length",
        ));
    }
    Ok(SequenceKv {
        truth: prompt.to_vec(),
        stored_tokens: received.kv.tokens,
        main: received.kv.main,
        index_k: received.kv.index_k,
    })
}

pub(super) async fn chat_handler(
    State(state): State<Arc<super::AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let not_decode = "this is the prefill role: send chat requests to decode";
    let malformed = "malformed request body";
    let (request, shared): (ChatRequest, _) =
        match super::role_request(body, &state.decode, not_decode, malformed) {
            Ok(accepted) => accepted,
            Err(response) => return *response,
        };
    let conversation = match request.validate() {
        Ok(conversation) => conversation,
        Err(error) => return error_response(StatusCode::BAD_REQUEST, error.to_string()),
    };
    let (prompt, mut generation) = model::prepare(&conversation, &shared.replies.vocab);
    if request.top_logprobs().is_some() {
        generation.keep_probs();
    }
    let sequence = match receive_prompt_kv(&shared, &prompt).await {
        Ok(sequence) => sequence,
        Err(response) => return response,
    };
    let cancelled = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop::new(cancelled.clone());
    let (reply, receive) = oneshot::channel();
    let (tokens, token_stream) = match request.stream == Some(true) {
        true => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    shared.engine.submit(DecodeJob {
        generation,
        sequence,
        cancelled,
        reply,
        tokens,
        streamed: 0,
    });
    let reply = Reply {
        shared: shared.replies.clone(),
        top_logprobs: request.top_logprobs(),
        model: request.model.unwrap_or_else(|| DEFAULT_MODEL.to_string()),
        prompt_tokens: prompt.len(),
    };
    if let Some(token_stream) = token_stream {
        return sse::stream_completion(reply, token_stream, receive, guard);
    }
    let result = receive.await;
    guard.disarm();
    match result {
        Ok(Ok(generation)) => reply.complete(&generation),
        Ok(Err(error)) => error_response(StatusCode::INTERNAL_SERVER_ERROR, format!("{error:#}")),
        Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "decode worker stopped"),
    }
}
