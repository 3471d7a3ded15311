//! A chat completion's body read into a round outcome: a JSON reply ([`parse_reply`]) or
//! server-sent events assembled into one message the way OpenAI's client libraries do
//! ([`assemble_stream`]).
//!
//! A stream is a clean reply only when it ends as streams end: `data: [DONE]`, or a
//! chunk with a finish reason. An error event inside it (llama-server sends a parse
//! failure after the first chunk as `data: {"error": {...}}` after HTTP 200, with no
//! `[DONE]`; vLLM's is `{"object": "error", ...}` or `{"error": {...}}` by version) is
//! the engine's error reply, whatever came before it: the classifier judges it with the
//! target's rejection patterns like a non-2xx reply, with the partial text as evidence.

use serde::Deserialize;

use super::{ChatOutcome, ChatReply};
use crate::core::oracle::TokenChoice;
use crate::core::session::{ChatMessage, ToolCall};

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
    #[serde(default)]
    logprobs: Option<Logprobs>,
}

/// `choices[0].logprobs` as OpenAI's chat API serves it when `logprobs: true` is asked
/// (llama.cpp, vLLM and SGLang serve the same shape): one entry per generated token,
/// with `top_logprobs` when `top_logprobs: k` is asked too. `null` reads as none.
#[derive(Deserialize, Default)]
struct Logprobs {
    #[serde(default, deserialize_with = "null_as_empty")]
    content: Vec<LogprobEntry>,
}

#[derive(Deserialize)]
struct LogprobEntry {
    token: String,
    logprob: f64,
    #[serde(default, deserialize_with = "null_as_empty")]
    top_logprobs: Vec<TopLogprob>,
}

#[derive(Deserialize)]
struct TopLogprob {
    token: String,
    logprob: f64,
}

impl From<LogprobEntry> for TokenChoice {
    fn from(e: LogprobEntry) -> Self {
        TokenChoice {
            token: e.token,
            logprob: e.logprob,
            top: e
                .top_logprobs
                .into_iter()
                .map(|t| (t.token, t.logprob))
                .collect(),
        }
    }
}

