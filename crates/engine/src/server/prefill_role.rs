//! The prefill role over HTTP: `POST /internal/prefill` queues a prompt for the
//! compute thread (`prefill_loop`, which owns the `PrefillCore`) and answers with the
//! binary KV payload of `transfer`; plus this role's `/metrics` values.

use super::{error_response, CancelOnDrop};
use crate::backend::{Backend, PoolStats};
use crate::metrics::{BusyTime, Metric};
use crate::prefill::{PrefillCore, PrefillCounters, PrefillGauges};
use crate::transfer::{self, PrefillRequest};
use crate::EngineConfig;
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

type PrefillReply = oneshot::Sender<Result<Vec<u8>, String>>;

/// A queued prefill request.
struct Submission {
    id: u64,
    tokens: Vec<u32>,
    reply: PrefillReply,
    cancelled: Arc<AtomicBool>,
}

/// What the HTTP side and the compute thread share.
pub(super) struct PrefillShared {
    incoming: Mutex<Vec<Submission>>,
    wake: Condvar,
    gauges: Mutex<PrefillGauges>,
    counters: Mutex<PrefillCounters>,
    /// The backend pool's counters when the pool is device-resident (`--device cuda`):
    /// stale reads as the reading kernel counted them.
    pool_stats: Mutex<Option<PoolStats>>,
    next_id: AtomicU64,
    /// Time the running gauge read above zero.
    busy: BusyTime,
    checksum: bool,
    pub(super) ready: AtomicBool,
}

/// Start the compute thread of the prefill role.
pub(super) fn start(
    config: &EngineConfig,
    backend: Box<dyn Backend>,
) -> anyhow::Result<Arc<PrefillShared>> {
    let shared = Arc::new(PrefillShared {
        incoming: Mutex::new(Vec::new()),
        wake: Condvar::new(),
        gauges: Mutex::new(PrefillGauges::default()),
        counters: Mutex::new(PrefillCounters::default()),
        pool_stats: Mutex::new(None),
        next_id: AtomicU64::new(0),
        busy: BusyTime::default(),
        checksum: config.flags.index_k_checksum,
        ready: AtomicBool::new(false),
    });
    // On CUDA the pool and its HiCache live on the device and the load-back race is the
    // copy stream's; on the CPU the virtual-time loader (prefill.rs module doc).
    let core = PrefillCore::for_backend(config.prefill_options(), backend.as_ref())?;
    if core.is_resident() {
        tracing::info!(
            "prefill: prefix cache in a {} pool, HiCache load-backs on the copy stream",
            backend.name()
        );
        *shared.pool_stats.lock() = Some(PoolStats::default());
    }
    *shared.gauges.lock() = core.gauges();
    let floor = Duration::from_micros(config.tuning.prefill_step_floor_us);
    let worker = shared.clone();
    std::thread::Builder::new()
        .name("prefill-compute".into())
        .spawn(move || prefill_loop(worker, core, backend, floor))
        .context("starting the prefill compute thread")?;
    shared.ready.store(true, Ordering::Relaxed);
    Ok(shared)
}

