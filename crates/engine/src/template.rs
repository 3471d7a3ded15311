//! OpenAI chat request types and the DSV4-like chat template: messages + tools are
//! rendered into one token sequence (BOS, a system section describing the tools and
//! the DSML call format, the turns, the assistant prefix). Each piece is tokenized on
//! its own so that round r+1's prompt starts with round r's prompt plus its canonical
//! output: the prefix cache in prefill depends on it.

use super::dsml;
use super::tokenizer::{self, Vocab};
use serde::Deserialize;
use serde_json::{Map, Value};
use thiserror::Error;

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ChatRequest {
    #[serde(default)]
    pub(crate) model: Option<String>,
    pub(crate) messages: Vec<RequestMessage>,
    #[serde(default)]
    pub(crate) tools: Option<Vec<ToolDef>>,
    #[serde(default)]
    pub(crate) max_tokens: Option<i64>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<i64>,
    // Parsed so that a malformed value is refused as the OpenAI API refuses it; the
    // model does not use it.
    #[allow(dead_code)]
    #[serde(default)]
    pub(crate) temperature: Option<f64>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    /// OpenAI's `logprobs`: serve each generated token's log-probability.
    #[serde(default)]
    pub(crate) logprobs: Option<bool>,
    /// OpenAI's `top_logprobs` (0 to 20): the best alternatives at each token too.
    #[serde(default)]
    pub(crate) top_logprobs: Option<u8>,
}

