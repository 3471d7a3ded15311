//! Small pure statistics behind the verdict of `bisect run` (docs/design.md 3.7): interval
//! estimates for a corruption rate, the test and interval comparing two arms, the sample
//! size that would resolve a given difference, and a multiplicity adjustment.
//!
//! Methods, each implemented as its source states it:
//! - Wilson score interval for one proportion: E. B. Wilson (1927), "Probable inference,
//!   the law of succession, and statistical inference", JASA 22:209-212.
//! - Clopper-Pearson exact interval: C. J. Clopper and E. S. Pearson (1934), Biometrika
//!   26:404-413, computed through the Beta quantile:
//!   lower = B(alpha/2; k, n-k+1), upper = B(1-alpha/2; k+1, n-k).
//! - Fisher's exact test for a 2x2 table, one-sided (the hypergeometric upper tail, the
//!   matrix's regression test and the load sweep's level test) and two-sided: the sum of the hypergeometric
//!   probabilities (margins fixed) that are no larger than the observed table's, with the
//!   relative tolerance 1e-7 that R's `fisher.test` uses, so tables tied in exact
//!   arithmetic are not split by rounding.
//! - Difference of two proportions: R. G. Newcombe (1998), "Interval estimation for the
//!   difference between independent proportions: comparison of eleven methods",
//!   Statistics in Medicine 17:873-890, method 10 (hybrid score, from two Wilson intervals).
//! - The fewest sessions any sequential test can expect to need (the bound a sequential
//!   design is measured against, docs/sequential.md "How close to the bound"): Wald's
//!   inequality for the expected sample size of a test with error probabilities alpha and
//!   beta, E1[N] >= ((1-beta) ln((1-beta)/alpha) + beta ln(beta/(1-alpha))) / KL (A. Wald
//!   (1945), "Sequential tests of statistical hypotheses", Ann. Math. Statist. 16:117-186,
//!   section 4.4; A. Tartakovsky, I. Nikiforov, M. Basseville (2014), *Sequential
//!   Analysis*, Lemma 3.2.1), with KL the information per pair of sessions between the
//!   alternative and the nearest null (both arms at (p_on + p_off) / 2).
//! - Sessions per arm for two proportions: normal approximation with the continuity
//!   correction of Casagrande, Pike and Smith (1978), Biometrics 34:483-486, in the closed
//!   form of Fleiss, Tytun and Ury (1980), Biometrics 36:343-346 (also Fleiss, "Statistical
//!   Methods for Rates and Proportions", eq. 4.19). The correction makes it match the
//!   power of Fisher's exact test, which is the test the verdict runs.
//! - Holm (1979), "A simple sequentially rejective multiple test procedure", Scandinavian
//!   Journal of Statistics 6:65-70: step-down adjusted p-values, as R's `p.adjust(, "holm")`.
//!
//! - The binomial upper tail P(X >= k), X ~ Binomial(n, p): the conditional test of two
//!   Poisson rates (core::deaths) is its tail at p = e_a / (e_a + e_b).
//!
//! - Percentiles of latencies by the nearest-rank method (the smallest value with at least
//!   a fraction q of the values at or below it), as the driver reports them.
//!
//! Distributions come from `statrs`; nothing here does I/O.

#[cfg(test)]
use statrs::distribution::Beta;
use statrs::distribution::{ContinuousCDF, Discrete, Hypergeometric, Normal};

/// R's `fisher.test` tolerance: probabilities within this relative margin of the observed
/// table's count as "no more likely" than it.
const FISHER_RELATIVE_TOLERANCE: f64 = 1e-7;

/// P(X >= k) for X ~ Binomial(n, p): 1 for k = 0, 0 for k > n; summed exactly from
/// `statrs`' probability mass (n is a count of engine deaths: small).
pub(crate) fn binomial_upper_tail(k: u64, n: u64, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    let dist =
        statrs::distribution::Binomial::new(p.clamp(0.0, 1.0), n).expect("p is clamped to [0, 1]");
    (k..=n).map(|i| dist.pmf(i)).sum::<f64>().min(1.0)
}

