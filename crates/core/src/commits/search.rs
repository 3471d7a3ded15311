//! The commit search as a state machine driven by observations (docs/commits.md): ask
//! [`Search::next_round`] what to run, run it, tell [`Search::observe`] what it gave. No I/O:
//! `bisect commits` runs it on built commits, the simulation on scripted oracles, and a
//! resumed search replays its step log through it.
//!
//! Phases:
//! 1. **The ends**: blocks at the bad end and the good end, paired into looks of a
//!    sequential A/B ([`crate::sequential`], the anytime-valid e-process of `run
//!    --adaptive`). Bad end implicated: go on. The bad end's always-valid upper bound below
//!    `min_effect`: "could not reproduce" (checked first). Cleared, or the good end
//!    implicated: "no culprit: the ends do not differ". The cap reached undecided:
//!    inconclusive.
//! 2. **The search**: after every block, the posterior ([`super::posterior`]); stop when
//!    one answer (a commit, a range widened by untestable commits, or "no single
//!    culprit") holds at least `1 - alpha`; else the next commit by expected information
//!    per second, or with [`Params::parallel`] K a round of K commits by their joint
//!    information ([`super::choose`]).
//! 3. **Verification**: the answer's last commit against its parent, a fresh sequential
//!    A/B at `alpha / max_verifications`. A failed verification is not the end: its
//!    blocks join the posterior (a rate that drifted mid-search shows there) and the
//!    search goes on, until a candidate is verified or `max_verifications` were tried
//!    (Bonferroni over the verifications keeps the claim's error at `alpha`). The search's blocks chose the culprit, so they are not reused as
//!    looks (their selection would void Ville's bound); they only start the plug-in
//!    estimates (`SequentialState::with_prior`, valid for a prior from data its looks do
//!    not contain), which moves power, not error.
//!
//! Rounds: [`Search::next_round`] asks for one block, or with `parallel` > 1 a round
//! (the search phase's K commits, or a pair phase's two blocks), observed in order; each
//! observation carries the purpose it was run for, and a block counts toward the A/B of
//! its own phase only (a search block observed after its round's earlier blocks started
//! the verification feeds the posterior, never a look).
//!
//! Observations are three-valued: a block's counts, "could not tell" (weighs nothing; a
//! commit that could not tell `max_could_not_tell` times in a row becomes untestable), and
//! "untestable" (its build failed or exited 125). Every block counts against
//! `max_sessions`; a block that would pass it is not run, and the search ends
//! inconclusive with the posterior's top candidates.

pub use super::action::{Action, Answer, Purpose, Spent, Test};
use super::choose::{Choice, Cost};
use super::observation::off_arm_clean;
pub use super::observation::Observation;
pub use super::params::Params;
use super::posterior::{answer_sets, best_answer, posterior, sides, Counts, Posterior};
use crate::format;
use crate::sequential::{
    mixture_confidence_sequence, ArmPrior, Decision, DesignGoal, Direction, PlugInPrior,
    SequentialDesign, SequentialState,
};

enum Phase {
    Ends,
    Search,
    Verify {
        first: usize,
        last: usize,
        parent: usize,
        mass: f64,
    },
    Done(Answer),
}

/// One search in progress.
pub struct Search {
    params: Params,
    phase: Phase,
    counts: Vec<Counts>,
    /// With `--flag`: the off arm's counts per commit (the search counts the on arm's).
    off: Vec<Counts>,
    untestable: Vec<Option<String>>,
    built: Vec<bool>,
    could_not_tell: Vec<u32>,
    sessions: u64,
    /// Measured seconds: (sum, count) of builds and of blocks.
    builds: (f64, u64),
    blocks: (f64, u64),
    /// The A/B of the current phase (ends, then verification) and its pending pair:
    /// (on = bad end or culprit, off = good end or parent).
    ab: SequentialState,
    pair: (Option<Counts>, Option<Counts>),
    posterior: Posterior,
    /// Verifications that failed, in words, oldest first.
    refuted: Vec<String>,
    /// The search phase's blocks per commit since the last failed verification (with
    /// `--flag`, the off arm's beside them).
    navigation: Vec<Counts>,
    navigation_off: Vec<Counts>,
}

