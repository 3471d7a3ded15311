//! Workload files (docs/design.md 3.4): sessions, rounds, ctx filler, limits, tool schemas
//! and the task generator that gives each session its own numbered steps.
//!
//! This module owns the file format (documented key by key in `workloads/agentic.toml`),
//! its validation, the embedded builtin workloads, and the deterministic fill of a
//! tool's result template. [`RequestOptions`] carries what real agents send besides the
//! conversation: a system prompt, few-shot example turns, `tool_choice`, extra request
//! fields passed through verbatim (`chat_template_kwargs`, sampling extras) and
//! streaming.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::{read_text, ConfigError, Source};
use crate::core::session::{ChatMessage, FunctionCall, ToolCall};
use crate::core::workload::placeholders;
pub use crate::core::workload::{CheckArgs, RequestOptions, TaskSpec, ToolSpec, Workload};

/// Request fields bisect sets itself; `[request]` may not override them.
pub const RESERVED_REQUEST_FIELDS: [&str; 8] = [
    "model",
    "messages",
    "tools",
    "max_tokens",
    "temperature",
    "stream",
    "stream_options",
    "tool_choice",
];

/// The shipped workloads, embedded at build time: (name, contents).
const BUILTIN_WORKLOADS: &[(&str, &str)] = &[
    (
        "agentic",
        include_str!("../../../../workloads/agentic.toml"),
    ),
    ("needle", include_str!("../../../../workloads/needle.toml")),
    ("smoke", include_str!("../../../../workloads/smoke.toml")),
    ("tiny", include_str!("../../../../workloads/tiny.toml")),
];

/// The workload `bisect run` uses without `--workload`.
pub const DEFAULT_WORKLOAD: &str = "agentic";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: Option<Spanned<String>>,
    sessions: Spanned<i64>,
    rounds: Spanned<i64>,
    ctx: Spanned<i64>,
    max_tokens: Spanned<i64>,
    timeout_s: Spanned<f64>,
    #[serde(default)]
    temperature: Option<Spanned<f64>>,
    #[serde(default)]
    check_args: Option<Spanned<String>>,
    #[serde(default)]
    barrier: bool,
    #[serde(default)]
    seed: Option<Spanned<i64>>,
    task: Spanned<RawTask>,
    #[serde(default)]
    tool: Vec<Spanned<RawTool>>,
    #[serde(default)]
    system: Option<Spanned<String>>,
    #[serde(default)]
    example: Vec<Spanned<RawExample>>,
    #[serde(default)]
    tool_choice: Option<Spanned<toml::Value>>,
    #[serde(default)]
    request: Option<Spanned<toml::Table>>,
    #[serde(default)]
    stream: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExample {
    role: Spanned<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<RawExampleCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExampleCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    steps: Spanned<i64>,
    #[serde(default)]
    intro: String,
    outro: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    parameters: Spanned<toml::Table>,
    #[serde(default)]
    values: Option<Spanned<BTreeMap<String, Spanned<Vec<toml::Value>>>>>,
    result: Spanned<String>,
}

const WORKLOAD_FIX: &str =
    "see workloads/agentic.toml, which documents every key of the workload format";

