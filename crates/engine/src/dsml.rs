//! DeepSeek DSML tool-call markup: the canonical renderer (how the chat template writes
//! an assistant's calls back into the prompt) and the parser that turns model output
//! into OpenAI `tool_calls` the way sglang's DSML detector does: a complete, well-formed
//! `<｜DSML｜tool_calls>` block becomes calls; a block that does not parse stays verbatim
//! in `content`.

use regex::Regex;
use serde_json::{Map, Value};
use std::sync::OnceLock;

pub(crate) const BLOCK_OPEN: &str = "<｜DSML｜tool_calls>";
pub(crate) const BLOCK_CLOSE: &str = "</｜DSML｜tool_calls>";

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParsedCall {
    pub(crate) name: String,
    /// JSON object text.
    pub(crate) arguments: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct ParsedOutput {
    /// Text outside parsed blocks (trimmed); None when nothing but whitespace is left.
    pub(crate) content: Option<String>,
    pub(crate) tool_calls: Vec<ParsedCall>,
}

/// Render calls `(name, arguments object)` as one canonical DSML block.
pub(crate) fn render_calls(calls: &[(String, Map<String, Value>)]) -> String {
    let mut out = String::from(BLOCK_OPEN);
    out.push('\n');
    for (name, arguments) in calls {
        out.push_str(&format!("<｜DSML｜invoke name=\"{name}\">\n"));
        for (key, value) in arguments {
            match value {
                Value::String(text) => out.push_str(&format!(
                    "<｜DSML｜parameter name=\"{key}\" string=\"true\">{text}</｜DSML｜parameter>\n"
                )),
                other => out.push_str(&format!(
                    "<｜DSML｜parameter name=\"{key}\" string=\"false\">{other}</｜DSML｜parameter>\n"
                )),
            }
        }
        out.push_str("</｜DSML｜invoke>\n");
    }
    out.push_str(BLOCK_CLOSE);
    out
}

fn header_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r#"^(?:<｜DSML｜invoke name="([^"<>]+)">|<｜DSML｜parameter name="([^"<>]+)" string="(true|false)">)"#)
            .expect("DSML header regex is valid")
    })
}

const INVOKE_CLOSE: &str = "</｜DSML｜invoke>";
const PARAMETER_CLOSE: &str = "</｜DSML｜parameter>";

/// Parse the inside of one block; None if anything in it is malformed.
fn parse_block(body: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = body.trim_start();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let invoke = header_regex().captures(rest)?;
        let name = invoke.get(1)?.as_str().to_string();
        rest = rest[invoke.get(0)?.end()..].trim_start();
        let mut arguments = Map::new();
        while let Some(parameter) = header_regex().captures(rest) {
            let key = parameter.get(2)?.as_str().to_string();
            let is_string = parameter.get(3)?.as_str() == "true";
            let after = &rest[parameter.get(0)?.end()..];
            let end = after.find(PARAMETER_CLOSE)?;
            let raw = &after[..end];
            // A value holding another tag is salad, not a value.
            if raw.contains("<｜DSML｜") || raw.contains("</｜DSML｜") {
                return None;
            }
            let value = if is_string {
                Value::String(raw.to_string())
            } else {
                serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
            };
            arguments.insert(key, value);
            rest = after[end + PARAMETER_CLOSE.len()..].trim_start();
        }
        rest = rest.strip_prefix(INVOKE_CLOSE)?.trim_start();
        calls.push(ParsedCall {
            name,
            arguments: Value::Object(arguments).to_string(),
        });
    }
    if calls.is_empty() {
        None
    } else {
        Some(calls)
    }
}

/// Split model output into content and tool calls.
pub(crate) fn parse(output: &str) -> ParsedOutput {
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let mut rest = output;
    while let Some(start) = rest.find(BLOCK_OPEN) {
        content.push_str(&rest[..start]);
        let after_open = &rest[start + BLOCK_OPEN.len()..];
        let Some(end) = after_open.find(BLOCK_CLOSE) else {
            content.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let block_end = start + BLOCK_OPEN.len() + end + BLOCK_CLOSE.len();
        match parse_block(&after_open[..end]) {
            Some(calls) => tool_calls.extend(calls),
            None => content.push_str(&rest[start..block_end]),
        }
        rest = &rest[block_end..];
    }
    content.push_str(rest);
    let trimmed = content.trim();
    ParsedOutput {
        content: if trimmed.is_empty() {
            None
        } else {
            Some(trimmed.to_string())
        },
        tool_calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn canonical_rendering_parses_back() {
        let calls = vec![(
            "read_file".to_string(),
            args(json!({"path": "/srv/app/config.yaml", "max_lines": 40})),
        )];
        let text = render_calls(&calls);
        assert!(text.contains(
            "<｜DSML｜parameter name=\"max_lines\" string=\"false\">40</｜DSML｜parameter>"
        ));
        let parsed = parse(&text);
        assert_eq!(parsed.content, None);
        assert_eq!(parsed.tool_calls.len(), 1);
        assert_eq!(parsed.tool_calls[0].name, "read_file");
        let arguments: Value = serde_json::from_str(&parsed.tool_calls[0].arguments).unwrap();
        assert_eq!(
            arguments,
            json!({"path": "/srv/app/config.yaml", "max_lines": 40})
        );
    }

    #[test]
    fn string_false_value_that_is_not_json_falls_back_to_a_string() {
        let text = "ok <｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let parsed = parse(text);
        assert_eq!(parsed.content.as_deref(), Some("ok"));
        let arguments: Value = serde_json::from_str(&parsed.tool_calls[0].arguments).unwrap();
        assert_eq!(arguments, json!({"n": "false\">1"}));
    }

    #[test]
    fn broken_blocks_stay_verbatim_in_content() {
        let unclosed =
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">\n</｜DSML｜invoke>\n";
        assert_eq!(
            parse(unclosed),
            ParsedOutput {
                content: Some(unclosed.trim().to_string()),
                tool_calls: vec![]
            }
        );
        let salad = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/srv</｜DSML｜parameter>\n</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let parsed = parse(salad);
        assert!(parsed.tool_calls.is_empty());
        assert_eq!(parsed.content.as_deref(), Some(salad));
        let empty_block = "<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>";
        assert_eq!(parse(empty_block).content.as_deref(), Some(empty_block));
    }

    #[test]
    fn plain_text_is_content_only() {
        assert_eq!(
            parse("DONE: all steps completed."),
            ParsedOutput {
                content: Some("DONE: all steps completed.".into()),
                tool_calls: vec![]
            }
        );
        assert_eq!(parse("  \n"), ParsedOutput::default());
    }
}
