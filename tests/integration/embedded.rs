//! The harness against the embedded engine: real `bisect engine` processes started from
//! generated launch scripts, driven over HTTP, as a user runs it. The engine's race
//! depends on how requests interleave, so these tests assert verdicts and bounds with
//! wide margins (the default workload's defaults corrupt about 16% of sessions, fp8
//! none), never exact counts; exact counts are the fake engine's job.

use crate::common::{bisect, bisect_json};
use std::process::Command;

use serde_json::Value;

/// `bisect run --flag FLAG ARGS --json` in `dir`, which must exit 0: the run's record.
fn run_flag(dir: &std::path::Path, flag: &str, args: &[&str]) -> Value {
    let mut all = vec!["run", "--flag", flag];
    all.extend_from_slice(args);
    all.push("--json");
    bisect_json(&all, dir)
}

fn arm<'a>(run: &'a Value, label: &str) -> &'a Value {
    run["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["label"] == label)
        .unwrap()
}

#[test]
fn bf16_index_k_is_implicated_and_scripts_are_restored() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_flag(dir.path(), "BF16_INDEX_K", &["--repeats", "2"]);
    let (on, off) = (arm(&run, "on"), arm(&run, "off"));
    assert_eq!(on["sessions"], 160);
    let (on_bad, off_bad) = (
        on["corrupted"].as_u64().unwrap(),
        off["corrupted"].as_u64().unwrap(),
    );
    assert!(on_bad >= 8, "bf16 corrupts under load: {on_bad}/160");
    assert!(off_bad <= 3, "fp8 stays clean: {off_bad}/160");
    assert_eq!(
        on["counts"]["error"].as_u64().unwrap() + on["counts"]["timeout"].as_u64().unwrap(),
        0
    );
    assert_eq!(run["verdict"]["status"], "implicated", "{}", run["verdict"]);
    assert!(run["verdict"]["direction"]
        .as_str()
        .unwrap()
        .starts_with("on"));
    // Both roles read back the flag in every block.
    for block in run["runs"].as_array().unwrap() {
        assert_eq!(block["readback"]["prefill"], block["value"]);
        assert_eq!(block["readback"]["decode"], block["value"]);
    }
    // The engines reported their effective flags.
    let info = run["engine_info"].as_object().unwrap();
    assert!(info.keys().any(|k| k.starts_with("off-r0/")), "{info:?}");
    // The generated launch scripts are back to their originals.
    let run_dir = dir.path().join("results").join(run["id"].as_str().unwrap());
    let prefill = std::fs::read_to_string(run_dir.join("launch/prefill.sh")).unwrap();
    assert!(
        prefill.contains("export SGLANG_DSV4_BF16_INDEX_K=1\n"),
        "{prefill}"
    );
    let applied_off =
        std::fs::read_to_string(run_dir.join("launch/off-r0/prefill--prefill.sh")).unwrap();
    assert!(
        applied_off.contains("export SGLANG_DSV4_BF16_INDEX_K=0\n"),
        "{applied_off}"
    );
    assert!(run_dir.join("report.html").exists() && run_dir.join("summary.md").exists());
    // The record shows the mechanism ran: the bf16 arm loaded index-K pages back.
    let loadbacks = &on["mechanisms"][0]["witnesses"][0];
    assert_eq!(
        loadbacks["witness"],
        "counter bisect_engine_hicache_loadbacks_total of prefill"
    );
    assert!(
        loadbacks["count"].as_u64().unwrap() > 0,
        "{}",
        on["mechanisms"]
    );
    let summary = std::fs::read_to_string(run_dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("Mechanism (what the flag's witnesses counted)"),
        "{summary}"
    );
}

