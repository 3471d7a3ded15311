//! Which commit to test next: the largest expected information per unit of cost
//! (docs/commits.md).
//!
//! Expected information (D. V. Lindley (1956), "On a measure of the information provided
//! by an experiment", Ann. Math. Statist. 27:986-1005): the mutual information between the
//! hypothesis and the next block's count k, `H(mixture) - sum_s w_s H(pmf_s)` in nats. A
//! block at commit i can only tell on which side of the change i lies, or that there is
//! no change, so the hypotheses fall into three groups with weights `w_bad = P(culprit <=
//! i)`, `w_good = P(culprit > i)` and `w_none`, and the mutual information with the
//! hypothesis equals the mutual information with the group when, within a group, k has
//! one predictive distribution. Those are beta-binomial: the bad side's rate posterior,
//! the good side's, and the pooled one (the sides as the most probable culprit splits the
//! blocks, [`super::posterior::sides`]). Cost: seconds, the build's (0 once cached) plus a
//! block's, each the mean measured so far.

use statrs::function::beta::ln_beta;
use statrs::function::factorial::ln_binomial;

use super::posterior::{sides, Counts, Posterior};

/// P(k of n) under a Beta(a, b) rate: the beta-binomial pmf.
pub(crate) fn beta_binomial(n: u64, a: f64, b: f64) -> Vec<f64> {
    (0..=n)
        .map(|k| {
            (ln_binomial(n, k) + ln_beta(a + k as f64, b + (n - k) as f64) - ln_beta(a, b)).exp()
        })
        .collect()
}

/// Entropy in nats.
pub(crate) fn entropy(pmf: &[f64]) -> f64 {
    -pmf.iter()
        .filter(|p| **p > 0.0)
        .map(|p| p * p.ln())
        .sum::<f64>()
}

/// The three predictive distributions of a block of `n` (bad side, good side, none), and
/// their entropies.
pub(crate) struct Predictive {
    pmfs: [Vec<f64>; 3],
    entropies: [f64; 3],
}

impl Predictive {
    /// From per-commit counts, split at the posterior's most probable culprit.
    pub fn new(counts: &[Counts], post: &Posterior, n: u64) -> Self {
        let (good, bad) = sides(counts, post.map_culprit());
        let pooled = good + bad;
        let pmf = |c: Counts| {
            let (a, b) = c.beta();
            beta_binomial(n, a, b)
        };
        let pmfs = [pmf(bad), pmf(good), pmf(pooled)];
        let entropies = [entropy(&pmfs[0]), entropy(&pmfs[1]), entropy(&pmfs[2])];
        Predictive { pmfs, entropies }
    }

    /// Mutual information between the group (weights bad, good, none) and k.
    pub(crate) fn information(&self, w: [f64; 3]) -> f64 {
        let mut mixed = 0.0;
        for k in 0..self.pmfs[0].len() {
            let p: f64 = (0..3).map(|s| w[s] * self.pmfs[s][k]).sum();
            if p > 0.0 {
                mixed -= p * p.ln();
            }
        }
        let within: f64 = (0..3).map(|s| w[s] * self.entropies[s]).sum();
        (mixed - within).max(0.0)
    }
}

/// What one candidate costs: seconds to build it (0 when cached) and to run a block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cost {
    pub build_s: f64,
    pub block_s: f64,
}

/// What the choice of the next commits sees: the per-commit counts and their posterior,
/// the block's sessions `n`, the candidates (commit indices, ascending), which builds
/// are cached (`built[i]`), and the costs.
#[derive(Clone, Copy)]
pub(crate) struct Choice<'c> {
    pub(crate) counts: &'c [Counts],
    pub(crate) post: &'c Posterior,
    pub(crate) n: u64,
    pub(crate) candidates: &'c [usize],
    pub(crate) built: &'c [bool],
    pub(crate) cost: Cost,
}

