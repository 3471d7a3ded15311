//! `bisect check`: every shipped profile under targets/ passes offline (and is left
//! byte for byte as it was), the URL checks pass against live embedded engines started
//! from their launch scripts and fail with a fix against a dead port, a flag matching
//! no launch line and an engine not running its launch config are problems, a profile
//! with a syntax error names its file and line, and `bisect flags --target` agrees with
//! check about which flags do not apply.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::bisect;

/// The repository's targets/ directory.
fn targets_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("targets")
}

/// Every file under `dir` with its bytes and permissions.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let mode = std::fs::metadata(&path).unwrap().permissions().mode();
                out.insert(path.clone(), (std::fs::read(&path).unwrap(), mode));
            }
        }
    }
    out
}

/// `bisect check ARGS --json`: (exit code, report, stderr).
fn check_json(args: &[&str], cwd: &Path) -> (i32, Value, String) {
    let mut all = vec!["check", "--json"];
    all.extend_from_slice(args);
    let out = bisect(&all, cwd);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr: {stderr}"));
    (out.status.code().unwrap(), report, stderr)
}

/// `bisect check --offline --target PROFILE --json`: (exit code, report, stderr).
fn check_offline(profile: &Path, cwd: &Path) -> (i32, Value, String) {
    check_json(&["--offline", "--target", profile.to_str().unwrap()], cwd)
}

/// `bisect check --target PROFILE` as a person reads it: (exit code, stdout).
fn check_text(profile: &Path, cwd: &Path) -> (Option<i32>, String) {
    let out = bisect(&["check", "--target", profile.to_str().unwrap()], cwd);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    (out.status.code(), text)
}

fn problems(report: &Value) -> Vec<String> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{}: {} | fix: {}", p["subject"], p["message"], p["fix"]))
        .collect()
}

