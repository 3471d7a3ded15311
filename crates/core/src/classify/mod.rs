//! The round classifier (docs/design.md 3.5): turns one request/response of a session into a
//! [`RoundClass`] plus a short piece of evidence saying why.
//!
//! Rules, first match wins: `rejected` (a non-2xx reply matching one of the target's
//! [`RejectionPattern`]s: the engine refused the model's tool call as unparseable) ·
//! `error` (transport, other non-2xx, unparseable body) · `timeout` ·
//! `leak` (tool-call markup of any configured [`MarkupFamily`] in `content` or
//! `reasoning_content`) · `bad_args` (a call naming a tool not offered, arguments that do
//! not parse, are not a JSON object, fail the tool's JSON schema, or hold markup
//! fragments) · `wrong_args` (with [`CheckArgs::Strict`] only: a well-formed call that is
//! not the task's current step, a call when no step remains, or more than one call) ·
//! `no_tool` (no call while a step remains, or an empty final answer) · `ok`.
//!
//! Then [`account_for_truncation`]: a reply the engine cut off at `max_tokens`
//! (`finish_reason: "length"`) that would be judged corrupted is `truncated` instead: a
//! half-written call does not parse and a half-written answer misses its call, so the
//! cut, not the engine, explains it. Replies without a finish reason (records written
//! before it was kept) keep their class, so old runs reclassify unchanged.
//!
//! Everything expensive (regexes, JSON schema validators) is compiled once per run in
//! [`Classifier::new`]; [`Classifier::classify`] is a pure function of its inputs.

mod markup;
#[cfg(test)]
mod proptests;
pub mod rejection;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub use markup::MarkupFamily;
pub use rejection::{BadRejection, RejectionPattern, RejectionSet};

use crate::format::clip as head;
use crate::session::{ChatMessage, RoundClass, ToolCall};
use crate::workload::{CheckArgs, ToolSpec};
use markup::{Hit, MarkupSet};

/// Evidence is kept to about this many characters: enough to show the salad, short
/// enough for a table cell and a jsonl line per session.
pub(crate) const EVIDENCE_MAX_CHARS: usize = 300;

/// Characters of context shown before a leak match.
const SNIPPET_BEFORE: usize = 40;
/// Characters shown from the start of a leak match onwards.
const SNIPPET_AFTER: usize = 160;

/// What the task's current step asks for (`None` at the call site when all steps are
/// done and the model should answer in text).
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedCall {
    pub tool: String,
    pub args: Map<String, Value>,
}

impl ExpectedCall {
    /// The step as the task message writes it: `read_file(path="/a", max_lines=40)`.
    pub fn render(&self) -> String {
        render_call(&self.tool, &self.args)
    }
}

/// How the round ended on the wire.
#[derive(Debug, Clone)]
pub enum RoundOutcome<'a> {
    /// 2xx with a parseable body: the assistant message of the first choice.
    Reply(&'a ChatMessage),
    /// Transport failure, unparseable body.
    Error(String),
    /// A non-2xx reply: `rejected` when it matches a rejection pattern, else `error`
    /// with `error` as its text (status and the body's head). `partial`: set when the
    /// error came as an event inside a 200 stream, the reply text streamed before it.
    Status {
        status: u16,
        body: &'a str,
        error: String,
        partial: Option<&'a str>,
    },
    Timeout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundVerdict {
    pub class: RoundClass,
    /// At most [`EVIDENCE_MAX_CHARS`]: the snippet that decided, tagged with the rule
    /// (`leak[dsml]: ...`, `bad_args[schema]: ...`); for ok rounds the accepted call.
    pub evidence: String,
}

impl RoundVerdict {
    fn new(class: RoundClass, evidence: impl Into<String>) -> Self {
        RoundVerdict {
            class,
            evidence: truncate_chars(&evidence.into(), EVIDENCE_MAX_CHARS),
        }
    }
}

/// Compiled once per run: regexes per markup family, JSON schema validators per tool,
/// the target's rejection patterns.
pub struct Classifier {
    markup: MarkupSet,
    validators: BTreeMap<String, jsonschema::Validator>,
    rejections: RejectionSet,
}

impl std::fmt::Debug for Classifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Classifier")
            .field("markup", &self.markup)
            .field("tools", &self.validators.keys().collect::<Vec<_>>())
            .field("rejections", &self.rejections)
            .finish()
    }
}

