//! The harness against a real engine judging a real model's tool calls: llama.cpp's
//! `llama-server` through the shipped profile `targets/llama-cpp/` (engine preset
//! `llamacpp`, Qwen2.5-Coder-1.5B-Instruct with the profile's tool-call template), flag
//! `CACHE_RAM` 8192 vs 0, the `tiny` workload at a small N. It needs the server binary
//! and the model, which `scripts/llama-server.sh` installs, passed as
//! `BISECT_LLAMA_SERVER` and `BISECT_LLAMA_MODEL`; without them the test says it is
//! skipped and passes (a developer machine without the build), unless
//! `BISECT_REQUIRE_LLAMA` is set, as `.ci/run` does after installing both. A few minutes
//! on two busy cores (docs/real-engines.md has the timings). The verdict is not asserted
//! (4 sessions per arm decide nothing); what is: llama-server says its template carries
//! tool calls, the model's calls come back parsed (`tool_calls`, finish reason
//! `tool_calls`) and sessions are judged in both arms, and every check an arm rests on
//! ran: read-backs, engine-side load from `llamacpp:` gauges, finish reasons, the
//! effective configuration from `/props`, a verdict with reasons, and the profile's files
//! restored byte for byte.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn copy_dir(from: &Path, to: &Path, port: u16) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &dest, port);
        } else {
            // A free port instead of the profile's 8093, so parallel tests and a server
            // the developer runs do not collide.
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(&dest, text.replace("8093", &port.to_string())).unwrap();
        }
    }
}

/// The llama-server binary and model `scripts/llama-server.sh` installed, or `None` (the
/// test says it is skipped) on a machine without them; CI sets `BISECT_REQUIRE_LLAMA` so a
/// broken install step fails the suite instead of skipping it.
fn llama_paths(test: &str) -> Option<(std::ffi::OsString, std::ffi::OsString)> {
    match (
        std::env::var_os("BISECT_LLAMA_SERVER"),
        std::env::var_os("BISECT_LLAMA_MODEL"),
    ) {
        (Some(server), Some(model)) => Some((server, model)),
        _ => {
            assert!(
                std::env::var_os("BISECT_REQUIRE_LLAMA").is_none(),
                "BISECT_REQUIRE_LLAMA is set but BISECT_LLAMA_SERVER / BISECT_LLAMA_MODEL are not: \
                 run scripts/llama-server.sh and export the paths it prints"
            );
            eprintln!(
                "SKIPPED: {test}: BISECT_LLAMA_SERVER / BISECT_LLAMA_MODEL are not set \
                 (scripts/llama-server.sh prints the paths)"
            );
            None
        }
    }
}

