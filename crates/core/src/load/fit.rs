//! The dose-response fit of `bisect load`: the corruption rate as a non-decreasing
//! function of the sessions in flight, with a band that holds for every level at once.
//!
//! Methods:
//! - The fit: weighted isotonic regression by pool-adjacent-violators (M. Ayer, H. D.
//!   Brunk, G. M. Ewing, W. T. Reid and E. Silverman (1955), "An empirical distribution
//!   function for sampling with incomplete information", Ann. Math. Statist. 26:641-647;
//!   R. E. Barlow, D. J. Bartholomew, J. M. Bremner and H. D. Brunk (1972), "Statistical
//!   Inference under Order Restrictions", chapter 1): the least-squares non-decreasing fit
//!   of the observed rates weighted by judged sessions, which is also the maximum-
//!   likelihood monotone fit of binomial rates. Adjacent levels that violate the order
//!   are pooled into one block whose value is their weighted mean.
//! - The band (CHOICE: a monotone envelope of Bonferroni Wilson intervals, not a
//!   bootstrap: deterministic, no seed to report, and a stated coverage): each level's
//!   Wilson interval (Wilson 1927, [`crate::stats::wilson`]) at confidence
//!   `1 - alpha / m` for `m` levels, so all `m` cover their level's rate at once with
//!   probability >= 1 - alpha (Bonferroni); then, because the rate never falls with load,
//!   level i's rate is at least every lower level's lower bound and at most every higher
//!   level's upper bound: lower_i = max_{j <= i} L_j, upper_i = min_{j >= i} U_j. The
//!   band therefore holds simultaneously under the monotone model with probability at
//!   least 1 - alpha. A lower bound above an upper bound means the data contradict a
//!   non-decreasing rate ([`Band::contradicts_monotone`]).

use serde::{Deserialize, Serialize};

use crate::stats;

/// One level's count for the fit: corrupted of judged sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    pub corrupted: u64,
    pub judged: u64,
}

/// The weighted least-squares non-decreasing fit of `values` (weights >= 0). Points of
/// weight 0 carry no data: they are left out of the pooling and take the fitted value
/// of the point before them (the one after, for leading ones; 0 when no point has
/// weight), which keeps the fit non-decreasing.
pub(crate) fn isotonic(values: &[f64], weights: &[f64]) -> Vec<f64> {
    assert_eq!(values.len(), weights.len(), "one weight per value");
    // Blocks of pooled points: (weighted sum, weight, points).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(values.len());
    for (&v, &w) in values.iter().zip(weights).filter(|(_, &w)| w > 0.0) {
        blocks.push((v * w, w, 1));
        while blocks.len() > 1 {
            let (s1, w1, n1) = blocks[blocks.len() - 2];
            let (s2, w2, n2) = blocks[blocks.len() - 1];
            if s1 / w1 <= s2 / w2 {
                break;
            }
            blocks.pop();
            *blocks.last_mut().expect("two blocks") = (s1 + s2, w1 + w2, n1 + n2);
        }
    }
    let weighted: Vec<f64> = blocks
        .iter()
        .flat_map(|&(s, w, n)| std::iter::repeat_n(s / w, n))
        .collect();
    let mut next = weighted.iter().copied();
    let first = weighted.first().copied().unwrap_or(0.0);
    let mut last = None;
    weights
        .iter()
        .map(|&w| {
            if w > 0.0 {
                last = next.next();
            }
            last.unwrap_or(first)
        })
        .collect()
}

/// The isotonic fit of the observed rates, weighted by judged sessions.
pub(crate) fn fit_rates(counts: &[Count]) -> Vec<f64> {
    let values: Vec<f64> = counts
        .iter()
        .map(|c| stats::rate(c.corrupted, c.judged))
        .collect();
    let weights: Vec<f64> = counts.iter().map(|c| c.judged as f64).collect();
    isotonic(&values, &weights)
}

/// The simultaneous band of a non-decreasing rate, per level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Band {
    pub lower: Vec<f64>,
    pub upper: Vec<f64>,
    /// The confidence of the band as a whole (1 - alpha).
    pub(crate) confidence: f64,
}

