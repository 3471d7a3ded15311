//! A small fake prefill/decode engine for harness tests: in-process axum servers whose
//! flags are read, like a real engine's, from the `export` lines and arguments of their
//! launch configs at every restart. Its bugs are deterministic functions of the task
//! text, so every count a test checks is known in advance.
//!
//! Flags it understands:
//! - `FAKE_INDEX_BF16` (both roles; they must agree or every request fails with 500)
//! - `FAKE_RACE=1` (decode): with FAKE_INDEX_BF16=1 too, sessions whose task hash is
//!   divisible by 4 leak DSML in round 2
//! - `FAKE_SLOW=1` (decode): every request sleeps `FAKE_SLOW_MS` (default 1500 ms)
//! - `--fake-noise N` (decode arg): speed noise only
//! - `FAKE_ECHO_KEY=1` (decode): every chat fails with 401 and echoes the bearer token
//!   it was sent, as careless servers do
//! - `FAKE_REJECT=1` (decode): the sessions the race would hit (task hash divisible by
//!   4) get, in round 2, the HTTP 500 llama-server sends when the model's tool-call
//!   markup does not parse ([`LLAMA_REJECTION`]); to a streamed request, as llama-server
//!   streams it: HTTP 200, a first chunk of the call's markup, then the error as an
//!   event and no `[DONE]`
//!
//! - `FAKE_NO_PARSER=1` (decode): every tool call comes back as DSML text in `content`,
//!   as an SGLang started without `--tool-call-parser` returns it
//!
//! A request with `"stream": true` gets its reply as server-sent events (one chunk for
//! the message, one with the finish reason and usage, then `[DONE]`).
//!
//! Restarts: both roles report `pid` and `started_at` (`gen-N`) in `/server_info`, N
//! counting that role's restarts. A restart is [`FakeControl::restart`] in-process, or,
//! for a `bisect` process driving the fake through restart commands, the command
//! creating the role's marker file ([`FakeEngine::restart_marker`]), which the fake
//! consumes at its next request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bisect_harness::control::EngineControl;
use futures::future::BoxFuture;
use parking_lot::RwLock;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// Flags of one role, as parsed from its launch config.
#[derive(Debug, Clone, Default)]
pub struct RoleFlags {
    pub env: BTreeMap<String, String>,
    pub args: Vec<String>,
}

impl RoleFlags {
    /// The fake's own reading of a launch config: `export K=V` / `K=V` lines and the
    /// words of the `exec` line.
    pub fn parse(text: &str) -> RoleFlags {
        let mut flags = RoleFlags::default();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let assignment = line.strip_prefix("export ").unwrap_or(line);
            if let Some((k, v)) = assignment.split_once('=') {
                if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !k.is_empty() {
                    flags.env.insert(
                        k.to_string(),
                        v.trim_matches('"').trim_matches('\'').to_string(),
                    );
                    continue;
                }
            }
            flags.args.extend(line.split_whitespace().map(String::from));
        }
        flags
    }

    fn env_is(&self, key: &str, value: &str) -> bool {
        self.env.get(key).map(|v| v == value).unwrap_or(false)
    }
}

#[derive(Default)]
struct Shared {
    prefill: RwLock<RoleFlags>,
    decode: RwLock<RoleFlags>,
    /// An engine that ignores restarts: once set, `/server_info` keeps reporting the
    /// prefill env of the first restart after [`FakeEngine::ignore_restarts`].
    ignore_restarts: std::sync::atomic::AtomicBool,
    /// Each chat request is held this long, so load is visible to a sampling poller
    /// (a real engine's requests last seconds; the fake's would last microseconds).
    hold_ms: AtomicU64,
    reported_prefill: RwLock<Option<BTreeMap<String, String>>>,
    running: AtomicU64,
    requests: AtomicU64,
    /// When non-zero: the chat request with this number (1-based, counted from the
    /// setting) "crashes" decode, which its supervisor restarts at once: decode's
    /// generation moves on, its config stays.
    crash_at: AtomicU64,
    /// Restarts per role (prefill, decode): `started_at` is `gen-N`.
    generation: [AtomicU64; 2],
    /// An engine a restart never reaches: configs and generations stay as they are.
    never_restart: AtomicBool,
    /// With `never_restart`: each restart marker makes that role's health fail this many
    /// checks while the same process keeps answering (a decode whose health reports
    /// prefill's restart, its own command having restarted nothing).
    blink_checks: AtomicU64,
    /// Health checks still to fail, per role.
    health_failing: [AtomicU64; 2],
    /// Launch configs, for the restart markers beside them.
    launch: [PathBuf; 2],
}