impl Choice<'_> {
    /// The commit to test next: the largest information per second, ties to the larger
    /// information, then the lower index. `None` when there is no candidate.
    pub(crate) fn next_commit(&self) -> Option<(usize, f64)> {
        let Choice {
            counts,
            post,
            n,
            candidates,
            built,
            cost,
        } = *self;
        let predictive = Predictive::new(counts, post, n);
        let mut best: Option<(usize, f64, f64)> = None;
        let mut bad_side = 0.0;
        let mut upto = 0;
        for &i in candidates {
            // Candidates ascend: the cumulative posterior is carried along.
            while upto <= i {
                bad_side += post.culprit[upto];
                upto += 1;
            }
            let good_side = (1.0 - post.none - bad_side).max(0.0);
            let info = predictive.information([bad_side, good_side, post.none]);
            let seconds = if built[i] { 0.0 } else { cost.build_s } + cost.block_s;
            let score = info / seconds.max(1e-9);
            let better = match best {
                None => true,
                Some((_, s, inf)) => score > s * (1.0 + 1e-12) || (score >= s && info > inf),
            };
            if better {
                best = Some((i, score, info));
            }
        }
        best.map(|(i, _, info)| (i, info))
    }
}

/// A block's count reduced to its likelihood-ratio decision ("bad side" when
/// `pmf_bad(k) >= pmf_good(k)`): P(says bad) on the bad side, the good side and under
/// "no single culprit".
fn says_bad(pred: &Predictive) -> [f64; 3] {
    let [bad, good, pooled] = &pred.pmfs;
    let mut q = [0.0; 3];
    for k in 0..bad.len() {
        if bad[k] >= good[k] {
            q[0] += bad[k];
            q[1] += good[k];
            q[2] += pooled[k];
        }
    }
    q.map(|p| p.clamp(0.0, 1.0))
}

fn binary_entropy(p: f64) -> f64 {
    entropy(&[p, 1.0 - p])
}

/// Joint information of blocks at the sorted, distinct commits `points` (a lower bound:
/// each block's count reduced to its decision, data processing), in nats. `cum[i]` is
/// P(culprit <= i); `none` the weight of "no single culprit"; `q` from [`says_bad`].
/// Hypotheses fall into `points.len() + 2` groups (how many of the blocks lie before the
/// change, or none); within a group the decisions are independent.
fn joint_information(points: &[usize], cum: &[f64], none: f64, q: [f64; 3]) -> f64 {
    let m = points.len();
    let total = 1.0 - none;
    // Group g: the first g blocks on the good side, the rest on the bad side.
    let mut weights = Vec::with_capacity(m + 1);
    let mut below = 0.0;
    for g in 0..=m {
        let upto = if g < m { cum[points[g]] } else { total };
        weights.push((upto - below).max(0.0));
        below = upto.max(below);
    }
    let within: f64 = weights
        .iter()
        .enumerate()
        .map(|(g, w)| w * (g as f64 * binary_entropy(q[1]) + (m - g) as f64 * binary_entropy(q[0])))
        .sum::<f64>()
        + none * m as f64 * binary_entropy(q[2]);
    let mut mixed = 0.0;
    for pattern in 0..(1u32 << m) {
        let mut p = 0.0;
        for (g, w) in weights.iter().enumerate() {
            if *w == 0.0 {
                continue;
            }
            let mut l = *w;
            for j in 0..m {
                let side = if j < g { q[1] } else { q[0] };
                l *= if pattern >> j & 1 == 1 {
                    side
                } else {
                    1.0 - side
                };
            }
            p += l;
        }
        let mut l = none;
        for j in 0..m {
            l *= if pattern >> j & 1 == 1 {
                q[2]
            } else {
                1.0 - q[2]
            };
        }
        p += l;
        if p > 0.0 {
            mixed -= p * p.ln();
        }
    }
    (mixed - within).max(0.0)
}

/// Most blocks one round may run: the joint information enumerates `2^k` outcomes.
pub(crate) const MAX_PARALLEL: usize = 8;