fn toml_to_json(value: &toml::Value) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// `system`, `[[example]]`, `tool_choice`, `[request]`, `stream`, checked.
fn request_options(
    src: &Source,
    raw: &RawWorkload,
    tools: &[ToolSpec],
) -> Result<RequestOptions, ConfigError> {
    let system = match &raw.system {
        Some(s) if s.get_ref().trim().is_empty() => {
            return Err(src.invalid(
                s.span(),
                "system is empty",
                "write the system prompt, or remove the key",
            ))
        }
        Some(s) => Some(s.get_ref().trim().to_string()),
        None => None,
    };
    let mut examples = Vec::new();
    for (i, spanned) in raw.example.iter().enumerate() {
        let e = spanned.get_ref();
        let role = e.role.get_ref().as_str();
        if !["user", "assistant", "tool"].contains(&role) {
            return Err(src.invalid(
                e.role.span(),
                format!("example {} has role {role:?}", i + 1),
                "an example turn is role = \"user\", \"assistant\" or \"tool\" (the system prompt is `system`)",
            ));
        }
        let mut calls = Vec::new();
        for (j, c) in e.tool_calls.iter().enumerate() {
            if role != "assistant" {
                return Err(src.invalid(
                    spanned.span(),
                    format!("example {} has tool_calls but role {role:?}", i + 1),
                    "only assistant turns carry tool_calls",
                ));
            }
            if !tools.iter().any(|t| t.name == c.name) {
                return Err(src.invalid(
                    spanned.span(),
                    format!(
                        "example {} calls tool {:?}, which the workload does not define",
                        i + 1,
                        c.name
                    ),
                    "call one of the workload's [[tool]]s in examples",
                ));
            }
            let arguments =
                serde_json::to_string(&toml_to_json(&toml::Value::Table(c.arguments.clone())))
                    .unwrap_or_else(|_| "{}".into());
            calls.push(ToolCall {
                id: c
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("example_{}_{}", i + 1, j + 1)),
                kind: "function".into(),
                function: FunctionCall {
                    name: c.name.clone(),
                    arguments,
                },
            });
        }
        if role == "tool" && e.tool_call_id.is_none() {
            return Err(src.invalid(
                spanned.span(),
                format!("example {} is a tool turn without tool_call_id", i + 1),
                "give the id of the assistant example's call it answers (tool_calls = [{id = \"example_1\", ...}])",
            ));
        }
        if e.content.is_none() && calls.is_empty() {
            return Err(src.invalid(
                spanned.span(),
                format!("example {} has neither content nor tool_calls", i + 1),
                "give the turn's text as content (or an assistant turn's tool_calls)",
            ));
        }
        examples.push(ChatMessage {
            role: role.to_string(),
            content: e.content.clone(),
            tool_calls: (!calls.is_empty()).then_some(calls),
            tool_call_id: e.tool_call_id.clone(),
            ..Default::default()
        });
    }
    let tool_choice = match &raw.tool_choice {
        None => None,
        Some(v) => match v.get_ref() {
            toml::Value::String(s) if ["auto", "required", "none"].contains(&s.as_str()) => {
                Some(serde_json::Value::String(s.clone()))
            }
            toml::Value::Table(_) => Some(toml_to_json(v.get_ref())),
            other => {
                return Err(src.invalid(
                    v.span(),
                    format!("tool_choice = {other} is not a tool choice"),
                    "use \"auto\", \"required\", \"none\", or a table {type = \"function\", function = {name = \"read_file\"}}",
                ))
            }
        },
    };
    let mut extra = serde_json::Map::new();
    if let Some(table) = &raw.request {
        for (key, value) in table.get_ref() {
            if RESERVED_REQUEST_FIELDS.contains(&key.as_str()) {
                return Err(src.invalid(
                    table.span(),
                    format!("[request] sets {key:?}, which bisect sets itself"),
                    format!(
                        "remove {key} from [request] (bisect sets {}; tool_choice and stream are workload keys)",
                        RESERVED_REQUEST_FIELDS.join(", ")
                    ),
                ));
            }
            extra.insert(key.clone(), toml_to_json(value));
        }
    }
    Ok(RequestOptions {
        system,
        examples,
        tool_choice,
        extra,
        stream: raw.stream,
    })
}