/// The observed proportion k/n; an empty sample has rate 0 by convention (its intervals
/// below are the whole [0, 1], which is what carries the "no information").
pub fn rate(k: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        k.min(n) as f64 / n as f64
    }
}

/// The standard normal quantile z with P(|Z| <= z) = confidence (1.959964 for 0.95);
/// NaN for a NaN confidence (the intervals built on it are then NaN, not a panic).
pub(crate) fn two_sided_z(confidence: f64) -> f64 {
    if confidence.is_nan() {
        return f64::NAN;
    }
    let confidence = confidence.clamp(0.0, 1.0);
    standard_normal().inverse_cdf(1.0 - (1.0 - confidence) / 2.0)
}

fn standard_normal() -> Normal {
    Normal::new(0.0, 1.0).expect("the standard normal has valid parameters")
}

/// Wilson score interval for k successes in n trials at the given confidence (0.95).
/// n = 0 gives [0, 1]; k = 0 gives a lower bound of exactly 0 and k = n an upper bound of
/// exactly 1 (the formula reaches them only up to rounding).
pub fn wilson(k: u64, n: u64, confidence: f64) -> (f64, f64) {
    if confidence.is_nan() {
        return (f64::NAN, f64::NAN);
    }
    if n == 0 {
        return (0.0, 1.0);
    }
    let k = k.min(n);
    let n_f = n as f64;
    let p = k as f64 / n_f;
    let z = two_sided_z(confidence);
    let z2 = z * z;
    let denominator = 1.0 + z2 / n_f;
    let centre = (p + z2 / (2.0 * n_f)) / denominator;
    let half_width = z * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt() / denominator;
    let lower = if k == 0 {
        0.0
    } else {
        (centre - half_width).max(0.0)
    };
    let upper = if k == n {
        1.0
    } else {
        (centre + half_width).min(1.0)
    };
    (lower, upper)
}

/// Clopper-Pearson exact interval for k successes in n trials at the given confidence.
/// n = 0 gives [0, 1]; k = 0 has lower bound 0 and k = n upper bound 1 (the Beta
/// quantiles there have a zero shape parameter).
#[cfg(test)]
pub(crate) fn clopper_pearson(k: u64, n: u64, confidence: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    if confidence.is_nan() {
        return (f64::NAN, f64::NAN);
    }
    let k = k.min(n);
    let tail = (1.0 - confidence.clamp(0.0, 1.0)) / 2.0;
    let lower = if k == 0 {
        0.0
    } else {
        Beta::new(k as f64, (n - k + 1) as f64)
            .expect("shapes are positive when 0 < k <= n")
            .inverse_cdf(tail)
    };
    let upper = if k == n {
        1.0
    } else {
        Beta::new((k + 1) as f64, (n - k) as f64)
            .expect("shapes are positive when 0 <= k < n")
            .inverse_cdf(1.0 - tail)
    };
    (lower, upper)
}

/// One-sided Fisher exact p for `[[a, b], [c, d]]` = night (corrupted a, clean b) over
/// baseline (corrupted c, clean d): the probability, margins fixed, of a night count of
/// at least `a`. An empty row or column carries no evidence: p = 1.
pub fn fisher_one_sided_greater(a: u64, b: u64, c: u64, d: u64) -> f64 {
    let population = a + b + c + d;
    let successes = a + c;
    let draws = a + b;
    if successes == 0 || successes == population || draws == 0 || draws == population {
        return 1.0;
    }
    let h = Hypergeometric::new(population, successes, draws)
        .expect("margins of a 2x2 table never exceed its total");
    // A tail from the lowest count the margins allow is the whole distribution: 1
    // exactly, not a rounded sum of every probability.
    if a <= draws.saturating_sub(population - successes) {
        return 1.0;
    }
    let highest = successes.min(draws);
    // Summing the tail directly (not 1 - cdf) keeps tiny p-values exact instead of 0.
    let tail: f64 = (a..=highest).map(|x| h.pmf(x)).sum();
    tail.clamp(0.0, 1.0)
}

