//! A culprit block on replica sets (docs/culprit.md, "Replica sets"): every block the
//! search asks for runs on several sets at once, each set driving its own share of the
//! block's sessions at the full load, and the shares come back as one block.
//!
//! Why split each block rather than give the sets different blocks: every step of the
//! search is compared with both ends' blocks, and the next configuration is chosen from
//! the last step's answer (ddmin is sequential). Different configurations on different
//! sets would put a set's own difference (another build, a warmer cache, a bad GPU) into
//! those comparisons. A block split evenly over the sets holds every set in the same
//! proportion in every configuration, so a set's own rate enters every configuration
//! alike and cancels in their comparisons, as a replica does in `bisect run`'s crossover
//! (Jones & Kenward, *Design and Analysis of Cross-Over Trials*, 3rd ed., 2014, ch. 2);
//! [`replica_check`] tests and reports it.
//!
//! The load is never lowered, and it is held, not only reached: a set's share is driven
//! at the block's concurrency, and a block splits over only as many sets as give every
//! share at least two waves of it ([`split_sets`]), so every set keeps the load with
//! sessions ending and new ones starting for half its share, as `bisect load` holds a
//! level (docs/load.md: 64 sessions at 64 in flight corrupted 0 of 192 on the embedded
//! engine where 200 at 64 corrupted 12). A block of one or two waves at the load (80
//! sessions at 80 or at 40 in flight) runs on one set. What the split buys is wall time:
//! the sets restart at once and each drives its fraction of the block's waves.

use serde::{Deserialize, Serialize};

use super::block::{BlockOutcome, BlockRequest, SetShare};
use crate::evidence::Severity;
use crate::format::{p_value, percent_digits};
use crate::stats::{fisher_exact_two_sided, rate};

/// Set j's share of block b runs the workload with seed `seed + b + j * SHARE_SEED_STRIDE`:
/// fresh sessions on every set, never another block's (a search runs at most a few
/// dozen blocks, far below the stride).
pub const SHARE_SEED_STRIDE: u64 = 1 << 32;

/// How many of `sets` replica sets a block of `block` sessions at `concurrency` in flight
/// runs on at once: every share must hold at least two waves (twice `concurrency`
/// sessions), or its set would reach the load only to drain it. At least one.
pub fn split_sets(block: u64, concurrency: u32, sets: usize) -> usize {
    let per_set = 2 * u64::from(concurrency.max(1));
    (block / per_set).clamp(1, sets.max(1) as u64) as usize
}

impl BlockRequest {
    /// The block's shares over `sets` sets: the sessions as even as they divide (the
    /// first sets take the remainder), set j's seed offset by j strides. One set: the
    /// block itself.
    pub fn shares(&self, sets: usize) -> Vec<BlockRequest> {
        if sets <= 1 {
            return vec![self.clone()];
        }
        let k = sets as u64;
        (0..k)
            .map(|j| BlockRequest {
                sessions: self.sessions / k + u64::from(j < self.sessions % k),
                seed: self.seed.wrapping_add(j.wrapping_mul(SHARE_SEED_STRIDE)),
                ..self.clone()
            })
            .collect()
    }
}

impl BlockOutcome {
    /// The shares of one block (in set order) as the block the search asked for:
    /// - the classes interleaved set by set (session i of set j at i * k + j while every
    ///   set has one), so every look of the search holds each set's sessions alike;
    /// - the peak the lowest set's (each set's busiest role): a "passes" needs every
    ///   engine at the load, and none measured on a set is none measured;
    /// - the speed the slowest set's: every block of a search is split alike, so
    ///   configurations are compared set for set (a flag that slows the engine slows
    ///   every set); a set without token counts where another has them counts as 0;
    /// - the wall the longest set's (they run at once); warnings and mechanism counts of
    ///   all, each warning once;
    /// - each set's counts in `sets`, for [`replica_check`].
    ///
    /// One share is returned as it is.
    pub fn merge(mut parts: Vec<BlockOutcome>) -> BlockOutcome {
        if parts.len() == 1 {
            return parts.remove(0);
        }
        let longest = parts.iter().map(|p| p.classes.len()).max().unwrap_or(0);
        let mut classes = Vec::with_capacity(parts.iter().map(|p| p.classes.len()).sum());
        for i in 0..longest {
            classes.extend(parts.iter().filter_map(|p| p.classes.get(i).copied()));
        }
        let peak_engine = parts
            .iter()
            .map(|p| p.peak_engine)
            .collect::<Option<Vec<u64>>>()
            .and_then(|v| v.into_iter().min());
        // A set that drove sessions and reported no tokens drove none (its engine answers
        // token counts on the other sets); none known on any set is none known.
        let tokens_per_s = parts.iter().any(|p| p.tokens_per_s.is_some()).then(|| {
            parts
                .iter()
                .map(|p| p.tokens_per_s.unwrap_or(0.0))
                .fold(f64::INFINITY, f64::min)
        });
        let mut warnings: Vec<String> = Vec::new();
        for w in parts.iter().flat_map(|p| &p.warnings) {
            if !warnings.contains(w) {
                warnings.push(w.clone());
            }
        }
        BlockOutcome {
            classes,
            peak_engine,
            wall_s: parts.iter().map(|p| p.wall_s).fold(0.0, f64::max),
            tokens_per_s,
            warnings,
            mechanisms: crate::mechanism::pool(parts.iter().map(|p| p.mechanisms.as_slice())),
            sets: parts.iter().map(SetShare::of).collect(),
        }
    }
}