fn prefill_loop(
    shared: Arc<PrefillShared>,
    mut core: PrefillCore,
    backend: Box<dyn Backend>,
    floor: Duration,
) {
    let mut waiting: HashMap<u64, (PrefillReply, Arc<AtomicBool>)> = HashMap::new();
    let mut logged = (Instant::now(), PrefillCounters::default());
    loop {
        {
            let mut incoming = shared.incoming.lock();
            while incoming.is_empty() && !core.has_work() {
                shared.wake.wait(&mut incoming);
            }
            for submission in incoming.drain(..) {
                core.submit(submission.id, submission.tokens);
                waiting.insert(submission.id, (submission.reply, submission.cancelled));
            }
        }
        let gone: Vec<u64> = waiting
            .iter()
            .filter(|(_, (reply, cancelled))| {
                cancelled.load(Ordering::Relaxed) || reply.is_closed()
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            core.cancel(id);
            waiting.remove(&id);
        }
        let started = Instant::now();
        let outcome = core.step(backend.as_ref());
        // Published before the replies go out, so a client that got its answer never
        // reads gauges that still count its request.
        let gauges = core.gauges();
        *shared.gauges.lock() = gauges;
        shared.busy.publish(gauges.running);
        let shipped_any = matches!(&outcome, Ok(shipped) if !shipped.is_empty());
        if shipped_any || core.counters.evicted_pages != shared.counters.lock().evicted_pages {
            // Only when something was read or evicted: on CUDA this reads the kernels'
            // counters back (a small copy and a sync of the compute stream).
            match core.pool_stats(backend.as_ref()) {
                Some(Ok(stats)) => *shared.pool_stats.lock() = Some(stats),
                Some(Err(error)) => {
                    tracing::warn!("prefill: reading the pool's counters: {error:#}")
                }
                None => {}
            }
        }
        *shared.counters.lock() = core.counters.clone();
        match outcome {
            Ok(shipped) => {
                for (id, result) in shipped {
                    if let Some((reply, _)) = waiting.remove(&id) {
                        if let Ok(kv) = &result {
                            if kv.stale_index_pages > 0 {
                                tracing::debug!(
                                    request = id,
                                    pages = kv.stale_index_pages,
                                    "shipping index-K pages whose load-back is still running"
                                );
                            }
                        }
                        let _ = reply.send(result.map(|kv| transfer::encode(&kv, shared.checksum)));
                    }
                }
            }
            Err(error) => {
                tracing::error!("prefill step failed: {error:#}");
                for (_, (reply, _)) in waiting.drain() {
                    let _ = reply.send(Err(format!("prefill step failed: {error:#}")));
                }
            }
        }
        let due = logged.0.elapsed() >= COUNTERS_LOG_PERIOD || !core.has_work();
        if due && core.counters != logged.1 {
            log_counters(&core.counters, *shared.pool_stats.lock());
            logged = (Instant::now(), core.counters.clone());
        }
        let elapsed = started.elapsed();
        if elapsed < floor && core.has_work() {
            // Modelled forward duration (see EngineTuning::prefill_step_floor_us).
            std::thread::sleep(floor - elapsed);
        }
    }
}

/// How often the compute thread logs its counters while they change (and once more when
/// it runs out of work): the engine log is
/// where a run's race figures survive the engine (scripts/gpu-check.sh reads the last
/// line of each arm's prefill log).
const COUNTERS_LOG_PERIOD: Duration = Duration::from_secs(1);

fn log_counters(counters: &PrefillCounters, pool: Option<PoolStats>) {
    let kernel = pool.map_or_else(
        || "kernel_stale_index_k_reads=- loadback_waits=-".to_string(),
        |stats| {
            format!(
                "kernel_stale_index_k_reads={} kernel_stale_main_reads={} loadback_waits={}",
                stats.stale_index_k_reads, stats.stale_main_reads, stats.gated_waits
            )
        },
    );
    tracing::info!(
        "prefill counters: requests={} loadback_requests={} loadback_pages={} evicted_pages={} stale_index_k_requests={} stale_index_k_pages={} {kernel}",
        counters.requests,
        counters.loadback_requests,
        counters.loadback_pages,
        counters.evicted_pages,
        counters.stale_index_k_requests,
        counters.stale_index_k_pages,
    );
}

pub(super) async fn prefill_handler(
    State(state): State<Arc<super::AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let not_prefill = "this is not a prefill server";
    let malformed = "bad prefill request";
    let (request, shared): (PrefillRequest, _) =
        match super::role_request(body, &state.prefill, not_prefill, malformed) {
            Ok(accepted) => accepted,
            Err(response) => return *response,
        };
    if request.tokens.is_empty() {
        return error_response(StatusCode::BAD_REQUEST, "empty prompt");
    }
    if request.index_k_dtype != state.config.flags.dtype().name() {
        tracing::warn!(decode = %request.index_k_dtype, prefill = state.config.flags.dtype().name(), "index-K dtype differs from decode's; decode will refuse this payload");
    }
    let (reply, receive) = oneshot::channel();
    let cancelled = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop::new(cancelled.clone());
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared.incoming.lock().push(Submission {
        id,
        tokens: request.tokens,
        reply,
        cancelled,
    });
    shared.wake.notify_one();
    let result = receive.await;
    guard.disarm();
    match result {
        Ok(Ok(payload)) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            payload,
        )
            .into_response(),
        Ok(Err(message)) => error_response(StatusCode::SERVICE_UNAVAILABLE, message),
        Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "prefill worker stopped"),
    }
}

impl PrefillShared {
    /// This role's `/metrics` values.
    pub(super) fn metrics(&self) -> Vec<(Metric, f64)> {
        let gauges = *self.gauges.lock();
        let counters = self.counters.lock().clone();
        let mut values = vec![
            (Metric::RunningRequests, gauges.running as f64),
            (Metric::QueuedRequests, gauges.queued as f64),
            (
                Metric::TokenUsage,
                gauges.used_pages as f64 / gauges.total_pages.max(1) as f64,
            ),
            (
                Metric::CacheHitRate,
                counters.cached_tokens as f64 / counters.prompt_tokens.max(1) as f64,
            ),
            (Metric::GenThroughput, 0.0),
            (Metric::PromptTokens, counters.prompt_tokens as f64),
            (Metric::CachedTokens, counters.cached_tokens as f64),
            (Metric::ComputedTokens, counters.computed_tokens as f64),
            (Metric::HicacheLoadbacks, counters.loadback_requests as f64),
            (Metric::HicacheLoadbackPages, counters.loadback_pages as f64),
            (Metric::EvictedPages, counters.evicted_pages as f64),
            (Metric::DroppedPages, counters.dropped_pages as f64),
            (
                Metric::StaleIndexKReads,
                counters.stale_index_k_pages as f64,
            ),
            (
                Metric::StaleIndexKRequests,
                counters.stale_index_k_requests as f64,
            ),
            (Metric::LoaderBytes, counters.loader_bytes as f64),
            (Metric::HostPages, gauges.host_pages as f64),
            (Metric::LoaderJobs, gauges.loader_jobs as f64),
            (Metric::BusySeconds, self.busy.seconds()),
        ];
        if let Some(stats) = *self.pool_stats.lock() {
            values.extend([
                (
                    Metric::KernelStaleIndexKReads,
                    stats.stale_index_k_reads as f64,
                ),
                (Metric::KernelStaleMainReads, stats.stale_main_reads as f64),
                (Metric::LoadBackWaits, stats.gated_waits as f64),
            ]);
        }
        values
    }

    /// The device pool's size, for `/server_info`.
    pub(super) fn total_pages(&self) -> usize {
        self.gauges.lock().total_pages
    }
}
