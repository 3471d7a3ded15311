//! Pressure as a controlled variable (docs/design.md 3.4 "Pressure"): the share of the
//! engine's KV cache the sessions in flight fill. bisect reads the engine's capacity
//! after a restart (harness: arm/capacity.rs) and sizes each session's filler context so
//! that `in_flight` sessions at their last round fill `pressure` of it, instead of a
//! hand-picked `--ctx`. Where the engine gives each request a slot of its own
//! (llama.cpp), the share is of the slots the sessions occupy, each capped at its slot.
//!
//! The tokens a session holds are counted by the engine where it can ([`Tokens::counted`]:
//! `usage.prompt_tokens` of session 0's opening request at ctx 0 and with filler, a line
//! through the two), else estimated from the workload itself ([`Tokens::estimated`]: the
//! filler's own [`crate::task::approx_tokens`], the tool schemas); a tool call and its
//! result per later round are estimated either way ([`ROUND_TOKENS`]). The occupancy is
//! an aim; whether the flag's path then ran is what its witnesses say (core::mechanism).

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
    /// The tokens of a session at its last round without filler.
    pub base_tokens: u64,
    /// The tokens a filler token of `--ctx` adds, by the engine's count (1 estimated).
    #[serde(default = "one")]
    pub per_ctx: f64,
    /// Whether the engine counted the tokens, or why they were estimated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<TokenCount>,
    /// The `--ctx` chosen.
    pub ctx: u32,
    /// The estimated share of the cache filled at the last round, after caps.
    pub aimed: f64,
    /// Why the aim falls short of `pressure`, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
}

fn one() -> f64 {
    1.0
}

/// The engine's own count of session 0's opening request (`usage.prompt_tokens`), at
/// ctx 0 and at a filler of `ctx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counted {
    pub at_zero: u64,
    pub ctx: u32,
    pub at_ctx: u64,
}

/// Where a sizing's tokens came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenCount {
    /// The engine's count.
    Counted(Counted),
    /// The workload's estimate, and why the engine's count is not used.
    Estimated(String),
}

/// How a session's tokens at its last round follow `--ctx`: `base + per_ctx * ctx`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokens {
    pub base: u64,
    pub per_ctx: f64,
    /// Where the line came from: the engine's count, or why it could not be had.
    pub count: TokenCount,
}

impl Tokens {
    /// From the workload alone ([`base_tokens`], one token a filler token); `why` says
    /// why the engine's count is not used.
    pub fn estimated(workload: &Workload, why: impl Into<String>) -> Tokens {
        Tokens {
            base: base_tokens(workload),
            per_ctx: 1.0,
            count: TokenCount::Estimated(why.into()),
        }
    }

    /// From the engine's count: its prompt at ctx 0 is the base's opening (template,
    /// tools and all, as its tokenizer sees them), the rise to `ctx` the filler's rate;
    /// the later rounds' call and result ([`ROUND_TOKENS`] each, in the filler's
    /// estimate) are scaled by that rate. A count that does not rise with the filler
    /// (an engine that truncates, or reports something else) is refused, and the
    /// caller estimates instead, saying why.
    pub fn counted(workload: &Workload, counted: Counted) -> Result<Tokens, String> {
        if counted.ctx == 0 || counted.at_ctx <= counted.at_zero {
            return Err(format!(
                "the engine counted {} prompt tokens at ctx 0 and {} at ctx {}: no rise with the filler",
                counted.at_zero, counted.at_ctx, counted.ctx
            ));
        }
        let per_ctx = (counted.at_ctx - counted.at_zero) as f64 / f64::from(counted.ctx);
        let later = ROUND_TOKENS * u64::from(workload.rounds.saturating_sub(1));
        Ok(Tokens {
            base: counted.at_zero + (later as f64 * per_ctx).round() as u64,
            per_ctx,
            count: TokenCount::Counted(counted),
        })
    }
}

impl Sizing {
    /// A session's tokens at its last round, by the sizing's line.
    pub fn session_tokens(&self) -> u64 {
        self.base_tokens + (self.per_ctx * f64::from(self.ctx)).round() as u64
    }