/// Why a classifier cannot be built from a workload's tools and a profile's patterns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifierError {
    #[error("tool `{tool}`: its `parameters` is not a usable JSON schema: {reason}")]
    Schema { tool: String, reason: String },
    #[error("tool `{0}` is defined twice")]
    DuplicateTool(String),
    #[error("markup pattern {family}/{name} does not compile: {reason}")]
    Markup {
        family: MarkupFamily,
        name: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Rejection(#[from] BadRejection),
}

impl Classifier {
    /// `families`: the markup families counted as leaks and as argument salad; an empty
    /// slice disables markup detection (schema and step checks still apply).
    pub fn new(tools: &[ToolSpec], families: &[MarkupFamily]) -> Result<Self, ClassifierError> {
        let markup = MarkupSet::new(families)?;
        let mut validators = BTreeMap::new();
        for tool in tools {
            let validator = jsonschema::validator_for(&tool.parameters).map_err(|e| {
                ClassifierError::Schema {
                    tool: tool.name.clone(),
                    reason: e.to_string(),
                }
            })?;
            if validators.insert(tool.name.clone(), validator).is_some() {
                return Err(ClassifierError::DuplicateTool(tool.name.clone()));
            }
        }
        Ok(Classifier {
            markup,
            validators,
            rejections: RejectionSet::default(),
        })
    }

    /// The same classifier, judging non-2xx replies against `patterns` (none by
    /// default: every non-2xx reply is an `error`).
    pub fn with_rejections(
        mut self,
        patterns: &[RejectionPattern],
    ) -> Result<Self, ClassifierError> {
        self.rejections = RejectionSet::new(patterns)?;
        Ok(self)
    }

    /// All markup families.
    pub fn with_defaults(tools: &[ToolSpec]) -> Result<Self, ClassifierError> {
        Classifier::new(tools, &MarkupFamily::ALL)
    }

    /// The class of one round and why (rules in the module doc, first match wins).
    /// `expected`: the task's current step, `None` once every step is done.
    pub fn classify(
        &self,
        outcome: &RoundOutcome<'_>,
        expected: Option<&ExpectedCall>,
        check: CheckArgs,
    ) -> RoundVerdict {
        match outcome {
            RoundOutcome::Error(message) => RoundVerdict::new(
                RoundClass::Error,
                format!("error: {}", escape_line(message)),
            ),
            RoundOutcome::Status {
                status,
                body,
                error,
                partial,
            } => {
                // An error event inside a 200 stream says so, with what came before it.
                let streamed = partial.map_or(String::new(), |text| {
                    format!(
                        " (an error event mid-stream after HTTP 200; streamed before it: {:?})",
                        truncate_chars(text, 80)
                    )
                });
                match self.rejections.find(*status, body) {
                    Some(pattern) => RoundVerdict::new(
                        RoundClass::Rejected,
                        format!(
                            "rejected[{}]: HTTP {status}{streamed}: {}",
                            pattern.name,
                            escape_line(body.trim())
                        ),
                    ),
                    None => RoundVerdict::new(
                        RoundClass::Error,
                        format!("error{streamed}: {}", escape_line(error)),
                    ),
                }
            }
            RoundOutcome::Timeout => RoundVerdict::new(
                RoundClass::Timeout,
                "timeout: no complete reply within the round's limit",
            ),
            RoundOutcome::Reply(message) => self.classify_reply(message, expected, check),
        }
    }

    fn classify_reply(
        &self,
        message: &ChatMessage,
        expected: Option<&ExpectedCall>,
        check: CheckArgs,
    ) -> RoundVerdict {
        if let Some(verdict) = self.find_leak(message) {
            return verdict;
        }
        let calls: &[ToolCall] = message.tool_calls.as_deref().unwrap_or(&[]);
        let mut parsed = Vec::with_capacity(calls.len());
        for (index, call) in calls.iter().enumerate() {
            match self.check_call(call, expected) {
                Ok(args) => parsed.push((call.function.name.as_str(), args)),
                Err(problem) => {
                    let which = if calls.len() > 1 {
                        format!("call {} of {}: ", index + 1, calls.len())
                    } else {
                        String::new()
                    };
                    return RoundVerdict::new(
                        RoundClass::BadArgs,
                        format!("bad_args[{}]: {which}{}", problem.rule, problem.detail),
                    );
                }
            }
        }
        if parsed.is_empty() {
            return self.classify_text(message, expected);
        }
        let mut rendered: Vec<String> = parsed
            .iter()
            .map(|(name, args)| render_call(name, args))
            .collect();
        if check == CheckArgs::Schema {
            return RoundVerdict::new(RoundClass::Ok, rendered.join("; "));
        }
        let Some(expected) = expected else {
            return RoundVerdict::new(
                RoundClass::WrongArgs,
                format!(
                    "wrong_args: no step remains (a final answer was expected), got {}",
                    rendered.join("; ")
                ),
            );
        };
        let (first_name, first_args) = &parsed[0];
        if *first_name != expected.tool || *first_args != expected.args {
            let mut evidence = format!(
                "wrong_args: expected {}, got {}",
                expected.render(),
                rendered[0]
            );
            if *first_name == expected.tool {
                evidence.push_str(&format!(
                    " (differs in {})",
                    differing_keys(&expected.args, first_args).join(", ")
                ));
            }
            return RoundVerdict::new(RoundClass::WrongArgs, evidence);
        }
        if parsed.len() > 1 {
            return RoundVerdict::new(
                RoundClass::WrongArgs,
                format!(
                    "wrong_args: {} calls where one was expected: {}",
                    parsed.len(),
                    rendered.join("; ")
                ),
            );
        }
        RoundVerdict::new(RoundClass::Ok, rendered.swap_remove(0))
    }

    /// The earliest markup in `content`, else in `reasoning_content`.
    fn find_leak(&self, message: &ChatMessage) -> Option<RoundVerdict> {
        let fields = [
            ("content", &message.content),
            ("reasoning_content", &message.reasoning_content),
        ];
        fields.into_iter().find_map(|(field, text)| {
            let text = text.as_deref()?;
            let hit = self.markup.find_leak(text)?;
            let place = if field == "content" {
                String::new()
            } else {
                format!(" in {field}")
            };
            Some(RoundVerdict::new(
                RoundClass::Leak,
                format!(
                    "leak[{}]{place}: {} ({})",
                    hit.family,
                    snippet(text, &hit),
                    hit.pattern
                ),
            ))
        })
    }

    /// A call's arguments as an object, or why they are bad (docs/design.md 3.5 `bad_args`).
    fn check_call(
        &self,
        call: &ToolCall,
        expected: Option<&ExpectedCall>,
    ) -> Result<Map<String, Value>, CallProblem> {
        let name = call.function.name.as_str();
        let Some(validator) = self.validators.get(name) else {
            let offered: Vec<&str> = self.validators.keys().map(String::as_str).collect();
            return Err(CallProblem::new(
                "unknown_tool",
                format!(
                    "{} is not an offered tool (offered: {})",
                    json_string(name),
                    offered.join(", ")
                ),
            ));
        };
        let raw = call.function.arguments.trim();
        // Servers send "" for a call without arguments; that is `{}`, not garbage.
        let value: Value = if raw.is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(raw).map_err(|e| {
                CallProblem::new(
                    "json",
                    format!(
                        "{name} arguments do not parse ({e}): {}",
                        escape_line(&head(raw, 80))
                    ),
                )
            })?
        };
        if !value.is_object() {
            return Err(CallProblem::new(
                "not_object",
                format!(
                    "{name} arguments are {}, not an object: {}",
                    json_kind(&value),
                    escape_line(&head(raw, 80))
                ),
            ));
        }
        if let Some(problem) = schema_problem(name, validator, &value) {
            return Err(problem);
        }
        let Value::Object(args) = value else {
            unreachable!("checked to be an object above")
        };
        let asked = expected.filter(|e| e.tool == name).map(|e| &e.args);
        for (key, value) in &args {
            // A value the step itself asked for is not salad, whatever it contains.
            if asked.and_then(|a| a.get(key)) == Some(value) {
                continue;
            }
            if let Some(found) = self.find_fragment_in(key, value, &format!("{name}.{key}")) {
                return Err(found);
            }
        }
        Ok(args)
    }

    /// Markup fragments anywhere in a key or (nested) string value.
    fn find_fragment_in(&self, key: &str, value: &Value, path: &str) -> Option<CallProblem> {
        let describe = |text: &str, hit: Hit, what: &str| {
            CallProblem::new(
                "markup",
                format!(
                    "{path}{what}: {} ({}:{})",
                    json_string(&head(text, 120)),
                    hit.family,
                    hit.pattern
                ),
            )
        };
        if let Some(hit) = self.markup.find_fragment(key) {
            return Some(describe(key, hit, " (key)"));
        }
        match value {
            Value::String(text) => self
                .markup
                .find_fragment(text)
                .map(|hit| describe(text, hit, "")),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| self.find_fragment_in("", item, &format!("{path}[{i}]"))),
            Value::Object(map) => map
                .iter()
                .find_map(|(k, v)| self.find_fragment_in(k, v, &format!("{path}.{k}"))),
            Value::Null | Value::Bool(_) | Value::Number(_) => None,
        }
    }

    fn classify_text(
        &self,
        message: &ChatMessage,
        expected: Option<&ExpectedCall>,
    ) -> RoundVerdict {
        let text = message.content.as_deref().unwrap_or("").trim();
        match (expected, text.is_empty()) {
            (Some(step), true) => RoundVerdict::new(
                RoundClass::NoTool,
                format!("no_tool: empty reply, expected {}", step.render()),
            ),
            (Some(step), false) => RoundVerdict::new(
                RoundClass::NoTool,
                format!(
                    "no_tool: expected {}, got text: {}",
                    step.render(),
                    json_string(&head(text, 120))
                ),
            ),
            (None, true) => RoundVerdict::new(
                RoundClass::NoTool,
                "no_tool: empty reply where the final answer was expected",
            ),
            (None, false) => RoundVerdict::new(
                RoundClass::Ok,
                format!("answer: {}", json_string(&head(text, 160))),
            ),
        }
    }
}

