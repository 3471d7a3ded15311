//! Streaming chat completions (server-sent events), built of `reply`'s pieces. Plain
//! text streams token by token; DSML tool-call markup is held back and sent as
//! `tool_calls` once the whole reply is parsed, as sglang's streaming detector does.

use super::reply::{finish_reason, tool_calls_json, Reply};
use super::CancelOnDrop;
use crate::dsml;
use crate::model;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::convert::Infallible;
use tokio::sync::{mpsc, oneshot};

/// Where DSML markup starts in streamed text: content before it streams token by token,
/// the markup is held back and sent as `tool_calls` once the whole reply is parsed;
/// markup that never parses goes out as content.
const DSML_START: &str = "<｜DSML｜";

/// Length of the longest suffix of `text` that could still grow into [`DSML_START`].
fn pending_markup_prefix(text: &str) -> usize {
    (1..DSML_START.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && DSML_START.is_char_boundary(n)
                && DSML_START.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

type Events = mpsc::Sender<Result<String, Infallible>>;

/// One streaming request: where its events go and how each is framed.
struct Stream {
    reply: Reply,
    events: Events,
    id: String,
    created: i64,
}

impl Stream {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let chunk = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.reply.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {chunk}\n\n")
    }

    /// Sends one event; false when the client is gone.
    async fn send(&self, event: String) -> bool {
        self.events.send(Ok(event)).await.is_ok()
    }

    /// Streams plain text as it is generated, stopping at DSML markup; returns the
    /// emitted text's byte length already sent, or None when the client went away.
    async fn stream_text(&self, token_stream: &mut mpsc::UnboundedReceiver<u32>) -> Option<usize> {
        let mut emitted = Vec::new();
        let mut sent = 0usize;
        let mut markup = false;
        while let Some(token) = token_stream.recv().await {
            emitted.push(token);
            if markup {
                continue;
            }
            let text = self.reply.shared.vocab.decode(&emitted);
            let safe = match text.find(DSML_START) {
                Some(at) => {
                    markup = true;
                    at
                }
                None => text.len() - pending_markup_prefix(&text),
            };
            if safe > sent {
                let delta = json!({"content": &text[sent..safe]});
                sent = safe;
                if !self.send(self.chunk(delta, None)).await {
                    return None;
                }
            }
        }
        Some(sent)
    }

    /// The events after generation: tool calls and any unsent text, then the finish
    /// reason with usage, then `[DONE]`.
    async fn finish(&self, generation: &model::Generation, sent: usize) {
        let text = self.reply.shared.vocab.decode(&generation.emitted);
        let parsed = dsml::parse(&text);
        let mut deltas = Vec::new();
        if parsed.tool_calls.is_empty() {
            if text.len() > sent {
                deltas.push(json!({"content": &text[sent..]}));
            }
        } else {
            deltas.push(json!({"tool_calls": tool_calls_json(&parsed)}));
            // Text after the block (the parser's content past what already streamed).
            if let Some(rest) = parsed.content.as_deref().and_then(|c| c.get(sent..)) {
                if !rest.is_empty() {
                    deltas.push(json!({"content": rest}));
                }
            }
        }
        let (prompt, completion) = (self.reply.prompt_tokens, generation.emitted.len());
        self.reply.shared.record_usage(prompt, completion);
        for delta in deltas {
            if !self.send(self.chunk(delta, None)).await {
                return;
            }
        }
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion});
        let mut choice =
            json!({"index": 0, "delta": {}, "finish_reason": finish_reason(generation, &parsed)});
        if let Some(top) = self.reply.top_logprobs {
            // The whole reply's tokens in the last chunk: the text streamed ahead of
            // them is held back at markup, so per-chunk lists would not line up with it.
            choice["logprobs"] = self.reply.logprobs(generation, top);
        }
        let last = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "choices": [choice], "usage": usage});
        self.send(format!("data: {last}\n\ndata: [DONE]\n\n")).await;
    }

    async fn fail(&self, message: String) {
        let error = json!({"error": {"message": message}});
        self.send(format!("data: {error}\n\ndata: [DONE]\n\n"))
            .await;
    }
}

/// SSE body of a streaming chat completion: one `chat.completion.chunk` per generated
/// token of plain text, the tool calls in one delta at the end, then the finish reason
/// with usage, then `[DONE]`. A client that disconnects drops the body, which cancels
/// the request in the decode loop.
pub(super) fn stream_completion(
    reply: Reply,
    mut token_stream: mpsc::UnboundedReceiver<u32>,
    receive: oneshot::Receiver<anyhow::Result<model::Generation>>,
    guard: CancelOnDrop,
) -> Response {
    let (events, body) = mpsc::channel(64);
    let stream = Stream {
        id: reply.shared.next_completion_id(),
        created: chrono::Utc::now().timestamp(),
        reply,
        events,
    };
    tokio::spawn(async move {
        // The guard moves into the task: dropping it early, with the task, is what
        // cancels the request when the client goes away.
        let guard = guard;
        if !stream
            .send(stream.chunk(json!({"role": "assistant"}), None))
            .await
        {
            return;
        }
        let Some(sent) = stream.stream_text(&mut token_stream).await else {
            return; // client gone: dropping the guard cancels the request
        };
        match receive.await {
            Ok(Ok(generation)) => {
                guard.disarm();
                stream.finish(&generation, sent).await;
            }
            Ok(Err(error)) => stream.fail(format!("{error:#}")).await,
            Err(_) => stream.fail("decode worker stopped".to_string()).await,
        }
    });
    let body = futures::stream::unfold(body, |mut body| async move {
        body.recv().await.map(|event| (event, body))
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_prefix_is_held_back() {
        assert_eq!(pending_markup_prefix("hello"), 0);
        assert_eq!(pending_markup_prefix("hello <"), 1);
        assert_eq!(pending_markup_prefix("x<｜"), "<｜".len());
        assert_eq!(pending_markup_prefix("x<｜D"), "<｜D".len());
        assert_eq!(pending_markup_prefix("x<y"), 0);
    }
}