    pub fn words(&self) -> String {
        let mut s = format!(
            "pressure {:.0}% of {} KV tokens ({}) at {} in flight: --ctx {} (about {} tokens a \
             session at its last round, {:.0}% of the cache)",
            100.0 * self.pressure,
            self.capacity.kv_tokens,
            self.capacity.source,
            self.in_flight,
            self.ctx,
            self.session_tokens(),
            100.0 * self.aimed
        );
        match &self.count {
            Some(TokenCount::Counted(c)) => s.push_str(&format!(
                "; tokens counted by the engine: {} prompt tokens at ctx 0, {} at ctx {} ({:.2} a \
                 filler token)",
                c.at_zero, c.at_ctx, c.ctx, self.per_ctx
            )),
            Some(TokenCount::Estimated(why)) => s.push_str(&format!("; tokens estimated ({why})")),
            None => {}
        }
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

/// The filler context that puts `in_flight` sessions of `tokens` at `pressure` of
/// `capacity`. With slots, the sessions occupy `min(in_flight, slots)` of them and none
/// can outgrow its slot (capped at 90% of it, room for the reply).
pub fn size(capacity: &Capacity, pressure: f64, in_flight: u64, tokens: &Tokens) -> Sizing {
    let base = tokens.base;
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
    let ctx = ((per_session - base as f64) / tokens.per_ctx)
        .max(0.0)
        .round();
    if ctx == 0.0 && per_session < base as f64 {
        short = Some(format!(
            "a session holds about {base} tokens without filler, more than the {per_session:.0} the aim gives it"
        ));
    }
    let ctx = ctx.min(f64::from(u32::MAX)) as u32;
    let held = (base as f64 + tokens.per_ctx * f64::from(ctx))
        * match capacity.slots {
            Some(slots) if slots > 0 => in_flight.min(slots) as f64,
            _ => in_flight as f64,
        };
    Sizing {
        pressure,
        capacity: capacity.clone(),
        in_flight,
        base_tokens: base,
        per_ctx: tokens.per_ctx,
        count: Some(tokens.count.clone()),
        ctx,
        aimed: if total > 0.0 { held / total } else { 0.0 },
        short,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guessed(base: u64) -> Tokens {
        Tokens {
            base,
            per_ctx: 1.0,
            count: TokenCount::Estimated("a test".into()),
        }
    }

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
        let s = size(&llama, 0.5, 4, &guessed(420));
        assert_eq!(s.ctx, 604);
        assert!((s.aimed - 0.5).abs() < 1e-9, "{s:?}");
        assert_eq!(s.short, None);
        // One in flight cannot fill half of four slots: capped at 90% of its own.
        let one = size(&llama, 0.5, 1, &guessed(420));
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
        let s = size(&vllm, 1.2, 4, &guessed(500));
        assert_eq!(s.ctx, (1.2f64 * 5120.0 / 4.0 - 500.0).round() as u32);
        assert!((s.aimed - 1.2).abs() < 1e-9);
        // A base bigger than the share: no filler, and the record says why.
        let tight = size(&vllm, 0.1, 4, &guessed(500));
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

    /// A tokenizer that makes 1.3 tokens of every estimated filler token, and an
    /// opening 80 tokens longer than the estimate: the counted line sizes the filler
    /// so the engine's own tokens meet the aim, where the estimate would overshoot.
    #[test]
    fn the_engines_count_sizes_the_filler_in_its_own_tokens() {
        let mut w = crate::workload::sample_workload(4, 1);
        w.rounds = 3;
        let estimate = Tokens::estimated(&w, "a test");
        let at_zero = estimate.base - 2 * ROUND_TOKENS + 80;
        let counted = Tokens::counted(
            &w,
            Counted {
                at_zero,
                ctx: 1000,
                at_ctx: at_zero + 1300,
            },
        )
        .unwrap();
        assert!((counted.per_ctx - 1.3).abs() < 1e-12);
        assert_eq!(counted.base, at_zero + 156);
        let vllm = Capacity {
            kv_tokens: 40 * 128,
            slots: None,
            source: "cache_config_info".into(),
        };
        let s = size(&vllm, 1.0, 4, &counted);
        assert_eq!(s.ctx, ((1280.0 - counted.base as f64) / 1.3).round() as u32);
        assert!((s.aimed - 1.0).abs() < 0.002, "{s:?}");
        assert!(s.words().contains("1.30 a filler token"), "{}", s.words());
        // The estimate's filler, in the engine's tokens, overshoots the aim.
        let guessed = size(&vllm, 1.0, 4, &estimate);
        assert!(f64::from(guessed.ctx) * 1.3 + at_zero as f64 > 1280.0);
        assert!(guessed.words().contains("tokens estimated (a test)"));
    }

    #[test]
    fn a_count_that_does_not_rise_with_the_filler_is_refused() {
        let w = crate::workload::sample_workload(4, 1);
        for (at_zero, ctx, at_ctx) in [(400, 1000, 400), (400, 0, 900), (400, 1000, 390)] {
            let why = Tokens::counted(
                &w,
                Counted {
                    at_zero,
                    ctx,
                    at_ctx,
                },
            )
            .unwrap_err();
            assert!(why.contains("no rise with the filler"), "{why}");
        }
    }

    /// Records written before the count was kept still read.
    #[test]
    fn a_sizing_without_a_count_reads_as_estimated_one_to_one() {
        let s = size(
            &Capacity {
                kv_tokens: 1000,
                slots: None,
                source: "x".into(),
            },
            0.5,
            1,
            &guessed(100),
        );
        let mut json = serde_json::to_value(&s).unwrap();
        let map = json.as_object_mut().unwrap();
        map.remove("per_ctx");
        map.remove("count");
        let old: Sizing = serde_json::from_value(json).unwrap();
        assert_eq!(old.per_ctx, 1.0);
        assert_eq!(old.count, None);
        assert_eq!(old.session_tokens(), 500);
    }
}
