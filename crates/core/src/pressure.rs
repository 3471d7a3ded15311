//! Pressure as a controlled variable (docs/design.md 3.4 "Pressure"): the share of the
//! engine's KV cache the sessions in flight fill. bisect reads the engine's capacity
//! after a restart (harness: arm/capacity.rs) and sizes each session's filler context so
//! that `in_flight` sessions at their last round fill `pressure` of it, instead of a
//! hand-picked `--ctx`. Where the engine gives each request a slot of its own
//! (llama.cpp), the share is of the slots the sessions occupy, each capped at its slot.
//!
//! The tokens a session holds are estimated from the workload itself (the filler's own
//! [`crate::task::approx_tokens`], the tool schemas, and a tool call and its result per
//! round), so the occupancy is approximate; whether the flag's path then ran is what its
//! witnesses say (core::mechanism), and pressure only aims the workload at it.

use serde::{Deserialize, Serialize};

use crate::task::approx_tokens;
use crate::workload::Workload;

/// Tokens a round adds to a conversation besides the first: the model's tool call and
/// the tool's result (the built-in workloads' results are one or two sentences).
pub const ROUND_TOKENS: u64 = 60;

/// What an engine can hold, as it reported it after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// KV-cache tokens of the whole engine (all slots, all blocks).
    pub kv_tokens: u64,
    /// Slots when every request gets one of its own (llama.cpp `total_slots`), whose
    /// share of the cache is `kv_tokens / slots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u64>,
    /// Where it was read, in words ("/props: n_ctx 8192, total_slots 4").
    pub source: String,
}

/// The filler context chosen for a pressure, and what it aims at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sizing {
    pub pressure: f64,
    pub capacity: Capacity,
    pub in_flight: u64,
    /// The estimated tokens of a session at its last round without filler.
    pub base_tokens: u64,
    /// The `--ctx` chosen.
    pub ctx: u32,
    /// The estimated share of the cache filled at the last round, after caps.
    pub aimed: f64,
    /// Why the aim falls short of `pressure`, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
}

impl Sizing {
    pub fn words(&self) -> String {
        let mut s = format!(
            "pressure {:.0}% of {} KV tokens ({}) at {} in flight: --ctx {} (about {} tokens a \
             session at its last round, {:.0}% of the cache)",
            100.0 * self.pressure,
            self.capacity.kv_tokens,
            self.capacity.source,
            self.in_flight,
            self.ctx,
            self.base_tokens + u64::from(self.ctx),
            100.0 * self.aimed
        );
        if let Some(why) = &self.short {
            s.push_str(&format!("; short of the aim: {why}"));
        }
        s
    }
}

/// A session's estimated tokens at its last round with no filler: the opening
/// conversation (system prompt and first task), the tool schemas, and
/// [`ROUND_TOKENS`] for every round after the first.
pub fn base_tokens(workload: &Workload) -> u64 {
    let mut w = workload.clone();
    w.ctx = 0;
    let (_, messages) = crate::task::initial_conversation(&w, 0);
    let text: usize = messages
        .iter()
        .map(|m| m.content.as_deref().map_or(0, approx_tokens))
        .sum();
    // What the engine's template renders of each tool: its name, description and schema.
    let tools: usize = workload
        .tools
        .iter()
        .map(|t| {
            approx_tokens(&t.name)
                + approx_tokens(&t.description)
                + approx_tokens(&t.parameters.to_string())
        })
        .sum();
    (text + tools) as u64 + ROUND_TOKENS * u64::from(workload.rounds.saturating_sub(1))
}

