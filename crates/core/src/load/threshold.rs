//! The threshold rule of `bisect load`: which levels of load are shown to corrupt more
//! than the baseline (the lowest level, or the flag's `off` arm at the same level), which
//! are shown not to, and from those the lowest reproducing load.
//!
//! Each tested level asks one one-sided question, "does this level corrupt more than its
//! baseline?", and the `k` questions are corrected together:
//! - Fixed allocation (every level run once at its planned sessions): one-sided Fisher
//!   exact test (R. A. Fisher (1935), "The logic of inductive inference", J. R. Statist.
//!   Soc. 98:39-82): the hypergeometric upper tail P(X >= a) of the level's corrupted
//!   count given both margins, as R's `fisher.test(, alternative = "greater")`; then
//!   Holm's step-down adjustment across the `k` levels (Holm 1979,
//!   [`crate::stats::holm`]). A level rises when its adjusted p is below alpha.
//! - Adaptive allocation: one e-process per level, the two-proportion e-variable of
//!   Turner, Ly and Grunwald (2021) ([`crate::sequential::block_log_e_value`])
//!   restricted to the one-sided alternative: a block counts only when the predictable
//!   plug-in rate of the level exceeds the baseline's, else its e-value is 1 (a choice
//!   made before the block is seen, so the product stays an e-process under equal rates).
//!   A level rises when its e-process reaches k / alpha (Ville's inequality with
//!   Bonferroni over the k e-processes: valid at any stopping time, whatever the
//!   allocation chose to run).
//! - "Flat" (the level corrupts at most `min_effect` more than its baseline) at error
//!   [`CLEAR_ALPHA`] / k: fixed, the one-sided upper bound of Newcombe's hybrid score
//!   interval (Newcombe 1998, method 10); adaptive, the upper bound of the level's
//!   Robbins mixture confidence sequence minus the lower bound of its baseline's, each at
//!   CLEAR_ALPHA / (2k) ([`crate::sequential::mixture_confidence_sequence`]).
//!
//! Under the model that the rate never falls as load rises, a level that rises makes
//! every higher level rise and a flat level makes every lower level flat; [`resolve`]
//! turns the per-level statuses into the threshold (the lowest level shown to rise), the
//! interval it lies in (above the highest flat level below it), and the level where
//! another block would narrow the answer most (the open level next to the threshold).

use serde::{Deserialize, Serialize};

use crate::sequential::{block_log_e_value, mixture_confidence_sequence, Tally, PLUG_IN_PRIOR};
use crate::stats;

/// Error rate of "flat" across all levels (the 95% of `run`'s Newcombe interval).
pub(crate) const CLEAR_ALPHA: f64 = 0.05;

/// Where one tested level stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Undecided; more sessions could decide it.
    Open,
    /// Shown to corrupt more than its baseline.
    Rises,
    /// Shown to corrupt at most `min_effect` more than its baseline.
    Flat,
    /// Spent its cap undecided (adaptive allocation only).
    Capped,
    /// Its engine-side load fell short of the level: it measures another load.
    Short,
}

