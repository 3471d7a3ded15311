//! Nights as a history (docs/history.md): each cell of a nightly matrix read across the
//! nights, a state per night, evidence that adds up across nights, and the regressions
//! found with the last good and first bad night. The harness reads the nights' records
//! into [`CellNight`]s; everything here is pure.
//!
//! A cell's nights form **chains**: consecutive nights with the same chain key (the
//! harness's: the cell's configuration and workload hashes, the engine and model, bisect's
//! version). A night whose key differs starts a new chain: its evidence starts again from
//! nothing, and a regression still open is closed as reset. A night's new build of the
//! same engine does not: builds are what the history compares.
//!
//! The rules, night by night, per cell (docs/history.md "States"), first match wins:
//!
//! 1. **missing**: nothing was measured (no record of the night, the cell did not
//!    finish, was blocked, or was not in the night's plan).
//! 2. **regression**: the cell's evidence of a rise over its chain ([`evidence`]) is
//!    rejected by e-BH at `alpha` across all the history's cells ([`ebh`]); or a
//!    regression found earlier is still open (not mended, not reset).
//! 3. **insufficient**: the night was measured but cannot speak alone: its condition was
//!    not the cell's (an engine died, the load fell short, fewer than half its sessions
//!    were judged: its sessions are kept out of the evidence), or it judged fewer than
//!    half the sessions of its plan or of a usual night (under-sampled), or the mechanism
//!    under suspicion never ran (a path that never ran is never ok): those sessions still
//!    count in the evidence, they measure the cell's rate as configured.
//! 4. **suspicious**: evidence of a rise of at least `suspicious_e` (10: "strong" on
//!    Jeffreys' scale) that e-BH does not reject, or this night alone above the chain's
//!    earlier nights (one-sided Fisher p < `suspicious_p`, 0.05, unadjusted): worth a
//!    look, never a regression.
//! 5. **ok**.
//!
//! A regression found at night t names its change point (the likeliest split of the
//! chain): the first bad night, and the night before it in the chain, the last good one.
//! The chain then restarts at the first bad night: later nights are compared with the
//! regressed rate, a further rise is a new regression, and a fall (evidence of a drop
//! at least K / alpha, Bonferroni over the K cells) mends it.

pub mod ebh;
pub mod evidence;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use evidence::{chain_evidence, ChainEvidence, Change, Tally};

/// The thresholds of the history's rules.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistoryPolicy {
    /// e-BH level across the cells (false discovery rate of regressions).
    pub alpha: f64,
    /// Evidence of a rise at or above this, not rejected: suspicious.
    pub suspicious_e: f64,
    /// One night alone above its chain at this one-sided Fisher p: suspicious.
    pub suspicious_p: f64,
}

impl Default for HistoryPolicy {
    fn default() -> Self {
        HistoryPolicy {
            alpha: 0.01,
            suspicious_e: 10.0,
            suspicious_p: 0.05,
        }
    }
}

/// One cell on one night, as the night's record shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// Nothing measured, and why.
    Missing { why: String },
    /// Measured, but not under the cell's condition: kept out of the evidence.
    Unfit { tally: Tally, why: Vec<String> },
    /// Measured under the cell's condition; `insufficient` says why the night alone
    /// cannot be ok (under-sampled, or the mechanism under suspicion never ran): its
    /// sessions still count, they measure the cell's rate as configured.
    Measured {
        tally: Tally,
        insufficient: Option<String>,
    },
}

/// A cell's night: its chain key and what was observed.
#[derive(Debug, Clone, PartialEq)]
pub struct CellNight {
    /// Nights compare only within one key (see the module's chains).
    pub chain: String,
    pub observation: Observation,
}

impl CellNight {
    pub fn missing(why: impl Into<String>) -> CellNight {
        CellNight {
            chain: String::new(),
            observation: Observation::Missing { why: why.into() },
        }
    }
}

/// A cell's state on a night.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Regression,
    Suspicious,
    Ok,
    Insufficient,
    Missing,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Regression => "regression",
            State::Suspicious => "suspicious",
            State::Ok => "ok",
            State::Insufficient => "insufficient",
            State::Missing => "missing",
        }
    }
}

/// One cell's assessment on one night.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assessment {
    pub state: State,
    /// The cell's evidence of a rise over its chain, this night (`None`: not measured
    /// this night, or its chain has one night).
    pub e_rise: Option<f64>,
    /// While a regression is open: the evidence that it was mended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_drop: Option<f64>,
    /// Nights in the cell's chain whose sessions count, this one included.
    pub chain_nights: usize,
    /// Why the state, one sentence each.
    pub reasons: Vec<String>,
    /// The chain started again this night, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<String>,
    /// The regression (index into the events) this night found or continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<usize>,
}

/// How an open regression ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The rate fell back: evidence of a drop at the Bonferroni threshold.
    Mended,
    /// A further rise was found: a new regression carries on from it.
    Superseded,
    /// The chain changed (plan, workload, engine): nothing compares any more.
    Reset,
}