#[test]
fn cache_ram_on_llama_server_judges_real_tool_calls() {
    let _one = crate::common::heavy();
    let Some((server, model)) = llama_paths("llama_cpp run test") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let profile_dir = dir.path().join("llama-cpp");
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/llama-cpp");
    copy_dir(&shipped, &profile_dir, crate::common::free_port());
    let serve_before = std::fs::read(profile_dir.join("serve.sh")).unwrap();
    let results = dir.path().join("results");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args([
            "run",
            "--target",
            profile_dir.join("target.toml").to_str().unwrap(),
            "--flag",
            "CACHE_RAM",
            "--workload",
            "tiny",
            "--sessions",
            "4",
            "--concurrency",
            "2",
            // Generous: a shared 2-core CI machine prefills slowly, and a reply waits
            // for the other one in flight.
            "--timeout",
            "300",
            "--results",
            results.to_str().unwrap(),
            "--json",
        ])
        .env("LLAMA_SERVER", &server)
        .env("LLAMA_MODEL", &model)
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .current_dir(dir.path())
        .output()
        .expect("running bisect");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let run: Value = serde_json::from_slice(&out.stdout).expect("run.json on stdout");

    assert_eq!(run["status"], "finished", "{run}");
    assert_eq!(run["target"]["engine"], "llamacpp");
    let role = &run["target"]["roles"][0];
    assert!(role["metrics"].as_str().unwrap().ends_with("/metrics"));
    assert_eq!(role["running_metric"], "llamacpp:requests_processing");
    assert!(role["effective_url"].as_str().unwrap().ends_with("/props"));

    // Both arms, every session classified, nothing silently unmeasured.
    let arms = run["arms"].as_array().unwrap();
    assert_eq!(arms.len(), 2);
    for arm in arms {
        assert_eq!(arm["sessions"], 4, "{arm}");
        let peak = arm["peak_running"]["server"].as_u64();
        assert!(
            peak.is_some_and(|p| p >= 1),
            "engine-side load from llamacpp:requests_processing: {arm}"
        );
        assert!(arm.get("metrics_failed").is_none(), "{arm}");
    }
    // Read-backs and the engine's own word on what it ran with, per block.
    for block in run["runs"].as_array().unwrap() {
        assert_eq!(block["readback"]["server"], block["value"], "{block}");
    }
    let info = run["engine_info"].as_object().unwrap();
    assert!(
        info.contains_key("on-r0/server") && info.contains_key("off-r0/server"),
        "/props fetched for both arms: {:?}",
        info.keys().collect::<Vec<_>>()
    );
    // The template is what makes llama-server offer the tools and parse the calls.
    for (block, props) in info {
        assert_eq!(
            props["chat_template_caps"]["supports_tool_calls"], true,
            "{block}: /props says the chat template carries no tool calls"
        );
    }
    let confounds = run["confounds"].as_array().unwrap();
    assert!(
        !confounds.iter().any(|c| c["severity"] == "blocking"
            && c["name"].as_str().unwrap().starts_with("effective.")),
        "{confounds:?}"
    );
    // A verdict, with its reasons in words.
    let verdict = &run["verdict"];
    assert!(
        ["implicated", "cleared", "inconclusive"].contains(&verdict["status"].as_str().unwrap())
    );
    assert!(
        !verdict["summary"].as_str().unwrap().is_empty(),
        "{verdict}"
    );
    if verdict["status"] != "implicated" {
        assert!(
            !verdict["reasons"].as_array().unwrap().is_empty(),
            "{verdict}"
        );
    }

    // Sessions were judged in both arms: a model that makes no call, or replies that
    // all time out or run to max_tokens, judge nothing (Gemma 3 270M: 0 of 16 per arm).
    for arm in arms {
        let c = &arm["counts"];
        let unjudged: u64 = ["error", "timeout", "truncated"]
            .iter()
            .map(|k| c[*k].as_u64().unwrap_or(0))
            .sum();
        assert!(unjudged < 4, "no session judged: {arm}");
    }

    // Every round that got a reply says how it finished, and the model's calls came back
    // parsed by llama-server, not as text.
    let run_dir = results.join(run["id"].as_str().unwrap());
    let sessions = std::fs::read_to_string(run_dir.join("sessions.jsonl")).unwrap();
    let (mut replied, mut parsed_calls, mut finished_for_calls) = (0, 0, 0);
    for line in sessions.lines() {
        let session: Value = serde_json::from_str(line).unwrap();
        for round in session["rounds"].as_array().unwrap() {
            if round["class"] != "error" && round["class"] != "timeout" {
                replied += 1;
                assert!(round["finish_reason"].is_string(), "{round}");
                if round["finish_reason"] == "tool_calls" {
                    finished_for_calls += 1;
                }
            }
        }
        parsed_calls += session["transcript"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .filter_map(|m| m["tool_calls"].as_array())
            .filter(|calls| calls.iter().any(|c| c["function"]["name"].is_string()))
            .count();
    }
    assert!(replied >= 1, "{replied} rounds with a reply");
    assert!(
        parsed_calls >= 1 && finished_for_calls >= 1,
        "no tool call came back parsed ({parsed_calls} replies with tool_calls, {finished_for_calls} with finish_reason tool_calls): {sessions}"
    );
    // The engine-side gauge is in metrics.csv, not "no sample".
    let metrics = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    assert!(
        metrics.lines().any(|l| {
            let cols: Vec<&str> = l.split(',').collect();
            cols.get(1) == Some(&"server") && cols.get(2).is_some_and(|r| !r.is_empty())
        }),
        "{metrics}"
    );
    // The launch config is back, byte for byte.
    assert_eq!(
        std::fs::read(profile_dir.join("serve.sh")).unwrap(),
        serve_before
    );
}

/// A llama-server started from `dir/serve.sh`, stopped on drop.
struct Server(std::process::Child);

impl Server {
    fn start(dir: &Path, port: u16, server: &std::ffi::OsStr, model: &std::ffi::OsStr) -> Server {
        let server = Server(
            std::process::Command::new("sh")
                .arg("serve.sh")
                .current_dir(dir)
                .env("LLAMA_SERVER", server)
                .env("LLAMA_MODEL", model)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let health = format!("127.0.0.1:{port}");
        let started = std::time::Instant::now();
        loop {
            use std::io::{Read, Write};
            if let Ok(mut s) = std::net::TcpStream::connect(&health) {
                let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
                let mut reply = String::new();
                let _ = s.read_to_string(&mut reply);
                if reply.starts_with("HTTP/1.1 200") {
                    return server;
                }
            }
            assert!(
                started.elapsed().as_secs() < 300,
                "llama-server did not answer health in 5 minutes"
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `bisect check` on the real llama-server: the tool-call probe (a `tiny` session's
/// first round) comes back as parsed tool_calls with the shipped template; with a
/// template that carries no tool calls the check fails, naming the template and the fix.
#[test]
fn check_proves_the_real_llama_server_parses_tool_calls() {
    let _one = crate::common::heavy();
    let Some((server, model)) = llama_paths("llama_cpp check test") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let profile_dir = dir.path().join("llama-cpp");
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/llama-cpp");
    let port = crate::common::free_port();
    copy_dir(&shipped, &profile_dir, port);
    let check = || -> (i32, Value) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
            .args(["check", "--json", "--workload", "tiny", "--target"])
            .arg(profile_dir.join("target.toml"))
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .current_dir(dir.path())
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code().unwrap(), report)
    };
    let row = |report: &Value, kind: &str| -> Value {
        report["urls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} row: {report}"))
    };

    let running = Server::start(&profile_dir, port, &server, &model);
    let (code, report) = check();
    drop(running);
    assert_eq!(code, 0, "{report:#}");
    let probe = row(&report, "tool_calls");
    assert_eq!(probe["ok"], true, "{probe}");
    crate::common::assert_tool_calls_parsed(&probe);
    // Which process the server is comes from its /metrics header (or its socket).
    assert!(
        report["notes"]
            .to_string()
            .contains("role server: which process it is comes from"),
        "{report:#}"
    );

    // A template that renders no tools and no tool calls: plain ChatML.
    std::fs::write(
        profile_dir.join("qwen2.5-coder-tools.jinja"),
        "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let running = Server::start(&profile_dir, port, &server, &model);
    let (code, report) = check();
    drop(running);
    assert_eq!(code, 1, "{report:#}");
    let tools = row(&report, "tools");
    assert_eq!(tools["ok"], false, "{tools}");
    let problems = report["problems"].to_string();
    assert!(
        problems.contains("supports_tool_calls = false")
            && problems.contains("--chat-template-file"),
        "{problems}"
    );
    eprintln!(
        "tool-call probe with a template without tools: {}",
        row(&report, "tool_calls")
    );
}
