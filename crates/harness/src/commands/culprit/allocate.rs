//! The allocation and stopping rule of `bisect culprit`, as pure functions: how many
//! sessions screening gives each flag, which extra looks the budget allows, how pooled
//! counts become implicated / cleared / inconclusive, and which flag gets the next look.
//!
//! Methods: Fisher's exact test and Newcombe's hybrid score interval (method 10) per flag
//! from [`crate::core::stats`]; Holm (1979) step-down adjustment across the k flags; and a
//! Bonferroni split of alpha across the at most L evaluation points ("looks") the budget
//! allows, so that P(any flag wrongly implicated at any look) <= L * alpha / L = alpha.
//! No I/O.

use crate::core::format;
use crate::core::session::Counts;
use crate::core::stats;
use crate::core::verdict::{Policy, Status};

/// Fewer sessions per arm than this cannot resolve anything; screening and every extra
/// look use at least this many.
pub const MIN_SESSIONS_PER_ARM: u64 = 8;

/// The confidence of every interval reported.
const CONFIDENCE: f64 = 0.95;

/// Sessions per arm of each flag's screening pair: budget / (4 k), rounded, at least
/// [`MIN_SESSIONS_PER_ARM`]. Screening thus spends about half the budget, leaving the
/// other half for the adaptive looks.
pub fn screening_sessions_per_arm(budget: u64, flags: usize) -> u64 {
    let k = flags.max(1) as f64;
    ((budget as f64 / (4.0 * k)).round() as u64).max(MIN_SESSIONS_PER_ARM)
}

/// Sessions (both arms) screening spends: one pair of `n0` per flag.
pub fn screening_cost(budget: u64, flags: usize) -> u64 {
    2 * flags as u64 * screening_sessions_per_arm(budget, flags)
}

/// Sessions per arm of each extra look the budget allows after screening, in order. The
/// schedule depends on the budget alone (not on the data), which is what lets the number
/// of looks bound the type-I error in advance. Empty when screening alone exceeds it.
pub fn extra_look_sizes(budget: u64, flags: usize) -> Vec<u64> {
    let n0 = screening_sessions_per_arm(budget, flags);
    let mut remaining = budget.saturating_sub(screening_cost(budget, flags));
    let mut sizes = Vec::new();
    loop {
        let n = n0.min(remaining / 2);
        if n < MIN_SESSIONS_PER_ARM {
            return sizes;
        }
        sizes.push(n);
        remaining -= 2 * n;
    }
}

/// L: screening plus every extra look; decisions are taken at most this many times.
pub fn max_looks(budget: u64, flags: usize) -> u32 {
    1 + extra_look_sizes(budget, flags).len() as u32
}

/// The level each Holm-adjusted p is compared with at every look: alpha / L.
pub fn alpha_per_look(alpha: f64, looks: u32) -> f64 {
    alpha / f64::from(looks.max(1))
}

/// One flag's pooled evidence over its looks so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub on_value: String,
    pub off_value: String,
    pub on: Counts,
    pub off: Counts,
    pub looks: u32,
    /// A blocking confound (degraded arm, readback mismatch, ...): the comparison is void
    /// and the flag gets no more budget.
    pub blocked: Option<String>,
}

impl Tally {
    pub fn new(on_value: &str, off_value: &str) -> Tally {
        Tally {
            on_value: on_value.to_string(),
            off_value: off_value.to_string(),
            ..Tally::default()
        }
    }

    /// Pool one more look's arms; an arm over `degraded_fraction` error+timeout (pooled)
    /// blocks the flag.
    pub fn add_look(&mut self, on: &Counts, off: &Counts, degraded_fraction: f64) {
        self.on.merge(on);
        self.off.merge(off);
        self.looks += 1;
        if self.blocked.is_none() {
            self.blocked = self.degraded(degraded_fraction);
        }
    }

    /// Sessions spent on this flag, both arms.
    pub fn sessions(&self) -> u64 {
        self.on.total() + self.off.total()
    }

