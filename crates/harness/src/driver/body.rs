//! The request body of a chat round, built without re-serialising the conversation.
//!
//! A session's conversation only grows, and serde's string escaping of the whole of it on
//! every round was the client's largest cost (callgrind). So each message is serialised
//! once, when it joins the conversation ([`Transcript::push`]), and a round's body is three
//! byte slices spliced together: the fields before `messages` and the fields after it
//! ([`RequestTemplate`], serialised once per client) around the cached messages.
//!
//! The result is byte-for-byte what `serde_json` writes for the whole request
//! ([`reference_body`], kept as the specification the tests hold the splice to): the
//! template is cut out of serde's own serialisation of the request with an empty
//! `messages` array, and serde writes an array as `[` elements joined by `,` `]`.

use crate::config::workload::RequestOptions;
use crate::core::session::ChatMessage;
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde_json::Value;

/// Sampling limits sent with every request of a workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampling {
    pub max_tokens: u32,
    pub temperature: f64,
}

/// Every field of a chat request, in the order bisect sends them.
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
    /// The workload's extra request fields (the loader refuses names bisect sets).
    #[serde(flatten)]
    extra: &'a serde_json::Map<String, Value>,
}

impl<'a> ChatRequest<'a> {
    fn new(
        model: &'a str,
        messages: &'a [ChatMessage],
        tools: &'a [Value],
        sampling: Sampling,
        options: &'a RequestOptions,
    ) -> Self {
        ChatRequest {
            model,
            messages,
            tools,
            max_tokens: sampling.max_tokens,
            temperature: sampling.temperature,
            stream: options.stream,
            stream_options: options
                .stream
                .then(|| serde_json::json!({"include_usage": true})),
            tool_choice: options.tool_choice.as_ref(),
            extra: &options.extra,
        }
    }
}

/// The whole request serialised by serde in one go: what [`RequestTemplate::body`] must
/// equal, byte for byte.
pub(crate) fn reference_body(
    model: &str,
    messages: &[ChatMessage],
    tools: &[Value],
    sampling: Sampling,
    options: &RequestOptions,
) -> Vec<u8> {
    let request = ChatRequest::new(model, messages, tools, sampling, options);
    serde_json::to_vec(&request).expect("a chat request always serialises")
}

/// The fixed parts of every request of one client: the bytes before the first message
/// and after the last.
#[derive(Debug, Clone)]
pub(crate) struct RequestTemplate {
    /// `{"model":"...","messages":[`
    head: Vec<u8>,
    /// `],"tools":[...],"max_tokens":...}`
    tail: Vec<u8>,
}

impl RequestTemplate {
    pub fn new(model: &str, tools: &[Value], sampling: Sampling, options: &RequestOptions) -> Self {
        let empty = reference_body(model, &[], tools, sampling, options);
        // `model` is the only field before `messages`, and a string value cannot hold an
        // unescaped quote, so the first match is the field itself.
        const MARK: &[u8] = br#""messages":[]"#;
        let at = empty
            .windows(MARK.len())
            .position(|w| w == MARK)
            .expect("serde writes the messages field");
        let split = at + MARK.len() - 1;
        RequestTemplate {
            head: empty[..split].to_vec(),
            tail: empty[split..].to_vec(),
        }
    }

    /// The body of one round: the template around the transcript's cached messages.
    ///
    /// Built in this thread's [`BODIES`] buffer, not a fresh allocation.
    pub fn body(&self, transcript: &Transcript) -> Bytes {
        let messages = transcript.json();
        let len = self.head.len() + messages.len() + self.tail.len();
        BODIES.with_borrow_mut(|buffer| {
            buffer.reserve(len);
            buffer.extend_from_slice(&self.head);
            buffer.extend_from_slice(messages);
            buffer.extend_from_slice(&self.tail);
            buffer.split().freeze()
        })
    }
}

