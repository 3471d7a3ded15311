//! Test-only HTTP engines: a router served on a free loopback port, and an engine whose
//! self-report wants the API key, for the tests of the paths that read it (the arm
//! lifecycle, engine control, `bisect check`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;

/// The key the keyed test engines want.
pub const KEY: &str = "sk-test";

/// Serves `app` on a free loopback port until the test's runtime ends.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Whether a request carries `Bearer KEY`.
pub(crate) fn authed(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {KEY}"))
}

/// An engine whose health answers anyone but whose self-report (`/config`, and
/// `/server_info` beside its health URL) answers only `Bearer KEY`, with a new pid at
/// every read (as an engine restarted between two reads would).
pub(crate) async fn keyed_engine() -> SocketAddr {
    let reads = Arc::new(AtomicU64::new(0));
    let report = move |h: HeaderMap| {
        let reads = reads.clone();
        async move {
            if !authed(&h) {
                return Err(StatusCode::UNAUTHORIZED);
            }
            let pid = 100 + reads.fetch_add(1, Ordering::SeqCst);
            Ok(axum::Json(serde_json::json!({"pid": pid})))
        }
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/config", get(report.clone()))
        .route("/server_info", get(report));
    serve(app).await
}

/// A conformance fixture in the engines' own words (tests/fixtures/engines/, whose
/// README says where each came from).
pub(crate) use bisect_core::testing::engine_fixture;
