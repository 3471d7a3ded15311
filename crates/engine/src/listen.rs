//! Connection-level HTTP/1.1 serving shared by both engine roles and the mock: the
//! accept loop, the per-connection timeouts and the connection cap (`axum::serve` has
//! none of these, so one slow or stuck client could hold a connection forever).
//!
//! - A new connection must deliver its first request's headers within
//!   [`HttpLimits::header_read_timeout_ms`] or it is closed (slow-loris).
//! - A kept-alive connection that stays idle longer than
//!   [`HttpLimits::idle_timeout_ms`] is closed. This is hyper's header-read timer,
//!   which hyper restarts whenever a connection goes idle after a response, so it also
//!   bounds how long a later request's headers may take.
//! - Beyond [`HttpLimits::max_connections`] open connections, a new connection is
//!   answered `503` and closed; beyond twice the cap it is closed unanswered, so a flood
//!   cannot exhaust file descriptors through the rejection path either.
//!
//! Requests in flight are not timed out here: a decode request legitimately runs as
//! long as its generation does.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use serde_json::json;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Connection limits of one HTTP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HttpLimits {
    /// A new connection's first request headers must arrive within this.
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection idle for longer than this is closed.
    pub idle_timeout_ms: u64,
    /// Open connections beyond this get `503 Service Unavailable`.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    /// 10 s for headers (no real client needs more on loopback), 60 s idle (longer
    /// than a round barrier usually holds a session's connection), and 4096
    /// connections: a thousand-session workload plus decode's connections to prefill.
    fn default() -> Self {
        HttpLimits {
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_connections: 4096,
        }
    }
}

impl HttpLimits {
    fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms.max(1))
    }

    fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.max(self.header_read_timeout_ms).max(1))
    }
}

/// One open connection, counted until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serve `app` on `listener` under `limits` until `shutdown` completes; then stop
/// accepting, and let every open connection finish its request in flight and close.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let _stop_connections = stop.clone().drop_guard();
    let reject = Router::new().fallback(|| async {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"message": "too many open connections", "type": "server_error", "code": 503}})),
        )
            .into_response()
    });
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    accept_error(error).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let count = open.fetch_add(1, Ordering::SeqCst) + 1;
        let slot = Slot(open.clone());
        let (service, keep_alive) = if count <= limits.max_connections {
            (app.clone(), true)
        } else if count <= limits.max_connections.saturating_mul(2) {
            (reject.clone(), false)
        } else {
            continue; // dropping the stream closes it
        };
        let connection =
            serve_connection(stream, service, limits.clone(), keep_alive, stop.clone());
        tokio::spawn(async move {
            connection.await;
            drop(slot);
        });
    }
}

/// Errors of one connection (the peer reset it before accept) are not the listener's;
/// anything else (out of file descriptors) gets a short pause instead of a busy loop.
async fn accept_error(error: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::warn!("accepting a connection failed: {error}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: HttpLimits,
    keep_alive: bool,
    stop: CancellationToken,
) {
    let requested = Arc::new(AtomicBool::new(false));
    let seen = requested.clone();
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        seen.store(true, Ordering::Relaxed);
        app.clone().oneshot(request.map(Body::new))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout())
        .keep_alive(keep_alive);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let first_headers = tokio::time::sleep(limits.header_read_timeout());
    let mut first_headers = std::pin::pin!(first_headers);
    let (mut checked, mut stopping) = (false, false);
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!("HTTP connection ended: {error}");
                }
                return;
            }
            _ = &mut first_headers, if !checked => {
                checked = true;
                if !requested.load(Ordering::Relaxed) {
                    tracing::debug!("closing a connection that sent no request headers in time");
                    return;
                }
            }
            _ = stop.cancelled(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
