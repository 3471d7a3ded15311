//! The one table of Prometheus metrics this crate serves on `/metrics` (text format
//! 0.0.4), and its renderer. Both roles of the embedded engine and the zero-work mock
//! (`crate::mock`) report values for rows of [`Metric`] and render them with
//! [`render`], so a metric's name, type and help text exist in one place only.
//!
//! The `sglang:` rows carry sglang's names: the harness polls them from any engine
//! (running and queued requests feed its load-confound check). The `bisect_engine_`
//! rows are the embedded engine's own instrumentation.

use std::fmt::Write as _;

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
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

/// Every metric any server of this crate exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
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
    TransferErrors,
}

/// One row of the table: exported name, type, `# HELP` text.
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Metric {
    /// The table.
    pub fn spec(self) -> Spec {
        use Kind::{Counter, Gauge};
        use Metric::*;
        let (name, kind, help) = match self {
            RunningRequests => (
                "sglang:num_running_reqs",
                Gauge,
                "The number of running requests.",
            ),
            QueuedRequests => (
                "sglang:num_queue_reqs",
                Gauge,
                "The number of requests in the waiting queue.",
            ),
            TokenUsage => (
                "sglang:token_usage",
                Gauge,
                "Fraction of the KV pool in use.",
            ),
            CacheHitRate => (
                "sglang:cache_hit_rate",
                Gauge,
                "Prompt tokens served from the prefix cache over all prompt tokens.",
            ),
            GenThroughput => (
                "sglang:gen_throughput",
                Gauge,
                "Generated tokens per second over the last window.",
            ),
            Requests => (
                "bisect_engine_requests_total",
                Counter,
                "Chat requests answered.",
            ),
            PromptTokens => (
                "bisect_engine_prompt_tokens_total",
                Counter,
                "Prompt tokens received.",
            ),
            CompletionTokens => (
                "bisect_engine_completion_tokens_total",
                Counter,
                "Tokens generated.",
            ),
            CachedTokens => (
                "bisect_engine_cached_tokens_total",
                Counter,
                "Prompt tokens served from the prefix cache.",
            ),
            ComputedTokens => (
                "bisect_engine_computed_tokens_total",
                Counter,
                "Prompt tokens computed.",
            ),
            HicacheLoadbacks => (
                "bisect_engine_hicache_loadbacks_total",
                Counter,
                "Requests that loaded prefix pages back from the host tier.",
            ),
            HicacheLoadbackPages => (
                "bisect_engine_hicache_loadback_pages_total",
                Counter,
                "Pages loaded back from the host tier.",
            ),
            EvictedPages => (
                "bisect_engine_evicted_pages_total",
                Counter,
                "Device pages evicted.",
            ),
            DroppedPages => (
                "bisect_engine_dropped_pages_total",
                Counter,
                "Evicted pages dropped (no host tier, or the host tier full).",
            ),
            StaleIndexKReads => (
                "bisect_engine_stale_index_k_reads_total",
                Counter,
                "Index-K pages read before their load-back landed.",
            ),
            StaleIndexKRequests => (
                "bisect_engine_stale_index_k_requests_total",
                Counter,
                "Requests shipped with at least one stale index-K page.",
            ),
            LoaderBytes => (
                "bisect_engine_loader_bytes_total",
                Counter,
                "Bytes moved by the HiCache loader.",
            ),
            HostPages => (
                "bisect_engine_host_pages",
                Gauge,
                "Pages held in the host tier.",
            ),
            LoaderJobs => ("bisect_engine_loader_jobs", Gauge, "Load-backs in flight."),
            AbortedRequests => (
                "bisect_engine_aborted_requests_total",
                Counter,
                "Requests dropped because their client went away.",
            ),
            EagerDecodeSteps => (
                "bisect_engine_eager_decode_steps_total",
                Counter,
                "Decode steps on the eager path (batch above cuda_graph_max_bs).",
            ),
            GraphDecodeSteps => (
                "bisect_engine_graph_decode_steps_total",
                Counter,
                "Decode steps on the graph path.",
            ),
            IndexKChecksumMatches => (
                "bisect_engine_index_k_checksum_match_total",
                Counter,
                "Transfers whose index-K crc32 matched the sender's.",
            ),
            IndexKChecksumMismatches => (
                "bisect_engine_index_k_checksum_mismatch_total",
                Counter,
                "Transfers whose index-K crc32 differed from the sender's.",
            ),
            StaleIndexKPagesReceived => (
                "bisect_engine_stale_index_k_pages_received_total",
                Counter,
                "Stale index-K pages prefill reported in received transfers.",
            ),
            TransferErrors => (
                "bisect_engine_transfer_errors_total",
                Counter,
                "KV transfers from prefill that failed.",
            ),
        };
        Spec { name, kind, help }
    }
}

/// The Prometheus text of `values`, in the given order (the `Content-Type` to send it
/// with is [`CONTENT_TYPE`]).
pub fn render(values: &[(Metric, f64)]) -> String {
    let mut out = String::new();
    for &(metric, value) in values {
        let Spec { name, kind, help } = metric.spec();
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {}\n{name} {value}\n",
            kind.name()
        );
    }
    out
}

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

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

    #[test]
    fn counters_end_in_total_and_gauges_do_not() {
        use Metric::*;
        let all = [
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
            TransferErrors,
        ];
        let mut names: Vec<&str> = all.iter().map(|m| m.spec().name).collect();
        for metric in all {
            let spec = metric.spec();
            assert_eq!(
                spec.name.ends_with("_total"),
                spec.kind == Kind::Counter,
                "{}",
                spec.name
            );
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len(), "names are unique");
    }
}