    fn degraded(&self, degraded_fraction: f64) -> Option<String> {
        let arms = [
            ("on", &self.on_value, &self.on),
            ("off", &self.off_value, &self.off),
        ];
        let over: Vec<String> = arms
            .iter()
            .filter(|(_, _, c)| c.total() > 0)
            .filter(|(_, _, c)| c.failed() as f64 / c.total() as f64 > degraded_fraction)
            .map(|(label, value, c)| {
                format!(
                    "arm {label} (={value}) had {} error and {} timeout sessions of {}",
                    c.error,
                    c.timeout,
                    c.total()
                )
            })
            .collect();
        (!over.is_empty()).then(|| {
            format!(
                "degraded, not a same-speed toggle: {} (> {} error+timeout); given no more budget",
                over.join("; "),
                format::percent(degraded_fraction)
            )
        })
    }
}

/// One flag's standing after a look.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Fisher exact two-sided, pooled counts.
    pub p_value: f64,
    /// Holm-adjusted across all k flags.
    pub p_adjusted: f64,
    /// Corruption rate on minus off.
    pub rate_diff: f64,
    /// Newcombe 95% interval of `rate_diff`.
    pub diff_ci95: [f64; 2],
    pub status: Status,
    pub direction: Option<String>,
    pub reasons: Vec<String>,
    /// Implicated, cleared or blocked: no more budget goes to it.
    pub decided: bool,
}

/// Assess every flag from its pooled counts (docs/design.md 3.7 adapted to k flags and L
/// looks): blocked -> inconclusive; Holm-adjusted p < alpha / L -> implicated; Newcombe
/// interval inside +-min_effect -> cleared; otherwise inconclusive and still open.
pub fn assess(tallies: &[Tally], policy: &Policy, looks: u32) -> Vec<Assessment> {
    let level = alpha_per_look(policy.alpha, looks);
    let raw: Vec<f64> = tallies
        .iter()
        .map(|t| {
            let (k_on, n_on) = (t.on.corrupted(), t.on.total());
            let (k_off, n_off) = (t.off.corrupted(), t.off.total());
            stats::fisher_exact_two_sided(k_on, n_on - k_on, k_off, n_off - k_off)
        })
        .collect();
    let adjusted = stats::holm(&raw);
    tallies
        .iter()
        .zip(raw.iter().zip(&adjusted))
        .map(|(t, (&p_value, &p_adjusted))| {
            let (k_on, n_on) = (t.on.corrupted(), t.on.total());
            let (k_off, n_off) = (t.off.corrupted(), t.off.total());
            let (rate_diff, lo, hi) = stats::newcombe_diff(k_on, n_on, k_off, n_off, CONFIDENCE);
            let mut a = Assessment {
                p_value,
                p_adjusted,
                rate_diff,
                diff_ci95: [lo, hi],
                status: Status::Inconclusive,
                direction: None,
                reasons: Vec::new(),
                decided: false,
            };
            if let Some(why) = &t.blocked {
                a.reasons.push(why.clone());
                a.decided = true;
            } else if p_adjusted < level {
                let (bad, bad_value, worse, better) = if rate_diff > 0.0 {
                    ("on", &t.on_value, (k_on, n_on), (k_off, n_off))
                } else {
                    ("off", &t.off_value, (k_off, n_off), (k_on, n_on))
                };
                a.status = Status::Implicated;
                a.direction = Some(format!(
                    "{bad} (={bad_value}) corrupts: {}/{} vs {}/{}",
                    worse.0, worse.1, better.0, better.1
                ));
                a.reasons.push(format!(
                    "Holm-adjusted p = {} < alpha / looks = {} / {looks} = {}",
                    format::p_value(p_adjusted),
                    policy.alpha,
                    format::p_value(level)
                ));
                a.decided = true;
            } else if lo >= -policy.min_effect && hi <= policy.min_effect {
                a.status = Status::Cleared;
                a.reasons.push(format!(
                    "difference {} lies within +-{} (Newcombe 95% [{}, {}])",
                    format::signed_percent(rate_diff),
                    format::percent(policy.min_effect),
                    format::signed_percent(lo),
                    format::signed_percent(hi)
                ));
                a.decided = true;
            } else {
                a.reasons.push(format!(
                    "Holm-adjusted p = {} >= {} and the difference interval [{}, {}] is not inside +-{}",
                    format::p_value(p_adjusted),
                    format::p_value(level),
                    format::signed_percent(lo),
                    format::signed_percent(hi),
                    format::percent(policy.min_effect)
                ));
                let pooled = stats::rate(k_on + k_off, n_on + n_off);
                let needed =
                    stats::sessions_per_arm(pooled, policy.min_effect, level, policy.power);
                a.reasons.push(format!(
                    "underpowered: about {needed} sessions per arm would resolve a difference of {}",
                    format::percent(policy.min_effect)
                ));
            }
            a
        })
        .collect()
}

