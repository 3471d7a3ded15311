//! Corruption against time within an arm (docs/design.md 3.7, "trend"): the corruption
//! rate of an arm's judged sessions in bins of their request index, and whether it moves
//! with it. A rate that rises over the arm (engine state accumulating, an engine
//! poisoned after a first failure) or falls (a cold start) is not one rate at one load:
//! the arm's pooled rate then depends on how long the arm ran, which the verdict must say.
//!
//! Method: the Cochran-Armitage test for trend in proportions (W. G. Cochran (1954),
//! "Some methods for strengthening the common chi-squared tests", Biometrics
//! 10:417-451; P. Armitage (1955), "Tests for linear trends in proportions and
//! frequencies", Biometrics 11:375-386). For bins i with k_i corrupted of n_i judged
//! sessions and scores t_i, K = sum k_i, N = sum n_i, p = K/N:
//!
//!   T = sum t_i (k_i - n_i p),  Var T = p (1 - p) [sum n_i t_i^2 - (sum n_i t_i)^2 / N],
//!   z = T / sqrt(Var T), two-sided p-value 2 (1 - Phi(|z|)).
//!
//! This is Armitage's variance, as R's `prop.trend.test` computes it (its X-squared is
//! z^2); the permutation form (Agresti's M^2 = (N - 1) r^2, statsmodels'
//! `test_ordinal_association`) divides by N - 1 instead of N, so its z is smaller by
//! sqrt((N - 1) / N). z > 0: the rate rises with the score.
//!
//! Binning ([`bin`]): an arm block's judged sessions that carry their timing, ordered by
//! their request index within their engine life (`SessionTiming::request_seq`; ties by
//! uptime, then life), cut into equal-count bins: [`MAX_BINS`], fewer when the block has
//! fewer than [`MIN_PER_BIN`] sessions per bin, none below two bins. The request index,
//! not the block's clock (`started_s`), because what the test asks about is the engine's
//! history: a restart after a death starts a fresh engine whose requests count from 0
//! again (ordering by (life, request index) would put a fresh life's sessions at the end
//! of the arm, and a saw-tooth of rises would read as flat), and the request index does
//! not depend on the arm's speed, which the block's seconds do (the faster arm covers the
//! same requests in less time). The scores are the bins' positions 0, 1, ...
//! (equal-count bins make them rank scores: one long-lived engine's high request
//! indices do not outweigh the rest).
//!
//! Pooling ([`pool`]): the blocks of one arm (repeats, adaptive blocks) are pooled by
//! bin position: a block of m bins adds its bin j to position floor((j + 1/2) P / m) of
//! the P = the most bins of any block, the centre of its share of the arm; counts add
//! up, means are weighted by sessions. Each block is cut by its own order, so a block
//! with a higher rate throughout raises every position alike and makes no trend.
//!
//! Pure: the sessions' timings are measured by the driver.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal};

use crate::session::SessionResult;

/// The most bins an arm block is cut into.
pub const MAX_BINS: usize = 8;
/// The fewest judged sessions per bin: a block of fewer than twice this has no bins.
pub const MIN_PER_BIN: usize = 5;

/// One bin of an arm's judged sessions, by request index: what run.json keeps per arm
/// and block (`trend`), and the corruption-against-time chart draws.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrendBin {
    /// Judged sessions in the bin (`Counts::judged`).
    pub sessions: u64,
    /// Corrupted sessions among them.
    pub corrupted: u64,
    /// Mean request index of its sessions: chat requests their engine life had been sent
    /// before each session's first request.
    pub request_seq: f64,
    /// The lowest and highest request index in the bin.
    pub first_seq: u64,
    pub last_seq: u64,
    /// Mean seconds from the engine life's start to its sessions' first requests.
    pub uptime_s: f64,
}

/// What [`bin`] needs of one judged session that carries its timing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedSession {
    pub request_seq: u64,
    pub uptime_s: f64,
    pub life: u32,
    pub corrupted: bool,
}

impl TimedSession {
    /// The session's place in time, when it has one and is judged (a failed, truncated
    /// or crashed session cannot show corruption, so it is in no bin).
    pub fn of(session: &SessionResult) -> Option<TimedSession> {
        let timing = session.timing?;
        session.class.is_judged().then_some(TimedSession {
            request_seq: timing.request_seq,
            uptime_s: timing.uptime_s,
            life: timing.life,
            corrupted: session.class.is_corrupted(),
        })
    }
}