/// The reply's tokens, or `None` when the engine served no log-probabilities.
fn tokens_of(logprobs: Option<Logprobs>) -> Option<Vec<TokenChoice>> {
    let content = logprobs?.content;
    (!content.is_empty()).then(|| content.into_iter().map(TokenChoice::from).collect())
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

/// First `n` characters, on a char boundary.
pub(super) fn excerpt(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// Parses a 2xx body into a reply; anything else is an `Error` quoting the body.
pub(crate) fn parse_reply(body: &str) -> ChatOutcome {
    match serde_json::from_str::<ChatResponse>(body) {
        Ok(response) => match response.choices.into_iter().next() {
            Some(choice) => ChatOutcome::Reply(ChatReply {
                message: choice.message,
                completion_tokens: response.usage.as_ref().map_or(0, |u| u.completion_tokens),
                prompt_tokens: response.usage.and_then(|u| u.prompt_tokens),
                finish_reason: choice.finish_reason,
                tokens: tokens_of(choice.logprobs),
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
    /// `{"error": {"code": 500, "message": ...}}` (llama.cpp, SGLang, newer vLLM).
    #[serde(default)]
    error: Option<ErrorDetail>,
    /// `"error"` in vLLM's flat error object (`{"object": "error", "code": 400, ...}`).
    #[serde(default)]
    object: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: Option<serde_json::Value>,
}

/// The status an error event stands for: its code where that is an HTTP error status;
/// else 500 (the event is a server's error reply, and the HTTP status line already said
/// 200).
fn event_status(code: Option<&serde_json::Value>) -> hyper::StatusCode {
    code.and_then(serde_json::Value::as_u64)
        .filter(|c| (400..=599).contains(c))
        .and_then(|c| hyper::StatusCode::from_u16(c as u16).ok())
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR)
}

/// An error event (`{"error": {...}}`, or vLLM's flat `{"object": "error", ...}`) as the
/// engine's error reply, with what the stream had said before it; `None` for any other
/// chunk.
fn error_event(
    chunk: &StreamChunk,
    data: &str,
    message: &ChatMessage,
    calls: &[ToolCall],
) -> Option<ChatOutcome> {
    let flat_error = chunk.object.as_deref() == Some("error");
    if chunk.error.is_none() && !flat_error {
        return None;
    }
    let code = match &chunk.error {
        Some(detail) => detail.code.as_ref(),
        None => chunk.code.as_ref(),
    };
    Some(ChatOutcome::Status {
        status: event_status(code),
        body: excerpt(data, crate::core::session::HTTP_BODY_KEPT).to_string(),
        partial: Some(partial_text(message, calls)),
    })
}

/// One chunk's tool-call deltas folded into the calls by their `index`: id and type
/// from the first delta that has them, name and arguments concatenated.
fn merge_tool_call_deltas(calls: &mut Vec<ToolCall>, deltas: Vec<ToolCallDelta>) {
    for d in deltas {
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

/// What a stream had said before it ended badly: its text, reasoning and the calls as
/// far as they came, for the evidence.
fn partial_text(message: &ChatMessage, calls: &[ToolCall]) -> String {
    let mut out = String::new();
    for piece in [&message.reasoning_content, &message.content]
        .into_iter()
        .flatten()
    {
        out.push_str(piece);
    }
    for call in calls {
        out.push_str(&format!(
            "{}({})",
            call.function.name, call.function.arguments
        ));
    }
    out
}

#[derive(Deserialize)]
struct StreamChoice {
    #[serde(default)]
    delta: StreamDelta,
    #[serde(default)]
    finish_reason: Option<String>,
    /// This chunk's tokens' log-probabilities, concatenated over the stream.
    #[serde(default)]
    logprobs: Option<Logprobs>,
}

#[derive(Deserialize, Default)]
struct StreamDelta {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    /// `null` reads as none (servers send `"tool_calls": null`, as OpenAI's clients
    /// accept).
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<ToolCallDelta>,
}

fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
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
/// quoting it; an error event is the engine's error reply ([`ChatOutcome::Status`] with
/// the partial text); a stream that ends with neither `[DONE]` nor a finish reason was
/// cut off, an error.
pub(crate) fn assemble_stream(body: &str) -> ChatOutcome {
    let mut message = ChatMessage {
        role: "assistant".into(),
        ..Default::default()
    };
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut finish_reason = None;
    let mut tokens: Vec<TokenChoice> = Vec::new();
    let mut completion_tokens = 0;
    let mut prompt_tokens = None;
    let mut chunks = 0;
    let mut done = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
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
        if let Some(outcome) = error_event(&chunk, data, &message, &calls) {
            return outcome;
        }
        if let Some(usage) = chunk.usage {
            completion_tokens = usage.completion_tokens;
            prompt_tokens = usage.prompt_tokens.or(prompt_tokens);
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            continue;
        };
        if let Some(reason) = choice.finish_reason {
            finish_reason = Some(reason);
        }
        if let Some(logprobs) = choice.logprobs {
            tokens.extend(logprobs.content.into_iter().map(TokenChoice::from));
        }
        let delta = choice.delta;
        if let Some(role) = delta.role {
            message.role = role;
        }
        append(&mut message.content, delta.content);
        append(&mut message.reasoning_content, delta.reasoning_content);
        merge_tool_call_deltas(&mut calls, delta.tool_calls);
    }
    if chunks == 0 {
        return ChatOutcome::Error(format!("stream has no data chunks: {}", excerpt(body, 200)));
    }
    if !done && finish_reason.is_none() {
        return ChatOutcome::Error(format!(
            "the stream ended after {chunks} chunks with neither [DONE] nor a finish reason (cut off); streamed before the end: {:?}",
            excerpt(&partial_text(&message, &calls), 200)
        ));
    }
    if !calls.is_empty() {
        message.tool_calls = Some(calls);
    }
    ChatOutcome::Reply(ChatReply {
        message,
        completion_tokens,
        prompt_tokens,
        finish_reason,
        tokens: (!tokens.is_empty()).then_some(tokens),
    })
}
