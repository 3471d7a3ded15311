//! One judgement of an arm block: the checks every command makes before a block's
//! sessions count as evidence (docs/design.md 3.8, docs/commits.md), as a pure function
//! of plain values a command extracts from its record. `bisect probe` puts its Wilson
//! decision rule on top; `bisect commits` turns it into its three-valued observation.
//!
//! In this order, each voiding the block (it weighs nothing, it is never clean):
//! 1. an engine that was another process at the end than after the restart (a crash its
//!    supervisor recovered): part of the sessions ran on an engine the command did not
//!    start for this block;
//! 2. no session finished;
//! 3. degraded: more than `degraded_fraction` of the sessions errored or timed out;
//! 4. no session could show corruption (every one failed or was truncated at
//!    max_tokens);
//! 5. an engine died during the block and no session was corrupted: an engine that
//!    dies is evidence (core::deaths), never a clean block; corruption seen beside a
//!    death is still the bug seen, and the block is judged.
//!
//! Otherwise the block is judged: k corrupted (rejected replies included) of n judged
//! sessions (neither failed nor truncated, `Counts::judged`). Whether the load reached
//! the target (`confounds::load_shortfall`) is handed on, not decided here: a
//! load-dependent bug cannot be ruled out below its load, but corruption seen below it is
//! still the bug seen, so each caller weighs the shortfall by what it concludes.

use crate::session::Counts;
use crate::session::SessionClass;

/// What a block gave, extracted from its record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockFacts {
    /// The block's sessions by class.
    pub counts: Counts,
    /// One line per engine that was another process at the end than after the restart.
    pub engine_replaced: Vec<String>,
    /// One line per engine death during the block (core::deaths).
    pub deaths: Vec<String>,
    /// Why the block's load does not count as the target's, when it does not.
    pub load_shortfall: Option<String>,
}

/// Why a block weighs nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Void {
    /// The engines' replacements, joined by "; ".
    EngineReplaced(String),
    NoSession,
    Degraded {
        failed: u64,
        sessions: u64,
    },
    NothingJudged {
        truncated: u64,
        failed: u64,
        sessions: u64,
    },
    /// The engine died during a block that showed no corruption: the deaths' lines.
    EngineDied(Vec<String>),
}

impl std::fmt::Display for Void {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Void::EngineReplaced(lines) => write!(f, "an engine changed during the block: {lines}"),
            Void::NoSession => write!(f, "no session finished"),
            Void::Degraded { failed, sessions } => write!(
                f,
                "degraded: {failed}/{sessions} sessions errored or timed out"
            ),
            Void::NothingJudged {
                truncated,
                sessions,
                ..
            } => write!(
                f,
                "no session could show corruption: {truncated} of {sessions} truncated"
            ),
            Void::EngineDied(deaths) => write!(
                f,
                "the engine died during the block ({} death{}: {}): an engine that dies is never clean",
                deaths.len(),
                if deaths.len() == 1 { "" } else { "s" },
                deaths.join("; ")
            ),
        }
    }
}

/// A block that counts: `corrupted` of `judged`, and the load's shortfall if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub corrupted: u64,
    pub judged: u64,
    /// Sessions of the block, judged or not (the denominator of the degraded rule).
    pub sessions: u64,
    pub failed: u64,
    pub truncated: u64,
    pub load_shortfall: Option<String>,
}

