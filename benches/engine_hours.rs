//! Engine-hours per verdict at SGLang scale (issue 45): a simulated deployment whose
//! restart takes 15 minutes and whose block of 80 sessions at 80 in flight takes about 10
//! (`RESTART_S`, `BLOCK_S`), run through the real schedules with binomial sessions from a
//! fixed seed:
//! - **run**, the fixed design, 2 pairs of blocks of 80: priced by `core::cost::plan` on
//!   one set (arms one after the other) and on two replica sets (each pair at once);
//! - **adaptive** (`core::adaptive::Schedule`, the code `bisect run --adaptive` runs), per
//!   scenario: *before* the cost model (blocks handed back with no restart time, so the
//!   schedule never learns restarts are dear and keeps blocks of 80) and *after* it (the
//!   measured restart and drive seconds, so its re-plan picks longer blocks), on one set
//!   and on two (each set a whole pair at a time, `Schedule::next_pairs`).
//!
//! Wall: restarts plus driving, a round of sets at once costing its slowest set. Engine-
//! hours: sets held x wall. Run: `cargo bench --bench engine_hours` (`BISECT_EH_REPS`
//! experiments per adaptive cell, default 400).

use bisect_harness::core::adaptive::{plan, AdaptiveError, AdaptiveSpec, BlockOutcome, Schedule};
use bisect_harness::core::cost::{plan as plan_cost, Blocks, Unit};
use bisect_harness::core::sequential::{Decision, DesignGoal};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const RESTART_S: f64 = 900.0;
const BLOCK_S: f64 = 600.0;
const C: u64 = 80;
const SEED: u64 = 20_261_205;

/// One adaptive experiment's cost and answer.
#[derive(Default, Clone, Copy)]
struct Spent {
    wall_s: f64,
    engine_h: f64,
    restarts: u64,
    sessions: u64,
    implicated: bool,
}

fn adaptive_once(
    p_on: f64,
    p_off: f64,
    lanes: u64,
    cost_model: bool,
    planned: (u64, u64),
    rng: &mut ChaCha8Rng,
) -> Spent {
    let spec = AdaptiveSpec {
        goal: DesignGoal::default(),
        concurrency: C,
        max_sessions: None,
    };
    let mut schedule = Schedule::with_plan(spec, Some(planned)).expect("a plannable goal");
    let mut spent = Spent::default();
    loop {
        let pairs = schedule.next_pairs(lanes);
        if pairs.is_empty() {
            break;
        }
        let block_s = |sessions: u64| BLOCK_S * sessions as f64 / C as f64;
        // Each set runs its pair (two restarts, two blocks); the round takes the longest.
        let round = pairs
            .iter()
            .map(|p| 2.0 * RESTART_S + 2.0 * block_s(p[0].sessions))
            .fold(0.0, f64::max);
        spent.wall_s += round;
        spent.engine_h += round * lanes as f64 / 3600.0;
        for pair in &pairs {
            spent.restarts += 2;
            spent.sessions += 2 * pair[0].sessions;
            let outcomes = pair.map(|b| {
                let p = if b.label.as_str() == "on" {
                    p_on
                } else {
                    p_off
                };
                BlockOutcome {
                    sessions: (0..b.sessions)
                        .map(|_| Some(rng.random::<f64>() < p))
                        .collect(),
                    restart_s: if cost_model { RESTART_S } else { 0.0 },
                    drive_s: block_s(b.sessions),
                }
            });
            match schedule.pair_done(pair, outcomes) {
                Ok(Decision::Implicated { .. }) => spent.implicated = true,
                Ok(_) | Err(AdaptiveError::Finished) => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
    spent
}

fn main() {
    let reps: usize = std::env::var("BISECT_EH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(400);
    println!(
        "SGLang-scale profile: restart {:.0} min, a block of {C} sessions at {C} in flight {:.0} min",
        RESTART_S / 60.0,
        BLOCK_S / 60.0
    );
    println!();
    println!(
        "| command | design | sets | restarts | sessions | implicated | wall (h) | engine-hours |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let fixed = Blocks {
        restarts: 4,
        blocks: vec![(C, C as u32); 4],
    };
    for sets in [1u32, 2] {
        let p = plan_cost(&fixed, sets, &Unit::Given(RESTART_S), &Unit::Given(BLOCK_S));
        println!(
            "| run (2 pairs) | fixed | {sets} | 4 | {} | - | {:.2} | {:.2} |",
            p.sessions,
            p.wall_s.unwrap_or(f64::NAN) / 3600.0,
            p.engine_hours.unwrap_or(f64::NAN)
        );
    }
    let planned = plan(DesignGoal::default(), C, None).expect("a plannable goal");
    for (name, p_on, p_off) in [
        ("17% vs 0%", 0.17, 0.0),
        ("5% vs 1%", 0.05, 0.01),
        ("A/A 0%", 0.0, 0.0),
    ] {
        for (model, cost_model) in [("before the cost model", false), ("after", true)] {
            for lanes in [1u64, 2] {
                let mut rng = ChaCha8Rng::seed_from_u64(SEED);
                let runs: Vec<Spent> = (0..reps)
                    .map(|_| adaptive_once(p_on, p_off, lanes, cost_model, planned, &mut rng))
                    .collect();
                let mean = |f: fn(&Spent) -> f64| runs.iter().map(f).sum::<f64>() / reps as f64;
                println!(
                    "| adaptive {name} | {model} | {lanes} | {:.1} | {:.0} | {:.1}% | {:.2} | {:.2} |",
                    mean(|s| s.restarts as f64),
                    mean(|s| s.sessions as f64),
                    100.0 * mean(|s| f64::from(u8::from(s.implicated))),
                    mean(|s| s.wall_s) / 3600.0,
                    mean(|s| s.engine_h)
                );
            }
        }
    }
}