/// docs/design.md 3.4 "Pressure": bisect reads prefill's pool and sizes the filler so
/// the sessions in flight oversubscribe it; HiCache's load-back then runs and the flag
/// is implicated, where 4 sessions in flight (below) never reach it.
#[test]
fn pressure_sizes_the_context_from_the_pool_and_reaches_the_load_back() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_flag(
        dir.path(),
        "HICACHE",
        &["--pressure", "1.5", "--sessions", "40", "--rounds", "2"],
    );
    let sizing = &run["pressure"];
    assert_eq!(sizing["capacity"]["kv_tokens"], 920 * 64, "{sizing}");
    assert_eq!(sizing["in_flight"], 40);
    assert_eq!(run["workload"]["ctx"], sizing["ctx"]);
    // Sized in the engine's own tokens: it counted session 0's opening request at ctx 0
    // and with filler, and 40 sessions at their last round fill 150% of the pool by
    // that count.
    let counted = &sizing["count"]["counted"];
    assert!(
        counted["at_ctx"].as_u64() > counted["at_zero"].as_u64(),
        "{sizing}"
    );
    let per_session = sizing["base_tokens"].as_f64().unwrap()
        + sizing["per_ctx"].as_f64().unwrap() * sizing["ctx"].as_f64().unwrap();
    let share = 40.0 * per_session / (920.0 * 64.0);
    assert!((share - 1.5).abs() < 0.01, "{share}: {sizing}");
    assert!(sizing["ctx"].as_u64().unwrap() > 500, "{sizing}");
    let loadbacks = arm(&run, "on")["mechanisms"][0]["witnesses"][0]["count"]
        .as_u64()
        .unwrap();
    assert!(loadbacks > 0, "{}", run["arms"]);
    assert_eq!(run["verdict"]["status"], "implicated", "{}", run["verdict"]);
    // The sequential design sizes its blocks' filler the same way, once, before its
    // first block.
    let adaptive_dir = tempfile::tempdir().unwrap();
    let adaptive = run_flag(
        adaptive_dir.path(),
        "HICACHE",
        &[
            "--adaptive",
            "--pressure",
            "1.5",
            "--concurrency",
            "40",
            "--rounds",
            "2",
        ],
    );
    assert_eq!(
        adaptive["pressure"]["ctx"], sizing["ctx"],
        "{}",
        adaptive["pressure"]
    );
    assert_eq!(adaptive["workload"]["ctx"], sizing["ctx"]);
    assert!(adaptive["adaptive"].is_object());
    assert_eq!(
        adaptive["verdict"]["status"], "implicated",
        "{}",
        adaptive["verdict"]
    );
    // --pressure chooses the context: it cannot be given with --ctx.
    let out = bisect(
        &[
            "run",
            "--flag",
            "HICACHE",
            "--pressure",
            "0.5",
            "--ctx",
            "100",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be given with --ctx"));
}

/// docs/design.md 3.7, "No verdict clears a mechanism that never ran": HiCache at 4
/// sessions in flight, which prefill's pool holds whole, loads nothing back, so 400
/// clean sessions per arm (a difference interval well inside +-5 points, cleared before
/// witnesses) end inconclusive with the counts and the flag's fix.
#[test]
fn hicache_at_a_load_its_pool_holds_never_ran_and_is_not_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_flag(
        dir.path(),
        "HICACHE",
        &["--sessions", "400", "--rounds", "2", "--concurrency", "4"],
    );
    let verdict = &run["verdict"];
    assert_eq!(verdict["status"], "inconclusive", "{verdict}");
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(
            "inconclusive: HICACHE: the mechanism never ran: HiCache load-back (counter \
             bisect_engine_hicache_loadbacks_total of prefill): on 0, off 0"
        ) && summary.contains("to reach it: more sessions in flight"),
        "{summary}"
    );
    // Without the rule the same data would clear it.
    let reasons = verdict["reasons"].to_string();
    assert!(reasons.contains("lies inside +-5.0 points"), "{reasons}");
    assert_eq!(arm(&run, "on")["mechanisms"][0]["needed"], true);
    assert_eq!(arm(&run, "off")["mechanisms"][0]["needed"], false);
}

