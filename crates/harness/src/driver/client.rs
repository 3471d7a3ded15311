//! The OpenAI chat client of the workload: one `POST {api}/chat/completions` per round,
//! non-streaming or (workload `stream = true`) server-sent events assembled into one
//! message the way OpenAI's client libraries do ([`assemble_stream`]: content and
//! reasoning concatenated, tool-call deltas joined by their `index`, the last
//! `finish_reason`, usage from the final chunk), with the workload's `tool_choice` and
//! extra fields in the body, and transport problems sorted into the round outcomes of
//! docs/design.md 3.5 (timeout; error: connect failure, non-2xx status, unparseable
//! body or stream). Also [`InFlight`], the client-side in-flight request counter the
//! metrics poller samples and run.json reports as `peak_running.client`.

pub use super::body::Sampling;
use super::body::{RequestTemplate, Transcript};
use super::connect::{ConnectFailure, ConnectGate};
use crate::config::workload::RequestOptions;
use crate::config::ToolSpec;
use crate::core::session::{ChatMessage, ToolCall};
use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
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
    pub fn enter(&self) -> InFlightGuard<'_> {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        InFlightGuard { counter: self }
    }

    pub fn current(&self) -> u64 {
        self.current.load(Ordering::SeqCst)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }

    /// Starts a new peak measurement (one per arm) from the current level.
    pub fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::SeqCst);
    }
}

pub struct InFlightGuard<'a> {
    counter: &'a InFlight,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.counter.current.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A parsed reply: `choices[0].message`, `choices[0].finish_reason` and
/// `usage.completion_tokens` (0 when absent).
#[derive(Debug, Clone)]
pub struct ChatReply {
    pub message: ChatMessage,
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
}

