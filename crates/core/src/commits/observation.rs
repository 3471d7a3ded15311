//! What the commit search is told about a commit: a block's counts, an A/B pair of the
//! flag's blocks (`--flag`), "could not tell" (weighs nothing), or "untestable".
//!
//! With `--flag NAME` the question is "since which commit does NAME on corrupt?", and a
//! tested commit runs two blocks, NAME on and NAME off ([`judge_pair`]). The oracle's
//! counts are the on arm's: the search's model (one unknown rate before the change and
//! one from it on, `posterior.rs`) then asks where the on arm's rate changes, which is
//! the question, and its Beta-binomial likelihood stays exact (a difference of two
//! counts is no binomial count). The off arm is the control that keeps the answer the
//! flag's: a pair whose off arm corrupts above the background (its Wilson 95% lower
//! bound above `background`, the rule by which `bisect probe` calls a build corrupted)
//! could not tell, since the corruption there is not the flag's and counting the on arm
//! would hand a change that corrupts with the flag off, too, to the flag. Below that
//! rule the off arm's counts are kept beside the search's: the verification asks them
//! whether the off arm at the culprit is clean ([`off_arm_clean`]), pooled over every pair
//! there, which shows what no single pair of 80 sessions could.

use serde::{Deserialize, Serialize};

use super::posterior::Counts;
use crate::format;
use crate::judgement::{Judged, Void};
use crate::stats::wilson;

/// What a block (or its build) gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Observation {
    Block {
        corrupted: u64,
        judged: u64,
    },
    /// The flag's A/B at the commit (`--flag`): the search counts `on`; `off` is the
    /// control, kept for the verification.
    Pair {
        on: Counts,
        off: Counts,
    },
    /// The block ran but its checks failed: weighs nothing.
    CouldNotTell {
        reason: String,
    },
    /// The commit cannot be built or run (build failure, exit 125).
    Untestable {
        reason: String,
    },
}

impl Observation {
    /// A block's observation from the one judgement of a block
    /// ([`crate::judgement`]): a void block, or one whose load fell short of the
    /// target (a load-dependent bug can hide below its load), could not tell.
    pub fn of_block(judgement: Result<Judged, Void>) -> Self {
        match judgement {
            Err(void) => Observation::CouldNotTell {
                reason: void.to_string(),
            },
            Ok(Judged {
                load_shortfall: Some(why),
                ..
            }) => Observation::CouldNotTell {
                reason: format!("the load fell short: {why}"),
            },
            Ok(j) => Observation::Block {
                corrupted: j.corrupted,
                judged: j.judged,
            },
        }
    }
}

/// The observation of `flag`'s A/B at a commit from its two blocks' own (`off` is `None`
/// when it was not run because the on arm could not tell): the on arm's counts with the
/// off arm's beside them, or "could not tell" when either arm could not, or when the off
/// arm corrupts above `background` (this module's header).
pub fn judge_pair(
    flag: &str,
    on: Observation,
    off: Option<Observation>,
    background: f64,
) -> Observation {
    let void = |reason: String| Observation::CouldNotTell { reason };
    let on = match on {
        Observation::Block { corrupted, judged } => Counts { corrupted, judged },
        Observation::CouldNotTell { reason } => return void(format!("{flag} on: {reason}")),
        other => return other,
    };
    let off = match off {
        Some(Observation::Block { corrupted, judged }) => Counts { corrupted, judged },
        Some(Observation::CouldNotTell { reason }) => return void(format!("{flag} off: {reason}")),
        Some(other) => return other,
        None => return void(format!("{flag} off was not run")),
    };
    let (lo, hi) = wilson(off.corrupted, off.judged, 0.95);
    if lo > background {
        return void(format!(
            "{flag} off corrupts too: {}/{} (95% CI {}-{}%) is above the background {}, so \
             the corruption at this commit is not the flag's (on: {}/{})",
            off.corrupted,
            off.judged,
            format::percent_digits(lo),
            format::percent_digits(hi),
            format::percent(background),
            on.corrupted,
            on.judged
        ));
    }
    Observation::Pair { on, off }
}

