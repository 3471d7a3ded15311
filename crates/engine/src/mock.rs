//! A zero-work OpenAI chat server for the harness's tests and benchmarks: it reads the
//! task's numbered list from the request (with the embedded engine's own task parser,
//! `model::parse_task`), counts the tool results already in the conversation and
//! answers, instantly, with exactly the call the current step asks for (a short text
//! answer once all steps are done). Fault rules corrupt chosen sessions in
//! deterministic ways (a CRC-32 of the task message picks them, the round says when),
//! so tests can predict every class and count; nothing here is random. Two knobs
//! depend on the load instead: `crash_at_running` dies of SIGSEGV, and
//! `poison_at_running` corrupts every call for the rest of the process's life, once
//! that many chat requests were in flight at once.
//! Also serves `/health` and `/metrics` (its own running requests, from the engine's
//! one metrics table), with the engine's connection handling (`listen`), and `/stats`
//! (`/stats/reset`): handling time and the client's think time between rounds, as seen
//! by the server, for benchmarks that drive it from another process.

use crate::listen::{self, HttpLimits};
use crate::metrics::{self, Metric};
use crate::model::{parse_task, Step};
use crate::tokenizer;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A deliberate, deterministic misbehaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// DSML tool-call markup in `content`, no structured call (a leak).
    LeakDsml,
    /// The right tool with one argument value changed (wrong_args).
    WrongArgs,
    /// The right tool with truncated, unparseable JSON arguments (bad_args).
    BadJsonArgs,
    /// A text answer while steps remain (no_tool).
    NoTool,
    /// HTTP 500 with a short body (error).
    Status500,
    /// HTTP 200 with a body that is not JSON (error).
    GarbageBody,
    /// Answer correctly, but only after this long (timeout, with a shorter client limit).
    Sleep(Duration),
}

/// What the mock does while more than one chat request is in flight: the solo oracle's
/// two stand-ins. Alone (one request in flight) every reply is the task's own call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadFault {
    /// An engine whose every choice is a near-tie that batch size can flip (numerics
    /// that follow the batch): under load a call's first argument value is the
    /// runner-up's (altered as `WrongArgs` alters it). Every served token's margin is
    /// `margin` nats, alone and under load.
    NearTieFlip { margin: f32 },
    /// An engine that crosses requests under load: a reply is the call the previous
    /// request in flight was answered with, and that request got this one's (two
    /// sessions' replies swapped). Every served token wins by 8 nats.
    Swap,
}

/// Applies `fault` in round `round` (1-based) of the sessions whose task message has
/// `crc32(text) % modulus == residue`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub modulus: u32,
    pub residue: u32,
    pub round: u32,
    pub fault: Fault,
}

impl FaultRule {
    pub fn new(modulus: u32, residue: u32, round: u32, fault: Fault) -> Self {
        FaultRule {
            modulus: modulus.max(1),
            residue,
            round,
            fault,
        }
    }

    /// An engine whose first rounds are sometimes corrupted even alone: round 1 of the
    /// sessions whose task message has `crc32 % modulus == 0` is answered with DSML
    /// markup in `content` ([`Fault::LeakDsml`]), whatever the load
    /// (`--leak-first-round`, `BISECT_MOCK_LEAK_FIRST_ROUND`).
    pub fn leak_first_round(modulus: u32) -> Self {
        FaultRule::new(modulus, 0, 1, Fault::LeakDsml)
    }

    /// Whether this rule picks the session whose task message is `task_message`.
    pub fn selects(&self, task_message: &str) -> bool {
        crc32fast::hash(task_message.as_bytes()) % self.modulus.max(1) == self.residue
    }
}