/// Two-sided Fisher exact p-value for the 2x2 table
/// `[[a, b], [c, d]]` = arm 1 (corrupted a, clean b) over arm 2 (corrupted c, clean d).
/// A table with an empty row or column carries no evidence: p = 1.
pub fn fisher_exact_two_sided(a: u64, b: u64, c: u64, d: u64) -> f64 {
    let population = a + b + c + d;
    let successes = a + c; // corrupted, both arms
    let draws = a + b; // arm 1's sessions
    if successes == 0 || successes == population || draws == 0 || draws == population {
        return 1.0;
    }
    let hypergeometric = Hypergeometric::new(population, successes, draws)
        .expect("margins of a 2x2 table never exceed its total");
    let lowest = draws.saturating_sub(population - successes);
    let highest = successes.min(draws);
    // Work in logs relative to the largest term: the tails of big tables underflow f64,
    // and normalising by the sum cancels the rounding of ln-gamma in the constant.
    let log_pmf: Vec<f64> = (lowest..=highest)
        .map(|x| hypergeometric.ln_pmf(x))
        .collect();
    let largest = log_pmf.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let relative: Vec<f64> = log_pmf.iter().map(|l| (l - largest).exp()).collect();
    let observed = relative[(a - lowest) as usize];
    let threshold = observed * (1.0 + FISHER_RELATIVE_TOLERANCE);
    let total: f64 = relative.iter().sum();
    let as_extreme: f64 = relative.iter().filter(|&&r| r <= threshold).sum();
    (as_extreme / total).clamp(0.0, 1.0)
}

/// Newcombe's hybrid score interval (method 10) for p1 - p2, p_i = k_i / n_i.
/// Returns (p1 - p2, lower, upper). An empty arm leaves the difference unknown: the
/// interval is then [-1, 1] around the conventional rate 0 of that arm.
pub fn newcombe_diff(k1: u64, n1: u64, k2: u64, n2: u64, confidence: f64) -> (f64, f64, f64) {
    let p1 = rate(k1, n1);
    let p2 = rate(k2, n2);
    let difference = p1 - p2;
    if n1 == 0 || n2 == 0 {
        return (difference, -1.0, 1.0);
    }
    let (l1, u1) = wilson(k1, n1, confidence);
    let (l2, u2) = wilson(k2, n2, confidence);
    let lower = difference - ((p1 - l1).powi(2) + (u2 - p2).powi(2)).sqrt();
    let upper = difference + ((u1 - p1).powi(2) + (p2 - l2).powi(2)).sqrt();
    (difference, lower.max(-1.0), upper.min(1.0))
}

