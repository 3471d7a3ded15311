//! Workload files: the builtin workloads, request options, tool schemas and the
//! errors (file, line, fix) bad ones get.

use super::*;

fn parse(text: &str) -> Result<Workload, ConfigError> {
    parse_workload(Path::new("workloads/t.toml"), text, "t")
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
    let a = crate::config::builtin_workload("agentic").unwrap();
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

    let n = crate::config::load_workload("needle").unwrap();
    assert_eq!(
        (n.sessions, n.rounds, n.ctx, n.task.steps),
        (24, 2, 12000, 1)
    );
    let s = crate::config::load_workload("smoke").unwrap();
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
    let err = crate::config::load_workload("agentc").unwrap_err();
    assert!(matches!(err, ConfigError::UnknownWorkload { .. }));
    let text = err.to_string();
    assert!(text.contains("agentic, needle, smoke, tiny"), "{text}");
}

#[test]
fn paths_load_files_and_default_the_name_to_the_stem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mine.toml");
    std::fs::write(&path, MINIMAL).unwrap();
    let w = crate::config::load_workload(path.to_str().unwrap()).unwrap();
    assert_eq!(w.name, "mine");
    assert_eq!(w.source.as_deref(), Some(path.as_path()));
    assert_eq!(w.seed, 1);
    assert!(matches!(
        crate::config::load_workload("missing/file.toml").unwrap_err(),
        ConfigError::Read { .. }
    ));
}

#[test]
fn params_json_has_every_comparable_parameter() {
    let p = crate::config::builtin_workload("agentic")
        .unwrap()
        .params_json();
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
    let a = crate::config::builtin_workload("agentic").unwrap();
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
    let (line, msg) = error_line(&MINIMAL.replace("ctx = 0", "ctx = 0\ncheck_args = \"loose\""));
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
    let mut w = crate::config::builtin_workload("smoke").unwrap();
    assert!(crate::config::workload::validate_overrides(&w).is_ok());
    w.sessions = 0;
    assert!(matches!(
        crate::config::workload::validate_overrides(&w),
        Err(ConfigError::Usage { .. })
    ));
    w.sessions = 1;
    w.timeout_s = 0.0;
    assert!(crate::config::workload::validate_overrides(&w).is_err());
}
