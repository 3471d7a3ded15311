//! The posterior over "the first bad commit is c" for every commit c of the first-parent
//! range, plus "no single culprit", from the blocks run so far (docs/commits.md).
//!
//! Model (a Bayesian change-point model for Bernoulli data; the product-partition form
//! of D. Barry and J. A. Hartigan (1993), "A Bayesian analysis for change point
//! problems", JASA 88:309-319, restricted to at most one change): commits are indexed
//! 0 (the good end) to N (the bad end). Under `H_c` (1 <= c <= N), every session at a
//! commit before c corrupts with a rate `p_good`, every session at c or later with
//! `p_bad`; under `H_none` every commit shares one rate. Each unknown rate has a
//! Beta(a, b) prior ([`RATE_PRIOR`], Jeffreys), so a hypothesis's marginal likelihood of
//! the per-commit counts (k corrupted of n judged) is, binomial coefficients cancelling,
//! `B(a + K_G, b + N_G - K_G) / B(a, b) * B(a + K_B, b + N_B - K_B) / B(a, b)` with
//! `K_G, N_G` pooled over the commits before c and `K_B, N_B` over the rest (one factor
//! for `H_none`). The prior puts [`NONE_PRIOR`] on `H_none` and spreads the rest evenly.
//! The marginal likelihood is what makes "no single culprit" a real answer: it pays for
//! its second rate (Bayes factors' Occam factor), so equal rates favour `H_none`.
//!
//! Untestable commits carry no data, so `H_c` and `H_{c+1}` have equal likelihood when c
//! is untestable: the answer widens to a range. [`answer_sets`] groups each run of
//! untestable commits with the next testable one; the stopping rule reads the posterior
//! of these sets.

use statrs::function::beta::ln_beta;

/// Beta(1/2, 1/2) (Jeffreys) for both rates: tight near 0, where clean builds live.
pub(crate) const RATE_PRIOR: f64 = 0.5;

/// Prior probability of "no single culprit".
pub(crate) const NONE_PRIOR: f64 = 0.1;

/// Corrupted of judged sessions, pooled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    pub corrupted: u64,
    pub judged: u64,
}

impl std::ops::Add for Counts {
    type Output = Counts;
    fn add(self, other: Counts) -> Counts {
        Counts {
            corrupted: self.corrupted + other.corrupted,
            judged: self.judged + other.judged,
        }
    }
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, other: Counts) -> Counts {
        Counts {
            corrupted: self.corrupted - other.corrupted,
            judged: self.judged - other.judged,
        }
    }
}

impl Counts {
    /// Observed rate (0 when nothing was judged).
    pub fn rate(self) -> f64 {
        crate::stats::rate(self.corrupted, self.judged)
    }

    /// The Beta posterior's shapes under [`RATE_PRIOR`].
    pub(crate) fn beta(self) -> (f64, f64) {
        (
            RATE_PRIOR + self.corrupted as f64,
            RATE_PRIOR + (self.judged - self.corrupted) as f64,
        )
    }
}

/// Log marginal likelihood of `counts` under one Beta([`RATE_PRIOR`]) rate.
pub(crate) fn log_marginal(counts: Counts) -> f64 {
    let (a, b) = counts.beta();
    ln_beta(a, b) - ln_beta(RATE_PRIOR, RATE_PRIOR)
}

/// The posterior: `culprit[c]` for `H_c` (index 0 unused, always 0), and `none`.
#[derive(Debug, Clone, PartialEq)]
pub struct Posterior {
    pub culprit: Vec<f64>,
    pub none: f64,
}

/// The posterior from per-commit counts (`counts[i]` for commit i, 0 = good end, last =
/// bad end).
pub(crate) fn posterior(counts: &[Counts]) -> Posterior {
    let last = counts.len().saturating_sub(1);
    let total = counts.iter().fold(Counts::default(), |s, c| s + *c);
    let mut logs = vec![f64::NEG_INFINITY; last + 1];
    let each = ((1.0 - NONE_PRIOR) / last.max(1) as f64).ln();
    let mut before = Counts::default();
    for c in 1..=last {
        before = before + counts[c - 1];
        logs[c] = each + log_marginal(before) + log_marginal(total - before);
    }
    let log_none = NONE_PRIOR.ln() + log_marginal(total);
    let top = logs.iter().copied().fold(log_none, f64::max);
    let weights: Vec<f64> = logs.iter().map(|l| (l - top).exp()).collect();
    let none = (log_none - top).exp();
    let sum: f64 = weights.iter().sum::<f64>() + none;
    Posterior {
        culprit: weights.iter().map(|w| w / sum).collect(),
        none: none / sum,
    }
}

impl Posterior {
    /// P(the first bad commit is at or before `i`): commit i is on the bad side.
    #[cfg(test)]
    pub(crate) fn bad_side(&self, i: usize) -> f64 {
        self.culprit[..=i.min(self.culprit.len() - 1)].iter().sum()
    }

    /// The most probable culprit (the lowest index on a tie).
    pub(crate) fn map_culprit(&self) -> usize {
        let mut best = 1.min(self.culprit.len() - 1);
        for (c, p) in self.culprit.iter().enumerate().skip(1) {
            if *p > self.culprit[best] {
                best = c;
            }
        }
        best
    }
}

