//! Benchmark of the workload driver alone: N sessions x 4 rounds against a zero-work mock
//! engine, so every figure is harness overhead. By default the mock runs in this process
//! (`bisect_engine::mock`); with `--url` the driver runs against an external one (the
//! hidden `bisect mock-engine --port P`, possibly pinned to another core), which is how
//! `scripts/bench-clients.sh` compares it with the Python asyncio client of
//! `benches/python/client.py` on the same server.
//!
//! Per row: sessions/s, client CPU seconds per 1000 requests (utime + stime of this
//! process, /proc/self/stat; with the in-process mock it includes the mock's),
//! client-side round latency p50/p99 (and, in-process, the mock's own handling time),
//! the harness's send lag p50/p99 (from a reply's arrival to the same session's next
//! request), peak client in-flight requests against the target, peak RSS (VmHWM,
//! cumulative over the rows).
//!
//! Run: `cargo bench --bench driver` (optionally sizes: `-- 100 1000 5000`), or
//! `-- --url http://127.0.0.1:P/v1 [--concurrency C] [--json] SIZES...`;
//! `-- --dump FILE N` writes the first N sessions' conversations, expected calls and tool
//! results as JSON lines for the Python client (the same conversations the driver sends).
//! `--rounds R` and `--timeout S` set the sessions' rounds and per-round timeout;
//! `--unpaced` opens connections all at once, as the driver did before its connect pacer
//! (`scripts/bench-servers.sh` compares both against a thread-per-connection server).
//! `--metrics-ms P` runs the engine metrics poller alongside, as `bisect run` does (one
//! scrape of the mock's `/metrics` every P ms; `bisect run` uses 250), to measure its
//! cost; the row then reports the scrapes taken.

mod support;

use bisect_engine::mock::{MockConfig, MockServer};
use bisect_harness::core::classify::Classifier;
use bisect_harness::core::session::{FunctionCall, SessionClass, ToolCall};
use bisect_harness::core::task::initial_conversation;
use bisect_harness::core::tools::simulate;
use bisect_harness::driver::client::tools_payload;
use bisect_harness::driver::connect::{ConnectGate, Pacing};
use bisect_harness::driver::metrics::MetricsEndpoint;
use bisect_harness::driver::sample::sample_workload;
use bisect_harness::driver::{drive, poll, DrivePlan, InFlight};
use comfy_table::Table;
use std::sync::Arc;
use std::time::Duration;
use support::{cpu_seconds, percentile_ms, proc_status_kib};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const ROUNDS: u32 = 4;
const CTX_TOKENS: u32 = 300;

fn open_files_soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

struct Options {
    url: Option<String>,
    concurrency: u32,
    /// Poll the mock's `/metrics` every this many ms during each row (0: no poller).
    metrics_ms: u64,
    json: bool,
    sizes: Vec<u32>,
    /// Rounds per session (`--rounds`).
    rounds: u32,
    /// The per-round timeout (`--timeout`, seconds).
    timeout_s: f64,
    /// Every connect at once, as before the connect pacer (`--unpaced`).
    unpaced: bool,
}

struct Row {
    sessions: u32,
    target_inflight: u32,
    requests: u64,
    cpu_s_per_1000: f64,
    lag_p50: f64,
    lag_p99: f64,
    wall_s: f64,
    sessions_per_s: f64,
    client_p50: f64,
    client_p99: f64,
    mock_p50: f64,
    mock_p99: f64,
    peak_inflight: u64,
    hwm_mib: f64,
    done: u64,
    errors: u64,
    timeouts: u64,
    scrapes: u64,
    connects: bisect_harness::core::transport::TransportStats,
}

fn bench_workload(sessions: u32, rounds: u32, timeout_s: f64) -> bisect_harness::config::Workload {
    let mut workload = sample_workload(sessions, rounds);
    workload.ctx = CTX_TOKENS;
    workload.timeout_s = timeout_s;
    workload
}