/// The flag the next extra look goes to: the open one (not decided, not frozen) with the
/// smallest raw p, ties to the fewest sessions spent, then to the order given. None when
/// every flag is decided.
pub fn next_flag(tallies: &[Tally], assessments: &[Assessment], frozen: &[bool]) -> Option<usize> {
    (0..tallies.len())
        .filter(|&i| !frozen[i] && !assessments[i].decided)
        .min_by(|&i, &j| {
            assessments[i]
                .p_value
                .total_cmp(&assessments[j].p_value)
                .then(tallies[i].sessions().cmp(&tallies[j].sessions()))
                .then(i.cmp(&j))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(corrupted: u64, clean: u64, failed: u64) -> Counts {
        Counts {
            leak: corrupted,
            done: clean,
            timeout: failed,
            ..Counts::default()
        }
    }

    fn tally(on: Counts, off: Counts) -> Tally {
        let mut t = Tally::new("1", "0");
        t.add_look(&on, &off, 0.10);
        t
    }

    #[test]
    fn screening_takes_about_half_the_budget() {
        assert_eq!(screening_sessions_per_arm(640, 3), 53);
        assert_eq!(screening_cost(640, 3), 318);
        assert_eq!(screening_sessions_per_arm(400, 2), 50);
        // Small budgets still screen with the minimum pair.
        assert_eq!(screening_sessions_per_arm(40, 5), MIN_SESSIONS_PER_ARM);
    }

    #[test]
    fn look_schedule_never_exceeds_the_budget() {
        for budget in [0u64, 16, 33, 100, 400, 640, 1001, 5000] {
            for k in 2..7 {
                let spent =
                    screening_cost(budget, k) + 2 * extra_look_sizes(budget, k).iter().sum::<u64>();
                if screening_cost(budget, k) <= budget {
                    assert!(spent <= budget, "budget {budget}, k {k}: spent {spent}");
                    assert!(
                        budget - spent < 2 * MIN_SESSIONS_PER_ARM,
                        "budget {budget}, k {k}: {} left unused",
                        budget - spent
                    );
                } else {
                    assert!(extra_look_sizes(budget, k).is_empty());
                }
            }
        }
        // 640 over 3 flags: 318 screening, then 53, 53, 53 per arm (318), 4 left.
        assert_eq!(extra_look_sizes(640, 3), vec![53, 53, 53]);
        assert_eq!(max_looks(640, 3), 4);
        // The last look takes what is left when that is still a useful pair.
        assert_eq!(extra_look_sizes(413, 2), vec![52, 50]);
    }

    #[test]
    fn alpha_is_split_across_looks() {
        assert!((alpha_per_look(0.01, 4) - 0.0025).abs() < 1e-15);
        assert_eq!(alpha_per_look(0.01, 0), 0.01);
    }

    #[test]
    fn clear_difference_is_implicated_with_direction() {
        let tallies = vec![
            tally(counts(14, 36, 0), counts(0, 50, 0)),
            tally(counts(3, 47, 0), counts(3, 47, 0)),
        ];
        let a = assess(&tallies, &Policy::default(), 3);
        assert_eq!(a[0].status, Status::Implicated, "{:?}", a[0]);
        assert!(a[0].decided);
        assert_eq!(
            a[0].direction.as_deref(),
            Some("on (=1) corrupts: 14/50 vs 0/50")
        );
        // Holm over two flags: the smaller p is doubled.
        assert!((a[0].p_adjusted - 2.0 * a[0].p_value).abs() < 1e-12);
        assert_eq!(a[1].status, Status::Inconclusive);
        assert!(!a[1].decided);
        assert!(a[1].reasons.iter().any(|r| r.starts_with("underpowered")));
    }

    #[test]
    fn off_value_can_be_the_culprit() {
        let tallies = vec![
            tally(counts(0, 60, 0), counts(20, 40, 0)),
            tally(counts(0, 60, 0), counts(0, 60, 0)),
        ];
        let a = assess(&tallies, &Policy::default(), 2);
        assert_eq!(a[0].status, Status::Implicated);
        assert!(a[0].direction.as_deref().unwrap().starts_with("off (=0)"));
    }

    #[test]
    fn more_looks_demand_a_smaller_p() {
        // p = 0.0024 for 9/40 vs 0/40: Holm x2 = 0.0047 passes alpha 0.01 with one look,
        // fails at alpha / 4.
        let tallies = vec![
            tally(counts(9, 31, 0), counts(0, 40, 0)),
            tally(counts(0, 40, 0), counts(0, 40, 0)),
        ];
        let p = Policy::default();
        assert!(assess(&tallies, &p, 1)[0].p_adjusted < 0.01);
        assert_eq!(assess(&tallies, &p, 1)[0].status, Status::Implicated);
        assert_eq!(assess(&tallies, &p, 4)[0].status, Status::Inconclusive);
    }

    #[test]
    fn tight_interval_clears() {
        let tallies = vec![
            tally(counts(1, 399, 0), counts(1, 399, 0)),
            tally(counts(0, 400, 0), counts(0, 400, 0)),
        ];
        let a = assess(&tallies, &Policy::default(), 2);
        assert!(a.iter().all(|x| x.status == Status::Cleared), "{a:?}");
        assert!(a.iter().all(|x| x.decided));
    }

    #[test]
    fn degraded_arm_blocks_even_a_significant_flag() {
        // on: 30 timeouts of 50 and 15 corrupted: a big difference, but not a same-speed toggle.
        let t = tally(counts(15, 5, 30), counts(0, 50, 0));
        assert!(t
            .blocked
            .as_deref()
            .unwrap()
            .contains("degraded, not a same-speed toggle"));
        let a = assess(
            &[t, tally(counts(0, 8, 0), counts(0, 8, 0))],
            &Policy::default(),
            2,
        );
        assert_eq!(a[0].status, Status::Inconclusive);
        assert!(a[0].decided, "a degraded flag gets no more budget");
        // Exactly 10% is not over the line.
        assert!(tally(counts(0, 45, 5), counts(0, 50, 0)).blocked.is_none());
    }

    #[test]
    fn next_look_goes_to_the_most_promising_open_flag() {
        let tallies = vec![
            tally(counts(14, 36, 0), counts(0, 50, 0)), // implicated: closed
            tally(counts(5, 45, 0), counts(1, 49, 0)),  // p ~ 0.2
            tally(counts(2, 48, 0), counts(2, 48, 0)),  // p = 1
            tally(counts(20, 0, 30), counts(0, 50, 0)), // degraded: closed
        ];
        let a = assess(&tallies, &Policy::default(), 3);
        let frozen = vec![false; 4];
        assert_eq!(next_flag(&tallies, &a, &frozen), Some(1));
        assert_eq!(
            next_flag(&tallies, &a, &[false, true, false, false]),
            Some(2)
        );
        assert_eq!(next_flag(&tallies, &a, &[false, true, true, false]), None);
    }

    #[test]
    fn ties_go_to_the_flag_with_fewer_sessions() {
        let mut more = tally(counts(2, 48, 0), counts(2, 48, 0));
        more.add_look(&counts(0, 8, 0), &counts(0, 8, 0), 0.10);
        let tallies = vec![more, tally(counts(2, 48, 0), counts(2, 48, 0))];
        let a = assess(&tallies, &Policy::default(), 3);
        assert_eq!(a[0].p_value, a[1].p_value);
        assert_eq!(next_flag(&tallies, &a, &[false, false]), Some(1));
    }
}