fn names(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn every_shipped_profile_passes_offline_and_is_left_untouched() {
    let dir = targets_dir();
    let before = snapshot(&dir);
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let sub = entry.unwrap().path();
        for file in std::fs::read_dir(&sub).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with("target") && name.ends_with(".toml") {
                profiles.push(path);
            }
        }
    }
    profiles.sort();
    // llama-cpp, sglang-pd (systemd, compose), vllm (systemd, k8s) at least.
    assert!(profiles.len() >= 5, "{profiles:?}");
    let cwd = tempfile::tempdir().unwrap();
    for profile in &profiles {
        let (code, report, stderr) = check_offline(profile, cwd.path());
        assert_eq!(
            code,
            0,
            "{}: {:#?}\n{stderr}",
            profile.display(),
            problems(&report)
        );
        assert!(report["urls"].as_array().unwrap().is_empty());
        let flags = report["flags"].as_array().unwrap();
        assert!(!flags.is_empty(), "{}", profile.display());
        // Every applying flag's edit of every role is shown: the off arm of a flag
        // the launch config sets changes exactly one setting, line by line.
        for f in flags {
            for e in f["edits"].as_array().unwrap() {
                for arm in e["arms"].as_array().unwrap() {
                    assert_ne!(arm["change"], "refused", "{}: {arm}", profile.display());
                }
            }
        }
    }
    // The sglang-pd profiles flip all six built-in flags, each in its catalog roles.
    let (_, pd, _) = check_offline(&dir.join("sglang-pd/target.toml"), cwd.path());
    assert_eq!(
        names(&pd["flags"]),
        [
            "BF16_INDEX_K",
            "CUDA_GRAPH_MAX_BS",
            "HICACHE",
            "INDEX_K_HICACHE_SYNC",
            "MMA_FLASHMLA",
            "TOPK_V2"
        ]
    );
    let bf16 = &pd["flags"][0];
    assert_eq!(bf16["edits"].as_array().unwrap().len(), 2);
    let off = &bf16["edits"][0]["arms"][1];
    assert_eq!(off["change"], "replace");
    assert_eq!(off["before"][0], "export SGLANG_DSV4_BF16_INDEX_K=1");
    assert_eq!(off["after"][0], "export SGLANG_DSV4_BF16_INDEX_K=0");
    // Each flag lists its mechanism and witness for this engine, and what reads it.
    let mechanism: Vec<&str> = bf16["mechanism"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(mechanism[0], "mechanism: index-K load-back (runs in both)");
    assert!(
        mechanism[1].starts_with(
            "  witness counter sglang:load_back_tokens_total{pool=\"kv\"} of prefill (at least 1): prefill: read from"
        ) && mechanism[1].contains("(offline: not tried)"),
        "{mechanism:?}"
    );
    // The 12253 profile's DEFRAG: a log bisect captures, at the level its line needs.
    let (_, llama, _) = check_offline(&dir.join("llama-cpp-12253/target.toml"), cwd.path());
    let defrag = llama["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "DEFRAG")
        .unwrap();
    let witness = defrag["mechanism"][1].as_str().unwrap();
    assert!(
        witness.contains("log /requesting defrag/")
            && witness.contains("needs --log-verbosity 1")
            && witness
                .contains("server: readable (bisect captures the output of the role it spawns)"),
        "{witness}"
    );
    assert_eq!(snapshot(&dir), before, "a file under targets/ changed");
}

/// A profile for two embedded engine roles on `ports`, their launch scripts written
/// beside it (the generated scripts bisect itself uses), `extra` appended to the
/// top-level keys.
pub(crate) fn embedded_profile(dir: &Path, prefill: u16, decode: u16, extra: &str) -> PathBuf {
    let exe = env!("CARGO_BIN_EXE_bisect");
    std::fs::write(
        dir.join("prefill.sh"),
        bisect_harness::config::embedded::prefill_script(exe, prefill),
    )
    .unwrap();
    std::fs::write(
        dir.join("decode.sh"),
        bisect_harness::config::embedded::decode_script(exe, decode, prefill),
    )
    .unwrap();
    let profile = dir.join("target.toml");
    let role = |name: &str, port: u16| {
        format!(
            "[[role]]\nname = \"{name}\"\nlaunch = \"{name}.sh\"\nhealth = \"http://127.0.0.1:{port}/health\"\nmetrics = \"http://127.0.0.1:{port}/metrics\"\n\n"
        )
    };
    std::fs::write(
        &profile,
        format!(
            "name = \"embedded-check\"\napi = \"http://127.0.0.1:{decode}/v1\"\nmodel = \"m\"\nengine = \"embedded\"\n{extra}\n{}{}",
            role("prefill", prefill),
            role("decode", decode)
        ),
    )
    .unwrap();
    profile
}

/// [`embedded_profile`] on ports nothing uses, with a flag catalog of its own: each
/// `(NAME, env, roles)` an env flag `NAME.toml` (on 1, off 0) in `flags/`.
fn profile_with_flags(dir: &Path, flags: &[(&str, &str, &[&str])]) -> PathBuf {
    let profile = embedded_profile(dir, 1, 2, "flags_dir = \"flags\"");
    let flags_dir = dir.join("flags");
    std::fs::create_dir(&flags_dir).unwrap();
    for (name, env, roles) in flags {
        let roles: Vec<String> = roles.iter().map(|r| format!("{r:?}")).collect();
        std::fs::write(
            flags_dir.join(format!("{name}.toml")),
            format!(
                "doc = \"x\"\nenv = \"{env}\"\nroles = [{}]\non = \"1\"\noff = \"0\"\n",
                roles.join(", ")
            ),
        )
        .unwrap();
    }
    profile
}

pub(crate) fn free_port() -> u16 {
    bisect_harness::config::embedded::free_port().unwrap()
}

/// An engine role started the way bisect spawns one (`sh LAUNCH` in its directory),
/// killed when dropped.
struct Role(std::process::Child);

impl Role {
    fn start(script: &Path) -> Role {
        Role(
            Command::new("sh")
                .arg(script)
                .current_dir(script.parent().unwrap())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_healthy(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    loop {
        // A plain HTTP/1.0 request: the test needs no client library for one GET.
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            let mut head = [0u8; 12];
            if s.read_exact(&mut head).is_ok() && &head[9..12] == b"200" {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "port {port} never became healthy"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn url_checks_pass_against_live_engines_and_catch_one_not_running_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let (prefill, decode) = (free_port(), free_port());
    // The key is sent as a bearer token; the embedded engine takes any.
    let profile = embedded_profile(
        dir.path(),
        prefill,
        decode,
        "api_key_env = \"BISECT_CHECK_TEST_KEY\"",
    );
    let _p = Role::start(&dir.path().join("prefill.sh"));
    wait_healthy(prefill);
    let _d = Role::start(&dir.path().join("decode.sh"));
    wait_healthy(decode);
    // Per-target state is looked up (for a journal a run left), never in the user's.
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_bisect"))
            .args(["check", "--json", "--target", profile.to_str().unwrap()])
            .env("BISECT_CHECK_TEST_KEY", "sk-check-test")
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .current_dir(dir.path())
            .output()
            .unwrap()
    };

    let out = check();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{:#?}\n{}",
        problems(&report),
        String::from_utf8_lossy(&out.stderr)
    );
    let urls = report["urls"].as_array().unwrap();
    // health, metrics and effective config for each of the two roles, the tool-call
    // probe through the API, and what the solo oracle could judge with.
    assert_eq!(urls.len(), 8, "{urls:#?}");
    assert!(urls.iter().all(|u| u["ok"] == true), "{urls:#?}");
    let logprobs = urls.iter().find(|u| u["kind"] == "logprobs").unwrap();
    let said = logprobs["detail"].as_str().unwrap();
    assert!(said.starts_with("log-probabilities served ("), "{said}");
    assert!(said.ends_with("the engine is batch-invariant by construction: any parting from a session alone is a bug"), "{said}");
    let probe = urls.iter().find(|u| u["kind"] == "tool_calls").unwrap();
    crate::common::assert_tool_calls_parsed(probe);
    // Each role's identity, and where it came from, is said.
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("role decode: which process it is comes from the engine's self-report"),
        "{notes}"
    );
    let metrics = urls.iter().find(|u| u["kind"] == "metrics").unwrap();
    assert!(
        metrics["detail"]
            .as_str()
            .unwrap()
            .contains("sglang:num_running_reqs"),
        "{metrics}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("sk-check-test"));

    // The decode script now says fp8 index-K, but the running engine was started with
    // bf16: a run would measure an engine that is not running its launch config.
    let script = dir.path().join("decode.sh");
    let text = std::fs::read_to_string(&script).unwrap();
    std::fs::write(
        &script,
        text.replace("SGLANG_DSV4_BF16_INDEX_K=1", "SGLANG_DSV4_BF16_INDEX_K=0"),
    )
    .unwrap();
    let out = check();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let found = problems(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("role decode flag BF16_INDEX_K")
            && found[0].contains("not running from its launch config")
            && found[0].contains("restart the role"),
        "{found:#?}"
    );
}

#[test]
fn a_dead_port_fails_each_url_with_a_fix_and_offline_skips_them() {
    let dir = tempfile::tempdir().unwrap();
    // Bound and dropped: nothing listens there.
    let (prefill, decode) = (free_port(), free_port());
    let profile = embedded_profile(dir.path(), prefill, decode, "");
    let (code, text) = check_text(&profile, dir.path());
    assert_eq!(code, Some(1));
    assert!(
        text.contains(&format!(
            "http://127.0.0.1:{prefill}/health: connection refused"
        )),
        "{text}"
    );
    // The fix names how to start the role and where the URL is in the profile.
    let profile_at = format!("{}:9", profile.display());
    assert!(text.contains("fix: start it (`sh "), "{text}");
    assert!(text.contains(&profile_at), "{profile_at} in {text}");
    // Three URLs per role, and the tool-call probe through the API.
    assert!(text.contains("check: 7 problem(s)"), "{text}");
    assert!(
        text.contains("no reply could be judged (errors or timeouts)"),
        "{text}"
    );

    let (code, report, _) = check_offline(&profile, dir.path());
    assert_eq!(code, 0, "{:#?}", problems(&report));
    assert!(report["urls"].as_array().unwrap().is_empty());
}

#[test]
fn a_flag_that_matches_no_launch_line_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    // One letter short of the real variable: a run would add it, the engine ignore it.
    let typo = (
        "BF16_TYPO",
        "SGLANG_DSV4_BF16_INDEXK",
        &["prefill", "decode"][..],
    );
    let profile = profile_with_flags(dir.path(), &[typo]);
    let before = snapshot(dir.path());
    let (code, report, _) = check_offline(&profile, dir.path());
    assert_eq!(code, 1);
    let found = problems(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("flag BF16_TYPO")
            && found[0].contains("SGLANG_DSV4_BF16_INDEXK matches no line")
            && found[0].contains("check the spelling"),
        "{found:#?}"
    );
    // The dry run shows where it would go, and nothing was written.
    let typo = report["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "BF16_TYPO")
        .unwrap();
    assert_eq!(typo["edits"][0]["arms"][0]["change"], "insert");
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn a_profile_with_a_syntax_error_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let profile = embedded_profile(dir.path(), 1, 2, "");
    let text = std::fs::read_to_string(&profile).unwrap();
    std::fs::write(&profile, text.replace("model = \"m\"", "model = \"m")).unwrap();
    let out = bisect(
        &["check", "--target", profile.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:3:", profile.display())) && err.contains("fix:"),
        "{err}"
    );
}

#[test]
fn flags_and_check_agree_on_what_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    // Lists a role the target lacks: partial, a problem for check, not applying for flags.
    let too = (
        "ROUTER_TOO",
        "SGLANG_OPT_USE_TOPK_V2",
        &["prefill", "decode", "router"][..],
    );
    let only = ("ROUTER_ONLY", "ROUTER_X", &["router"][..]);
    let profile = profile_with_flags(dir.path(), &[too, only]);
    let (code, report, _) = check_offline(&profile, dir.path());
    assert_eq!(code, 1);
    assert_eq!(names(&report["not_applying"]), ["ROUTER_ONLY"]);
    let partial = report["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "ROUTER_TOO")
        .unwrap();
    assert_eq!(partial["coverage"], "partial");
    assert_eq!(partial["missing_roles"][0], "router");
    assert!(problems(&report)
        .iter()
        .any(|p| p.contains("flag ROUTER_TOO") && p.contains("applies partially")));

    let out = bisect(
        &["flags", "--target", profile.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("not applying"))
        .unwrap();
    assert!(line.contains("ROUTER_ONLY (roles router)"), "{line}");
    assert!(
        line.contains(
            "ROUTER_TOO (roles prefill,decode,router; partial: the target has no router)"
        ),
        "{line}"
    );
    // Every flag check shows as applying is listed by `flags`, and no other.
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.is_empty() && !l.starts_with("not applying"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut shown: Vec<String> = shown.into_iter().map(String::from).collect();
    shown.sort();
    let mut full: Vec<String> = report["flags"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["coverage"] == "full")
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    full.sort();
    assert_eq!(shown, full);
}

/// A vLLM stand-in: `/health`, and `/metrics` with the preset's gauges and the
/// `vllm:cache_config_info` info metric reporting `cache_dtype`.
fn fake_vllm(cache_dtype: &'static str) -> (u16, tokio::runtime::Runtime) {
    use axum::routing::get;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let metrics = format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"qwen3-8b\"}} 0.0\n\
         vllm:num_requests_waiting{{model_name=\"qwen3-8b\"}} 0.0\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"{cache_dtype}\",enable_prefix_caching=\"True\"}} 1.0\n\
         process_start_time_seconds 1.7e9\n"
    );
    let app = axum::Router::new()
        .route("/health", get(|| async { "" }))
        .route("/metrics", get(move || async move { metrics }))
        .route("/v1/chat/completions", axum::routing::post(parsed_call));
    runtime.spawn(async move { axum::serve(listener, app).await });
    (port, runtime)
}

/// A chat reply with the call parsed, as an engine with a tool-call parser returns it
/// (the shape of llama-server's, tests/fixtures/engines/llamacpp/toolcall.json).
async fn parsed_call() -> axum::Json<Value> {
    axum::Json(serde_json::json!({
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\": \"/srv/app/config.yaml\"}"}}]}}],
        "usage": {"completion_tokens": 20}
    }))
}

/// The engines' own fixture file (tests/fixtures/engines/).
fn engine_fixture(path: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/engines")
            .join(path),
    )
    .unwrap()
}

