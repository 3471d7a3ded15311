//! Table of real-looking rounds, each with the class it must get and a piece of the
//! evidence that must explain it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::*;
use crate::session::FunctionCall;

fn tool(name: &str, parameters: Value) -> ToolSpec {
    ToolSpec {
        name: name.to_string(),
        description: format!("{name} (test tool)"),
        parameters,
        arg_values: BTreeMap::new(),
        result: String::new(),
    }
}

/// `read_file(path, max_lines?)`, also the property tests' first tool.
pub(super) fn read_file_tool() -> ToolSpec {
    tool(
        "read_file",
        json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer"}},
            "required": ["path"],
        }),
    )
}

fn tools() -> Vec<ToolSpec> {
    vec![
        read_file_tool(),
        tool(
            "grep",
            json!({
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                "required": ["pattern", "path"],
            }),
        ),
        tool(
            "run_tests",
            json!({
                "type": "object",
                "properties": {"target": {"type": "string"}, "verbose": {"type": "boolean"}},
                "required": ["target"],
            }),
        ),
    ]
}

fn step(tool: &str, args: Value) -> Option<ExpectedCall> {
    let Value::Object(args) = args else {
        panic!("step args must be an object")
    };
    Some(ExpectedCall {
        tool: tool.to_string(),
        args,
    })
}

fn read_step() -> Option<ExpectedCall> {
    step(
        "read_file",
        json!({"path": "/srv/app/config.yaml", "max_lines": 40}),
    )
}

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: format!("call_{name}"),
        kind: "function".to_string(),
        function: FunctionCall {
            name: name.to_string(),
            arguments: arguments.to_string(),
        },
    }
}

fn calls(content: Option<&str>, calls: Vec<ToolCall>) -> ChatMessage {
    ChatMessage {
        role: "assistant".to_string(),
        content: content.map(str::to_string),
        tool_calls: Some(calls),
        ..Default::default()
    }
}

fn text(content: &str) -> ChatMessage {
    ChatMessage::new("assistant", content)
}

fn reasoning(reasoning: &str, content: Option<&str>) -> ChatMessage {
    ChatMessage {
        role: "assistant".to_string(),
        content: content.map(str::to_string),
        reasoning_content: Some(reasoning.to_string()),
        ..Default::default()
    }
}

const FULL_DSML_BLOCK: &str = "I'll read the configuration first.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/srv/app/config.yaml</｜DSML｜parameter>\n<｜DSML｜parameter name=\"max_lines\" string=\"false\">40\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