impl Shared {
    /// A restart of role `i` (0 prefill, 1 decode): re-read its launch config.
    fn restart_role(&self, i: usize) -> std::io::Result<()> {
        if self.never_restart.load(Ordering::Relaxed) {
            return Ok(());
        }
        let flags = RoleFlags::parse(&std::fs::read_to_string(&self.launch[i])?);
        if i == 0 {
            *self.prefill.write() = flags;
        } else {
            *self.decode.write() = flags;
        }
        self.generation[i].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Consumes role `i`'s restart marker, restarting the role, if a command made one.
    fn take_marker(&self, i: usize) {
        if std::fs::remove_file(marker_of(&self.launch[i])).is_ok() {
            if self.never_restart.load(Ordering::Relaxed) {
                let blink = self.blink_checks.load(Ordering::Relaxed);
                self.health_failing[i].store(blink, Ordering::Relaxed);
            }
            let _ = self.restart_role(i);
            if i == 0 && self.ignore_restarts.load(Ordering::Relaxed) {
                let mut reported = self.reported_prefill.write();
                if reported.is_none() {
                    *reported = Some(self.prefill.read().env.clone());
                }
            }
        }
    }

    /// Role `i`'s health answer: down while a blink lasts.
    fn health(&self, i: usize) -> (StatusCode, &'static str) {
        let failing = &self.health_failing[i];
        let blinking = failing
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if blinking {
            (StatusCode::SERVICE_UNAVAILABLE, "restarting")
        } else {
            (StatusCode::OK, "ok")
        }
    }

    fn identity(&self, i: usize) -> Value {
        json!({
            "pid": std::process::id(),
            "started_at": format!("gen-{}", self.generation[i].load(Ordering::Relaxed)),
        })
    }
}

fn marker_of(launch: &std::path::Path) -> PathBuf {
    let mut name = launch.as_os_str().to_owned();
    name.push(".restart");
    PathBuf::from(name)
}

/// The running fake: two listeners on loopback.
pub struct FakeEngine {
    shared: Arc<Shared>,
    pub prefill_addr: SocketAddr,
    pub decode_addr: SocketAddr,
    pub launch: [PathBuf; 2],
    pub restarts: Arc<AtomicU64>,
    shutdown: CancellationToken,
}

impl FakeEngine {
    pub async fn start(prefill_launch: PathBuf, decode_launch: PathBuf) -> FakeEngine {
        let shared = Arc::new(Shared {
            launch: [prefill_launch.clone(), decode_launch.clone()],
            ..Shared::default()
        });
        let shutdown = CancellationToken::new();
        let prefill_app = Router::new()
            .route("/health", get(prefill_health))
            .route("/metrics", get(prefill_metrics))
            .route("/server_info", get(prefill_info))
            .with_state(shared.clone());
        let decode_app = Router::new()
            .route("/health", get(decode_health))
            .route("/server_info", get(decode_info))
            .route("/metrics", get(decode_metrics))
            .route("/v1/chat/completions", post(chat))
            .with_state(shared.clone());
        let prefill_addr = serve(prefill_app, shutdown.clone()).await;
        let decode_addr = serve(decode_app, shutdown.clone()).await;
        FakeEngine {
            shared,
            prefill_addr,
            decode_addr,
            launch: [prefill_launch, decode_launch],
            restarts: Arc::new(AtomicU64::new(0)),
            shutdown,
        }
    }

    /// Re-read both launch configs, as a restart of real processes would.
    pub fn reload(&self) -> std::io::Result<()> {
        *self.shared.prefill.write() = RoleFlags::parse(&std::fs::read_to_string(&self.launch[0])?);
        *self.shared.decode.write() = RoleFlags::parse(&std::fs::read_to_string(&self.launch[1])?);
        Ok(())
    }

    pub fn control(&self) -> FakeControl {
        FakeControl {
            shared: self.shared.clone(),
            launch: self.launch.clone(),
            restarts: self.restarts.clone(),
        }
    }

    /// From the next restart on, report that restart's prefill config forever, like an
    /// engine that restarts but does not honour its launch config (a dead conditional).
    pub fn ignore_restarts(&self) {
        self.shared.ignore_restarts.store(true, Ordering::Relaxed);
    }

    /// Restarts never reach this engine: same process, same config, same identity.
    pub fn never_restart(&self) {
        self.shared.never_restart.store(true, Ordering::Relaxed);
    }

    /// Restarts never reach this engine, but each one makes the role's health fail
    /// `checks` times: health goes down and comes back on the same process.
    pub fn never_restart_but_blink_health(&self, checks: u64) {
        self.shared.blink_checks.store(checks, Ordering::Relaxed);
        self.never_restart();
    }