#[derive(Debug, Clone, Default)]
pub struct MockConfig {
    /// First matching rule wins.
    pub faults: Vec<FaultRule>,
    /// Adds a deterministic delay of 0..jitter_ms per request (from the task and round),
    /// so sessions drift apart unless something (the round barrier) holds them together.
    pub jitter_ms: u64,
    /// Dies of SIGSEGV the moment this many chat requests are in flight at once: an
    /// engine that crashes at load, for the harness's tests of engine deaths (a real
    /// signal death of a real process, decided by the load alone).
    pub crash_at_running: Option<u64>,
    /// Becomes poisoned the first time this many chat requests are in flight at once,
    /// for the rest of its process life: every call from then on, that request's
    /// included, has a wrong argument ([`Fault::WrongArgs`]), alone or not, until the
    /// process restarts (a session with no step left still gets its closing text). An
    /// engine poisoned by its first failure (xgrammar #460, vLLM #35718), for tests of
    /// corruption against time.
    pub poison_at_running: Option<u64>,
    /// What changes under load ([`LoadFault`]); `None`: nothing.
    pub under_load: Option<LoadFault>,
    /// Milliseconds per token of the reply's call (its tool name and arguments, one
    /// token per 4 bytes), slept before answering: an engine whose time is decode
    /// latency, not the machine's CPU, so several of them on one small machine run
    /// side by side at their own pace (the replicas benchmark).
    pub token_delay_ms: u64,
}

/// Kills this process with SIGSEGV. Rust's runtime handles SIGSEGV (to report stack
/// overflows): a SIGSEGV that is no fault in a guard page makes its handler restore the
/// default action and return, so the signal is sent twice: the second one kills.
fn die_of_sigsegv() -> ! {
    use nix::sys::signal::{raise, Signal};
    let _ = raise(Signal::SIGSEGV);
    let _ = raise(Signal::SIGSEGV);
    std::process::abort()
}

/// What the mock saw, for assertions and benchmark figures.
#[derive(Debug, Default)]
pub struct MockStats {
    requests: AtomicU64,
    bearer: AtomicU64,
    running: AtomicI64,
    rounds: Mutex<Vec<u32>>,
    handling_ns: Mutex<Vec<u64>>,
    /// When each session's last reply left the handler, keyed by a hash of the
    /// conversation up to its task message.
    replied: Mutex<HashMap<u32, Instant>>,
    think_ns: Mutex<Vec<u64>>,
    /// Sessions (by key) whose reply a load fault changed at least once.
    changed_under_load: Mutex<std::collections::HashSet<u32>>,
    /// [`LoadFault::Swap`]'s held call: (tool, arguments) of the last request answered.
    held: Mutex<Option<(String, String)>>,
    /// Whether [`MockConfig::poison_at_running`] poisoned the mock (never cleared).
    poisoned: AtomicBool,
    /// When it was poisoned: set once, with the `poisoned` flag.
    poisoning: std::sync::OnceLock<Poisoning>,
}

/// When the mock was poisoned ([`MockConfig::poison_at_running`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Poisoning {
    /// The chat request that poisoned it, as [`MockStats::requests`] counted it (from
    /// 1; since the last [`MockStats::clear`]).
    pub request: u64,
    /// Chat requests in flight at that moment, that one included.
    pub running: u64,
}

impl MockStats {
    /// Sessions whose reply a load fault changed at least once.
    pub fn changed_under_load(&self) -> usize {
        self.changed_under_load.lock().len()
    }

    /// Whether the mock is poisoned ([`MockConfig::poison_at_running`]) and since which
    /// request; `None` while it is not.
    pub fn poisoned(&self) -> Option<Poisoning> {
        self.poisoning.get().copied()
    }

    /// Chat requests answered (any status).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Chat requests that carried `Authorization: Bearer ...`.
    pub fn bearer_seen(&self) -> u64 {
        self.bearer.load(Ordering::SeqCst)
    }

    /// Round number of every chat request, in arrival order.
    pub fn round_arrivals(&self) -> Vec<u32> {
        self.rounds.lock().clone()
    }

    /// Time each chat request spent in the handler (parse, build, serialise), in ns,
    /// excluding deliberate sleeps and jitter.
    pub fn handling_ns(&self) -> Vec<u64> {
        self.handling_ns.lock().clone()
    }

    /// Forgets everything recorded (between benchmark rows).
    /// The client's turn-around as this server sees it: from a session's reply leaving
    /// the handler to the same session's next request arriving. It covers both kernel
    /// crossings, the client's event loop and its own work per round, whichever client it
    /// is, so clients are compared by the same clock (benches/python, scripts/bench-clients.sh).
    pub(crate) fn think_ns(&self) -> Vec<u64> {
        self.think_ns.lock().clone()
    }

