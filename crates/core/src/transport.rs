//! What the transport to the engine did during one arm block, as plain values: how the
//! driver's connections were set up (count, connect times apart from reply times,
//! refused and reset connects retried, connects slow enough to mean a dropped SYN, the
//! pacing gap), the replies that shed load (429/503), and where the requests the client
//! had in flight were while the engine said it was running fewer ([`LoadGap`]). The
//! driver fills these in; the verdict words them (docs/design.md 3.4, "Reaching the
//! load").

use serde::{Deserialize, Serialize};

/// A connect that took at least this long almost always waited on a retransmitted SYN
/// (Linux's first SYN retransmission is after 1 s): the server's listen queue was full
/// and the kernel dropped the SYN (`TcpExtListenOverflows` on the server).
pub const SLOW_CONNECT_MS: f64 = 500.0;

/// Connection set-up and load shedding seen by the client in one arm block.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TransportStats {
    /// Connections opened (TCP handshakes completed).
    pub connects: u64,
    /// Connect time (SYN to established, pacing wait excluded), milliseconds.
    pub connect_ms_p50: f64,
    pub connect_ms_p99: f64,
    pub connect_ms_max: f64,
    /// Connects at least [`SLOW_CONNECT_MS`] long: SYNs the server's full listen queue
    /// dropped and the kernel sent again.
    pub slow_connects: u64,
    /// Connects whose SYN went unanswered far longer than the usual connect time (a full
    /// listen queue dropped it), abandoned and started again without waiting for the
    /// kernel's retransmission.
    #[serde(default)]
    pub stalled_connects: u64,
    /// Connects refused (nothing listening, or a full queue answered with a reset) and
    /// tried again within the round's timeout.
    pub refused_retried: u64,
    /// Connects reset or aborted during the handshake and tried again.
    pub reset_retried: u64,
    /// Connects that failed for good (an error not worth retrying).
    pub failed: u64,
    /// Connects cut off by the round's timeout or the end of the drive.
    pub abandoned: u64,
    /// Replies 429 or 503: the server shedding load.
    pub shed_replies: u64,
    /// Of those, requests sent again after the server's `Retry-After` (within the
    /// round's timeout).
    pub shed_retried: u64,
    /// The widest gap the connect pacer kept between two connection starts,
    /// milliseconds (it widens when connects come back slow or refused).
    pub pacing_gap_ms_max: f64,
}

impl TransportStats {
    /// Sentences for the record and the verdict's reasons when the transport may have
    /// held the load down: slow or refused connects, shed requests. Empty when clean.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.slow_connects > 0 {
            out.push(format!(
                "{} of {} connects took {:.0} ms or more (max {:.0} ms): the server's listen \
                 queue dropped SYNs, so those sessions started late",
                self.slow_connects, self.connects, SLOW_CONNECT_MS, self.connect_ms_max
            ));
        }
        if self.stalled_connects > 0 {
            out.push(format!(
                "{} connects stalled (no answer to the SYN: the server's listen queue was full) \
                 and were started again, the pacing widened to {:.1} ms between connects",
                self.stalled_connects, self.pacing_gap_ms_max
            ));
        }
        let retried = self.refused_retried + self.reset_retried;
        if retried > 0 {
            out.push(format!(
                "{retried} connects were refused or reset and tried again ({} refused, {} reset)",
                self.refused_retried, self.reset_retried
            ));
        }
        if self.failed + self.abandoned > 0 {
            out.push(format!(
                "{} connects never completed ({} failed, {} cut off by the round's timeout)",
                self.failed + self.abandoned,
                self.failed,
                self.abandoned
            ));
        }
        if self.shed_replies > 0 {
            out.push(format!(
                "the server shed load: {} replies were 429/503 ({} sent again after Retry-After)",
                self.shed_replies, self.shed_retried
            ));
        }
        out
    }
}

/// Where the client's in-flight requests were, on average, over the samples of a block
/// taken while the client held most of its load (at least 90% of its own peak): the
/// engine's running and queued gauges, the client's connects in progress, and the rest:
/// sent but neither running nor queued by the engine's own count (in the server's accept
/// queue or HTTP layer, or replies on their way back).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadGap {
    /// Samples averaged.
    pub samples: u64,
    /// The engine role the gap is measured against (its busiest).
    pub role: String,
    pub client_in_flight: f64,
    pub(crate) engine_running: f64,
    /// The engine's queued gauge; None where the engine reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) engine_queued: Option<f64>,
    pub connecting: f64,
    /// Requests the engines hold in their prefill/decode hand-over queues (SGLang's PD
    /// queue gauges), per role and queue, averaged like the rest; empty where no role
    /// reports such a gauge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) waiting: Vec<Waiting>,
    /// In flight at the client, not connecting, not running, queued or waiting at the
    /// engine.
    pub(crate) unaccounted: f64,
}

