//! The OpenAI reply of a chat completion, what both its forms (the `chat.completion`
//! here, the stream in `sse`) are made of: [`Reply`], the pieces they share
//! (`finish_reason`, `tool_calls`, `logprobs`), and [`ReplyShared`], the vocabulary,
//! completion ids and usage counters every reply of the decode role uses.

use crate::dsml;
use crate::model::{Finish, Generation};
use crate::tokenizer::Vocab;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What every reply of the decode role shares. Kept apart from `DecodeShared` so that
/// replies, streamed or not, need nothing of the role that produced the generation.
pub(super) struct ReplyShared {
    pub(super) vocab: Vocab,
    pub(super) requests: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) completion_tokens: AtomicU64,
    next_id: AtomicU64,
}

impl ReplyShared {
    pub(super) fn new() -> Self {
        ReplyShared {
            vocab: Vocab::new(),
            requests: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        }
    }

    pub(super) fn next_completion_id(&self) -> String {
        format!("chatcmpl-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Counts one answered request.
    pub(super) fn record_usage(&self, prompt_tokens: usize, completion_tokens: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion_tokens as u64, Ordering::Relaxed);
    }
}

/// OpenAI `finish_reason` of a finished generation.
pub(super) fn finish_reason(generation: &Generation, parsed: &dsml::ParsedOutput) -> &'static str {
    match (generation.finish, parsed.tool_calls.is_empty()) {
        (Some(Finish::Length), _) => "length",
        (_, false) => "tool_calls",
        _ => "stop",
    }
}

/// OpenAI `tool_calls` of a parsed reply (the `index` key serves streaming deltas and is
/// ignored by non-streaming clients).
pub(super) fn tool_calls_json(parsed: &dsml::ParsedOutput) -> Vec<Value> {
    parsed
        .tool_calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            json!({"index": index, "id": format!("call_{index}"), "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}})
        })
        .collect()
}

/// What a reply needs besides the generation.
pub(super) struct Reply {
    pub(super) shared: Arc<ReplyShared>,
    pub(super) model: String,
    pub(super) prompt_tokens: usize,
    /// The request's `top_logprobs` when it asked for `logprobs` (`None`: not asked).
    pub(super) top_logprobs: Option<usize>,
}

impl Reply {
    /// The non-streaming `chat.completion` of a finished generation.
    pub(super) fn complete(&self, generation: &Generation) -> Response {
        let shared = &self.shared;
        let text = shared.vocab.decode(&generation.emitted);
        let parsed = dsml::parse(&text);
        let finish_reason = finish_reason(generation, &parsed);
        let id = shared.next_completion_id();
        let (prompt, completion) = (self.prompt_tokens, generation.emitted.len());
        shared.record_usage(prompt, completion);
        let tool_calls = (!parsed.tool_calls.is_empty()).then(|| tool_calls_json(&parsed));
        let message = json!({"role": "assistant", "content": parsed.content, "tool_calls": tool_calls, "reasoning_content": null});
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
        let mut choice = json!({"index": 0, "message": message, "finish_reason": finish_reason});
        if let Some(top) = self.top_logprobs {
            choice["logprobs"] = self.logprobs(generation, top);
        }
        Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": chrono::Utc::now().timestamp(),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }))
        .into_response()
    }

    /// OpenAI's `choices[0].logprobs` of a finished generation, `top` alternatives a
    /// token: `{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`, or `null`
    /// where the backend gave no distribution for some token (the CUDA kernels return
    /// the argmax only): no partial list that a reader could take for the whole reply.
    pub(super) fn logprobs(&self, generation: &Generation, top: usize) -> serde_json::Value {
        let vocab = &self.shared.vocab;
        let content: Option<Vec<serde_json::Value>> = generation
            .emitted
            .iter()
            .zip(&generation.probs)
            .map(|(&token, prob)| {
                let prob = prob.as_ref()?;
                let text = vocab.decode(&[token]);
                let alternatives: Vec<serde_json::Value> = prob
                    .top
                    .iter()
                    .take(top)
                    .map(|&(t, lp)| {
                        let text = vocab.decode(&[t]);
                        json!({"token": text, "logprob": lp, "bytes": text.as_bytes()})
                    })
                    .collect();
                Some(
                    json!({"token": text, "logprob": prob.logprob, "bytes": text.as_bytes(),
                    "top_logprobs": alternatives}),
                )
            })
            .collect();
        match content {
            Some(content) => json!({ "content": content }),
            None => serde_json::Value::Null,
        }
    }
}