    pub fn clear(&self) {
        self.requests.store(0, Ordering::SeqCst);
        self.bearer.store(0, Ordering::SeqCst);
        self.rounds.lock().clear();
        self.handling_ns.lock().clear();
        self.replied.lock().clear();
        self.think_ns.lock().clear();
    }

    /// Request count and percentiles (microseconds) of handling and think time, for an
    /// external client's benchmark (`GET /stats`).
    pub fn summary(&self) -> Value {
        fn percentiles(mut ns: Vec<u64>) -> Value {
            ns.sort_unstable();
            let at = |q: f64| {
                if ns.is_empty() {
                    return 0.0;
                }
                let rank = ((q * ns.len() as f64).ceil() as usize).clamp(1, ns.len());
                ns[rank - 1] as f64 / 1000.0
            };
            json!({"samples": ns.len(), "p50_us": at(0.50), "p99_us": at(0.99)})
        }
        json!({
            "requests": self.requests(),
            "handling": percentiles(self.handling_ns()),
            "think": percentiles(self.think_ns()),
            "poisoned": self.poisoned(),
        })
    }
}

struct Shared {
    config: MockConfig,
    stats: Arc<MockStats>,
    shutdown: CancellationToken,
    /// Every user message text seen, with its parsed task (None: not a task). A session
    /// sends its task message every round; parsing it (regexes) and tokenizing the
    /// answers once per session instead of once per round keeps the mock cheaper than
    /// the clients it measures.
    tasks: Mutex<HashMap<Box<str>, Option<Arc<ParsedTask>>>>,
}

/// A task message's steps, with each step's arguments as the JSON text the reply carries
/// and the reply's token count.
struct ParsedTask {
    steps: Vec<Step>,
    arguments: Vec<String>,
    tokens: Vec<usize>,
}

impl ParsedTask {
    fn parse(text: &str) -> Option<ParsedTask> {
        let steps = parse_task(text)?.steps;
        let arguments: Vec<String> = steps
            .iter()
            .map(|(_, args)| Value::Object(args.clone()).to_string())
            .collect();
        let tokens = steps
            .iter()
            .zip(&arguments)
            .map(|((tool, _), arguments)| token_count(tool) + token_count(arguments))
            .collect();
        Some(ParsedTask {
            steps,
            arguments,
            tokens,
        })
    }
}

impl Shared {
    fn task(&self, text: &str) -> Option<Arc<ParsedTask>> {
        if let Some(known) = self.tasks.lock().get(text) {
            return known.clone();
        }
        let parsed = ParsedTask::parse(text).map(Arc::new);
        self.tasks.lock().insert(text.into(), parsed.clone());
        parsed
    }
}

/// A running mock; stops when dropped.
pub struct MockServer {
    addr: SocketAddr,
    stats: Arc<MockStats>,
    shutdown: CancellationToken,
}

