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

impl RoundClass {
    /// Whether the round got the model's reply (an assistant message in the
    /// transcript): not a failed request, an engine's rejection or a death.
    pub(crate) fn carries_reply(self) -> bool {
        match self {
            RoundClass::Ok
            | RoundClass::Leak
            | RoundClass::BadArgs
            | RoundClass::WrongArgs
            | RoundClass::NoTool
            | RoundClass::Truncated => true,
            RoundClass::Error
            | RoundClass::Timeout
            | RoundClass::Rejected
            | RoundClass::Crashed => false,
        }
    }
}

/// The class of a whole session: its first non-ok round's class, else done/maxrounds.
///
/// The variants are the only list of the classes: [`SessionClass::iter`], the count
/// and the names come from them, and every property below is an exhaustive `match`, so
/// a new class is a variant here, its answers to those matches, and its classifier rule.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::EnumCount,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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
    /// Well-formed, but not what the same session answered alone (core::oracle): the
    /// first reply that differs parted from its reference where the reference's choice
    /// won by a wide margin (or, without log-probabilities, at all). Corruption the
    /// classifier cannot see; judged only with `--oracle solo`.
    Diverged,
    /// Parted from its reference at a near-tie of the reference's own choice: numerical
    /// drift on an engine that is not batch-invariant, recorded, not corruption.
    Drifted,
}

impl SessionClass {
    /// Every class, in the order of the enum (the order records and tables use).
    pub fn iter() -> impl Iterator<Item = SessionClass> + Clone {
        <SessionClass as strum::IntoEnumIterator>::iter()
    }

    /// How many classes there are.
    pub(crate) const COUNT: usize = <SessionClass as strum::EnumCount>::COUNT;

    /// The name records and reports use (docs/design.md 3.6): `bad_args`, `no_tool`...
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The classes that count as corruption, in order.
    pub fn corrupted() -> impl Iterator<Item = SessionClass> + Clone {
        Self::iter().filter(|c| c.is_corrupted())
    }

    /// Corrupted = leak + bad_args + wrong_args + no_tool + rejected + diverged. A rejected
    /// session is the engine refusing a call it could not parse: counted as an error it
    /// would leave the denominator, and a flag that corrupts calls past parsing would
    /// look cleaner than one that corrupts them a little.
    pub fn is_corrupted(self) -> bool {
        match self {
            SessionClass::Leak
            | SessionClass::BadArgs
            | SessionClass::WrongArgs
            | SessionClass::NoTool
            | SessionClass::Rejected
            | SessionClass::Diverged => true,
            SessionClass::Done
            | SessionClass::Maxrounds
            | SessionClass::Error
            | SessionClass::Timeout
            | SessionClass::Truncated
            | SessionClass::Crashed
            | SessionClass::Drifted => false,
        }
    }

    /// error/timeout: not corruption, but they make an arm "degraded".
    pub fn is_failure(self) -> bool {
        matches!(self, SessionClass::Error | SessionClass::Timeout)
    }

    /// Could this session show corruption: neither failed, nor cut off at max_tokens,
    /// nor cut short by the engine's death (`Counts::judged` counts these).
    pub fn is_judged(self) -> bool {
        !self.is_failure() && !matches!(self, SessionClass::Truncated | SessionClass::Crashed)
    }

    /// A class added after the first records were written: its count is written only
    /// when non-zero and reads as 0 when absent, so older records keep their shape when
    /// rewritten. Every class added from now on answers true.
    pub fn recorded_when_nonzero(self) -> bool {
        match self {
            SessionClass::Done
            | SessionClass::Maxrounds
            | SessionClass::Leak
            | SessionClass::BadArgs
            | SessionClass::WrongArgs
            | SessionClass::NoTool
            | SessionClass::Error
            | SessionClass::Timeout => false,
            SessionClass::Truncated
            | SessionClass::Rejected
            | SessionClass::Crashed
            | SessionClass::Diverged
            | SessionClass::Drifted => true,
        }
    }

