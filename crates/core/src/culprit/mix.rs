//! The class-mix test of the culprit search: does a step's failure look like the
//! reference failure? A step counts as "still failing" only if the classes of its
//! corrupted sessions (leak, bad_args, wrong_args, no_tool, rejected) are distributed like those
//! of the failing end's; a different mix is a different failure mode, reported apart.
//!
//! Method: the Freeman-Halton extension of Fisher's exact test to a 2 x c table
//! (Freeman and Halton 1951, "Note on an exact treatment of contingency, goodness of fit
//! and other problems of significance", Biometrika 38; R's `fisher.test` on an r x c
//! table computes the same p-value). With the row totals (corrupted sessions of the step
//! and of the reference) and the column totals (sessions of each class) fixed, a table's
//! probability is the multivariate hypergeometric `prod_j C(c_j, x_j) / C(N, r_1)`; the
//! p-value sums the probabilities of every table no more likely than the observed one
//! (with R's relative tolerance of 1e-7). Exact, so small counts (a handful of corrupted
//! sessions per step) need no chi-square approximation. Enumeration is over the first
//! row only (the second follows from the margins): at most a few thousand tables for
//! the counts a search meets; above [`MAX_TABLES`] it falls back to Pearson's chi-square
//! with (columns used - 1) degrees of freedom. No I/O.

use statrs::distribution::{ChiSquared, ContinuousCDF};
use statrs::function::factorial::ln_binomial;

use crate::session::SessionClass;

/// Above this many candidate tables the test uses the chi-square approximation.
pub(super) const MAX_TABLES: u64 = 2_000_000;

/// Counts of each corrupted class in `classes`, in the enum's order
/// ([`SessionClass::corrupted`]): the columns of the table (an unused column drops out of
/// the test, so outcomes without rejections are judged as before).
pub(super) fn corrupted_mix<'a>(classes: impl IntoIterator<Item = &'a SessionClass>) -> Vec<u64> {
    let mut counts = crate::session::Counts::default();
    for c in classes {
        counts.add(*c);
    }
    SessionClass::corrupted().map(|c| counts[c]).collect()
}

/// Two-sided p-value that rows `a` and `b` come from the same class distribution.
/// 1.0 when either row is empty or only one class occurs (nothing to compare).
pub(super) fn mix_p_value(a: &[u64], b: &[u64]) -> f64 {
    assert_eq!(a.len(), b.len(), "rows of different width");
    let cols: Vec<(u64, u64)> = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x, y))
        .filter(|(x, y)| x + y > 0)
        .collect();
    let r1: u64 = cols.iter().map(|c| c.0).sum();
    let r2: u64 = cols.iter().map(|c| c.1).sum();
    if cols.len() < 2 || r1 == 0 || r2 == 0 {
        return 1.0;
    }
    let totals: Vec<u64> = cols.iter().map(|(x, y)| x + y).collect();
    let tables: u64 = totals
        .iter()
        .take(totals.len() - 1)
        .map(|&t| t.min(r1) + 1)
        .product();
    if tables > MAX_TABLES {
        return chi_square_p(&cols);
    }
    let n: u64 = totals.iter().sum();
    let denom = ln_binomial(n, r1);
    let ln_p = |row: &[u64]| -> f64 {
        row.iter()
            .zip(&totals)
            .map(|(&x, &t)| ln_binomial(t, x))
            .sum::<f64>()
            - denom
    };
    let observed: Vec<u64> = cols.iter().map(|c| c.0).collect();
    let p_obs = ln_p(&observed).exp();
    let mut row = vec![0u64; totals.len()];
    let mut p = 0.0;
    enumerate(&totals, r1, 0, &mut row, &mut |row| {
        let q = ln_p(row).exp();
        if q <= p_obs * (1.0 + 1e-7) {
            p += q;
        }
    });
    p.min(1.0)
}

/// Every first row with `row[j] <= totals[j]` summing to `left` over columns `j..`.
fn enumerate(
    totals: &[u64],
    left: u64,
    j: usize,
    row: &mut Vec<u64>,
    visit: &mut dyn FnMut(&[u64]),
) {
    if j + 1 == totals.len() {
        if left <= totals[j] {
            row[j] = left;
            visit(row);
        }
        return;
    }
    let rest: u64 = totals[j + 1..].iter().sum();
    let lo = left.saturating_sub(rest);
    for x in lo..=left.min(totals[j]) {
        row[j] = x;
        enumerate(totals, left - x, j + 1, row, visit);
    }
}

fn chi_square_p(cols: &[(u64, u64)]) -> f64 {
    let r1: f64 = cols.iter().map(|c| c.0 as f64).sum();
    let r2: f64 = cols.iter().map(|c| c.1 as f64).sum();
    let n = r1 + r2;
    let stat: f64 = cols
        .iter()
        .map(|&(x, y)| {
            let t = (x + y) as f64;
            let (ex, ey) = (t * r1 / n, t * r2 / n);
            (x as f64 - ex).powi(2) / ex + (y as f64 - ey).powi(2) / ey
        })
        .sum();
    let df = (cols.len() - 1) as f64;
    ChiSquared::new(df).map_or(1.0, |d| 1.0 - d.cdf(stat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_by_two_matches_fisher() {
        // R: fisher.test(matrix(c(3,1,1,3), 2))$p.value = 0.4857143
        let p = mix_p_value(&[3, 1], &[1, 3]);
        assert!((p - 0.485_714_3).abs() < 1e-6, "{p}");
        // R: fisher.test(matrix(c(10,0,0,10),2))$p.value = 1.082509e-05
        let p = mix_p_value(&[10, 0], &[0, 10]);
        assert!((p - 1.082_509e-5).abs() < 1e-10, "{p}");
    }

    #[test]
    fn two_by_three_matches_r() {
        // fisher.test(rbind(c(5,2,1), c(1,3,6)))$p.value; checked by an independent
        // enumeration of all 2 x 3 tables with these margins: 0.052973170620
        let p = mix_p_value(&[5, 2, 1], &[1, 3, 6]);
        assert!((p - 0.052_973_170_620).abs() < 1e-9, "{p}");
    }

    #[test]
    fn same_mix_is_not_rejected_and_empty_rows_compare_nothing() {
        assert!(mix_p_value(&[9, 2, 7, 0], &[10, 1, 8, 0]) > 0.5);
        assert_eq!(mix_p_value(&[0, 0, 0, 0], &[3, 1, 2, 0]), 1.0);
        assert_eq!(mix_p_value(&[4, 0, 0, 0], &[3, 0, 0, 0]), 1.0);
    }

    #[test]
    fn a_different_failure_mode_is_rejected() {
        // The race's salad (leak / wrong_args) against a step that only stops calling tools.
        let p = mix_p_value(&[9, 1, 8, 0], &[0, 0, 0, 12]);
        assert!(p < 1e-6, "{p}");
    }

    #[test]
    fn chi_square_fallback_agrees_roughly() {
        let cols = [(40, 42), (30, 28), (20, 25)];
        let approx = chi_square_p(&cols);
        let exact = mix_p_value(&[40, 30, 20], &[42, 28, 25]);
        assert!((approx - exact).abs() < 0.05, "{approx} vs {exact}");
    }
}
