//! The e-BH procedure: which of K hypotheses to reject from their e-values, with the
//! false discovery rate at most alpha whatever the dependence between them (R. Wang and
//! A. Ramdas (2022), "False discovery rate control with e-values", JRSS B 84:822-852,
//! definition and theorem 2). With the e-values sorted from the largest, `e_(1) >= ...`,
//! reject the `k*` largest, `k* = max { k : e_(k) >= K / (alpha k) }` (none when no k
//! qualifies). An e-process stopped at any night is an e-value, so the procedure holds
//! at whichever night the history is read.
//!
//! Pure.

/// For each e-value, whether e-BH at `alpha` rejects it; `family` is K, at least the
/// number of e-values given (hypotheses with no data count, as e-values of 1 would).
pub fn e_bh(e_values: &[f64], alpha: f64, family: usize) -> Vec<bool> {
    let k_total = family.max(e_values.len()) as f64;
    let mut order: Vec<usize> = (0..e_values.len()).collect();
    order.sort_by(|&a, &b| e_values[b].total_cmp(&e_values[a]));
    let mut cut = 0;
    for (rank, &i) in order.iter().enumerate() {
        let k = (rank + 1) as f64;
        if e_values[i] >= k_total / (alpha * k) {
            cut = rank + 1;
        }
    }
    let mut rejected = vec![false; e_values.len()];
    for &i in &order[..cut] {
        rejected[i] = true;
    }
    rejected
}

/// The e-value at which e-BH rejects a hypothesis alone: `K / alpha`.
pub fn single_threshold(alpha: f64, family: usize) -> f64 {
    family.max(1) as f64 / alpha
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_the_largest_while_each_clears_its_step() {
        // K = 4, alpha = 0.1: steps 40, 20, 13.3, 10.
        let e = [50.0, 1.0, 25.0, 12.0];
        assert_eq!(e_bh(&e, 0.1, 4), vec![true, false, true, false]);
        // 12 clears the third step (13.3) only if it were 14: then three rejections.
        let e = [50.0, 1.0, 25.0, 14.0];
        assert_eq!(e_bh(&e, 0.1, 4), vec![true, false, true, true]);
    }

    #[test]
    fn a_later_step_carries_the_earlier_ones() {
        // The largest (30) misses its step (40) but the second clears the second step
        // (20 >= 20): both rejected, as the step-up rule says.
        let e = [30.0, 20.0, 0.5];
        assert_eq!(e_bh(&e, 0.1, 4), vec![true, true, false]);
    }

    #[test]
    fn the_family_counts_hypotheses_without_data() {
        assert_eq!(e_bh(&[150.0], 0.01, 1), vec![true]);
        assert_eq!(e_bh(&[150.0], 0.01, 2), vec![false]);
        assert_eq!(single_threshold(0.01, 2), 200.0);
        assert!(e_bh(&[], 0.01, 3).is_empty());
    }
}
