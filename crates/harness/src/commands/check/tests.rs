//! `bisect check` without a live engine: the dry run, changed lines, restart programs,
//! chat-template discovery, and the URL checks against scripted local servers.

use super::flags::dry_run;
use super::urls::chat_template_file;
use super::*;
use crate::config::Engine;

#[test]
fn changed_lines_names_the_whole_lines_of_a_replacement() {
    let old = "#!/bin/sh\nexport A=1\nexec srv --x 32 --y\n";
    let new = "#!/bin/sh\nexport A=0\nexec srv --x 32 --y\n";
    assert_eq!(
        changed_lines(old, new),
        (2, vec!["export A=1".into()], vec!["export A=0".into()])
    );
    let new = "#!/bin/sh\nexport A=1\nexec srv --x 64 --y\n";
    assert_eq!(
        changed_lines(old, new),
        (
            3,
            vec!["exec srv --x 32 --y".into()],
            vec!["exec srv --x 64 --y".into()]
        )
    );
}

#[test]
fn changed_lines_of_an_insertion_and_a_removal() {
    let old = "#!/bin/sh\nexport A=1\nexec srv\n";
    let new = "#!/bin/sh\nexport A=1\nexport B=0\nexec srv\n";
    assert_eq!(
        changed_lines(old, new),
        (3, vec![], vec!["export B=0".into()])
    );
    // The new line shares its first letters with the line it goes before.
    let new = "#!/bin/sh\nexport A=1\nexport EXEC=1\nexec srv\n";
    assert_eq!(
        changed_lines(old, new),
        (3, vec![], vec!["export EXEC=1".into()])
    );
    // A removed continuation line.
    let old = "exec srv \\\n  --sw \\\n  --x 1\n";
    let new = "exec srv \\\n  --x 1\n";
    assert_eq!(
        changed_lines(old, new),
        (2, vec!["  --sw \\".into()], vec![])
    );
    // No trailing newline, CRLF kept out of the lines.
    let old = "export A=1\r\nexec srv";
    let new = "export A=1\r\nexec srv --sw";
    assert_eq!(
        changed_lines(old, new),
        (2, vec!["exec srv".into()], vec!["exec srv --sw".into()])
    );
}

/// A two-role target in `dir` with the embedded engine's launch scripts.
fn target_in(dir: &Path) -> TargetProfile {
    let prefill = dir.join("prefill.sh");
    let decode = dir.join("decode.sh");
    std::fs::write(&prefill, crate::config::embedded::prefill_script("srv", 1)).unwrap();
    std::fs::write(&decode, crate::config::embedded::decode_script("srv", 2, 1)).unwrap();
    TargetProfile {
        name: "t".into(),
        api: "http://127.0.0.1:2/v1".into(),
        model: "m".into(),
        api_key_env: None,
        roles: vec![
            RoleSpec::new("prefill", prefill, "http://127.0.0.1:1/health".into(), None),
            RoleSpec::new("decode", decode, "http://127.0.0.1:2/health".into(), None),
        ],
        source: None,
        engine: Default::default(),
        markup: Vec::new(),
        flags_dir: None,
        rejections: Vec::new(),
        launch_scripts: Vec::new(),
        replica: None,
        replicas: Vec::new(),
    }
}

fn offline<'a>(target: &'a TargetProfile, catalog: &'a FlagCatalog, root: &Path) -> CheckPlan<'a> {
    CheckPlan {
        target,
        catalog,
        workload: None,
        offline: true,
        api_key: None,
        api_key_missing: Some("SOME_KEY".into()),
        timeout: Duration::from_secs(1),
        state_root: root.to_path_buf(),
    }
}

#[tokio::test]
async fn a_journal_left_for_the_target_is_a_problem_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let target = target_in(dir.path());
    let catalog = FlagCatalog::builtin();
    let root = dir.path().join("state");
    let before: Vec<String> = target
        .roles
        .iter()
        .map(|r| std::fs::read_to_string(&r.launch).unwrap())
        .collect();

    let report = check(&offline(&target, &catalog, &root)).await;
    assert!(report.passed(), "{:#?}", report.problems);
    assert_eq!(report.flags.len(), 6);
    // Offline, an unset api_key_env is a note, not a problem.
    assert!(report.notes.iter().any(|n| n.contains("$SOME_KEY")));
    // The check created no state of its own.
    assert!(!root.exists());

    let files: Vec<_> = target.roles.iter().map(|r| r.launch.clone()).collect();
    let canonical: Vec<_> = {
        let mut c: Vec<_> = files.iter().map(|f| f.canonicalize().unwrap()).collect();
        c.sort();
        c
    };
    let state = crate::launch::state_root_for_tests(&root, &canonical);
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join(crate::launch::JOURNAL_FILE), "{}").unwrap();
    let report = check(&offline(&target, &catalog, &root)).await;
    assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
    assert!(report.problems[0].fix.contains("bisect restore"));

    let after: Vec<String> = target
        .roles
        .iter()
        .map(|r| std::fs::read_to_string(&r.launch).unwrap())
        .collect();
    assert_eq!(before, after);
}