/// Sessions per arm needed for a two-sided test at level `alpha` to detect, with the given
/// `power`, a difference of `min_effect` from a base rate `p_base` (the alternative is
/// p_base + min_effect, or p_base - min_effect where that would pass 1).
/// Fleiss-Tytun-Ury continuity-corrected formula:
/// n' = (z_a sqrt(2 pbar qbar) + z_b sqrt(p1 q1 + p2 q2))^2 / delta^2,
/// n = n'/4 (1 + sqrt(1 + 4 / (n' delta)))^2, rounded up.
/// A non-positive or non-finite `min_effect` can never be resolved, and alpha or power
/// outside (0, 1) sizes nothing: both give u64::MAX.
pub fn sessions_per_arm(p_base: f64, min_effect: f64, alpha: f64, power: f64) -> u64 {
    let is_probability = |x: f64| x > 0.0 && x < 1.0;
    if !min_effect.is_finite()
        || min_effect <= 0.0
        || !p_base.is_finite()
        || !is_probability(alpha)
        || !is_probability(power)
    {
        return u64::MAX;
    }
    let p1 = p_base.clamp(0.0, 1.0);
    let p2 = if p1 + min_effect <= 1.0 {
        p1 + min_effect
    } else {
        (p1 - min_effect).max(0.0)
    };
    let delta = (p1 - p2).abs();
    if delta == 0.0 {
        return u64::MAX;
    }
    let normal = standard_normal();
    let z_alpha = normal.inverse_cdf(1.0 - alpha / 2.0);
    let z_beta = normal.inverse_cdf(power);
    let p_bar = (p1 + p2) / 2.0;
    let uncorrected = (z_alpha * (2.0 * p_bar * (1.0 - p_bar)).sqrt()
        + z_beta * (p1 * (1.0 - p1) + p2 * (1.0 - p2)).sqrt())
    .powi(2)
        / (delta * delta);
    let corrected = uncorrected / 4.0 * (1.0 + (1.0 + 4.0 / (uncorrected * delta)).sqrt()).powi(2);
    // Guard the ceiling against rounding that pushes an exact integer just above itself.
    (corrected - 1e-9).ceil().max(1.0) as u64
}

/// The fewest sessions per arm that any test, sequential or not, of "the arms share a
/// rate" at level `alpha` can expect to spend when the arms are at `p_on` and `p_off`
/// and it implicates the flag with probability `power` there (Wald's bound, above).
/// Infinite when the rates are equal.
pub fn wald_min_sessions_per_arm(p_on: f64, p_off: f64, alpha: f64, power: f64) -> f64 {
    let kl = |p: f64, q: f64| {
        let term = |a: f64, b: f64| if a > 0.0 { a * (a / b).ln() } else { 0.0 };
        term(p, q) + term(1.0 - p, 1.0 - q)
    };
    let common = (p_on + p_off) / 2.0;
    let per_pair = kl(p_on, common) + kl(p_off, common);
    let beta = 1.0 - power;
    let information = power * (power / alpha).ln() + beta * (beta / (1.0 - alpha)).ln();
    if per_pair > 0.0 {
        information / per_pair
    } else {
        f64::INFINITY
    }
}

/// Holm step-down adjusted p-values, in the input order (R's `p.adjust(p, "holm")`):
/// sorted ascending, the i-th smallest (0-based) becomes max over j <= i of
/// min(1, (m - j) p_(j)). NaN inputs stay NaN and do not count towards m, as in R.
pub fn holm(p_values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p_values.len())
        .filter(|&i| !p_values[i].is_nan())
        .collect();
    order.sort_by(|&i, &j| p_values[i].total_cmp(&p_values[j]));
    let m = order.len();
    let mut adjusted = vec![f64::NAN; p_values.len()];
    let mut running_max = 0.0_f64;
    for (rank, &index) in order.iter().enumerate() {
        let scaled = ((m - rank) as f64 * p_values[index]).min(1.0);
        running_max = running_max.max(scaled);
        adjusted[index] = running_max;
    }
    adjusted
}