/// A regression the history found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegressionEvent {
    /// Index of the cell.
    pub cell: usize,
    /// The night the evidence crossed.
    pub flagged_night: usize,
    /// The first night of the raised rate (the likeliest change point).
    pub first_bad_night: usize,
    /// The chain's night before it.
    pub last_good_night: usize,
    /// The evidence when flagged, and the e-BH threshold it met.
    pub e_value: f64,
    pub threshold: f64,
    /// The chain's sessions before and after the change point, when flagged.
    pub before: (u64, u64),
    pub after: (u64, u64),
    /// The night it ended, and how; `None` while open.
    pub ended: Option<(usize, Ending)>,
}

impl RegressionEvent {
    pub fn is_open(&self) -> bool {
        self.ended.is_none()
    }
}

/// The whole history's assessment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryAssessment {
    /// `[cell][night]`.
    pub cells: Vec<Vec<Assessment>>,
    pub events: Vec<RegressionEvent>,
    /// The e-BH family: every cell of the history.
    pub family: usize,
}

impl HistoryAssessment {
    /// The last night's state of each cell.
    pub fn latest(&self) -> impl Iterator<Item = (usize, &Assessment)> {
        self.cells
            .iter()
            .enumerate()
            .filter_map(|(c, nights)| nights.last().map(|a| (c, a)))
    }
}

/// One cell's running chain.
#[derive(Debug, Default)]
struct Tracker {
    key: Option<String>,
    /// (night, tally) of the nights whose sessions count.
    nights: Vec<(usize, Tally)>,
    open: Option<usize>,
}

impl Tracker {
    fn tallies(&self) -> Vec<Tally> {
        self.nights.iter().map(|&(_, t)| t).collect()
    }

    /// Keep the chain from its `at`-th night on.
    fn restart_at(&mut self, at: usize) {
        self.nights.drain(..at);
    }
}