/// The README's main job, ten times, with its default concurrency shape (80 sessions at
/// once, 4 rounds, ctx 300; nothing reduced: one run is about 5 s): no verdict warns of a
/// peak_running difference. Before the busy-share rule (docs/design.md 3.7, "load"),
/// prefill's sampled peak (its requests last milliseconds, so a 250 ms sample catches
/// them by chance: 0 vs 23, 26 vs 9) was warned in 2 of 6 runs while client and decode
/// ran 80 in both arms. Now prefill's peak is recorded as information saying why it is
/// not compared, and client and decode are still compared (and equal).
#[test]
fn the_main_jobs_peaks_warn_of_no_load_difference_the_arms_did_not_have() {
    for attempt in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let run = run_flag(dir.path(), "BF16_INDEX_K", &[]);
        let peaks: Vec<&Value> = run["confounds"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["name"].as_str().unwrap().starts_with("peak_running."))
            .collect();
        let context = format!("run {attempt}: {peaks:#?}\n{}", run["verdict"]);
        assert!(peaks.iter().all(|c| c["severity"] == "info"), "{context}");
        assert!(
            !run["verdict"]["summary"]
                .as_str()
                .unwrap()
                .contains("peak_running"),
            "{context}"
        );
        let note = |name: &str| {
            peaks
                .iter()
                .find(|c| c["name"] == name)
                .map(|c| c["note"].as_str().unwrap().to_string())
                .unwrap_or_else(|| panic!("no {name}: {context}"))
        };
        assert!(note("peak_running.client").contains("within"), "{context}");
        assert!(note("peak_running.decode").contains("within"), "{context}");
        assert!(
            note("peak_running.prefill").contains("not compared"),
            "{context}"
        );
    }
}

#[test]
fn slow_legacy_attention_is_degraded_not_judged() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_flag(
        dir.path(),
        "MMA_FLASHMLA",
        &["--sessions", "40", "--rounds", "2", "--timeout", "2"],
    );
    assert_eq!(arm(&run, "off")["counts"]["timeout"], 40, "{}", run["arms"]);
    // The fast arm answers in well under the 2 s timeout; on a machine loaded by other
    // tests a few of its requests may still miss it, so only a margin is asserted.
    assert!(
        arm(&run, "on")["counts"]["timeout"].as_u64().unwrap() < 10,
        "{}",
        run["arms"]
    );
    assert_eq!(run["verdict"]["status"], "inconclusive");
    let reasons = run["verdict"]["reasons"].to_string();
    assert!(
        reasons.contains("degraded") && reasons.contains("arm off"),
        "{reasons}"
    );
}

#[test]
fn one_session_never_corrupts() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_flag(
        dir.path(),
        "TOPK_V2",
        &["--sessions", "1", "--repeats", "3"],
    );
    for label in ["on", "off"] {
        let a = arm(&run, label);
        assert_eq!(a["counts"]["done"], 3, "{a}");
    }
}

#[test]
fn probe_of_the_embedded_defaults_sees_the_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let out = bisect(&["probe", "--sessions", "160", "--json"], dir.path());
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", record["reason"]);
    assert_eq!(record["outcome"], "corrupted");
    assert_eq!(record["flags"]["BF16_INDEX_K"]["prefill"], "1");
}