/// Nearest-rank percentile of an ascending slice (`q` in 0..=1); 0 for an empty one.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values worked by hand from the formula: 3% vs 0% at alpha 0.01, power
    /// 0.8: KL per pair 0.021023, information 3.18565, 151.5 per arm; 5% vs 1%: KL
    /// 0.014970, 212.8 per arm (0.60 of the 353 + 353 fixed design at 6% vs 1%).
    #[test]
    fn walds_bound_at_reference_values() {
        let b = wald_min_sessions_per_arm(0.03, 0.0, 0.01, 0.8);
        assert!((b - 151.53).abs() < 0.1, "{b}");
        let b = wald_min_sessions_per_arm(0.05, 0.01, 0.01, 0.8);
        assert!((b - 212.8).abs() < 0.2, "{b}");
        assert!((2.0 * b / 706.0 - 0.603).abs() < 0.001);
        assert_eq!(
            wald_min_sessions_per_arm(0.1, 0.1, 0.01, 0.8),
            f64::INFINITY
        );
        // Symmetric in the arms, and falling as the effect grows.
        assert_eq!(
            wald_min_sessions_per_arm(0.05, 0.01, 0.01, 0.8),
            wald_min_sessions_per_arm(0.01, 0.05, 0.01, 0.8)
        );
        let big = wald_min_sessions_per_arm(0.18, 0.01, 0.01, 0.8);
        assert!((big - 31.7).abs() < 0.1, "{big}");
    }

    #[test]
    fn binomial_upper_tail_matches_reference_values() {
        // R: pbinom(2, 10, 0.3, lower.tail = FALSE) = 0.6172172
        assert!((binomial_upper_tail(3, 10, 0.3) - 0.617_217_2).abs() < 1e-6);
        // R: pbinom(4, 5, 0.5, lower.tail = FALSE) = 0.03125
        assert!((binomial_upper_tail(5, 5, 0.5) - 0.03125).abs() < 1e-12);
        assert_eq!(binomial_upper_tail(0, 5, 0.2), 1.0);
        assert_eq!(binomial_upper_tail(6, 5, 0.2), 0.0);
    }

    fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
        (actual - expected).abs() <= tolerance
    }

    macro_rules! assert_close {
        ($actual:expr, $expected:expr, $tolerance:expr) => {{
            let (actual, expected) = ($actual, $expected);
            assert!(
                close(actual, expected, $tolerance),
                "{} = {actual}, expected {expected} +- {}",
                stringify!($actual),
                $tolerance
            );
        }};
    }

    #[test]
    fn z_for_95_percent() {
        assert_close!(two_sided_z(0.95), 1.959963984540054, 1e-9);
    }

    // Wilson references: the closed form evaluated in exact-ish Python floats with
    // z = 1.959963984540054 (the same numbers R's prop.test(correct = FALSE) prints).
    #[test]
    fn wilson_matches_reference_values() {
        let (lo, hi) = wilson(0, 80, 0.95);
        assert_eq!(lo, 0.0);
        assert_close!(hi, 0.0458181295355271, 1e-12);

        let (lo, hi) = wilson(14, 80, 0.95);
        assert_close!(lo, 0.10720636440977926, 1e-12);
        assert_close!(hi, 0.2725754197883133, 1e-12);

        let (lo, hi) = wilson(2, 60, 0.95);
        assert_close!(lo, 0.009189319256197877, 1e-12);
        assert_close!(hi, 0.113637742743086, 1e-12);

        let (lo, hi) = wilson(80, 80, 0.95);
        assert_close!(lo, 0.9541818704644728, 1e-12);
        assert_eq!(hi, 1.0);
    }

    #[test]
    fn wilson_edge_cases() {
        assert_eq!(wilson(0, 0, 0.95), (0.0, 1.0));
        let (lo, hi) = wilson(1, 1, 0.95);
        assert_close!(lo, 0.20654931437723745, 1e-12);
        assert_eq!(hi, 1.0);
        // k > n is clamped rather than producing an interval outside [0, 1].
        assert_eq!(wilson(5, 4, 0.95), wilson(4, 4, 0.95));
        // A NaN confidence propagates instead of panicking inside the quantile.
        assert!(wilson(3, 10, f64::NAN).0.is_nan());
        assert!(clopper_pearson(3, 10, f64::NAN).1.is_nan());
    }

    // Clopper-Pearson at k = 0 and k = n has the closed forms 1 - (alpha/2)^(1/n) and
    // (alpha/2)^(1/n); the interior values are scipy beta.ppf(0.025, 14, 67) and
    // beta.ppf(0.975, 15, 66), the same as R binom.test(14, 80)$conf.int.
    #[test]
    fn clopper_pearson_matches_reference_values() {
        let (lo, hi) = clopper_pearson(0, 80, 0.95);
        assert_eq!(lo, 0.0);
        assert_close!(hi, 1.0 - 0.025_f64.powf(1.0 / 80.0), 1e-10);
        assert_close!(hi, 0.0450640350676923, 1e-10);

        let (lo, hi) = clopper_pearson(80, 80, 0.95);
        assert_close!(lo, 0.9549359649323077, 1e-10);
        assert_eq!(hi, 1.0);

        let (lo, hi) = clopper_pearson(14, 80, 0.95);
        assert_close!(lo, 0.09911050983942865, 1e-9);
        assert_close!(hi, 0.27615403952101353, 1e-9);

        assert_eq!(clopper_pearson(0, 0, 0.95), (0.0, 1.0));
    }

    #[test]
    fn clopper_pearson_is_wider_than_wilson() {
        for (k, n) in [(1, 10), (14, 80), (2, 60), (30, 31)] {
            let (wl, wu) = wilson(k, n, 0.95);
            let (cl, cu) = clopper_pearson(k, n, 0.95);
            assert!(
                cl <= wl && cu >= wu,
                "{k}/{n}: CP [{cl}, {cu}] vs Wilson [{wl}, {wu}]"
            );
        }
    }

    // Fisher references: exact rational sums (Python fractions over math.comb) with R's
    // 1e-7 tolerance; [[1, 9], [11, 3]] is also the example in scipy's fisher_exact docs.
    #[test]
    fn fisher_matches_exact_rational_reference() {
        for ((a, b, c, d), want, tol) in [
            ((14, 66, 0, 80), 6.553361437755207e-05, 1e-13),
            ((0, 80, 14, 66), 6.553361437755207e-05, 1e-13),
            ((2, 58, 0, 60), 0.4957983193277311, 1e-12),
            ((1, 9, 11, 3), 0.0027594561852200836, 1e-12),
            ((3, 7, 1, 9), 0.5820433436532507, 1e-12),
            ((5, 0, 0, 5), 0.007936507936507936, 1e-13),
            ((0, 400, 1, 399), 1.0, 1e-12),
        ] {
            assert_close!(fisher_exact_two_sided(a, b, c, d), want, tol);
        }
    }

    #[test]
    fn fisher_degenerate_tables_carry_no_evidence() {
        assert_eq!(fisher_exact_two_sided(0, 0, 0, 0), 1.0);
        assert_eq!(fisher_exact_two_sided(0, 80, 0, 80), 1.0);
        assert_eq!(fisher_exact_two_sided(80, 0, 80, 0), 1.0);
        assert_eq!(fisher_exact_two_sided(0, 0, 3, 5), 1.0);
    }

    // Same exact rational reference: the tails of these tables lie far below what a
    // direct product of binomial coefficients can hold in f64.
    #[test]
    fn fisher_handles_large_tables_without_underflow() {
        assert_close!(fisher_exact_two_sided(500, 4500, 500, 4500), 1.0, 1e-9);
        assert_close!(
            fisher_exact_two_sided(520, 4480, 480, 4520),
            0.19358022280023487,
            1e-9
        );
        let p = fisher_exact_two_sided(100, 900, 0, 1000);
        assert_close!(p / 1.165089965262989e-31, 1.0, 1e-6);
        let p = fisher_exact_two_sided(300, 2700, 0, 3000);
        assert_close!(p / 3.745807731360066e-94, 1.0, 1e-6);
    }

    // Newcombe (1998), Table II, method 10: his worked examples, to his 4 decimals.
    #[test]
    fn newcombe_reproduces_the_papers_examples() {
        let cases = [
            ((56, 70, 48, 80), (0.2, 0.0524, 0.3339)),
            ((9, 10, 3, 10), (0.6, 0.1705, 0.8090)),
            ((6, 7, 2, 7), (4.0 / 7.0, 0.0582, 0.8062)),
            ((5, 56, 0, 29), (5.0 / 56.0, -0.0381, 0.1926)),
            ((0, 10, 0, 20), (0.0, -0.1611, 0.2775)),
            ((0, 10, 0, 10), (0.0, -0.2775, 0.2775)),
            ((10, 10, 0, 20), (1.0, 0.6791, 1.0)),
        ];
        for ((k1, n1, k2, n2), (d, lo, hi)) in cases {
            let (diff, lower, upper) = newcombe_diff(k1, n1, k2, n2, 0.95);
            assert_close!(diff, d, 1e-12);
            assert_close!(lower, lo, 6e-5);
            assert_close!(upper, hi, 6e-5);
        }
    }

    #[test]
    fn newcombe_empty_arm_is_uninformative() {
        let (diff, lo, hi) = newcombe_diff(3, 10, 0, 0, 0.95);
        assert_close!(diff, 0.3, 1e-12);
        assert_eq!((lo, hi), (-1.0, 1.0));
    }

    // References: the Fleiss-Tytun-Ury formula evaluated in Python with scipy's norm.ppf
    // (n' = 434.43 -> n = 473.59 for 0.05 vs 0.10; Fleiss's Table A.4 lists 474 there).
    #[test]
    fn sessions_per_arm_matches_fleiss_formula() {
        assert_eq!(sessions_per_arm(0.05, 0.05, 0.05, 0.8), 474);
        assert_eq!(sessions_per_arm(1.0 / 60.0, 0.05, 0.01, 0.8), 411);
        assert_eq!(sessions_per_arm(0.0, 0.05, 0.01, 0.8), 265);
        assert_eq!(sessions_per_arm(0.02, 0.05, 0.01, 0.8), 440);
        // The alternative flips below p_base when p_base + min_effect would exceed 1,
        // and the formula is symmetric under p -> 1 - p.
        assert_eq!(sessions_per_arm(0.98, 0.05, 0.01, 0.8), 440);
    }

    #[test]
    fn sessions_per_arm_monotone_and_guarded() {
        assert!(sessions_per_arm(0.1, 0.05, 0.01, 0.9) > sessions_per_arm(0.1, 0.05, 0.01, 0.8));
        assert!(sessions_per_arm(0.1, 0.02, 0.01, 0.8) > sessions_per_arm(0.1, 0.05, 0.01, 0.8));
        assert!(sessions_per_arm(0.1, 0.05, 0.01, 0.8) > sessions_per_arm(0.1, 0.05, 0.05, 0.8));
        assert_eq!(sessions_per_arm(0.1, 0.0, 0.01, 0.8), u64::MAX);
        assert_eq!(sessions_per_arm(0.1, f64::NAN, 0.01, 0.8), u64::MAX);
        assert_eq!(sessions_per_arm(0.1, 0.05, 0.0, 0.8), u64::MAX);
        assert_eq!(sessions_per_arm(0.1, 0.05, 0.01, f64::NAN), u64::MAX);
    }

    // R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02
    #[test]
    fn holm_matches_r_p_adjust() {
        let adjusted = holm(&[0.01, 0.04, 0.03, 0.005]);
        for (a, e) in adjusted.iter().zip([0.03, 0.06, 0.06, 0.02]) {
            assert_close!(*a, e, 1e-12);
        }
        // Capped at 1, monotone in the sorted order.
        let adjusted = holm(&[0.5, 0.9, 0.02]);
        for (a, e) in adjusted.iter().zip([1.0, 1.0, 0.06]) {
            assert_close!(*a, e, 1e-12);
        }
        assert!(holm(&[]).is_empty());
        // NaN stays NaN and m counts the others only: p.adjust(c(0.01, NA, 0.02), "holm").
        let adjusted = holm(&[0.01, f64::NAN, 0.02]);
        assert_close!(adjusted[0], 0.02, 1e-12);
        assert!(adjusted[1].is_nan());
        assert_close!(adjusted[2], 0.02, 1e-12);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
