//! Phase 1 of the culprit search, both ends: the failing end (the configuration as it is)
//! must fail, and the passing end (every testable flag flipped) must be usable and
//! verified against it, else the search ends here (could not reproduce, no culprit,
//! inconclusive).

use super::evidence::{looks_of, pct, totals, EvidenceKey, Totals};
use super::report::{Answer, Outcome, StepKind};
use super::search::{Halt, Level, Search, Tested};
use crate::sequential::{mixture_confidence_sequence, Decision, Direction, SequentialState};
use crate::stats;

impl Search<'_> {
    /// The failing end's first block. A configuration as it is that is degraded (errors,
    /// timeouts) cannot be searched: the deployment needs fixing first.
    pub(super) async fn run_failing_end(&mut self) -> Result<(), Halt> {
        let fail_key = (self.all(), 0);
        self.run_block(&fail_key).await?;
        if let Some(why) = self.degraded(&fail_key) {
            let reason = format!("the configuration as it is is degraded: {why}");
            self.record_step(
                StepKind::Ends,
                &fail_key,
                (Outcome::Degraded, reason.clone()),
                Level::Claim,
            )?;
            return Err(Halt::Answer(
                Answer::CouldNotReproduce,
                format!("could not reproduce: {reason}; fix the deployment before searching"),
            ));
        }
        Ok(())
    }

    /// Before every flip is screened (a block per flag), the failing end shows it can fail
    /// at all, by its own always-valid bounds: it runs more blocks, up to the ends' cap,
    /// until its lower bound clears zero ([`Search::failing_end_bounds`]).
    pub(super) async fn failing_end_can_fail(&mut self) -> Result<(), Halt> {
        while !self.failing_end_bounds()? {
            self.run_block(&(self.all(), 0)).await?;
        }
        Ok(())
    }

    /// Whether the failing end's bounds let the screening start: its lower bound above
    /// zero, or its blocks at the ends' cap. Its upper bound below the effect sought ends
    /// the search, as the ends would.
    fn failing_end_bounds(&mut self) -> Result<bool, Halt> {
        let fail_key = (self.all(), 0);
        let f = totals(self.blocks_of(&fail_key));
        let [lower, upper] =
            mixture_confidence_sequence(f.corrupted, f.classified, self.p.clear_alpha / 2.0);
        if upper < self.p.min_effect {
            let figures = format!(
                "the configuration as it is: {}, at {} sessions in flight; its always-valid upper bound {:.1}% is below the {:.0}-point effect sought",
                pct(f.corrupted, f.classified),
                self.p.concurrency,
                100.0 * upper,
                100.0 * self.p.min_effect
            );
            let (outcome, answer, words) = self.not_reproduced(&fail_key, &figures);
            self.record_step(
                StepKind::Ends,
                &fail_key,
                (outcome, words.clone()),
                Level::Claim,
            )?;
            return Err(Halt::Answer(answer, words));
        }
        let f_blocks = self.blocks_of(&fail_key).len() as u64;
        Ok(lower > 0.0 || f_blocks >= self.p.ends_cap_blocks)
    }

    /// Make the passing end (every testable flag flipped) usable as a reference: not
    /// degraded (else find the flag that degrades it), verified against the failing end
    /// (else the search ends here with that answer), with at least `looks` looks.
    pub(super) async fn ensure_passing_end(&mut self, looks: usize) -> Result<(), Halt> {
        loop {
            let key = (self.passing_end(), 0);
            if self.blocks_of(&key).is_empty() {
                self.run_block(&key).await?;
                continue;
            }
            if let Some(why) = self.degraded(&key) {
                if self.testable().is_empty() {
                    return Err(Halt::Answer(
                        Answer::Inconclusive,
                        format!(
                            "inconclusive: every listed flag is untestable{}",
                            self.untestable_words()
                        ),
                    ));
                }
                self.find_degrader(why).await?;
                continue;
            }
            if self.ends_verified.as_ref() != Some(&self.held) {
                self.verify_ends().await?;
                continue;
            }
            if looks_of(self.blocks_of(&key), self.p.look).len() >= looks {
                return Ok(());
            }
            self.run_block(&key).await?;
        }
    }

    /// The failing end against the passing end (which is not degraded). Returns once
    /// both are verified; any other end of the ends is the search's answer.
    pub(super) async fn verify_ends(&mut self) -> Result<(), Halt> {
        let fail_key = (self.all(), 0);
        loop {
            let pass_key = (self.passing_end(), 0);
            if self.degraded(&pass_key).is_some() {
                // A later block of the passing end degraded: the caller holds out again.
                return Ok(());
            }
            self.pin_pairing(&pass_key);
            let (outcome, reason, answer) = match self.judge_ends(&fail_key, &pass_key) {
                Ends::RunBlock(key) => {
                    self.run_block(&key).await?;
                    continue;
                }
                Ends::Decided(outcome, reason, answer) => (outcome, reason, answer),
            };
            self.record_step(
                StepKind::Ends,
                &fail_key,
                (outcome, reason.clone()),
                Level::Claim,
            )?;
            if let Some(answer) = answer {
                return Err(Halt::Answer(
                    answer,
                    format!("{reason}{}", self.untestable_words()),
                ));
            }
            self.ends_verified = Some(self.held.clone());
            self.tested.push(Tested {
                set: self.all(),
                outcome: Outcome::Fails,
                claim: true,
            });
            self.tested.push(Tested {
                set: self.held.clone(),
                outcome: Outcome::Passes,
                claim: true,
            });
            return Ok(());
        }
    }

    /// What the ends' blocks so far come to: verified (the e-process implicates the
    /// failing end), could not reproduce (the failing end's upper bound is below the
    /// effect sought), no culprit (the passing end fails as much), or, undecided,
    /// [`Search::undecided_ends`].
    fn judge_ends(&self, fail_key: &EvidenceKey, pass_key: &EvidenceKey) -> Ends {
        let (state, _) = self.ends_state();
        let f = totals(self.blocks_of(fail_key));
        let p = totals(self.blocks_of(pass_key));
        let f_bounds =
            mixture_confidence_sequence(f.corrupted, f.classified, self.p.clear_alpha / 2.0);
        let p_bounds =
            mixture_confidence_sequence(p.corrupted, p.classified, self.p.clear_alpha / 2.0);
        let words = format!(
            "the configuration as it is: {}, every testable flag flipped: {}, at {} sessions in flight",
            pct(f.corrupted, f.classified),
            pct(p.corrupted, p.classified),
            self.p.concurrency
        );
        let decision = state.decision();
        if matches!(
            decision,
            Some(Decision::Implicated {
                direction: Direction::On
            })
        ) {
            Ends::Decided(Outcome::Fails, format!("both ends verified: {words}"), None)
        } else if f_bounds[1] < self.p.min_effect {
            let figures = format!(
                "{words}; the failing end's always-valid upper bound {:.1}% is below the {:.0}-point effect sought",
                100.0 * f_bounds[1],
                100.0 * self.p.min_effect
            );
            let (outcome, answer, words) = self.not_reproduced(fail_key, &figures);
            Ends::Decided(outcome, words, Some(answer))
        } else if matches!(
            decision,
            Some(Decision::Implicated {
                direction: Direction::Off
            })
        ) || (matches!(decision, Some(Decision::Cleared)) && f_bounds[0] > 0.0)
        {
            no_culprit(&words)
        } else {
            self.undecided_ends(fail_key, pass_key, (&f, &p), p_bounds[0], &words)
        }
    }

    /// Ends the e-process has not decided: another block of the end with fewer, until both
    /// reach the cap; at the cap, no culprit when the passing end's own lower bound is
    /// above zero, else inconclusive.
    fn undecided_ends(
        &self,
        fail_key: &EvidenceKey,
        pass_key: &EvidenceKey,
        (f, p): (&Totals, &Totals),
        p_lower: f64,
        words: &str,
    ) -> Ends {
        let f_blocks = self.blocks_of(fail_key).len() as u64;
        let p_blocks = self.blocks_of(pass_key).len() as u64;
        // Ends that differ by min_effect or more on their counts, the passing end at
        // most half the failing end's rate, undecided at the cap, are likely a
        // culprit over a background rate that fails the passing end too: they get
        // as many blocks again before "no culprit" is considered.
        let (f_rate, p_rate) = (
            stats::rate(f.corrupted, f.classified),
            stats::rate(p.corrupted, p.classified),
        );
        let leaning = f_rate - p_rate >= self.p.min_effect && f_rate >= 2.0 * p_rate;
        let cap = if leaning {
            2 * self.p.ends_cap_blocks
        } else {
            self.p.ends_cap_blocks
        };
        if f_blocks >= cap && p_blocks >= cap {
            if leaning {
                Ends::Decided(
                    Outcome::Unresolved,
                    format!(
                        "inconclusive: the ends differ but not at alpha {} after {cap} blocks each ({words})",
                        self.p.alpha
                    ),
                    Some(Answer::Inconclusive),
                )
            } else if p_lower > 0.0 {
                no_culprit(words)
            } else {
                Ends::Decided(
                    Outcome::Unresolved,
                    format!("inconclusive: the ends could not be told apart ({words})"),
                    Some(Answer::Inconclusive),
                )
            }
        } else {
            // The end with fewer blocks runs next (the failing end on ties: its
            // upper bound is what can stop a search that cannot reproduce).
            let key = if f_blocks <= p_blocks {
                fail_key.clone()
            } else {
                pass_key.clone()
            };
            Ends::RunBlock(key)
        }
    }

    pub(super) fn ends_state(&self) -> (SequentialState, Vec<(u64, u64)>) {
        let pass_key = (self.passing_end(), 0);
        let f = self.failing_pairs(&pass_key);
        let p = looks_of(self.blocks_of(&pass_key), self.p.look);
        let mut state = SequentialState::new(self.design);
        for (a, b) in f.iter().zip(&p) {
            if state.look(*a, *b).expect("counts from classes").is_final() {
                break;
            }
        }
        (state, f)
    }

    pub(super) fn passing_ok(&self) -> bool {
        self.ends_verified.as_ref() == Some(&self.held)
    }

    /// The answer when the failing end did not fail (`figures`: its rate and bound).
    /// "Could not reproduce" is a claim about the load asked for, so it needs that load
    /// shown on the engine side, as a pass does: a build whose engine never ran more
    /// than a few requests at once (a capped max running requests, KV memory) would
    /// otherwise send the user to raise `--concurrency`, which changes nothing there.
    fn not_reproduced(&self, fail_key: &EvidenceKey, figures: &str) -> (Outcome, Answer, String) {
        match self.load_unconfirmed(self.blocks_of(fail_key)) {
            Some(why) => (
                Outcome::Unresolved,
                Answer::Inconclusive,
                format!(
                    "inconclusive: the configuration as it is did not fail, but not at the load asked: {why}; find what holds the engine back (its max running requests, KV memory, metrics) and search again ({figures})"
                ),
            ),
            None => (
                Outcome::Passes,
                Answer::CouldNotReproduce,
                format!("could not reproduce: raise --concurrency or the workload ({figures})"),
            ),
        }
    }
}

/// The ends' answer when the passing end fails as much as the failing end.
fn no_culprit(words: &str) -> Ends {
    Ends::Decided(
        Outcome::Fails,
        format!("no culprit among the listed flags: with every one of them flipped it still fails ({words})"),
        Some(Answer::NoCulprit),
    )
}

/// What the ends' blocks so far come to ([`Search::judge_ends`]).
enum Ends {
    /// Decided, with the reason the ends' step records; with an answer, the search ends
    /// there with it.
    Decided(Outcome, String, Option<Answer>),
    /// Undecided: run another block of this end.
    RunBlock(EvidenceKey),
}