impl Status {
    /// `open`, `rises`, `flat`, `capped`, `short`: as tables write it.
    pub fn word(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

/// One-sided Fisher exact p-value that arm 1 (k1 of n1) corrupts more than arm 0
/// (k0 of n0): P(X >= k1) for X hypergeometric with both margins fixed. An empty arm
/// carries no evidence: 1.
pub(crate) fn fisher_greater(k1: u64, n1: u64, k0: u64, n0: u64) -> f64 {
    if n1 == 0 || n0 == 0 {
        return 1.0;
    }
    let (k1, k0) = (k1.min(n1), k0.min(n0));
    crate::stats::fisher_one_sided_greater(k1, n1 - k1, k0, n0 - k0)
}

/// The fixed rule's evidence for one level: its one-sided p, Holm-adjusted across levels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct FixedTest {
    pub p: f64,
    pub holm_p: f64,
    /// One-sided upper bound of the difference (level - baseline) at CLEAR_ALPHA / k.
    pub(crate) diff_upper: f64,
}

/// (corrupted, judged) of a level and of its baseline.
pub(crate) type Pair = ((u64, u64), (u64, u64));

/// The fixed rule over `k` levels: each `(level, baseline)` pair of (corrupted, judged);
/// `None` for a level left out (short). Returns each level's status and evidence.
pub(crate) fn fixed_rule(
    pairs: &[Option<Pair>],
    alpha: f64,
    min_effect: f64,
) -> Vec<(Status, Option<FixedTest>)> {
    let k = pairs.iter().flatten().count().max(1) as f64;
    let p: Vec<f64> = pairs
        .iter()
        .map(|pair| match pair {
            Some(((k1, n1), (k0, n0))) => fisher_greater(*k1, *n1, *k0, *n0),
            None => f64::NAN,
        })
        .collect();
    let adjusted = stats::holm(&p);
    let confidence = 1.0 - 2.0 * CLEAR_ALPHA / k;
    pairs
        .iter()
        .zip(p.iter().zip(adjusted))
        .map(|(pair, (&p, holm_p))| {
            let Some(((k1, n1), (k0, n0))) = pair else {
                return (Status::Short, None);
            };
            let (_, _, diff_upper) = stats::newcombe_diff(*k1, *n1, *k0, *n0, confidence);
            let status = if holm_p < alpha {
                Status::Rises
            } else if diff_upper < min_effect {
                Status::Flat
            } else {
                Status::Open
            };
            (
                status,
                Some(FixedTest {
                    p,
                    holm_p,
                    diff_upper,
                }),
            )
        })
        .collect()
}

/// The one-sided e-process of one level against its baseline: it consumes the sessions
/// of both that it has not seen yet whenever both have new ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EProcess {
    pub(crate) seen_level: Tally,
    pub(crate) seen_baseline: Tally,
    pub(crate) log_e: f64,
}

fn minus(a: Tally, b: Tally) -> Tally {
    Tally {
        corrupted: a.corrupted - b.corrupted,
        sessions: a.sessions - b.sessions,
    }
}

/// Posterior mean under the e-process's Beta(PLUG_IN_PRIOR, PLUG_IN_PRIOR) prior.
fn plug_in(t: Tally) -> f64 {
    (t.corrupted as f64 + PLUG_IN_PRIOR) / (t.sessions as f64 + 2.0 * PLUG_IN_PRIOR)
}

impl EProcess {
    /// Take in the new sessions of `level` and `baseline` (their running totals, each
    /// at least what was seen). Nothing happens until both have new sessions.
    pub fn update(&mut self, level: Tally, baseline: Tally) {
        let new_level = minus(level, self.seen_level);
        let new_baseline = minus(baseline, self.seen_baseline);
        if new_level.sessions == 0 || new_baseline.sessions == 0 {
            return;
        }
        if plug_in(self.seen_level) > plug_in(self.seen_baseline) {
            self.log_e +=
                block_log_e_value(self.seen_level, self.seen_baseline, new_level, new_baseline);
        }
        self.seen_level = level;
        self.seen_baseline = baseline;
    }

    pub fn e_value(&self) -> f64 {
        self.log_e.exp()
    }
}

/// The adaptive rule for one level: rises at e >= k / alpha, flat when the always-valid
/// difference bound is below `min_effect`, else open.
pub(crate) fn sequential_status(
    e: &EProcess,
    level: Tally,
    baseline: Tally,
    k: usize,
    alpha: f64,
    min_effect: f64,
) -> (Status, f64) {
    let per_side = CLEAR_ALPHA / (2.0 * k.max(1) as f64);
    let upper = mixture_confidence_sequence(level.corrupted, level.sessions, per_side)[1];
    let lower = mixture_confidence_sequence(baseline.corrupted, baseline.sessions, per_side)[0];
    let diff_upper = upper - lower;
    let status = if e.log_e >= (k.max(1) as f64 / alpha).ln() {
        Status::Rises
    } else if diff_upper < min_effect {
        Status::Flat
    } else {
        Status::Open
    };
    (status, diff_upper)
}

/// What the statuses of the tested levels (ascending load) say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    /// The lowest level shown to rise (an index into the statuses).
    pub threshold: Option<usize>,
    /// The highest level shown flat below the threshold (or anywhere, without one).
    pub(crate) flat_below: Option<usize>,
    /// The open level another block should go to; `None`: nothing left to decide.
    pub next: Option<usize>,
}