/// What one request came to, before classification.
#[derive(Debug, Clone)]
pub enum ChatOutcome {
    Reply(ChatReply),
    /// Connect failure, unparseable body.
    Error(String),
    /// A non-2xx reply: its status and the first `HTTP_BODY_KEPT` characters of its
    /// body (the API key masked). The classifier decides whether it is the engine
    /// rejecting the model's tool call (`rejected`) or an `error`.
    Status {
        status: StatusCode,
        body: String,
    },
    /// No complete response within the per-request timeout.
    Timeout,
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChatMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: u64,
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

/// First `n` characters, on a char boundary.
fn excerpt(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((end, _)) => &text[..end],
        None => text,
    }
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
    pub fn is_open(&mut self) -> bool {
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

/// The opening burst: every slot's first request is dispatched before any slot acts on
/// its first reply. Without it, against a fast server, the runtime ran the first
/// sessions' later rounds (woken tasks go first) before it had even polled the last
/// slots, and the burst of C requests never happened (185 in flight of 1000 against the
/// zero-work mock). Real engines take longer than dispatching C requests, so there it
/// changes nothing.
#[derive(Debug)]
pub struct FirstWave {
    remaining: AtomicU64,
    all_sent: tokio_util::sync::CancellationToken,
}

impl FirstWave {
    pub fn new(slots: u32) -> Self {
        let wave = FirstWave {
            remaining: AtomicU64::new(u64::from(slots)),
            all_sent: tokio_util::sync::CancellationToken::new(),
        };
        if slots == 0 {
            wave.all_sent.cancel();
        }
        wave
    }

    /// One slot's place in the wave; it counts as sent when dispatched or dropped (a
    /// slot that fails or stops before sending never holds the others).
    pub fn seat(self: &std::sync::Arc<Self>) -> WaveSeat {
        WaveSeat {
            wave: Some(self.clone()),
        }
    }

    fn arrive(&self) {
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.all_sent.cancel();
        }
    }
}

pub struct WaveSeat {
    wave: Option<std::sync::Arc<FirstWave>>,
}

impl WaveSeat {
    fn sent(&mut self) {
        if let Some(wave) = self.wave.take() {
            wave.arrive();
        }
    }
}

impl Drop for WaveSeat {
    fn drop(&mut self) {
        self.sent();
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
pub struct ChatClient {
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
    pub fn with_request(
        mut self,
        tools: &[Value],
        sampling: Sampling,
        options: &RequestOptions,
    ) -> Self {
        self.template = RequestTemplate::new(&self.model, tools, sampling, options);
        self.stream = options.stream;
        self
    }

    pub fn url(&self) -> &str {
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
            return ChatOutcome::Status { status, body };
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

/// Parses a 2xx body into a reply; anything else is an `Error` quoting the body.
pub fn parse_reply(body: &str) -> ChatOutcome {
    match serde_json::from_str::<ChatResponse>(body) {
        Ok(response) => match response.choices.into_iter().next() {
            Some(choice) => ChatOutcome::Reply(ChatReply {
                message: choice.message,
                completion_tokens: response.usage.map_or(0, |u| u.completion_tokens),
                finish_reason: choice.finish_reason,
            }),
            None => ChatOutcome::Error(format!("response has no choices: {}", excerpt(body, 200))),
        },
        Err(e) => ChatOutcome::Error(format!("unparseable body ({e}): {}", excerpt(body, 200))),
    }
}

#[derive(Deserialize)]
struct StreamChunk {
    #[serde(default)]
    choices: Vec<StreamChoice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct StreamChoice {
    #[serde(default)]
    delta: StreamDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct StreamDelta {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

fn append(slot: &mut Option<String>, piece: Option<String>) {
    if let Some(piece) = piece {
        slot.get_or_insert_with(String::new).push_str(&piece);
    }
}

/// Assembles a server-sent-event body (`data: {chunk}` lines, `data: [DONE]`) into one
/// reply as OpenAI's clients do: text fields concatenated, each tool call built from the
/// deltas with its `index` (id and type from the first delta that has them, name and
/// arguments concatenated), the last non-null `finish_reason`, usage from the chunk
/// that carries it. A stream with no chunk, or a chunk that does not parse, is an error
/// quoting it.
pub fn assemble_stream(body: &str) -> ChatOutcome {
    let mut message = ChatMessage {
        role: "assistant".into(),
        ..Default::default()
    };
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut finish_reason = None;
    let mut completion_tokens = 0;
    let mut chunks = 0;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            break;
        }
        let chunk: StreamChunk = match serde_json::from_str(data) {
            Ok(c) => c,
            Err(e) => {
                return ChatOutcome::Error(format!(
                    "unparseable stream chunk ({e}): {}",
                    excerpt(data, 200)
                ))
            }
        };
        chunks += 1;
        if let Some(usage) = chunk.usage {
            completion_tokens = usage.completion_tokens;
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            continue;
        };
        if let Some(reason) = choice.finish_reason {
            finish_reason = Some(reason);
        }
        let delta = choice.delta;
        if let Some(role) = delta.role {
            message.role = role;
        }
        append(&mut message.content, delta.content);
        append(&mut message.reasoning_content, delta.reasoning_content);
        for d in delta.tool_calls {
            while calls.len() <= d.index {
                calls.push(ToolCall {
                    id: String::new(),
                    kind: "function".into(),
                    function: crate::core::session::FunctionCall {
                        name: String::new(),
                        arguments: String::new(),
                    },
                });
            }
            let call = &mut calls[d.index];
            if let Some(id) = d.id.filter(|id| !id.is_empty()) {
                if call.id.is_empty() {
                    call.id = id;
                }
            }
            if let Some(kind) = d.kind {
                call.kind = kind;
            }
            if let Some(f) = d.function {
                call.function.name.push_str(&f.name.unwrap_or_default());
                call.function
                    .arguments
                    .push_str(&f.arguments.unwrap_or_default());
            }
        }
    }
    if chunks == 0 {
        return ChatOutcome::Error(format!("stream has no data chunks: {}", excerpt(body, 200)));
    }
    if !calls.is_empty() {
        message.tool_calls = Some(calls);
    }
    ChatOutcome::Reply(ChatReply {
        message,
        completion_tokens,
        finish_reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn parses_tool_call_replies_and_usage() {
        let body = r#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"call_0","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"/a\"}"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":17}}"#;
        let ChatOutcome::Reply(reply) = parse_reply(body) else {
            panic!("expected a reply")
        };
        assert_eq!(reply.completion_tokens, 17);
        assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
        let calls = reply.message.tool_calls.unwrap();
        assert_eq!(calls[0].function.name, "read_file");
        assert_eq!(calls[0].function.arguments, r#"{"path":"/a"}"#);
    }

    #[test]
    fn streamed_tool_call_deltas_assemble_like_an_openai_client() {
        // The shape llama.cpp and vLLM send: id and name first, arguments in pieces,
        // finish_reason on its own chunk, usage last.
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\": \"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"/a\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"function\":{\"name\":\"grep\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":21}}\n\n",
            "data: [DONE]\n\n",
        );
        let ChatOutcome::Reply(reply) = assemble_stream(body) else {
            panic!("expected a reply")
        };
        assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(reply.completion_tokens, 21);
        assert_eq!(reply.message.content, None);
        let calls = reply.message.tool_calls.unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_1");
        assert_eq!(calls[0].function.name, "read_file");
        assert_eq!(calls[0].function.arguments, r#"{"path": "/a"}"#);
        assert_eq!(calls[1].function.name, "grep");

        // Text in pieces, cut at the limit.
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"DONE: all \"}}]}\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\"steps\"},\"finish_reason\":\"length\"}]}\n\
                    data: [DONE]\n";
        let ChatOutcome::Reply(reply) = assemble_stream(body) else {
            panic!("expected a reply")
        };
        assert_eq!(reply.message.content.as_deref(), Some("DONE: all steps"));
        assert_eq!(reply.finish_reason.as_deref(), Some("length"));
        assert!(reply.message.tool_calls.is_none());

        let ChatOutcome::Error(e) = assemble_stream("data: {oops\n") else {
            panic!()
        };
        assert!(e.starts_with("unparseable stream chunk"), "{e}");
        let ChatOutcome::Error(e) = assemble_stream("<html>502</html>") else {
            panic!()
        };
        assert!(e.contains("no data chunks"), "{e}");
    }

    #[test]
    fn bad_bodies_are_errors_quoting_the_body() {
        let ChatOutcome::Error(e) = parse_reply("<html>bad gateway</html>") else {
            panic!()
        };
        assert!(e.starts_with("unparseable body"), "{e}");
        assert!(e.contains("<html>bad gateway</html>"));
        let ChatOutcome::Error(e) = parse_reply(r#"{"choices":[]}"#) else {
            panic!()
        };
        assert!(e.contains("no choices"));
        let long = "x".repeat(500);
        let ChatOutcome::Error(e) = parse_reply(&long) else {
            panic!()
        };
        assert!(e.len() < 300);
    }

    #[test]
    fn inflight_tracks_current_and_peak() {
        let counter = InFlight::new();
        {
            let _a = counter.enter();
            let _b = counter.enter();
            assert_eq!(counter.current(), 2);
        }
        let _c = counter.enter();
        assert_eq!(counter.current(), 1);
        assert_eq!(counter.peak(), 2);
        counter.reset_peak();
        assert_eq!(counter.peak(), 1);
    }

    fn transcript() -> Transcript {
        Transcript::new(vec![ChatMessage::new("user", "say \"hi\"")])
    }

    #[tokio::test]
    async fn connection_refused_is_an_error_not_a_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = ChatClient::new(
            &format!("http://127.0.0.1:{port}/v1/"),
            "m",
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(
            client.url(),
            format!("http://127.0.0.1:{port}/v1/chat/completions")
        );
        let counter = InFlight::new();
        let mut connection = Connection::new();
        let ChatOutcome::Error(e) = client
            .complete(&mut connection, &transcript(), &counter, None)
            .await
        else {
            panic!("expected an error")
        };
        assert!(e.starts_with("connect error"), "{e}");
        assert!(e.contains("refused"), "{e}");
        assert!(!connection.is_open());
        assert_eq!(counter.current(), 0);
        assert_eq!(counter.peak(), 1);
    }

    #[tokio::test]
    async fn a_first_request_that_never_went_out_does_not_hold_the_wave() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = ChatClient::new(
            &format!("http://127.0.0.1:{port}/v1"),
            "m",
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        // A wave of one: this request's own seat is all it waits for.
        let wave = Arc::new(FirstWave::new(1));
        let counter = InFlight::new();
        let mut connection = Connection::new();
        let outcome = tokio::time::timeout(
            Duration::from_secs(30),
            client.complete(&mut connection, &transcript(), &counter, Some(wave.seat())),
        )
        .await
        .expect("a request that could not connect must not wait for itself at the wave");
        assert!(
            matches!(&outcome, ChatOutcome::Error(e) if e.starts_with("connect error")),
            "{outcome:?}"
        );
        assert!(wave.all_sent.is_cancelled());
    }

    #[test]
    fn urls_it_cannot_serve_are_refused_up_front_with_a_fix() {
        let timeout = Duration::from_secs(1);
        let e = ChatClient::new("https://engine:443/v1", "m", None, timeout).unwrap_err();
        assert!(format!("{e:#}").contains("plain http only"), "{e:#}");
        let e = ChatClient::new("not a url", "m", None, timeout).unwrap_err();
        assert!(format!("{e:#}").contains("chat URL"), "{e:#}");
        let e = ChatClient::new("http://h:1/v1", "m", Some("sk\n".into()), timeout).unwrap_err();
        assert!(format!("{e:#}").contains("API key"), "{e:#}");
        let client = ChatClient::new("http://[::1]:8000/v1/", "m", None, timeout).unwrap();
        assert_eq!((client.host.as_str(), client.port), ("::1", 8000));
        assert_eq!(client.host_header, "[::1]:8000");
        assert_eq!(client.path, "/v1/chat/completions");
        let client = ChatClient::new("http://engine/v1", "m", None, timeout).unwrap();
        assert_eq!(
            (client.port, client.host_header.to_str().unwrap()),
            (80, "engine")
        );
    }

    /// One request as a raw HTTP/1.1 server saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        connection: usize,
        head: String,
        body: Vec<u8>,
    }

    /// A hand-written HTTP/1.1 server: answers every request with `reply` and keeps the
    /// connection open, or closes it after `close_after` requests on it. Records every
    /// request and the connection it came on.
    async fn raw_server(
        reply: &'static str,
        close_after: Option<usize>,
        answer: bool,
    ) -> (u16, Arc<parking_lot::Mutex<Vec<Seen>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            for connection in 0.. {
                let (mut stream, _) = listener.accept().await.unwrap();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut served = 0;
                    loop {
                        let head_end = loop {
                            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                                break at + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
                        let length: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        while buffer.len() < head_end + length {
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let body = buffer[head_end..head_end + length].to_vec();
                        buffer.drain(..head_end + length);
                        log.lock().push(Seen {
                            connection,
                            head,
                            body,
                        });
                        if !answer {
                            std::future::pending::<()>().await;
                        }
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                            reply.len()
                        );
                        stream.write_all(response.as_bytes()).await.unwrap();
                        served += 1;
                        if close_after == Some(served) {
                            return;
                        }
                    }
                });
            }
        });
        (port, seen)
    }

    const REPLY: &str = r#"{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#;

    fn sampling() -> Sampling {
        Sampling {
            max_tokens: 16,
            temperature: 0.5,
        }
    }

    #[tokio::test]
    async fn a_connection_carries_every_round_with_the_spliced_body_and_headers() {
        let (port, seen) = raw_server(REPLY, None, true).await;
        let tools = vec![serde_json::json!({"type": "function"})];
        let options = RequestOptions::default();
        let client = ChatClient::new(
            &format!("http://127.0.0.1:{port}/v1"),
            "model-x",
            Some("sk-secret".into()),
            Duration::from_secs(10),
        )
        .unwrap()
        .with_request(&tools, sampling(), &options);
        let counter = InFlight::new();
        let mut connection = Connection::new();
        let mut conversation = transcript();
        for round in 0..3 {
            let ChatOutcome::Reply(reply) = client
                .complete(&mut connection, &conversation, &counter, None)
                .await
            else {
                panic!("round {round}: expected a reply")
            };
            assert_eq!(reply.message.content.as_deref(), Some("ok"));
            assert!(connection.is_open());
            conversation.push(reply.message);
            conversation.push(ChatMessage::new("tool", format!("result {round} \u{1}")));
        }
        let seen = seen.lock().clone();
        assert_eq!(seen.len(), 3);
        assert!(
            seen.iter().all(|s| s.connection == 0),
            "one connection for all rounds"
        );
        let first = &seen[0];
        assert!(
            first
                .head
                .starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
            "{}",
            first.head
        );
        let head = first.head.to_ascii_lowercase();
        for line in [
            format!("host: 127.0.0.1:{port}\r\n"),
            "content-type: application/json\r\n".to_string(),
            "authorization: bearer sk-secret\r\n".to_string(),
            format!("content-length: {}\r\n", first.body.len()),
        ] {
            assert!(head.contains(&line), "{line:?} missing in {head}");
        }
        // Round 3's body is serde's serialisation of the conversation it was sent with.
        let sent: Vec<ChatMessage> = conversation.messages()[..5].to_vec();
        assert_eq!(
            seen[2].body,
            super::super::body::reference_body("model-x", &sent, &tools, sampling(), &options)
        );
        assert_eq!(counter.current(), 0);
    }

    /// Waits (bounded) until the client has noticed the server closed the connection.
    async fn until_closed(connection: &mut Connection) {
        for _ in 0..500 {
            if !connection.is_open() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the client never noticed the close");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced_and_nothing_is_sent_twice() {
        let (port, seen) = raw_server(REPLY, Some(1), true).await;
        let client = ChatClient::new(
            &format!("http://127.0.0.1:{port}/v1"),
            "m",
            None,
            Duration::from_secs(10),
        )
        .unwrap();
        let counter = InFlight::new();
        let mut connection = Connection::new();
        for round in 0..3 {
            let outcome = client
                .complete(&mut connection, &transcript(), &counter, None)
                .await;
            assert!(
                matches!(outcome, ChatOutcome::Reply(_)),
                "round {round}: {outcome:?}"
            );
            until_closed(&mut connection).await;
        }
        let connections: Vec<usize> = seen.lock().iter().map(|s| s.connection).collect();
        assert_eq!(connections, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn no_reply_in_time_is_a_timeout_and_the_next_round_gets_a_new_connection() {
        let (port, seen) = raw_server(REPLY, None, false).await;
        let client = ChatClient::new(
            &format!("http://127.0.0.1:{port}/v1"),
            "m",
            None,
            Duration::from_millis(300),
        )
        .unwrap();
        let counter = InFlight::new();
        let mut connection = Connection::new();
        for _ in 0..2 {
            let outcome = client
                .complete(&mut connection, &transcript(), &counter, None)
                .await;
            assert!(matches!(outcome, ChatOutcome::Timeout), "{outcome:?}");
            assert!(!connection.is_open());
        }
        let connections: Vec<usize> = seen.lock().iter().map(|s| s.connection).collect();
        assert_eq!(connections, vec![0, 1]);
        assert_eq!(counter.current(), 0);
    }
}