#[tokio::test]
async fn a_half_applied_flag_is_a_problem_with_its_fix() {
    let dir = tempfile::tempdir().unwrap();
    let target = target_in(dir.path());
    // MMA_FLASHMLA lists decode only; setting it in prefill too would half-apply it.
    let prefill = &target.roles[0].launch;
    let text = std::fs::read_to_string(prefill).unwrap();
    std::fs::write(
        prefill,
        text.replace("exec ", "export SGLANG_SM120_MMA_FLASHMLA=1\nexec "),
    )
    .unwrap();
    let catalog = FlagCatalog::builtin();
    let mut plan = offline(&target, &catalog, dir.path());
    plan.api_key_missing = None;
    let report = check(&plan).await;
    assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
    let p = &report.problems[0];
    assert_eq!(p.subject, "flag MMA_FLASHMLA");
    assert!(
        p.message
            .contains("prefill.sh:6: SGLANG_SM120_MMA_FLASHMLA")
            && p.message.contains("which the flag does not list"),
        "{p:?}"
    );
    assert!(p.fix.contains("--allow-partial"), "{p:?}");
}

/// A server that wants `Bearer KEY` on /health and /metrics; its metrics use vLLM's
/// names, its /server_info reports bf16 index-K.
async fn keyed_server() -> std::net::SocketAddr {
    use crate::test_http::authed;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/health",
            get(|h: HeaderMap| async move {
                if authed(&h) {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .route(
            "/metrics",
            get(|h: HeaderMap| async move {
                if authed(&h) {
                    (
                        StatusCode::OK,
                        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 0\n",
                    )
                } else {
                    (StatusCode::UNAUTHORIZED, "")
                }
            }),
        )
        .route(
            "/server_info",
            get(|| async {
                axum::Json(serde_json::json!({"flags": {"SGLANG_DSV4_BF16_INDEX_K": "1"}}))
            }),
        );
    crate::test_http::serve(app).await
}

#[tokio::test]
async fn urls_are_asked_with_the_key_and_a_missing_gauge_names_the_ones_there() {
    let addr = keyed_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut target = target_in(dir.path());
    for role in &mut target.roles {
        role.health = format!("http://{addr}/health");
        role.metrics = Some(format!("http://{addr}/metrics"));
        role.effective_url = Some(format!("http://{addr}/server_info"));
        role.running_metric = "vllm:num_requests_running".into();
        // The SGLang name on a vLLM server: the gauge a wrong preset would expect.
        role.queued_metric = "sglang:num_queue_reqs".into();
    }
    let catalog = FlagCatalog::builtin();
    let mut plan = offline(&target, &catalog, dir.path());
    plan.offline = false;
    plan.api_key_missing = None;
    plan.api_key = Some(crate::test_http::KEY.into());

    let report = check(&plan).await;
    let kinds: Vec<(&str, &str, bool)> = report
        .urls
        .iter()
        .map(|u| (u.role.as_str(), u.kind.as_str(), u.ok))
        .collect();
    assert_eq!(
        kinds,
        [
            ("prefill", "health", true),
            ("prefill", "metrics", false),
            ("prefill", "effective", true),
            ("decode", "health", true),
            ("decode", "metrics", false),
            ("decode", "effective", true)
        ]
    );
    assert_eq!(report.problems.len(), 2, "{:#?}", report.problems);
    let p = &report.problems[0];
    assert_eq!(p.subject, "role prefill metrics");
    assert!(
        p.message
            .contains("no sglang:num_queue_reqs among its 2 samples"),
        "{p:?}"
    );
    assert!(
        p.fix.contains("queued_metric") && p.fix.contains("vllm:num_requests_waiting"),
        "{p:?}"
    );
    assert!(
        report
            .notes
            .iter()
            .any(|n| n
                == "role decode: the engine reports BF16_INDEX_K=1, as its launch config says"),
        "{:#?}",
        report.notes
    );

    // Without the key the server refuses, and the fix says what it wants.
    plan.api_key = None;
    let report = check(&plan).await;
    let health = &report.problems[0];
    assert_eq!(health.subject, "role prefill health");
    assert!(health.message.ends_with("HTTP 401"), "{health:?}");
    assert!(health.fix.contains("api_key_env"), "{health:?}");
}

#[test]
fn a_restart_program_this_machine_lacks_is_named() {
    assert_eq!(missing_program("sh -c true"), None);
    assert_eq!(
        missing_program("FOO=1 no-such-program-here restart x"),
        Some("no-such-program-here".into())
    );
    assert_eq!(
        missing_program("/no/such/kubectl rollout"),
        Some("/no/such/kubectl".into())
    );
}

#[test]
fn dry_run_refuses_what_the_read_back_would() {
    let flag = FlagCatalog::builtin().get("BF16_INDEX_K").unwrap().clone();
    let text = "export SGLANG_DSV4_BF16_INDEX_K=1\nexec srv\n";
    let e = dry_run(&flag, Path::new("p.sh"), text, "off", "0");
    assert_eq!(e.change, "replace");
    assert_eq!(e.before, vec!["export SGLANG_DSV4_BF16_INDEX_K=1"]);
    assert_eq!(e.after, vec!["export SGLANG_DSV4_BF16_INDEX_K=0"]);
    let e = dry_run(&flag, Path::new("p.sh"), text, "on", "1");
    assert_eq!((e.change.as_str(), e.line), ("unchanged", 1));
    let bad = dry_run(&flag, Path::new("p.sh"), text, "off", "0 1");
    assert_eq!(bad.change, "refused");
    assert!(bad.error.unwrap().to_string().contains("fix:"));
}

/// A llama-server stand-in whose `/props` says whether its template carries tool
/// calls (`None`: no `chat_template_caps` at all).
async fn llama_server(tools: Option<bool>) -> std::net::SocketAddr {
    use axum::routing::get;
    let props = match tools {
        Some(t) => serde_json::json!({"chat_template_caps": {"supports_tool_calls": t}}),
        None => serde_json::json!({"total_slots": 4}),
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "{\"status\":\"ok\"}" }))
        .route(
            "/metrics",
            get(|| async { "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n" }),
        )
        .route(
            "/props",
            get(move || {
                let props = props.clone();
                async move { axum::Json(props) }
            }),
        );
    crate::test_http::serve(app).await
}

#[tokio::test]
async fn a_llama_server_without_tool_calls_fails_naming_its_template() {
    let dir = tempfile::tempdir().unwrap();
    let serve = dir.path().join("serve.sh");
    std::fs::write(
        &serve,
        "#!/bin/sh\n# --chat-template-file commented.jinja\nexport LLAMA_ARG_N_PARALLEL=4\nexec \"$LLAMA_SERVER\" --jinja \\\n    --chat-template-file gemma3.jinja --metrics\n",
    )
    .unwrap();
    let catalog = FlagCatalog::builtin();
    for (tools, ok) in [(Some(true), true), (Some(false), false), (None, false)] {
        let addr = llama_server(tools).await;
        let preset = Engine::Llamacpp.preset();
        let mut role = RoleSpec::new(
            "server",
            serve.clone(),
            format!("http://{addr}/health"),
            Some(format!("http://{addr}/metrics")),
        );
        role.running_metric = preset.running_metric.into();
        role.queued_metric = preset.queued_metric.into();
        role.effective_url = Some(format!("http://{addr}/props"));
        let target = TargetProfile {
            name: "llama".into(),
            api: format!("http://{addr}/v1"),
            model: "m".into(),
            api_key_env: None,
            roles: vec![role],
            source: None,
            engine: Engine::Llamacpp,
            markup: Vec::new(),
            rejections: Vec::new(),
            flags_dir: None,
            launch_scripts: Vec::new(),
            replica: None,
            replicas: Vec::new(),
        };
        let mut plan = offline(&target, &catalog, dir.path());
        plan.offline = false;
        plan.api_key_missing = None;
        let report = check(&plan).await;
        let tools_row = report.urls.iter().find(|u| u.kind == "tools");
        assert_eq!(tools_row.map(|u| u.ok), Some(ok), "{:#?}", report.urls);
        // The builtin catalog has no flag for a role named "server" (a problem of its
        // own); only the tools check's problem is this test's.
        let tools: Vec<&Problem> = report
            .problems
            .iter()
            .filter(|p| p.subject.ends_with(" tools"))
            .collect();
        assert_eq!(tools.is_empty(), ok, "{:#?}", report.problems);
        if !ok {
            let p = tools[0];
            assert_eq!(p.subject, "role server tools");
            assert!(
                p.message.contains("gemma3.jinja") && p.message.contains("serve.sh:5"),
                "{p:?}"
            );
            assert!(p.fix.contains("--chat-template-file"), "{p:?}");
        }
    }
    assert_eq!(
        chat_template_file("exec srv --chat-template-file=t.jinja"),
        Some((1, "t.jinja".into()))
    );
    assert_eq!(
        chat_template_file("export LLAMA_ARG_CHAT_TEMPLATE_FILE=\"t.jinja\""),
        Some((1, "t.jinja".into()))
    );
}

/// What the engines say of their tool-call parsing, in their own documents
/// (tests/fixtures/engines/): SGLang's `tool_call_parser` (null: nothing is parsed),
/// llama-server's `chat_template_caps` as the real server serves them.
#[test]
fn the_engines_own_word_on_their_tool_call_parser_is_read() {
    use crate::test_http::engine_fixture;
    let role = RoleSpec::new(
        "decode",
        PathBuf::from("serve_dsv4_decode.sh"),
        "http://127.0.0.1:30002/health".into(),
        None,
    );
    let doc =
        |file: &str| -> serde_json::Value { serde_json::from_str(&engine_fixture(file)).unwrap() };
    let (message, fix) = super::toolcalls::sglang_parser(
        Engine::Sglang,
        &role,
        &doc("sglang/server_info-no-parser.json"),
    )
    .unwrap()
    .unwrap_err();
    assert!(message.starts_with("tool_call_parser = null"), "{message}");
    assert!(
        fix.contains("--tool-call-parser") && fix.contains("deepseekv4"),
        "{fix}"
    );
    assert_eq!(
        super::toolcalls::sglang_parser(Engine::Sglang, &role, &doc("sglang/server_info.json")),
        Some(Ok("tool_call_parser = deepseekv4".into()))
    );
    // Other engines' documents are not read for it.
    assert_eq!(
        super::toolcalls::sglang_parser(Engine::Vllm, &role, &doc("sglang/server_info.json")),
        None
    );
    let props = doc("llamacpp/props.json");
    assert_eq!(
        super::urls::llamacpp_tool_calls(&role, &props),
        Ok("chat_template_caps.supports_tool_calls = true".into())
    );
}

/// A running engine that reports a flag at neither of its values puts its own in place
/// (vLLM on CPU and the attention backend): check says a run of it is refused, and the
/// one that reports the other arm's value is still "not running from its launch config".
#[test]
fn an_engine_reporting_neither_of_a_flags_values_is_named_before_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let target = target_in(dir.path());
    let catalog = FlagCatalog::builtin();
    let root = dir.path().join("state");
    let plan = offline(&target, &catalog, &root);
    let decode = &target.roles[1];
    let launch = std::fs::read_to_string(&decode.launch).unwrap();
    assert!(launch.contains("SGLANG_DSV4_BF16_INDEX_K=1"), "{launch}");
    let compare = |reported: &str| {
        let doc = serde_json::json!({ "flags": { "SGLANG_DSV4_BF16_INDEX_K": reported } });
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        super::urls::compare_effective(&plan, decode, &doc, &mut problems, &mut notes);
        problems
    };
    let own = compare("7");
    assert_eq!(own.len(), 1, "{own:#?}");
    assert!(
        own[0].message.contains(
            "the engine reports SGLANG_DSV4_BF16_INDEX_K=7, neither of the flag's values (on 1, off 0)"
        ) && own[0].message.contains("a run of BF16_INDEX_K is refused before its sessions"),
        "{own:#?}"
    );
    let other = compare("0");
    assert_eq!(other.len(), 1, "{other:#?}");
    assert!(
        other[0]
            .message
            .contains("not running from its launch config"),
        "{other:#?}"
    );
    assert!(compare("1").is_empty());
}

/// An engine that takes the request and never answers within the workload's timeout
/// (a CPU vLLM's first reply takes longer than `agentic`'s): the probe's fix says which
/// wait ran out and how to give a slow engine longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_times_out_says_the_workloads_timeout_and_how_to_lengthen_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = target_in(dir.path());
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    target.api = format!("http://{}/v1", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let mut workload = crate::config::builtin_workload("tiny").unwrap();
    workload.timeout_s = 0.5;
    let catalog = FlagCatalog::builtin();
    let root = dir.path().join("state");
    let mut plan = offline(&target, &catalog, &root);
    plan.offline = false;
    plan.workload = Some(&workload);
    let report = check(&plan).await;
    held.abort();
    let probe = report
        .problems
        .iter()
        .find(|p| p.subject == "tool calls")
        .unwrap_or_else(|| panic!("{:#?}", report.problems));
    assert!(
        probe
            .fix
            .contains("a reply timed out after the workload's timeout_s = 0.5 s: a slow engine needs a workload with a longer timeout_s"),
        "{probe:#?}"
    );
}
