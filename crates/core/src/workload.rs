//! A validated workload as plain values (docs/design.md 3.4): sessions, rounds, load,
//! limits, the tools with their schemas and result templates, the task text and the
//! request options. `config::workload` reads and checks the files; everything here is
//! what the rest of bisect (the classifier, the task generator, the driver) reads.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::session::ChatMessage;
use serde_json::{json, Value};

/// How each request of a workload is made, beyond the conversation itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestOptions {
    /// A system message first in every session.
    pub system: Option<String>,
    /// Example turns after the system message and before the filler (few-shot: a
    /// model that needs to see a tool call before it makes one).
    pub examples: Vec<ChatMessage>,
    /// Sent as `tool_choice` when set (`"auto"`, `"required"`, or a table).
    pub tool_choice: Option<serde_json::Value>,
    /// Extra top-level request fields, passed through as they are.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// `stream: true`: the reply arrives as server-sent events and is assembled as
    /// OpenAI clients do (tool-call deltas joined by index).
    pub stream: bool,
}

impl RequestOptions {
    /// What run.json records; `None` when nothing is set, so records from before these
    /// options compare equal.
    pub fn params_json(&self) -> Option<serde_json::Value> {
        if *self == RequestOptions::default() {
            return None;
        }
        Some(serde_json::json!({
            "system": self.system,
            "examples": self.examples.len(),
            "tool_choice": self.tool_choice,
            "extra": self.extra,
            "stream": self.stream,
        }))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckArgs {
    /// A well-formed call must also be the task's current step (`wrong_args` otherwise).
    Strict,
    /// Only the tool's JSON schema is checked.
    Schema,
}

impl CheckArgs {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckArgs::Strict => "strict",
            CheckArgs::Schema => "schema",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object (sent as the OpenAI `parameters`).
    pub parameters: serde_json::Value,
    /// Value pools the task generator draws each argument from.
    pub arg_values: BTreeMap<String, Vec<serde_json::Value>>,
    /// Simulated result template; `{args}` etc. are filled deterministically.
    pub result: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// Steps per session task (one tool call each).
    pub steps: u32,
    /// Text before the numbered list.
    pub intro: String,
    /// Text after the numbered list (what to answer when done).
    pub outro: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    /// The sample: sessions per arm block.
    pub sessions: u32,
    /// The load: sessions kept in flight at once (closed loop, docs/design.md 3.4);
    /// `None` starts every session at once (concurrency = sessions).
    pub concurrency: Option<u32>,
    pub rounds: u32,
    /// Filler tokens of earlier conversation before the task message.
    pub ctx: u32,
    pub max_tokens: u32,
    pub timeout_s: f64,
    pub temperature: f64,
    pub tools: Vec<ToolSpec>,
    pub task: TaskSpec,
    pub check_args: CheckArgs,
    /// All sessions finish round r before any starts round r+1.
    pub barrier: bool,
    pub seed: u64,
    pub source: Option<PathBuf>,
    /// System prompt, example turns, tool_choice, extra fields, streaming.
    pub request: RequestOptions,
}

/// A `{...}` placeholder of a result template, with its byte range in the template.
pub fn placeholders(template: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut rest = template;
    let mut offset = 0;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) => {
                let inner = &after[..close];
                let is_name = !inner.is_empty()
                    && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if is_name {
                    out.push((offset + open, inner));
                }
                let consumed = open + 1 + close + 1;
                offset += consumed;
                rest = &rest[consumed..];
            }
            None => break,
        }
    }
    out
}