/// Every `[[tool]]` table, at least one, names distinct.
fn validate_tools(src: &Source, raw: &RawWorkload) -> Result<Vec<ToolSpec>, ConfigError> {
    if raw.tool.is_empty() {
        return Err(src.invalid(
            raw.task.span(),
            "the workload offers no tools: every step is a tool call",
            "add at least one [[tool]] table (see workloads/agentic.toml)",
        ));
    }
    let mut seen = HashSet::new();
    let mut tools = Vec::with_capacity(raw.tool.len());
    for raw_tool in &raw.tool {
        let tool = validate_tool(src, raw_tool)?;
        if !seen.insert(tool.name.clone()) {
            return Err(src.invalid(
                raw_tool.get_ref().name.span(),
                format!("tool {} is defined twice", tool.name),
                "give every [[tool]] a distinct name",
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

const SCHEMA_FIX: &str = "write an object schema: type = \"object\" and one [tool.parameters.properties.NAME] table per argument";

fn validate_tool(src: &Source, raw: &Spanned<RawTool>) -> Result<ToolSpec, ConfigError> {
    let t = raw.get_ref();
    let name = t.name.get_ref().trim().to_string();
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(src.invalid(
            t.name.span(),
            format!("tool name {name:?} is not a function name"),
            "use letters, digits, _ and - (at most 64 characters), e.g. read_file",
        ));
    }
    let check = ToolCheck {
        src,
        tool: t,
        name: &name,
    };
    let (parameters, whole) = check.parameters()?;
    let properties = parameters["properties"]
        .as_object()
        .expect("parameters() checked the properties");
    let values_span = t
        .values
        .as_ref()
        .map(|v| v.span())
        .unwrap_or_else(|| raw.span());
    let arg_values = check.value_pools(properties, values_span)?;
    check.sample_passes(&whole, &arg_values)?;
    check.result_placeholders(properties)?;
    Ok(ToolSpec {
        name,
        description: t.description.trim().to_string(),
        parameters,
        arg_values,
        result: t.result.get_ref().clone(),
    })
}

/// The checks of one `[[tool]]` table after its name: schema, value pools, result template.
struct ToolCheck<'a> {
    src: &'a Source<'a>,
    tool: &'a RawTool,
    name: &'a str,
}

type Properties = serde_json::Map<String, serde_json::Value>;

impl ToolCheck<'_> {
    fn invalid(&self, span: Range<usize>, message: String, fix: impl Into<String>) -> ConfigError {
        self.src
            .invalid(span, format!("tool {}: {message}", self.name), fix)
    }

    /// The parameters as JSON: a valid object schema with at least one property, and
    /// its compiled validator.
    fn parameters(&self) -> Result<(serde_json::Value, jsonschema::Validator), ConfigError> {
        let span = self.tool.parameters.span();
        let parameters = serde_json::to_value(self.tool.parameters.get_ref()).map_err(|e| {
            self.invalid(
                span.clone(),
                format!("parameters cannot be expressed as JSON: {e}"),
                "write the schema with strings, numbers, booleans, arrays and tables only",
            )
        })?;
        if parameters.get("type").and_then(|v| v.as_str()) != Some("object") {
            return Err(self.invalid(
                span,
                "parameters must be a JSON schema with type = \"object\"".into(),
                SCHEMA_FIX,
            ));
        }
        if !parameters
            .get("properties")
            .and_then(|p| p.as_object())
            .is_some_and(|p| !p.is_empty())
        {
            return Err(self.invalid(
                span,
                "parameters has no properties (every step passes arguments)".into(),
                SCHEMA_FIX,
            ));
        }
        if let Err(e) = jsonschema::meta::validate(&parameters) {
            return Err(self.invalid(
                span,
                format!("parameters is not a valid JSON schema: {e}"),
                SCHEMA_FIX,
            ));
        }
        let whole = jsonschema::validator_for(&parameters).map_err(|e| {
            self.invalid(
                span,
                format!("parameters cannot be compiled as a JSON schema: {e}"),
                SCHEMA_FIX,
            )
        })?;
        Ok((parameters, whole))
    }

    /// `[tool.values]`: one non-empty pool per property (and none for anything else),
    /// every value valid under its property's schema.
    fn value_pools(
        &self,
        properties: &Properties,
        values_span: Range<usize>,
    ) -> Result<BTreeMap<String, Vec<serde_json::Value>>, ConfigError> {
        let empty = BTreeMap::new();
        let pools = self
            .tool
            .values
            .as_ref()
            .map(|v| v.get_ref())
            .unwrap_or(&empty);
        for (key, pool) in pools {
            if !properties.contains_key(key) {
                return Err(self.invalid(
                    pool.span(),
                    format!("value pool `{key}` is not a property of its parameters"),
                    format!(
                        "remove it or add [tool.parameters.properties.{key}]; properties: {}",
                        property_list(properties)
                    ),
                ));
            }
        }
        let mut arg_values = BTreeMap::new();
        for (prop, prop_schema) in properties {
            let Some(pool) = pools.get(prop) else {
                return Err(self.invalid(
                    values_span,
                    format!("no value pool for argument `{prop}`"),
                    format!("add `{prop} = [...]` under [tool.values] with the values the task generator may use"),
                ));
            };
            arg_values.insert(prop.clone(), self.pool(prop, prop_schema, pool)?);
        }
        Ok(arg_values)
    }

    /// One property's pool as JSON values, each valid under the property's schema.
    fn pool(
        &self,
        prop: &str,
        prop_schema: &serde_json::Value,
        pool: &Spanned<Vec<toml::Value>>,
    ) -> Result<Vec<serde_json::Value>, ConfigError> {
        if pool.get_ref().is_empty() {
            return Err(self.invalid(
                pool.span(),
                format!("the value pool for `{prop}` is empty"),
                format!("list at least one value for `{prop}`"),
            ));
        }
        let validator = jsonschema::validator_for(prop_schema).map_err(|e| {
            self.invalid(
                self.tool.parameters.span(),
                format!("schema of `{prop}` cannot be compiled: {e}"),
                SCHEMA_FIX,
            )
        })?;
        let mut json_pool = Vec::with_capacity(pool.get_ref().len());
        for v in pool.get_ref() {
            let jv = serde_json::to_value(v).map_err(|e| {
                self.invalid(
                    pool.span(),
                    format!("`{prop}` value {v} is not JSON: {e}"),
                    "use strings, numbers or booleans",
                )
            })?;
            if !validator.is_valid(&jv) {
                return Err(self.invalid(
                    pool.span(),
                    format!("value {jv} for `{prop}` does not match its schema {prop_schema}"),
                    format!("change the value or the schema of `{prop}` so every pool value is a valid argument"),
                ));
            }
            json_pool.push(jv);
        }
        Ok(json_pool)
    }

    /// A generated call uses one value from every pool; check that such an object passes
    /// the whole schema (required, additionalProperties, ...), not just each property.
    fn sample_passes(
        &self,
        whole: &jsonschema::Validator,
        arg_values: &BTreeMap<String, Vec<serde_json::Value>>,
    ) -> Result<(), ConfigError> {
        let sample: serde_json::Map<String, serde_json::Value> = arg_values
            .iter()
            .map(|(k, v)| (k.clone(), v[0].clone()))
            .collect();
        let sample = serde_json::Value::Object(sample);
        if let Some(err) = whole.iter_errors(&sample).next() {
            return Err(self.invalid(
                self.tool.parameters.span(),
                format!("generated arguments {sample} fail the parameters schema: {err}"),
                "make the schema accept one value of every pool (check `required` and additionalProperties)",
            ));
        }
        Ok(())
    }

    /// The result template's placeholders: `{tool}`, `{args}` or an argument name.
    fn result_placeholders(&self, properties: &Properties) -> Result<(), ConfigError> {
        for (_, placeholder) in placeholders(self.tool.result.get_ref()) {
            if placeholder != "tool"
                && placeholder != "args"
                && !properties.contains_key(placeholder)
            {
                return Err(self.invalid(
                    self.tool.result.span(),
                    format!("result template uses {{{placeholder}}}, which is not an argument"),
                    format!(
                        "use {{tool}}, {{args}} or an argument name: {}",
                        property_list(properties)
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn property_list(properties: &Properties) -> String {
    properties.keys().cloned().collect::<Vec<_>>().join(", ")
}

impl Workload {
    /// Names of the builtin workloads.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN_WORKLOADS.iter().map(|(n, _)| *n).collect()
    }

    /// A builtin workload by name (`agentic`, `needle`, `smoke`, `tiny`).
    pub fn builtin(name: &str) -> Result<Workload, ConfigError> {
        let (file_name, text) = BUILTIN_WORKLOADS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| ConfigError::UnknownWorkload {
                name: name.to_string(),
                known: Self::builtin_names().join(", "),
            })?;
        let path = Path::new("workloads").join(format!("{file_name}.toml"));
        let mut w = Self::parse(&path, text, file_name)?;
        // Builtins have no file on disk; `source` names only real files.
        w.source = None;
        Ok(w)
    }

    /// A builtin name (no `/` and no `.toml`) or the path of a workload file.
    pub fn load(name_or_path: &str) -> Result<Workload, ConfigError> {
        let looks_like_path = name_or_path.contains('/')
            || name_or_path.contains('\\')
            || name_or_path.ends_with(".toml");
        if !looks_like_path {
            return Self::builtin(name_or_path);
        }
        let path = Path::new(name_or_path);
        let text = read_text(path)?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "workload".into());
        Self::parse(path, &text, &stem)
    }

    fn parse(path: &Path, text: &str, stem: &str) -> Result<Workload, ConfigError> {
        let src = Source { path, text };
        let raw: RawWorkload = src.parse(WORKLOAD_FIX)?;

        let name = match &raw.name {
            Some(n) if n.get_ref().trim().is_empty() => {
                return Err(src.invalid(
                    n.span(),
                    "name is empty",
                    "name the workload, e.g. name = \"agentic\"",
                ))
            }
            Some(n) => n.get_ref().trim().to_string(),
            None => stem.to_string(),
        };
        let sessions = src.whole_number("sessions", &raw.sessions, 1)?;
        let rounds = src.whole_number("rounds", &raw.rounds, 1)?;
        let ctx = src.whole_number("ctx", &raw.ctx, 0)?;
        let max_tokens = src.whole_number("max_tokens", &raw.max_tokens, 1)?;
        let timeout_s = *raw.timeout_s.get_ref();
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(src.invalid(
                raw.timeout_s.span(),
                format!("timeout_s = {timeout_s} must be a positive number of seconds"),
                "set timeout_s to the per-request timeout, e.g. timeout_s = 30",
            ));
        }
        let temperature = match &raw.temperature {
            None => 0.0,
            Some(t) => {
                let v = *t.get_ref();
                if !(0.0..=2.0).contains(&v) {
                    return Err(src.invalid(
                        t.span(),
                        format!("temperature = {v} is outside 0..2"),
                        "use temperature = 0.0 so arms stay comparable",
                    ));
                }
                v
            }
        };
        let check_args = match &raw.check_args {
            None => CheckArgs::Strict,
            Some(c) => match c.get_ref().as_str() {
                "strict" => CheckArgs::Strict,
                "schema" => CheckArgs::Schema,
                other => {
                    return Err(src.invalid(
                        c.span(),
                        format!("check_args = {other:?} is not a known mode"),
                        "use \"strict\" (calls must match the current step) or \"schema\" (only the schema is checked)",
                    ))
                }
            },
        };
        let seed = match &raw.seed {
            None => 1,
            Some(s) if *s.get_ref() >= 0 => *s.get_ref() as u64,
            Some(s) => {
                return Err(src.invalid(
                    s.span(),
                    format!("seed = {} is negative", s.get_ref()),
                    "use a seed >= 0",
                ))
            }
        };

        let raw_task = raw.task.get_ref();
        let steps = src.whole_number("steps", &raw_task.steps, 1)?;
        if raw_task.outro.get_ref().trim().is_empty() {
            return Err(src.invalid(
                raw_task.outro.span(),
                "task outro is empty: the model would not know what to answer when done",
                "end the outro with the exact answer, e.g. \"When every step is done, reply exactly: DONE: all steps completed.\"",
            ));
        }
        let task = TaskSpec {
            steps,
            intro: raw_task.intro.trim().to_string(),
            outro: raw_task.outro.get_ref().trim().to_string(),
        };

        let tools = validate_tools(&src, &raw)?;
        let request = request_options(&src, &raw, &tools)?;

        Ok(Workload {
            name,
            sessions,
            concurrency: None,
            rounds,
            ctx,
            max_tokens,
            timeout_s,
            temperature,
            tools,
            task,
            check_args,
            barrier: raw.barrier,
            seed,
            source: Some(path.to_path_buf()),
            request,
        })
    }

    /// Re-checks the limits after command-line overrides (`--sessions 0` etc.); the
    /// file itself was checked when loaded.
    pub fn validate_overrides(&self) -> Result<(), ConfigError> {
        let usage = |message: String, fix: &str| ConfigError::Usage {
            message,
            fix: fix.to_string(),
        };
        if self.sessions == 0 {
            return Err(usage(
                "--sessions must be at least 1".into(),
                "pass --sessions N with N >= 1",
            ));
        }
        if self.rounds == 0 {
            return Err(usage(
                "--rounds must be at least 1".into(),
                "pass --rounds R with R >= 1",
            ));
        }
        if self.max_tokens == 0 {
            return Err(usage(
                "--max-tokens must be at least 1".into(),
                "pass --max-tokens N with N >= 1",
            ));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(usage(
                format!(
                    "--timeout {} must be a positive number of seconds",
                    self.timeout_s
                ),
                "pass --timeout SECS with SECS > 0",
            ));
        }
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Workload, ConfigError> {
        Workload::parse(Path::new("workloads/t.toml"), text, "t")
    }

    fn error_line(text: &str) -> (usize, String) {
        parse(text).unwrap_err().line_and_text()
    }

    const MINIMAL: &str = r#"sessions = 2
rounds = 3
ctx = 0
max_tokens = 64
timeout_s = 5
[task]
steps = 2
outro = "reply exactly: DONE"
[[tool]]
name = "read_file"
result = "{path}: ok ({tool} {args})"
[tool.parameters]
type = "object"
required = ["path"]
[tool.parameters.properties.path]
type = "string"
[tool.values]
path = ["/a", "/b"]
"#;

    #[test]
    fn request_options_build_the_conversation_and_the_body() {
        let text = format!(
            "system = \"You call tools.\"\ntool_choice = \"required\"\nstream = true\n{MINIMAL}\
             [request]\nchat_template_kwargs = {{enable_thinking = false}}\ntop_k = 1\n\
             [[example]]\nrole = \"user\"\ncontent = \"Read /a.\"\n\
             [[example]]\nrole = \"assistant\"\ntool_calls = [{{id = \"ex1\", name = \"read_file\", arguments = {{path = \"/a\"}}}}]\n\
             [[example]]\nrole = \"tool\"\ntool_call_id = \"ex1\"\ncontent = \"/a: ok\"\n"
        );
        let w = parse(&text).unwrap();
        let r = &w.request;
        assert_eq!(r.system.as_deref(), Some("You call tools."));
        assert_eq!(r.tool_choice, Some(serde_json::json!("required")));
        assert!(r.stream);
        assert_eq!(
            serde_json::Value::Object(r.extra.clone()),
            serde_json::json!({"chat_template_kwargs": {"enable_thinking": false}, "top_k": 1})
        );
        assert_eq!(r.examples.len(), 3);
        let call = &r.examples[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, r#"{"path":"/a"}"#);
        let (_, messages) = crate::core::task::initial_conversation(&w, 0);
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[1].content.as_deref(), Some("Read /a."));
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("ex1"));
        assert_eq!(w.params_json()["request"]["examples"], 3);
        assert!(parse(MINIMAL)
            .unwrap()
            .params_json()
            .get("request")
            .is_none());
    }

    #[test]
    fn request_options_refuse_what_bisect_sets_and_bad_examples() {
        let (line, msg) = error_line(&format!("{MINIMAL}[request]\nmax_tokens = 9\n"));
        assert_eq!(line, 19);
        assert!(msg.contains("which bisect sets itself"), "{msg}");
        let (_, msg) = error_line(&format!(
            "{MINIMAL}[[example]]\nrole = \"assistant\"\ntool_calls = [{{name = \"rm\"}}]\n"
        ));
        assert!(msg.contains("does not define"), "{msg}");
        let (_, msg) = error_line(&format!(
            "{MINIMAL}[[example]]\nrole = \"tool\"\ncontent = \"x\"\n"
        ));
        assert!(msg.contains("without tool_call_id"), "{msg}");
        let (line, msg) = error_line(&format!("tool_choice = \"always\"\n{MINIMAL}"));
        assert_eq!(line, 1);
        assert!(msg.contains("not a tool choice"), "{msg}");
    }

    #[test]
    fn builtins_load_with_the_documented_parameters() {
        let a = Workload::builtin("agentic").unwrap();
        assert_eq!(
            (
                a.sessions,
                a.rounds,
                a.ctx,
                a.max_tokens,
                a.task.steps,
                a.seed
            ),
            (80, 4, 300, 256, 3, 1)
        );
        assert_eq!(a.timeout_s, 10.0);
        assert_eq!(a.temperature, 0.0);
        assert_eq!(a.check_args, CheckArgs::Strict);
        assert!(!a.barrier);
        assert_eq!(a.source, None);
        let names: Vec<_> = a.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["read_file", "grep", "run_tests", "list_dir"]);
        assert!(a
            .task
            .outro
            .ends_with("reply exactly: DONE: all steps completed."));
        assert!(a.tools[0].arg_values["path"].contains(&serde_json::json!("/srv/app/config.yaml")));
        assert!(a.tools[2].arg_values["target"].contains(&serde_json::json!("integration")));

        let n = Workload::load("needle").unwrap();
        assert_eq!(
            (n.sessions, n.rounds, n.ctx, n.task.steps),
            (24, 2, 12000, 1)
        );
        let s = Workload::load("smoke").unwrap();
        assert_eq!((s.sessions, s.rounds, s.ctx), (4, 4, 100));
        for w in [&a, &n, &s] {
            assert!(
                w.rounds > w.task.steps,
                "{}: steps + answer must fit the rounds",
                w.name
            );
        }
    }

    #[test]
    fn unknown_builtin_lists_known_ones() {
        let err = Workload::load("agentc").unwrap_err();
        assert!(matches!(err, ConfigError::UnknownWorkload { .. }));
        let text = err.to_string();
        assert!(text.contains("agentic, needle, smoke, tiny"), "{text}");
    }

    #[test]
    fn paths_load_files_and_default_the_name_to_the_stem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        let w = Workload::load(path.to_str().unwrap()).unwrap();
        assert_eq!(w.name, "mine");
        assert_eq!(w.source.as_deref(), Some(path.as_path()));
        assert_eq!(w.seed, 1);
        assert!(matches!(
            Workload::load("missing/file.toml").unwrap_err(),
            ConfigError::Read { .. }
        ));
    }

    #[test]
    fn params_json_has_every_comparable_parameter() {
        let p = Workload::builtin("agentic").unwrap().params_json();
        assert_eq!(
            p,
            serde_json::json!({
                "name": "agentic", "sessions": 80, "rounds": 4, "ctx": 300,
                "max_tokens": 256, "timeout_s": 10.0, "seed": 1, "temperature": 0.0,
                "steps": 3, "check_args": "strict", "barrier": false
            })
        );
    }

    #[test]
    fn render_result_fills_placeholders_deterministically() {
        let w = parse(MINIMAL).unwrap();
        let args = serde_json::json!({"path": "/a"});
        assert_eq!(
            w.tools[0].render_result(&args),
            "/a: ok (read_file {\"path\":\"/a\"})"
        );
        let a = Workload::builtin("agentic").unwrap();
        let run = &a.tools[2];
        assert_eq!(
            run.render_result(&serde_json::json!({"target": "unit", "verbose": true})),
            "test suite unit (verbose=true): 48 passed, 0 failed in 12.4s"
        );
        assert_eq!(run.property_names(), ["target", "verbose"]);
    }

    #[test]
    fn limits_are_checked_with_their_lines() {
        assert_eq!(
            error_line(&MINIMAL.replace("sessions = 2", "sessions = 0")).0,
            1
        );
        assert_eq!(
            error_line(&MINIMAL.replace("rounds = 3", "rounds = -1")).0,
            2
        );
        assert_eq!(
            error_line(&MINIMAL.replace("timeout_s = 5", "timeout_s = 0")).0,
            5
        );
        assert_eq!(error_line(&MINIMAL.replace("steps = 2", "steps = 0")).0, 7);
        let (line, msg) =
            error_line(&MINIMAL.replace("ctx = 0", "ctx = 0\ncheck_args = \"loose\""));
        assert_eq!(line, 4);
        assert!(msg.contains("loose"), "{msg}");
    }

    #[test]
    fn tools_are_required_and_schemas_checked() {
        let no_tools: String = MINIMAL.lines().take(8).collect::<Vec<_>>().join("\n");
        let (line, msg) = error_line(&no_tools);
        assert_eq!(line, 6);
        assert!(msg.contains("no tools"), "{msg}");

        let not_object = MINIMAL.replace("type = \"object\"", "type = \"array\"");
        let (line, msg) = error_line(&not_object);
        assert!((12..=13).contains(&line), "line {line}");
        assert!(msg.contains("type = \"object\""), "{msg}");

        let bad_schema = MINIMAL.replace(
            "[tool.parameters.properties.path]\ntype = \"string\"",
            "[tool.parameters.properties.path]\ntype = \"strin\"",
        );
        let (_, msg) = error_line(&bad_schema);
        assert!(msg.contains("valid JSON schema"), "{msg}");

        let dup = format!("{MINIMAL}{}", &MINIMAL[MINIMAL.find("[[tool]]").unwrap()..]);
        let (line, msg) = error_line(&dup);
        assert_eq!(line, 20);
        assert!(msg.contains("twice"), "{msg}");
    }

    #[test]
    fn value_pools_must_cover_every_property_and_match_it() {
        let (line, msg) = error_line(&MINIMAL.replace("path = [\"/a\", \"/b\"]", "path = []"));
        assert_eq!(line, 18);
        assert!(msg.contains("empty"), "{msg}");

        let extra_prop = MINIMAL.replace(
            "[tool.values]",
            "[tool.parameters.properties.max_lines]\ntype = \"integer\"\n[tool.values]",
        );
        let (line, msg) = error_line(&extra_prop);
        assert_eq!(line, 19);
        assert!(
            msg.contains("no value pool for argument `max_lines`"),
            "{msg}"
        );

        let wrong_type = MINIMAL.replace("path = [\"/a\", \"/b\"]", "path = [\"/a\", 3]");
        let (line, msg) = error_line(&wrong_type);
        assert_eq!(line, 18);
        assert!(msg.contains("does not match"), "{msg}");

        let stray = MINIMAL.replace("path = [\"/a\", \"/b\"]", "path = [\"/a\"]\npth = [\"/x\"]");
        let (line, msg) = error_line(&stray);
        assert_eq!(line, 19);
        assert!(msg.contains("`pth`"), "{msg}");

        let closed = MINIMAL.replace("required = [\"path\"]", "required = [\"path\", \"mode\"]");
        let (_, msg) = error_line(&closed);
        assert!(msg.contains("generated arguments"), "{msg}");
    }

    #[test]
    fn result_placeholders_must_name_arguments() {
        let (line, msg) = error_line(&MINIMAL.replace("{path}: ok", "{file}: ok"));
        assert_eq!(line, 11);
        assert!(msg.contains("{file}"), "{msg}");
        // JSON-looking braces are text, not placeholders.
        assert!(parse(&MINIMAL.replace("{path}: ok", r#"{\"a\": 1} {path}"#)).is_ok());
    }

    #[test]
    fn malformed_toml_reports_the_parser_line() {
        let (line, _) = error_line(&MINIMAL.replace("max_tokens = 64", "max_tokens = = 64"));
        assert_eq!(line, 4);
        let (line, msg) = error_line(&MINIMAL.replace("ctx = 0", "ctx = 0\nsesions = 3"));
        assert_eq!(line, 4);
        assert!(msg.contains("sesions"), "{msg}");
    }

    #[test]
    fn overrides_are_rechecked() {
        let mut w = Workload::builtin("smoke").unwrap();
        assert!(w.validate_overrides().is_ok());
        w.sessions = 0;
        assert!(matches!(
            w.validate_overrides(),
            Err(ConfigError::Usage { .. })
        ));
        w.sessions = 1;
        w.timeout_s = 0.0;
        assert!(w.validate_overrides().is_err());
    }
}