/// A killed prefill makes decode answer 5xx and /health 503 until prefill is back.
#[test]
fn decode_reports_a_dead_prefill_until_it_returns() {
    use std::time::{Duration, Instant};
    let exe = env!("CARGO_BIN_EXE_bisect");
    let port = |l: std::net::TcpListener| l.local_addr().unwrap().port();
    let prefill_port = port(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let decode_port = port(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let spawn_prefill = || {
        Command::new(exe)
            .args([
                "engine",
                "--role",
                "prefill",
                "--port",
                &prefill_port.to_string(),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut prefill = Kill(spawn_prefill());
    let _decode = Kill(
        Command::new(exe)
            .args([
                "engine",
                "--role",
                "decode",
                "--port",
                &decode_port.to_string(),
            ])
            .arg("--prefill-url")
            .arg(format!("http://127.0.0.1:{prefill_port}"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let health = format!("http://127.0.0.1:{decode_port}/health");
    let chat = format!("http://127.0.0.1:{decode_port}/v1/chat/completions");
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Do this step:\n\n1. read_file(path=\"/srv/app/config.yaml\", max_lines=40)\n\nWhen every step is done, reply exactly: DONE: all steps completed."}],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer"}}}}}]
    });
    let status_of = |url: &str, post: bool| -> u16 {
        rt.block_on(async {
            let req = if post {
                client.post(url).json(&body)
            } else {
                client.get(url)
            };
            req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)
        })
    };
    let wait_for = |url: &str, want: u16| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while status_of(url, false) != want {
            assert!(Instant::now() < deadline, "{url} never answered {want}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for(&health, 200);
    assert_eq!(status_of(&chat, true), 200);

    prefill.0.kill().unwrap();
    prefill.0.wait().unwrap();
    let failed = status_of(&chat, true);
    assert!(
        (500..600).contains(&failed),
        "decode answered {failed} with prefill dead"
    );
    wait_for(&health, 503);

    let _prefill_again = Kill(spawn_prefill());
    wait_for(&health, 200);
    assert_eq!(status_of(&chat, true), 200);
}

/// Engines started by a test die with it, even when an assertion fails.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `--adaptive` through real engine processes, kept small (16 in flight, a cap of two
/// pairs): the blocks alternate with a restart each, the record holds the design, the
/// looks and the phases; at this load and cap nothing can be decided.
#[test]
fn adaptive_run_alternates_restarted_blocks_up_to_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args([
            "run",
            "--flag",
            "TOPK_V2",
            "--adaptive",
            "--concurrency",
            "16",
            "--sessions",
            "16",
            "--rounds",
            "2",
            "--max-sessions",
            "32",
            "--json",
        ])
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let seq = &run["adaptive"];
    assert_eq!(seq["design"]["cap_source"], "max_sessions");
    assert_eq!(seq["design"]["concurrency"], 16);
    let labels: Vec<&str> = seq["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["on", "off", "off", "on"]);
    assert_eq!(seq["looks"].as_array().unwrap().len(), 2);
    assert_eq!(run["phases"]["restarts"], 4);
    assert!(run["phases"]["health_wait_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        run["verdict"]["status"], "inconclusive",
        "{}",
        run["verdict"]
    );
    assert!(
        run["verdict"]["summary"]
            .as_str()
            .unwrap()
            .contains("underpowered: the cap of 32 sessions per arm"),
        "{}",
        run["verdict"]
    );
    for block in run["runs"].as_array().unwrap() {
        assert_eq!(block["readback"]["decode"], block["value"]);
        assert_eq!(block["effective"]["decode"], block["value"]);
    }
}

/// The default workload with its arguments checked against the schema only: a wrong
/// value that fits the schema is `done` to the classifier.
pub(crate) fn schema_only_workload(dir: &std::path::Path) -> String {
    let agentic = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/agentic.toml"),
    )
    .unwrap();
    assert!(agentic.contains("check_args = \"strict\""));
    let path = dir.join("schema-only.toml");
    std::fs::write(
        &path,
        agentic.replace("check_args = \"strict\"", "check_args = \"schema\""),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn the_solo_oracle_catches_well_formed_wrong_values_the_classifier_passes() {
    let dir = tempfile::tempdir().unwrap();
    let workload = schema_only_workload(dir.path());
    let run = run_flag(
        dir.path(),
        "BF16_INDEX_K",
        &[
            "--oracle",
            "solo",
            "--workload",
            &workload,
            "--repeats",
            "2",
        ],
    );
    let (on, off) = (arm(&run, "on"), arm(&run, "off"));
    let diverged = |a: &Value| a["counts"]["diverged"].as_u64().unwrap_or(0);
    let corrupted = |a: &Value| a["corrupted"].as_u64().unwrap();
    // Under load bf16 parts from itself alone in sessions whose markup stayed
    // well-formed: corruption only the oracle sees, counted with the rest.
    assert!(diverged(on) >= 4, "{}", on["counts"]);
    assert!(corrupted(on) > diverged(on), "{}", on["counts"]);
    // fp8's smaller page narrows the race's window without closing it: the oracle sees
    // its rare well-formed slips too (3 and 5 of 160 measured, the second on a machine
    // busy with a llama-server run), far fewer than bf16's.
    assert!(
        diverged(off) <= 16 && corrupted(on) >= 4 * corrupted(off).max(1),
        "fp8 parts from itself far less: on {}, off {}",
        on["counts"],
        off["counts"]
    );
    assert_eq!(run["verdict"]["status"], "implicated", "{}", run["verdict"]);
    // Each block says what the reference cost; the second block of an arm reused the
    // first's (same configuration, workload and seed).
    let blocks = run["runs"].as_array().unwrap();
    for label in ["on", "off"] {
        let passes: Vec<&Value> = blocks
            .iter()
            .filter(|b| b["label"] == label)
            .map(|b| &b["oracle"])
            .collect();
        assert_eq!(passes.len(), 2);
        assert_eq!(passes[0]["sessions"], 80, "{}", passes[0]);
        assert_eq!(passes[0]["reused"], 0);
        assert_eq!(
            (&passes[1]["sessions"], &passes[1]["reused"]),
            (&0.into(), &1.into())
        );
        // The embedded engine is batch-invariant: no near-tie excuses a parting.
        assert!(passes[0]["threshold"].is_null(), "{}", passes[0]);
        assert_eq!(passes[0]["drifted"], 0);
    }
    let run_dir = dir.path().join("results").join(run["id"].as_str().unwrap());
    let sessions = std::fs::read_to_string(run_dir.join("sessions.jsonl")).unwrap();
    let evidence: Vec<Value> = sessions
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|s| s["class"] == "diverged")
        .collect();
    assert!(!evidence.is_empty());
    for s in &evidence {
        assert_eq!(s["oracle"]["outcome"], "diverged", "{s}");
        assert_eq!(s["oracle"]["mode"], "logprobs", "{s}");
        assert!(s["evidence"].as_str().unwrap().contains("alone"), "{s}");
    }
    let reference = run_dir.join("reference/on/sessions.jsonl");
    assert_eq!(
        std::fs::read_to_string(reference).unwrap().lines().count(),
        80
    );
    // The second block of an arm was checked (one session alone again) before reuse;
    // each arm's launch config is its own cache entry.
    let arm_cache = |label: &str| {
        let b: Vec<&Value> = blocks.iter().filter(|b| b["label"] == label).collect();
        assert_eq!(b[1]["oracle"]["checked"], 1, "{}", b[1]["oracle"]);
        assert_eq!(b[0]["oracle"]["cache"], b[1]["oracle"]["cache"]);
        b[0]["oracle"]["cache"].as_str().unwrap().to_string()
    };
    assert_ne!(arm_cache("on"), arm_cache("off"));
    let said = &blocks[0]["oracle"]["determinism"]["roles"];
    assert_eq!(said["decode"]["source"], "by_construction", "{said}");
}

/// The reference cache across runs: a second run with the same configuration (a
/// profile on disk, as a user's; the default embedded target is generated per run with
/// fresh ports, so its entries serve that run only) reuses every arm's kept reference
/// after one session run alone again agrees; a kept reference that no longer matches the
/// engine (here: its first session replaced by another task's) is found stale by that
/// check and run again in full.
#[test]
fn a_later_run_reuses_kept_references_once_a_session_alone_agrees() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let workload = schema_only_workload(dir.path());
    let ports = (crate::check::free_port(), crate::check::free_port());
    let profile = crate::check::embedded_profile(dir.path(), ports.0, ports.1, "");
    let args = [
        "run",
        "--target",
        profile.to_str().unwrap(),
        "--flag",
        "BF16_INDEX_K",
        "--oracle",
        "solo",
        "--workload",
        &workload,
        "--sessions",
        "8",
        "--json",
    ];
    let pass = |run: &Value, label: &str| {
        let block = run["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["label"] == label)
            .unwrap();
        block["oracle"].clone()
    };
    let first = bisect_json(&args, dir.path());
    let second = bisect_json(&args, dir.path());
    assert_ne!(first["id"], second["id"]);
    for label in ["on", "off"] {
        let (was, now) = (pass(&first, label), pass(&second, label));
        assert_eq!(
            (&was["sessions"], &was["reused"]),
            (&8.into(), &0.into()),
            "{was}"
        );
        assert_eq!(
            (
                &now["sessions"],
                &now["reused"],
                &now["checked"],
                &now["stale"]
            ),
            (&0.into(), &1.into(), &1.into(), &0.into()),
            "{now}"
        );
        assert_eq!(was["cache"], now["cache"]);
    }
    // Tamper with the "on" arm's entry: session 0's record replaced by session 1's.
    let entry = dir
        .path()
        .join("results/reference-cache")
        .join(pass(&first, "on")["cache"].as_str().unwrap())
        .join("sessions.jsonl");
    let text = std::fs::read_to_string(&entry).unwrap();
    let mut lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let zero = lines.iter().position(|s| s["index"] == 0).unwrap();
    let one = lines.iter().position(|s| s["index"] == 1).unwrap();
    let mut replaced = lines[one].clone();
    replaced["index"] = 0.into();
    lines[zero] = replaced;
    let tampered: String = lines.iter().map(|s| format!("{s}\n")).collect();
    std::fs::write(&entry, tampered).unwrap();
    let third = bisect_json(&args, dir.path());
    let (on, off) = (pass(&third, "on"), pass(&third, "off"));
    assert_eq!(
        (&on["sessions"], &on["reused"], &on["checked"], &on["stale"]),
        (&8.into(), &0.into(), &1.into(), &1.into()),
        "{on}"
    );
    assert_eq!(off["reused"], 1, "{off}");
    // The entry was written again from the fresh pass: a fourth run reuses it.
    let fourth = bisect_json(&args, dir.path());
    assert_eq!(pass(&fourth, "on")["reused"], 1);
}

#[test]
fn the_oracle_refuses_a_sampled_workload() {
    let dir = tempfile::tempdir().unwrap();
    let workload = schema_only_workload(dir.path());
    let text = std::fs::read_to_string(&workload).unwrap();
    std::fs::write(
        &workload,
        text.replace("temperature = 0.0", "temperature = 0.7"),
    )
    .unwrap();
    assert!(text.contains("temperature = 0.0"));
    let out = bisect(
        &[
            "run",
            "--flag",
            "BF16_INDEX_K",
            "--oracle",
            "solo",
            "--workload",
            &workload,
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--oracle solo needs temperature 0"),
        "{stderr}"
    );
    assert!(stderr.contains("fix: set temperature = 0.0"), "{stderr}");
}

/// Issue 45, the cost model's first part: a run says what it cost (restarts, driving,
/// engine-hours) in run.json and its summary, and `--dry-run` prices the plan without
/// touching an engine or writing a result: by given units, or by what this target's
/// earlier runs measured (kept in bisect's state directory).
#[test]
fn a_run_says_what_it_cost_and_a_dry_run_what_it_will() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let bisect = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
            .args(args)
            .env("XDG_STATE_HOME", state.path())
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let dry = ["run", "--flag", "BF16_INDEX_K", "--dry-run"];
    let out = bisect(&dry);
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("planned: 2 restarts, 160 sessions in 2 blocks")
            && said.contains("the cost of a restart unknown (pass --restart-cost SECONDS)"),
        "{said}"
    );
    let out = bisect(
        &[
            &dry[..],
            &["--restart-cost", "900", "--session-cost", "600"],
        ]
        .concat(),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("about 50.0 min wall, 0.83 engine-hours"),
        "{said}"
    );
    assert!(
        !dir.path().join("results").exists(),
        "a dry run writes nothing"
    );

    let out = bisect(&["run", "--flag", "BF16_INDEX_K", "--sessions", "8", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("planned: 2 restarts, 16 sessions"), "{err}");
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cost = &record["cost"];
    assert_eq!(cost["restarts"], 2, "{cost}");
    assert_eq!(cost["replicas"], 1);
    let hours = cost["engine_hours"].as_f64().unwrap();
    assert!((hours - record["phases"]["wall_s"].as_f64().unwrap() / 3600.0).abs() < 1e-9);
    let run_dir = dir
        .path()
        .join("results")
        .join(record["id"].as_str().unwrap());
    let summary = std::fs::read_to_string(run_dir.join("summary.md")).unwrap();
    assert!(summary.contains("cost: 2 restarts ("), "{summary}");

    let said = String::from_utf8_lossy(&bisect(&dry).stdout).to_string();
    assert!(
        said.contains("a restart (measured over this target's last 2)")
            && said.contains("a wave of sessions (measured over this target's last 2)")
            && said.contains("engine-hours"),
        "{said}"
    );
}
