//! Shared vocabulary of the harness: chat messages as the OpenAI API carries them,
//! per-round and per-session classes (docs/design.md 3.5), and one session's result record
//! (a line of `sessions.jsonl`, docs/design.md 3.6).

use serde::{Deserialize, Serialize};

/// One OpenAI chat message, as sent to and received from `/v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: Some(content.into()),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, exactly as the server sent it (it may not parse: that is evidence).
    #[serde(default)]
    pub arguments: String,
}

/// The class of one round (one request/response), first match wins (docs/design.md 3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundClass {
    Ok,
    Error,
    Timeout,
    Leak,
    BadArgs,
    WrongArgs,
    NoTool,
    /// The reply was cut off by `max_tokens` (`finish_reason: "length"`) and would
    /// otherwise have been judged corrupted: the cut, not the engine, explains it.
    Truncated,
    /// The engine refused to return the model's output: a non-2xx reply whose status
    /// and body match one of the target's rejection patterns (its tool-call parser
    /// failed on what the model wrote). Corruption, with the body as evidence.
    Rejected,
    /// The round failed because the engine died (core::deaths): its refused or cut
    /// connection is the death's, not an infrastructure error nor a timeout.
    Crashed,
}

/// The class of a whole session: its first non-ok round's class, else done/maxrounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionClass {
    Done,
    Maxrounds,
    Leak,
    BadArgs,
    WrongArgs,
    NoTool,
    Error,
    Timeout,
    /// Ended by a reply cut off at `max_tokens`: neither corruption nor failure,
    /// reported beside the rates (docs/design.md 3.5).
    Truncated,
    /// Ended by the engine rejecting the model's output as unparseable tool-call
    /// markup (a non-2xx reply matching the target's rejection patterns): corruption
    /// the engine caught before it reached the client. Last, so the order (and `Ord`)
    /// of the classes that existed before it is unchanged.
    Rejected,
    /// Cut short by the engine's death (core::deaths): judged with the deaths, by engine
    /// lives, never as clean, timed out or corrupted. Last, for the same reason.
    Crashed,
}

impl SessionClass {
    pub const ALL: [SessionClass; 11] = [
        SessionClass::Done,
        SessionClass::Maxrounds,
        SessionClass::Leak,
        SessionClass::BadArgs,
        SessionClass::WrongArgs,
        SessionClass::NoTool,
        SessionClass::Error,
        SessionClass::Timeout,
        SessionClass::Truncated,
        SessionClass::Rejected,
        SessionClass::Crashed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SessionClass::Done => "done",
            SessionClass::Maxrounds => "maxrounds",
            SessionClass::Leak => "leak",
            SessionClass::BadArgs => "bad_args",
            SessionClass::WrongArgs => "wrong_args",
            SessionClass::NoTool => "no_tool",
            SessionClass::Error => "error",
            SessionClass::Timeout => "timeout",
            SessionClass::Truncated => "truncated",
            SessionClass::Rejected => "rejected",
            SessionClass::Crashed => "crashed",
        }
    }

    /// Corrupted = leak + bad_args + wrong_args + no_tool + rejected. A rejected
    /// session is the engine refusing a call it could not parse: counted as an error it
    /// would leave the denominator, and a flag that corrupts calls past parsing would
    /// look cleaner than one that corrupts them a little.
    pub fn is_corrupted(self) -> bool {
        matches!(
            self,
            SessionClass::Leak
                | SessionClass::BadArgs
                | SessionClass::WrongArgs
                | SessionClass::NoTool
                | SessionClass::Rejected
        )
    }

    /// error/timeout: not corruption, but they make an arm "degraded".
    pub fn is_failure(self) -> bool {
        matches!(self, SessionClass::Error | SessionClass::Timeout)
    }

    /// Could this session show corruption: neither failed, nor cut off at max_tokens,
    /// nor cut short by the engine's death (`Counts::judged` counts these).
    pub(crate) fn is_judged(self) -> bool {
        !self.is_failure() && !matches!(self, SessionClass::Truncated | SessionClass::Crashed)
    }

    pub(crate) fn from_round(class: RoundClass) -> Option<SessionClass> {
        Some(match class {
            RoundClass::Ok => return None,
            RoundClass::Error => SessionClass::Error,
            RoundClass::Timeout => SessionClass::Timeout,
            RoundClass::Leak => SessionClass::Leak,
            RoundClass::BadArgs => SessionClass::BadArgs,
            RoundClass::WrongArgs => SessionClass::WrongArgs,
            RoundClass::NoTool => SessionClass::NoTool,
            RoundClass::Truncated => SessionClass::Truncated,
            RoundClass::Rejected => SessionClass::Rejected,
            RoundClass::Crashed => SessionClass::Crashed,
        })
    }
}

