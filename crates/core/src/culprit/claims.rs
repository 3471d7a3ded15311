//! Phase 4 of the culprit search, the answer's claims at alpha: the minimal set fails
//! again as a fresh step, and each of its values is needed. A claim that does not hold is
//! a navigation error caught: the search runs again once with every step at alpha.

use super::evidence::{pct, totals, EvidenceKey, FailingSet};
use super::report::{Answer, Outcome, StepKind};
use super::search::{Halt, Level, Search, Tested};
use super::step::Eval;

/// What the confirmation of an answer's values came to.
enum Confirmation {
    Confirmed,
    /// A value is not needed: the configuration without it fails at alpha.
    Refuted(String),
    /// A value could not be shown needed (undecided, degraded, another failure).
    Unconfirmed(String),
}

impl Search<'_> {
    /// ddmin over the testable flags, then the answer's claims at alpha: the minimal set
    /// and the evidence of its re-test. A claim that does not hold is a navigation error
    /// caught: the search runs again once with every step at alpha (the blocks it has are
    /// kept: each step's e-process carries on from them).
    pub(super) async fn claimed_minimal_set(
        &mut self,
        finest: bool,
    ) -> Result<(Vec<usize>, EvidenceKey), Halt> {
        loop {
            self.parked.retain(|f| !self.held.contains(f));
            let delta: Vec<usize> = self
                .testable()
                .into_iter()
                .filter(|f| !self.parked.contains(f))
                .collect();
            let answer = self.ddmin(delta, finest).await?;
            self.ensure_passing_end(0).await?;
            // The parked flags are flipped in the re-test: failing, it shows them not
            // needed; otherwise ddmin goes over every testable flag.
            let parked = std::mem::take(&mut self.parked);
            let answer_set = self.with_held(answer.iter().copied());
            let (retest_key, outcome, reason) = self.retest(&answer_set).await?;
            let shown = self.show(&answer);
            if outcome != Outcome::Fails {
                if outcome == Outcome::Passes {
                    self.tested.push(Tested {
                        set: answer_set,
                        outcome,
                        claim: true,
                    });
                }
                if !parked.is_empty() {
                    continue;
                }
                let why = format!("{shown} did not fail again on re-test ({reason})");
                if self.escalate(&why) {
                    continue;
                }
                return Err(Halt::Answer(
                    Answer::Inconclusive,
                    format!(
                        "inconclusive: the minimal set {shown} did not fail again on re-test ({reason}){}; rerun with a larger --budget or check for flakiness{}",
                        self.caught_words(),
                        self.untestable_words()
                    ),
                ));
            }
            match self.confirm_needed(&answer).await? {
                Confirmation::Confirmed => return Ok((answer, retest_key)),
                Confirmation::Refuted(why) if self.escalate(&why) => continue,
                Confirmation::Refuted(why) | Confirmation::Unconfirmed(why) => {
                    return Err(Halt::Answer(
                        Answer::Inconclusive,
                        format!(
                            "inconclusive: {shown} fails (re-tested: {reason}) but is not shown minimal: {why}{}{}",
                            self.caught_words(),
                            self.untestable_words()
                        ),
                    ));
                }
            }
        }
    }

    /// The answer fails again as a fresh step, at alpha: the test that ended ddmin where
    /// it ran as this re-test ([`Search::final_test`]), else a re-test on fresh blocks.
    async fn retest(
        &mut self,
        answer_set: &FailingSet,
    ) -> Result<(EvidenceKey, Outcome, String), Halt> {
        match self.final_tested.take() {
            // ddmin ended on a set it tested as the re-test: fresh blocks, at alpha.
            Some((key, outcome, reason)) if key.0 == *answer_set => Ok((key, outcome, reason)),
            _ => {
                self.retests += 1;
                let retest_key = (answer_set.clone(), self.retests);
                let (outcome, reason) = self
                    .decide_and_record(&retest_key, Level::Claim, |_| StepKind::Retest)
                    .await?;
                Ok((retest_key, outcome, reason))
            }
        }
    }

    /// The verdict of a culprit whose claims held, with the re-test's figures beside the
    /// ends'.
    pub(super) fn culprit_verdict(
        &self,
        answer: Vec<usize>,
        retest_key: &EvidenceKey,
    ) -> (Answer, String) {
        let shown = self.show(&answer);
        let t = totals(self.blocks_of(retest_key));
        let p = totals(self.blocks_of(&(self.passing_end(), 0)));
        let f = totals(self.blocks_of(&(self.all(), 0)));
        let needed = if answer.len() > 1 {
            "each needed: flipping any one of them passes"
        } else {
            "flipping it passes"
        };
        let mut verdict = format!(
            "culprit: {shown} is the minimal failure-inducing set ({needed}, at alpha {}); re-tested: {} corrupted vs {} with every testable flag flipped (the configuration as it is: {}), at {} sessions in flight",
            self.p.alpha,
            pct(t.corrupted, t.classified),
            pct(p.corrupted, p.classified),
            pct(f.corrupted, f.classified),
            self.p.concurrency
        );
        verdict.push_str(&self.caught_words());
        verdict.push_str(&self.untestable_words());
        (Answer::Culprit { flags: answer }, verdict)
    }

    /// A claim did not hold at alpha: a navigation step erred. Once: every step from now
    /// on decides at alpha, and ddmin forgets what it decided at the navigation level.
    /// False when the search already ran at alpha.
    fn escalate(&mut self, why: &str) -> bool {
        if self.strict {
            return false;
        }
        self.strict = true;
        self.tested.retain(|t| t.claim);
        self.caught.push(why.to_string());
        true
    }

    fn caught_words(&self) -> String {
        self.caught
            .iter()
            .map(|w| {
                format!(
                    "; searched again with every step at alpha {} after {w}",
                    self.p.alpha
                )
            })
            .collect()
    }

    /// Each value of `answer` is needed: the configuration without it (or a tested one
    /// without it that holds the rest of the answer, which passes only if it does, by
    /// monotonicity) passes at alpha. Decided from the blocks already run where they
    /// suffice; else the step's own e-process is carried on to 1/alpha (valid at any
    /// stopping time). A one-value answer needs nothing more here than the passing end's
    /// load: without it is the passing end, verified at alpha.
    async fn confirm_needed(&mut self, answer: &[usize]) -> Result<Confirmation, Halt> {
        for &flag in answer {
            let without = self.with_held(answer.iter().copied().filter(|&x| x != flag));
            if without == self.passing_end() {
                // The verified passing end is this claim ("without it, it passes"): a
                // pass, so it needs the load as any step's does.
                let pass_key = (self.passing_end(), 0);
                if let Some(why) = self.load_unconfirmed(self.blocks_of(&pass_key)) {
                    return Ok(Confirmation::Unconfirmed(format!(
                        "{}={} could not be shown needed: the passing end passes, but {why}",
                        self.p.flags[flag].name, self.p.flags[flag].failing
                    )));
                }
                continue;
            }
            let mut candidates: Vec<FailingSet> = Vec::new();
            for t in &self.tested {
                let evidence = !t.set.contains(&flag)
                    && t.set.is_superset(&without)
                    && (t.outcome == Outcome::Passes || t.set == without)
                    && !self.blocks_of(&(t.set.clone(), 0)).is_empty();
                if evidence && !candidates.contains(&t.set) {
                    candidates.push(t.set.clone());
                }
            }
            let decided = candidates.iter().any(|c| {
                matches!(
                    self.evaluate(&(c.clone(), 0), Level::Claim),
                    Eval::Decided(Outcome::Passes, _)
                )
            });
            if decided {
                continue;
            }
            // The configuration itself if it ran, else the tested one with most blocks.
            let pick = if candidates.contains(&without) {
                without.clone()
            } else {
                candidates
                    .iter()
                    .max_by_key(|c| self.blocks_of(&((*c).clone(), 0)).len())
                    .cloned()
                    .unwrap_or_else(|| without.clone())
            };
            let key: EvidenceKey = (pick.clone(), 0);
            let (outcome, reason) = self
                .decide_and_record(&key, Level::Claim, |_| StepKind::Confirm)
                .await?;
            self.tested.retain(|t| t.set != pick);
            self.tested.push(Tested {
                set: pick.clone(),
                outcome,
                claim: true,
            });
            let name = format!("{}={}", self.p.flags[flag].name, self.p.flags[flag].failing);
            let config = format!("{{{}}}", self.names(&pick).join(", "));
            match outcome {
                Outcome::Passes => {}
                Outcome::Fails => {
                    return Ok(Confirmation::Refuted(format!(
                        "{name} is not needed: {config} fails without it at alpha ({reason})"
                    )))
                }
                _ => {
                    return Ok(Confirmation::Unconfirmed(format!(
                        "{name} could not be shown needed at alpha {}: {config} {reason}",
                        self.p.alpha
                    )))
                }
            }
        }
        Ok(Confirmation::Confirmed)
    }

    fn show(&self, set: &[usize]) -> String {
        format!(
            "{{{}}}",
            set.iter()
                .map(|&i| format!("{}={}", self.p.flags[i].name, self.p.flags[i].failing))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}