impl MockServer {
    /// Binds 127.0.0.1 on a free port and serves until dropped.
    pub async fn start(config: MockConfig) -> anyhow::Result<MockServer> {
        Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config).await
    }

    /// Binds `addr` and serves until dropped.
    pub async fn bind(addr: SocketAddr, config: MockConfig) -> anyhow::Result<MockServer> {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        // A deep accept queue: a thousand sessions connect at once.
        let listener = socket.listen(8192)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(MockStats::default());
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            config,
            stats: stats.clone(),
            shutdown: shutdown.clone(),
            tasks: Mutex::default(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/health", get(|| async { "ok" }))
            .route("/metrics", get(metrics))
            .route("/stats", get(stats_summary))
            .route("/stats/reset", post(stats_reset))
            .with_state(shared);
        // Benchmarks open one connection per session, thousands of them.
        let limits = HttpLimits {
            max_connections: 1 << 16,
            ..HttpLimits::default()
        };
        let stop = shutdown.clone();
        tokio::spawn(listen::serve(listener, app, limits, async move {
            stop.cancelled().await
        }));
        Ok(MockServer {
            addr,
            stats,
            shutdown,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI base URL (`http://127.0.0.1:PORT/v1`).
    pub fn api(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    pub fn health_url(&self) -> String {
        format!("http://{}/health", self.addr)
    }

    pub fn stats(&self) -> Arc<MockStats> {
        self.stats.clone()
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

struct RunningGuard<'a>(&'a AtomicI64);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a conversation stands: the task, its text, and the round about to be answered.
struct Progress<'a> {
    /// Which session this is: a hash of every message up to and including the task.
    session_key: u32,
    task_text: &'a str,
    task: Arc<ParsedTask>,
    done_steps: usize,
    round: u32,
}

/// The part of a chat request the mock reads: roles and texts. Tool calls and every
/// other field are skipped unparsed, so the mock's cost per request stays small next to
/// the client it is benchmarking (a `serde_json::Value` tree of the whole conversation
/// cost more than the client's own work per round).
/// Strings without escapes are borrowed from the body, not copied.
#[derive(Debug, Default, Deserialize)]
struct ChatRequest<'a> {
    #[serde(default, borrow)]
    messages: Vec<RequestMessage<'a>>,
    /// OpenAI's `logprobs`: serve each reply's tokens with log-probabilities.
    #[serde(default)]
    logprobs: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RequestMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
}

fn progress<'a>(shared: &Shared, messages: &'a [RequestMessage<'a>]) -> Option<Progress<'a>> {
    let (at, task_text, task) = messages.iter().enumerate().rev().find_map(|(i, m)| {
        if m.role != "user" {
            return None;
        }
        let text = m.content.as_deref()?;
        shared.task(text).map(|task| (i, text, task))
    })?;
    let later = &messages[at + 1..];
    let count = |role: &str| later.iter().filter(|m| m.role == role).count();
    let mut hasher = crc32fast::Hasher::new();
    for message in &messages[..=at] {
        if let Some(text) = &message.content {
            hasher.update(text.as_bytes());
        }
    }
    Some(Progress {
        session_key: hasher.finalize(),
        task_text,
        task,
        done_steps: count("tool"),
        round: count("assistant") as u32 + 1,
    })
}

/// [`MockConfig::token_delay_ms`] times the reply's tokens: the call it answers this
/// round with (one token per 4 bytes of its tool name and arguments), one token for a
/// closing text.
fn decode_time(config: &MockConfig, state: &Progress<'_>) -> Duration {
    if config.token_delay_ms == 0 {
        return Duration::ZERO;
    }
    let tokens = state
        .task
        .steps
        .get(state.done_steps)
        .map_or(1, |(tool, args)| {
            (tool.len() + Value::Object(args.clone()).to_string().len()).div_ceil(4)
        });
    Duration::from_millis(config.token_delay_ms * tokens as u64)
}

fn jitter(config: &MockConfig, task_text: &str, round: u32) -> Duration {
    if config.jitter_ms == 0 {
        return Duration::ZERO;
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(task_text.as_bytes());
    hasher.update(&round.to_le_bytes());
    Duration::from_millis(u64::from(hasher.finalize()) % config.jitter_ms)
}

fn altered(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(format!("{s}.bak")),
        Value::Number(n) => json!(n.as_f64().unwrap_or(0.0) as i64 + 1),
        Value::Bool(b) => Value::Bool(!b),
        other => json!([other]),
    }
}

/// Tokens of `text` by the embedded engine's tokenizer (for `usage`).
fn token_count(text: &str) -> usize {
    tokenizer::split(text).len()
}

/// A reply body, typed: serialising a `json!` tree per reply was a visible share of
/// the mock's cost. Field order as OpenAI's.
#[derive(Serialize)]
struct Completion<'a> {
    id: &'static str,
    object: &'static str,
    model: &'static str,
    choices: [Choice<'a>; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: ReplyMessage<'a>,
    finish_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Value>,
}

#[derive(Serialize)]
struct ReplyMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ReplyCall<'a>; 1]>,
}

#[derive(Serialize)]
struct ReplyCall<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ReplyFunction<'a>,
}

#[derive(Serialize)]
struct ReplyFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
}

fn completion(message: ReplyMessage<'_>, completion_tokens: usize) -> Response {
    completion_with(message, completion_tokens, None)
}

fn completion_with(
    message: ReplyMessage<'_>,
    completion_tokens: usize,
    logprobs: Option<Value>,
) -> Response {
    let body = Completion {
        id: "chatcmpl-mock",
        object: "chat.completion",
        model: "mock",
        choices: [Choice {
            index: 0,
            message,
            finish_reason: "stop",
            logprobs,
        }],
        usage: Usage {
            prompt_tokens: 0,
            completion_tokens,
        },
    };
    let body = serde_json::to_vec(&body).expect("a reply always serialises");
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A reply calling `tool` with `arguments`; `tokens` is its completion token count.
fn tool_call_reply(round: u32, tool: &str, arguments: &str, tokens: usize) -> Response {
    completion(
        ReplyMessage {
            role: "assistant",
            content: None,
            tool_calls: Some([ReplyCall {
                id: format!("call_{round}"),
                kind: "function",
                function: ReplyFunction {
                    name: tool,
                    arguments,
                },
            }]),
        },
        tokens,
    )
}

/// A tool-call reply whose arguments were altered by a fault: tokens counted afresh.
fn faulty_call_reply(round: u32, tool: &str, arguments: String) -> Response {
    let tokens = token_count(tool) + token_count(&arguments);
    tool_call_reply(round, tool, &arguments, tokens)
}

fn text_reply(text: &str) -> Response {
    completion(
        ReplyMessage {
            role: "assistant",
            content: Some(text),
            tool_calls: None,
        },
        token_count(text),
    )
}

async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let stats = &shared.stats;
    let running = stats.running.fetch_add(1, Ordering::SeqCst) + 1;
    let _running = RunningGuard(&stats.running);
    if shared
        .config
        .crash_at_running
        .is_some_and(|n| running >= n as i64)
    {
        die_of_sigsegv();
    }
    let request = stats.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if shared
        .config
        .poison_at_running
        .is_some_and(|n| running >= n as i64)
        && !stats.poisoned.swap(true, Ordering::SeqCst)
    {
        let _ = stats.poisoning.set(Poisoning {
            request,
            running: running as u64,
        });
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer "));
    if bearer {
        stats.bearer.fetch_add(1, Ordering::SeqCst);
    }

    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad json: {e}")).into_response(),
    };
    let Some(state) = progress(&shared, &request.messages) else {
        return text_reply("There is no task to work on.");
    };
    stats.rounds.lock().push(state.round);
    if state.round > 1 {
        if let Some(replied) = stats.replied.lock().remove(&state.session_key) {
            let think = started.saturating_duration_since(replied);
            stats.think_ns.lock().push(think.as_nanos() as u64);
        }
    }
    let fault = if stats.poisoned.load(Ordering::SeqCst) {
        Some(Fault::WrongArgs)
    } else {
        shared
            .config
            .faults
            .iter()
            .find(|rule| rule.round == state.round && rule.selects(state.task_text))
            .map(|rule| rule.fault)
    };
    let waited = delay(&shared, &state, fault).await;
    let response = match shared.config.under_load {
        Some(load) if fault.is_none() => load_reply(
            &shared,
            load,
            running > 1,
            request.logprobs == Some(true),
            &state,
        ),
        _ => reply(fault, &state),
    };
    stats
        .handling_ns
        .lock()
        .push(started.elapsed().saturating_sub(waited).as_nanos() as u64);
    stats
        .replied
        .lock()
        .insert(state.session_key, Instant::now());
    response
}

/// Wait as the request's jitter and a sleep fault ask (cut short by shutdown); returns
/// the wait, which the handling time leaves out.
async fn delay(shared: &Shared, state: &Progress<'_>, fault: Option<Fault>) -> Duration {
    let mut waited =
        jitter(&shared.config, state.task_text, state.round) + decode_time(&shared.config, state);
    if let Some(Fault::Sleep(extra)) = fault {
        waited += extra;
    }
    if !waited.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(waited) => {}
            _ = shared.shutdown.cancelled() => {}
        }
    }
    waited
}