/// Assess `grid[cell][night]` (every cell has the same nights, named by `labels` in the
/// reasons) night by night.
pub fn assess(
    grid: &[Vec<CellNight>],
    labels: &[String],
    policy: &HistoryPolicy,
) -> HistoryAssessment {
    let family = grid.len();
    let nights = labels.len();
    assert!(grid.iter().all(|c| c.len() == nights), "ragged history");
    let threshold_single = ebh::single_threshold(policy.alpha, family);
    let mut trackers: Vec<Tracker> = (0..family).map(|_| Tracker::default()).collect();
    let mut events: Vec<RegressionEvent> = Vec::new();
    let mut out: Vec<Vec<Assessment>> = vec![Vec::with_capacity(nights); family];

    // By night, every cell at once (e-BH is across cells), so the loop is an index.
    #[allow(clippy::needless_range_loop)]
    for t in 0..nights {
        // Feed the night, resetting chains whose key changed.
        let mut fed = vec![false; family];
        let mut resets: Vec<Option<String>> = vec![None; family];
        for (c, tracker) in trackers.iter_mut().enumerate() {
            let night = &grid[c][t];
            let tally = match &night.observation {
                Observation::Missing { .. } => continue,
                Observation::Unfit { .. } => None,
                Observation::Measured { tally, .. } => Some(*tally),
            };
            if let Some(old) = &tracker.key {
                if *old != night.chain {
                    resets[c] = Some(
                        "the cell's configuration, workload, engine or bisect changed: its evidence starts again".into(),
                    );
                    tracker.nights.clear();
                    if let Some(e) = tracker.open.take() {
                        events[e].ended = Some((t, Ending::Reset));
                    }
                }
            }
            tracker.key = Some(night.chain.clone());
            if let Some(tally) = tally {
                tracker.nights.push((t, tally));
                fed[c] = true;
            }
        }

        // The rise evidence of every cell fed tonight; e-BH over them, K = all cells.
        let rise: Vec<ChainEvidence> = (0..family)
            .map(|c| {
                if fed[c] {
                    chain_evidence(&trackers[c].tallies(), Change::Rise)
                } else {
                    ChainEvidence {
                        e_value: None,
                        change_at: None,
                    }
                }
            })
            .collect();
        let tested: Vec<usize> = (0..family).filter(|&c| rise[c].e_value.is_some()).collect();
        let e_values: Vec<f64> = tested.iter().map(|&c| rise[c].e_value.unwrap()).collect();
        let rejected = ebh::e_bh(&e_values, policy.alpha, family);
        // The smallest rejected e-value's step: what a cell had to reach tonight.
        let rejected_count = rejected.iter().filter(|&&r| r).count().max(1);
        let threshold_tonight = family as f64 / (policy.alpha * rejected_count as f64);

        for c in 0..family {
            let night = &grid[c][t];
            let tracker = &mut trackers[c];
            let mut reasons = Vec::new();
            let mut event_here = None;
            let mut e_drop = None;
            let is_rejected = tested
                .iter()
                .position(|&x| x == c)
                .is_some_and(|i| rejected[i]);
            let e_rise = rise[c].e_value;
            if is_rejected {
                let at = rise[c]
                    .change_at
                    .expect("a chain of two nights has a change point");
                let all = tracker.tallies();
                let before = Tally::sum(&all[..at]);
                let after = Tally::sum(&all[at..]);
                if let Some(prev) = tracker.open.take() {
                    events[prev].ended = Some((t, Ending::Superseded));
                }
                let event = RegressionEvent {
                    cell: c,
                    flagged_night: t,
                    first_bad_night: tracker.nights[at].0,
                    last_good_night: tracker.nights[at - 1].0,
                    e_value: e_rise.unwrap_or(0.0),
                    threshold: threshold_tonight,
                    before: (before.corrupted, before.judged),
                    after: (after.corrupted, after.judged),
                    ended: None,
                };
                reasons.push(format!(
                    "evidence of a rise e = {} >= {} (e-BH at alpha {} over {} cells): {} -> {} from night {} on",
                    crate::adaptive::e_value_text(event.e_value),
                    crate::adaptive::e_value_text(threshold_tonight),
                    policy.alpha,
                    family,
                    crate::format::rate(before.corrupted, before.judged),
                    crate::format::rate(after.corrupted, after.judged),
                    labels[event.first_bad_night],
                ));
                events.push(event);
                tracker.open = Some(events.len() - 1);
                tracker.restart_at(at);
                event_here = Some(events.len() - 1);
            } else if let Some(open) = tracker.open {
                if fed[c] {
                    let drop = chain_evidence(&tracker.tallies(), Change::Drop);
                    e_drop = drop.e_value;
                    if let (Some(e), Some(at)) = (drop.e_value, drop.change_at) {
                        if e >= threshold_single {
                            let mended_at = tracker.nights[at].0;
                            events[open].ended = Some((t, Ending::Mended));
                            tracker.open = None;
                            tracker.restart_at(at);
                            reasons.push(format!(
                                "the regression found on night {} is mended: evidence of a drop e = {} >= {} from night {} on",
                                labels[events[open].flagged_night],
                                crate::adaptive::e_value_text(e),
                                crate::adaptive::e_value_text(threshold_single),
                                labels[mended_at]
                            ));
                        }
                    }
                }
                if tracker.open.is_some() {
                    event_here = Some(open);
                    reasons.push(format!(
                        "open regression since night {} (found on night {})",
                        labels[events[open].first_bad_night], labels[events[open].flagged_night]
                    ));
                }
            }

            let state = match &night.observation {
                Observation::Missing { why } => {
                    reasons.insert(0, why.clone());
                    State::Missing
                }
                _ if event_here.is_some() => State::Regression,
                Observation::Unfit { why, .. } => {
                    reasons.extend(why.iter().cloned());
                    reasons.push("its sessions are kept out of the evidence".into());
                    State::Insufficient
                }
                Observation::Measured {
                    insufficient: Some(why),
                    ..
                } => {
                    reasons.push(format!("{why}; its sessions still count in the evidence"));
                    State::Insufficient
                }
                Observation::Measured { tally, .. } => {
                    match suspicion(&tracker.nights, *tally, e_rise, policy) {
                        Some(why) => {
                            reasons.push(why);
                            State::Suspicious
                        }
                        None => State::Ok,
                    }
                }
            };
            out[c].push(Assessment {
                state,
                e_rise,
                e_drop,
                chain_nights: tracker.nights.len(),
                reasons,
                reset: resets[c].take(),
                event: event_here,
            });
        }
    }
    HistoryAssessment {
        cells: out,
        events,
        family,
    }
}

/// Why a measured, unflagged night is suspicious, if it is.
fn suspicion(
    chain: &[(usize, Tally)],
    tonight: Tally,
    e_rise: Option<f64>,
    policy: &HistoryPolicy,
) -> Option<String> {
    if let Some(e) = e_rise.filter(|&e| e >= policy.suspicious_e) {
        return Some(format!(
            "evidence of a rise e = {} >= {}, short of the regression threshold",
            crate::adaptive::e_value_text(e),
            crate::adaptive::e_value_text(policy.suspicious_e)
        ));
    }
    let earlier: Vec<Tally> = chain[..chain.len().saturating_sub(1)]
        .iter()
        .map(|&(_, t)| t)
        .collect();
    let reference = Tally::sum(&earlier);
    if reference.judged == 0 {
        return None;
    }
    let p = crate::stats::fisher_one_sided_greater(
        tonight.corrupted,
        tonight.judged - tonight.corrupted,
        reference.corrupted,
        reference.judged - reference.corrupted,
    );
    (p < policy.suspicious_p).then(|| {
        format!(
            "this night alone ({}) is above its chain's earlier nights ({}): one-sided Fisher p = {} < {}",
            crate::format::rate(tonight.corrupted, tonight.judged),
            crate::format::rate(reference.corrupted, reference.judged),
            crate::format::p_value(p),
            policy.suspicious_p
        )
    })
}