/// The first schema violation of a call's arguments, with a count of the others.
/// The round's verdict once its `finish_reason` is known (module doc): a corrupted-looking
/// reply cut off by `max_tokens` becomes `truncated`, keeping what it looked like as
/// evidence; every other verdict is returned as it is.
pub fn account_for_truncation(verdict: RoundVerdict, finish_reason: Option<&str>) -> RoundVerdict {
    let corrupted_looking = matches!(
        verdict.class,
        RoundClass::Leak | RoundClass::BadArgs | RoundClass::WrongArgs | RoundClass::NoTool
    );
    if finish_reason != Some("length") || !corrupted_looking {
        return verdict;
    }
    RoundVerdict::new(
        RoundClass::Truncated,
        format!(
            "truncated[length]: the reply stopped at max_tokens; as cut off it reads {}",
            verdict.evidence
        ),
    )
}

fn schema_problem(
    name: &str,
    validator: &jsonschema::Validator,
    args: &Value,
) -> Option<CallProblem> {
    let mut errors = validator.iter_errors(args);
    let first = errors.next()?;
    let others = errors.count();
    let more = if others > 0 {
        format!(" (+{others} more)")
    } else {
        String::new()
    };
    let path = first.instance_path.as_str().replace('/', ".");
    Some(CallProblem::new(
        "schema",
        format!("{name}{path}: {first}{more}"),
    ))
}

