//! Known dose-response curves scored through the real sweep ([`sweep()`]): a
//! block runner whose sessions corrupt independently (ChaCha8 from a fixed seed) at the
//! curve's rate for the block's level, and whose engine always reaches the level. For
//! each curve the truth is the lowest level whose rate exceeds the lowest level's; a
//! sweep is right within one level when its threshold is that level or a neighbour, and
//! claims a false threshold when it names one on a flat curve. Run by
//! `cargo bench --bench load` (figures in docs/load.md) and, small, by the tests below.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::report::{Answer, LoadReport};
use super::sweep::{sweep, LevelBlock};
use super::LoadParams;
use crate::culprit::BlockOutcome;
use crate::session::SessionClass;

/// A corruption rate as a function of sessions in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Curve {
    /// `rate` from `at` in flight on, `background` below.
    Step { at: u32, rate: f64, background: f64 },
    /// `background` up to `from`, rising linearly to `background + rate` at `to`.
    Ramp {
        from: u32,
        to: u32,
        rate: f64,
        background: f64,
    },
    /// The same rate at every load.
    Flat { rate: f64 },
}

impl Curve {
    pub fn rate(&self, level: u32) -> f64 {
        match *self {
            Curve::Step {
                at,
                rate,
                background,
            } => {
                if level >= at {
                    background + rate
                } else {
                    background
                }
            }
            Curve::Ramp {
                from,
                to,
                rate,
                background,
            } => {
                let x = (f64::from(level) - f64::from(from)) / (f64::from(to) - f64::from(from));
                background + rate * x.clamp(0.0, 1.0)
            }
            Curve::Flat { rate } => rate,
        }
    }

    /// The lowest of `levels` whose rate exceeds the lowest level's.
    pub(crate) fn onset(&self, levels: &[u32]) -> Option<u32> {
        let base = self.rate(levels[0]);
        levels[1..].iter().copied().find(|&l| self.rate(l) > base)
    }
}

/// The curves of docs/load.md: the seeds' 15% (12-18% at 60-80 in flight).
pub fn curves() -> Vec<(&'static str, Curve)> {
    vec![
        (
            "step at 30",
            Curve::Step {
                at: 30,
                rate: 0.15,
                background: 0.0,
            },
        ),
        (
            "ramp 16-64",
            Curve::Ramp {
                from: 16,
                to: 64,
                rate: 0.15,
                background: 0.0,
            },
        ),
        ("flat 0", Curve::Flat { rate: 0.0 }),
        ("flat 5%", Curve::Flat { rate: 0.05 }),
    ]
}

struct CurveRunner {
    curve: Curve,
    seed: u64,
}

impl CurveRunner {
    fn run_block(&self, block: &LevelBlock) -> BlockOutcome {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ block.seed.rotate_left(23));
        let rate = self.curve.rate(block.level);
        scripted_block(block.sessions, Some(u64::from(block.level)), |_| {
            rng.random::<f64>() < rate
        })
    }
}

/// A block whose session `i` corrupts (leaks) when `corrupts(i)`, else finishes clean, and
/// whose busiest engine ran `peak`: what the simulation's and the tests' runners return.
pub(crate) fn scripted_block(
    sessions: u64,
    peak: Option<u64>,
    mut corrupts: impl FnMut(u64) -> bool,
) -> BlockOutcome {
    let classes = (0..sessions)
        .map(|i| {
            if corrupts(i) {
                SessionClass::Leak
            } else {
                SessionClass::Done
            }
        })
        .collect();
    BlockOutcome {
        classes,
        peak_engine: peak,
        wall_s: 0.0,
        tokens_per_s: None,
        warnings: Vec::new(),
        mechanisms: Vec::new(),
        sets: Vec::new(),
    }
}

/// The report of one sweep over `curve`.
pub fn sweep_curve(curve: Curve, params: &LoadParams, seed: u64) -> LoadReport {
    let runner = CurveRunner { curve, seed };
    sweep(params.clone(), None).run(|b| runner.run_block(b), drop)
}

/// One simulated sweep, scored.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub threshold: Option<u32>,
    /// The threshold is the true onset or a neighbouring level (a flat curve: none).
    pub(crate) within_one: bool,
    /// A threshold named on a curve that has none.
    pub(crate) false_threshold: bool,
    /// The answer is pinned down: the rise lies between two adjacent levels (the level
    /// below the threshold shown flat, or the threshold at the lowest level), or every
    /// level is shown flat.
    pub(crate) located: bool,
    pub sessions: u64,
    pub restarts: u64,
}