/// A verification gives up when its candidate's posterior mass falls below this.
const FUTILE_MASS: f64 = 0.5;

impl Search {
    pub fn new(params: Params) -> Self {
        let n = params.commits.max(2);
        let counts = vec![Counts::default(); n];
        let ab = SequentialState::new(design(&params, 0.0, params.alpha));
        Search {
            posterior: posterior(&counts),
            phase: Phase::Ends,
            off: counts.clone(),
            counts,
            untestable: vec![None; n],
            built: vec![false; n],
            could_not_tell: vec![0; n],
            sessions: 0,
            builds: (0.0, 0),
            blocks: (0.0, 0),
            ab,
            pair: (None, None),
            params,
            refuted: Vec::new(),
            navigation: vec![Counts::default(); n],
            navigation_off: vec![Counts::default(); n],
        }
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn posterior(&self) -> &Posterior {
        &self.posterior
    }

    pub fn counts(&self) -> &[Counts] {
        &self.counts
    }

    /// With `--flag`: the off arm's counts per commit.
    pub fn off_counts(&self) -> &[Counts] {
        &self.off
    }

    pub fn untestable(&self) -> &[Option<String>] {
        &self.untestable
    }

    pub fn sessions(&self) -> u64 {
        self.sessions
    }

    /// Builds run (cached ones not counted).
    pub fn builds(&self) -> u64 {
        self.builds.1
    }

    /// The A/B of the ends or the verification, as it stands.
    pub fn ab(&self) -> &SequentialState {
        &self.ab
    }

    fn last(&self) -> usize {
        self.counts.len() - 1
    }

    /// What to run next, or the answer.
    pub fn next_round(&mut self) -> Action {
        if let Phase::Done(answer) = &self.phase {
            return Action::Done(answer.clone());
        }
        let room = (self.params.max_sessions.saturating_sub(self.sessions)
            / self.params.step_sessions().max(1)) as usize;
        if room == 0 {
            let answer = self.out_of_budget();
            self.phase = Phase::Done(answer.clone());
            return Action::Done(answer);
        }
        let k = room.min(self.params.parallel.max(1) as usize);
        let test = |commit, purpose| Test { commit, purpose };
        // A pair phase runs its pair in one round when it may (the on side first); the
        // A/B looks once both are in.
        let pair = |on: usize, off: usize, purpose| match (self.pair.0.is_some(), k) {
            (true, _) => vec![test(off, purpose)],
            (false, 1) => vec![test(on, purpose)],
            (false, _) => vec![test(on, purpose), test(off, purpose)],
        };
        let round = match &self.phase {
            Phase::Ends => pair(self.last(), 0, Purpose::Ends),
            Phase::Verify { last, parent, .. } => pair(*last, *parent, Purpose::Verify),
            Phase::Search => self.next_search(k),
            Phase::Done(_) => unreachable!(),
        };
        if round.is_empty() {
            let answer = self.inconclusive("no commit is left to test".into());
            self.phase = Phase::Done(answer.clone());
            return Action::Done(answer);
        }
        Action::Round(round)
    }

    /// The search phase's round of `k` commits.
    fn next_search(&self, k: usize) -> Vec<Test> {
        let candidates: Vec<usize> = (0..self.counts.len())
            .filter(|&i| self.untestable[i].is_none())
            .collect();
        let cost = Cost {
            build_s: mean(self.builds, self.params.build_s_guess),
            block_s: mean(self.blocks, self.params.block_s_guess),
        };
        let choice = Choice {
            counts: &self.counts,
            post: &self.posterior,
            n: self.params.block,
            candidates: &candidates,
            built: &self.built,
            cost,
        };
        choice
            .next_commits(k)
            .into_iter()
            .map(|commit| Test {
                commit,
                purpose: Purpose::Search,
            })
            .collect()
    }

    /// What a block of `test` gave (a commit out of range, or any observation after the
    /// answer, is ignored). A block counts toward the phase it was run for: a search
    /// block observed after its round's earlier blocks started the verification feeds
    /// the posterior only (the verification's looks are its own blocks).
    pub fn observe(&mut self, test: Test, obs: &Observation, spent: Spent) {
        let Test { commit, purpose } = test;
        if commit >= self.counts.len() || matches!(self.phase, Phase::Done(_)) {
            return;
        }
        self.sessions += spent.sessions;
        if let Some(s) = spent.build_s {
            self.builds = (self.builds.0 + s, self.builds.1 + 1);
        }
        if let Some(s) = spent.block_s {
            self.blocks = (self.blocks.0 + s, self.blocks.1 + 1);
        }
        match obs {
            Observation::Untestable { reason } => {
                self.untestable[commit] = Some(reason.clone());
                if commit == 0 || commit == self.last() || self.in_verification(commit) {
                    let answer = self.inconclusive(format!(
                        "commit {commit} cannot be tested ({reason}), and the search needs it"
                    ));
                    self.phase = Phase::Done(answer);
                }
            }
            Observation::CouldNotTell { reason } => {
                self.built[commit] = true;
                self.could_not_tell[commit] += 1;
                if self.could_not_tell[commit] >= self.params.max_could_not_tell {
                    self.observe(
                        test,
                        &Observation::Untestable {
                            reason: format!(
                                "could not tell {} times: {reason}",
                                self.could_not_tell[commit]
                            ),
                        },
                        Spent::default(),
                    );
                }
            }
            Observation::Block { corrupted, judged } => self.count(
                test,
                Counts {
                    corrupted: *corrupted,
                    judged: *judged,
                },
            ),
            Observation::Pair { on, off } => {
                self.off[commit] = self.off[commit] + clamped(*off);
                if purpose == Purpose::Search {
                    self.navigation_off[commit] = self.navigation_off[commit] + clamped(*off);
                }
                self.count(test, *on);
            }
        }
    }

    /// A block's counts (a pair's on arm) into the posterior and the phase.
    fn count(&mut self, Test { commit, purpose }: Test, block: Counts) {
        self.built[commit] = true;
        self.could_not_tell[commit] = 0;
        let block = clamped(block);
        self.counts[commit] = self.counts[commit] + block;
        if purpose == Purpose::Search {
            self.navigation[commit] = self.navigation[commit] + block;
        }
        self.posterior = posterior(&self.counts);
        self.advance(commit, purpose, block);
    }

    /// The purpose of the blocks the current phase runs.
    fn purpose(&self) -> Purpose {
        match self.phase {
            Phase::Ends => Purpose::Ends,
            Phase::Verify { .. } => Purpose::Verify,
            Phase::Search | Phase::Done(_) => Purpose::Search,
        }
    }

    fn in_verification(&self, commit: usize) -> bool {
        matches!(self.phase, Phase::Verify { last, parent, .. } if commit == last || commit == parent)
    }

    fn advance(&mut self, commit: usize, purpose: Purpose, block: Counts) {
        match self.phase {
            _ if purpose != self.purpose() => {}
            Phase::Ends => {
                if self.pair.0.is_none() && commit == self.last() {
                    self.pair.0 = Some(block);
                } else if self.pair.0.is_some() && commit == 0 {
                    self.pair.1 = Some(block);
                    self.look_ends();
                }
            }
            Phase::Search => self.maybe_stop(),
            Phase::Verify { last, parent, .. } => {
                if self.pair.0.is_none() && commit == last {
                    self.pair.0 = Some(block);
                } else if self.pair.0.is_some() && commit == parent {
                    self.pair.1 = Some(block);
                    self.look_verify();
                }
            }
            Phase::Done(_) => {}
        }
    }

    /// One look of the ends' A/B.
    fn look_ends(&mut self) {
        let decision = self.look_pair();
        let (bad, good) = self.ab.tallies();
        let bad_hi =
            mixture_confidence_sequence(bad.corrupted, bad.sessions, self.params.clear_alpha / 2.0)
                [1];
        let numbers = format!(
            "bad end {}, good end {}",
            rate_words(bad.corrupted, bad.sessions),
            rate_words(good.corrupted, good.sessions)
        );
        let load = self.params.concurrency;
        let arm = self.params.arm_words();
        self.phase = match decision {
            Decision::Implicated {
                direction: Direction::On,
            } => {
                self.maybe_stop();
                return;
            }
            _ if bad_hi < self.params.min_effect => Phase::Done(Answer::CouldNotReproduce {
                words: format!(
                    "could not reproduce: the bad end{arm} corrupts below {} at {load} in flight \
                     (always-valid upper bound {}; {numbers})",
                    format::percent(self.params.min_effect),
                    format::percent(bad_hi)
                ),
            }),
            Decision::Cleared | Decision::Implicated { .. } => Phase::Done(Answer::NoCulprit {
                words: format!(
                    "no culprit: the ends do not differ{arm} at {load} in flight ({numbers})"
                ),
            }),
            Decision::Underpowered { .. } => {
                let answer = self.inconclusive(format!(
                    "the ends stayed undecided after {} blocks each ({numbers})",
                    self.params.cap_blocks
                ));
                Phase::Done(answer)
            }
            Decision::Continue => Phase::Ends,
        };
    }

    /// The pending pair into the A/B; the decision.
    fn look_pair(&mut self) -> Decision {
        let (on, off) = (self.pair.0.take(), self.pair.1.take());
        let (on, off) = (on.unwrap_or_default(), off.unwrap_or_default());
        self.ab
            .look((on.corrupted, on.judged), (off.corrupted, off.judged))
            .unwrap_or(Decision::Underpowered {
                interval: [-1.0, 1.0],
            })
    }

    /// In the search phase: stop when an answer holds 1 - alpha.
    fn maybe_stop(&mut self) {
        let untestable: Vec<bool> = self.untestable.iter().map(Option::is_some).collect();
        let (best, mass) = best_answer(&self.posterior, &answer_sets(&untestable));
        self.phase = if mass < 1.0 - self.params.alpha {
            Phase::Search
        } else {
            match best {
                Some((first, last)) => self.start_verify(first, last, mass),
                None => Phase::Done(Answer::NoCulprit {
                    words: format!(
                        "no culprit: no single commit explains the range (posterior of \"no \
                         single culprit\" {:.3})",
                        mass
                    ),
                }),
            }
        };
    }

    fn start_verify(&mut self, first: usize, last: usize, mass: f64) -> Phase {
        let parent = first - 1;
        let (good, bad) = sides(&self.counts, first);
        let weight = self.params.block as f64;
        let prior = PlugInPrior {
            on: ArmPrior::guess(bad.rate(), weight),
            off: ArmPrior::guess(good.rate(), weight),
        };
        let design = design(&self.params, good.rate(), self.params.verify_alpha());
        self.ab = SequentialState::with_prior(design, prior);
        self.pair = (None, None);
        Phase::Verify {
            first,
            last,
            parent,
            mass,
        }
    }

    fn look_verify(&mut self) {
        let Phase::Verify {
            first,
            last,
            parent,
            mass,
        } = self.phase
        else {
            return;
        };
        let decision = self.look_pair();
        // Stopping a verification without a claim never raises its error, so it gives
        // up as soon as its own blocks move the posterior off the candidate.
        let now: f64 = self.posterior.culprit[first..=last].iter().sum();
        let futile = decision == Decision::Continue && now < FUTILE_MASS;
        if decision == Decision::Continue && !futile {
            return;
        }
        let outcome = if futile {
            format!("its blocks moved the posterior off it, to {now:.3}")
        } else {
            format!("{decision:?}")
        };
        let implicated = matches!(
            decision,
            Decision::Implicated {
                direction: Direction::On
            }
        );
        let (verified, words) = self.verify_words(first, last, parent, mass, implicated, &outcome);
        if !implicated && self.refuted.len() + 1 < self.params.max_verifications as usize {
            self.back_to_search(words);
            return;
        }
        let words = self.with_refuted(words);
        self.phase = Phase::Done(Answer::Culprit {
            first,
            last,
            parent,
            // Unverified: the mass the candidate holds now, its verification's blocks in.
            posterior: if verified { mass } else { now },
            verified,
            words,
        });
    }

    /// The verification's closing sentence, and whether it verified the candidate: a
    /// rise with its always-valid interval, a rise that is not the flag's (the off arm
    /// at the culprit not clean), or what the pair gave instead.
    fn verify_words(
        &self,
        first: usize,
        last: usize,
        parent: usize,
        mass: f64,
        implicated: bool,
        outcome: &str,
    ) -> (bool, String) {
        let (on, off) = self.ab.tallies();
        let interval = self
            .ab
            .looks()
            .last()
            .map_or([-1.0, 1.0], |l| l.diff_interval);
        let name = if first == last {
            format!("commit {last}")
        } else {
            format!("commits {first}..={last} (untestable between)")
        };
        // With --flag: the off arm at the culprit must be clean, or the rise is not the flag's.
        let off_arm = self.params.flag.as_deref().map(|flag| {
            let (off, on) = (self.off[last], self.counts[last]);
            off_arm_clean(flag, off, on, self.params.background)
        });
        let verified = implicated && off_arm.as_ref().is_none_or(|(clean, _)| *clean);
        let off_words = off_arm
            .as_ref()
            .map(|(_, words)| format!("; {words}"))
            .unwrap_or_default();
        let load = self.params.concurrency;
        let arm = self.params.arm_words();
        let words = if verified {
            format!(
                "{name} raises corruption{arm} from {} to {} at {load} in flight (always-valid {:.0}% \
                 interval for the rise {:+.1}% to {:+.1}%; e-value {:.0} >= {:.0}; posterior {mass:.3}){off_words}",
                rate_words(off.corrupted, off.sessions),
                rate_words(on.corrupted, on.sessions),
                100.0 * (1.0 - self.params.clear_alpha),
                100.0 * interval[0],
                100.0 * interval[1],
                self.ab.e_value(),
                1.0 / self.params.verify_alpha()
            )
        } else if implicated {
            format!(
                "verification failed: {name} raises corruption{arm} from {} to {} against its \
                 parent {parent} at {load} in flight (posterior {mass:.3}), but the rise is not \
                 the flag's{off_words}",
                rate_words(off.corrupted, off.sessions),
                rate_words(on.corrupted, on.sessions)
            )
        } else {
            self.not_implicated_words(&name, last, parent, mass, outcome)
        };
        (verified, words)
    }

    /// A verification whose pair did not implicate the candidate: what it gave instead,
    /// and whether either commit's rate drifted since the search ran it.
    fn not_implicated_words(
        &self,
        name: &str,
        last: usize,
        parent: usize,
        mass: f64,
        outcome: &str,
    ) -> String {
        let (on, off) = self.ab.tallies();
        let load = self.params.concurrency;
        let arm = self.params.arm_words();
        format!(
            "verification failed: the search named {name} (posterior {mass:.3}), but against \
             its parent {parent} it gave {} vs {}{arm} at {load} in flight ({outcome}){}",
            rate_words(on.corrupted, on.sessions),
            rate_words(off.corrupted, off.sessions),
            self.drift_words([
                (
                    last,
                    Counts {
                        corrupted: on.corrupted,
                        judged: on.sessions
                    }
                ),
                (
                    parent,
                    Counts {
                        corrupted: off.corrupted,
                        judged: off.sessions
                    }
                ),
            ])
        )
    }

    /// Back to the search after a refuted verification. The blocks that led it here are
    /// suspect (a rate that drifted while they ran, or plain bad luck): they leave the
    /// posterior, the ends' and the verification's stay, and the search tests afresh.
    fn back_to_search(&mut self, words: String) {
        self.refuted.push(words);
        for (counts, navigated) in self.counts.iter_mut().zip(&mut self.navigation) {
            *counts = *counts - std::mem::take(navigated);
        }
        for (off, navigated) in self.off.iter_mut().zip(&mut self.navigation_off) {
            *off = *off - std::mem::take(navigated);
        }
        self.posterior = posterior(&self.counts);
        self.phase = Phase::Search;
        self.maybe_stop();
    }

    /// Where one of the verification's two commits gave the search and the verification
    /// significantly different rates (two-sided Fisher at `alpha`), a sentence saying
    /// the corruption rate changed between blocks: it drifted during the search.
    fn drift_words(&self, verified: [(usize, Counts); 2]) -> String {
        for (commit, now) in verified {
            let before = self.navigation[commit];
            if before.judged == 0 || now.judged == 0 {
                continue;
            }
            let p = crate::stats::fisher_exact_two_sided(
                before.corrupted,
                before.judged - before.corrupted,
                now.corrupted,
                now.judged - now.corrupted,
            );
            if p < self.params.alpha {
                return format!(
                    "; commit {commit} gave {} in the search and {} in the verification \
                     (Fisher p = {}): the corruption rate drifted during the search (e.g. with \
                     the machine's load)",
                    rate_words(before.corrupted, before.judged),
                    rate_words(now.corrupted, now.judged),
                    format::p_value(p)
                );
            }
        }
        String::new()
    }

    /// `words`, then what earlier verifications refuted.
    fn with_refuted(&self, words: String) -> String {
        if self.refuted.is_empty() {
            return words;
        }
        format!("{words}; earlier: {}", self.refuted.join("; "))
    }

    fn out_of_budget(&self) -> Answer {
        self.inconclusive(format!(
            "the budget of {} sessions is spent ({} used, a step is {})",
            self.params.max_sessions,
            self.sessions,
            self.params.step_sessions()
        ))
    }

    /// Inconclusive, with the posterior's top candidates.
    fn inconclusive(&self, why: String) -> Answer {
        let mut top: Vec<(usize, f64)> = self
            .posterior
            .culprit
            .iter()
            .copied()
            .enumerate()
            .skip(1)
            .collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        top.truncate(3);
        let names: Vec<String> = top.iter().map(|(c, p)| format!("{c} ({p:.2})")).collect();
        Answer::Inconclusive {
            words: self.with_refuted(format!(
                "inconclusive: {why}; top candidates {}; no single culprit {:.2}",
                names.join(", "),
                self.posterior.none
            )),
            top,
        }
    }
}

/// At most `judged` corrupted.
fn clamped(c: Counts) -> Counts {
    Counts {
        corrupted: c.corrupted.min(c.judged),
        judged: c.judged,
    }
}

fn mean((sum, n): (f64, u64), guess: f64) -> f64 {
    if n == 0 {
        guess
    } else {
        sum / n as f64
    }
}

fn rate_words(k: u64, n: u64) -> String {
    format!("{k}/{n} ({})", format::percent(crate::stats::rate(k, n)))
}

/// The sequential design of the ends (at `alpha`) and of a verification (at
/// [`Params::verify_alpha`]): `min_effect`, looks of
/// one block per side, at most `cap_blocks` of them.
fn design(p: &Params, baseline: f64, alpha: f64) -> SequentialDesign {
    let goal = DesignGoal {
        alpha,
        power: 0.8,
        min_effect: p.min_effect,
        baseline: baseline.clamp(0.0, 1.0 - p.min_effect),
        clear_alpha: p.clear_alpha,
        block_per_arm: p.block.max(1),
    };
    SequentialDesign::with_cap(goal, p.block.max(1) * p.cap_blocks.max(1))
        .expect("the search's parameters are validated")
}