impl Band {
    /// Whether some level's lower bound lies above its upper bound: the counts are not
    /// those of a non-decreasing rate (at the band's confidence).
    pub(crate) fn contradicts_monotone(&self) -> bool {
        self.lower.iter().zip(&self.upper).any(|(l, u)| l > u)
    }
}

/// The monotone envelope of Bonferroni Wilson intervals at overall `confidence`.
pub(crate) fn monotone_band(counts: &[Count], confidence: f64) -> Band {
    let m = counts.len().max(1) as f64;
    let each = 1.0 - (1.0 - confidence) / m;
    let intervals: Vec<(f64, f64)> = counts
        .iter()
        .map(|c| stats::wilson(c.corrupted, c.judged, each))
        .collect();
    let mut lower = Vec::with_capacity(counts.len());
    let mut running = 0.0_f64;
    for &(l, _) in &intervals {
        running = running.max(l);
        lower.push(running);
    }
    let mut upper = vec![1.0; counts.len()];
    let mut running = 1.0_f64;
    for (i, &(_, u)) in intervals.iter().enumerate().rev() {
        running = running.min(u);
        upper[i] = running;
    }
    Band {
        lower,
        upper,
        confidence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn pava_pools_violators_by_weight_as_computed_by_hand() {
        // Already ordered: unchanged.
        close(
            &isotonic(&[0.0, 0.1, 0.2], &[1.0, 1.0, 1.0]),
            &[0.0, 0.1, 0.2],
        );
        // 0.3 then 0.1 (weights 1, 3) pool to (0.3 + 0.3) / 4 = 0.15.
        close(
            &isotonic(&[0.0, 0.3, 0.1, 0.4], &[2.0, 1.0, 3.0, 1.0]),
            &[0.0, 0.15, 0.15, 0.4],
        );
        // A cascade: 0.5, 0.2 pool to 0.35 (w 2), then 0.1 (w 2) pools all three:
        // (0.5 + 0.2 + 0.2) / 4 = 0.225.
        close(
            &isotonic(&[0.5, 0.2, 0.1], &[1.0, 1.0, 2.0]),
            &[0.225, 0.225, 0.225],
        );
        // A weightless point is left out and takes its predecessor's fitted value.
        close(
            &isotonic(&[0.9, 0.2, 0.9, 0.3], &[0.0, 1.0, 0.0, 1.0]),
            &[0.2, 0.2, 0.2, 0.3],
        );
        close(&isotonic(&[0.5], &[0.0]), &[0.0]);
    }

    #[test]
    fn the_fit_of_counts_weights_by_judged_sessions() {
        let counts = [
            Count {
                corrupted: 0,
                judged: 80,
            },
            Count {
                corrupted: 4,
                judged: 40,
            },
            Count {
                corrupted: 2,
                judged: 40,
            },
            Count {
                corrupted: 12,
                judged: 80,
            },
        ];
        // 0.1 (w 40) and 0.05 (w 40) pool to 6/80 = 0.075.
        close(&fit_rates(&counts), &[0.0, 0.075, 0.075, 0.15]);
    }

    #[test]
    fn the_band_is_the_monotone_envelope_of_bonferroni_wilson_intervals() {
        let counts = [
            Count {
                corrupted: 0,
                judged: 80,
            },
            Count {
                corrupted: 12,
                judged: 80,
            },
            Count {
                corrupted: 6,
                judged: 80,
            },
        ];
        let band = monotone_band(&counts, 0.95);
        // Each interval at 1 - 0.05 / 3.
        let w = |k| stats::wilson(k, 80, 1.0 - 0.05 / 3.0);
        let (l0, u0) = w(0);
        let (l1, u1) = w(12);
        let (l2, u2) = w(6);
        close(&band.lower, &[l0, l1.max(l0), l1.max(l2)]);
        close(&band.upper, &[u0.min(u1).min(u2), u1.min(u2), u2]);
        assert_eq!(l0, 0.0);
        // 12/80's lower bound (about 7%) stays below 6/80's upper (about 17%).
        assert!(!band.contradicts_monotone());
        let clash = [
            Count {
                corrupted: 40,
                judged: 40,
            },
            Count {
                corrupted: 0,
                judged: 40,
            },
        ];
        assert!(monotone_band(&clash, 0.95).contradicts_monotone());
    }
}
