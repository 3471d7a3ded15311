//! The one table of Prometheus metrics this crate serves on `/metrics` (text format
//! 0.0.4), and its renderer. Both roles of the embedded engine and the zero-work mock
//! (`crate::mock`) report values for rows of [`Metric`] and render them with
//! [`render`], so a metric's name, type and help text exist in one place only.
//!
//! The `sglang:` rows carry sglang's names: the harness polls them from any engine
//! (running and queued requests feed its load-confound check). The `bisect_engine_`
//! rows are the embedded engine's own instrumentation.

use parking_lot::Mutex;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// Every metric any server of this crate exports (keep `TransferErrors` last: a test
/// checks the table has a row for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    RunningRequests,
    QueuedRequests,
    TokenUsage,
    CacheHitRate,
    GenThroughput,
    Requests,
    PromptTokens,
    CompletionTokens,
    CachedTokens,
    ComputedTokens,
    HicacheLoadbacks,
    HicacheLoadbackPages,
    EvictedPages,
    DroppedPages,
    StaleIndexKReads,
    StaleIndexKRequests,
    LoaderBytes,
    HostPages,
    LoaderJobs,
    AbortedRequests,
    EagerDecodeSteps,
    GraphDecodeSteps,
    IndexKChecksumMatches,
    IndexKChecksumMismatches,
    StaleIndexKPagesReceived,
    KernelStaleIndexKReads,
    KernelStaleMainReads,
    LoadBackWaits,
    BusySeconds,
    TransferErrors,
}

/// One row of the table: the metric, its exported name, type and `# HELP` text.
pub(crate) struct Spec {
    /// Read by the test that holds the table in `Metric` order.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) metric: Metric,
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) help: &'static str,
}

const fn row(metric: Metric, name: &'static str, kind: Kind, help: &'static str) -> Spec {
    Spec {
        metric,
        name,
        kind,
        help,
    }
}

/// The table, in [`Metric`]'s declaration order (a test checks it).
const TABLE: [Spec; 30] = {
    use Kind::{Counter, Gauge};
    use Metric::*;
    [
        row(
            RunningRequests,
            "sglang:num_running_reqs",
            Gauge,
            "The number of running requests.",
        ),
        row(
            QueuedRequests,
            "sglang:num_queue_reqs",
            Gauge,
            "The number of requests in the waiting queue.",
        ),
        row(
            TokenUsage,
            "sglang:token_usage",
            Gauge,
            "Fraction of the KV pool in use.",
        ),
        row(
            CacheHitRate,
            "sglang:cache_hit_rate",
            Gauge,
            "Prompt tokens served from the prefix cache over all prompt tokens.",
        ),
        row(
            GenThroughput,
            "sglang:gen_throughput",
            Gauge,
            "Generated tokens per second over the last window.",
        ),
        row(
            Requests,
            "bisect_engine_requests_total",
            Counter,
            "Chat requests answered.",
        ),
        row(
            PromptTokens,
            "bisect_engine_prompt_tokens_total",
            Counter,
            "Prompt tokens received.",
        ),
        row(
            CompletionTokens,
            "bisect_engine_completion_tokens_total",
            Counter,
            "Tokens generated.",
        ),
        row(
            CachedTokens,
            "bisect_engine_cached_tokens_total",
            Counter,
            "Prompt tokens served from the prefix cache.",
        ),
        row(
            ComputedTokens,
            "bisect_engine_computed_tokens_total",
            Counter,
            "Prompt tokens computed.",
        ),
        row(
            HicacheLoadbacks,
            "bisect_engine_hicache_loadbacks_total",
            Counter,
            "Requests that loaded prefix pages back from the host tier.",
        ),
        row(
            HicacheLoadbackPages,
            "bisect_engine_hicache_loadback_pages_total",
            Counter,
            "Pages loaded back from the host tier.",
        ),
        row(
            EvictedPages,
            "bisect_engine_evicted_pages_total",
            Counter,
            "Device pages evicted.",
        ),
        row(
            DroppedPages,
            "bisect_engine_dropped_pages_total",
            Counter,
            "Evicted pages dropped (no host tier, or the host tier full).",
        ),
        row(
            StaleIndexKReads,
            "bisect_engine_stale_index_k_reads_total",
            Counter,
            "Index-K pages read before their load-back landed.",
        ),
        row(
            StaleIndexKRequests,
            "bisect_engine_stale_index_k_requests_total",
            Counter,
            "Requests shipped with at least one stale index-K page.",
        ),
        row(
            LoaderBytes,
            "bisect_engine_loader_bytes_total",
            Counter,
            "Bytes moved by the HiCache loader.",
        ),
        row(
            HostPages,
            "bisect_engine_host_pages",
            Gauge,
            "Pages held in the host tier.",
        ),
        row(
            LoaderJobs,
            "bisect_engine_loader_jobs",
            Gauge,
            "Load-backs in flight.",
        ),
        row(
            AbortedRequests,
            "bisect_engine_aborted_requests_total",
            Counter,
            "Requests dropped because their client went away.",
        ),
        row(
            EagerDecodeSteps,
            "bisect_engine_eager_decode_steps_total",
            Counter,
            "Decode steps on the eager path (batch above cuda_graph_max_bs).",
        ),
        row(
            GraphDecodeSteps,
            "bisect_engine_graph_decode_steps_total",
            Counter,
            "Decode steps on the graph path.",
        ),
        row(
            IndexKChecksumMatches,
            "bisect_engine_index_k_checksum_match_total",
            Counter,
            "Transfers whose index-K crc32 matched the sender's.",
        ),
        row(
            IndexKChecksumMismatches,
            "bisect_engine_index_k_checksum_mismatch_total",
            Counter,
            "Transfers whose index-K crc32 differed from the sender's.",
        ),
        row(
            StaleIndexKPagesReceived,
            "bisect_engine_stale_index_k_pages_received_total",
            Counter,
            "Stale index-K pages prefill reported in received transfers.",
        ),
        row(
            KernelStaleIndexKReads,
            "bisect_engine_kernel_stale_index_k_reads_total",
            Counter,
            "Index-K page reads whose generation tag the reading GPU kernel found stale (load-back not landed); served only by a device-resident prefill pool (--device cuda).",
        ),
        row(
            KernelStaleMainReads,
            "bisect_engine_kernel_stale_main_reads_total",
            Counter,
            "The same for main-KV page reads (always gated: 0 unless broken); device-resident prefill pool only.",
        ),
        row(
            LoadBackWaits,
            "bisect_engine_loadback_waits_total",
            Counter,
            "Page reads whose stream waited on an unfinished HiCache load-back; device-resident prefill pool only.",
        ),
        row(
            BusySeconds,
            "bisect_engine_busy_seconds_total",
            Counter,
            "Seconds sglang:num_running_reqs read above zero: over a window, its rise over the window's length is the chance a sample of that gauge sees this role busy.",
        ),
        row(
            TransferErrors,
            "bisect_engine_transfer_errors_total",
            Counter,
            "KV transfers from prefill that failed.",
        ),
    ]
};