/// The answer to the round under a [`LoadFault`]: the task's own call alone, changed
/// under load as the fault says, with log-probabilities when `logprobs` asked.
fn load_reply(
    shared: &Shared,
    load: LoadFault,
    loaded: bool,
    logprobs: bool,
    state: &Progress<'_>,
) -> Response {
    let Some((tool, args)) = state.task.steps.get(state.done_steps) else {
        return text_reply("All steps are done; nothing unusual found.");
    };
    let own = (tool.clone(), Value::Object(args.clone()).to_string());
    let (call, margin) = match load {
        LoadFault::NearTieFlip { margin } if loaded => {
            let mut args = args.clone();
            if let Some((_, value)) = args.iter_mut().next() {
                *value = altered(value);
            }
            ((tool.clone(), Value::Object(args).to_string()), margin)
        }
        LoadFault::NearTieFlip { margin } => (own.clone(), margin),
        LoadFault::Swap => {
            let mut held = shared.stats.held.lock();
            let call = match (loaded, held.take()) {
                (true, Some(other)) => other,
                _ => own.clone(),
            };
            *held = Some(own.clone());
            (call, 8.0)
        }
    };
    if call != own {
        shared
            .stats
            .changed_under_load
            .lock()
            .insert(state.session_key);
    }
    let (tool, arguments) = call;
    let text = format!("{tool}({arguments})");
    let pieces = tokenizer::split(&text);
    let served = logprobs.then(|| {
        let content: Vec<Value> = pieces
            .iter()
            .map(|token| {
                let chosen = -0.01f32;
                json!({"token": token, "logprob": chosen,
                    "top_logprobs": [{"token": token, "logprob": chosen},
                                     {"token": "<runner-up>", "logprob": chosen - margin}]})
            })
            .collect();
        json!({ "content": content })
    });
    completion_with(
        ReplyMessage {
            role: "assistant",
            content: None,
            tool_calls: Some([ReplyCall {
                id: format!("call_{}", state.round),
                kind: "function",
                function: ReplyFunction {
                    name: &tool,
                    arguments: &arguments,
                },
            }]),
        },
        pieces.len(),
        served,
    )
}