/// Cochran-Armitage test for trend: `bins` are (corrupted k, sessions n) in order,
/// `scores` their scores (the same length). Returns (z, two-sided p); z > 0 when the
/// rate rises with the score. No variance (no corruption, all corrupted, one non-empty
/// bin, equal scores) gives (0, 1).
pub fn cochran_armitage(bins: &[(u64, u64)], scores: &[f64]) -> (f64, f64) {
    debug_assert_eq!(bins.len(), scores.len(), "one score per bin");
    let pairs = || {
        bins.iter()
            .zip(scores)
            .map(|(&(k, n), &t)| (k.min(n), n, t))
    };
    let (k_total, n_total) = pairs().fold((0u64, 0u64), |(k, n), (ki, ni, _)| (k + ki, n + ni));
    if n_total == 0 {
        return (0.0, 1.0);
    }
    let (n_f, p) = (n_total as f64, k_total as f64 / n_total as f64);
    let t_stat: f64 = pairs().map(|(k, n, t)| t * (k as f64 - n as f64 * p)).sum();
    let sum_nt: f64 = pairs().map(|(_, n, t)| n as f64 * t).sum();
    let sum_ntt: f64 = pairs().map(|(_, n, t)| n as f64 * t * t).sum();
    let variance = p * (1.0 - p) * (sum_ntt - sum_nt * sum_nt / n_f);
    // Relative to its scale, a variance this small is rounding of an exact zero.
    if variance.is_nan() || variance <= 1e-12 * (p * (1.0 - p) * sum_ntt).max(f64::MIN_POSITIVE) {
        return (0.0, 1.0);
    }
    let z = t_stat / variance.sqrt();
    let normal = Normal::new(0.0, 1.0).expect("the standard normal has valid parameters");
    // The survival function keeps tiny p-values instead of 1 - cdf's 0.
    (z, (2.0 * normal.sf(z.abs())).min(1.0))
}

/// The test of one arm's or block's bins.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrendTest {
    pub z: f64,
    pub p: f64,
}

/// [`cochran_armitage`] over `bins` with their positions as scores; `None` with fewer
/// than two non-empty bins (nothing to order).
pub fn test(bins: &[TrendBin]) -> Option<TrendTest> {
    if bins.iter().filter(|b| b.sessions > 0).count() < 2 {
        return None;
    }
    let counts: Vec<(u64, u64)> = bins.iter().map(|b| (b.corrupted, b.sessions)).collect();
    let scores: Vec<f64> = (0..bins.len()).map(|i| i as f64).collect();
    let (z, p) = cochran_armitage(&counts, &scores);
    Some(TrendTest { z, p })
}

/// How many bins `n` sessions are cut into: [`MAX_BINS`], fewer so each holds at least
/// [`MIN_PER_BIN`]; 0 below two bins.
pub fn bin_count(n: usize) -> usize {
    let bins = (n / MIN_PER_BIN).min(MAX_BINS);
    if bins < 2 {
        0
    } else {
        bins
    }
}

/// One block's sessions cut into equal-count bins by request index (the module's
/// rule); empty below two bins.
pub fn bin(sessions: &[TimedSession]) -> Vec<TrendBin> {
    let bins = bin_count(sessions.len());
    if bins == 0 {
        return Vec::new();
    }
    let mut ordered = sessions.to_vec();
    ordered.sort_by(|a, b| {
        a.request_seq
            .cmp(&b.request_seq)
            .then(a.uptime_s.total_cmp(&b.uptime_s))
            .then(a.life.cmp(&b.life))
    });
    let n = ordered.len();
    (0..bins)
        .map(|i| {
            let part = &ordered[i * n / bins..(i + 1) * n / bins];
            let count = part.len() as f64;
            TrendBin {
                sessions: part.len() as u64,
                corrupted: part.iter().filter(|s| s.corrupted).count() as u64,
                request_seq: part.iter().map(|s| s.request_seq as f64).sum::<f64>() / count,
                first_seq: part.iter().map(|s| s.request_seq).min().unwrap_or(0),
                last_seq: part.iter().map(|s| s.request_seq).max().unwrap_or(0),
                uptime_s: part.iter().map(|s| s.uptime_s).sum::<f64>() / count,
            }
        })
        .collect()
}