/// The filler context that puts `in_flight` sessions of `base` tokens (at ctx 0) at
/// `pressure` of `capacity`. With slots, the sessions occupy `min(in_flight, slots)` of
/// them and none can outgrow its slot (capped at 90% of it, room for the reply).
pub fn size(capacity: &Capacity, pressure: f64, in_flight: u64, base: u64) -> Sizing {
    let in_flight = in_flight.max(1);
    let total = capacity.kv_tokens as f64;
    let (per_session, cap) = match capacity.slots {
        Some(slots) if slots > 0 => {
            let slot = total / slots as f64;
            let used = in_flight.min(slots) as f64;
            (
                pressure * total / used,
                Some((0.9 * slot, used / slots as f64)),
            )
        }
        _ => (pressure * total / in_flight as f64, None),
    };
    let mut short = None;
    let per_session = match cap {
        Some((limit, share)) if per_session > limit => {
            short = Some(format!(
                "{in_flight} in flight fill {} of {} slots, each holding at most {:.0} tokens",
                (share * capacity.slots.unwrap_or(1) as f64).round(),
                capacity.slots.unwrap_or(1),
                limit / 0.9
            ));
            limit
        }
        _ => per_session,
    };
    let ctx = (per_session - base as f64).max(0.0).round();
    if ctx == 0.0 && per_session < base as f64 {
        short = Some(format!(
            "a session holds about {base} tokens without filler, more than the {per_session:.0} the aim gives it"
        ));
    }
    let ctx = ctx.min(f64::from(u32::MAX)) as u32;
    let held = (base + u64::from(ctx)) as f64
        * match capacity.slots {
            Some(slots) if slots > 0 => in_flight.min(slots) as f64,
            _ => in_flight as f64,
        };
    Sizing {
        pressure,
        capacity: capacity.clone(),
        in_flight,
        base_tokens: base,
        ctx,
        aimed: if total > 0.0 { held / total } else { 0.0 },
        short,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The #12253 hunt by hand: llama.cpp 0.3.8 with `-c 8192` and 4 slots (2048 cells
    /// each), 4 in flight, found defrag at `--ctx 600` (docs/real-engines.md). Half the
    /// cache at 4 in flight is 1024 tokens a session: with a 420-token base, ctx 604.
    #[test]
    fn slots_share_the_cache_and_cap_each_session() {
        let llama = Capacity {
            kv_tokens: 8192,
            slots: Some(4),
            source: "/props".into(),
        };
        let s = size(&llama, 0.5, 4, 420);
        assert_eq!(s.ctx, 604);
        assert!((s.aimed - 0.5).abs() < 1e-9, "{s:?}");
        assert_eq!(s.short, None);
        // One in flight cannot fill half of four slots: capped at 90% of its own.
        let one = size(&llama, 0.5, 1, 420);
        assert_eq!(one.ctx, (0.9f64 * 2048.0 - 420.0).round() as u32);
        assert!(
            one.short.as_deref().unwrap().contains("fill 1 of 4 slots"),
            "{one:?}"
        );
        assert!(one.aimed < 0.25);
    }

    /// vLLM's KV_BLOCKS on arm: 40 blocks of 128 tokens, shared by the requests in flight.
    #[test]
    fn a_shared_cache_is_split_over_the_sessions_in_flight() {
        let vllm = Capacity {
            kv_tokens: 40 * 128,
            slots: None,
            source: "cache_config_info".into(),
        };
        let s = size(&vllm, 1.2, 4, 500);
        assert_eq!(s.ctx, (1.2f64 * 5120.0 / 4.0 - 500.0).round() as u32);
        assert!((s.aimed - 1.2).abs() < 1e-9);
        // A base bigger than the share: no filler, and the record says why.
        let tight = size(&vllm, 0.1, 4, 500);
        assert_eq!(tight.ctx, 0);
        assert!(tight.short.unwrap().contains("about 500 tokens"));
    }

    #[test]
    fn the_base_grows_with_rounds_and_tools() {
        let mut w = crate::workload::sample_workload(4, 1);
        let one = base_tokens(&w);
        w.rounds = 4;
        assert_eq!(base_tokens(&w), one + 3 * ROUND_TOKENS);
        assert!(one > 50, "{one}");
    }
}