/// Each set's counts over `blocks` (those split over `sets` sets; a block that ran on
/// one set, or on another number of them, is left out).
pub fn set_tallies<'a>(
    blocks: impl IntoIterator<Item = &'a [SetShare]>,
    sets: usize,
) -> Vec<SetShare> {
    let mut out = vec![SetShare::default(); sets];
    for shares in blocks {
        if shares.len() == sets {
            for (t, s) in out.iter_mut().zip(shares) {
                t.add(s);
            }
        }
    }
    out
}

/// What [`replica_check`] found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaCheck {
    pub severity: Severity,
    /// The set least like the others (Bonferroni-adjusted p below alpha), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub differs: Option<String>,
    pub p: f64,
    pub note: String,
}

/// Whether the sets corrupted alike over the blocks split among them: Fisher's exact
/// test of each set's corrupted share, pooled over the blocks, against the other sets'
/// (Bonferroni over the sets where there are more than two), as `bisect run`'s replica
/// confound tests its sets. Every block holds each set in the same proportion, so a set
/// that differs is a warning, never a block on the answer: its difference enters every
/// configuration alike. `None` with fewer than two sets or nothing judged.
pub fn replica_check(names: &[String], tallies: &[SetShare], alpha: f64) -> Option<ReplicaCheck> {
    if names.len() < 2 || names.len() != tallies.len() {
        return None;
    }
    let corrupted: u64 = tallies.iter().map(|t| t.corrupted).sum();
    let judged: u64 = tallies.iter().map(|t| t.judged).sum();
    if judged == 0 {
        return None;
    }
    let tests = if tallies.len() == 2 {
        1.0
    } else {
        tallies.len() as f64
    };
    let (worst, p) = tallies
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (k, n) = (t.corrupted, t.judged);
            let p = fisher_exact_two_sided(k, n - k, corrupted - k, (judged - n) - (corrupted - k));
            (i, (p * tests).min(1.0), rate(k, n))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1).then(b.2.total_cmp(&a.2)))
        .map(|(i, p, _)| (i, p))?;
    let rates: Vec<String> = names
        .iter()
        .zip(tallies)
        .map(|(name, t)| {
            format!(
                "replica {name} {}/{} ({}%)",
                t.corrupted,
                t.judged,
                percent_digits(rate(t.corrupted, t.judged))
            )
        })
        .collect();
    let check = if p < alpha {
        let name = &names[worst];
        ReplicaCheck {
            severity: Severity::Warning,
            differs: Some(name.clone()),
            p,
            note: format!(
                "replica {name} differs from the others whatever the configuration ({}; Fisher \
                 p = {}); every block ran an even share of its sessions on each set, so the \
                 difference enters every configuration alike and cancels in the search's \
                 comparisons; check replica {name} (its build, its hardware, its load)",
                rates.join(", "),
                p_value(p)
            ),
        }
    } else {
        ReplicaCheck {
            severity: Severity::Info,
            differs: None,
            p,
            note: format!(
                "the replica sets corrupted alike over the search's blocks ({}; Fisher p = {})",
                rates.join(", "),
                p_value(p)
            ),
        }
    };
    Some(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionClass::{self, Done, Error, Leak};

    fn outcome(
        classes: Vec<SessionClass>,
        peak: Option<u64>,
        speed: f64,
        wall: f64,
    ) -> BlockOutcome {
        BlockOutcome {
            classes,
            peak_engine: peak,
            wall_s: wall,
            tokens_per_s: Some(speed),
            warnings: vec!["w".into()],
            mechanisms: Vec::new(),
            sets: Vec::new(),
        }
    }

    fn request(sessions: u64) -> BlockRequest {
        BlockRequest {
            block: 3,
            config: Default::default(),
            failing: vec!["A".into()],
            sessions,
            concurrency: 8,
            seed: 45,
        }
    }

    /// A share must hold the load for two waves: 80 sessions at 20 in flight split over
    /// two sets, at 21 (or at 40, two waves on one set) over none; never more sets than
    /// there are.
    #[test]
    fn a_block_splits_only_over_sets_whose_share_holds_the_load() {
        assert_eq!(split_sets(80, 20, 2), 2);
        assert_eq!(split_sets(80, 21, 2), 1);
        assert_eq!(split_sets(80, 40, 2), 1);
        assert_eq!(split_sets(80, 80, 4), 1);
        assert_eq!(split_sets(80, 8, 2), 2);
        assert_eq!(split_sets(80, 8, 8), 5);
        assert_eq!(split_sets(80, 13, 4), 3);
        assert_eq!(split_sets(80, 8, 1), 1);
        assert_eq!(split_sets(80, 0, 0), 1);
    }

    #[test]
    fn shares_divide_the_sessions_and_draw_fresh_seeds() {
        let r = request(81);
        assert_eq!(r.shares(1), vec![r.clone()]);
        let shares = r.shares(2);
        assert_eq!(
            shares.iter().map(|s| s.sessions).collect::<Vec<_>>(),
            [41, 40]
        );
        assert_eq!(shares[0].seed, 45);
        assert_eq!(shares[1].seed, 45 + SHARE_SEED_STRIDE);
        assert!(shares
            .iter()
            .all(|s| s.block == 3 && s.failing == r.failing && s.concurrency == 8));
    }

    /// Interleaved set by set; the lowest peak, the slowest speed, the longest wall;
    /// warnings once; each set's counts.
    #[test]
    fn shares_merge_into_one_block_set_by_set() {
        let a = outcome(vec![Done, Leak, Done], Some(8), 30.0, 10.0);
        let b = outcome(vec![Leak, Error], Some(7), 20.0, 12.0);
        let m = BlockOutcome::merge(vec![a.clone(), b]);
        assert_eq!(m.classes, [Done, Leak, Leak, Error, Done]);
        assert_eq!(m.peak_engine, Some(7));
        assert_eq!(m.tokens_per_s, Some(20.0));
        assert_eq!(m.wall_s, 12.0);
        assert_eq!(m.warnings, ["w"]);
        assert_eq!(
            m.sets,
            [
                SetShare {
                    sessions: 3,
                    corrupted: 1,
                    judged: 3
                },
                SetShare {
                    sessions: 2,
                    corrupted: 1,
                    judged: 1
                }
            ]
        );
        // A set that measured no load: no load measured.
        let blind = outcome(vec![Done], None, 20.0, 1.0);
        assert_eq!(
            BlockOutcome::merge(vec![a.clone(), blind]).peak_engine,
            None
        );
        // A set that reported no tokens drove none; no set with tokens, no speed.
        let tokenless = BlockOutcome {
            tokens_per_s: None,
            ..a.clone()
        };
        assert_eq!(
            BlockOutcome::merge(vec![a.clone(), tokenless.clone()]).tokens_per_s,
            Some(0.0)
        );
        assert_eq!(
            BlockOutcome::merge(vec![tokenless.clone(), tokenless]).tokens_per_s,
            None
        );
        // Truncated and crashed sessions are not judged.
        let cut = outcome(
            vec![SessionClass::Truncated, SessionClass::Crashed, Leak],
            Some(8),
            1.0,
            1.0,
        );
        assert_eq!(BlockOutcome::merge(vec![cut, a.clone()]).sets[0].judged, 1);
        // One share is the block.
        assert_eq!(BlockOutcome::merge(vec![a.clone()]), a);
    }

    #[test]
    fn sets_that_differ_are_a_warning_and_alike_are_recorded() {
        let names = vec!["a".to_string(), "b".to_string()];
        let share = |corrupted, judged| SetShare {
            sessions: judged,
            corrupted,
            judged,
        };
        // Eight blocks of 40 a set: b leaks 8 of its 320, a none.
        let blocks: Vec<Vec<SetShare>> = (0..8).map(|_| vec![share(0, 40), share(1, 40)]).collect();
        let tallies = set_tallies(blocks.iter().map(Vec::as_slice), 2);
        assert_eq!(tallies[1], share(8, 320));
        let check = replica_check(&names, &tallies, 0.01).unwrap();
        assert_eq!(check.severity, Severity::Warning);
        assert_eq!(check.differs.as_deref(), Some("b"));
        // Fisher's exact two-sided p of [[0, 320], [8, 312]]: the two tails of the
        // hypergeometric (640 sessions, 8 corrupted, 320 drawn) at 0 and 8, 0.007474.
        assert!((check.p - 0.007474).abs() < 1e-5, "{}", check.p);
        assert!(check.note.contains("cancels"), "{}", check.note);
        let alike = set_tallies([&[share(2, 40), share(3, 40)][..]], 2);
        let check = replica_check(&names, &alike, 0.01).unwrap();
        assert_eq!(check.severity, Severity::Info);
        assert_eq!(check.differs, None);
        // A block that ran on one set is not counted; one set is no check.
        assert_eq!(
            set_tallies([&[share(2, 40)][..]], 2),
            vec![SetShare::default(); 2]
        );
        assert_eq!(replica_check(&names[..1], &alike[..1], 0.01), None);
    }
}
