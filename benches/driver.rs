//! Benchmark of the workload driver alone: N concurrent sessions x 4 rounds against the
//! in-process zero-work mock engine (`bisect_engine::mock`), so every figure is harness
//! overhead. Rows: a 100-session baseline and 1000 sessions, in one process.
//! Reports sessions/s, client-side round latency p50/p99 next to the mock's own
//! handling time (the difference is what the client stack adds), peak client in-flight
//! requests and peak RSS (VmHWM, cumulative over the rows).
//!
//! Run: `cargo bench --bench driver` (optionally `-- 100 1000 5000` for other sizes).

use bisect_engine::mock::{MockConfig, MockServer};
use bisect_harness::core::classify::Classifier;
use bisect_harness::driver::sample::sample_workload;
use bisect_harness::driver::{drive, DrivePlan, InFlight};
use comfy_table::Table;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const ROUNDS: u32 = 4;
const CTX_TOKENS: u32 = 300;

fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn open_files_soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn percentile_ms(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len());
    sorted_ns[rank - 1] as f64 / 1e6
}

struct Row {
    sessions: u32,
    wall_s: f64,
    sessions_per_s: f64,
    client_p50: f64,
    client_p99: f64,
    mock_p50: f64,
    mock_p99: f64,
    peak_inflight: u64,
    hwm_mib: f64,
    done: u64,
}

async fn run_row(server: &MockServer, sessions: u32) -> anyhow::Result<Row> {
    let mut workload = sample_workload(sessions, ROUNDS);
    workload.ctx = CTX_TOKENS;
    workload.timeout_s = 120.0;
    let classifier = Arc::new(Classifier::with_defaults(&workload.tools)?);
    let plan = DrivePlan {
        api: server.api(),
        model: "mock".into(),
        api_key: None,
        workload,
        label: format!("n{sessions}"),
        repeat: 1,
        sessions,
        concurrency: 0,
    };
    server.stats().clear();
    let (tx, mut rx) = mpsc::channel(256);
    let collector = tokio::spawn(async move {
        let mut received = 0u64;
        while rx.recv().await.is_some() {
            received += 1;
        }
        received
    });
    let inflight = Arc::new(InFlight::new());
    let stats = drive(&plan, classifier, tx, inflight, CancellationToken::new()).await?;
    let received = collector.await?;
    anyhow::ensure!(
        received == u64::from(sessions),
        "only {received} results arrived"
    );
    let mut handling = server.stats().handling_ns();
    handling.sort_unstable();
    Ok(Row {
        sessions,
        wall_s: stats.wall_s,
        sessions_per_s: f64::from(sessions) / stats.wall_s,
        client_p50: stats.round_latency_p50_ms,
        client_p99: stats.round_latency_p99_ms,
        mock_p50: percentile_ms(&handling, 0.50),
        mock_p99: percentile_ms(&handling, 0.99),
        peak_inflight: stats.peak_client_inflight,
        hwm_mib: proc_status_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0,
        done: stats.counts.done,
    })
}

fn main() -> anyhow::Result<()> {
    let sizes: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100, 1000]
    } else {
        sizes
    };
    let largest = u64::from(*sizes.iter().max().unwrap_or(&0));
    // Client and server sockets live in this one process: two descriptors per session.
    let needed = 2 * largest + 256;
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
        let server = MockServer::start(MockConfig::default()).await?;
        let mut rows = Vec::new();
        for &n in &sizes {
            rows.push(run_row(&server, n).await?);
        }
        anyhow::Ok(rows)
    })?;

    let mut table = Table::new();
    table.set_header(vec![
        "sessions",
        "done",
        "wall s",
        "sessions/s",
        "ratio vs first",
        "client p50 ms",
        "client p99 ms",
        "mock p50 ms",
        "mock p99 ms",
        "added p50 ms",
        "added p99 ms",
        "peak in-flight",
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
            format!("{:.3}", r.client_p50),
            format!("{:.3}", r.client_p99),
            format!("{:.3}", r.mock_p50),
            format!("{:.3}", r.mock_p99),
            format!("{:.3}", r.client_p50 - r.mock_p50),
            format!("{:.3}", r.client_p99 - r.mock_p99),
            r.peak_inflight.to_string(),
            format!("{:.1}", r.hwm_mib),
        ]);
    }
    println!(
        "workload driver vs zero-work mock: {ROUNDS} rounds, ctx {CTX_TOKENS} tokens, {} worker threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("{table}");
    Ok(())
}