/// Writes what the Python client needs to run the same sessions: a header line (model,
/// rounds, sampling, the `tools` payload), then per session its initial messages and,
/// per step, the expected call and the tool result the driver would answer it with.
fn dump(path: &str, sessions: u32) -> anyhow::Result<()> {
    use std::io::Write;
    let workload = bench_workload(sessions, ROUNDS, 120.0);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let header = serde_json::json!({
        "model": "mock",
        "rounds": workload.rounds,
        "max_tokens": workload.max_tokens,
        "temperature": workload.temperature,
        "tools": tools_payload(&workload.tools),
    });
    writeln!(out, "{header}")?;
    for index in 0..sessions {
        let (task, messages) = initial_conversation(&workload, index);
        let steps: Vec<serde_json::Value> = task
            .steps
            .iter()
            .map(|step| {
                let tool = workload
                    .tools
                    .iter()
                    .find(|t| t.name == step.tool)
                    .expect("a step names a workload tool");
                let call = ToolCall {
                    id: String::new(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: step.tool.clone(),
                        arguments: serde_json::Value::Object(step.args.clone()).to_string(),
                    },
                };
                serde_json::json!({
                    "name": step.tool,
                    "arguments": step.args,
                    "result": simulate(tool, &call, &step.args),
                })
            })
            .collect();
        let line = serde_json::json!({"index": index, "messages": messages, "steps": steps});
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

async fn run_row(
    server: Option<&MockServer>,
    url: Option<&str>,
    sessions: u32,
    options: &Options,
) -> anyhow::Result<Row> {
    let concurrency = options.concurrency;
    let metrics_ms = options.metrics_ms;
    let workload = bench_workload(sessions, options.rounds, options.timeout_s);
    let classifier = Arc::new(Classifier::with_defaults(&workload.tools)?);
    let api = match (server, url) {
        (Some(server), _) => server.api(),
        (None, Some(url)) => url.to_string(),
        (None, None) => anyhow::bail!("no server to drive"),
    };
    let plan = DrivePlan {
        api,
        model: "mock".into(),
        api_key: None,
        workload,
        label: format!("n{sessions}"),
        repeat: 1,
        sessions,
        concurrency,
        oracle: None,
    };
    let target_inflight = plan.slots();
    if let Some(server) = server {
        server.stats().clear();
    }
    let cpu_before = cpu_seconds();
    let (tx, mut rx) = mpsc::channel(256);
    let collector = tokio::spawn(async move {
        let mut received = 0u64;
        while rx.recv().await.is_some() {
            received += 1;
        }
        received
    });
    let inflight = Arc::new(if options.unpaced {
        InFlight::with_gate(ConnectGate::new(Pacing::unpaced()))
    } else {
        InFlight::new()
    });
    let stop_poller = CancellationToken::new();
    let poller = (metrics_ms > 0).then(|| {
        let metrics_url = format!("{}/metrics", plan.api.trim_end_matches("/v1"));
        tokio::spawn(poll(
            vec![MetricsEndpoint::sglang("mock", metrics_url)],
            None,
            inflight.clone(),
            Duration::from_millis(metrics_ms),
            stop_poller.clone(),
        ))
    });
    let stats = drive(&plan, classifier, tx, inflight, CancellationToken::new()).await?;
    stop_poller.cancel();
    let scrapes = match poller {
        Some(poller) => {
            let log = poller.await?;
            anyhow::ensure!(
                log.all_failed().is_empty(),
                "metrics scrapes failed: {:?}",
                log.all_failed()
            );
            log.rows.iter().filter(|r| r.role == "mock").count() as u64
        }
        None => 0,
    };
    let received = collector.await?;
    let cpu = cpu_seconds() - cpu_before;
    anyhow::ensure!(
        received == u64::from(sessions),
        "only {received} results arrived"
    );
    let mut handling = server.map(|s| s.stats().handling_ns()).unwrap_or_default();
    handling.sort_unstable();
    Ok(Row {
        sessions,
        target_inflight,
        requests: stats.requests,
        cpu_s_per_1000: if stats.requests > 0 {
            cpu * 1000.0 / stats.requests as f64
        } else {
            0.0
        },
        lag_p50: stats.send_lag_p50_ms,
        lag_p99: stats.send_lag_p99_ms,
        wall_s: stats.wall_s,
        sessions_per_s: f64::from(sessions) / stats.wall_s,
        client_p50: stats.round_latency_p50_ms,
        client_p99: stats.round_latency_p99_ms,
        mock_p50: percentile_ms(&handling, 0.50),
        mock_p99: percentile_ms(&handling, 0.99),
        peak_inflight: stats.peak_client_inflight,
        hwm_mib: proc_status_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0,
        done: stats.counts[SessionClass::Done],
        errors: stats.counts[SessionClass::Error],
        timeouts: stats.counts[SessionClass::Timeout],
        scrapes,
        connects: stats.transport.clone(),
    })
}

fn parse_options() -> anyhow::Result<Option<Options>> {
    let mut args = std::env::args().skip(1);
    let mut options = Options {
        url: None,
        concurrency: 0,
        metrics_ms: 0,
        json: false,
        sizes: Vec::new(),
        rounds: ROUNDS,
        timeout_s: 120.0,
        unpaced: false,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--url" => options.url = args.next(),
            "--concurrency" => {
                options.concurrency = args.next().unwrap_or_default().parse()?;
            }
            "--metrics-ms" => {
                options.metrics_ms = args.next().unwrap_or_default().parse()?;
            }
            "--json" => options.json = true,
            "--unpaced" => options.unpaced = true,
            "--rounds" => options.rounds = args.next().unwrap_or_default().parse()?,
            "--timeout" => options.timeout_s = args.next().unwrap_or_default().parse()?,
            "--dump" => {
                let path = args.next().unwrap_or_default();
                let n: u32 = args.next().unwrap_or_default().parse()?;
                dump(&path, n)?;
                return Ok(None);
            }
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            other => {
                if let Ok(n) = other.parse() {
                    options.sizes.push(n);
                }
            }
        }
    }
    if options.sizes.is_empty() {
        options.sizes = vec![100, 1000];
    }
    Ok(Some(options))
}

fn main() -> anyhow::Result<()> {
    let Some(options) = parse_options()? else {
        return Ok(());
    };
    let sizes = options.sizes.clone();
    let largest = u64::from(*sizes.iter().max().unwrap_or(&0));
    // Client and server sockets live in this one process: two descriptors per session.
    let needed = if options.url.is_some() {
        largest
    } else {
        2 * largest
    } + 256;
    match open_files_soft_limit() {
        Some(limit) if limit < needed => eprintln!(
            "warning: open-files soft limit {limit} is below the ~{needed} this run needs; \
             raise it (ulimit -n) or expect connect errors"
        ),
        Some(limit) => eprintln!("open-files soft limit {limit} (need ~{needed})"),
        None => eprintln!("open-files limit unknown (no /proc/self/limits)"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let rows = runtime.block_on(async {
        let server = match &options.url {
            Some(_) => None,
            None => Some(MockServer::start(MockConfig::default()).await?),
        };
        let mut rows = Vec::new();
        for &n in &sizes {
            let row = run_row(server.as_ref(), options.url.as_deref(), n, &options);
            rows.push(row.await?);
        }
        anyhow::Ok(rows)
    })?;

    if options.json {
        for r in &rows {
            let line = serde_json::json!({
                "client": "bisect",
                "sessions": r.sessions,
                "done": r.done,
                "wall_s": r.wall_s,
                "sessions_per_s": r.sessions_per_s,
                "requests": r.requests,
                "cpu_s_per_1000_requests": r.cpu_s_per_1000,
                "round_p50_ms": r.client_p50,
                "round_p99_ms": r.client_p99,
                "lag_p50_ms": r.lag_p50,
                "lag_p99_ms": r.lag_p99,
                "target_inflight": r.target_inflight,
                "peak_inflight": r.peak_inflight,
                "peak_rss_mib": r.hwm_mib,
                "metrics_scrapes": r.scrapes,
                "errors": r.errors,
                "timeouts": r.timeouts,
                "connects": r.connects,
            });
            println!("{line}");
        }
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header(vec![
        "sessions",
        "done",
        "wall s",
        "sessions/s",
        "ratio vs first",
        "CPU s / 1000 req",
        "client p50 ms",
        "client p99 ms",
        "mock p50 ms",
        "mock p99 ms",
        "send lag p50 ms",
        "send lag p99 ms",
        "in-flight peak/target",
        "VmHWM MiB",
    ]);
    let base = rows.first().map_or(1.0, |r| r.sessions_per_s);
    for r in &rows {
        table.add_row(vec![
            r.sessions.to_string(),
            r.done.to_string(),
            format!("{:.3}", r.wall_s),
            format!("{:.0}", r.sessions_per_s),
            format!("{:.2}", r.sessions_per_s / base),
            format!("{:.3}", r.cpu_s_per_1000),
            format!("{:.3}", r.client_p50),
            format!("{:.3}", r.client_p99),
            format!("{:.3}", r.mock_p50),
            format!("{:.3}", r.mock_p99),
            format!("{:.3}", r.lag_p50),
            format!("{:.3}", r.lag_p99),
            format!("{}/{}", r.peak_inflight, r.target_inflight),
            format!("{:.1}", r.hwm_mib),
        ]);
    }
    println!(
        "workload driver vs zero-work mock ({}): {ROUNDS} rounds, ctx {CTX_TOKENS} tokens, {} worker threads",
        options.url.as_deref().unwrap_or("in-process"),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("{table}");
    Ok(())
}