    /// The name in the tables' narrow columns (`done/max`, `leak/bad/wrong/no_tool/rejected`).
    pub fn short_name(self) -> &'static str {
        match self {
            SessionClass::Maxrounds => "max",
            SessionClass::BadArgs => "bad",
            SessionClass::WrongArgs => "wrong",
            other => other.name(),
        }
    }

    /// Only the solo oracle gives this class (`--oracle solo`): tables show it only in
    /// runs the oracle judged.
    pub fn needs_oracle(self) -> bool {
        matches!(self, SessionClass::Diverged | SessionClass::Drifted)
    }

    /// One letter per session in culprit's step log (docs/culprit.md).
    pub fn letter(self) -> char {
        match self {
            SessionClass::Done => 'd',
            SessionClass::Maxrounds => 'm',
            SessionClass::Leak => 'l',
            SessionClass::BadArgs => 'b',
            SessionClass::WrongArgs => 'w',
            SessionClass::NoTool => 'n',
            SessionClass::Error => 'e',
            SessionClass::Timeout => 't',
            SessionClass::Truncated => 'c',
            SessionClass::Rejected => 'r',
            SessionClass::Crashed => 'x',
            SessionClass::Diverged => 'v',
            SessionClass::Drifted => 'f',
        }
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

/// Sessions per class, indexed by the class (`counts[SessionClass::Leak]`), serialised
/// as an object with the class names of docs/design.md 3.6 in the enum's order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; SessionClass::COUNT]);

impl std::ops::Index<SessionClass> for Counts {
    type Output = u64;
    fn index(&self, class: SessionClass) -> &u64 {
        &self.0[class as usize]
    }
}

impl std::ops::IndexMut<SessionClass> for Counts {
    fn index_mut(&mut self, class: SessionClass) -> &mut u64 {
        &mut self.0[class as usize]
    }
}

impl<const N: usize> From<[(SessionClass, u64); N]> for Counts {
    fn from(pairs: [(SessionClass, u64); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl FromIterator<(SessionClass, u64)> for Counts {
    fn from_iter<I: IntoIterator<Item = (SessionClass, u64)>>(pairs: I) -> Self {
        let mut counts = Counts::default();
        for (class, n) in pairs {
            counts[class] += n;
        }
        counts
    }
}

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let written = SessionClass::iter()
            .filter(|c| !(c.recorded_when_nonzero() && self[*c] == 0))
            .collect::<Vec<_>>();
        let mut map = serializer.serialize_map(Some(written.len()))?;
        for class in written {
            map.serialize_entry(class.name(), &self[class])?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Counts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountsVisitor;
        impl<'de> serde::de::Visitor<'de> for CountsVisitor {
            type Value = Counts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of session counts by class name")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Counts, A::Error> {
                let mut counts = Counts::default();
                let mut seen = [false; SessionClass::COUNT];
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    // A name this build does not know is a later class: ignored, as
                    // serde ignores unknown fields.
                    match key.parse::<SessionClass>() {
                        Ok(class) => {
                            counts[class] = map.next_value()?;
                            seen[class as usize] = true;
                        }
                        Err(_) => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                if let Some(missing) =
                    SessionClass::iter().find(|c| !c.recorded_when_nonzero() && !seen[*c as usize])
                {
                    return Err(serde::de::Error::missing_field(missing.name()));
                }
                Ok(counts)
            }
        }
        deserializer.deserialize_map(CountsVisitor)
    }
}

impl Counts {
    pub fn add(&mut self, class: SessionClass) {
        self[class] += 1;
    }

    pub fn get(&self, class: SessionClass) -> u64 {
        self[class]
    }

    pub fn merge(&mut self, other: &Counts) {
        for c in SessionClass::iter() {
            self[c] += other[c];
        }
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub fn corrupted(&self) -> u64 {
        SessionClass::corrupted().map(|c| self[c]).sum()
    }

    pub fn failed(&self) -> u64 {
        SessionClass::iter()
            .filter(|c| c.is_failure())
            .map(|c| self[c])
            .sum()
    }

    /// Sessions that could show corruption: neither failed (error, timeout) nor cut off
    /// at max_tokens. The denominator of every corruption rate: a session that never
    /// got a whole reply in is not evidence of a clean engine, so counting it as clean
    /// would let an arm that times out or truncates look cleaner, or let a run where
    /// nothing was judged look like one where nothing went wrong.
    pub fn judged(&self) -> u64 {
        SessionClass::iter()
            .filter(|c| c.is_judged())
            .map(|c| self[c])
            .sum()
    }
}

/// One round as the driver saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundRecord {
    pub round: u32,
    pub class: RoundClass,
    pub latency_ms: u64,
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
    /// The reply's tokens with their log-probabilities, when the workload asked for them
    /// (`[request.extra] logprobs = true, top_logprobs = k`) and the engine served them:
    /// the solo oracle's evidence (core::oracle). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<crate::oracle::TokenChoice>>,
}

/// How much of a non-2xx reply's body is judged and kept: engines' error bodies are a
/// short JSON object, but llama.cpp's older parse error quotes the rest of the model's
/// output after the position it failed at.
pub const HTTP_BODY_KEPT: usize = 2000;

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
    pub latency_ms: Vec<u64>,
    pub completion_tokens: u64,
    pub error: Option<String>,
    /// The solo oracle's comparison with the same session run alone (`--oracle solo`);
    /// absent without it and in records written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle: Option<crate::oracle::Comparison>,
    /// When the session ran against its engine's life (corruption against time): absent
    /// in records written before it was kept, and for sessions no driver ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<SessionTiming>,
}

/// When one session ran, against the block and the engine life that served it: what
/// the rate-against-time trend (core::trend) and the poisoned-engine split read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionTiming {
    /// The engine life within the block that served it: 0 until the first death, then
    /// one more after each restart (core::deaths).
    pub life: u32,
    /// Seconds from the block's drive start to the session's first request.
    pub started_s: f64,
    /// Seconds from its engine life's start (the engines healthy) to its first request.
    pub uptime_s: f64,
    /// Chat requests the block had sent to this engine life before the session's first
    /// request: the session's request index.
    pub request_seq: u64,
    /// Seconds from the block's drive start to the session's end.
    pub ended_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_serialise_by_class_name_in_the_enums_order_with_later_classes_only_when_nonzero() {
        let counts = Counts::from([(SessionClass::Leak, 2), (SessionClass::Done, 5)]);
        assert_eq!(
            serde_json::to_string(&counts).unwrap(),
            r#"{"done":5,"maxrounds":0,"leak":2,"bad_args":0,"wrong_args":0,"no_tool":0,"error":0,"timeout":0}"#
        );
        let crashed = Counts::from([(SessionClass::Crashed, 3)]);
        assert!(serde_json::to_string(&crashed)
            .unwrap()
            .ends_with(r#""timeout":0,"crashed":3}"#));
    }

    #[test]
    fn counts_read_old_records_and_refuse_ones_missing_a_first_class() {
        let old = r#"{"done":5,"maxrounds":1,"leak":2,"bad_args":0,"wrong_args":0,"no_tool":0,"error":0,"timeout":1}"#;
        let counts: Counts = serde_json::from_str(old).unwrap();
        assert_eq!(
            (counts.total(), counts.judged(), counts.corrupted()),
            (9, 8, 2)
        );
        assert_eq!(counts[SessionClass::Rejected], 0);
        // A class a later build adds is ignored here, as serde ignores unknown fields.
        let later = old.replace("}", r#","garbled":4}"#);
        assert_eq!(serde_json::from_str::<Counts>(&later).unwrap(), counts);
        let missing = old.replace(r#""maxrounds":1,"#, "");
        let err = serde_json::from_str::<Counts>(&missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `maxrounds`"), "{err}");
    }

    #[test]
    fn every_class_has_its_own_letter_and_name() {
        let letters: std::collections::BTreeSet<char> =
            SessionClass::iter().map(|c| c.letter()).collect();
        let names: std::collections::BTreeSet<&str> =
            SessionClass::iter().map(|c| c.name()).collect();
        assert_eq!(
            (letters.len(), names.len()),
            (SessionClass::COUNT, SessionClass::COUNT)
        );
        for c in SessionClass::iter() {
            assert_eq!(c.name().parse::<SessionClass>().unwrap(), c);
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.name())
            );
        }
    }

    #[test]
    fn a_rounds_logprobs_are_kept_when_served_and_absent_otherwise() {
        let old =
            r#"{"round":1,"class":"ok","latency_ms":12,"completion_tokens":3,"evidence":"x"}"#;
        let round: RoundRecord = serde_json::from_str(old).unwrap();
        assert_eq!(round.logprobs, None);
        assert!(!serde_json::to_string(&round).unwrap().contains("logprobs"));
        let with = RoundRecord {
            logprobs: Some(vec![crate::oracle::TokenChoice {
                token: "DONE".into(),
                logprob: -0.01,
                top: vec![("I".into(), -5.0)],
            }]),
            ..round
        };
        let back: RoundRecord =
            serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
        assert_eq!(back.logprobs, with.logprobs);
    }
}