/// Counts per session class, serialised with the class names of docs/design.md 3.6.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub done: u64,
    pub maxrounds: u64,
    pub leak: u64,
    pub bad_args: u64,
    pub wrong_args: u64,
    pub no_tool: u64,
    pub error: u64,
    pub timeout: u64,
    /// Written only when non-zero, so records from before the class existed keep
    /// their shape when rewritten; absent reads as 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub truncated: u64,
    /// Likewise written only when non-zero (records before the class read as 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejected: u64,
    /// Likewise (sessions cut short by an engine death).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub crashed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Counts {
    pub fn add(&mut self, class: SessionClass) {
        *self.slot(class) += 1;
    }

    pub fn get(&self, class: SessionClass) -> u64 {
        match class {
            SessionClass::Done => self.done,
            SessionClass::Maxrounds => self.maxrounds,
            SessionClass::Leak => self.leak,
            SessionClass::BadArgs => self.bad_args,
            SessionClass::WrongArgs => self.wrong_args,
            SessionClass::NoTool => self.no_tool,
            SessionClass::Error => self.error,
            SessionClass::Timeout => self.timeout,
            SessionClass::Truncated => self.truncated,
            SessionClass::Rejected => self.rejected,
            SessionClass::Crashed => self.crashed,
        }
    }

    fn slot(&mut self, class: SessionClass) -> &mut u64 {
        match class {
            SessionClass::Done => &mut self.done,
            SessionClass::Maxrounds => &mut self.maxrounds,
            SessionClass::Leak => &mut self.leak,
            SessionClass::BadArgs => &mut self.bad_args,
            SessionClass::WrongArgs => &mut self.wrong_args,
            SessionClass::NoTool => &mut self.no_tool,
            SessionClass::Error => &mut self.error,
            SessionClass::Timeout => &mut self.timeout,
            SessionClass::Truncated => &mut self.truncated,
            SessionClass::Rejected => &mut self.rejected,
            SessionClass::Crashed => &mut self.crashed,
        }
    }

    pub fn merge(&mut self, other: &Counts) {
        for c in SessionClass::ALL {
            *self.slot(c) += other.get(c);
        }
    }

    pub fn total(&self) -> u64 {
        SessionClass::ALL.iter().map(|c| self.get(*c)).sum()
    }

    pub fn corrupted(&self) -> u64 {
        self.leak + self.bad_args + self.wrong_args + self.no_tool + self.rejected
    }

    pub fn failed(&self) -> u64 {
        self.error + self.timeout
    }

    /// Sessions that could show corruption: neither failed (error, timeout) nor cut off
    /// at max_tokens. The denominator of every corruption rate: a session that never
    /// got a whole reply in is not evidence of a clean engine, so counting it as clean
    /// would let an arm that times out or truncates look cleaner, or let a run where
    /// nothing was judged look like one where nothing went wrong.
    pub fn judged(&self) -> u64 {
        self.total()
            .saturating_sub(self.failed())
            .saturating_sub(self.truncated)
            .saturating_sub(self.crashed)
    }
}

/// One round as the driver saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundRecord {
    pub round: u32,
    pub class: RoundClass,
    pub(crate) latency_ms: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    /// The text that decided the class (for ok rounds: the call that was accepted).
    #[serde(default)]
    pub evidence: String,
    /// `choices[0].finish_reason` as the engine sent it (`stop`, `tool_calls`,
    /// `length`); absent in records written before it was kept, and for rounds with no
    /// reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// A non-2xx reply's status and body (the first [`HTTP_BODY_KEPT`] characters), so
    /// `bisect reclassify` can judge it again against the run's rejection patterns;
    /// absent for every other round and in records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpReply>,
}

/// How much of a non-2xx reply's body is judged and kept: engines' error bodies are a
/// short JSON object, but llama.cpp's older parse error quotes the rest of the model's
/// output after the position it failed at.
pub(crate) const HTTP_BODY_KEPT: usize = 2000;

/// A non-2xx reply as the client received it (the API key masked), or an error event
/// a server sent inside a 200 event stream (then `status` is the event's own code, and
/// `partial` the reply text streamed before it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpReply {
    pub status: u16,
    pub body: String,
    /// Set for an error event that arrived mid-stream: what the reply had said before it
    /// (content, reasoning and tool-call text as streamed), kept as evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

/// One session's result: a line of sessions.jsonl.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionResult {
    /// Arm label (`on`/`off`), or the cell/probe label.
    pub label: String,
    pub repeat: u32,
    pub index: u32,
    pub class: SessionClass,
    pub rounds_used: u32,
    pub first_bad_round: Option<u32>,
    pub evidence: String,
    pub transcript: Vec<ChatMessage>,
    pub rounds: Vec<RoundRecord>,
    pub(crate) latency_ms: Vec<u64>,
    pub completion_tokens: u64,
    pub error: Option<String>,
}
