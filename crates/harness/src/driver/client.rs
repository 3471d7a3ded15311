//! The OpenAI chat client of the workload: one `POST {api}/chat/completions` per round,
//! non-streaming or (workload `stream = true`) server-sent events assembled into one
//! message the way OpenAI's client libraries do ([`assemble_stream`]: content and
//! reasoning concatenated, tool-call deltas joined by their `index`, the last
//! `finish_reason`, usage from the final chunk), with the workload's `tool_choice` and
//! extra fields in the body, and transport problems sorted into the round outcomes of
//! docs/design.md 3.5 (timeout; error: connect failure, non-2xx status, unparseable
//! body or stream). Also [`InFlight`], the client-side in-flight request counter the
//! metrics poller samples and run.json reports as `peak_running.client`.

use crate::config::workload::RequestOptions;
use crate::config::ToolSpec;
use crate::core::session::{ChatMessage, ToolCall};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Requests currently in flight from this client, and the most seen at once.
#[derive(Debug, Default)]
pub struct InFlight {
    current: AtomicU64,
    peak: AtomicU64,
}

impl InFlight {
    pub fn new() -> Self {
        Self::default()
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
    /// Connect failure, non-2xx status (with up to 200 chars of body), unparseable body.
    Error(String),
    /// No complete response within the per-request timeout.
    Timeout,
}

/// Sampling limits sent with every request of a workload.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f64,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: &'a [ChatMessage],
    #[serde(skip_serializing_if = "<[Value]>::is_empty")]
    tools: &'a [Value],
    max_tokens: u32,
    temperature: f64,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'a Value>,
    /// The workload's extra request fields (the loader refuses names bisect sets), written
    /// in place: no `Value` copy of the growing conversation per request.
    #[serde(flatten)]
    extra: &'a serde_json::Map<String, Value>,
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

/// One engine's chat endpoint; cheap to share (`reqwest::Client` pools connections).
#[derive(Debug, Clone)]
pub struct ChatClient {
    http: reqwest::Client,
    /// Parsed once: parsing it per request was a measurable share of the client's work.
    url: reqwest::Url,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    tool_choice: Option<Value>,
    extra: serde_json::Map<String, Value>,
    stream: bool,
}

impl ChatClient {
    /// The workload's request options: `tool_choice`, extra fields, streaming.
    pub fn with_options(mut self, options: &RequestOptions) -> Self {
        self.tool_choice = options.tool_choice.clone();
        self.extra = options.extra.clone();
        self.stream = options.stream;
        self
    }

    /// `api` is the OpenAI base URL (`http://host:port/v1`). The pool keeps an idle
    /// connection per session, so a thousand sessions reuse sockets between rounds, and
    /// proxies are ignored: the engine is usually on loopback.
    pub fn new(
        api: &str,
        model: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(16_384)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .connect_timeout(timeout.min(Duration::from_secs(30)))
            // An engine answers its chat endpoint itself; a redirect is a misconfigured
            // URL, reported as the HTTP status it is (and the redirect policy's per-request
            // URL bookkeeping is not paid).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("building the HTTP client")?;
        let url = format!("{}/chat/completions", api.trim_end_matches('/'));
        let url = reqwest::Url::parse(&url).with_context(|| format!("chat URL {url}"))?;
        Ok(ChatClient {
            http,
            url,
            model: model.to_string(),
            api_key,
            timeout,
            tool_choice: None,
            extra: serde_json::Map::new(),
            stream: false,
        })
    }

    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Sends one round and sorts what came back; never fails otherwise.
    pub async fn complete(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        sampling: Sampling,
        inflight: &InFlight,
    ) -> ChatOutcome {
        let _counted = inflight.enter();
        let body = ChatRequest {
            model: &self.model,
            messages,
            tools,
            max_tokens: sampling.max_tokens,
            temperature: sampling.temperature,
            stream: self.stream,
            stream_options: self
                .stream
                .then(|| serde_json::json!({"include_usage": true})),
            tool_choice: self.tool_choice.as_ref(),
            extra: &self.extra,
        };
        let mut request = self
            .http
            .post(self.url.clone())
            .timeout(self.timeout)
            .json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return transport_outcome(self.url.as_str(), e),
        };
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(b) => b,
            Err(e) => return transport_outcome(self.url.as_str(), e),
        };
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            // A server may echo the key it rejected: mask it before the excerpt can cut
            // it in half.
            let text = match &self.api_key {
                Some(key) => crate::redact::mask(&text, std::slice::from_ref(key)).into_owned(),
                None => text.into_owned(),
            };
            return ChatOutcome::Error(format!("HTTP {status}: {}", excerpt(&text, 200)));
        }
        if self.stream {
            assemble_stream(&text)
        } else {
            parse_reply(&text)
        }
    }
}

fn transport_outcome(url: &str, error: reqwest::Error) -> ChatOutcome {
    if error.is_timeout() {
        return ChatOutcome::Timeout;
    }
    let kind = if error.is_connect() {
        "connect error"
    } else if error.is_body() || error.is_decode() {
        "error reading the response body"
    } else {
        "request error"
    };
    // The source chain holds the useful part ("Connection refused", "reset by peer").
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(s) = source {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        source = s.source();
    }
    ChatOutcome::Error(format!("{kind} ({url}): {detail}"))
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
        let sampling = Sampling {
            max_tokens: 8,
            temperature: 0.0,
        };
        let counter = InFlight::new();
        let ChatOutcome::Error(e) = client.complete(&[], &[], sampling, &counter).await else {
            panic!("expected an error")
        };
        assert!(e.starts_with("connect error"), "{e}");
        assert_eq!(counter.current(), 0);
        assert_eq!(counter.peak(), 1);
    }
}