/// An SGLang stand-in serving SGLang's own words: `/server_info` (with or without a
/// tool-call parser), `/metrics` with the scheduler gauges of every TP rank, and a chat
/// endpoint that returns the DSML call as text (no parser, as SGLang does then) or as
/// parsed `tool_calls`.
fn fake_sglang(parser: bool) -> (u16, tokio::runtime::Runtime) {
    use axum::routing::{get, post};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let info = engine_fixture(if parser {
        "sglang/server_info.json"
    } else {
        "sglang/server_info-no-parser.json"
    });
    let metrics = engine_fixture("sglang/metrics-pd-decode.txt");
    let chat = move || async move {
        if parser {
            parsed_call().await
        } else {
            axum::Json(serde_json::json!({
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant",
                    "content": "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/srv/app/config.yaml</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}}],
                "usage": {"completion_tokens": 40}
            }))
        }
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "" }))
        .route("/metrics", get(move || async move { metrics }))
        .route(
            "/server_info",
            get(move || async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    info,
                )
            }),
        )
        .route("/v1/chat/completions", post(chat));
    runtime.spawn(async move { axum::serve(listener, app).await });
    (port, runtime)
}

/// `targets/sglang-pd/` as shipped, every port (router, prefill, decode) moved to `port`.
fn sglang_profile(dir: &Path, port: u16) -> PathBuf {
    let profile_dir = dir.join("sglang-pd");
    std::fs::create_dir_all(&profile_dir).unwrap();
    for rel in [
        "target.toml",
        "serve_dsv4_prefill.sh",
        "serve_dsv4_decode.sh",
    ] {
        let text = std::fs::read_to_string(targets_dir().join("sglang-pd").join(rel)).unwrap();
        let text = ["127.0.0.1:8000", "127.0.0.1:30000", "127.0.0.1:30002"]
            .iter()
            .fold(text, |t, from| {
                t.replace(from, &format!("127.0.0.1:{port}"))
            });
        std::fs::write(profile_dir.join(rel), text).unwrap();
    }
    profile_dir.join("target.toml")
}

