//! One step of the culprit search: a configuration decided by two sequential e-processes
//! (against the passing end, and the failing end against it) from the blocks it has,
//! running more of its own or of a reference until it is decided, then recorded.

use super::block::BlockOutcome;
use super::evidence::{looks_of, pct, totals, EvidenceKey};
use super::mix;
use super::report::{Outcome, StepKind, StepRecord};
use super::search::{Event, Halt, Level, Search};
use crate::sequential::{ArmPrior, Decision, Direction, PlugInPrior, SequentialState};
use crate::stats;

/// Weight, in sessions, of the guesses a step's e-process against the passing end starts
/// from ([`Search::step_prior`]).
const PRIOR_SESSIONS: f64 = 10.0;

/// A step's state after reading the blocks it has.
pub(super) enum Eval {
    Decided(Outcome, String),
    /// Run another block of this configuration.
    NeedStep,
    /// Run another block of the failing end.
    NeedFailing,
    /// Make the passing end usable, with at least this many looks.
    NeedPassing(usize),
}

impl Search<'_> {
    /// Run blocks until the step at `key` is decided.
    async fn decide_step(
        &mut self,
        key: &EvidenceKey,
        level: Level,
    ) -> Result<(Outcome, String), Halt> {
        loop {
            self.pin_pairing(key);
            match self.evaluate(key, level) {
                Eval::Decided(outcome, reason) => return Ok((outcome, reason)),
                Eval::NeedStep => self.run_block(key).await?,
                Eval::NeedFailing => self.run_block(&(self.all(), 0)).await?,
                Eval::NeedPassing(looks) => {
                    let held = self.held.clone();
                    self.ensure_passing_end(looks).await?;
                    if self.held != held {
                        // A flag was held out on the way: this configuration is gone.
                        return Ok((
                            Outcome::Unresolved,
                            "a flag it flips was held out as untestable meanwhile".into(),
                        ));
                    }
                }
            }
        }
    }

    /// [`Search::decide_step`], then the step recorded as `kind_of(outcome)`.
    pub(super) async fn decide_and_record(
        &mut self,
        key: &EvidenceKey,
        level: Level,
        kind_of: impl FnOnce(Outcome) -> StepKind,
    ) -> Result<(Outcome, String), Halt> {
        let (outcome, reason) = self.decide_step(key, level).await?;
        self.record_step(kind_of(outcome), key, (outcome, reason.clone()), level)?;
        Ok((outcome, reason))
    }

    pub(super) fn evaluate(&self, key: &EvidenceKey, level: Level) -> Eval {
        let blocks = self.blocks_of(key);
        if blocks.is_empty() {
            return Eval::NeedStep;
        }
        if let Some(why) = self.degraded(key) {
            return Eval::Decided(Outcome::Degraded, why);
        }
        let (vp, vf) = self.step_states(key, level);
        let t = totals(blocks);
        match step_verdict(&vp, &vf) {
            Some(Outcome::Fails) => {
                let p = self.mix_p(key);
                if p < self.p.mix_alpha {
                    let step = mix::corrupted_mix(blocks.iter().flat_map(|b| b.classes.iter()));
                    return Eval::Decided(
                        Outcome::OtherFailure,
                        format!(
                            "fails ({}) with another class mix than the reference failure (leak/bad/wrong/no_tool/rejected {}/{}/{}/{}/{}; Freeman-Halton p = {p:.2e}): a different failure mode",
                            pct(t.corrupted, t.classified),
                            step[0], step[1], step[2], step[3], step[4]
                        ),
                    );
                }
                Eval::Decided(
                    Outcome::Fails,
                    format!(
                        "fails: {} corrupted, e-value {:.0} against the passing end, class mix as the reference (p = {p:.2})",
                        pct(t.corrupted, t.classified),
                        vp.e_value()
                    ),
                )
            }
            Some(Outcome::Passes) => {
                if let Some(why) = self.load_unconfirmed(blocks) {
                    return Eval::Decided(
                        Outcome::Unresolved,
                        format!(
                            "passes ({}) but {why}: a load-dependent failure is not ruled out",
                            pct(t.corrupted, t.classified),
                        ),
                    );
                }
                Eval::Decided(
                    Outcome::Passes,
                    format!(
                        "passes: {} corrupted, e-value {:.0} for the failing end against it",
                        pct(t.corrupted, t.classified),
                        vf.e_value()
                    ),
                )
            }
            _ => {
                let s = looks_of(blocks, self.p.look).len();
                let f = self.failing_pairs(key).len();
                let pass_key = (self.passing_end(), 0);
                // Which reference can decide it: a step whose rate is nearer the failing
                // end's can only come to "fails", against the passing end; one nearer the
                // passing end's, to "passes", against the failing end. Only that one runs
                // another block (the other keeps the looks it has).
                let fr = totals(self.blocks_of(&(self.all(), 0)));
                let pr = totals(self.blocks_of(&pass_key));
                let rate = stats::rate(t.corrupted, t.classified);
                let leans_fails = self.passing_ok()
                    && rate - stats::rate(pr.corrupted, pr.classified)
                        >= stats::rate(fr.corrupted, fr.classified) - rate;
                if f < s && !leans_fails {
                    return Eval::NeedFailing;
                }
                if self.passing_ok() {
                    if leans_fails && looks_of(self.blocks_of(&pass_key), self.p.look).len() < s {
                        return Eval::NeedPassing(s);
                    }
                } else {
                    // Without a usable passing end only "passes" can be decided. One that
                    // was never run is cheap to try; one that degraded costs a search for
                    // the degrading flag, worth it only once the step alone is stuck.
                    let tried = !self.blocks_of(&pass_key).is_empty();
                    if !tried || blocks.len() >= 2 {
                        return Eval::NeedPassing(s);
                    }
                }
                let cap = match level {
                    Level::Navigate => self.p.step_cap_blocks,
                    Level::Claim => self.p.claim_cap_blocks,
                };
                if blocks.len() as u64 >= cap {
                    return Eval::Decided(
                        Outcome::Unresolved,
                        format!(
                            "undecided after {} sessions ({} corrupted)",
                            t.sessions,
                            pct(t.corrupted, t.classified)
                        ),
                    );
                }
                Eval::NeedStep
            }
        }
    }

    fn step_states(&self, key: &EvidenceKey, level: Level) -> (SequentialState, SequentialState) {
        let s = looks_of(self.blocks_of(key), self.p.look);
        let p = if self.passing_ok() {
            looks_of(self.blocks_of(&(self.passing_end(), 0)), self.p.look)
        } else {
            Vec::new()
        };
        let f = self.failing_pairs(key);
        let design = match level {
            Level::Navigate => self.navigate,
            Level::Claim => self.design,
        };
        let mut vp = SequentialState::with_prior(design, self.step_prior(key));
        let mut vf = SequentialState::new(design);
        // Each e-process reads the looks its reference has: a step leaning one way only
        // needs more of the reference that can decide it (see `evaluate`).
        for i in 0..s.len() {
            if vp.decision().is_none() && i < p.len() {
                vp.look(s[i], p[i]).expect("counts from classes");
            }
            if vf.decision().is_none() && i < f.len() {
                vf.look(f[i], s[i]).expect("counts from classes");
            }
            if step_verdict(&vp, &vf).is_some() {
                break;
            }
        }
        (vp, vf)
    }

    /// The failing end's looks paired with each look of the configuration at `key`, as
    /// far as the failing end has them. The pairing is fixed by what existed when the
    /// configuration was first evaluated (`pinned`: m looks), never by its own data,
    /// so the e-process stays valid: with m >= 2L (L looks per block), look i
    /// of the first block pairs with the r = m / L failing looks r i .. r i + r - 1
    /// (merged), so every failing-end session already run counts, instead of the first
    /// block's alone; later looks pair one to one with the failing end's looks from r L
    /// on. Turner, Ly and Grunwald's e-variable allows any group sizes per look
    /// (`block_log_e_value`), and a failing end with two blocks against a step's one is
    /// what the search has whenever the failing end ran again first (the machine check,
    /// an undecided ends' block): the claims "without this value it passes" then decide
    /// in the step's first block far more often.
    pub(super) fn failing_pairs(&self, key: &EvidenceKey) -> Vec<(u64, u64)> {
        let f = looks_of(self.blocks_of(&(self.all(), 0)), self.p.look);
        if key.0 == self.all() {
            return f;
        }
        let per_block = (self.p.block / self.p.look).max(1) as usize;
        let m = self.pinned.get(key).map_or(f.len(), |p| p.failing_looks);
        let r = (m / per_block).max(1);
        let steps = looks_of(self.blocks_of(key), self.p.look)
            .len()
            .max(per_block);
        let mut out = Vec::new();
        for i in 0..steps {
            let range = if i < per_block {
                r * i..r * i + r
            } else {
                r * per_block + (i - per_block)..r * per_block + (i - per_block) + 1
            };
            if range.end > f.len() {
                break;
            }
            out.push(
                f[range]
                    .iter()
                    .fold((0, 0), |(k, n), &(dk, dn)| (k + dk, n + dn)),
            );
        }
        out
    }

    /// Where a step's e-process against the passing end (step "on", passing end "off")
    /// starts its plug-in estimates: the step is guessed to fail like the failing end did
    /// when the step was first evaluated (sessions this e-process never reads), the
    /// passing end to be clean, each guess worth [`PRIOR_SESSIONS`] sessions. Without it
    /// both start at 1/2, where the first look's e-value is exactly 1 and the next ones
    /// learn the rates slowly; the data outweigh a wrong guess within a block. The e-process
    /// against the failing end keeps safestats' uninformed start: a guess there could only
    /// come from the passing end, and it made "passes" decide on an unusually high sample
    /// of the failing end more often (README, culprit bench).
    fn step_prior(&self, key: &EvidenceKey) -> PlugInPrior {
        let failing = self.pinned.get(key).map_or_else(
            || {
                let t = totals(self.blocks_of(&(self.all(), 0)));
                stats::rate(t.corrupted, t.classified)
            },
            |p| p.failing_rate,
        );
        PlugInPrior {
            on: ArmPrior::guess(failing, PRIOR_SESSIONS),
            off: ArmPrior::guess(0.0, PRIOR_SESSIONS),
        }
    }

    fn mix_p(&self, key: &EvidenceKey) -> f64 {
        let step = mix::corrupted_mix(self.blocks_of(key).iter().flat_map(|b| b.classes.iter()));
        let reference = mix::corrupted_mix(
            self.blocks_of(&(self.all(), 0))
                .iter()
                .flat_map(|b| b.classes.iter()),
        );
        mix::mix_p_value(&step, &reference)
    }

    /// Why `blocks` cannot show a pass at the experiment's load (`bisect run`'s rule for
    /// `cleared`): a block whose busiest engine role peaked below `min_load_fraction` of
    /// the target concurrency, or one no engine role measured at all (no metrics: the
    /// load is unconfirmed, as in `run`, never taken for granted).
    pub(super) fn load_unconfirmed(&self, blocks: &[BlockOutcome]) -> Option<String> {
        let unmeasured = blocks.iter().filter(|b| b.peak_engine.is_none()).count();
        if unmeasured > 0 {
            return Some(format!(
                "{unmeasured} of its {} blocks had no engine-side load measurement (no role's \
                 metrics reported running requests), so the {} in flight targeted are unconfirmed",
                blocks.len(),
                self.p.concurrency
            ));
        }
        let target = self.p.min_load_fraction * f64::from(self.p.concurrency);
        let low = blocks
            .iter()
            .filter_map(|b| b.peak_engine)
            .filter(|&peak| (peak as f64) < target)
            .min()?;
        Some(format!(
            "the engines peaked at {low} running requests, below {:.0}% of the {} targeted",
            100.0 * self.p.min_load_fraction,
            self.p.concurrency
        ))
    }

    pub(super) fn record_step(
        &mut self,
        kind: StepKind,
        key: &EvidenceKey,
        (outcome, reason): (Outcome, String),
        level: Level,
    ) -> Result<(), Halt> {
        self.pin_pairing(key);
        let blocks = self.blocks_of(key);
        let t = totals(blocks);
        let ids = self
            .blocks
            .iter()
            .filter(|(r, _)| self.names(&key.0) == r.failing)
            .map(|(r, _)| r.block)
            .collect::<Vec<_>>();
        // A re-test's own blocks are the last ones of its configuration.
        let own = blocks.len();
        let ids = ids[ids.len().saturating_sub(own)..].to_vec();
        let (vs_passing, vs_failing, mix_p) = if kind == StepKind::Ends {
            let (state, _) = self.ends_state();
            (state.looks().last().copied(), None, None)
        } else {
            let (vp, vf) = self.step_states(key, level);
            let mix_p = (t.corrupted > 0).then(|| self.mix_p(key));
            (
                vp.looks().last().copied(),
                vf.looks().last().copied(),
                mix_p,
            )
        };
        let record = StepRecord {
            step: self.steps.len() as u32 + 1,
            kind,
            failing: self.names(&key.0),
            outcome,
            blocks: ids,
            corrupted: t.corrupted,
            classified: t.classified,
            sessions: t.sessions,
            error_timeout: t.error_timeout,
            vs_passing,
            vs_failing,
            mix_p,
            reason,
            alpha: Some(match level {
                Level::Navigate => self.p.navigate_alpha,
                Level::Claim => self.p.alpha,
            }),
        };
        self.port.emit(Event::Step(record.clone()));
        if outcome == Outcome::OtherFailure {
            self.other_failures.push(record.clone());
        }
        self.steps.push(record);
        Ok(())
    }
}

/// A step's outcome from its two e-processes, or None while undecided. "Fails" wins a
/// tie: the step reproduces the failure, at whatever rate.
fn step_verdict(vs_passing: &SequentialState, vs_failing: &SequentialState) -> Option<Outcome> {
    match (vs_passing.decision(), vs_failing.decision()) {
        (
            Some(Decision::Implicated {
                direction: Direction::On,
            }),
            _,
        ) => Some(Outcome::Fails),
        (
            Some(Decision::Implicated {
                direction: Direction::Off,
            }),
            _,
        )
        | (Some(Decision::Cleared), _)
        | (
            _,
            Some(Decision::Implicated {
                direction: Direction::On,
            }),
        ) => Some(Outcome::Passes),
        _ => None,
    }
}