/// Why one call is `bad_args`: the rule's short name and a human-readable detail.
struct CallProblem {
    rule: &'static str,
    detail: String,
}

impl CallProblem {
    fn new(rule: &'static str, detail: String) -> Self {
        CallProblem { rule, detail }
    }
}

/// `name(key=value, ...)` with values as compact JSON, like the task's numbered steps.
fn render_call(name: &str, args: &Map<String, Value>) -> String {
    let args: Vec<String> = args.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{name}({})", args.join(", "))
}

/// Keys whose values differ (or that only one side has), in key order.
fn differing_keys(expected: &Map<String, Value>, got: &Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<String> = expected
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    keys.extend(
        got.keys()
            .filter(|k| !expected.contains_key(*k))
            .map(|k| format!("extra {k}")),
    );
    keys
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn json_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// The text around a leak: some context before, the match and what follows, newlines
/// shown as `\n` so the evidence stays on one line.
fn snippet(text: &str, hit: &Hit) -> String {
    let before = &text[..hit.start];
    let after = &text[hit.start..];
    let skip = before.chars().count().saturating_sub(SNIPPET_BEFORE);
    let lead: String = before.chars().skip(skip).collect();
    let tail = head(after, SNIPPET_AFTER);
    let mut out = String::new();
    if skip > 0 {
        out.push_str("...");
    }
    out.push_str(&escape_line(&lead));
    out.push_str(&escape_line(&tail));
    out
}

fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        head(text, max.saturating_sub(3))
    } else {
        text.to_string()
    }
}

fn escape_line(text: &str) -> String {
    text.replace('\n', "\\n")
        .replace('\r', "\\r")
        .replace('\t', "\\t")
}
