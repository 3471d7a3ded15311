//! The evidence at one look (docs/sequential.md): the log e-value of a block of `on` and
//! `off` sessions (Turner, Ly and Grunwald 2021) and the always-valid interval of one
//! arm's rate (Robbins 1970), narrowed look by look.

use statrs::function::beta::ln_beta;

use super::{
    Bet, PlugInPrior, SequentialDesign, Tally, CLEAN_BASELINE, PLUG_IN_SHARE, SEQUENCE_PRIOR,
};

/// Log of one block's e-variable (Turner, Ly and Grunwald 2021; safestats
/// `calculateETwoProportions`): the likelihood of the block under the plug-in rates
/// `ta`, `tb` (from the earlier blocks `past_on`, `past_off`) over its likelihood under the
/// common rate `t0 = (na ta + nb tb) / (na + nb)`.
pub(crate) fn block_log_e_value(past_on: Tally, past_off: Tally, on: Tally, off: Tally) -> f64 {
    block_log_e_value_with(past_on, past_off, PlugInPrior::default(), on, off)
}

/// [`block_log_e_value`] with the plug-in estimates starting from `prior`.
pub(crate) fn block_log_e_value_with(
    past_on: Tally,
    past_off: Tally,
    prior: PlugInPrior,
    on: Tally,
    off: Tally,
) -> f64 {
    block_log_likelihood_ratio(
        past_on.plug_in_with(prior.on),
        past_off.plug_in_with(prior.off),
        on,
        off,
    )
}

/// Log of one block's e-variable for given rates `theta_a` (on) and `theta_b` (off), both
/// inside (0, 1): `p_{ta,tb}(block) / p_{t0,t0}(block)`, `t0 = (na ta + nb tb) / (na +
/// nb)`. Its expectation is at most 1 under every common rate whenever the rates do not
/// depend on the block itself: plug-in estimates from earlier blocks, or fixed
/// alternatives ([`super::Bet`]).
pub(crate) fn block_log_likelihood_ratio(theta_a: f64, theta_b: f64, on: Tally, off: Tally) -> f64 {
    let (na, nb) = (on.sessions as f64, off.sessions as f64);
    if na + nb == 0.0 {
        return 0.0;
    }
    let theta_0 = (na * theta_a + nb * theta_b) / (na + nb);
    let log_ratio = |block: Tally, theta: f64| {
        let (k, n) = (block.corrupted as f64, block.sessions as f64);
        k * (theta / theta_0).ln() + (n - k) * ((1.0 - theta) / (1.0 - theta_0)).ln()
    };
    log_ratio(on, theta_a) + log_ratio(off, theta_b)
}

/// One e-process of a [`Bet`]: the plug-in estimates, or a fixed alternative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Component {
    PlugIn,
    Fixed { on: f64, off: f64 },
}

/// Fixed alternatives stay this far inside (0, 1), so that every block's factor is finite.
const FIXED_RATE_FLOOR: f64 = 1e-4;

/// The components of a bet with their weights (summing to 1).
pub(crate) fn components(bet: Bet, design: &SequentialDesign) -> Vec<(f64, Component)> {
    let fixed = |on: f64, off: f64| {
        let clamp = |rate: f64| rate.clamp(FIXED_RATE_FLOOR, 1.0 - FIXED_RATE_FLOOR);
        Component::Fixed {
            on: clamp(on),
            off: clamp(off),
        }
    };
    match bet {
        Bet::PlugIn => vec![(1.0, Component::PlugIn)],
        Bet::Fixed { on, off } => vec![(1.0, fixed(on, off))],
        Bet::DesignMixture => {
            let (m, b) = (design.min_effect, design.baseline);
            let mut baselines = vec![b];
            if b > CLEAN_BASELINE {
                baselines.push(CLEAN_BASELINE);
            }
            let alternatives: Vec<Component> = baselines
                .iter()
                .flat_map(|&base| [fixed(base + m, base), fixed(base, base + m)])
                .collect();
            let share = (1.0 - PLUG_IN_SHARE) / alternatives.len() as f64;
            std::iter::once((PLUG_IN_SHARE, Component::PlugIn))
                .chain(alternatives.into_iter().map(|c| (share, c)))
                .collect()
        }
    }
}

/// Log of the mixture `sum_i w_i exp(log_wealth_i)` (log-sum-exp).
pub(crate) fn log_mixture(weights: &[(f64, Component)], log_wealth: &[f64]) -> f64 {
    let weighted = || weights.iter().zip(log_wealth).map(|((w, _), l)| w.ln() + l);
    let top = weighted().fold(f64::NEG_INFINITY, f64::max);
    top + weighted().map(|l| (l - top).exp()).sum::<f64>().ln()
}

/// Robbins' conjugate-mixture confidence sequence for a Bernoulli rate after `k` of `n`:
/// the rates p whose mixture martingale `B(a+k, b+n-k) / B(a, b) / (p^k (1-p)^(n-k))`,
/// a = b = SEQUENCE_PRIOR, is below 1/alpha. It covers the true rate at every n at once
/// with probability >= 1 - alpha. n = 0 gives [0, 1].
pub(crate) fn mixture_confidence_sequence(k: u64, n: u64, alpha: f64) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    let k = k.min(n);
    let (kf, nf) = (k as f64, n as f64);
    let log_marginal = ln_beta(SEQUENCE_PRIOR + kf, SEQUENCE_PRIOR + nf - kf)
        - ln_beta(SEQUENCE_PRIOR, SEQUENCE_PRIOR);
    let threshold = -alpha.ln();
    // Convex in p with its minimum (<= 0) at k/n: each bound is a single crossing.
    let excluded = |p: f64| {
        let log_likelihood = if k == 0 {
            nf * (1.0 - p).ln()
        } else if k == n {
            kf * p.ln()
        } else {
            kf * p.ln() + (nf - kf) * (1.0 - p).ln()
        };
        log_marginal - log_likelihood >= threshold
    };
    let centre = kf / nf;
    let lower = if k == 0 {
        0.0
    } else {
        bisect_crossing(0.0, centre, |p| !excluded(p))
    };
    let upper = if k == n {
        1.0
    } else {
        // The first excluded rate above the centre; `bisect_crossing` wants the predicate
        // false below the crossing.
        bisect_crossing(centre, 1.0, excluded)
    };
    [lower, upper]
}

/// The point in [lo, hi] where `predicate` turns from false to true (it must be false at
/// lo, true at hi, and switch once), to 1e-12.
fn bisect_crossing(mut lo: f64, mut hi: f64, predicate: impl Fn(f64) -> bool) -> f64 {
    while hi - lo > 1e-12 {
        let mid = 0.5 * (lo + hi);
        if predicate(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The running intersection of two intervals; an empty one (possible only when an
/// interval already missed the truth) keeps the newer interval.
pub(super) fn intersect(old: [f64; 2], new: [f64; 2]) -> [f64; 2] {
    let joined = [old[0].max(new[0]), old[1].min(new[1])];
    if joined[0] <= joined[1] {
        joined
    } else {
        new
    }
}
