//! Workload files (docs/design.md 3.4): sessions, rounds, ctx filler, limits, tool schemas
//! and the task generator that gives each session its own numbered steps.
//!
//! This module owns the file format (documented key by key in `workloads/agentic.toml`),
//! its validation, the embedded builtin workloads, and the deterministic fill of a
//! tool's result template. [`RequestOptions`] carries what real agents send besides the
//! conversation: a system prompt, few-shot example turns, `tool_choice`, extra request
//! fields passed through verbatim (`chat_template_kwargs`, sampling extras) and
//! streaming.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::{read_text, ConfigError, Source};
pub use crate::core::workload::{CheckArgs, RequestOptions, TaskSpec, ToolSpec, Workload};

/// Request fields bisect sets itself; `[request]` may not override them.
pub(crate) const RESERVED_REQUEST_FIELDS: [&str; 8] = [
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
        include_str!("../../../../../workloads/agentic.toml"),
    ),
    (
        "needle",
        include_str!("../../../../../workloads/needle.toml"),
    ),
    ("smoke", include_str!("../../../../../workloads/smoke.toml")),
    ("tiny", include_str!("../../../../../workloads/tiny.toml")),
];

/// The workload `bisect run` uses without `--workload`.
pub(crate) const DEFAULT_WORKLOAD: &str = "agentic";

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

/// A TOML value as JSON (`null` where it has none).
fn toml_to_json(value: &toml::Value) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// Names of the builtin workloads.
pub(crate) fn builtin_workload_names() -> Vec<&'static str> {
    BUILTIN_WORKLOADS.iter().map(|(n, _)| *n).collect()
}

/// A builtin workload by name (`agentic`, `needle`, `smoke`, `tiny`).
pub(crate) fn builtin_workload(name: &str) -> Result<Workload, ConfigError> {
    let (file_name, text) = BUILTIN_WORKLOADS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .ok_or_else(|| ConfigError::UnknownWorkload {
            name: name.to_string(),
            known: builtin_workload_names().join(", "),
        })?;
    let path = Path::new("workloads").join(format!("{file_name}.toml"));
    let mut w = parse_workload(&path, text, file_name)?;
    // Builtins have no file on disk; `source` names only real files.
    w.source = None;
    Ok(w)
}

/// A builtin name (no `/` and no `.toml`) or the path of a workload file.
pub fn load_workload(name_or_path: &str) -> Result<Workload, ConfigError> {
    let looks_like_path = name_or_path.contains('/')
        || name_or_path.contains('\\')
        || name_or_path.ends_with(".toml");
    if !looks_like_path {
        return builtin_workload(name_or_path);
    }
    let path = Path::new(name_or_path);
    let text = read_text(path)?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "workload".into());
    parse_workload(path, &text, &stem)
}

fn parse_workload(path: &Path, text: &str, stem: &str) -> Result<Workload, ConfigError> {
    let src = Source { path, text };
    let raw: RawWorkload = src.parse(WORKLOAD_FIX)?;

    let name = workload_name(&src, &raw, stem)?;
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
    let temperature = temperature(&src, &raw)?;
    let check_args = check_args_mode(&src, &raw)?;
    let seed = seed(&src, &raw)?;
    let task = task_spec(&src, &raw)?;
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

/// `name`, trimmed; the file's stem when absent, refused when blank.
fn workload_name(src: &Source, raw: &RawWorkload, stem: &str) -> Result<String, ConfigError> {
    match &raw.name {
        Some(n) if n.get_ref().trim().is_empty() => Err(src.invalid(
            n.span(),
            "name is empty",
            "name the workload, e.g. name = \"agentic\"",
        )),
        Some(n) => Ok(n.get_ref().trim().to_string()),
        None => Ok(stem.to_string()),
    }
}

/// `temperature`, 0 when absent; refused outside 0..2.
fn temperature(src: &Source, raw: &RawWorkload) -> Result<f64, ConfigError> {
    match &raw.temperature {
        None => Ok(0.0),
        Some(t) => {
            let v = *t.get_ref();
            if !(0.0..=2.0).contains(&v) {
                return Err(src.invalid(
                    t.span(),
                    format!("temperature = {v} is outside 0..2"),
                    "use temperature = 0.0 so arms stay comparable",
                ));
            }
            Ok(v)
        }
    }
}

/// `check_args`: `strict` (the default) or `schema`.
fn check_args_mode(src: &Source, raw: &RawWorkload) -> Result<CheckArgs, ConfigError> {
    match &raw.check_args {
        None => Ok(CheckArgs::Strict),
        Some(c) => match c.get_ref().as_str() {
            "strict" => Ok(CheckArgs::Strict),
            "schema" => Ok(CheckArgs::Schema),
            other => Err(src.invalid(
                c.span(),
                format!("check_args = {other:?} is not a known mode"),
                "use \"strict\" (calls must match the current step) or \"schema\" (only the schema is checked)",
            )),
        },
    }
}

/// `seed`, 1 when absent; refused when negative.
fn seed(src: &Source, raw: &RawWorkload) -> Result<u64, ConfigError> {
    match &raw.seed {
        None => Ok(1),
        Some(s) if *s.get_ref() >= 0 => Ok(*s.get_ref() as u64),
        Some(s) => Err(src.invalid(
            s.span(),
            format!("seed = {} is negative", s.get_ref()),
            "use a seed >= 0",
        )),
    }
}

/// `[task]`: at least one step, and an outro that says what to answer when done.
fn task_spec(src: &Source, raw: &RawWorkload) -> Result<TaskSpec, ConfigError> {
    let raw_task = raw.task.get_ref();
    let steps = src.whole_number("steps", &raw_task.steps, 1)?;
    if raw_task.outro.get_ref().trim().is_empty() {
        return Err(src.invalid(
            raw_task.outro.span(),
            "task outro is empty: the model would not know what to answer when done",
            "end the outro with the exact answer, e.g. \"When every step is done, reply exactly: DONE: all steps completed.\"",
        ));
    }
    Ok(TaskSpec {
        steps,
        intro: raw_task.intro.trim().to_string(),
        outro: raw_task.outro.get_ref().trim().to_string(),
    })
}

/// Re-checks the limits after command-line overrides (`--sessions 0` etc.); the
/// file itself was checked when loaded.
#[cfg(test)]
pub(crate) fn validate_overrides(w: &Workload) -> Result<(), ConfigError> {
    let usage = |message: String, fix: &str| ConfigError::Usage {
        message,
        fix: fix.to_string(),
    };
    if w.sessions == 0 {
        return Err(usage(
            "--sessions must be at least 1".into(),
            "pass --sessions N with N >= 1",
        ));
    }
    if w.rounds == 0 {
        return Err(usage(
            "--rounds must be at least 1".into(),
            "pass --rounds R with R >= 1",
        ));
    }
    if w.max_tokens == 0 {
        return Err(usage(
            "--max-tokens must be at least 1".into(),
            "pass --max-tokens N with N >= 1",
        ));
    }
    if !(w.timeout_s.is_finite() && w.timeout_s > 0.0) {
        return Err(usage(
            format!(
                "--timeout {} must be a positive number of seconds",
                w.timeout_s
            ),
            "pass --timeout SECS with SECS > 0",
        ));
    }
    Ok(())
}

mod request;
mod tools;

use request::request_options;
use tools::validate_tools;

#[cfg(test)]
mod tests;