/// A gauge of requests an engine holds between prefill and decode, and what it means in
/// words (`waiting for KV transfer`): an engine preset's (config/engine.rs). With
/// `of_queue`, a part of the engine's queued gauge instead (vLLM's waiting requests by
/// reason): named inside the queued count, not subtracted from the gap again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitGauge {
    pub metric: String,
    pub words: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub of_queue: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Requests in one role's hand-over queue (or, `of_queue`, one reason's part of its
/// queue): one sample's count, or a block's average.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    pub role: String,
    pub words: String,
    pub requests: f64,
    #[serde(default, skip_serializing_if = "is_false")]
    pub of_queue: bool,
}

/// One metrics sample of the block: the client's counts and one engine role's gauges
/// taken at the same moment, with every role's hand-over queues at that moment.
#[derive(Debug, Clone, PartialEq)]
pub struct GapSample {
    pub client_in_flight: u64,
    pub connecting: u64,
    pub running: f64,
    pub queued: Option<f64>,
    pub waiting: Vec<Waiting>,
}

impl LoadGap {
    /// The gap over `samples` of `role`, or None when there is nothing to average (no
    /// sample with requests in flight).
    pub fn measure(role: &str, samples: &[GapSample]) -> Option<LoadGap> {
        let peak = samples.iter().map(|s| s.client_in_flight).max()?;
        if peak == 0 {
            return None;
        }
        let floor = (0.9 * peak as f64).ceil() as u64;
        let loaded: Vec<&GapSample> = samples
            .iter()
            .filter(|s| s.client_in_flight >= floor)
            .collect();
        let n = loaded.len() as f64;
        let mean = |f: &dyn Fn(&GapSample) -> f64| loaded.iter().map(|s| f(s)).sum::<f64>() / n;
        let client_in_flight = mean(&|s| s.client_in_flight as f64);
        let engine_running = mean(&|s| s.running);
        let engine_queued = loaded
            .iter()
            .all(|s| s.queued.is_some())
            .then(|| mean(&|s| s.queued.unwrap_or(0.0)));
        let connecting = mean(&|s| s.connecting as f64);
        // Each (role, queue) averaged over the loaded samples (a sample without it: 0).
        let mut waiting: Vec<Waiting> = Vec::new();
        for w in loaded.iter().flat_map(|s| &s.waiting) {
            if !waiting
                .iter()
                .any(|m| m.role == w.role && m.words == w.words)
            {
                waiting.push(Waiting {
                    requests: 0.0,
                    ..w.clone()
                });
            }
        }
        for m in &mut waiting {
            m.requests = mean(&|s| {
                s.waiting
                    .iter()
                    .filter(|w| w.role == m.role && w.words == m.words)
                    .map(|w| w.requests)
                    .sum()
            });
        }
        let waits: f64 = waiting
            .iter()
            .filter(|w| !w.of_queue)
            .map(|w| w.requests)
            .sum();
        let unaccounted =
            (client_in_flight - engine_running - engine_queued.unwrap_or(0.0) - waits - connecting)
                .max(0.0);
        Some(LoadGap {
            samples: loaded.len() as u64,
            role: role.to_string(),
            client_in_flight,
            engine_running,
            engine_queued,
            connecting,
            waiting,
            unaccounted,
        })
    }

    /// Whether the engine ran clearly fewer requests than the client had in flight
    /// (more than 10% and at least one request short).
    pub fn is_material(&self) -> bool {
        let short = self.client_in_flight - self.engine_running;
        short >= 1.0 && short > 0.1 * self.client_in_flight
    }