thread_local! {
    /// Where this thread builds request bodies. A body is written to its socket soon
    /// after it is built and then dropped, so by the next one this buffer is free again
    /// and `reserve` takes it back: every body is written into the same few KiB, which
    /// stay in cache. A fresh allocation per body came from wherever the allocator had
    /// room, cold memory once a thousand sessions' state no longer fits in the cache:
    /// with 1000 sessions in flight, the copy into it was the client's largest source of
    /// cache misses (callgrind's cache simulation, 15 write misses a request). A body
    /// still in flight when the next is built keeps its part, and the buffer moves on
    /// to a new allocation.
    static BODIES: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

thread_local! {
    /// Where this thread serialises a session's opening messages before they get an
    /// allocation of their own ([`Transcript::new`]).
    static OPENINGS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Room kept for the rounds after the opening `len` bytes of a conversation: each round
/// adds a reply and tool results, usually a few hundred bytes, so half the opening again
/// (at least 2 KiB) covers a session's rounds without a reallocation in most workloads;
/// a longer one grows the usual way.
fn headroom(len: usize) -> usize {
    (len / 2).max(2048)
}

/// A session's conversation, each message kept both as itself (for the classifier and
/// `sessions.jsonl`) and serialised once (for the next request's body).
#[derive(Debug, Clone, Default)]
pub(crate) struct Transcript {
    messages: Vec<ChatMessage>,
    /// The messages as serde writes the elements of a JSON array: each one's JSON,
    /// joined by `,`, without the brackets.
    json: Vec<u8>,
}

impl Transcript {
    /// The opening messages are serialised in this thread's scratch buffer and copied
    /// once into an allocation with room for the rounds ahead: grown from empty, the
    /// JSON went through a dozen reallocations per session, each a copy into memory the
    /// allocator had not touched lately, and with 1000 sessions in flight those copies
    /// were a tenth of the client's cache misses (callgrind's cache simulation).
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        let mut transcript = Transcript {
            messages: Vec::with_capacity(messages.len() + 8),
            json: Vec::new(),
        };
        OPENINGS.with_borrow_mut(|scratch| {
            scratch.clear();
            for (i, message) in messages.iter().enumerate() {
                if i > 0 {
                    scratch.push(b',');
                }
                serde_json::to_writer(&mut *scratch, message)
                    .expect("a chat message always serialises");
            }
            let mut json = Vec::with_capacity(scratch.len() + headroom(scratch.len()));
            json.extend_from_slice(scratch);
            transcript.json = json;
        });
        transcript.messages.extend(messages);
        transcript
    }

    pub fn push(&mut self, message: ChatMessage) {
        if !self.messages.is_empty() {
            self.json.push(b',');
        }
        serde_json::to_writer(&mut self.json, &message).expect("a chat message always serialises");
        self.messages.push(message);
    }

    pub fn extend(&mut self, messages: impl IntoIterator<Item = ChatMessage>) {
        for message in messages {
            self.push(message);
        }
    }

    #[cfg(test)]
    pub(crate) fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    pub(crate) fn into_messages(self) -> Vec<ChatMessage> {
        self.messages
    }

    fn json(&self) -> &[u8] {
        &self.json
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::{FunctionCall, ToolCall};
    use proptest::prelude::*;

    /// Strings that need every kind of escape serde_json knows, and some it does not.
    const TRICKY: &[&str] = &[
        "",
        "plain",
        "quote \" backslash \\ slash /",
        "newline\n tab\t return\r backspace\u{8} formfeed\u{c}",
        "nul \u{0} unit separator \u{1f} delete \u{7f}",
        "line separator \u{2028} paragraph \u{2029}",
        "DSML <｜DSML｜function_calls> 全角 émoji 🦀 \u{fffd}",
        "{\"messages\":[]}",
        "\"messages\":[",
    ];

    fn message(i: usize, text: &str) -> ChatMessage {
        match i % 4 {
            0 => ChatMessage::new("user", text),
            1 => ChatMessage {
                role: "assistant".into(),
                content: None,
                reasoning_content: Some(text.to_string()),
                tool_calls: Some(vec![ToolCall {
                    id: format!("call_{text}"),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: text.to_string(),
                        arguments: format!("{{\"path\":{}}}", serde_json::json!(text)),
                    },
                }]),
                ..Default::default()
            },
            2 => ChatMessage {
                role: "tool".into(),
                content: Some(text.to_string()),
                tool_call_id: Some(text.to_string()),
                name: Some(text.to_string()),
                ..Default::default()
            },
            _ => ChatMessage::new("system", text),
        }
    }

    fn options(stream: bool, extra_text: &str) -> RequestOptions {
        let mut extra = serde_json::Map::new();
        extra.insert("top_p".into(), serde_json::json!(0.95));
        extra.insert(
            format!("x_{}", extra_text.len()),
            serde_json::json!(extra_text),
        );
        RequestOptions {
            stream,
            tool_choice: Some(serde_json::json!({"type": "function", "note": extra_text})),
            extra,
            ..Default::default()
        }
    }

    fn assert_spliced_equals_serde(
        model: &str,
        texts: &[&str],
        tools: &[Value],
        sampling: Sampling,
        options: &RequestOptions,
    ) {
        let template = RequestTemplate::new(model, tools, sampling, options);
        let mut transcript = Transcript::default();
        // After every push: a session sends a body at each length of its conversation.
        for (i, text) in texts.iter().enumerate() {
            transcript.push(message(i, text));
            let spliced = template.body(&transcript);
            let whole = reference_body(model, transcript.messages(), tools, sampling, options);
            assert_eq!(
                String::from_utf8_lossy(&spliced),
                String::from_utf8_lossy(&whole)
            );
            let parsed: Value = serde_json::from_slice(&spliced).unwrap();
            let expected: Value = serde_json::from_slice(&whole).unwrap();
            assert_eq!(parsed, expected);
            assert_eq!(
                parsed["messages"].as_array().unwrap().len(),
                transcript.messages().len()
            );
        }
        // Opened with every message at once, then grown: the same bytes as pushed one by
        // one, whichever way it starts.
        for opening in 0..=texts.len() {
            let all: Vec<ChatMessage> = (0..texts.len()).map(|i| message(i, texts[i])).collect();
            let mut opened = Transcript::new(all[..opening].to_vec());
            opened.extend(all[opening..].iter().cloned());
            assert_eq!(template.body(&opened), template.body(&transcript));
        }
        // No message at all: `"messages":[]`.
        assert_eq!(
            template.body(&Transcript::new(Vec::new())),
            template.body(&Transcript::default())
        );
        let empty = template.body(&Transcript::default());
        assert_eq!(empty, reference_body(model, &[], tools, sampling, options));
    }

    #[test]
    fn spliced_body_is_serdes_whole_request_byte_for_byte() {
        let tools =
            [serde_json::json!({"type": "function", "function": {"name": "read_file \"x\""}})];
        let sampling = Sampling {
            max_tokens: 512,
            temperature: 0.7,
        };
        for model in TRICKY {
            for stream in [false, true] {
                for extra in [&[][..], &tools[..]] {
                    assert_spliced_equals_serde(
                        model,
                        TRICKY,
                        extra,
                        sampling,
                        &options(stream, model),
                    );
                }
            }
        }
        // No options at all: no stream_options, tool_choice or extra fields.
        assert_spliced_equals_serde(
            "m",
            TRICKY,
            &[],
            Sampling {
                max_tokens: 1,
                temperature: 0.0,
            },
            &RequestOptions::default(),
        );
    }

    #[test]
    fn transcript_keeps_every_message_in_order() {
        let mut transcript = Transcript::new(vec![message(0, "a"), message(3, "b")]);
        transcript.extend([message(1, "c"), message(2, "d")]);
        let messages = transcript.clone().into_messages();
        assert_eq!(messages.len(), 4);
        assert_eq!(messages.as_slice(), transcript.messages());
        let array: Value =
            serde_json::from_slice(&[b"[", transcript.json(), b"]"].concat()).unwrap();
        assert_eq!(array, serde_json::to_value(&messages).unwrap());
    }

    proptest! {
        #![proptest_config(crate::proptest_config::config())]
        #[test]
        fn any_text_splices_like_serde(
            texts in proptest::collection::vec(any::<String>(), 1..6),
            model in any::<String>(),
            temperature in -1.0e6f64..1.0e6,
        ) {
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let sampling = Sampling { max_tokens: 7, temperature };
            assert_spliced_equals_serde(&model, &texts, &[], sampling, &options(false, &model));
        }
    }
}