/// Resolve per-level statuses under the monotone model (module docs).
pub fn resolve(statuses: &[Status]) -> Resolution {
    let usable: Vec<usize> = (0..statuses.len())
        .filter(|&i| statuses[i] != Status::Short)
        .collect();
    let threshold = usable
        .iter()
        .copied()
        .find(|&i| statuses[i] == Status::Rises);
    let below = threshold.unwrap_or(statuses.len());
    let flat_below = usable
        .iter()
        .copied()
        .rev()
        .find(|&i| i < below && statuses[i] == Status::Flat);
    let next = match threshold {
        // The open level nearest below the threshold, above the highest flat one.
        Some(t) => usable
            .iter()
            .copied()
            .rev()
            .filter(|&i| i < t && flat_below.is_none_or(|f| i > f))
            .find(|&i| statuses[i] == Status::Open),
        // Without a rise: the highest level, while it is open (a flat or capped top
        // level answers for every level below it).
        None => usable
            .last()
            .copied()
            .filter(|&i| statuses[i] == Status::Open),
    };
    Resolution {
        threshold,
        flat_below,
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    #[test]
    fn one_sided_fisher_matches_the_hypergeometric_tail_by_hand() {
        // 3 of 4 vs 0 of 4: margins 3 corrupted of 8; P(X >= 3) = C(4,3) C(4,0) / C(8,3)
        // = 4 / 56.
        assert!((fisher_greater(3, 4, 0, 4) - 4.0 / 56.0).abs() < 1e-12);
        // 2 of 4 vs 1 of 4: P(X >= 2) = (C(4,2) C(4,1) + C(4,3) C(4,0)) / C(8,3) = 28 / 56.
        assert!((fisher_greater(2, 4, 1, 4) - 0.5).abs() < 1e-12);
        // R: fisher.test(matrix(c(12, 68, 0, 80), 2), alternative = "greater") gives
        // p = 1.3e-4 (C(80,12) / C(160,12)).
        let p = fisher_greater(12, 80, 0, 80);
        let by_hand: f64 = (0..12)
            .map(|i| (80.0 - i as f64) / (160.0 - i as f64))
            .product();
        assert!((p - by_hand).abs() < 1e-15, "{p} vs {by_hand}");
        assert_eq!(fisher_greater(0, 80, 5, 80), 1.0);
        assert_eq!(fisher_greater(3, 0, 0, 4), 1.0);
    }

    #[test]
    fn the_fixed_rule_holm_adjusts_across_levels() {
        // Levels 8, 16, 32, 64 against a baseline of 0/80.
        let base = (0, 80);
        let pairs = [
            Some(((0, 80), base)),
            Some(((1, 80), base)),
            None,
            Some(((12, 80), base)),
        ];
        let out = fixed_rule(&pairs, 0.01, 0.05);
        let p64 = fisher_greater(12, 80, 0, 80);
        let p16 = fisher_greater(1, 80, 0, 80);
        // Holm over the three levels tested: the smallest p times 3.
        let t64 = out[3].1.unwrap();
        assert!((t64.holm_p - 3.0 * p64).abs() < 1e-15);
        assert_eq!(out[3].0, Rises);
        assert!((p16 - 0.5).abs() < 1e-12, "1/80 vs 0/80: P(X >= 1) = 1/2");
        assert_eq!(out[1].0, Open, "{:?}", out[1]);
        assert_eq!(out[2], (Short, None));
        // 0/80 vs 0/80: Newcombe's upper bound at 1 - 2 * 0.05 / 3 is Wilson's 0/80
        // upper bound at that confidence, about 6%: above 5 points, so not flat.
        let w = stats::wilson(0, 80, 1.0 - 0.1 / 3.0).1;
        assert!((out[0].1.unwrap().diff_upper - w).abs() < 1e-12);
        assert_eq!(out[0].0, Open);
        let many = fixed_rule(&[Some(((0, 400), (0, 400)))], 0.01, 0.05);
        assert_eq!(many[0].0, Flat, "{many:?}");
    }

    #[test]
    fn the_e_process_counts_only_blocks_whose_plug_in_favours_the_level() {
        let t = |corrupted, sessions| Tally {
            corrupted,
            sessions,
        };
        let mut e = EProcess::default();
        // First block: equal plug-ins (nothing seen), e stays 1.
        e.update(t(4, 20), t(0, 20));
        assert_eq!(e.log_e, 0.0);
        // Second: plug-ins (4.18/20.36, 0.18/20.36) favour the level; the block's
        // e-value is the likelihood ratio computed by hand.
        e.update(t(8, 40), t(0, 40));
        let (ta, tb): (f64, f64) = (4.18 / 20.36, 0.18 / 20.36);
        let t0 = (ta + tb) / 2.0;
        let by_hand = 4.0 * (ta / t0).ln()
            + 16.0 * ((1.0 - ta) / (1.0 - t0)).ln()
            + 20.0 * ((1.0 - tb) / (1.0 - t0)).ln();
        assert!(
            (e.log_e - by_hand).abs() < 1e-12,
            "{} vs {by_hand}",
            e.log_e
        );
        // Only the baseline moved: nothing consumed yet.
        let before = e;
        e.update(t(8, 40), t(1, 60));
        assert_eq!(e, before);
        // A block where the baseline's plug-in leads counts as 1.
        let mut down = EProcess::default();
        down.update(t(0, 20), t(4, 20));
        down.update(t(9, 40), t(4, 40));
        assert_eq!(down.log_e, 0.0);
        assert_eq!(down.seen_level, t(9, 40));
    }

    #[test]
    fn sequential_status_thresholds_at_k_over_alpha() {
        let t = |corrupted, sessions| Tally {
            corrupted,
            sessions,
        };
        let e = EProcess {
            log_e: (5.0_f64 / 0.01).ln() + 1e-9,
            ..EProcess::default()
        };
        assert_eq!(
            sequential_status(&e, t(9, 60), t(0, 60), 5, 0.01, 0.05).0,
            Rises
        );
        let e = EProcess {
            log_e: (5.0_f64 / 0.01).ln() - 1e-9,
            ..EProcess::default()
        };
        assert_eq!(
            sequential_status(&e, t(9, 60), t(0, 60), 5, 0.01, 0.05).0,
            Open
        );
        let none = EProcess::default();
        let (status, upper) = sequential_status(&none, t(0, 400), t(0, 400), 5, 0.01, 0.05);
        let by_parts = mixture_confidence_sequence(0, 400, 0.005)[1];
        assert!((upper - by_parts).abs() < 1e-12);
        assert_eq!(status, Flat, "0/400 upper {upper}");
    }

    #[test]
    fn resolution_under_the_monotone_model() {
        let r = |s: &[Status]| {
            let r = resolve(s);
            (r.threshold, r.flat_below, r.next)
        };
        // Decided: flat at 16, rises at 32 (indices of 8, 16, 32, 64, 80).
        assert_eq!(
            r(&[Open, Flat, Rises, Open, Rises]),
            (Some(2), Some(1), None)
        );
        // Rises at 64, 16 flat: 32 is next to the threshold.
        assert_eq!(
            r(&[Open, Flat, Open, Rises, Open]),
            (Some(3), Some(1), Some(2))
        );
        // Rises already at the lowest tested level.
        assert_eq!(r(&[Rises, Open, Open]), (Some(0), None, None));
        // A short level is skipped: 32 short, 64 rises, 16 open is next.
        assert_eq!(r(&[Flat, Open, Short, Rises]), (Some(3), Some(0), Some(1)));
        // Capped below the threshold: nothing left to run, the interval stays wide.
        assert_eq!(r(&[Flat, Capped, Rises]), (Some(2), Some(0), None));
        // No rise: the top level decides for all; open top is next.
        assert_eq!(r(&[Open, Open, Open]), (None, None, Some(2)));
        assert_eq!(r(&[Open, Open, Flat]), (None, Some(2), None));
        assert_eq!(r(&[Open, Open, Capped]), (None, None, None));
        assert_eq!(r(&[Short, Short]), (None, None, None));
    }
}
