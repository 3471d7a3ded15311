//! The culprit search as a pure engine (docs/culprit.md): which flag values of a failing
//! configuration are needed for the failure, interactions included. The search is a
//! sans-IO state machine ([`CulpritSearch`]): it asks for one configuration's block of
//! sessions at the experiment's load and is told the classes of its sessions in index
//! order, so the whole search runs in tests and simulations without processes.
//!
//! The search, in order:
//! 1. **Both ends** (as mozregression and cargo-bisect-rustc verify good and bad before
//!    bisecting): the configuration as it is (every listed flag at its failing value,
//!    "F", the reference failure) against every listed flag flipped ("P"). Verified when
//!    the e-process implicates F. "Could not reproduce" when F's always-valid upper bound
//!    on its corruption rate falls below min_effect (the bug does not fire at this load);
//!    "no culprit among the listed flags" when P fails as much as F (the e-process
//!    implicates P, or the ends run out undecided while P's own always-valid lower bound
//!    is above zero).
//! 2. **Untestable flags**: if P is degraded (error+timeout share over the policy's
//!    threshold, or its fastest block over [`SLOW_RATIO`] times slower in tokens/s than
//!    the slowest of the failing end's blocks and of the blocks that ran at that speed
//!    after it: not a same-speed toggle; before a flag is blamed for slowness the
//!    machine must be shown at speed after the slow block, by a later block of the
//!    failing end or of any configuration that is not degraded, else the failing end
//!    runs again, so a machine that slowed down is not blamed on a flag), the degrader
//!    is found by halving: "P1" flips the first half and holds the second at failing
//!    values; when it is not degraded, the held half's front part is held back next,
//!    every other flag flipped, down to one flag, which is held out on two blocks that
//!    differ only in it (a degraded one and one that is not; given monotonicity of
//!    degradation). When P1 degrades too, each flag is flipped alone instead and those
//!    that degrade are held out. A degradation found later, one degrader at a time, by
//!    halving: hold back half the candidates (keep them at their failing values); if
//!    the rest flipped no longer degrades, the degrader is in the held half, else in
//!    the other. The flag found is held at its failing value from then on, untestable,
//!    with its reason; P is re-verified without it. Probes that did not degrade are
//!    steps like any other: their blocks are kept for the search below.
//! 3. **Delta debugging** (Zeller and Hildebrandt 2002, "Simplifying and isolating
//!    failure-inducing input", ddmin) over the testable flags: a test of a subset S runs
//!    the configuration with S at failing values and the other testable flags flipped.
//!    Outcomes are three-valued (fails / passes / unresolved, as ddmin allows); results
//!    are cached, and implied by monotonicity (a superset of a failing set fails, a
//!    subset of a passing set passes), which is the assumption that a failure needs its
//!    ingredients. The answer is 1-minimal: each of its flag values is needed. After
//!    the halving, when P1 passes (or is undecided at the navigation level), ddmin
//!    narrows P1's flipped half first with the held half's testable flags parked at
//!    their failing values, and the re-test flips them: failing, it shows them not
//!    needed; else ddmin goes over every testable flag.
//! 4. **The answer's claims at alpha**: it fails again as a fresh step (new blocks, new
//!    seeds; a test that would end ddmin runs as this re-test directly), and each of its
//!    values is needed: the configuration without it (or a tested superset of that
//!    without it) passes at alpha, from its blocks or by carrying its e-process on.
//!
//! **Error control.** ddmin steps decide at `navigate_alpha` ([`navigate_alpha`]:
//! 5 x alpha); the ends, re-tests and confirmations at `alpha`. A reported culprit of k
//! values rests on k + 1 claims at alpha (the re-test; per value, the configuration
//! without it passes, for k = 1 the verified passing end), so by the union bound it is
//! wrong with probability at most (k + 1) x alpha, given monotonicity. A navigation step's
//! error is not a claim: it can cost sessions or end inconclusive, never make a reported
//! answer wrong, because the answer's claims are re-decided at alpha. Carrying a step's
//! e-process on from 1/navigate_alpha to 1/alpha is valid: by Ville's inequality the
//! bound holds for the supremum over every look. The first claim that fails means a
//! navigation step erred: ddmin runs again, once, with every step at alpha (the blocks
//! kept, what was decided at the navigation level forgotten); a second failure, or a
//! claim undecided within `claim_cap_blocks`, is inconclusive with the reason.
//!
//! **A step** is a sequential A/B decided with [`crate::sequential`] (the
//! anytime-valid e-process of Turner, Ly and Grunwald 2021), twice over: the step against
//! the verified passing end ("fails" when the e-process implicates the step) and the
//! failing end against the step ("passes" when it implicates the failing end; also when
//! the step's interval against the passing end clears). Both ends' blocks are reused by
//! every step: the step's sessions, in session-index order, are cut into looks of
//! `look` sessions and paired with the passing end's looks of the same rank and with
//! every failing-end look run before the step's first evaluation
//! (`failing_pairs` in [`step`]: unequal looks, fixed before its counts are read); a
//! reference runs another block only when a step needs looks it does not have yet. The
//! e-process against the passing end starts from the failing end's rate
//! (`step_prior`: a plug-in prior from sessions it never reads). Every block
//! runs at the experiment's concurrency (never fewer sessions than that load). "Fails"
//! also needs the class mix of the step's corrupted sessions to match the failing end's
//! ([`mix`], Freeman-Halton exact test at `mix_alpha`): a different mix is a
//! different failure mode, reported and not merged ("unresolved" to ddmin). "Passes" is
//! blocked when a block's engine-side peak concurrency fell below `min_load_fraction`
//! of the target, or was not measured at all (a load-dependent bug cannot be ruled out
//! below its load, nor at a load nobody saw; `bisect run`'s rule for `cleared`); so is
//! the passing end standing in for "without it, it passes" of a one-value answer. A step that
//! reaches `step_cap_blocks` undecided (`claim_cap_blocks` at alpha), or whose own blocks
//! are degraded, is unresolved. The ends get twice their cap when their counts lean
//! towards a culprit over a background (differ by min_effect, the passing end at most
//! half the failing end's rate) before "no culprit" is considered.
//!
//! Budget: a block that would take the sessions spent past `budget` is not run; the
//! search stops there and says what it had.
//!
//! Laid out by phase, one module each, all of them `impl` blocks of one state
//! (`search::Search`, driven through [`search()`]'s state machine): [`ends`], [`untestable`], [`ddmin`],
//! [`claims`], and [`step`] (how any one step is decided); `search` also holds the blocks
//! run so far, which [`evidence`] reads as counts. [`params`] is what the search is asked,
//! [`block`] its seam to the engines (the requests and outcomes that pass through the
//! sans-IO [`CulpritSearch`], which `search` builds with its events), [`report`] what it tells; [`mix`] is the class-mix
//! test; [`simulate`] runs the search on scripted oracles (the bench and the tests).

mod block;
mod claims;
mod ddmin;
mod ends;
mod evidence;
mod mix;
mod params;
mod report;
mod search;
pub mod simulate;
mod split;
mod step;
#[cfg(test)]
mod tests;
mod untestable;

pub use block::{BlockOutcome, BlockRequest, SetShare};
pub use params::{navigate_alpha, FlagValues, SearchParams, MIN_BLOCK};
pub use report::{Answer, Outcome, SearchReport, StepKind, StepRecord, Untestable};
pub use search::{search, Event};
pub use split::{replica_check, set_tallies, split_sets, ReplicaCheck, SHARE_SEED_STRIDE};