/// Whether `flag` off is clean at the culprit, all its pairs there pooled (`off`),
/// against the on arm's pooled counts there (`on`): not above `background` by the pair
/// rule ([`judge_pair`], now on the pooled counts, which may show what no single pair
/// did), and its Wilson 95% upper bound below the on arm's rate (the rule by which
/// `bisect probe` calls a build clean, the bug rate being what the on arm showed). With
/// the words either way.
pub(crate) fn off_arm_clean(
    flag: &str,
    off: Counts,
    on: Counts,
    background: f64,
) -> (bool, String) {
    let (lo, hi) = wilson(off.corrupted, off.judged, 0.95);
    let numbers = format!(
        "{flag} off there {}/{} ({}, 95% CI {}-{}%)",
        off.corrupted,
        off.judged,
        format::percent(off.rate()),
        format::percent_digits(lo),
        format::percent_digits(hi)
    );
    let on_rate = format::percent(on.rate());
    if lo > background {
        let background = format::percent(background);
        return (
            false,
            format!("{numbers} corrupts above the background {background}"),
        );
    }
    if off.judged > 0 && hi < on.rate() {
        (
            true,
            format!("{numbers}, clean: below the on arm's {on_rate}"),
        )
    } else {
        (
            false,
            format!("{numbers} does not rule out the on arm's {on_rate}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(corrupted: u64, judged: u64) -> Observation {
        Observation::Block { corrupted, judged }
    }

    #[test]
    fn a_pair_counts_the_on_arm_while_the_off_arm_stays_near_the_background() {
        // 1/80 off: Wilson 95% lower bound 0.2% <= 2%.
        assert_eq!(
            judge_pair("F", block(14, 80), Some(block(1, 80)), 0.02),
            Observation::Pair {
                on: Counts {
                    corrupted: 14,
                    judged: 80
                },
                off: Counts {
                    corrupted: 1,
                    judged: 80
                },
            }
        );
        // 4/80: lower 1.96%, still not above 2%.
        assert!(matches!(
            judge_pair("F", block(14, 80), Some(block(4, 80)), 0.02),
            Observation::Pair { .. }
        ));
    }

    #[test]
    fn an_off_arm_above_the_background_could_not_tell() {
        // 5/80 off: lower bound 2.7% > 2%: the corruption is not the flag's.
        match judge_pair("F", block(14, 80), Some(block(5, 80)), 0.02) {
            Observation::CouldNotTell { reason } => {
                assert!(
                    reason.starts_with("F off corrupts too: 5/80 (95% CI 2.7-"),
                    "{reason}"
                );
                assert!(reason.contains("not the flag's (on: 14/80)"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn either_arm_that_could_not_tell_voids_the_pair() {
        let short = || Observation::CouldNotTell {
            reason: "the load fell short".into(),
        };
        assert_eq!(
            judge_pair("F", short(), None, 0.02),
            Observation::CouldNotTell {
                reason: "F on: the load fell short".into()
            }
        );
        assert_eq!(
            judge_pair("F", block(3, 80), Some(short()), 0.02),
            Observation::CouldNotTell {
                reason: "F off: the load fell short".into()
            }
        );
        assert!(matches!(
            judge_pair("F", block(3, 80), None, 0.02),
            Observation::CouldNotTell { .. }
        ));
    }

    #[test]
    fn the_off_arm_is_clean_when_it_rules_out_the_on_arms_rate() {
        let c = |corrupted, judged| Counts { corrupted, judged };
        // 0/240: Wilson upper 1.6% < 15%.
        let (clean, words) = off_arm_clean("F", c(0, 240), c(36, 240), 0.02);
        assert!(clean, "{words}");
        assert_eq!(
            words,
            "F off there 0/240 (0.0%, 95% CI 0.0-1.6%), clean: below the on arm's 15.0%"
        );
        // 2/80 off vs 4/80 on: upper 8.7% >= 5%.
        let (clean, words) = off_arm_clean("F", c(2, 80), c(4, 80), 0.02);
        assert!(!clean);
        assert!(
            words.ends_with("does not rule out the on arm's 5.0%"),
            "{words}"
        );
        assert!(!off_arm_clean("F", c(0, 0), c(4, 80), 0.02).0);
        // 24/480 off (5%): every pair of 80 passed the pair rule (4/80), pooled the
        // Wilson lower bound is 3.4% > 2%: not the flag's, though below the on arm's 10%.
        let (clean, words) = off_arm_clean("F", c(24, 480), c(48, 480), 0.02);
        assert!(!clean);
        assert!(
            words.starts_with("F off there 24/480 (5.0%, 95% CI 3.4-")
                && words.ends_with("corrupts above the background 2.0%"),
            "{words}"
        );
    }

    #[test]
    fn a_block_observation_from_the_one_judgement() {
        let judged = |load_shortfall: Option<&str>| Judged {
            corrupted: 3,
            judged: 78,
            sessions: 80,
            failed: 2,
            truncated: 0,
            load_shortfall: load_shortfall.map(str::to_string),
        };
        assert_eq!(Observation::of_block(Ok(judged(None))), block(3, 78));
        assert_eq!(
            Observation::of_block(Ok(judged(Some("reached at most 10")))),
            Observation::CouldNotTell {
                reason: "the load fell short: reached at most 10".into()
            }
        );
        assert_eq!(
            Observation::of_block(Err(Void::NoSession)),
            Observation::CouldNotTell {
                reason: "no session finished".into()
            }
        );
    }
}
