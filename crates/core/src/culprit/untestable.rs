//! Phase 2 of the culprit search, untestable flags: a configuration that is degraded (too
//! many errors and timeouts, or much slower than the failing end) is not a same-speed
//! toggle; the flag whose flip degrades it is found (alone, or by halving) and held at
//! its failing value from then on, with its reason.

use super::block::{BlockOutcome, BlockRequest};
use super::evidence::{totals, EvidenceKey};
use super::report::{Outcome, StepKind, Untestable};
use super::search::{Halt, Level, Search};

impl Search<'_> {
    /// Why the configuration at `key` is not a same-speed toggle of the failing end, if
    /// it is not: too many sessions in error or timeout, or much slower.
    pub(super) fn degraded(&self, key: &EvidenceKey) -> Option<String> {
        let blocks = self.blocks_of(key);
        let t = totals(blocks);
        if t.sessions > 0 && t.error_timeout as f64 > self.p.degraded_fraction * t.sessions as f64 {
            return Some(format!(
                "{} of {} sessions ended in error or timeout (over {:.0}%): not a same-speed toggle",
                t.error_timeout,
                t.sessions,
                100.0 * self.p.degraded_fraction
            ));
        }
        // An engine that dies is evidence, never a pass (core::deaths): a configuration
        // whose engine died and showed no corruption is not a same-speed toggle either.
        let crashed = super::evidence::crashed_without_corruption(blocks);
        if let Some(crashed) = crashed {
            return Some(format!(
                "the engine died under it ({crashed} session{} cut short, none corrupted): an engine that dies is never a pass",
                if crashed == 1 { "" } else { "s" }
            ));
        }
        // A path that never ran is never a pass (core::mechanism): a configuration that
        // showed no corruption while a flag it holds at an enabling value never ran its
        // mechanism says nothing about that flag.
        if t.corrupted == 0 {
            let records: Vec<&[crate::mechanism::MechanismRecord]> =
                blocks.iter().map(|b| b.mechanisms.as_slice()).collect();
            let pooled = crate::mechanism::pool(records);
            if let Some(refusal) =
                crate::mechanism::coverage(&[("it", &pooled)]).and_then(|c| c.refusal())
            {
                return Some(format!("{refusal}: a path that never ran is never a pass"));
            }
        }
        if key.0 == self.all() {
            return None; // the failing end is the speed reference
        }
        self.slower(blocks)
    }

    /// Speed against the failing end: the configuration's fastest block against the
    /// failing end's slowest, so a machine that slowed down during either is given the
    /// benefit of the doubt (when both are slow, the machine is, not the flag). Slower by
    /// more than `slow_ratio` is degraded.
    fn slower(&self, blocks: &[BlockOutcome]) -> Option<String> {
        let fastest = blocks
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
        let reference: Vec<f64> = self
            .blocks_of(&(self.all(), 0))
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .collect();
        let slowest = reference.iter().copied().reduce(f64::min)?;
        if slowest <= 0.0 || fastest * self.p.slow_ratio >= slowest {
            return None;
        }
        let ratio = if fastest > 0.0 {
            format!("{:.1}x slower", slowest / fastest)
        } else {
            "no tokens at all".to_string()
        };
        Some(format!(
            "it ran at {fastest:.0} tokens/s (its fastest of {} blocks) against {slowest:.0} tokens/s for the configuration as it is (its slowest of {}): {ratio}, over the {}x allowed: not a same-speed toggle",
            blocks.len(),
            reference.len(),
            self.p.slow_ratio
        ))
    }

    /// Hold `flag` at its failing value from now on, untestable, with the reason.
    pub(super) fn hold_out(&mut self, flag: usize, how: &str, why: &str) {
        self.held.insert(flag);
        self.untestable.push(Untestable {
            flag,
            reason: format!(
                "flipping it {how}to {} degrades the engine ({why})",
                self.p.flags[flag].passing
            ),
        });
    }

    pub(super) fn untestable_words(&self) -> String {
        self.untestable
            .iter()
            .map(|u| {
                format!(
                    "; untestable: {} (held at {}: {})",
                    self.p.flags[u.flag].name, self.p.flags[u.flag].failing, u.reason
                )
            })
            .collect()
    }

    /// Halve the candidates until one flag is left whose flip degrades the passing end.
    pub(super) async fn find_degrader(&mut self, why: String) -> Result<(), Halt> {
        let mut candidates = self.testable();
        let mut evidence = why;
        while candidates.len() > 1 {
            let half = candidates.len().div_ceil(2);
            let (first, second) = candidates.split_at(half);
            // Hold back the first half: its flags stay at their failing values.
            let key: EvidenceKey = (
                self.held
                    .iter()
                    .copied()
                    .chain(first.iter().copied())
                    .collect(),
                0,
            );
            if self.blocks_of(&key).is_empty() {
                self.run_block(&key).await?;
            }
            match self.degraded(&key) {
                Some(w) => {
                    self.record_step(
                        StepKind::Degrade,
                        &key,
                        (
                            Outcome::Degraded,
                            format!(
                                "still degraded with {} held back: {w}",
                                self.names(&first.iter().copied().collect()).join(", ")
                            ),
                        ),
                        Level::Claim,
                    )?;
                    evidence = w;
                    candidates = second.to_vec();
                }
                None => {
                    self.record_step(
                        StepKind::Degrade,
                        &key,
                        (
                            Outcome::Unresolved,
                            format!(
                                "not degraded with {} held back: the degrader is among them",
                                self.names(&first.iter().copied().collect()).join(", ")
                            ),
                        ),
                        Level::Claim,
                    )?;
                    candidates = first.to_vec();
                }
            }
        }
        let flag = candidates[0];
        // Confirm with the flag flipped alone: a degradation that comes and goes (a flip
        // near the timeout) can mislead the halving; then every flag is screened alone.
        let mut alone = self.all();
        alone.remove(&flag);
        let alone_key = (alone, 0);
        if self.blocks_of(&alone_key).is_empty() {
            self.run_block(&alone_key).await?;
        }
        if self.slower(self.blocks_of(&alone_key)).is_some() {
            self.machine_check(std::slice::from_ref(&alone_key)).await?;
        }
        if self.degraded(&alone_key).is_none() {
            let before = self.held.len();
            self.screen_single_flips().await?;
            if self.held.len() > before {
                return Ok(());
            }
            self.hold_out(
                flag,
                "",
                &format!("together with the other flips: {evidence}; though not alone"),
            );
            return Ok(());
        }
        let alone = self.degraded(&alone_key).unwrap_or_default();
        self.hold_out(
            flag,
            "",
            &format!("alone: {alone}; with the other flips: {evidence}"),
        );
        Ok(())
    }

    /// One block of each flag flipped alone (every other flag as found): a flag whose
    /// flip alone degrades the engine is held out as untestable. The blocks that did not
    /// degrade are ddmin's first complement tests, kept for it.
    pub(super) async fn screen_single_flips(&mut self) -> Result<(), Halt> {
        let singles: Vec<(usize, EvidenceKey)> = self
            .testable()
            .into_iter()
            .map(|flag| {
                let mut set = self.all();
                set.remove(&flag);
                (flag, (set, 0))
            })
            .collect();
        for (_, key) in &singles {
            if self.blocks_of(key).is_empty() {
                self.run_block(key).await?;
            }
        }
        let slow: Vec<EvidenceKey> = singles
            .iter()
            .filter(|(_, k)| self.slower(self.blocks_of(k)).is_some())
            .map(|(_, k)| k.clone())
            .collect();
        self.machine_check(&slow).await?;
        for (flag, key) in singles {
            if let Some(why) = self.degraded(&key) {
                self.record_step(
                    StepKind::Degrade,
                    &key,
                    (Outcome::Degraded, why.clone()),
                    Level::Claim,
                )?;
                self.hold_out(flag, "alone ", &why);
            }
        }
        Ok(())
    }

    /// Before a flag is blamed for slowness: if the failing end has not run since the
    /// slow blocks of `keys`, run it once more now. A machine that slowed down slows the
    /// failing end too, and its slowest block is the speed reference, so the flag is then
    /// not blamed; the block is evidence like any other of the failing end.
    async fn machine_check(&mut self, keys: &[EvidenceKey]) -> Result<(), Halt> {
        let last_of = |failing: &[String], blocks: &[(BlockRequest, BlockOutcome)]| {
            blocks
                .iter()
                .filter(|(r, _)| r.failing == failing)
                .map(|(r, _)| r.block)
                .max()
        };
        let failing_last = last_of(&self.names(&self.all()), &self.blocks).unwrap_or(0);
        let slow_last = keys
            .iter()
            .filter_map(|k| last_of(&self.names(&k.0), &self.blocks))
            .max();
        if slow_last.is_some_and(|slow| slow > failing_last) {
            self.run_block(&(self.all(), 0)).await?;
        }
        Ok(())
    }
}