impl Choice<'_> {
    /// The `k` distinct commits of one round (ascending): with `k == 1` [`next_commit`];
    /// else the round's joint information per second ([`joint_information`]'s bound over
    /// the round's seconds, its slowest block's: the blocks run side by side), maximised by
    /// a greedy pass (each commit the one that raises it most) and then coordinate ascent
    /// (each commit moved to wherever it rises most, the others held, until none moves; the
    /// greedy pass alone splits a uniform range at 16/32/40/48 of 64 where fifths are
    /// better). Fewer when fewer candidates remain; empty when none.
    pub(crate) fn next_commits(&self, k: usize) -> Vec<usize> {
        let (post, candidates, built, cost) = (self.post, self.candidates, self.built, self.cost);
        if k <= 1 {
            return self.next_commit().map(|(c, _)| vec![c]).unwrap_or_default();
        }
        let q = says_bad(&Predictive::new(self.counts, post, self.n));
        let mut cum = Vec::with_capacity(post.culprit.len());
        let mut acc = 0.0;
        for p in &post.culprit {
            acc += p;
            cum.push(acc);
        }
        let seconds = |i: usize| if built[i] { 0.0 } else { cost.build_s } + cost.block_s;
        let value = |points: &[usize]| {
            let round_s = points.iter().map(|&i| seconds(i)).fold(0.0, f64::max);
            let info = joint_information(points, &cum, post.none, q);
            (info / round_s.max(1e-9), info)
        };
        // Better when the score rises, or holds while the information rises.
        let better = |(s, inf): (f64, f64), (bs, binf): (f64, f64)| {
            s > bs * (1.0 + 1e-12) || (s >= bs && inf > binf * (1.0 + 1e-12))
        };
        let with = |chosen: &[usize], i: usize| {
            let mut points = chosen.to_vec();
            let at = points.binary_search(&i).unwrap_or_else(|at| at);
            points.insert(at, i);
            points
        };
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < k.min(MAX_PARALLEL) {
            let mut best: Option<(usize, (f64, f64))> = None;
            for &i in candidates {
                if chosen.binary_search(&i).is_ok() {
                    continue;
                }
                let v = value(&with(&chosen, i));
                if best.is_none_or(|(_, b)| better(v, b)) {
                    best = Some((i, v));
                }
            }
            let Some((i, _)) = best else { break };
            chosen = with(&chosen, i);
        }
        // Coordinate ascent; each accepted move raises the value, so it ends.
        let mut current = value(&chosen);
        let mut moved = true;
        while moved {
            moved = false;
            for slot in 0..chosen.len() {
                let mut others = chosen.clone();
                let was = others.remove(slot);
                let mut best: Option<(Vec<usize>, (f64, f64))> = None;
                for &i in candidates {
                    if i == was || others.binary_search(&i).is_ok() {
                        continue;
                    }
                    let points = with(&others, i);
                    let v = value(&points);
                    if best.as_ref().is_none_or(|(_, b)| better(v, *b)) {
                        best = Some((points, v));
                    }
                }
                if let Some((points, v)) = best.filter(|(_, v)| better(*v, current)) {
                    current = v;
                    chosen = points;
                    moved = true;
                }
            }
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commits::posterior::posterior;

    fn k(corrupted: u64, judged: u64) -> Counts {
        Counts { corrupted, judged }
    }

    #[test]
    fn beta_binomial_by_hand() {
        // n = 1 under Beta(1/2, 1/2): 1/2 each. n = 2: P(0) = B(1/2, 5/2)/B(1/2, 1/2) = 3/8,
        // P(1) = 2 B(3/2, 3/2)/pi = 1/4, P(2) = 3/8.
        let p = beta_binomial(1, 0.5, 0.5);
        assert!((p[0] - 0.5).abs() < 1e-12 && (p[1] - 0.5).abs() < 1e-12);
        let p = beta_binomial(2, 0.5, 0.5);
        for (got, want) in p.iter().zip([0.375, 0.25, 0.375]) {
            assert!((got - want).abs() < 1e-12, "{p:?}");
        }
        assert!((entropy(&[0.5, 0.5]) - 2f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn information_of_one_session_by_hand() {
        // Good end 0/3, bad end 3/3, nothing between: the most probable culprit splits
        // them, bad side Beta(3.5, 0.5) (P(corrupted) = 0.875), good side Beta(0.5, 3.5)
        // (0.125). With weights 1/2, 1/2, 0 the mixture is 1/2: ln 2 - H(0.875) =
        // 0.693147 - 0.376770 = 0.316377 nats.
        let counts = [k(0, 3), k(0, 0), k(3, 3)];
        let post = posterior(&counts);
        let pred = Predictive::new(&counts, &post, 1);
        let info = pred.information([0.5, 0.5, 0.0]);
        assert!((info - 0.316377).abs() < 1e-6, "{info}");
        // A block whose side is known tells nothing.
        assert!(pred.information([1.0, 0.0, 0.0]).abs() < 1e-12);
    }

    /// What a choice sees: counts, their posterior, candidates, builds, costs.
    struct Seen {
        counts: Vec<Counts>,
        post: Posterior,
        candidates: Vec<usize>,
        built: Vec<bool>,
    }

    impl Seen {
        fn choice(&self) -> Choice<'_> {
            Choice {
                counts: &self.counts,
                post: &self.post,
                n: 80,
                candidates: &self.candidates,
                built: &self.built,
                cost: Cost {
                    build_s: 600.0,
                    block_s: 120.0,
                },
            }
        }
    }

    /// 0/80 at the good end, 15/80 at the bad end (commit `n`), nothing between or
    /// built; 600 s a build, 120 s a block.
    fn clean_ends(n: usize) -> Seen {
        let mut counts = vec![k(0, 0); n + 1];
        counts[0] = k(0, 80);
        counts[n] = k(15, 80);
        Seen {
            post: posterior(&counts),
            counts,
            candidates: (1..n).collect(),
            built: vec![false; n + 1],
        }
    }

    #[test]
    fn the_middle_of_the_range_is_tested_first_and_a_cached_build_wins_near_it() {
        // 0/80 at the good end, 15/80 at the bad end (commit 10), 9 commits between:
        // every culprit 1..=10 is equally likely, so P(bad side) at commit i is i/10, and
        // the two sides' predictive distributions barely overlap: the information is
        // about the binary entropy of i/10, largest at 5.
        let seen = clean_ends(10);
        let choice = seen.choice();
        let (c, info) = choice.next_commit().unwrap();
        assert_eq!(c, 5);
        assert!(info > 0.6 && info <= 2f64.ln(), "{info}");
        // Commit 4's build is cached: H(0.4) = 0.673 nats for 120 s beats ln 2 for 720 s.
        let mut cached = seen.built.clone();
        cached[4] = true;
        let choice = Choice {
            built: &cached,
            ..choice
        };
        let (c, _) = choice.next_commit().unwrap();
        assert_eq!(c, 4);
        let none = Choice {
            candidates: &[],
            ..choice
        };
        assert!(none.next_commit().is_none());
    }

    #[test]
    fn joint_information_by_hand() {
        // One block, decisions right 90% on either side, the sides equally likely:
        // ln 2 - H(0.9) = 0.693147 - 0.325083 = 0.368064 nats.
        let cum = [0.0, 0.5, 1.0];
        let info = joint_information(&[1], &cum, 0.0, [0.9, 0.1, 0.5]);
        assert!((info - 0.368064).abs() < 1e-6, "{info}");
        // Noiseless blocks at the quartiles of a uniform culprit: four equal groups, ln 4.
        let cum: Vec<f64> = (0..=16).map(|i| i as f64 / 16.0).collect();
        let info = joint_information(&[4, 8, 12], &cum, 0.0, [1.0, 0.0, 0.5]);
        assert!((info - 4f64.ln()).abs() < 1e-12, "{info}");
        // Noiseless blocks at the last two commits: only "16 or not" is told apart.
        let info = joint_information(&[15, 16], &cum, 0.0, [1.0, 0.0, 0.5]);
        let (p, q) = (15f64 / 16.0, 1f64 / 16.0);
        assert!((info - (-p * p.ln() - q * q.ln())).abs() < 1e-12, "{info}");
        // "No single culprit" (a fair coin each block) against a known side: for one
        // block, H(0.5 * 1 + 0.5 * 0.5) - 0.5 * H(0.5) = H(0.75) - 0.5 ln 2.
        let half: Vec<f64> = cum.iter().map(|c| c / 2.0).collect();
        let info = joint_information(&[16], &half, 0.5, [1.0, 0.0, 0.5]);
        let h = |p: f64| -p * p.ln() - (1.0 - p) * (1.0 - p).ln();
        assert!((info - (h(0.75) - 0.5 * 2f64.ln())).abs() < 1e-12, "{info}");
    }

    #[test]
    fn a_round_of_three_splits_a_uniform_range_at_its_quartiles() {
        // 0/80 at the good end, 15/80 at the bad end (commit 16): every culprit 1..=16
        // equally likely, and the blocks nearly noiseless. The greedy rule takes the
        // middle, then the quarter below (ties go to the lower commit), then above.
        let seen = clean_ends(16);
        let choice = seen.choice();
        assert_eq!(choice.next_commits(3), vec![4, 8, 12]);
        // K = 1 is the one-block rule.
        assert_eq!(
            choice.next_commits(1),
            vec![choice.next_commit().unwrap().0]
        );
        // Fewer candidates than blocks: each once.
        let few = Choice {
            candidates: &[3, 9],
            ..choice
        };
        assert_eq!(few.next_commits(4), vec![3, 9]);
        let none = Choice {
            candidates: &[],
            ..choice
        };
        assert!(none.next_commits(4).is_empty());
    }
}