    /// "where the gap is" in words, e.g. "with 40.0 in flight at the client, decode ran
    /// 18.0: 2.0 connecting, 0.0 queued in the engine, 20.0 sent but not seen by the
    /// engine (its accept queue or HTTP layer)".
    pub fn describe(&self) -> String {
        let mut queued = match self.engine_queued {
            Some(q) => format!("{q:.1} queued in the engine"),
            None => "queue not reported by the engine".to_string(),
        };
        let reasons: Vec<String> = self
            .waiting
            .iter()
            .filter(|w| w.of_queue)
            .map(|w| format!("{:.1} {}", w.requests, w.words))
            .collect();
        if !reasons.is_empty() {
            queued.push_str(&format!(" ({})", reasons.join(", ")));
        }
        for w in self.waiting.iter().filter(|w| !w.of_queue) {
            queued.push_str(&format!(", {:.1} {} on {}", w.requests, w.words, w.role));
        }
        format!(
            "with {:.1} requests in flight at the client, {} ran {:.1} on average ({} samples): \
             {:.1} still connecting, {queued}, {:.1} sent but not seen by the engine (its \
             accept queue or HTTP layer, or replies in transit)",
            self.client_in_flight,
            self.role,
            self.engine_running,
            self.samples,
            self.connecting,
            self.unaccounted
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(client: u64, connecting: u64, running: f64, queued: Option<f64>) -> GapSample {
        GapSample {
            client_in_flight: client,
            connecting,
            running,
            queued,
            waiting: Vec::new(),
        }
    }

    #[test]
    fn the_gap_is_split_over_the_loaded_samples_only() {
        // Peak 40: samples below 36 (the ramp and the tail) are left out.
        let samples = [
            sample(10, 10, 0.0, Some(0.0)),
            sample(40, 4, 20.0, Some(6.0)),
            sample(38, 2, 18.0, Some(8.0)),
            sample(5, 0, 5.0, Some(0.0)),
        ];
        let gap = LoadGap::measure("decode", &samples).unwrap();
        assert_eq!(gap.samples, 2);
        assert_eq!(gap.client_in_flight, 39.0);
        assert_eq!(gap.engine_running, 19.0);
        assert_eq!(gap.engine_queued, Some(7.0));
        assert_eq!(gap.connecting, 3.0);
        // 39 - 19 - 7 - 3
        assert_eq!(gap.unaccounted, 10.0);
        assert!(gap.is_material());
        assert_eq!(
            gap.describe(),
            "with 39.0 requests in flight at the client, decode ran 19.0 on average (2 samples): \
             3.0 still connecting, 7.0 queued in the engine, 10.0 sent but not seen by the \
             engine (its accept queue or HTTP layer, or replies in transit)"
        );
    }

    /// SGLang prefill/decode: requests between the two engines are in their hand-over
    /// queues, not "sent but not seen": the gap names each queue in words.
    #[test]
    fn requests_in_the_pd_hand_over_queues_are_named_not_unseen() {
        let wait = |role: &str, words: &str, requests: f64| Waiting {
            role: role.into(),
            words: words.into(),
            requests,
            of_queue: false,
        };
        let mut loaded = sample(40, 0, 20.0, Some(0.0));
        loaded.waiting = vec![
            wait("decode", "waiting for KV transfer", 12.0),
            wait("prefill", "prefilled, KV being sent to decode", 4.0),
        ];
        let mut later = sample(40, 0, 22.0, Some(0.0));
        later.waiting = vec![wait("decode", "waiting for KV transfer", 8.0)];
        let gap = LoadGap::measure("decode", &[loaded, later]).unwrap();
        assert_eq!(
            gap.waiting,
            vec![
                wait("decode", "waiting for KV transfer", 10.0),
                wait("prefill", "prefilled, KV being sent to decode", 2.0),
            ]
        );
        // 40 - 21 - 0 - 10 - 2
        assert_eq!(gap.unaccounted, 7.0);
        assert_eq!(
            gap.describe(),
            "with 40.0 requests in flight at the client, decode ran 21.0 on average (2 samples): \
             0.0 still connecting, 0.0 queued in the engine, 10.0 waiting for KV transfer on \
             decode, 2.0 prefilled, KV being sent to decode on prefill, 7.0 sent but not seen by \
             the engine (its accept queue or HTTP layer, or replies in transit)"
        );
    }

    /// vLLM: its waiting requests by reason are parts of its queued gauge, named inside
    /// it and not taken from the gap a second time.
    #[test]
    fn the_queue_split_by_reason_is_named_inside_the_queued_count() {
        let reason = |words: &str, requests: f64| Waiting {
            role: "server".into(),
            words: words.into(),
            requests,
            of_queue: true,
        };
        let mut loaded = sample(8, 0, 4.0, Some(4.0));
        loaded.waiting = vec![
            reason("waiting for scheduling capacity", 3.0),
            reason("deferred", 1.0),
        ];
        let gap = LoadGap::measure("server", &[loaded]).unwrap();
        // 8 - 4 running - 4 queued: nothing unaccounted, the reasons not subtracted again.
        assert_eq!(gap.unaccounted, 0.0);
        assert_eq!(
            gap.describe(),
            "with 8.0 requests in flight at the client, server ran 4.0 on average (1 samples): \
             0.0 still connecting, 4.0 queued in the engine (3.0 waiting for scheduling \
             capacity, 1.0 deferred), 0.0 sent but not seen by the engine (its accept queue or \
             HTTP layer, or replies in transit)"
        );
    }

    #[test]
    fn an_engine_without_a_queue_gauge_and_an_idle_block() {
        let gap = LoadGap::measure("server", &[sample(4, 0, 4.0, None)]).unwrap();
        assert_eq!(gap.engine_queued, None);
        assert_eq!(gap.unaccounted, 0.0);
        assert!(!gap.is_material());
        assert!(gap.describe().contains("queue not reported by the engine"));
        assert_eq!(LoadGap::measure("server", &[sample(0, 0, 0.0, None)]), None);
        assert_eq!(LoadGap::measure("server", &[]), None);
    }

    #[test]
    fn transport_problems_are_worded_and_a_clean_block_has_none() {
        assert!(TransportStats::default().problems().is_empty());
        let stats = TransportStats {
            connects: 60,
            connect_ms_max: 1003.0,
            slow_connects: 7,
            refused_retried: 2,
            shed_replies: 5,
            shed_retried: 4,
            ..TransportStats::default()
        };
        let problems = stats.problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("7 of 60 connects took 500 ms or more (max 1003 ms)"));
        assert!(problems[1].starts_with("2 connects were refused or reset"));
        assert!(problems[2].contains("5 replies were 429/503 (4 sent again"));
    }
}
