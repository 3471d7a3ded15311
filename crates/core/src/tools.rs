//! Simulated tools: the deterministic result the harness answers a tool call with.
//!
//! The text is the tool's `result` template filled from the call's arguments by
//! [`ToolSpec::render_result`] (`{tool}`, `{args}`, `{NAME}`; the workload loader
//! validates the placeholders), so the same call always gets the same answer, in every
//! arm and repeat. Here: choosing the arguments to fill from, and the `role: "tool"`
//! message that carries the result back.

use crate::session::{ChatMessage, ToolCall};
use crate::workload::ToolSpec;
use serde_json::{Map, Value};

/// The result of `call`, filled from the arguments the model actually sent; when those
/// are not a JSON object (only possible for rounds the classifier let through under
/// `check_args = "schema"`), from `fallback`, the step's own arguments.
pub fn simulate(tool: &ToolSpec, call: &ToolCall, fallback: &Map<String, Value>) -> String {
    let args = serde_json::from_str::<Value>(&call.function.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::Object(fallback.clone()));
    tool.render_result(&args)
}

/// The `role: "tool"` message answering call `call_id`.
pub fn tool_message(call_id: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: "tool".to_string(),
        content: Some(content),
        tool_call_id: Some(call_id.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::FunctionCall;
    use serde_json::json;

    fn tool(result: &str) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
            arg_values: Default::default(),
            result: result.into(),
        }
    }

    fn call(arguments: &str) -> ToolCall {
        ToolCall {
            id: "call_1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "read_file".into(),
                arguments: arguments.into(),
            },
        }
    }

    fn step_args() -> Map<String, Value> {
        json!({"path": "/srv/app/config.yaml", "max_lines": 40})
            .as_object()
            .unwrap()
            .clone()
    }

    #[test]
    fn fills_the_template_from_the_call_arguments() {
        let t = tool("{tool}: {path} ({max_lines} lines) {args} {owner}");
        let text = simulate(
            &t,
            &call(r#"{"path": "/a \"b\"", "max_lines": 7}"#),
            &step_args(),
        );
        assert_eq!(
            text,
            r#"read_file: /a "b" (7 lines) {"path":"/a \"b\"","max_lines":7} {owner}"#
        );
        assert_eq!(
            text,
            simulate(
                &t,
                &call(r#"{"path": "/a \"b\"", "max_lines": 7}"#),
                &step_args()
            )
        );
    }

    #[test]
    fn unusable_arguments_fall_back_to_the_step() {
        let t = tool("{path}:{max_lines}");
        for bad in ["{\"path\": \"/srv", "[1, 2]", ""] {
            assert_eq!(
                simulate(&t, &call(bad), &step_args()),
                "/srv/app/config.yaml:40"
            );
        }
    }

    #[test]
    fn tool_message_answers_the_call_id() {
        let m = tool_message("call_1", "42".into());
        assert_eq!(m.role, "tool");
        assert_eq!(m.tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m.content.as_deref(), Some("42"));
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "tool", "content": "42", "tool_call_id": "call_1"})
        );
    }
}