/// The shipped SGLang profile once could never implicate anything: SGLang parses tool
/// calls only with `--tool-call-parser`, and `check` passed an engine without one. Now
/// the engine's own `tool_call_parser` is read and a session's first round must come
/// back as parsed calls.
#[test]
fn check_fails_an_sglang_without_a_tool_call_parser_and_passes_one_with_it() {
    for parser in [false, true] {
        let (port, _server) = fake_sglang(parser);
        let dir = tempfile::tempdir().unwrap();
        let profile = sglang_profile(dir.path(), port);
        let (code, report, stderr) =
            check_json(&["--target", profile.to_str().unwrap()], dir.path());
        let found = problems(&report);
        let urls = report["urls"].as_array().unwrap();
        let row = |role: &str, kind: &str| {
            urls.iter()
                .find(|u| u["role"] == role && u["kind"] == kind)
                .unwrap_or_else(|| panic!("no {role} {kind} row: {urls:#?}"))
                .clone()
        };
        if parser {
            assert_eq!(code, 0, "{found:#?}\n{stderr}");
            assert_eq!(
                row("decode", "tools")["detail"],
                "tool_call_parser = deepseekv4"
            );
            assert_eq!(row("api", "tool_calls")["ok"], true);
            // The effective configuration is read at /server_info, and each of the four
            // TP ranks' copies of the running gauge is counted once.
            assert!(row("decode", "effective")["url"]
                .as_str()
                .unwrap()
                .ends_with("/server_info"));
            assert!(
                row("decode", "metrics")["detail"]
                    .as_str()
                    .unwrap()
                    .contains("sglang:num_running_reqs = 12"),
                "{urls:#?}"
            );
        } else {
            assert_eq!(code, 1, "{found:#?}\n{stderr}");
            let parser_problem: Vec<&String> = found
                .iter()
                .filter(|p| p.contains("tool_call_parser = null"))
                .collect();
            assert_eq!(parser_problem.len(), 2, "both roles: {found:#?}");
            assert!(
                parser_problem[0].contains("--tool-call-parser"),
                "{found:#?}"
            );
            let probe: Vec<&String> = found.iter().filter(|p| p.contains("tool calls")).collect();
            assert!(
                probe.iter().any(|p| p.contains("came back as text")
                    && p.contains("leak[dsml]")
                    && p.contains("start every SGLang role with --tool-call-parser")),
                "{found:#?}"
            );
        }
    }
}