impl Metric {
    /// This metric's row of the table.
    pub(crate) fn spec(self) -> &'static Spec {
        &TABLE[self as usize]
    }
}

/// The Prometheus text of `values`, in the given order (the `Content-Type` to send it
/// with is [`CONTENT_TYPE`]).
pub(crate) fn render(values: &[(Metric, f64)]) -> String {
    let mut out = String::new();
    for &(metric, value) in values {
        let Spec {
            name, kind, help, ..
        } = metric.spec();
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {}\n{name} {value}\n",
            kind.name()
        );
    }
    out
}

pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The time a role's running-requests gauge read above zero, reported as
/// [`Metric::BusySeconds`]: over any window, its increase over the window's length is
/// the chance that a sample of the gauge taken in it sees the role busy. The harness
/// reads it to tell a role that holds requests (its sampled gauge shows its load) from
/// one they pass through in bursts shorter than a metrics period (docs/design.md 3.7,
/// "Peaks that mean something"). Fed every value the role publishes
/// ([`BusyTime::publish`]).
#[derive(Debug)]
pub(crate) struct BusyTime {
    /// Closed intervals above zero, and the last value published with its time.
    state: Mutex<(Duration, Instant, bool)>,
}

impl Default for BusyTime {
    fn default() -> Self {
        BusyTime {
            state: Mutex::new((Duration::ZERO, Instant::now(), false)),
        }
    }
}

impl BusyTime {
    /// The gauge now reads `running`.
    pub(crate) fn publish(&self, running: usize) {
        let now = Instant::now();
        let mut state = self.state.lock();
        let (busy, since, above) = &mut *state;
        if *above {
            *busy += now.duration_since(*since);
        }
        (*since, *above) = (now, running > 0);
    }

    /// Seconds above zero so far, the interval still open included.
    pub(crate) fn seconds(&self) -> f64 {
        let (busy, since, above) = *self.state.lock();
        let open = if above {
            since.elapsed()
        } else {
            Duration::ZERO
        };
        (busy + open).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_type_and_value_per_row() {
        let text = render(&[(Metric::RunningRequests, 3.0), (Metric::Requests, 7.0)]);
        assert_eq!(
            text,
            "# HELP sglang:num_running_reqs The number of running requests.\n\
             # TYPE sglang:num_running_reqs gauge\n\
             sglang:num_running_reqs 3\n\
             # HELP bisect_engine_requests_total Chat requests answered.\n\
             # TYPE bisect_engine_requests_total counter\n\
             bisect_engine_requests_total 7\n"
        );
    }

    /// Busy time is the time the gauge read above zero: it grows while a published
    /// value is above zero (read mid-interval too) and stands still at zero.
    #[test]
    fn busy_time_counts_only_time_above_zero() {
        let busy = BusyTime::default();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(busy.seconds(), 0.0, "nothing published: never busy");
        busy.publish(3);
        std::thread::sleep(Duration::from_millis(20));
        let open = busy.seconds();
        assert!(open >= 0.020, "{open}");
        busy.publish(1);
        std::thread::sleep(Duration::from_millis(10));
        busy.publish(0);
        let closed = busy.seconds();
        assert!(closed >= open + 0.010, "{open} then {closed}");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(busy.seconds(), closed, "idle time is not busy");
        busy.publish(0);
        assert_eq!(busy.seconds(), closed);
    }

    #[test]
    fn the_table_is_in_declaration_order_with_unique_names() {
        for (index, spec) in TABLE.iter().enumerate() {
            assert_eq!(spec.metric as usize, index, "{}", spec.name);
            assert_eq!(
                spec.name.ends_with("_total"),
                spec.kind == Kind::Counter,
                "counters and only counters end in _total: {}",
                spec.name
            );
        }
        // A variant added without a row would index past the table.
        assert_eq!(Metric::TransferErrors as usize, TABLE.len() - 1);
        let mut names: Vec<&str> = TABLE.iter().map(|spec| spec.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "names are unique");
    }
}
