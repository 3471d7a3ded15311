//! HTTP side of both roles (axum on `crate::listen`'s connection handling): the
//! routes, the state they share, and the endpoints both roles serve: `/health`,
//! `/metrics` (Prometheus text from `crate::metrics`' table) and `/server_info`. The
//! role endpoints live in `decode_role` (OpenAI chat, its reply made in `reply` and
//! streamed by `sse`) and `prefill_role` (`/internal/prefill`). Compute runs on
//! dedicated threads; handlers only queue work and wait. A handler dropped by a
//! disconnecting client cancels its work.

mod decode_role;
mod prefill_role;
mod reply;
mod sse;
#[cfg(test)]
mod tests;

use crate::backend::Backend;
use crate::{listen, metrics, EngineConfig, Role};
use anyhow::Context;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use decode_role::DecodeShared;
use prefill_role::PrefillShared;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A role handler's first steps: the request body (or the rejection's response), then
/// the role's shared state (or 404 saying `not_this_role` when this server plays the
/// other role), then the body's JSON as the role's request (or 400 saying `malformed`
/// and why). The refusal is boxed: a `Response` is large and this is the rare path.
fn role_request<T: Clone, R: serde::de::DeserializeOwned>(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    role: &Option<T>,
    not_this_role: &str,
    malformed: &str,
) -> Result<(R, T), Box<Response>> {
    let body = body
        .map_err(|rejection| Box::new(error_response(rejection.status(), rejection.body_text())))?;
    let shared = role
        .clone()
        .ok_or_else(|| Box::new(error_response(StatusCode::NOT_FOUND, not_this_role)))?;
    let request = serde_json::from_slice(&body).map_err(|error| {
        let message = format!("{malformed}: {error}");
        Box::new(error_response(StatusCode::BAD_REQUEST, message))
    })?;
    Ok((request, shared))
}

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

/// Sets a request's cancellation flag when dropped unless disarmed first: a handler
/// future dropped by axum means its client went away.
struct CancelOnDrop(Option<Arc<AtomicBool>>);

impl CancelOnDrop {
    fn new(flag: Arc<AtomicBool>) -> Self {
        CancelOnDrop(Some(flag))
    }

    /// The request finished: dropping the guard no longer cancels it.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

struct AppState {
    config: EngineConfig,
    device: String,
    prefill: Option<Arc<PrefillShared>>,
    decode: Option<Arc<DecodeShared>>,
    /// When this process started serving (RFC 3339, microseconds): with `pid` in
    /// `/server_info`, how a harness tells that a restart really replaced the process.
    started_at: String,
}

/// 200 when this role can serve; 503 with the reason otherwise (decode: its prefill is
/// unreachable, unhealthy, or stores index-K in another dtype).
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let problem = if let Some(prefill) = &state.prefill {
        (!prefill.ready.load(Ordering::Relaxed))
            .then(|| ("starting", "prefill worker not started".to_string()))
    } else {
        state
            .decode
            .as_ref()
            .and_then(|decode| decode.problem())
            .map(|reason| ("unavailable", reason))
    };
    match problem {
        Some((status, reason)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": status, "reason": reason})),
        )
            .into_response(),
        None => Json(json!({"status": "ok", "role": state.config.role})).into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let values = match (&state.prefill, &state.decode) {
        (Some(prefill), _) => prefill.metrics(),
        (None, Some(decode)) => decode.metrics(),
        (None, None) => Vec::new(),
    };
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&values),
    )
        .into_response()
}

async fn server_info(State(state): State<Arc<AppState>>) -> Response {
    let config = &state.config;
    let mut info = json!({
        "role": config.role,
        "pid": std::process::id(),
        "ppid": std::os::unix::process::parent_id(),
        "started_at": state.started_at,
        "device": state.device,
        "version": concat!("bisect-engine ", env!("CARGO_PKG_VERSION")),
        "build": build(),
        "index_k_dtype": config.flags.dtype().name(),
        "index_k_bytes_per_token": config.flags.dtype().bytes_per_token(),
        "flags": {
            crate::ENV_BF16_INDEX_K: config.flags.bf16_index_k as u8,
            crate::ENV_INDEX_K_HICACHE_SYNC: config.flags.index_k_hicache_sync as u8,
            crate::ENV_MMA_FLASHMLA: config.flags.mma_flashmla as u8,
            crate::ENV_TOPK_V2: config.flags.topk_v2 as u8,
            "enable_hierarchical_cache": config.flags.hierarchical_cache,
            "cuda_graph_max_bs": config.flags.cuda_graph_max_bs,
            "index_k_checksum": config.flags.index_k_checksum,
        },
        "tuning": config.tuning,
        "http": config.http,
        "prefill_url": config.prefill_url,
    });
    if let Some(prefill) = &state.prefill {
        info["pool"] = json!({"device_pages": prefill.total_pages(), "page_tokens": config.tuning.page_tokens, "pool_bytes": config.tuning.pool_bytes});
    }
    if let Some(decode) = &state.decode {
        info["pool"] = decode.pool();
    }
    Json(info).into_response()
}

/// Which build serves: the executable's size and modification time (seconds), so a
/// harness keying cached results by the engine's build sees a rebuilt engine as another
/// (the crate's version alone stays the same across rebuilds). `None` where the
/// executable cannot be read.
fn build() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let meta = std::fs::metadata(exe).ok()?;
    let modified = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!(
        "{} bytes, modified {}",
        meta.len(),
        modified.as_secs()
    ))
}

/// Serve one role until the process is killed.
pub(crate) async fn serve(config: EngineConfig, backend: Box<dyn Backend>) -> anyhow::Result<()> {
    let address = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("binding {address}"))?;
    tracing::info!("{:?} role listening on http://{address}", config.role);
    serve_listener(config, backend, listener).await
}

/// Serve one role on an already bound listener.
pub(crate) async fn serve_listener(
    config: EngineConfig,
    backend: Box<dyn Backend>,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<()> {
    let mut state = AppState {
        config: config.clone(),
        device: backend.name().to_string(),
        prefill: None,
        decode: None,
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    };
    match config.role {
        Role::Prefill => state.prefill = Some(prefill_role::start(&config, backend)?),
        Role::Decode => state.decode = Some(decode_role::start(&config, backend)?),
    }
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/server_info", get(server_info))
        .route("/v1/chat/completions", post(decode_role::chat_handler))
        .route("/internal/prefill", post(prefill_role::prefill_handler))
        .layer(DefaultBodyLimit::max(config.tuning.max_body_bytes))
        .with_state(Arc::new(state));
    listen::serve(listener, app, config.http, std::future::pending()).await;
    Ok(())
}
