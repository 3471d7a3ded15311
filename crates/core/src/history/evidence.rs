//! Evidence across nights that one cell's corruption rate changed: an e-process over the
//! nights of one comparable chain, whatever night the change came on.
//!
//! The null: every night of the chain has one corruption rate p (unknown), each judged
//! session a Bernoulli(p) draw. The alternative "the rate rose at night j" splits the
//! chain into `before` (nights 0..j) and `after` (nights j..), rates `p_b < p_a`.
//!
//! Per change point j the e-value is a likelihood ratio of a mixture against the null's
//! best fit (universal inference: L. Wasserman, A. Ramdas and S. Balakrishnan (2020),
//! "Universal inference", PNAS 117:16880-16890, the running-MLE form; and the one-sided
//! two-sample case of R. J. Turner, A. Ly and P. D. Grunwald, arXiv 2106.02693):
//!
//!   E_j = Q_j(data) / sup_{p_a <= p_b} L(p_b; before) L(p_a; after)
//!
//! with Q_j the marginal likelihood under independent Jeffreys Beta(1/2, 1/2) priors on
//! `p_b` and `p_a`:
//!
//!   Q_j = B(k_b + 1/2, n_b - k_b + 1/2) B(k_a + 1/2, n_a - k_a + 1/2) / B(1/2, 1/2)^2.
//!
//! (Restricting the prior to `p_a > p_b` would at most double it; the closed form is
//! kept, at that price of ln 2 nats.)
//!
//! The denominator is at least the likelihood under the true rates whenever they lie in
//! the null (`p_a <= p_b`, the constant rate included), and `Q_j` is a probability
//! distribution over the sessions, so `E_j <= Q_j / P_true`, a test martingale: `E_j` is
//! an e-process. The change point is unknown, so the cell's evidence mixes them with
//! fixed weights `w_j = 1 / (j (j + 1))` (j = 1, 2, ...: at least one night before),
//! which sum to 1: `E = sum_j w_j E_j` is dominated by `(sum_j w_j Q_j) / P_true`, again a
//! test martingale, so `P(sup_t E_t >= 1/alpha) <= alpha` under the null (Ville's
//! inequality), at any night and whatever nights are looked at. The price of not knowing
//! the night: `ln(j (j + 1))` nats for a change j nights into the chain.
//!
//! Change points whose `after` is still empty are left out of the sum (their terms are
//! non-negative), so the e-value computed is at most the mixture's and keeps its validity.
//!
//! Pure.

use statrs::function::beta::ln_beta;

/// Jeffreys prior shape: keeps the mixture honest near a rate of 0, where clean cells live.
const PRIOR: f64 = 0.5;

/// Judged and corrupted sessions of one night (or of nights pooled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    pub corrupted: u64,
    pub judged: u64,
}

impl std::ops::Add for Tally {
    type Output = Tally;

    fn add(self, other: Tally) -> Tally {
        Tally::new(self.corrupted + other.corrupted, self.judged + other.judged)
    }
}

impl Tally {
    pub fn new(corrupted: u64, judged: u64) -> Tally {
        assert!(corrupted <= judged, "{corrupted} corrupted of {judged}");
        Tally { corrupted, judged }
    }

    pub fn sum(nights: &[Tally]) -> Tally {
        nights.iter().fold(Tally::default(), |a, &t| a + t)
    }

    pub fn rate(self) -> f64 {
        crate::stats::rate(self.corrupted, self.judged)
    }

    fn clean(self) -> u64 {
        self.judged - self.corrupted
    }
}

/// Which change the evidence is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The rate rose (a regression).
    Rise,
    /// The rate fell (a regression mended).
    Drop,
}

/// The cell's evidence over its chain of nights.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainEvidence {
    /// The mixture e-value, `None` while the chain has fewer than two nights.
    pub e_value: Option<f64>,
    /// The likeliest change point (index into the chain: the first night after it),
    /// the one with the largest `E_j`.
    pub change_at: Option<usize>,
}

/// The e-value for a `change` at each night of `chain` (nights in order), mixed.
pub fn chain_evidence(chain: &[Tally], change: Change) -> ChainEvidence {
    let mut total = 0.0;
    let mut best: Option<(usize, f64)> = None;
    for j in 1..chain.len() {
        let before = Tally::sum(&chain[..j]);
        let after = Tally::sum(&chain[j..]);
        let e = match change {
            Change::Rise => split_e_value(before, after),
            Change::Drop => split_e_value(after, before),
        };
        let w = 1.0 / (j as f64 * (j as f64 + 1.0));
        total += w * e;
        if best.is_none_or(|(_, b)| e > b) {
            best = Some((j, e));
        }
    }
    ChainEvidence {
        e_value: (chain.len() >= 2).then_some(total),
        change_at: best.map(|(j, _)| j),
    }
}

/// `E_j` for "the rate of `high` is above the rate of `low`" against "it is not".
pub fn split_e_value(low: Tally, high: Tally) -> f64 {
    let ln_q = ln_marginal(low) + ln_marginal(high);
    let ln_d = if high.rate() <= low.rate() {
        ln_lik(low.rate(), low) + ln_lik(high.rate(), high)
    } else {
        let pooled = (low + high).rate();
        ln_lik(pooled, low) + ln_lik(pooled, high)
    };
    // Capped where f64 ends: a record must hold a number, and such evidence is final.
    (ln_q - ln_d).min(LN_CAP).exp()
}

/// The largest e-value kept (about 1e300).
const LN_CAP: f64 = 690.0;

/// ln of the Jeffreys marginal likelihood of the sessions (in order): B(k+1/2, n-k+1/2)/B(1/2,1/2).
fn ln_marginal(t: Tally) -> f64 {
    ln_beta(t.corrupted as f64 + PRIOR, t.clean() as f64 + PRIOR) - ln_beta(PRIOR, PRIOR)
}

/// ln L(p) of the sessions, 0 ln 0 taken as 0.
fn ln_lik(p: f64, t: Tally) -> f64 {
    let term = |count: u64, q: f64| {
        if count == 0 {
            0.0
        } else {
            count as f64 * q.ln()
        }
    };
    term(t.corrupted, p) + term(t.clean(), 1.0 - p)
}