    /// The file whose creation restarts role `i` (0 prefill, 1 decode): a restart
    /// command for a `bisect` process is `touch` of it.
    pub fn restart_marker(&self, i: usize) -> PathBuf {
        marker_of(&self.launch[i])
    }

    /// Hold every chat request `ms` milliseconds.
    pub fn hold_requests(&self, ms: u64) {
        self.shared.hold_ms.store(ms, Ordering::Relaxed);
    }

    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Decode restarts by itself (a crash its supervisor recovers) at the `n`-th chat
    /// request from now: `/server_info` then reports a new `started_at`.
    pub fn crash_decode_after(&self, n: u64) {
        self.shared
            .crash_at
            .store(self.requests() + n, Ordering::Relaxed);
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// EngineControl over the fake: "restart" re-reads the launch configs.
pub struct FakeControl {
    shared: Arc<Shared>,
    launch: [PathBuf; 2],
    pub restarts: Arc<AtomicU64>,
}

impl EngineControl for FakeControl {
    fn restart<'a>(
        &'a mut self,
        _label: &'a str,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, anyhow::Result<BTreeMap<String, f64>>> {
        Box::pin(async move {
            debug_assert_eq!(self.launch, self.shared.launch);
            self.shared.restart_role(0)?;
            self.shared.restart_role(1)?;
            if self.shared.ignore_restarts.load(Ordering::Relaxed) {
                let mut reported = self.shared.reported_prefill.write();
                if reported.is_none() {
                    *reported = Some(self.shared.prefill.read().env.clone());
                }
            }
            self.restarts.fetch_add(1, Ordering::Relaxed);
            Ok(BTreeMap::from([
                ("prefill".to_string(), 0.0),
                ("decode".to_string(), 0.0),
            ]))
        })
    }

    fn stop(&mut self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

async fn serve(app: Router, shutdown: CancellationToken) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .unwrap();
    });
    addr
}

async fn prefill_metrics() -> String {
    "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"fake\"} 0\nsglang:num_queue_reqs{model_name=\"fake\"} 0\n".into()
}

async fn prefill_health(State(s): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    s.take_marker(0);
    s.health(0)
}

async fn decode_health(State(s): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    s.take_marker(1);
    s.health(1)
}

async fn prefill_info(State(s): State<Arc<Shared>>) -> Json<Value> {
    s.take_marker(0);
    let env = s.prefill.read().env.clone();
    let reported = s
        .reported_prefill
        .read()
        .clone()
        .unwrap_or_else(|| env.clone());
    let mut info = json!({"role": "prefill", "env": env, "flags": reported});
    info.as_object_mut()
        .unwrap()
        .extend(s.identity(0).as_object().unwrap().clone());
    Json(info)
}

async fn decode_info(State(s): State<Arc<Shared>>) -> Json<Value> {
    s.take_marker(1);
    let mut info = json!({"role": "decode"});
    info.as_object_mut()
        .unwrap()
        .extend(s.identity(1).as_object().unwrap().clone());
    Json(info)
}

async fn decode_metrics(State(s): State<Arc<Shared>>) -> String {
    format!(
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{model_name=\"fake\"}} {}\nsglang:num_queue_reqs{{model_name=\"fake\"}} 0\n",
        s.running.load(Ordering::Relaxed)
    )
}

struct Running<'a>(&'a AtomicU64);
impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A parsed task step: `N. tool(k=v, ...)`.
#[derive(Debug, Clone)]
pub struct Step {
    pub tool: String,
    pub args: serde_json::Map<String, Value>,
}

/// The fake's reading of a task message (the format of docs/design.md 3.4).
pub fn parse_steps(text: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some((num, rest)) = line.split_once(". ") else {
            continue;
        };
        if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Some((tool, args)) = rest.split_once('(') else {
            continue;
        };
        let Some(args) = args.strip_suffix(')') else {
            continue;
        };
        let mut map = serde_json::Map::new();
        let mut rest = args.trim();
        while !rest.is_empty() {
            let Some((key, after)) = rest.split_once('=') else {
                break;
            };
            let mut de = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            let Some(Ok(value)) = de.next() else { break };
            map.insert(key.trim().to_string(), value);
            rest = after[de.byte_offset()..]
                .trim_start()
                .trim_start_matches(',')
                .trim_start();
        }
        steps.push(Step {
            tool: tool.trim().to_string(),
            args: map,
        });
    }
    steps
}

pub fn task_hash(text: &str) -> u64 {
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// llama-server's reply when its chat parser cannot read the model's output: the
/// message of common/chat.cpp in the llama.cpp that scripts/llama-server.sh builds, in
/// the body tools/server/server-common.cpp's `format_error_response` gives it.
pub const LLAMA_REJECTION: &str = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected Hermes 2 Pro format","type":"server_error"}}"#;

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": {"message": message}}))).into_response()
}