#[test]
fn vllm_reports_its_kv_cache_dtype_through_its_info_metrics() {
    for (served, agrees) in [("fp8", false), ("auto", true)] {
        let (port, _server) = fake_vllm(served);
        let dir = tempfile::tempdir().unwrap();
        let profile_dir = dir.path().join("vllm");
        std::fs::create_dir_all(profile_dir.join("flags")).unwrap();
        for rel in ["target.toml", "serve.sh"] {
            let text = std::fs::read_to_string(targets_dir().join("vllm").join(rel)).unwrap();
            std::fs::write(
                profile_dir.join(rel),
                text.replace("127.0.0.1:8000", &format!("127.0.0.1:{port}")),
            )
            .unwrap();
        }
        for entry in std::fs::read_dir(targets_dir().join("vllm/flags")).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(
                &path,
                profile_dir.join("flags").join(path.file_name().unwrap()),
            )
            .unwrap();
        }
        let (code, report, stderr) = check_json(
            &[
                "--target",
                profile_dir.join("target.toml").to_str().unwrap(),
            ],
            dir.path(),
        );
        let found = problems(&report);
        let kv: Vec<&String> = found
            .iter()
            .filter(|p| p.contains("flag KV_CACHE_DTYPE"))
            .collect();
        if agrees {
            assert!(kv.is_empty(), "{found:#?}\n{stderr}");
            assert_eq!(code, 0, "{found:#?}\n{stderr}");
        } else {
            // serve.sh says auto; the engine says it runs fp8: not running that file.
            assert_eq!(code, 1, "{found:#?}\n{stderr}");
            assert_eq!(kv.len(), 1, "{found:#?}");
            assert!(
                kv[0].contains("reports kv_cache_dtype=fp8") && kv[0].contains("sets auto"),
                "{}",
                kv[0]
            );
        }
    }
}