fn json_inline(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl ToolSpec {
    /// The simulated result for a call with `args`: `{tool}` becomes the tool name,
    /// `{args}` the arguments as compact JSON, `{NAME}` the value of argument NAME
    /// (strings unquoted; a missing argument leaves the placeholder as written).
    pub fn render_result(&self, args: &serde_json::Value) -> String {
        let mut out = String::with_capacity(self.result.len() + 64);
        let mut last = 0;
        for (at, name) in placeholders(&self.result) {
            let replacement = match name {
                "tool" => Some(self.name.clone()),
                "args" => Some(args.to_string()),
                other => args.get(other).map(json_inline),
            };
            if let Some(r) = replacement {
                out.push_str(&self.result[last..at]);
                out.push_str(&r);
                last = at + name.len() + 2;
            }
        }
        out.push_str(&self.result[last..]);
        out
    }

    /// Names of the schema's properties, in schema order.
    pub fn property_names(&self) -> Vec<&str> {
        self.parameters
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }
}

fn sample_tool(
    name: &str,
    description: &str,
    parameters: Value,
    pools: Value,
    result: &str,
) -> ToolSpec {
    let arg_values = pools
        .as_object()
        .expect("pools object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_array().expect("pool array").clone()))
        .collect();
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        parameters,
        arg_values,
        result: result.to_string(),
    }
}

/// The parameters that make two runs comparable, as records keep them (`workload` in
/// run.json and the other records), read back typed: every field is optional, since a
/// record written before a field existed lacks it. Written by
/// [`Workload::params_json`], compared whole by the "workload parameters differ"
/// confound; read here by everything that needs one of them.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(default)]
pub struct WorkloadParams {
    pub name: Option<String>,
    pub sessions: Option<u32>,
    pub rounds: Option<u32>,
    pub ctx: Option<u32>,
    pub max_tokens: Option<u32>,
    pub timeout_s: Option<f64>,
    pub seed: Option<u64>,
    pub temperature: Option<f64>,
    pub steps: Option<u32>,
    pub check_args: Option<CheckArgs>,
    pub barrier: Option<bool>,
    /// Sessions in flight, when the workload chose fewer than all of them.
    pub concurrency: Option<u32>,
}

impl WorkloadParams {
    /// The parameters a record holds; none where it holds no object of them (a value of
    /// another shape reads as no parameters, never as a wrong one).
    pub fn read(recorded: &serde_json::Value) -> WorkloadParams {
        serde_json::from_value(recorded.clone()).unwrap_or_default()
    }

    /// The sessions meant to be in flight: `concurrency`, else every session.
    pub fn target_concurrency(&self) -> Option<u32> {
        self.concurrency.or(self.sessions)
    }
}

impl Workload {
    /// The parameters that make two runs comparable, for run.json's `workload` and the
    /// "workload parameters differ" confound.
    pub fn params_json(&self) -> serde_json::Value {
        let mut params = serde_json::json!({
            "name": self.name,
            "sessions": self.sessions,
            "rounds": self.rounds,
            "ctx": self.ctx,
            "max_tokens": self.max_tokens,
            "timeout_s": self.timeout_s,
            "seed": self.seed,
            "temperature": self.temperature,
            "steps": self.task.steps,
            "check_args": self.check_args.as_str(),
            "barrier": self.barrier,
        });
        // Only when set: runs and matrix hashes from before the option stay comparable.
        if let Some(c) = self.concurrency {
            params["concurrency"] = c.into();
        }
        if let Some(request) = self.request.params_json() {
            params["request"] = request;
        }
        params
    }

    /// Sessions in flight at once: `concurrency`, else all of them.
    pub fn target_concurrency(&self) -> u32 {
        self.concurrency.unwrap_or(self.sessions).min(self.sessions)
    }
}

/// A small ops-agent workload (three tools, three steps per task) for tests, benches
/// and the lead's integration tests; `rounds` should exceed 3 for sessions to finish.
pub fn sample_workload(sessions: u32, rounds: u32) -> Workload {
    let paths = json!([
        "/srv/app/config.yaml",
        "/var/log/nginx/error.log",
        "/etc/sglang/decode.env",
        "/srv/app/logs/worker-3.log",
        "/opt/serve/launch_prefill.sh",
        "/var/lib/app/queue \"pending\".json"
    ]);
    let tools = vec![
        sample_tool(
            "read_file",
            "Read the first lines of a file.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "max_lines": {"type": "integer", "minimum": 1}
                },
                "required": ["path"]
            }),
            json!({"path": paths, "max_lines": [20, 40, 100, 250]}),
            "{path} (first {max_lines} lines):\nlisten: 0.0.0.0:8080\ntimeout: 30s",
        ),
        sample_tool(
            "grep",
            "Search a file for a pattern.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string"},
                    "ignore_case": {"type": "boolean"}
                },
                "required": ["pattern", "path"]
            }),
            json!({
                "pattern": ["ERROR", "timeout", "kv_pool", "retry \"later\"", "index_k"],
                "path": paths,
                "ignore_case": [true, false]
            }),
            "{path}: 2 matches for \"{pattern}\"",
        ),
        sample_tool(
            "list_dir",
            "List a directory.",
            json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"]
            }),
            json!({"path": ["/srv/app", "/var/log", "/etc/sglang", "/opt/serve"]}),
            r#"{"path": "{path}", "entries": ["config.yaml", "logs", "src"]}"#,
        ),
    ];
    Workload {
        name: "mock-ops".to_string(),
        sessions,
        concurrency: None,
        rounds,
        ctx: 0,
        max_tokens: 256,
        timeout_s: 30.0,
        temperature: 0.0,
        tools,
        task: TaskSpec {
            steps: 3,
            intro:
                "You are the on-call assistant. Do these steps in order, one tool call per step:"
                    .to_string(),
            outro: "When all steps are done, answer with a one-line summary.".to_string(),
        },
        check_args: CheckArgs::Strict,
        barrier: false,
        seed: 42,
        source: None,
        request: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_parameters_read_back_as_written() {
        let mut w = sample_workload(12, 4);
        w.concurrency = Some(3);
        w.check_args = CheckArgs::Schema;
        let p = WorkloadParams::read(&w.params_json());
        assert_eq!(p.name.as_deref(), Some("mock-ops"));
        assert_eq!(
            (p.sessions, p.rounds, p.ctx, p.steps),
            (Some(12), Some(4), Some(0), Some(3))
        );
        assert_eq!((p.concurrency, p.target_concurrency()), (Some(3), Some(3)));
        assert_eq!(p.check_args, Some(CheckArgs::Schema));
        assert_eq!(
            (p.seed, p.barrier, p.timeout_s),
            (Some(42), Some(false), Some(30.0))
        );
        // Without a chosen concurrency every session is in flight.
        w.concurrency = None;
        assert_eq!(
            WorkloadParams::read(&w.params_json()).target_concurrency(),
            Some(12)
        );
    }

    #[test]
    fn an_older_record_reads_what_it_has_and_nothing_else() {
        let p = WorkloadParams::read(&json!({"name": "smoke", "sessions": 8}));
        assert_eq!((p.name.as_deref(), p.sessions), (Some("smoke"), Some(8)));
        assert_eq!((p.rounds, p.concurrency, p.check_args), (None, None, None));
        assert_eq!(
            WorkloadParams::read(&json!(null)),
            WorkloadParams::default()
        );
    }
}