/// The answers the posterior can name: each run of untestable commits joined to the
/// testable commit after it, as `(first, last)` inclusive commit indices (`first < last`
/// only where untestable commits widen it). Commits 1..=N; the bad end is testable.
pub(crate) fn answer_sets(untestable: &[bool]) -> Vec<(usize, usize)> {
    let mut sets = Vec::new();
    let mut start = 1;
    for c in 1..untestable.len() {
        if !untestable[c] || c == untestable.len() - 1 {
            sets.push((start, c));
            start = c + 1;
        }
    }
    sets
}

/// The most probable answer: `Some((first, last, mass))` for a set of culprits, `None`
/// when "no single culprit" holds the most mass (with that mass).
pub(crate) fn best_answer(
    post: &Posterior,
    sets: &[(usize, usize)],
) -> (Option<(usize, usize)>, f64) {
    let mut best = (None, post.none);
    for &(first, last) in sets {
        let mass: f64 = post.culprit[first..=last].iter().sum();
        if mass > best.1 {
            best = (Some((first, last)), mass);
        }
    }
    best
}

/// The two rates' Beta posteriors under `H_c`: the good side (commits before c) and the
/// bad side (c and later).
pub fn sides(counts: &[Counts], c: usize) -> (Counts, Counts) {
    let good = counts[..c].iter().fold(Counts::default(), |s, x| s + *x);
    let bad = counts[c..].iter().fold(Counts::default(), |s, x| s + *x);
    (good, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(corrupted: u64, judged: u64) -> Counts {
        Counts { corrupted, judged }
    }

    #[test]
    fn marginal_likelihood_matches_hand_values() {
        // No data: B(1/2, 1/2) / B(1/2, 1/2) = 1.
        assert!(log_marginal(k(0, 0)).abs() < 1e-12);
        // One clean session: B(1/2, 3/2) / B(1/2, 1/2) = (pi/2) / pi = 1/2.
        assert!((log_marginal(k(0, 1)) - 0.5f64.ln()).abs() < 1e-12);
        // 0 of 2: B(1/2, 5/2)/pi = (3 pi / 8)/pi = 3/8.
        assert!((log_marginal(k(0, 2)) - (3.0f64 / 8.0).ln()).abs() < 1e-12);
        // 1 of 2: B(3/2, 3/2)/pi = (pi/8)/pi = 1/8.
        assert!((log_marginal(k(1, 2)) - (1.0f64 / 8.0).ln()).abs() < 1e-12);
    }

    #[test]
    fn posterior_of_three_commits_by_hand() {
        // Commits 0 (good end), 1, 2 (bad end): 0/2, 1/2, 2/2.
        // Marginals: m(0/2) = 3/8, m(1/2) = 1/8, m(2/2) = 3/8, m(1/4) = B(3/2,7/2)/pi =
        // 5/128, m(3/4) = 5/128, m(3/6) = B(7/2,7/2)/pi = 5/1024.
        // H_1: m(0/2) m(3/4) = 15/1024; H_2: m(1/4) m(2/2) = 15/1024; none: 5/1024.
        // Priors 0.45, 0.45, 0.1: 6.75, 6.75, 0.5 (x 1/1024): 6.75/14 each, 0.5/14 none.
        let post = posterior(&[k(0, 2), k(1, 2), k(2, 2)]);
        assert_eq!(post.culprit[0], 0.0);
        assert!((post.culprit[1] - 6.75 / 14.0).abs() < 1e-12, "{post:?}");
        assert!((post.culprit[2] - 6.75 / 14.0).abs() < 1e-12);
        assert!((post.none - 0.5 / 14.0).abs() < 1e-12);
        assert!((post.bad_side(1) - 6.75 / 14.0).abs() < 1e-12);
        assert_eq!(post.map_culprit(), 1);
    }

    #[test]
    fn no_data_is_the_prior_and_equal_rates_favour_none() {
        let post = posterior(&[k(0, 0); 5]);
        for c in 1..5 {
            assert!((post.culprit[c] - 0.9 / 4.0).abs() < 1e-12);
        }
        assert!((post.none - 0.1).abs() < 1e-12);
        // 2 of 200 at both ends: the change-point pays for its second rate.
        let post = posterior(&[k(2, 200), k(0, 0), k(2, 200)]);
        assert!(post.none > 0.5, "{post:?}");
        // 0 of 200 against 36 of 200: the culprit is between them.
        let post = posterior(&[k(0, 200), k(0, 0), k(36, 200)]);
        assert!(post.none < 1e-6);
        // Commit 1 has no data: H_1 and H_2 tie exactly.
        assert!((post.culprit[1] - post.culprit[2]).abs() < 1e-12);
    }

    #[test]
    fn untestable_commits_join_the_next_testable_one() {
        // Commits 0..=6; 2 and 3 untestable: {1}, {2,3,4}, {5}, {6}.
        let u = [false, false, true, true, false, false, false];
        assert_eq!(answer_sets(&u), vec![(1, 1), (2, 4), (5, 5), (6, 6)]);
        // The bad end always closes the last set.
        assert_eq!(answer_sets(&[false, true, false]), vec![(1, 2)]);
        let post = Posterior {
            culprit: vec![0.0, 0.1, 0.3, 0.3, 0.05, 0.1, 0.1],
            none: 0.05,
        };
        let (set, mass) = best_answer(&post, &answer_sets(&u));
        assert_eq!(set, Some((2, 4)));
        assert!((mass - 0.65).abs() < 1e-12);
    }
}