/// vLLM reports its batch-invariant mode nowhere but its environment: bisect reads it
/// from the process listening on each role's port. Two real processes here (the
/// embedded engine's roles, read as vLLM's would be): one started with
/// `VLLM_BATCH_INVARIANT=1`, one without; the pair is not batch-invariant.
#[test]
fn a_vllm_roles_deterministic_mode_is_read_from_its_processs_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (prefill, decode) = (free_port(), free_port());
    let profile = embedded_profile(dir.path(), prefill, decode, "");
    let script = dir.path().join("prefill.sh");
    let text = std::fs::read_to_string(&script).unwrap();
    std::fs::write(&script, format!("export VLLM_BATCH_INVARIANT=1\n{text}")).unwrap();
    let _p = Role::start(&script);
    wait_healthy(prefill);
    let _d = Role::start(&dir.path().join("decode.sh"));
    wait_healthy(decode);
    let mut target = bisect_harness::config::TargetProfile::load(&profile).unwrap();
    target.engine = bisect_harness::config::Engine::Vllm;
    let read = bisect_harness::control::determinism::read(&target, &BTreeMap::new());
    use bisect_harness::core::determinism::{Reading, Verdict};
    assert!(
        matches!(read.roles["prefill"], Reading::Environment { on: true, .. }),
        "{read:?}"
    );
    assert!(
        matches!(read.roles["decode"], Reading::Environment { on: false, .. }),
        "{read:?}"
    );
    assert_eq!(read.verdict(), Verdict::NotInvariant);
    // Read as SGLang's would be: the embedded engine's server info has no such key.
    target.engine = bisect_harness::config::Engine::Sglang;
    let read = bisect_harness::control::determinism::read(&target, &BTreeMap::new());
    assert_eq!(read.verdict(), Verdict::Unknown, "{read:?}");
}

/// A profile with replica sets is checked set by set: the shipped two-set llama.cpp
/// profile passes offline on both, each set's own launch config checked (`--json`: an
/// object of reports by set; the table: one per set, headed by its name).
#[test]
fn every_replica_set_is_checked_as_a_target_of_its_own() {
    let cwd = tempfile::tempdir().unwrap();
    let profile = targets_dir().join("llama-cpp-12253/replicas/target.toml");
    let (code, report, stderr) = check_offline(&profile, cwd.path());
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    let sets: Vec<&String> = report.as_object().unwrap().keys().collect();
    assert_eq!(sets, ["a", "b"]);
    for set in ["a", "b"] {
        assert!(
            problems(&report[set]).is_empty(),
            "{set}: {:#}",
            report[set]
        );
        let edits = report[set]["flags"][0]["edits"].to_string();
        assert!(edits.contains(&format!("serve-{set}.sh")), "{set}: {edits}");
    }
    let out = crate::common::bisect(
        &["check", "--offline", "--target", profile.to_str().unwrap()],
        cwd.path(),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("replica set a:") && text.contains("replica set b:"),
        "{text}"
    );
}
