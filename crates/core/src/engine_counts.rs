//! What an engine counted itself during one arm block, read from its own counters
//! (docs/design.md 3.6): requests it preempted, and replies its tool-call parser found
//! a call in or not. bisect's classes come from the replies it received; these are the
//! engine's side of the same events, recorded beside them so a reader can tell "the
//! model wrote no call" (the engine's parser agrees) from "the engine lost the call
//! between parser and client" (it does not), and can see preemption, the recompute path
//! a KV-cache shortage sends requests down, in an arm that corrupts. Also how long each
//! role was busy, which decides whether its sampled peak is compared between arms.
//!
//! Pure: the metrics poller (driver/metrics.rs) fills in the counts from the counters a
//! preset names (config/engine.rs); the verdict words them as a recorded confound.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An engine counter bisect reads, by meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineCounter {
    /// Requests the scheduler preempted (vLLM `vllm:num_preemptions_total`): their KV
    /// cache was dropped for lack of room and recomputed later.
    Preemptions,
    /// Whole replies in which the engine's tool-call parser found a call (vLLM
    /// `vllm:tool_call_parser_invocations_total{mode="non_streaming",outcome="tool_call"}`).
    ParsedCall,
    /// Whole replies in which it found none (`outcome="no_tool_call"`).
    ParsedNoCall,
    /// Milliseconds the role's running gauge read above zero (the embedded engine's
    /// `bisect_engine_busy_seconds_total`, read in seconds, counted in ms): over the
    /// block's wall time, the chance a sample of that gauge saw the role busy, which
    /// says whether its sampled peak can show its load (confounds::recorded,
    /// docs/design.md 3.7 "Peaks that mean something"). Not worded by [`describe`]: the
    /// peak comparison says it where it matters.
    BusyMs,
}

impl EngineCounter {
    fn words(self, n: u64) -> String {
        match self {
            EngineCounter::Preemptions => format!("{n} preemptions"),
            EngineCounter::ParsedCall => format!("{n} replies with a tool call"),
            EngineCounter::ParsedNoCall => format!("{n} replies without one"),
            EngineCounter::BusyMs => format!("busy {n} ms"),
        }
    }

    /// This counter's counts per unit of the engine's own counter: 1000 for
    /// [`EngineCounter::BusyMs`] (the engine counts seconds), else 1.
    pub fn per_unit(self) -> f64 {
        match self {
            EngineCounter::BusyMs => 1000.0,
            _ => 1.0,
        }
    }
}

/// One role's count of one counter over a block: the counter's last value less its
/// first (a counter that went down, an engine that restarted, counts from zero again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCount {
    pub role: String,
    pub counter: EngineCounter,
    pub count: u64,
}

/// The increase of a counter over a series of scrapes: rises add up; a fall is a reset
/// (the process restarted and counts from zero), after which the new value is the rise.
pub fn increase(values: &[f64]) -> u64 {
    let mut total = 0.0;
    for pair in values.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        total += if b >= a { b - a } else { b };
    }
    total.round() as u64
}

/// Several blocks' counts of one arm added up per (role, counter), in a fixed order.
pub fn pool<'a>(blocks: impl IntoIterator<Item = &'a [EngineCount]>) -> Vec<EngineCount> {
    let mut sums: BTreeMap<(String, EngineCounter), u64> = BTreeMap::new();
    for counts in blocks {
        for c in counts {
            *sums.entry((c.role.clone(), c.counter)).or_default() += c.count;
        }
    }
    sums.into_iter()
        .map(|((role, counter), count)| EngineCount {
            role,
            counter,
            count,
        })
        .collect()
}

/// "decode: 3 preemptions; its tool-call parser: 40 replies with a tool call, 2
/// replies without one", or None when nothing was counted.
pub fn describe(counts: &[EngineCount]) -> Option<String> {
    let mut roles: Vec<&str> = counts
        .iter()
        .filter(|c| c.counter != EngineCounter::BusyMs)
        .map(|c| c.role.as_str())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    let parts: Vec<String> = roles
        .iter()
        .map(|role| {
            let of = |counter: EngineCounter| {
                counts
                    .iter()
                    .find(|c| c.role == *role && c.counter == counter)
                    .map(|c| c.count)
            };
            let mut said = Vec::new();
            if let Some(n) = of(EngineCounter::Preemptions) {
                said.push(EngineCounter::Preemptions.words(n));
            }
            let parsed: Vec<String> = [EngineCounter::ParsedCall, EngineCounter::ParsedNoCall]
                .into_iter()
                .filter_map(|c| Some(c.words(of(c)?)))
                .collect();
            if !parsed.is_empty() {
                said.push(format!("its tool-call parser: {}", parsed.join(", ")));
            }
            format!("{role}: {}", said.join("; "))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The count of `counter` over every role, None when no role counted it.
pub fn total(counts: &[EngineCount], counter: EngineCounter) -> Option<u64> {
    let mut found = counts.iter().filter(|c| c.counter == counter).peekable();
    found.peek()?;
    Some(found.map(|c| c.count).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(role: &str, counter: EngineCounter, count: u64) -> EngineCount {
        EngineCount {
            role: role.into(),
            counter,
            count,
        }
    }

    #[test]
    fn a_counter_reset_counts_from_zero_again() {
        assert_eq!(increase(&[5.0, 7.0, 7.0, 9.0]), 4);
        // The engine restarted between the 2nd and 3rd scrape: 2 before, 3 after.
        assert_eq!(increase(&[5.0, 7.0, 1.0, 3.0]), 2 + 1 + 2);
        assert_eq!(increase(&[4.0]), 0);
        assert_eq!(increase(&[]), 0);
    }

    #[test]
    fn blocks_pool_per_role_and_counter_and_are_worded_per_role() {
        let a = vec![
            count("server", EngineCounter::ParsedNoCall, 2),
            count("server", EngineCounter::Preemptions, 0),
        ];
        let b = vec![
            count("server", EngineCounter::ParsedNoCall, 1),
            count("server", EngineCounter::ParsedCall, 30),
        ];
        let pooled = pool([a.as_slice(), b.as_slice()]);
        assert_eq!(
            pooled,
            vec![
                count("server", EngineCounter::Preemptions, 0),
                count("server", EngineCounter::ParsedCall, 30),
                count("server", EngineCounter::ParsedNoCall, 3),
            ]
        );
        assert_eq!(
            describe(&pooled).unwrap(),
            "server: 0 preemptions; its tool-call parser: 30 replies with a tool call, 3 \
             replies without one"
        );
        assert_eq!(total(&pooled, EngineCounter::ParsedNoCall), Some(3));
        assert_eq!(describe(&[]), None);
        assert_eq!(total(&[], EngineCounter::Preemptions), None);
    }
}
