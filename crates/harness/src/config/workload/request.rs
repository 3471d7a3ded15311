//! What a workload sends besides the conversation ([`RequestOptions`]): the system
//! prompt, the few-shot `[[example]]` turns, `tool_choice`, the `[request]` fields passed
//! through verbatim and `stream`, each checked against the file.

use toml::Spanned;

use super::{toml_to_json, RawExample, RawWorkload, RESERVED_REQUEST_FIELDS};
use crate::config::{ConfigError, Source};
use crate::core::session::{ChatMessage, FunctionCall, ToolCall};
use crate::core::workload::{RequestOptions, ToolSpec};

/// `system`, `[[example]]`, `tool_choice`, `[request]`, `stream`, checked.
pub(super) fn request_options(
    src: &Source,
    raw: &RawWorkload,
    tools: &[ToolSpec],
) -> Result<RequestOptions, ConfigError> {
    Ok(RequestOptions {
        system: system_prompt(src, raw)?,
        examples: example_turns(src, raw, tools)?,
        tool_choice: tool_choice(src, raw)?,
        extra: extra_fields(src, raw)?,
        stream: raw.stream,
    })
}

/// The system prompt, trimmed; an empty one is refused.
fn system_prompt(src: &Source, raw: &RawWorkload) -> Result<Option<String>, ConfigError> {
    match &raw.system {
        Some(s) if s.get_ref().trim().is_empty() => Err(src.invalid(
            s.span(),
            "system is empty",
            "write the system prompt, or remove the key",
        )),
        Some(s) => Ok(Some(s.get_ref().trim().to_string())),
        None => Ok(None),
    }
}

/// The `[[example]]` turns as chat messages: a known role, tool calls only on assistant
/// turns and only to the workload's tools, a tool turn answering a call by its id, and
/// something said in every turn.
fn example_turns(
    src: &Source,
    raw: &RawWorkload,
    tools: &[ToolSpec],
) -> Result<Vec<ChatMessage>, ConfigError> {
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
        let calls = example_calls(src, i, spanned, role, tools)?;
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
    Ok(examples)
}

/// Example `i`'s tool calls (0-based `i`), each with its id (`example_{i}_{j}` when the
/// file gives none) and its arguments as JSON.
fn example_calls(
    src: &Source,
    i: usize,
    spanned: &Spanned<RawExample>,
    role: &str,
    tools: &[ToolSpec],
) -> Result<Vec<ToolCall>, ConfigError> {
    let mut calls = Vec::new();
    for (j, c) in spanned.get_ref().tool_calls.iter().enumerate() {
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
    Ok(calls)
}

/// `tool_choice`: `"auto"`, `"required"`, `"none"` or a table, passed as JSON.
fn tool_choice(src: &Source, raw: &RawWorkload) -> Result<Option<serde_json::Value>, ConfigError> {
    let Some(v) = &raw.tool_choice else {
        return Ok(None);
    };
    match v.get_ref() {
        toml::Value::String(s) if ["auto", "required", "none"].contains(&s.as_str()) => {
            Ok(Some(serde_json::Value::String(s.clone())))
        }
        toml::Value::Table(_) => Ok(Some(toml_to_json(v.get_ref()))),
        other => Err(src.invalid(
            v.span(),
            format!("tool_choice = {other} is not a tool choice"),
            "use \"auto\", \"required\", \"none\", or a table {type = \"function\", function = {name = \"read_file\"}}",
        )),
    }
}

/// The `[request]` fields, passed verbatim; one bisect sets itself is refused.
fn extra_fields(
    src: &Source,
    raw: &RawWorkload,
) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
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
    Ok(extra)
}
