//! Simulation of the stopping rule (the `simulate` method, the cap derivation and
//! `benches/sequential.rs`): binomial draws through the real [`SequentialState`], and
//! the operating characteristics of many simulated experiments.

use rand::Rng;
use serde::Serialize;

use super::*;

/// How one simulated experiment ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimulatedRun {
    pub decision: Decision,
    /// Sessions of both arms together.
    pub sessions: u64,
    pub looks: u64,
}

/// Summary of simulated experiments.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OperatingCharacteristics {
    pub repetitions: usize,
    /// Fraction implicated, either direction.
    pub implicated: f64,
    /// Fraction implicated with the direction opposite the true difference (any implicated
    /// run when the rates are equal counts in `implicated` only).
    pub wrong_direction: f64,
    pub cleared: f64,
    pub underpowered: f64,
    /// Sessions of both arms together.
    pub mean_sessions: f64,
    pub p95_sessions: u64,
    pub mean_looks: f64,
}

impl OperatingCharacteristics {
    /// Summarises runs whose true difference (on - off) was `true_diff`.
    pub fn from_runs(runs: &[SimulatedRun], true_diff: f64) -> Self {
        let count = runs.len().max(1) as f64;
        let fraction = |pick: &dyn Fn(&Decision) -> bool| {
            runs.iter().filter(|r| pick(&r.decision)).count() as f64 / count
        };
        let wrong = match true_diff.partial_cmp(&0.0) {
            Some(std::cmp::Ordering::Greater) => Some(Direction::Off),
            Some(std::cmp::Ordering::Less) => Some(Direction::On),
            _ => None,
        };
        let mut sessions: Vec<u64> = runs.iter().map(|r| r.sessions).collect();
        sessions.sort_unstable();
        let p95_rank =
            ((0.95 * sessions.len() as f64).ceil() as usize).clamp(1, sessions.len().max(1));
        OperatingCharacteristics {
            repetitions: runs.len(),
            implicated: fraction(&|d| matches!(d, Decision::Implicated { .. })),
            wrong_direction: fraction(
                &|d| matches!(d, Decision::Implicated { direction } if Some(*direction) == wrong),
            ),
            cleared: fraction(&|d| matches!(d, Decision::Cleared)),
            underpowered: fraction(&|d| matches!(d, Decision::Underpowered { .. })),
            mean_sessions: sessions.iter().sum::<u64>() as f64 / count,
            p95_sessions: sessions.get(p95_rank - 1).copied().unwrap_or(0),
            mean_looks: runs.iter().map(|r| r.looks).sum::<u64>() as f64 / count,
        }
    }

    /// Two restarts per look: one block of each arm.
    pub fn mean_restarts(&self) -> f64 {
        2.0 * self.mean_looks
    }
}

/// Corrupted sessions among `n` Bernoulli(p) draws.
pub fn draw_binomial(rng: &mut impl Rng, n: u64, p: f64) -> u64 {
    (0..n).filter(|_| rng.random::<f64>() < p).count() as u64
}

pub(super) fn simulate_one(
    design: &SequentialDesign,
    bet: Bet,
    p_on: f64,
    p_off: f64,
    rng: &mut ChaCha8Rng,
) -> SimulatedRun {
    let mut state = SequentialState::with_bet(*design, bet);
    let block = design.block_per_arm;
    loop {
        let on = draw_binomial(rng, block, p_on);
        let off = draw_binomial(rng, block, p_off);
        let decision = state
            .look((on, block), (off, block))
            .expect("simulated counts are valid and the loop stops at the first final decision");
        if decision.is_final() {
            let (on, off) = state.tallies();
            return SimulatedRun {
                decision,
                sessions: on.sessions + off.sessions,
                looks: state.looks().len() as u64,
            };
        }
    }
}
