//! Phase 2 of the culprit search, untestable flags: a configuration that is degraded (too
//! many errors and timeouts, or much slower than the failing end) is not a same-speed
//! toggle; the flag whose flip degrades it is found (by halving from the passing end,
//! alone, or by halving later) and held at its failing value from then on, with its
//! reason. A flag is blamed for slowness only once the machine was shown at speed after
//! the slow block (a later block of the failing end, or of a configuration that is not
//! degraded; else the failing end runs again).

use super::evidence::{totals, EvidenceKey, FailingSet};
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
        // A clean configuration whose flag's path never ran is still a pass here: a pass
        // implicates the values it flips (the failure needs them, whether they cause it or
        // gate the path it runs in: flipping BF16_INDEX_K stops the index-K load-back the
        // race lives in), and a culprit search clears nothing by a pass (a value is "not
        // needed" only by a failing re-test). The rule "a path that never ran is never a
        // pass" guards clean answers (cleared, ok, flat, a clean probe); it held the
        // embedded catalog's own culprits out as untestable.
        if key.0 == self.all() {
            return None; // the failing end is the speed reference
        }
        self.slower(key)
    }

    /// Speed against the failing end: the configuration's fastest block against the
    /// reference, the slowest of the failing end's blocks and of the blocks that ran at
    /// speed after the configuration's last one ([`Search::witnesses`]), so a machine that
    /// slowed down during either is given the benefit of the doubt (when both are slow,
    /// the machine is, not the flag). Slower by more than `slow_ratio` is degraded.
    pub(super) fn slower(&self, key: &EvidenceKey) -> Option<String> {
        let blocks = self.blocks_of(key);
        let fastest = blocks
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
        let reference: Vec<f64> = self
            .blocks_of(&(self.all(), 0))
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .collect();
        let failing_slowest = reference.iter().copied().reduce(f64::min)?;
        let later = self
            .last_block_of(&key.0)
            .map(|last| self.witnesses(last, std::slice::from_ref(&key.0)))
            .unwrap_or_default();
        let slowest = later.iter().copied().fold(failing_slowest, f64::min);
        if slowest <= 0.0 || fastest * self.p.slow_ratio >= slowest {
            return None;
        }
        let ratio = if fastest > 0.0 {
            format!("{:.1}x slower", slowest / fastest)
        } else {
            "no tokens at all".to_string()
        };
        let of = if later.is_empty() {
            format!("its slowest of {}", reference.len())
        } else {
            format!(
                "the slowest of its {} blocks and of {} blocks of other configurations that ran at its speed after this one",
                reference.len(),
                later.len()
            )
        };
        Some(format!(
            "it ran at {fastest:.0} tokens/s (its fastest of {} blocks) against {slowest:.0} tokens/s for the configuration as it is ({of}): {ratio}, over the {}x allowed: not a same-speed toggle",
            blocks.len(),
            self.p.slow_ratio
        ))
    }

    /// The number of the last block run of the configuration with `failing` at its
    /// failing values (any generation).
    pub(super) fn last_block_of(&self, failing: &FailingSet) -> Option<u64> {
        let names = self.names(failing);
        self.blocks
            .iter()
            .filter(|(r, _)| r.failing == names)
            .map(|(r, _)| r.block)
            .max()
    }

    /// The speeds of the blocks that ran after block `after`, of configurations other than
    /// the failing end (its blocks are the reference already) and `except`, that were at
    /// the failing end's speed: not over the error+timeout share, and within `slow_ratio`
    /// of the failing end's slowest block. Such a block shows the machine at speed after
    /// `after`, as a block of the failing end would (a configuration that is not degraded
    /// is a same-speed toggle): it stands for the machine check.
    fn witnesses(&self, after: u64, except: &[FailingSet]) -> Vec<f64> {
        let Some(failing_slowest) = self
            .blocks_of(&(self.all(), 0))
            .iter()
            .filter_map(|b| b.tokens_per_s)
            .reduce(f64::min)
        else {
            return Vec::new();
        };
        let mut skip: Vec<Vec<String>> = except.iter().map(|s| self.names(s)).collect();
        skip.push(self.names(&self.all()));
        self.blocks
            .iter()
            .filter(|(r, _)| r.block > after && !skip.contains(&r.failing))
            .filter(|(_, o)| {
                let t = totals(std::slice::from_ref(o));
                t.error_timeout as f64 <= self.p.degraded_fraction * t.sessions as f64
            })
            .filter_map(|(_, o)| o.tokens_per_s)
            .filter(|&v| v * self.p.slow_ratio >= failing_slowest)
            .collect()
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
        if self.slower(&alone_key).is_some() {
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

    /// The passing end (every testable flag flipped) is degraded: find the flag whose
    /// flip degrades it by halving, with probes that are configurations worth having.
    /// The first probe flips the first half of the testable flags and holds the second
    /// half at its failing values ("P1"). When it is not degraded, the degrader is in the
    /// held half; each next probe holds back the smaller front part of the flags still
    /// in question, with every other flag flipped as in the last degraded probe, so a
    /// probe that is not degraded with one flag held back is the passing end without
    /// it. The flag found rests on two blocks: a degraded configuration, and one that
    /// is not degraded and differs from it only in that flag at its failing value (given
    /// monotonicity: flipping more flags never undoes a degradation, as the halving
    /// assumes), with the machine shown at speed after the degraded block
    /// ([`Search::machine_check`]). Returns P1's failing set when the flag was held out
    /// (ddmin then starts from P1's flipped half, [`Search::park_from`]); None when P1
    /// degrades too or the pair does not hold up, and the caller screens every flip
    /// alone.
    pub(super) async fn halve_degraded_end(&mut self) -> Result<Option<FailingSet>, Halt> {
        let testable = self.testable();
        if testable.len() < 2 {
            return Ok(None);
        }
        let (_, second) = testable.split_at(testable.len().div_ceil(2));
        let p1: FailingSet = self.held.iter().chain(second).copied().collect();
        let p1_key: EvidenceKey = (p1.clone(), 0);
        if self.blocks_of(&p1_key).is_empty() {
            self.run_block(&p1_key).await?;
        }
        // P1 degraded for any reason (slow, errors, the engine died) sends the search to
        // the screens.
        if self.degraded(&p1_key).is_some() {
            return Ok(None);
        }
        self.record_probe(&p1_key, second, None)?;
        // A degraded configuration (failing set `worse`), one that is not (`better`, the
        // same with `open` at failing values too), and the flags in question, `open`.
        let mut worse = self.passing_end();
        let mut better = p1.clone();
        let mut open: Vec<usize> = second.to_vec();
        while open.len() > 1 {
            let (front, back) = open.split_at(open.len() / 2);
            let probe: FailingSet = worse.iter().chain(front).copied().collect();
            let key: EvidenceKey = (probe.clone(), 0);
            if self.blocks_of(&key).is_empty() {
                self.run_block(&key).await?;
            }
            let why = self.degraded(&key);
            self.record_probe(&key, front, why.clone())?;
            if why.is_some() {
                worse = probe;
                open = back.to_vec();
            } else {
                better = probe;
                open = front.to_vec();
            }
        }
        let flag = open[0];
        let (worse_key, better_key) = ((worse.clone(), 0), (better.clone(), 0));
        if self.slower(&worse_key).is_some() {
            self.machine_check(std::slice::from_ref(&worse_key)).await?;
        }
        let (Some(why), None) = (self.degraded(&worse_key), self.degraded(&better_key)) else {
            return Ok(None);
        };
        let also: FailingSet = self
            .testable()
            .into_iter()
            .filter(|f| *f != flag && !worse.contains(f))
            .collect();
        let f = &self.p.flags[flag];
        if also.is_empty() {
            self.hold_out(flag, "alone ", &why);
        } else {
            let words = format!(
                "with {} flipped too: {why}; at {} with those flipped, it is not degraded",
                self.names(&also).join(", "),
                f.failing
            );
            self.hold_out(flag, "", &words);
        }
        Ok(Some(p1))
    }

    /// A halving probe as a step: degraded, or not with `held_back` at failing values.
    fn record_probe(
        &mut self,
        key: &EvidenceKey,
        held_back: &[usize],
        degraded: Option<String>,
    ) -> Result<(), Halt> {
        let held_back = self.names(&held_back.iter().copied().collect()).join(", ");
        let (outcome, words) = match degraded {
            Some(w) => (
                Outcome::Degraded,
                format!("still degraded with {held_back} held back: {w}"),
            ),
            None => (
                Outcome::Unresolved,
                format!("not degraded with {held_back} held back: the degrader is among them"),
            ),
        };
        self.record_step(StepKind::Degrade, key, (outcome, words), Level::Claim)
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
            .filter(|(_, k)| self.slower(k).is_some())
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

    /// Before a flag is blamed for slowness: the machine must be shown at speed after the
    /// slow blocks of `keys`. A block of the failing end shows it, and so does any block
    /// of another configuration that ran at the failing end's speed
    /// ([`Search::witnesses`]; its speed joins the reference, as the failing end's would);
    /// only when neither ran since does the failing end run once more now. A machine that
    /// slowed down slows those blocks too, and the slowest of them is the speed
    /// reference, so the flag is then not blamed; the block is evidence like any other of
    /// the failing end.
    pub(super) async fn machine_check(&mut self, keys: &[EvidenceKey]) -> Result<(), Halt> {
        let Some(slow_last) = keys.iter().filter_map(|k| self.last_block_of(&k.0)).max() else {
            return Ok(());
        };
        let failing_last = self.last_block_of(&self.all()).unwrap_or(0);
        let slow: Vec<FailingSet> = keys.iter().map(|k| k.0.clone()).collect();
        if slow_last > failing_last && self.witnesses(slow_last, &slow).is_empty() {
            self.run_block(&(self.all(), 0)).await?;
        }
        Ok(())
    }
}