const V31_BLOCK: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{\"path\": \"/srv/app/config.yaml\", \"max_lines\": 40}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

enum Outcome {
    Reply(ChatMessage),
    Error(&'static str),
    Timeout,
}

struct Case {
    name: &'static str,
    outcome: Outcome,
    expected: Option<ExpectedCall>,
    check: CheckArgs,
    class: RoundClass,
    evidence: &'static str,
}

fn case(
    name: &'static str,
    outcome: Outcome,
    expected: Option<ExpectedCall>,
    class: RoundClass,
    evidence: &'static str,
) -> Case {
    Case {
        name,
        outcome,
        expected,
        check: CheckArgs::Strict,
        class,
        evidence,
    }
}

fn reply(message: ChatMessage) -> Outcome {
    Outcome::Reply(message)
}

fn table() -> Vec<Case> {
    use RoundClass::*;
    let read_ok = r#"{"path": "/srv/app/config.yaml", "max_lines": 40}"#;
    let mut cases = vec![
        // Well-formed calls.
        case(
            "read_file as asked",
            reply(calls(None, vec![call("read_file", read_ok)])),
            read_step(),
            Ok,
            r#"read_file(path="/srv/app/config.yaml", max_lines=40)"#,
        ),
        case(
            "grep as asked",
            reply(calls(None, vec![call("grep", r#"{"pattern":"TODO","path":"/srv/app/src"}"#)])),
            step("grep", json!({"pattern": "TODO", "path": "/srv/app/src"})),
            Ok,
            r#"grep(pattern="TODO", path="/srv/app/src")"#,
        ),
        case(
            "run_tests with optional flag",
            reply(calls(None, vec![call("run_tests", r#"{"target": "tests/test_api.py", "verbose": true}"#)])),
            step("run_tests", json!({"target": "tests/test_api.py", "verbose": true})),
            Ok,
            r#"run_tests(target="tests/test_api.py", verbose=true)"#,
        ),
        case(
            "run_tests without the optional flag",
            reply(calls(None, vec![call("run_tests", r#"{"target": "tests/unit"}"#)])),
            step("run_tests", json!({"target": "tests/unit"})),
            Ok,
            r#"run_tests(target="tests/unit")"#,
        ),
        case(
            "call with a short preamble in content",
            reply(calls(Some("Let me read the configuration file first."), vec![call("read_file", read_ok)])),
            read_step(),
            Ok,
            "read_file(",
        ),
        case(
            "call with clean reasoning",
            reply(ChatMessage {
                reasoning_content: Some("Step 1 asks for the config; read it with a line limit.".to_string()),
                ..calls(None, vec![call("read_file", read_ok)])
            }),
            read_step(),
            Ok,
            "read_file(",
        ),
        case(
            "pretty-printed arguments",
            reply(calls(None, vec![call("read_file", "{\n  \"path\": \"/srv/app/config.yaml\",\n  \"max_lines\": 40\n}\n")])),
            read_step(),
            Ok,
            "path=\"/srv/app/config.yaml\"",
        ),
        // Leaks: DSML in every variant.
        case(
            "full DSML block left in content",
            reply(text(FULL_DSML_BLOCK)),
            read_step(),
            Leak,
            "leak[dsml]: I'll read the configuration first.\\n\\n<｜DSML｜function_calls>",
        ),
        case(
            "repeated parameter closers (the seeds' salad)",
            reply(text("Reading /srv/app/config.yaml now.\n</｜DSML｜parameter>\n</｜DSML｜parameter>\n</｜DSML｜parameter>")),
            read_step(),
            Leak,
            "</｜DSML｜parameter>\\n</｜DSML｜parameter>",
        ),
        case(
            "partial block: invoke without wrapper",
            reply(text("<｜DSML｜invoke name=\"grep\">\n<｜DSML｜parameter name=\"pattern\" string=\"true\">TODO")),
            step("grep", json!({"pattern": "TODO", "path": "/srv/app/src"})),
            Leak,
            "leak[dsml]: <｜DSML｜invoke name=\"grep\">\\n<｜DSML｜parameter",
        ),
        case(
            "doubled fullwidth bars",
            reply(text("<｜｜DSML｜｜function_calls>\n<｜｜DSML｜｜invoke name=\"read_file\">")),
            read_step(),
            Leak,
            "<｜｜DSML｜｜function_calls>",
        ),
        case(
            "doubled ASCII bars",
            reply(text("</||DSML||parameter>\n</||DSML||invoke>")),
            read_step(),
            Leak,
            "</||DSML||parameter>",
        ),
        case(
            "ASCII bars",
            reply(text("<|DSML|invoke name=\"grep\">\n<|DSML|parameter name=\"path\" string=\"true\">/srv/app</|DSML|parameter>")),
            read_step(),
            Leak,
            "leak[dsml]: <|DSML|invoke",
        ),
        case(
            "spaced ASCII bars",
            reply(text("< | DSML | parameter name=\"path\" string=\"true\">/srv/app/config.yaml")),
            read_step(),
            Leak,
            "< | DSML | parameter",
        ),
        case(
            "spaced fullwidth bars",
            reply(text("<｜ DSML ｜invoke name=\"run_tests\">")),
            step("run_tests", json!({"target": "tests/unit"})),
            Leak,
            "<｜ DSML ｜invoke",
        ),
        case(
            "V3.2 function_calls wrapper without prefix",
            reply(text("<function_calls>\n<invoke name=\"read_file\">\n<parameter name=\"path\" string=\"true\">/srv/app/config.yaml</parameter>\n</invoke>\n</function_calls>")),
            read_step(),
            Leak,
            "leak[dsml]: <function_calls>\\n<invoke",
        ),
        case(
            "V4 tool_calls wrapper, whole",
            reply(text("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/srv/app/config.yaml</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")),
            read_step(),
            Leak,
            "leak[dsml]: <｜DSML｜tool_calls>",
        ),
        case(
            "V4 tool_calls wrapper without prefix",
            reply(text("Sure.\n<tool_calls>\n")),
            read_step(),
            Leak,
            "leak[dsml]: Sure.\\n<tool_calls>",
        ),
        case(
            "V4 wrapper's tail with its < lost",
            reply(text("done ｜DSML｜tool_calls>")),
            read_step(),
            Leak,
            "｜DSML｜tool_calls",
        ),
        case(
            "DSML in reasoning_content",
            reply(reasoning("I need to read the file.</｜DSML｜parameter>\n</｜DSML｜parameter>", Some(""))),
            read_step(),
            Leak,
            "leak[dsml] in reasoning_content: I need to read the file.</｜DSML｜parameter>",
        ),
        case(
            "leak next to a parsed call",
            reply(calls(Some("</｜DSML｜invoke>\n</｜DSML｜function_calls>"), vec![call("read_file", read_ok)])),
            read_step(),
            Leak,
            "</｜DSML｜invoke>",
        ),
        case(
            "dangling string attribute salad in content",
            reply(text("max_lines 40\" string=\"false\">false\">1")),
            read_step(),
            Leak,
            "leak[dsml]: max_lines 40\" string=\"false\">false\">1 (string_attr)",
        ),
        case(
            "dangling tag fragment without its opening bracket",
            reply(text("config.yaml｜DSML｜parameter>\n")),
            read_step(),
            Leak,
            "(dsml_fragment)",
        ),
        // Leaks: other families.
        case(
            "V3.1 tool tokens in content",
            reply(text(V31_BLOCK)),
            read_step(),
            Leak,
            "leak[deepseek_v31]: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function",
        ),
        case(
            "V3.1 ASCII tokens",
            reply(text("<|tool_calls_begin|><|tool_call_begin|>function<|tool_sep|>grep")),
            read_step(),
            Leak,
            "leak[deepseek_v31]: <|tool_calls_begin|>",
        ),
        case(
            "V3.1 separator in reasoning",
            reply(reasoning("call read_file <｜tool▁sep｜> with the path", None)),
            read_step(),
            Leak,
            "leak[deepseek_v31] in reasoning_content",
        ),
        case(
            "Hermes block in content",
            reply(text("<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"/srv/app/config.yaml\"}}\n</tool_call>")),
            read_step(),
            Leak,
            "leak[hermes]: <tool_call>\\n{\"name\": \"read_file\"",
        ),
        case(
            "Hermes closing tag only",
            reply(text("{\"name\": \"grep\", \"arguments\": {}}</tool_call>")),
            read_step(),
            Leak,
            "</tool_call> (tool_call_tag)",
        ),
        // bad_args.
        case(
            "attribute salad in a string argument",
            reply(calls(None, vec![call("read_file", r#"{"path": "string=\"false\">false\">1", "max_lines": 40}"#)])),
            read_step(),
            BadArgs,
            r#"bad_args[markup]: read_file.path: "string=\"false\">false\">1""#,
        ),
        case(
            "DSML closer inside the path",
            reply(calls(None, vec![call("read_file", r#"{"path": "/srv/app</｜DSML｜parameter>"}"#)])),
            read_step(),
            BadArgs,
            r#"bad_args[markup]: read_file.path: "/srv/app</｜DSML｜parameter>" (dsml:dsml_tag)"#,
        ),
        case(
            "arguments are an array",
            reply(calls(None, vec![call("read_file", "[1,2]")])),
            read_step(),
            BadArgs,
            "bad_args[not_object]: read_file arguments are an array, not an object: [1,2]",
        ),
        case(
            "double-encoded arguments",
            reply(calls(None, vec![call("read_file", r#""{\"path\": \"/srv/app/config.yaml\"}""#)])),
            read_step(),
            BadArgs,
            "arguments are a string, not an object",
        ),
        case(
            "truncated arguments",
            reply(calls(None, vec![call("read_file", r#"{"path": "#)])),
            read_step(),
            BadArgs,
            "bad_args[json]: read_file arguments do not parse (EOF while parsing",
        ),
        case(
            "tool not offered",
            reply(calls(None, vec![call("delete_file", r#"{"path": "/srv/app/config.yaml"}"#)])),
            read_step(),
            BadArgs,
            r#"bad_args[unknown_tool]: "delete_file" is not an offered tool (offered: grep, read_file, run_tests)"#,
        ),
        case(
            "garbled tool name",
            reply(calls(None, vec![call("read_file</｜DSML｜invoke>", read_ok)])),
            read_step(),
            BadArgs,
            r#""read_file</｜DSML｜invoke>" is not an offered tool"#,
        ),
        case(
            "missing required argument",
            reply(calls(None, vec![call("grep", r#"{"pattern": "TODO"}"#)])),
            step("grep", json!({"pattern": "TODO", "path": "/srv/app/src"})),
            BadArgs,
            r#"bad_args[schema]: grep: "path" is a required property"#,
        ),
        case(
            "wrong type with salad",
            reply(calls(None, vec![call("read_file", r#"{"path": "/srv/app/config.yaml", "max_lines": "40\">1"}"#)])),
            read_step(),
            BadArgs,
            r#"bad_args[schema]: read_file.max_lines: "40\">1" is not of type "integer""#,
        ),
        case(
            "boolean as a string",
            reply(calls(None, vec![call("run_tests", r#"{"target": "tests/unit", "verbose": "false"}"#)])),
            step("run_tests", json!({"target": "tests/unit", "verbose": false})),
            BadArgs,
            "run_tests.verbose: \"false\" is not of type \"boolean\"",
        ),
        case(
            "attribute close in a grep pattern",
            reply(calls(None, vec![call("grep", r#"{"pattern": "false\">1", "path": "/srv/app/src"}"#)])),
            step("grep", json!({"pattern": "TODO", "path": "/srv/app/src"})),
            BadArgs,
            "grep.pattern: \"false\\\">1\" (dsml:attr_close)",
        ),
        case(
            "second of two calls garbled",
            reply(calls(None, vec![call("read_file", read_ok), call("grep", r#"{"pattern": "TODO", "path": "</｜DSML｜parameter>"}"#)])),
            read_step(),
            BadArgs,
            "bad_args[markup]: call 2 of 2: grep.path",
        ),
        case(
            "fragment-like value the step asked for is fine",
            reply(calls(None, vec![call("grep", r#"{"pattern": "string=\"", "path": "/srv/app/src"}"#)])),
            step("grep", json!({"pattern": "string=\"", "path": "/srv/app/src"})),
            Ok,
            r#"grep(pattern="string=\"", path="/srv/app/src")"#,
        ),
        // wrong_args.
        case(
            "right tool, wrong path",
            reply(calls(None, vec![call("read_file", r#"{"path": "/srv/app/main.py", "max_lines": 40}"#)])),
            read_step(),
            WrongArgs,
            r#"wrong_args: expected read_file(path="/srv/app/config.yaml", max_lines=40), got read_file(path="/srv/app/main.py", max_lines=40) (differs in path)"#,
        ),
        case(
            "missing optional argument the step gave",
            reply(calls(None, vec![call("read_file", r#"{"path": "/srv/app/config.yaml"}"#)])),
            read_step(),
            WrongArgs,
            "(differs in max_lines)",
        ),
        case(
            "extra argument",
            reply(calls(None, vec![call("run_tests", r#"{"target": "tests/unit", "verbose": true}"#)])),
            step("run_tests", json!({"target": "tests/unit"})),
            WrongArgs,
            "(differs in extra verbose)",
        ),
        case(
            "next step's tool instead of this one",
            reply(calls(None, vec![call("grep", r#"{"pattern": "TODO", "path": "/srv/app/src"}"#)])),
            read_step(),
            WrongArgs,
            r#"expected read_file(path="/srv/app/config.yaml", max_lines=40), got grep(pattern="TODO", path="/srv/app/src")"#,
        ),
        case(
            "extra call after the right one",
            reply(calls(None, vec![call("read_file", read_ok), call("grep", r#"{"pattern": "TODO", "path": "/srv/app/src"}"#)])),
            read_step(),
            WrongArgs,
            "wrong_args: 2 calls where one was expected: read_file(",
        ),
        case(
            "call although every step is done",
            reply(calls(None, vec![call("run_tests", r#"{"target": "tests/unit"}"#)])),
            None,
            WrongArgs,
            r#"wrong_args: no step remains (a final answer was expected), got run_tests(target="tests/unit")"#,
        ),
        // no_tool.
        case(
            "plain text mid-task",
            reply(text("I'll start by reading the configuration file to understand the setup.")),
            read_step(),
            NoTool,
            r#"no_tool: expected read_file(path="/srv/app/config.yaml", max_lines=40), got text: "I'll start by reading"#,
        ),
        case(
            "empty content mid-task",
            reply(text("")),
            read_step(),
            NoTool,
            "no_tool: empty reply, expected read_file(",
        ),
        case(
            "no content at all mid-task",
            reply(ChatMessage { role: "assistant".to_string(), ..Default::default() }),
            read_step(),
            NoTool,
            "empty reply",
        ),
        case(
            "empty tool_calls list and whitespace",
            reply(calls(Some("  \n"), Vec::new())),
            step("grep", json!({"pattern": "TODO", "path": "/srv/app/src"})),
            NoTool,
            "empty reply, expected grep(",
        ),
        case(
            "clean reasoning but no answer when done",
            reply(reasoning("All three steps are done; summarise.", None)),
            None,
            NoTool,
            "no_tool: empty reply where the final answer was expected",
        ),
        case("empty final answer", reply(text("")), None, NoTool, "empty reply"),
        // Final answers.
        case(
            "final answer when done",
            reply(text("The config sets max_lines to 40, TODOs remain in src/, and all unit tests pass.")),
            None,
            Ok,
            r#"answer: "The config sets max_lines to 40"#,
        ),
        case(
            "final answer discussing markup in prose",
            reply(text("| Format | DSML | Hermes |\n|---|---|---|\n| wrapper | function_calls | tool_call |")),
            None,
            Ok,
            "answer: ",
        ),
        // Transport.
        case(
            "connection refused",
            Outcome::Error("POST http://127.0.0.1:30002/v1/chat/completions: connection refused"),
            read_step(),
            Error,
            "error: POST http://127.0.0.1:30002/v1/chat/completions: connection refused",
        ),
        case(
            "non-2xx with a body",
            Outcome::Error("HTTP 503 Service Unavailable: {\"error\": \"overloaded\"\n}"),
            None,
            Error,
            "error: HTTP 503 Service Unavailable: {\"error\": \"overloaded\"\\n}",
        ),
        case("timeout", Outcome::Timeout, read_step(), Timeout, "timeout"),
    ];
    // check_args = "schema": the step check is skipped, everything before it still applies.
    let schema_only = [
        case(
            "schema mode: right tool, other path",
            reply(calls(
                None,
                vec![call("read_file", r#"{"path": "/srv/app/main.py"}"#)],
            )),
            read_step(),
            Ok,
            r#"read_file(path="/srv/app/main.py")"#,
        ),
        case(
            "schema mode: call when done",
            reply(calls(
                None,
                vec![call(
                    "grep",
                    r#"{"pattern": "TODO", "path": "/srv/app/src"}"#,
                )],
            )),
            None,
            Ok,
            "grep(",
        ),
        case(
            "schema mode: schema still checked",
            reply(calls(None, vec![call("read_file", r#"{"max_lines": 40}"#)])),
            read_step(),
            BadArgs,
            "\"path\" is a required property",
        ),
        case(
            "schema mode: leaks still leaks",
            reply(text(FULL_DSML_BLOCK)),
            read_step(),
            Leak,
            "leak[dsml]",
        ),
    ];
    cases.extend(schema_only.into_iter().map(|c| Case {
        check: CheckArgs::Schema,
        ..c
    }));
    cases
}

#[test]
fn table_of_rounds() {
    let classifier = Classifier::with_defaults(&tools()).unwrap();
    let cases = table();
    assert!(
        cases.len() >= 40,
        "the table should stay broad: {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    for case in &cases {
        let outcome = match &case.outcome {
            Outcome::Reply(message) => RoundOutcome::Reply(message),
            Outcome::Error(message) => RoundOutcome::Error(message.to_string()),
            Outcome::Timeout => RoundOutcome::Timeout,
        };
        let verdict = classifier.classify(&outcome, case.expected.as_ref(), case.check);
        if verdict.class != case.class || !verdict.evidence.contains(case.evidence) {
            failures.push(format!(
                "{}: got {:?} `{}`, want {:?} containing `{}`",
                case.name, verdict.class, verdict.evidence, case.class, case.evidence
            ));
        }
        assert!(
            verdict.evidence.chars().count() <= EVIDENCE_MAX_CHARS,
            "{}: evidence too long",
            case.name
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_class_is_covered_by_the_table() {
    let covered: Vec<RoundClass> = table().iter().map(|c| c.class).collect();
    for class in [
        RoundClass::Ok,
        RoundClass::Error,
        RoundClass::Timeout,
        RoundClass::Leak,
        RoundClass::BadArgs,
        RoundClass::WrongArgs,
        RoundClass::NoTool,
    ] {
        assert!(covered.contains(&class), "{class:?} has no case");
    }
}

#[test]
fn long_salad_is_cut_with_context() {
    let classifier = Classifier::with_defaults(&tools()).unwrap();
    let prose =
        "I will now read the configuration file and then search the sources for TODO markers. ";
    let content = format!("{prose}{}", "</｜DSML｜parameter>\n".repeat(50));
    let message = text(&content);
    let verdict = classifier.classify(
        &RoundOutcome::Reply(&message),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(verdict.class, RoundClass::Leak);
    assert!(
        verdict.evidence.starts_with(
            "leak[dsml]: ...en search the sources for TODO markers. </｜DSML｜parameter>\\n"
        ),
        "{}",
        verdict.evidence
    );
    // The snippet is bounded so the pattern name at the end always survives truncation.
    assert!(
        verdict.evidence.ends_with("... (dsml_tag)"),
        "{}",
        verdict.evidence
    );
    assert!(verdict.evidence.chars().count() <= EVIDENCE_MAX_CHARS);
    assert!(!verdict.evidence.contains('\n'));
}

#[test]
fn families_can_be_restricted() {
    let hermes_only = Classifier::new(&tools(), &[MarkupFamily::Hermes]).unwrap();
    let message = text(FULL_DSML_BLOCK);
    // Without DSML detection the block is only text, so the round has no call.
    let verdict = hermes_only.classify(
        &RoundOutcome::Reply(&message),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(verdict.class, RoundClass::NoTool, "{}", verdict.evidence);
    let message = text("<tool_call>{}</tool_call>");
    let verdict = hermes_only.classify(
        &RoundOutcome::Reply(&message),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(verdict.class, RoundClass::Leak);
}

#[test]
fn empty_arguments_mean_an_empty_object() {
    let no_args = tool("list_dir", json!({"type": "object", "properties": {}}));
    let classifier = Classifier::with_defaults(&[no_args]).unwrap();
    let message = calls(None, vec![call("list_dir", "")]);
    let verdict = classifier.classify(
        &RoundOutcome::Reply(&message),
        step("list_dir", json!({})).as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(
        verdict,
        RoundVerdict {
            class: RoundClass::Ok,
            evidence: "list_dir()".to_string()
        }
    );
    // A tool with a required argument still reports what is missing.
    let classifier = Classifier::with_defaults(&tools()).unwrap();
    let message = calls(None, vec![call("read_file", " ")]);
    let verdict = classifier.classify(
        &RoundOutcome::Reply(&message),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(verdict.class, RoundClass::BadArgs);
    assert!(
        verdict.evidence.contains("\"path\" is a required property"),
        "{}",
        verdict.evidence
    );
}

#[test]
fn nested_values_are_searched_for_fragments() {
    let batch = tool(
        "read_many",
        json!({"type": "object", "properties": {"paths": {"type": "array", "items": {"type": "string"}}}}),
    );
    let classifier = Classifier::with_defaults(&[batch]).unwrap();
    let message = calls(
        None,
        vec![call(
            "read_many",
            r#"{"paths": ["/a", "/b<|DSML|parameter>"]}"#,
        )],
    );
    let verdict = classifier.classify(&RoundOutcome::Reply(&message), None, CheckArgs::Schema);
    assert_eq!(verdict.class, RoundClass::BadArgs);
    assert!(
        verdict
            .evidence
            .starts_with("bad_args[markup]: read_many.paths[1]: "),
        "{}",
        verdict.evidence
    );
}

#[test]
fn bad_schemas_and_duplicate_tools_are_refused() {
    let broken = tool("read_file", json!({"type": 12}));
    let err = Classifier::with_defaults(&[broken]).unwrap_err();
    assert!(format!("{err:#}").contains("tool `read_file`"), "{err:#}");
    let mut twice = tools();
    twice.push(tools().remove(0));
    let err = Classifier::with_defaults(&twice).unwrap_err();
    assert_eq!(err.to_string(), "tool `read_file` is defined twice");
}

#[test]
fn classifier_can_be_shared_across_tasks() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Classifier>();
}

#[test]
fn expected_call_renders_like_a_task_step() {
    let step = step(
        "read_file",
        json!({"path": "/srv/app/config.yaml", "max_lines": 40}),
    )
    .unwrap();
    assert_eq!(
        step.render(),
        r#"read_file(path="/srv/app/config.yaml", max_lines=40)"#
    );
}

#[test]
fn a_corrupted_looking_reply_cut_at_max_tokens_is_truncated() {
    let classifier = Classifier::with_defaults(&tools()).unwrap();
    // The call's arguments stop mid-string: bad_args[json] as sent.
    let message = calls(None, vec![call("read_file", r#"{"path": "/srv/app/con"#)]);
    let verdict = classifier.classify(
        &RoundOutcome::Reply(&message),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(verdict.class, RoundClass::BadArgs);
    let cut = account_for_truncation(verdict.clone(), Some("length"));
    assert_eq!(cut.class, RoundClass::Truncated);
    assert!(
        cut.evidence.starts_with(
            "truncated[length]: the reply stopped at max_tokens; as cut off it reads bad_args"
        ),
        "{}",
        cut.evidence
    );
    assert!(cut.evidence.chars().count() <= EVIDENCE_MAX_CHARS);
    // Any other finish reason, or none (records from before it was kept), keeps the class.
    for reason in [None, Some("stop"), Some("tool_calls")] {
        assert_eq!(account_for_truncation(verdict.clone(), reason), verdict);
    }
    // An ok reply that also hit the limit stays ok: nothing is wrong with it.
    let ok = calls(
        None,
        vec![call(
            "read_file",
            r#"{"path": "/srv/app/config.yaml", "max_lines": 40}"#,
        )],
    );
    let verdict = classifier.classify(
        &RoundOutcome::Reply(&ok),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(
        account_for_truncation(verdict.clone(), Some("length")).class,
        verdict.class
    );
    // Transport failures are never truncation.
    let timeout = classifier.classify(&RoundOutcome::Timeout, None, CheckArgs::Strict);
    assert_eq!(
        account_for_truncation(timeout, Some("length")).class,
        RoundClass::Timeout
    );
}

/// llama-server's reply when the model's tool-call markup does not parse (the wording
/// of common/chat.cpp in the llama.cpp that scripts/llama-server.sh builds).
const LLAMA_REJECTION: &str = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected Hermes 2 Pro format","type":"server_error"}}"#;

/// A non-2xx reply as the driver hands it to the classifier.
fn status(status: u16, body: &str) -> RoundOutcome<'_> {
    RoundOutcome::Status {
        status,
        body,
        error: format!("HTTP {status}: {body}"),
        partial: None,
    }
}

#[test]
fn an_error_reply_a_rejection_pattern_names_is_rejected_with_its_body_as_evidence() {
    // The llama.cpp preset's pattern (config::engine tests that the preset matches the
    // engine's own words; here, what the classifier does with a match).
    let patterns = [
        super::RejectionPattern::new(
            "llamacpp.format",
            Some(500),
            r#"The model produced output that does not match the expected [^"]{1,80} format"#,
        ),
        super::RejectionPattern::new(
            "llamacpp.pos",
            Some(500),
            r"Failed to parse input at pos \d+",
        ),
    ];
    let classifier = Classifier::with_defaults(&tools())
        .unwrap()
        .with_rejections(&patterns)
        .unwrap();
    let rejected = classifier.classify(
        &status(500, LLAMA_REJECTION),
        read_step().as_ref(),
        CheckArgs::Strict,
    );
    assert_eq!(rejected.class, RoundClass::Rejected);
    assert!(
        rejected.evidence.starts_with(
            "rejected[llamacpp.format]: HTTP 500: {\"error\":{\"code\":500,\"message\":\"The model produced output"
        ),
        "{}",
        rejected.evidence
    );
    // Also once every step is done: the engine refused what the model wrote.
    assert_eq!(
        classifier
            .classify(&status(500, LLAMA_REJECTION), None, CheckArgs::Schema)
            .class,
        RoundClass::Rejected
    );
    // Another status, or a body no pattern names, is an infrastructure error as before.
    for (code, body) in [(503, LLAMA_REJECTION), (500, "upstream overloaded")] {
        let verdict = classifier.classify(&status(code, body), None, CheckArgs::Strict);
        assert_eq!(verdict.class, RoundClass::Error, "{code} {body}");
        assert_eq!(verdict.evidence, format!("error: HTTP {code}: {body}"));
    }
    // Without patterns (a custom target), the engine's words are only an error.
    let plain = Classifier::with_defaults(&tools()).unwrap();
    let verdict = plain.classify(&status(500, LLAMA_REJECTION), None, CheckArgs::Strict);
    assert_eq!(verdict.class, RoundClass::Error);
    // A rejected session is corruption, judged, never a failure.
    let class = crate::session::SessionClass::from_round(RoundClass::Rejected).unwrap();
    assert!(class.is_corrupted() && class.is_judged() && !class.is_failure());
    // No finish reason comes with it, and a cut-off one would not make it truncated.
    assert_eq!(
        account_for_truncation(rejected.clone(), Some("length")),
        rejected
    );
    // The evidence stays within the limit, on one line, however long the body.
    let long = format!(
        "{{\"error\":{{\"message\":\"Failed to parse input at pos 7: {}\"}}}}",
        "x\n".repeat(400)
    );
    let verdict = classifier.classify(&status(500, &long), None, CheckArgs::Strict);
    assert_eq!(verdict.class, RoundClass::Rejected);
    assert!(verdict.evidence.starts_with("rejected[llamacpp.pos]: "));
    assert!(verdict.evidence.chars().count() <= EVIDENCE_MAX_CHARS);
    assert!(!verdict.evidence.contains('\n'));
}

#[test]
fn rejected_counts_as_corrupted_in_the_judged_denominator() {
    use crate::session::{Counts, SessionClass};
    let mut as_rejected = Counts::default();
    let mut as_error = Counts::default();
    for _ in 0..8 {
        as_rejected.add(SessionClass::Done);
        as_error.add(SessionClass::Done);
    }
    for _ in 0..2 {
        as_rejected.add(SessionClass::Rejected);
        as_error.add(SessionClass::Error);
    }
    assert_eq!((as_rejected.corrupted(), as_rejected.judged()), (2, 10));
    assert_eq!((as_error.corrupted(), as_error.judged()), (0, 8));
    assert_eq!(as_rejected.failed(), 0);
    // Written only when non-zero: a record without rejections keeps its shape.
    let json = serde_json::to_value(as_error).unwrap();
    assert!(json.get("rejected").is_none(), "{json}");
    assert_eq!(serde_json::to_value(as_rejected).unwrap()["rejected"], 2);
    let old: Counts = serde_json::from_str(
        r#"{"done":1,"maxrounds":0,"leak":0,"bad_args":0,"wrong_args":0,"no_tool":0,"error":0,"timeout":0}"#,
    )
    .unwrap();
    assert_eq!(old[SessionClass::Rejected], 0);
}
