//! The OpenAI chat client of the workload: one `POST {api}/chat/completions` per round,
//! non-streaming or (workload `stream = true`) server-sent events assembled into one
//! message the way OpenAI's client libraries do ([`assemble_stream`]: content and
//! reasoning concatenated, tool-call deltas joined by their `index`, the last
//! `finish_reason`, usage from the final chunk), with the workload's `tool_choice` and
//! extra fields in the body, and transport problems sorted into the round outcomes of
//! docs/design.md 3.5 (timeout; error: connect failure, non-2xx status, unparseable
//! body or stream). Also [`InFlight`], the client-side in-flight request counter the
//! metrics poller samples and run.json reports as `peak_running.client`.

pub(crate) use super::body::Sampling;
use super::body::{RequestTemplate, Transcript};
use super::connect::{ConnectFailure, ConnectGate};
use crate::config::workload::RequestOptions;
use crate::config::ToolSpec;
use crate::core::oracle::TokenChoice;
use crate::core::session::ChatMessage;
use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

/// How much of a reply hyper reads at a time ([`ChatClient::connect`]).
const READ_BUFFER: usize = 1024;

/// A deadline for a timeout too long to add to now: 30 years, as tokio's own.
const FAR_FUTURE: Duration = Duration::from_secs(86400 * 365 * 30);

/// Requests currently in flight from this client, and the most seen at once; also the
/// drive's connect pacer, whose connects in progress the metrics poller samples beside
/// the requests in flight (where a gap to the engine's count is).
#[derive(Debug, Default)]
pub struct InFlight {
    current: AtomicU64,
    peak: AtomicU64,
    /// The most requests in flight since the last [`InFlight::take_recent_peak`]: the
    /// client's own count around an engine's death, which the death watch notices only
    /// after the requests it cut have already left `current`.
    recent_peak: AtomicU64,
    /// Chat requests sent so far (each counted as it is sent): a session's request index.
    sent: AtomicU64,
    /// Role -> the engine's last sampled running-requests gauge (the metrics poller's),
    /// recorded beside the client's count at a death.
    engine_running: parking_lot::Mutex<std::collections::BTreeMap<String, f64>>,
    gate: std::sync::Arc<ConnectGate>,
}

impl InFlight {
    pub fn new() -> Self {
        Self::default()
    }

    /// Connection set-up paced by `gate` (the default paces as [`super::connect::Pacing`]
    /// says; benchmarks compare against an unpaced one).
    pub fn with_gate(gate: ConnectGate) -> Self {
        InFlight {
            gate: std::sync::Arc::new(gate),
            ..Self::default()
        }
    }

    /// The pacer all connections of this client's drive go through.
    pub fn gate(&self) -> &ConnectGate {
        &self.gate
    }

    /// Connects in progress now.
    pub fn connecting(&self) -> u64 {
        self.gate.connecting()
    }

    /// Counts one request until the guard drops (also when its future is cancelled).
    pub(crate) fn enter(&self) -> InFlightGuard<'_> {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.recent_peak.fetch_max(now, Ordering::SeqCst);
        self.sent.fetch_add(1, Ordering::SeqCst);
        InFlightGuard { counter: self }
    }

    /// The most requests in flight since the last call (at least those in flight now),
    /// starting the next window from the current level.
    pub(crate) fn take_recent_peak(&self) -> u64 {
        let now = self.current();
        self.recent_peak.swap(now, Ordering::SeqCst).max(now)
    }

    /// Chat requests sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Keep `role`'s last sampled running gauge.
    pub(crate) fn note_engine_running(&self, role: &str, running: f64) {
        self.engine_running.lock().insert(role.to_string(), running);
    }

    /// `role`'s last sampled running gauge, if the poller read one.
    pub(crate) fn engine_running(&self, role: &str) -> Option<f64> {
        self.engine_running.lock().get(role).copied()
    }

    pub fn current(&self) -> u64 {
        self.current.load(Ordering::SeqCst)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }

    /// Starts a new peak measurement (one per arm) from the current level.
    #[cfg(test)]
    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::SeqCst);
    }
}

