//! A small ops-agent workload (three tools, three steps per task) built in code, for
//! the driver's tests and benchmarks against the zero-work mock engine
//! (`bisect_engine::mock`, a dev-dependency only) and for integration tests.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{drive, DrivePlan, DriveStats, InFlight};
use crate::config::{CheckArgs, TaskSpec, ToolSpec, Workload};
use crate::core::classify::Classifier;
use crate::core::session::SessionResult;

fn tool(name: &str, description: &str, parameters: Value, pools: Value, result: &str) -> ToolSpec {
    let arg_values = pools
        .as_object()
        .expect("pools object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_array().expect("pool array").clone()))
        .collect();
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        parameters,
        arg_values,
        result: result.to_string(),
    }
}

/// A small ops-agent workload (three tools, three steps per task) for tests, benches
/// and the lead's integration tests; `rounds` should exceed 3 for sessions to finish.
pub fn sample_workload(sessions: u32, rounds: u32) -> Workload {
    let paths = json!([
        "/srv/app/config.yaml",
        "/var/log/nginx/error.log",
        "/etc/sglang/decode.env",
        "/srv/app/logs/worker-3.log",
        "/opt/serve/launch_prefill.sh",
        "/var/lib/app/queue \"pending\".json"
    ]);
    let tools = vec![
        tool(
            "read_file",
            "Read the first lines of a file.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "max_lines": {"type": "integer", "minimum": 1}
                },
                "required": ["path"]
            }),
            json!({"path": paths, "max_lines": [20, 40, 100, 250]}),
            "{path} (first {max_lines} lines):\nlisten: 0.0.0.0:8080\ntimeout: 30s",
        ),
        tool(
            "grep",
            "Search a file for a pattern.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string"},
                    "ignore_case": {"type": "boolean"}
                },
                "required": ["pattern", "path"]
            }),
            json!({
                "pattern": ["ERROR", "timeout", "kv_pool", "retry \"later\"", "index_k"],
                "path": paths,
                "ignore_case": [true, false]
            }),
            "{path}: 2 matches for \"{pattern}\"",
        ),
        tool(
            "list_dir",
            "List a directory.",
            json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"]
            }),
            json!({"path": ["/srv/app", "/var/log", "/etc/sglang", "/opt/serve"]}),
            r#"{"path": "{path}", "entries": ["config.yaml", "logs", "src"]}"#,
        ),
    ];
    Workload {
        name: "mock-ops".to_string(),
        sessions,
        concurrency: None,
        rounds,
        ctx: 0,
        max_tokens: 256,
        timeout_s: 30.0,
        temperature: 0.0,
        tools,
        task: TaskSpec {
            steps: 3,
            intro:
                "You are the on-call assistant. Do these steps in order, one tool call per step:"
                    .to_string(),
            outro: "When all steps are done, answer with a one-line summary.".to_string(),
        },
        check_args: CheckArgs::Strict,
        barrier: false,
        seed: 42,
        source: None,
        request: Default::default(),
    }
}

/// Drives `plan` outside the arm lifecycle (the driver's own tests, the plain-server
/// tests) with every markup family counted, and collects every session's result in
/// session order.
pub async fn drive_collected(
    plan: &DrivePlan,
    cancel: CancellationToken,
) -> anyhow::Result<(DriveStats, Vec<SessionResult>)> {
    let classifier = Arc::new(Classifier::with_defaults(&plan.workload.tools)?);
    let (tx, mut rx) = mpsc::channel(64);
    let collector = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(r) = rx.recv().await {
            all.push(r);
        }
        all
    });
    let stats = drive(plan, classifier, tx, Arc::new(InFlight::new()), cancel).await?;
    let mut results = collector.await?;
    results.sort_by_key(|r| r.index);
    Ok((stats, results))
}