async fn chat(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let n = s.requests.fetch_add(1, Ordering::Relaxed) + 1;
    if s.crash_at.load(Ordering::Relaxed) == n {
        s.generation[1].fetch_add(1, Ordering::Relaxed);
    }
    s.running.fetch_add(1, Ordering::Relaxed);
    let _running = Running(&s.running);
    let hold = s.hold_ms.load(Ordering::Relaxed);
    if hold > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(hold)).await;
    }
    let (prefill, decode) = (s.prefill.read().clone(), s.decode.read().clone());
    if decode.env_is("FAKE_ECHO_KEY", "1") {
        let sent = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return error(
            StatusCode::UNAUTHORIZED,
            &format!("invalid API key: {sent} is not a key of this deployment"),
        );
    }
    let p = prefill
        .env
        .get("FAKE_INDEX_BF16")
        .cloned()
        .unwrap_or_default();
    let d = decode
        .env
        .get("FAKE_INDEX_BF16")
        .cloned()
        .unwrap_or_default();
    if p != d {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("index dtype mismatch: prefill {p:?}, decode {d:?}"),
        );
    }
    if decode.env_is("FAKE_SLOW", "1") {
        let ms = decode
            .env
            .get("FAKE_SLOW_MS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let Some(task_at) = messages.iter().rposition(|m| {
        m["role"] == "user" && !parse_steps(m["content"].as_str().unwrap_or("")).is_empty()
    }) else {
        return error(StatusCode::BAD_REQUEST, "no task message");
    };
    let task_text = messages[task_at]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let steps = parse_steps(&task_text);
    let done = messages[task_at..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    let round = messages[task_at..]
        .iter()
        .filter(|m| m["role"] == "assistant")
        .count()
        + 1;
    let stream = body["stream"] == json!(true);
    if decode.env_is("FAKE_REJECT", "1") && round == 2 && task_hash(&task_text) % 4 == 0 {
        if stream {
            let first = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "<tool_call>{\"na"}}]});
            return sse(&[first.to_string(), LLAMA_REJECTION.to_string()]);
        }
        return (StatusCode::INTERNAL_SERVER_ERROR, LLAMA_REJECTION).into_response();
    }
    let racy = decode.env_is("FAKE_RACE", "1") && d == "1";
    if racy && round == 2 && task_hash(&task_text) % 4 == 0 {
        let salad = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"max_lines\" string=\"false\">false\">1</｜DSML｜parameter>\n</｜DSML｜parameter>";
        return Json(completion(
            json!({"role": "assistant", "content": salad}),
            "stop",
        ))
        .into_response();
    }
    if let (true, Some(step)) = (decode.env_is("FAKE_NO_PARSER", "1"), steps.get(done)) {
        let params: String = step
            .args
            .iter()
            .map(|(k, v)| {
                let (text, string) = match v {
                    Value::String(s) => (s.clone(), "true"),
                    other => (other.to_string(), "false"),
                };
                format!("<｜DSML｜parameter name=\"{k}\" string=\"{string}\">{text}</｜DSML｜parameter>\n")
            })
            .collect();
        let text = format!(
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"{}\">\n{params}</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
            step.tool
        );
        return Json(completion(
            json!({"role": "assistant", "content": text}),
            "stop",
        ))
        .into_response();
    }
    let message = match steps.get(done) {
        Some(step) => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_{round}"),
                "type": "function",
                "function": {"name": step.tool, "arguments": Value::Object(step.args.clone()).to_string()}
            }]
        }),
        None => json!({"role": "assistant", "content": "DONE: all steps completed."}),
    };
    let finish = if steps.get(done).is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    if stream {
        return streamed(message, finish);
    }
    Json(completion(message, finish)).into_response()
}

/// `events` as a 200 event stream, each a `data:` line; no `[DONE]` unless one of them
/// is it.
fn sse(events: &[String]) -> Response {
    let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        body,
    )
        .into_response()
}

/// A reply streamed as OpenAI servers do: the message as one delta (each call with its
/// index), the finish reason and usage, then `[DONE]`.
fn streamed(mut message: Value, finish: &str) -> Response {
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for (i, call) in calls.iter_mut().enumerate() {
            call["index"] = json!(i);
        }
    }
    let delta = json!({"choices": [{"index": 0, "delta": message}]});
    let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}});
    sse(&[delta.to_string(), end.to_string(), "[DONE]".to_string()])
}

fn completion(message: Value, finish: &str) -> Value {
    json!({
        "id": "fake",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    })
}
