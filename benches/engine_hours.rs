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
//! - **culprit** (`core::culprit::simulate`, the search `bisect culprit` runs, on the
//!   scripted scenarios of `benches/culprit.rs`): each block a restart and a wave of 80;
//!   at a low load (8 in flight: ten waves a block), also every block split over two
//!   replica sets (`core::culprit::split_sets`, five waves on each set at once);
//! - **commits** (`core::commits::simulate`, the search `bisect commits` runs, 64-commit
//!   ranges): each block a restart and a wave, each build of a commit 20 min with the
//!   set held idle; one set, and `--parallel 2` (a round's two blocks, and their builds,
//!   at once on two sets or Slurm nodes).
//!
//! Wall: restarts plus driving, a round of sets at once costing its slowest set. Engine-
//! hours: sets held x wall. Run: `cargo bench --bench engine_hours` (`BISECT_EH_REPS`
//! experiments per adaptive cell, default 400; the searches take a quarter of it).

use bisect_harness::commands::culprit::DEFAULT_BUDGET;
use bisect_harness::core::adaptive::{plan, AdaptiveError, AdaptiveSpec, BlockOutcome, Schedule};
use bisect_harness::core::commits::params::Params as CommitParams;
use bisect_harness::core::commits::simulate as commits_sim;
use bisect_harness::core::cost::{plan as plan_cost, Blocks, Unit};
use bisect_harness::core::culprit::simulate as culprit_sim;
use bisect_harness::core::sequential::{Decision, DesignGoal};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const RESTART_S: f64 = 900.0;
const BLOCK_S: f64 = 600.0;
const C: u64 = 80;
const SEED: u64 = 20_261_205;
/// A build of one commit of a DeepSeek-class engine, the set held idle meanwhile.
const BUILD_S: f64 = 1200.0;

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
    searches(reps / 4);
}

/// The searches at the same profile: culprit per scenario, commits per scenario, their
/// engine-hours from the restarts, waves and builds their simulations spend.
fn searches(reps: usize) {
    let reps = reps.max(1);
    println!();
    println!("| search | scenario | accuracy | restarts | sessions | wall (h) | engine-hours |");
    println!("|---|---|---|---|---|---|---|");
    for (oracle, load) in culprit_sim::scenarios() {
        let runs: Vec<culprit_sim::Scored> = (0..reps as u64)
            .map(|i| culprit_sim::simulate_search(&oracle, load, DEFAULT_BUDGET, SEED + i))
            .collect();
        let n = runs.len() as f64;
        let restarts = runs.iter().map(|r| r.restarts as f64).sum::<f64>() / n;
        let sessions = runs.iter().map(|r| r.sessions as f64).sum::<f64>() / n;
        // Blocks of `load` sessions at `load` in flight: one wave each.
        let wall = restarts * RESTART_S + sessions / f64::from(load) * BLOCK_S;
        let accuracy = runs.iter().filter(|r| r.correct).count() as f64 / n;
        println!(
            "| culprit | {} (at {load}) | {accuracy:.3} | {restarts:.1} | {sessions:.0} | {:.2} | {:.2} |",
            oracle.name,
            wall / 3600.0,
            wall / 3600.0
        );
        // On two replica sets every block splits where each share holds two waves at the
        // load (core::culprit::split_sets): the same search, its blocks' restarts at once
        // and their waves spread over the sets.
        let block = u64::from(load).max(bisect_harness::core::culprit::MIN_BLOCK);
        let k = bisect_harness::core::culprit::split_sets(block, load, 2) as u64;
        if k > 1 {
            let share_waves = block.div_ceil(k).div_ceil(u64::from(load)) as f64;
            let split_wall = restarts * (RESTART_S + share_waves * BLOCK_S);
            println!(
                "| culprit, blocks split over {k} sets | {} (at {load}) | {accuracy:.3} | {:.1} | {sessions:.0} | {:.2} | {:.2} |",
                oracle.name,
                restarts * k as f64,
                split_wall / 3600.0,
                k as f64 * split_wall / 3600.0
            );
        }
    }
    // What a cost model for culprit would choose among: blocks of one, two or three waves
    // (80, 160, 240 sessions at 80 in flight), every scenario at 80 in flight, the mean
    // engine-hours and the worst accuracy over them.
    println!();
    println!("| culprit blocks of | mean restarts | mean sessions | worst accuracy | mean engine-hours |");
    println!("|---|---|---|---|---|");
    for waves in [1u64, 2, 3] {
        let (mut restarts, mut sessions, mut hours, mut worst, mut count) =
            (0.0, 0.0, 0.0, 1.0f64, 0.0);
        for (oracle, load) in culprit_sim::scenarios()
            .into_iter()
            .filter(|(_, l)| *l == 80)
        {
            let runs: Vec<culprit_sim::Scored> = (0..reps as u64)
                .map(|i| {
                    let mut p = bisect_harness::core::culprit::SearchParams::new(
                        oracle.flag_values(),
                        load,
                        DEFAULT_BUDGET,
                        SEED + i,
                    );
                    p.block = waves * u64::from(load);
                    culprit_sim::simulate_with(&oracle, &p)
                })
                .collect();
            let n = runs.len() as f64;
            let r = runs.iter().map(|r| r.restarts as f64).sum::<f64>() / n;
            let s = runs.iter().map(|r| r.sessions as f64).sum::<f64>() / n;
            restarts += r;
            sessions += s;
            hours += (r * RESTART_S + s / f64::from(load) * BLOCK_S) / 3600.0;
            worst = worst.min(runs.iter().filter(|r| r.correct).count() as f64 / n);
            count += 1.0;
        }
        println!(
            "| {} sessions ({waves} wave{}) | {:.1} | {:.0} | {worst:.3} | {:.2} |",
            waves * C,
            if waves == 1 { "" } else { "s" },
            restarts / count,
            sessions / count,
            hours / count
        );
    }
    println!();
    println!("| search | scenario | accuracy | restarts | sessions | wall (h) | engine-hours |");
    println!("|---|---|---|---|---|---|---|");
    let n = 64;
    for s in commits_sim::scenarios()
        .into_iter()
        .filter(|s| ["18% vs 0%", "12% vs 1%", "5% vs 1%", "flake-only 2%"].contains(&s.name))
    {
        for k in [1u32, 2] {
            let mut params = CommitParams::new(2, C, C as u32);
            params.parallel = k;
            let scored = commits_sim::benchmark(&s, n, reps, &params, &[], SEED).remove(0);
            // One restart per block; a round's k blocks side by side on k sets.
            let blocks = scored.mean_sessions / C as f64;
            let build_h = scored.mean_builds * BUILD_S / 3600.0;
            let rounds = scored.mean_rounds;
            // Builds of a round run at once too (one a task).
            let wall_h = rounds * (RESTART_S + BLOCK_S) / 3600.0 + build_h / f64::from(k);
            println!(
                "| commits, --parallel {k} | {} ({n} commits) | {:.3} | {blocks:.1} | {:.0} | {wall_h:.2} | {:.2} |",
                s.name,
                scored.accuracy,
                scored.mean_sessions,
                f64::from(k) * wall_h
            );
        }
    }
}
