//! The OpenAI chat client of the workload: one non-streaming
//! `POST {api}/chat/completions` per round, with transport problems sorted into the
//! round outcomes of docs/design.md 3.5 (timeout; error: connect failure, non-2xx status,
//! unparseable body). Also [`InFlight`], the client-side in-flight request counter the
//! metrics poller samples and run.json reports as `peak_running.client`.

use crate::config::ToolSpec;
use crate::core::session::ChatMessage;
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
    url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
}

impl ChatClient {
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
            .build()
            .context("building the HTTP client")?;
        Ok(ChatClient {
            http,
            url: format!("{}/chat/completions", api.trim_end_matches('/')),
            model: model.to_string(),
            api_key,
            timeout,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
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
            stream: false,
        };
        let mut request = self.http.post(&self.url).timeout(self.timeout).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return transport_outcome(&self.url, e),
        };
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(b) => b,
            Err(e) => return transport_outcome(&self.url, e),
        };
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            return ChatOutcome::Error(format!("HTTP {status}: {}", excerpt(&text, 200)));
        }
        parse_reply(&text)
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
