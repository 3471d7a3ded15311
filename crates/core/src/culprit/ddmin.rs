//! Phase 3 of the culprit search, delta debugging: Zeller's ddmin over the testable
//! flags with a three-valued test, its cache, and what monotonicity implies from it.

use super::evidence::{EvidenceKey, FailingSet};
use super::report::{Outcome, StepKind};
use super::search::{Halt, Level, Search, Tested};
use super::step::Eval;

impl Search<'_> {
    /// Zeller's ddmin with a three-valued test. Standard (from halves, subsets before
    /// complements) unless `finest`: then from single flags, complements first, so the
    /// first tests flip one flag at a time from the failing configuration, and a flag
    /// whose flip alone degrades the engine is held out as untestable.
    pub(super) async fn ddmin(
        &mut self,
        delta: Vec<usize>,
        finest: bool,
    ) -> Result<Vec<usize>, Halt> {
        let mut c = delta;
        let mut n = if finest { c.len().max(2) } else { 2 };
        'search: while c.len() >= 2 {
            let parts = split(&c, n);
            let orders: [bool; 2] = if finest { [true, false] } else { [false, true] };
            for complements in orders {
                if complements && n == 2 && !finest {
                    continue; // with two parts, complements are the subsets
                }
                for part in &parts {
                    let candidate: Vec<usize> = if complements {
                        c.iter().copied().filter(|x| !part.contains(x)).collect()
                    } else {
                        part.clone()
                    };
                    let flipped_alone =
                        complements && part.len() == 1 && c.len() == self.testable().len();
                    let outcome = if self.would_end(&candidate) {
                        self.final_test(&candidate).await?
                    } else {
                        self.test(&candidate).await?
                    };
                    match outcome {
                        Outcome::Fails => {
                            c = candidate;
                            n = if complements { (n - 1).max(2) } else { 2 };
                            continue 'search;
                        }
                        Outcome::Degraded if flipped_alone => {
                            let flag = part[0];
                            let why = self
                                .steps
                                .last()
                                .map(|s| s.reason.clone())
                                .unwrap_or_default();
                            self.hold_out(flag, "alone ", &why);
                            c.retain(|&x| x != flag);
                            n = n.min(c.len()).max(2);
                            continue 'search;
                        }
                        _ => {}
                    }
                }
            }
            if n >= c.len() {
                break;
            }
            n = (2 * n).min(c.len());
        }
        Ok(c)
    }

    /// The outcome of the configuration with `subset` (testable flags) failing and every
    /// other testable flag flipped: cached, implied by monotonicity, or run as a step.
    async fn test(&mut self, subset: &[usize]) -> Result<Outcome, Halt> {
        let set = self.with_held(subset.iter().copied());
        if let Some(outcome) = self.cached(&set) {
            return Ok(outcome);
        }
        let level = if self.strict {
            Level::Claim
        } else {
            Level::Navigate
        };
        let key: EvidenceKey = (set.clone(), 0);
        let (outcome, _) = self
            .decide_and_record(&key, level, |_| StepKind::Ddmin)
            .await?;
        self.tested.push(Tested {
            set,
            outcome,
            claim: level == Level::Claim,
        });
        Ok(outcome)
    }

    /// A test that can only end the search, so it is the answer's re-test: fresh blocks
    /// decided at alpha, never at the navigation level.
    async fn final_test(&mut self, subset: &[usize]) -> Result<Outcome, Halt> {
        let set = self.with_held(subset.iter().copied());
        // Its own blocks when it has none yet (they are fresh, and a confirmation finds
        // them there), else a new generation.
        let key: EvidenceKey = if self.blocks_of(&(set.clone(), 0)).is_empty() {
            (set.clone(), 0)
        } else {
            self.retests += 1;
            (set.clone(), self.retests)
        };
        // Failing, it is the answer's re-test; otherwise a ddmin step decided at alpha.
        let parked = !self.parked.is_empty();
        let kind_of = |outcome| {
            if outcome == Outcome::Fails && !parked {
                StepKind::Retest
            } else {
                StepKind::Ddmin
            }
        };
        let (outcome, reason) = self.decide_and_record(&key, Level::Claim, kind_of).await?;
        self.tested.push(Tested {
            set,
            outcome,
            claim: true,
        });
        self.final_tested = Some((key, outcome, reason));
        Ok(outcome)
    }

    /// The failing set of a configuration: the given testable flags failing, and the
    /// held-out ones, which every step keeps at their failing values.
    pub(super) fn with_held(&self, failing: impl Iterator<Item = usize>) -> FailingSet {
        failing
            .chain(self.held.iter().copied())
            .chain(self.parked.iter().copied())
            .collect()
    }

    /// After the halving ([`Search::halve_degraded_end`]): P1, the configuration that
    /// flipped the first half and held the second at failing values, was not degraded.
    /// If it passes (from its block, at the navigation level), the failure needs a value
    /// of the flipped half; undecided, that is still the better bet. ddmin then narrows
    /// that half first, with the held half's testable
    /// flags parked at their failing values (its first tests are the flips alone of the
    /// first half's flags), and the answer's re-test flips the parked flags. A re-test
    /// that does not fail then sends ddmin over every testable flag.
    pub(super) fn park_from(&mut self, p1: &FailingSet) -> Result<(), Halt> {
        let parked: FailingSet = p1
            .iter()
            .copied()
            .filter(|f| !self.held.contains(f))
            .collect();
        let key: EvidenceKey = (p1.clone(), 0);
        if parked.is_empty() || !self.passing_ok() || self.cached(p1).is_some() {
            return Ok(());
        }
        self.pin_pairing(&key);
        match self.evaluate(&key, Level::Navigate) {
            Eval::Decided(Outcome::Passes, reason) => {
                self.record_step(
                    StepKind::Ddmin,
                    &key,
                    (Outcome::Passes, reason),
                    Level::Navigate,
                )?;
                self.tested.push(Tested {
                    set: p1.clone(),
                    outcome: Outcome::Passes,
                    claim: false,
                });
            }
            // Decided otherwise: the failure may need only the held half; no bet.
            Eval::Decided(..) => return Ok(()),
            // Undecided from its block: still the better bet (a wrong one costs the
            // re-test, and ddmin then goes over every flag with its tests kept).
            _ => {}
        }
        self.parked = parked;
        Ok(())
    }

    /// The outcome of `set` as ddmin's cache has it: tested, or implied by monotonicity
    /// (a superset of a failing set fails, a subset of a passing set passes).
    fn cached(&self, set: &FailingSet) -> Option<Outcome> {
        if let Some(t) = self.tested.iter().rev().find(|t| &t.set == set) {
            return Some(t.outcome);
        }
        self.tested
            .iter()
            .find(|t| {
                (t.outcome == Outcome::Fails && t.set.is_subset(set))
                    || (t.outcome == Outcome::Passes && t.set.is_superset(set))
            })
            .map(|t| t.outcome)
    }

    /// Whether `subset` failing would end ddmin with it as the answer: every one-smaller
    /// subset of it is known to pass (cached, or implied by a passing superset), and it
    /// was never tested.
    fn would_end(&self, subset: &[usize]) -> bool {
        let whole = self.with_held(subset.iter().copied());
        if subset.is_empty() || self.cached(&whole).is_some() {
            return false;
        }
        subset.iter().all(|&x| {
            let smaller = self.with_held(subset.iter().copied().filter(|&y| y != x));
            self.tested
                .iter()
                .any(|t| t.outcome == Outcome::Passes && t.set.is_superset(&smaller))
        })
    }
}

/// `items` cut into `n` consecutive parts of nearly equal size, larger parts first
/// (numpy's `array_split`).
fn split(items: &[usize], n: usize) -> Vec<Vec<usize>> {
    let n = n.clamp(1, items.len().max(1));
    let (base, extra) = (items.len() / n, items.len() % n);
    let mut parts = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        parts.push(items[start..start + len].to_vec());
        start += len;
    }
    parts
}