/// Run the real sweep once against `curve`.
pub fn simulate(curve: Curve, params: &LoadParams, seed: u64) -> Scored {
    let report = sweep_curve(curve, params, seed);
    let threshold = match report.answer {
        Answer::Threshold { level, .. } => Some(level),
        _ => None,
    };
    let levels = &params.levels;
    let index = |l: u32| levels.iter().position(|&x| x == l).expect("a level") as i64;
    let located = match report.answer {
        Answer::Threshold {
            level,
            above,
            at_lowest,
        } => at_lowest || above.is_some_and(|a| index(a) + 1 == index(level)),
        Answer::NoThreshold { all_flat, .. } => all_flat,
        Answer::NoBaseline => false,
    };
    let truth = curve.onset(levels);
    let within_one = match (truth, threshold) {
        (Some(t), Some(found)) => (index(t) - index(found)).abs() <= 1,
        (None, None) => true,
        _ => false,
    };
    Scored {
        threshold,
        within_one,
        false_threshold: truth.is_none() && threshold.is_some(),
        located,
        sessions: report.sessions_spent,
        restarts: report.restarts,
    }
}

/// The docs/load.md table: per curve and allocation, over `reps` seeded sweeps at the
/// default levels, alpha 0.01: the share within one level of the truth, the share with
/// a false threshold, the share whose answer is pinned down between adjacent levels
/// ([`Scored::located`]), and mean and 95th-percentile sessions.
pub fn table(reps: u64) -> String {
    use super::{Allocation, DEFAULT_LEVELS};
    use crate::evidence::Policy;
    let allocations = [
        (
            "adaptive, cap 480/level",
            Allocation::Adaptive { max_sessions: 480 },
        ),
        ("fixed 80/level", Allocation::Fixed { sessions: 80 }),
        ("fixed 160/level", Allocation::Fixed { sessions: 160 }),
        ("fixed 320/level", Allocation::Fixed { sessions: 320 }),
    ];
    let mut out = String::from(
        "| curve | allocation | within one level | false threshold | located | mean sessions | p95 sessions |\n|---|---|---|---|---|---|---|\n",
    );
    for (name, curve) in curves() {
        for (words, allocation) in allocations {
            let params = LoadParams::new(
                DEFAULT_LEVELS.to_vec(),
                false,
                allocation,
                &Policy::default(),
                2026,
            );
            let runs: Vec<Scored> = (0..reps).map(|s| simulate(curve, &params, s)).collect();
            let share = |f: &dyn Fn(&Scored) -> bool| {
                100.0 * runs.iter().filter(|r| f(r)).count() as f64 / reps as f64
            };
            let sessions = runs.iter().map(|r| r.sessions as f64).sum::<f64>() / reps as f64;
            let mut sorted: Vec<u64> = runs.iter().map(|r| r.sessions).collect();
            sorted.sort_unstable();
            let p95 =
                sorted[((sorted.len() as f64 * 0.95).ceil() as usize).clamp(1, sorted.len()) - 1];
            out.push_str(&format!(
                "| {name} | {words} | {:.1}% | {:.1}% | {:.1}% | {sessions:.0} | {p95} |\n",
                share(&|r| r.within_one),
                share(&|r| r.false_threshold),
                share(&|r| r.located)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Allocation, DEFAULT_LEVELS};
    use super::*;
    use crate::evidence::Policy;

    /// Of 20 seeded sweeps of `curve` at the default levels, how many `count` holds for.
    fn over_seeds(curve: Curve, allocation: Allocation, count: fn(&Scored) -> bool) -> usize {
        let p = LoadParams::new(
            DEFAULT_LEVELS.to_vec(),
            false,
            allocation,
            &Policy::default(),
            7,
        );
        (0..20).filter(|&s| count(&simulate(curve, &p, s))).count()
    }

    /// `cargo test -p bisect-core --lib print_load_simulation -- --ignored --nocapture`
    /// (BISECT_LOAD_REPS, default 500): the table of docs/load.md.
    #[test]
    #[ignore]
    #[allow(clippy::disallowed_methods)] // A test's setting, read by the test.
    fn print_load_simulation() {
        let reps = std::env::var("BISECT_LOAD_REPS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(500);
        println!("{}", table(reps));
    }

    #[test]
    fn curves_and_their_onsets() {
        let c = curves();
        let levels = &DEFAULT_LEVELS;
        assert_eq!(c[0].1.onset(levels), Some(32));
        assert_eq!(c[1].1.onset(levels), Some(32));
        assert!((c[1].1.rate(32) - 0.05).abs() < 1e-12);
        assert_eq!(c[2].1.onset(levels), None);
        assert_eq!(c[3].1.onset(levels), None);
    }

    #[test]
    fn a_step_is_found_within_one_level_by_both_allocations() {
        // 20 seeds each, large margins: the full rates are in docs/load.md.
        for allocation in [
            Allocation::Fixed { sessions: 160 },
            Allocation::Adaptive { max_sessions: 480 },
        ] {
            let right = over_seeds(curves()[0].1, allocation, |r| r.within_one);
            assert!(right >= 17, "{allocation:?}: {right}/20");
        }
    }

    #[test]
    fn a_flat_curve_gets_no_threshold() {
        for allocation in [
            Allocation::Fixed { sessions: 80 },
            Allocation::Adaptive { max_sessions: 480 },
        ] {
            let false_claims = over_seeds(curves()[3].1, allocation, |r| r.false_threshold);
            assert!(false_claims <= 2, "{allocation:?}: {false_claims}/20");
        }
    }
}