pub(crate) struct InFlightGuard<'a> {
    counter: &'a InFlight,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.counter.current.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A parsed reply: `choices[0].message`, `choices[0].finish_reason`,
/// `usage.completion_tokens` (0 when absent), `usage.prompt_tokens` and
/// `choices[0].logprobs`.
#[derive(Debug, Clone)]
pub(crate) struct ChatReply {
    pub message: ChatMessage,
    pub completion_tokens: u64,
    /// The engine's count of the request's prompt, where it served one (pressure's
    /// sizing reads it: core::pressure::Tokens::counted).
    pub prompt_tokens: Option<u64>,
    pub finish_reason: Option<String>,
    /// The reply's tokens with their log-probabilities, where the request asked for
    /// them and the engine served them (the solo oracle's evidence, core::oracle).
    pub tokens: Option<Vec<TokenChoice>>,
}

/// What one request came to, before classification.
#[derive(Debug, Clone)]
pub(crate) enum ChatOutcome {
    Reply(ChatReply),
    /// Connect failure, unparseable body.
    Error(String),
    /// A non-2xx reply: its status and the first `HTTP_BODY_KEPT` characters of its
    /// body (the API key masked). The classifier decides whether it is the engine
    /// rejecting the model's tool call (`rejected`) or an `error`. Also an error event
    /// inside a 200 event stream ([`assemble_stream`]): then `status` is the event's
    /// code, `body` the event, and `partial` what the reply had streamed before it.
    Status {
        status: StatusCode,
        body: String,
        partial: Option<String>,
    },
    /// No complete response within the per-request timeout.
    Timeout,
}

/// The OpenAI `tools` array for a workload's tool specs.
pub fn tools_payload(tools: &[ToolSpec]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            serde_json::json!({
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                }
            })
        })
        .collect()
}

/// One HTTP/1.1 connection to the engine, owned by one driver slot and kept alive
/// across its rounds and sessions. A slot has at most one request in flight, so a
/// connection of its own is all it needs: no pool to check out from, and no second
/// connection opened because the first had not yet been handed back (a shared pool did
/// that for most sessions at 1000 in flight, each one an extra accept on the engine).
/// Empty until the first request; dropped and reopened after any failure.
///
/// The connection's I/O (hyper's dispatcher) runs in the slot's own task, polled while
/// the slot waits on it, not in a task of its own: one task per session instead of two,
/// and no wake-up passed between them twice a request: at 1000 sessions in flight their
/// state no longer fits in a core's cache, and every task and wake-up a request touches
/// costs (docs/design.md 3.4, docs/performance.md "Harness speed").
#[derive(Default)]
pub struct Connection {
    link: Link,
    /// The request timeout: one timer per slot, moved forward at each request.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The open connection itself: hyper's request handle and the connection's I/O.
#[derive(Default)]
struct Link {
    sender: Option<http1::SendRequest<Full<Bytes>>>,
    /// hyper's dispatcher for this connection, polled by the slot's own task while it
    /// waits on the connection ([`Link::drive`]); None when closed (or spawned).
    io: Option<Pin<Box<Io>>>,
}

type Io = http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>;

impl Connection {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the connection is open, as far as can be seen without waiting: a close
    /// by the server is noticed here only if its end of file has already arrived.
    pub(crate) fn is_open(&mut self) -> bool {
        if let Some(io) = &mut self.link.io {
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            if io.as_mut().poll(&mut cx).is_ready() {
                self.link.io = None;
            }
        }
        self.link.sender.as_ref().is_some_and(|s| !s.is_closed())
    }
}

impl Link {
    fn close(&mut self) {
        self.sender = None;
        self.io = None;
    }