/// The checks of this module's header.
pub fn judge_block(facts: &BlockFacts, degraded_fraction: f64) -> Result<Judged, Void> {
    let counts = &facts.counts;
    let (failed, sessions, judged) = (counts.failed(), counts.total(), counts.judged());
    if !facts.engine_replaced.is_empty() {
        return Err(Void::EngineReplaced(facts.engine_replaced.join("; ")));
    }
    if sessions == 0 {
        return Err(Void::NoSession);
    }
    if failed as f64 > degraded_fraction * sessions as f64 {
        return Err(Void::Degraded { failed, sessions });
    }
    if judged == 0 {
        return Err(Void::NothingJudged {
            truncated: counts[SessionClass::Truncated],
            failed,
            sessions,
        });
    }
    if !facts.deaths.is_empty() && counts.corrupted() == 0 {
        return Err(Void::EngineDied(facts.deaths.clone()));
    }
    Ok(Judged {
        corrupted: counts.corrupted(),
        judged,
        sessions,
        failed,
        truncated: counts[SessionClass::Truncated],
        load_shortfall: facts.load_shortfall.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_whose_engine_died_is_never_clean_but_its_corruption_counts() {
        let died = BlockFacts {
            deaths: vec!["role server killed by SIGSEGV (signal 11) at 3.0 s with 4 in flight (the client's count)".into()],
            ..facts(0, 0, 0, 20)
        };
        let void = judge_block(&died, 0.2).unwrap_err();
        assert!(matches!(void, Void::EngineDied(_)));
        assert!(
            void.to_string().starts_with(
                "the engine died during the block (1 death: role server killed by SIGSEGV"
            ),
            "{void}"
        );
        let corrupted = BlockFacts {
            deaths: died.deaths.clone(),
            ..facts(3, 0, 0, 20)
        };
        assert_eq!(judge_block(&corrupted, 0.2).unwrap().corrupted, 3);
    }

    /// `corrupted` bad_args, `failed` timeouts, `truncated`, the rest done, of `sessions`.
    fn facts(corrupted: u64, failed: u64, truncated: u64, sessions: u64) -> BlockFacts {
        BlockFacts {
            counts: Counts::from([
                (SessionClass::BadArgs, corrupted),
                (SessionClass::Timeout, failed),
                (SessionClass::Truncated, truncated),
                (
                    SessionClass::Done,
                    sessions - corrupted - failed - truncated,
                ),
            ]),
            ..BlockFacts::default()
        }
    }

    #[test]
    fn a_block_counts_its_judged_sessions() {
        let j = judge_block(&facts(12, 2, 3, 80), 0.10).unwrap();
        // 80 - 2 failed - 3 truncated = 75 judged.
        assert_eq!((j.corrupted, j.judged, j.sessions), (12, 75, 80));
        assert_eq!((j.failed, j.truncated), (2, 3));
        assert_eq!(j.load_shortfall, None);
        // Rejected replies count as corrupted.
        let mut rejected = facts(0, 0, 0, 80);
        rejected.counts[SessionClass::Rejected] = 4;
        rejected.counts[SessionClass::Done] = 76;
        assert_eq!(judge_block(&rejected, 0.10).unwrap().corrupted, 4);
    }

    #[test]
    fn the_degraded_share_is_exclusive() {
        // 8 of 80 is exactly 10%: not over it. 9 is.
        assert!(judge_block(&facts(0, 8, 0, 80), 0.10).is_ok());
        assert_eq!(
            judge_block(&facts(0, 9, 0, 80), 0.10),
            Err(Void::Degraded {
                failed: 9,
                sessions: 80
            })
        );
        assert_eq!(
            Void::Degraded {
                failed: 9,
                sessions: 80
            }
            .to_string(),
            "degraded: 9/80 sessions errored or timed out"
        );
    }

    #[test]
    fn nothing_judged_or_nothing_run_is_void() {
        assert_eq!(
            judge_block(&facts(0, 0, 80, 80), 0.10),
            Err(Void::NothingJudged {
                truncated: 80,
                failed: 0,
                sessions: 80
            })
        );
        assert_eq!(
            judge_block(&BlockFacts::default(), 0.10),
            Err(Void::NoSession)
        );
    }

    #[test]
    fn a_replaced_engine_voids_first_and_the_load_is_handed_on() {
        let mut f = facts(14, 40, 0, 80);
        f.engine_replaced = vec!["role decode: pid 1 -> 2".into(), "role prefill".into()];
        // Checked before the degraded share (40 of 80 failed here).
        assert_eq!(
            judge_block(&f, 0.10),
            Err(Void::EngineReplaced(
                "role decode: pid 1 -> 2; role prefill".into()
            ))
        );
        let mut short = facts(3, 0, 0, 80);
        short.load_shortfall = Some("reached at most 10".into());
        let j = judge_block(&short, 0.10).unwrap();
        assert_eq!(j.load_shortfall.as_deref(), Some("reached at most 10"));
        assert_eq!((j.corrupted, j.judged), (3, 80));
    }
}