/// The answer to the round: the current step's call, the fault's corruption of it, or
/// the closing text once every step is done.
fn reply(fault: Option<Fault>, state: &Progress<'_>) -> Response {
    let step = state.task.steps.get(state.done_steps);
    match (fault, step) {
        (Some(Fault::Status500), _) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "injected failure").into_response()
        }
        (Some(Fault::GarbageBody), _) => (
            [(header::CONTENT_TYPE, "application/json")],
            "<html>upstream hiccup</html>",
        )
            .into_response(),
        (Some(Fault::NoTool), _) => text_reply("Let me think about how to approach this."),
        (Some(Fault::LeakDsml), Some((tool, args))) => {
            let (name, value) = args
                .iter()
                .next()
                .map_or(("path", json!("")), |(k, v)| (k.as_str(), v.clone()));
            text_reply(&format!(
                "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"{tool}\">\n\
                 <｜DSML｜parameter name=\"{name}\" string=\"true\">{value}</｜DSML｜parameter>\
                 </｜DSML｜parameter>\n"
            ))
        }
        (Some(Fault::WrongArgs), Some((tool, args))) => {
            let mut args = args.clone();
            if let Some((_, value)) = args.iter_mut().next() {
                *value = altered(value);
            }
            faulty_call_reply(state.round, tool, Value::Object(args).to_string())
        }
        (Some(Fault::BadJsonArgs), Some((tool, args))) => {
            let mut text = Value::Object(args.clone()).to_string();
            text.truncate(text.len().saturating_sub(3).max(1));
            faulty_call_reply(state.round, tool, text)
        }
        (_, Some((tool, _))) => {
            let at = state.done_steps;
            tool_call_reply(
                state.round,
                tool,
                &state.task.arguments[at],
                state.task.tokens[at],
            )
        }
        (_, None) => text_reply("All steps are done; nothing unusual found."),
    }
}

async fn stats_summary(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        shared.stats.summary().to_string(),
    )
        .into_response()
}

async fn stats_reset(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.stats.clear();
    StatusCode::NO_CONTENT
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let running = shared.stats.running.load(Ordering::SeqCst).max(0);
    let values = [
        (Metric::RunningRequests, running as f64),
        (Metric::QueuedRequests, 0.0),
    ];
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&values),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