impl ChatRequest {
    /// How many alternatives to serve per token when log-probabilities are asked for
    /// (`None`: not asked).
    pub(crate) fn top_logprobs(&self) -> Option<usize> {
        (self.logprobs == Some(true)).then(|| usize::from(self.top_logprobs.unwrap_or(0).min(20)))
    }
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RequestMessage {
    pub(crate) role: String,
    #[serde(default)]
    pub(crate) content: Option<Value>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<RequestToolCall>>,
    // Parsed so that a malformed value is refused as the OpenAI API refuses it; the
    // model does not use it.
    #[allow(dead_code)]
    #[serde(default)]
    pub(crate) tool_call_id: Option<String>,
    // Parsed so that a malformed value is refused as the OpenAI API refuses it; the
    // model does not use it.
    #[allow(dead_code)]
    #[serde(default)]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RequestToolCall {
    // Parsed so that a malformed value is refused as the OpenAI API refuses it; the
    // model does not use it.
    #[allow(dead_code)]
    #[serde(default)]
    pub(crate) id: Option<String>,
    pub(crate) function: RequestFunctionCall,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RequestFunctionCall {
    pub(crate) name: String,
    /// JSON object text (OpenAI) or, leniently, an object.
    pub(crate) arguments: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ToolDef {
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
    pub(crate) function: Option<ToolFunction>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ToolFunction {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: Option<String>,
    #[serde(default)]
    pub(crate) parameters: Option<Value>,
}

/// A request the engine refuses with HTTP 400.
#[derive(Debug, Error, PartialEq)]
pub(crate) enum RequestError {
    #[error("messages must not be empty")]
    NoMessages,
    #[error("unknown message role {0:?} (expected system, user, assistant or tool)")]
    UnknownRole(String),
    #[error(
        "this engine is a tool-calling agent: the request must offer at least one tool in `tools`"
    )]
    MissingTools,
    #[error("tool #{0} is invalid: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")]
    InvalidTool(usize),
    #[error("max_tokens must be at least 1 (got {0})")]
    BadMaxTokens(i64),
    #[error("message #{0}: content must be a string or a list of text parts")]
    BadContent(usize),
    #[error("message #{0}: tool call arguments must be a JSON object")]
    BadArguments(usize),
}

/// A validated request: tools, plain-text messages, the token limit.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    pub(crate) tools: Vec<ToolFunction>,
    pub(crate) messages: Vec<Turn>,
    pub(crate) max_tokens: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Turn {
    System(String),
    User(String),
    Assistant {
        content: String,
        calls: Vec<(String, Map<String, Value>)>,
    },
    Tool(String),
}

/// Default completion limit when the request gives none.
pub(crate) const DEFAULT_MAX_TOKENS: usize = 512;

fn text_of(content: &Option<Value>, index: usize) -> Result<String, RequestError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| {
                part.get("text")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or(RequestError::BadContent(index))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
        Some(_) => Err(RequestError::BadContent(index)),
    }
}

impl ChatRequest {
    pub(crate) fn validate(&self) -> Result<Conversation, RequestError> {
        if self.messages.is_empty() {
            return Err(RequestError::NoMessages);
        }
        let max_tokens = match self.max_tokens.or(self.max_completion_tokens) {
            None => DEFAULT_MAX_TOKENS,
            Some(n) if n >= 1 => n as usize,
            Some(n) => return Err(RequestError::BadMaxTokens(n)),
        };
        let tools = match &self.tools {
            None => return Err(RequestError::MissingTools),
            Some(tools) if tools.is_empty() => return Err(RequestError::MissingTools),
            Some(tools) => tools
                .iter()
                .enumerate()
                .map(|(index, tool)| match (&tool.kind, &tool.function) {
                    (Some(kind), Some(function))
                        if kind == "function" && !function.name.trim().is_empty() =>
                    {
                        Ok(function.clone())
                    }
                    _ => Err(RequestError::InvalidTool(index)),
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let mut messages = Vec::with_capacity(self.messages.len());
        for (index, message) in self.messages.iter().enumerate() {
            let text = text_of(&message.content, index)?;
            messages.push(match message.role.as_str() {
                "system" | "developer" => Turn::System(text),
                "user" => Turn::User(text),
                "tool" => Turn::Tool(text),
                "assistant" => {
                    let mut calls = Vec::new();
                    for call in message.tool_calls.iter().flatten() {
                        let arguments = match &call.function.arguments {
                            Value::String(text) => serde_json::from_str::<Value>(text).ok(),
                            other => Some(other.clone()),
                        };
                        match arguments {
                            Some(Value::Object(map)) => {
                                calls.push((call.function.name.clone(), map))
                            }
                            _ => return Err(RequestError::BadArguments(index)),
                        }
                    }
                    Turn::Assistant {
                        content: text,
                        calls,
                    }
                }
                other => return Err(RequestError::UnknownRole(other.to_string())),
            });
        }
        Ok(Conversation {
            tools,
            messages,
            max_tokens,
        })
    }
}

/// The DSML format example of the system section: every tag fragment and both
/// `string="true"` and `string="false"` forms appear here, so the agent can copy them.
pub(crate) const FORMAT_EXAMPLE: &str = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"TOOL_NAME\">\n<｜DSML｜parameter name=\"TEXT_PARAM\" string=\"true\">text value</｜DSML｜parameter>\n<｜DSML｜parameter name=\"NUMBER_PARAM\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

fn system_section(tools: &[ToolFunction]) -> String {
    let mut text = String::from(
        "You are a careful coding agent working on a server. Follow the user's task step by step and call one tool per reply.\n\n## Tools\n",
    );
    for tool in tools {
        text.push_str(&format!("### {}\n", tool.name));
        if let Some(description) = &tool.description {
            text.push_str(description);
            text.push('\n');
        }
        if let Some(parameters) = &tool.parameters {
            text.push_str(&format!("Parameters: {parameters}\n"));
        }
    }
    text.push_str(
        "\n## Tool call format\nTo call a tool, reply with exactly one block like this:\n",
    );
    text.push_str(FORMAT_EXAMPLE);
    text.push_str("\nUse string=\"true\" for string values and string=\"false\" for numbers, booleans, arrays and objects.\n");
    text
}

/// Token sequence of the whole prompt, ending with the assistant prefix.
pub(crate) fn render(conversation: &Conversation, vocab: &Vocab) -> Vec<u32> {
    let mut tokens = vec![vocab.id(tokenizer::BOS)];
    tokens.extend(vocab.encode(&system_section(&conversation.tools)));
    for turn in &conversation.messages {
        match turn {
            Turn::System(text) => tokens.extend(vocab.encode(text)),
            Turn::User(text) => {
                tokens.push(vocab.id(tokenizer::USER));
                tokens.extend(vocab.encode(text));
            }
            Turn::Assistant { content, calls } => {
                tokens.push(vocab.id(tokenizer::ASSISTANT));
                tokens.extend(vocab.encode(content));
                if !calls.is_empty() {
                    tokens.extend(vocab.encode(&dsml::render_calls(calls)));
                }
                tokens.push(vocab.id(tokenizer::EOS));
            }
            Turn::Tool(text) => {
                tokens.push(vocab.id(tokenizer::TOOL_OUTPUT_BEGIN));
                tokens.extend(vocab.encode(text));
                tokens.push(vocab.id(tokenizer::TOOL_OUTPUT_END));
            }
        }
    }
    tokens.push(vocab.id(tokenizer::ASSISTANT));
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(value: Value) -> ChatRequest {
        serde_json::from_value(value).unwrap()
    }

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {"type": "object"}}}])
    }

    #[test]
    fn validation_refuses_bad_requests_with_reasons() {
        let no_tools = request(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(no_tools.validate().unwrap_err(), RequestError::MissingTools);
        let bad_role =
            request(json!({"messages": [{"role": "wizard", "content": "hi"}], "tools": tools()}));
        assert_eq!(
            bad_role.validate().unwrap_err(),
            RequestError::UnknownRole("wizard".into())
        );
        let zero = request(
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools(), "max_tokens": 0}),
        );
        assert_eq!(zero.validate().unwrap_err(), RequestError::BadMaxTokens(0));
        let bad_tool = request(
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
        );
        assert_eq!(
            bad_tool.validate().unwrap_err(),
            RequestError::InvalidTool(0)
        );
    }

    #[test]
    fn rendering_is_prefix_stable_across_rounds() {
        let vocab = Vocab::new();
        let round1 = request(
            json!({"messages": [{"role": "user", "content": "1. read_file(path=\"/a\")"}], "tools": tools()}),
        );
        let first = render(&round1.validate().unwrap(), &vocab);
        let output = dsml::render_calls(&[(
            "read_file".into(),
            json!({"path": "/a"}).as_object().cloned().unwrap(),
        )]);
        let round2 = request(json!({"messages": [
            {"role": "user", "content": "1. read_file(path=\"/a\")"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/a\"}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "contents"}
        ], "tools": tools()}));
        let second = render(&round2.validate().unwrap(), &vocab);
        let mut expected_prefix = first.clone();
        expected_prefix.extend(vocab.encode(&output));
        assert_eq!(&second[..expected_prefix.len()], &expected_prefix[..]);
    }
}