    /// Awaits `future` (a step of a request on this connection) while polling the
    /// connection's I/O in the same task.
    ///
    /// Everything `future` waits for is produced by the connection, which is polled right
    /// before it here, so `future` is polled with a no-op waker: hyper's channels between
    /// the request handle and the connection would otherwise wake this very task for
    /// nothing (each such wake-up re-queues the task behind every other ready one, a cold
    /// re-poll at 1000 in flight). Before it returns pending, the connection is polled
    /// once more with the task's waker, so every wake-up that means progress (socket
    /// readiness, `future` taking data the connection waits to hand over) reaches the task.
    async fn drive<F: Future>(io: &mut Option<Pin<Box<Io>>>, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        std::future::poll_fn(|cx| {
            let mut quiet = std::task::Context::from_waker(futures::task::noop_waker_ref());
            for register in [false, true] {
                let Some(connection) = io else {
                    return future.as_mut().poll(cx);
                };
                let polled = if register {
                    connection.as_mut().poll(cx)
                } else {
                    connection.as_mut().poll(&mut quiet)
                };
                if polled.is_ready() {
                    // Closed: whatever `future` waits for is now settled (an error).
                    *io = None;
                    return future.as_mut().poll(cx);
                }
                if let Poll::Ready(output) = future.as_mut().poll(&mut quiet) {
                    return Poll::Ready(output);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Why a request got no reply.
enum Failure {
    Timeout,
    Error(String),
}

/// One engine's chat endpoint: where it is, the fixed parts of every request body, and
/// the limits. Cheap to share; the connections are the slots' ([`Connection`]).
#[derive(Debug, Clone)]
pub(crate) struct ChatClient {
    url: String,
    /// Host name or address to connect to (IPv6 without brackets) and port.
    host: String,
    port: u16,
    /// `Host` header and request target (origin form), computed once.
    host_header: HeaderValue,
    path: Uri,
    /// `Bearer <key>`, marked sensitive.
    authorization: Option<HeaderValue>,
    api_key: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    model: String,
    template: RequestTemplate,
    stream: bool,
}

impl ChatClient {
    /// `api` is the OpenAI base URL (`http://host:port/v1`); plain HTTP only (bisect is
    /// built without TLS), no proxies (the engine is usually on loopback), no redirects
    /// (an engine answers its chat endpoint itself: a redirect is a misconfigured URL,
    /// reported as the HTTP status it is). Requests carry no tools and default sampling
    /// until [`ChatClient::with_request`].
    pub fn new(
        api: &str,
        model: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let url = format!("{}/chat/completions", api.trim_end_matches('/'));
        let parsed = reqwest::Url::parse(&url).with_context(|| format!("chat URL {url}"))?;
        if parsed.scheme() != "http" {
            anyhow::bail!(
                "chat URL {url}: bisect's workload client speaks plain http only (it is built without TLS)\n  fix: point the target's api at the engine's http:// address"
            );
        }
        let Some(host) = parsed.host_str() else {
            anyhow::bail!("chat URL {url} has no host");
        };
        let port = parsed
            .port_or_known_default()
            .with_context(|| format!("chat URL {url} has no port"))?;
        let host_header = match parsed.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        let host_header = HeaderValue::from_str(&host_header)
            .with_context(|| format!("chat URL {url}: host {host_header:?}"))?;
        let target = match parsed.query() {
            Some(query) => format!("{}?{query}", parsed.path()),
            None => parsed.path().to_string(),
        };
        let path = Uri::try_from(target.as_str())
            .with_context(|| format!("chat URL {url}: path {target:?}"))?;
        let authorization = match &api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                    anyhow::anyhow!(
                        "the API key holds characters an HTTP header cannot carry (control characters or non-ASCII)\n  fix: check the key's environment variable for a stray newline"
                    )
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let sampling = Sampling {
            max_tokens: 0,
            temperature: 0.0,
        };
        let options = RequestOptions::default();
        Ok(ChatClient {
            template: RequestTemplate::new(model, &[], sampling, &options),
            url: parsed.to_string(),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            host_header,
            path,
            authorization,
            api_key,
            timeout,
            connect_timeout: timeout.min(Duration::from_secs(30)),
            model: model.to_string(),
            stream: false,
        })
    }

    /// What every request of a workload carries besides the conversation: the `tools`
    /// array, sampling limits, `tool_choice`, extra fields, streaming.
    pub(crate) fn with_request(
        mut self,
        tools: &[Value],
        sampling: Sampling,
        options: &RequestOptions,
    ) -> Self {
        self.template = RequestTemplate::new(&self.model, tools, sampling, options);
        self.stream = options.stream;
        self
    }

    #[cfg(test)]
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Sends one round on `connection` (opening it if needed) and sorts what came back;
    /// never fails otherwise. The timeout covers connecting, sending and reading the
    /// whole reply.
    ///
    /// With `wave` (a slot's first request), the reply is handed back only once every
    /// slot of the wave has dispatched its first request ([`FirstWave`]); the timeout
    /// still runs from the send.
    pub async fn complete(
        &self,
        connection: &mut Connection,
        transcript: &Transcript,
        inflight: &InFlight,
        wave: Option<WaveSeat>,
    ) -> ChatOutcome {
        let _counted = inflight.enter();
        let body = self.template.body(transcript);
        let held = wave.as_ref().and_then(|seat| seat.wave.clone());
        let mut seat = wave;
        let now = tokio::time::Instant::now();
        let round_deadline = now
            .checked_add(self.timeout)
            .unwrap_or_else(|| now + FAR_FUTURE);
        let exchanged = loop {
            let Connection { link, deadline } = &mut *connection;
            let deadline =
                deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(self.timeout)));
            // A timer moved later is not re-registered (one atomic store), where a timeout
            // per request inserted an entry into the runtime's timer wheel and removed it.
            deadline.as_mut().reset(round_deadline);
            let exchanged = tokio::select! {
                biased;
                exchanged = self.exchange(link, body.clone(), &mut seat, inflight.gate(), round_deadline) => exchanged,
                () = deadline.as_mut() => Err(Failure::Timeout),
            };
            // A server shedding load (429/503) that says when to come back is asked
            // again then, within the round's timeout, as OpenAI's client libraries do:
            // the request was refused, not served, so sending it again sends nothing
            // twice. Without Retry-After, or past the deadline, the reply stands.
            let wait = match &exchanged {
                Ok((status, retry_after, _)) if matches!(status.as_u16(), 429 | 503) => {
                    let fits = retry_after
                        .filter(|wait| tokio::time::Instant::now() + *wait < round_deadline);
                    inflight.gate().note_shed(fits.is_some());
                    fits
                }
                _ => None,
            };
            let Some(wait) = wait else {
                break exchanged;
            };
            tokio::time::sleep(wait).await;
        };
        // A request that never went out (no connection) counts as sent here, or the
        // wave would wait for it forever.
        drop(seat);
        if let Some(wave) = &held {
            wave.all_sent.cancelled().await;
        }
        let (status, _, bytes) = match exchanged {
            Ok(reply) => reply,
            Err(Failure::Timeout) => {
                connection.link.close();
                return ChatOutcome::Timeout;
            }
            Err(Failure::Error(text)) => {
                connection.link.close();
                return ChatOutcome::Error(text);
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            // A server may echo the key it rejected: mask it before the excerpt can cut
            // it in half.
            let text = match &self.api_key {
                Some(key) => crate::redact::mask(&text, std::slice::from_ref(key)).into_owned(),
                None => text.into_owned(),
            };
            let body = excerpt(&text, crate::core::session::HTTP_BODY_KEPT).to_string();
            return ChatOutcome::Status {
                status,
                body,
                partial: None,
            };
        }
        if self.stream {
            assemble_stream(&text)
        } else {
            parse_reply(&text)
        }
    }

    /// Opens `connection` ahead of its first request; true when it is open. A failure is
    /// not reported here: the next request on it connects again and records the error.
    pub async fn open(&self, connection: &mut Connection, gate: &ConnectGate) -> bool {
        if !connection.is_open() {
            let deadline = tokio::time::Instant::now() + self.connect_timeout;
            connection.link = self.connect(gate, deadline).await.unwrap_or_default();
        }
        connection.is_open()
    }

    fn request(&self, body: Bytes) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.path.clone();
        let headers = request.headers_mut();
        headers.insert(header::HOST, self.host_header.clone());
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(value) = &self.authorization {
            headers.insert(header::AUTHORIZATION, value.clone());
        }
        request
    }

    async fn connect(
        &self,
        gate: &ConnectGate,
        deadline: tokio::time::Instant,
    ) -> Result<Link, Failure> {
        let deadline = deadline.min(tokio::time::Instant::now() + self.connect_timeout);
        let stream = match gate.connect(&self.host, self.port, deadline).await {
            Ok(stream) => stream,
            Err(ConnectFailure::Error(e)) => {
                return Err(Failure::Error(format!(
                    "connect error ({}): tcp connect error: {e}",
                    self.url
                )))
            }
            Err(ConnectFailure::Timeout) => return Err(Failure::Timeout),
        };
        // Requests are single writes; Nagle would only hold the last segment back.
        let _ = stream.set_nodelay(true);
        let (sender, io) = http1::Builder::new()
            // Replies are read 1 KiB at a time instead of into a fresh 8 KiB buffer per
            // reply (hyper allocates anew while the last reply's bytes are still held):
            // a 1 KiB block comes back from the allocator's per-thread cache, still in
            // the CPU cache, where 8 KiB blocks came from all over a heap that 1000
            // sessions had spread (callgrind's cache simulation: 11 fewer misses a request
            // at 1000 in flight). Replies longer than that take one more read per KiB.
            .read_buf_exact_size(Some(READ_BUFFER))
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.transport_error("connect error", &e))?;
        Ok(Link {
            sender: Some(sender),
            io: Some(Box::pin(io)),
        })
    }

    /// One request and its whole reply. A kept-alive connection the engine has closed
    /// in the meantime (its idle timeout) is replaced once, and only when the request
    /// was never written to it, so no request is ever sent twice.
    async fn exchange(
        &self,
        link: &mut Link,
        body: Bytes,
        seat: &mut Option<WaveSeat>,
        gate: &ConnectGate,
        deadline: tokio::time::Instant,
    ) -> Result<(StatusCode, Option<Duration>, Bytes), Failure> {
        let mut request = self.request(body);
        loop {
            let reused = link.sender.is_some();
            if !reused {
                // The opening wave holds the first replies until every slot has sent its
                // first request: a slot that must connect first leaves the wave now, so
                // no reply waits on anyone's connect (a dropped SYN costs a second).
                if let Some(seat) = seat {
                    seat.sent();
                }
                // Boxed: connecting is rare, and inline its future would make every
                // request's future (moved at each round) larger.
                *link = Box::pin(self.connect(gate, deadline)).await?;
            }
            let Link { sender, io } = link;
            let sender = sender.as_mut().expect("connected above");
            if let Err(e) = Link::drive(io, sender.ready()).await {
                link.close();
                if reused {
                    continue;
                }
                return Err(self.transport_error("request error", &e));
            }
            // The request is queued to the connection when this is called, before the
            // future is polled: that is the moment it counts as sent.
            let pending = sender.try_send_request(request);
            if let Some(seat) = seat {
                seat.sent();
            }
            match Link::drive(io, pending).await {
                Ok(response) => {
                    let status = response.status();
                    let retry_after = retry_after(response.headers());
                    let bytes = Link::drive(io, response.into_body().collect())
                        .await
                        .map_err(|e| self.transport_error("error reading the response body", &e))?
                        .to_bytes();
                    return Ok((status, retry_after, bytes));
                }
                Err(mut e) => {
                    link.close();
                    match e.take_message() {
                        Some(unsent) if reused => request = unsent,
                        _ => return Err(self.transport_error("request error", e.error())),
                    }
                }
            }
        }
    }

    fn transport_error(&self, kind: &str, error: &hyper::Error) -> Failure {
        if error.is_timeout() {
            return Failure::Timeout;
        }
        // The source chain holds the useful part ("Connection refused", "reset by peer").
        let mut detail = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(s) = source {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            source = s.source();
        }
        Failure::Error(format!("{kind} ({}): {detail}", self.url))
    }
}

/// A `Retry-After` of delay-seconds (RFC 9110 10.2.3; the HTTP-date form is not
/// honoured: engines send seconds).
fn retry_after(headers: &hyper::HeaderMap) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    let seconds: f64 = text.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

mod reply;
mod wave;

use reply::excerpt;
pub(crate) use reply::{assemble_stream, parse_reply};
pub use wave::FirstWave;
pub use wave::WaveSeat;

#[cfg(test)]
mod tests;