/// The blocks of one arm pooled by bin position (the module's rule). Blocks without
/// bins add nothing; no block with bins gives none.
pub fn pool<'a>(blocks: impl IntoIterator<Item = &'a [TrendBin]>) -> Vec<TrendBin> {
    let blocks: Vec<&[TrendBin]> = blocks.into_iter().filter(|b| !b.is_empty()).collect();
    if blocks.len() == 1 {
        return blocks[0].to_vec();
    }
    let positions = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut pooled = vec![
        TrendBin {
            sessions: 0,
            corrupted: 0,
            request_seq: 0.0,
            first_seq: u64::MAX,
            last_seq: 0,
            uptime_s: 0.0,
        };
        positions
    ];
    for block in blocks {
        let m = block.len();
        for (j, b) in block.iter().enumerate() {
            let slot = &mut pooled[((2 * j + 1) * positions) / (2 * m)];
            let n = b.sessions as f64;
            slot.request_seq += b.request_seq * n;
            slot.uptime_s += b.uptime_s * n;
            slot.sessions += b.sessions;
            slot.corrupted += b.corrupted;
            if b.sessions > 0 {
                slot.first_seq = slot.first_seq.min(b.first_seq);
                slot.last_seq = slot.last_seq.max(b.last_seq);
            }
        }
    }
    for slot in &mut pooled {
        if slot.sessions > 0 {
            slot.request_seq /= slot.sessions as f64;
            slot.uptime_s /= slot.sessions as f64;
        } else {
            slot.first_seq = 0;
        }
    }
    pooled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1e-300)
    }

    /// R's own example for `prop.trend.test` (its help page): smokers among patients in
    /// four age groups, scores 1..4: X-squared = 8.2249, p-value = 0.004132. Checked
    /// independently with Python (numpy, scipy 1.17 `norm.sf`) from the formula, and
    /// against statsmodels 0.15 `Table(..., shift_zeros=False).test_ordinal_association`
    /// (z = -2.8642982730193864), whose permutation z times sqrt(N / (N - 1)) is this z.
    #[test]
    fn reference_r_prop_trend_test_example() {
        let (z, p) = cochran_armitage(
            &[(83, 86), (90, 93), (129, 136), (70, 82)],
            &[1.0, 2.0, 3.0, 4.0],
        );
        assert!(close(z, -2.8679125309530877, 1e-9), "{z}");
        assert!(close(z * z, 8.224922285197746, 1e-9));
        assert!(close(p, 0.004131897477641406, 1e-6), "{p}");
        let n: f64 = 86.0 + 93.0 + 136.0 + 82.0;
        assert!(close(z * ((n - 1.0) / n).sqrt(), -2.8642982730193864, 1e-9));
    }

    /// Agresti, "An Introduction to Categorical Data Analysis" (2nd ed., 2007), 2.5.3,
    /// Table 2.7: infant malformation by the mother's alcohol consumption, scores
    /// 0, 0.5, 1.5, 4, 7: M^2 = 6.57 (the N - 1 form), P = 0.01; z = 2.56. Python as above:
    /// z = 2.5632272518654204, p = 0.010370414572997434.
    #[test]
    fn reference_agresti_infant_malformation() {
        let (z, p) = cochran_armitage(
            &[
                (48, 48 + 17066),
                (38, 38 + 14464),
                (5, 5 + 788),
                (1, 1 + 126),
                (1, 1 + 37),
            ],
            &[0.0, 0.5, 1.5, 4.0, 7.0],
        );
        assert!(close(z, 2.5632272518654204, 1e-9), "{z}");
        assert!(close(p, 0.010370414572997434, 1e-6), "{p}");
    }

    /// Series of the shape bisect sees (bins of 10 or 12 sessions), Python as above.
    #[test]
    fn reference_rising_flat_and_falling_series() {
        let scores: Vec<f64> = (0..8).map(f64::from).collect();
        let bins = |ks: &[u64], n: u64| ks.iter().map(|&k| (k, n)).collect::<Vec<_>>();
        let (z, p) = cochran_armitage(&bins(&[0, 1, 1, 2, 3, 5, 7, 9], 10), &scores);
        assert!(close(z, 5.422012617727134, 1e-9), "{z}");
        assert!(close(p, 5.893172135312206e-08, 1e-5), "{p}");
        let (z, p) = cochran_armitage(&bins(&[2, 1, 2, 2, 1, 2, 1, 2], 10), &scores);
        assert!(close(z, -0.06613422500505543, 1e-9), "{z}");
        assert!(close(p, 0.9472709628719946, 1e-6), "{p}");
        let (z, p) = cochran_armitage(&bins(&[5, 3, 2, 1, 0, 0], 12), &scores[..6]);
        assert!(close(z, -3.356600366570972, 1e-9), "{z}");
        assert!(close(p, 0.0007890707551107173, 1e-5), "{p}");
    }

    #[test]
    fn no_variance_is_no_evidence() {
        let scores = [0.0, 1.0, 2.0];
        assert_eq!(
            cochran_armitage(&[(0, 10), (0, 10), (0, 10)], &scores),
            (0.0, 1.0)
        );
        assert_eq!(
            cochran_armitage(&[(10, 10), (10, 10), (10, 10)], &scores),
            (0.0, 1.0)
        );
        assert_eq!(
            cochran_armitage(&[(0, 0), (3, 10), (0, 0)], &scores),
            (0.0, 1.0)
        );
        assert_eq!(cochran_armitage(&[], &[]), (0.0, 1.0));
        assert_eq!(
            cochran_armitage(&[(1, 10), (5, 10)], &[2.0, 2.0]),
            (0.0, 1.0)
        );
    }

    use crate::testing::trend_timeline as timeline;

    #[test]
    fn bins_are_equal_count_by_request_index_and_fewer_for_few_sessions() {
        // Given out of order: binning sorts by request index.
        let mut sessions = timeline(80, |i| i >= 70);
        sessions.reverse();
        let bins = bin(&sessions);
        assert_eq!(bins.len(), 8);
        assert!(bins.iter().all(|b| b.sessions == 10));
        assert_eq!((bins[0].first_seq, bins[0].last_seq), (0, 9));
        assert_eq!(bins[0].request_seq, 4.5);
        assert_eq!(bins[7].uptime_s, 9.3125);
        assert_eq!((bins[7].corrupted, bins[6].corrupted), (10, 0));
        assert_eq!(bin(&timeline(23, |_| false)).len(), 4);
        assert_eq!(
            bin(&timeline(23, |_| false))
                .iter()
                .map(|b| b.sessions)
                .sum::<u64>(),
            23
        );
        assert!(bin(&timeline(9, |_| true)).is_empty());
        assert_eq!(bin_count(10), 2);
        assert_eq!(bin_count(1000), MAX_BINS);
    }

    #[test]
    fn a_flat_series_is_not_significant_and_a_rising_one_is() {
        // Every fifth session corrupted, evenly: 20% throughout.
        let flat = test(&bin(&timeline(80, |i| i % 5 == 0))).unwrap();
        assert!(flat.p > 0.5, "{flat:?}");
        let rising = test(&bin(&timeline(80, |i| i >= 60 && i % 2 == 0))).unwrap();
        assert!(rising.z > 3.0 && rising.p < 0.01, "{rising:?}");
        let falling = test(&bin(&timeline(80, |i| i < 16))).unwrap();
        assert!(falling.z < -3.0 && falling.p < 0.01, "{falling:?}");
        assert_eq!(test(&[]), None);
    }

    #[test]
    fn blocks_pool_by_bin_position() {
        let a = bin(&timeline(80, |i| i >= 70));
        let b = bin(&timeline(80, |i| i >= 70));
        let pooled = pool([&a[..], &b[..]]);
        assert_eq!(pooled.len(), 8);
        assert!(pooled.iter().all(|p| p.sessions == 20));
        assert_eq!(pooled[7].corrupted, 20);
        // A block of 4 bins lands in the middle of each pair of positions: 1, 3, 5, 7.
        let c = bin(&timeline(20, |_| true));
        let pooled = pool([&a[..], &c[..], &[][..]]);
        let sessions: Vec<u64> = pooled.iter().map(|p| p.sessions).collect();
        assert_eq!(sessions, [10, 15, 10, 15, 10, 15, 10, 15]);
        assert_eq!((pooled[1].first_seq, pooled[1].last_seq), (0, 19));
        assert!(close(
            pooled[1].request_seq,
            (14.5 * 10.0 + 2.0 * 5.0) / 15.0,
            1e-12
        ));
        // A block that corrupts more throughout makes no trend of a flat one.
        let clean = bin(&timeline(80, |_| false));
        let dirty = bin(&timeline(80, |_| true));
        assert!(test(&pool([&clean[..], &dirty[..]])).unwrap().p > 0.99);
        assert!(pool(std::iter::empty()).is_empty());
        assert_eq!(pool([&a[..]]), a);
    }
}
