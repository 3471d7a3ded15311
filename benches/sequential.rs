//! Simulation benchmark of the sequential A/B test (`bisect_harness::core::sequential`):
//! thousands of experiments per scenario, drawn from binomial models with a fixed seed and
//! run through the real stopping code, next to the designs it replaces or was chosen over:
//! - `e-process`: the chosen design (`SequentialDesign::plan`, looks every 20 sessions per
//!   arm, cap sized for the goal's power at 1% vs 6%);
//! - `e-process mix`: the same test with `Bet::DesignMixture` (half on the plug-in, half on
//!   fixed alternatives at the design effect), its cap planned for it
//!   (`SequentialDesign::plan_with_bet`): tried for small effects, not the default;
//! - `group-seq`: Lan-DeMets O'Brien-Fleming-type spending on the pooled z statistic, cap
//!   inflated from the fixed design for the same power, repeated Newcombe intervals for
//!   `cleared`;
//! - `fixed 80`: 80 + 80 sessions, Fisher exact and the verdict's Newcombe rule;
//! - `fixed N`: the fixed design sized by `stats::sessions_per_arm` for the same power at
//!   the same design point, same rule.
//!
//! Scenarios: the seeds' effects (18% vs 1%, 17% vs 0%, 12% vs 0%), smaller ones (5% vs 1%,
//! 3% vs 0%) and nulls (A/A at 0%, 5%, 18%), at alpha 0.01 (the verdict's default) and 0.05.
//! Per scenario and design: fraction implicated (the false-positive rate under a null,
//! power otherwise), cleared and undecided, sessions (both arms: mean and 95th
//! percentile), looks and restarts (two per look), and mean sessions over those of the
//! `fixed N` design. Printed as a table and again as markdown for docs/sequential.md.
//! Then, per effect, how close the e-processes come to Wald's bound, beside an oracle
//! (`Bet::Fixed` at the scenario's true rates, cap planned with the bet at the design
//! point): what no bet of this family can beat.
//!
//! Run: `cargo bench --bench sequential`; `BISECT_SEQ_REPS=20000` for more experiments per
//! cell (default 5000).

use std::time::Instant;

use bisect_harness::core::sequential::group_sequential;
use bisect_harness::core::sequential::{
    draw_binomial, Bet, CostModel, Decision, DesignGoal, Direction, OperatingCharacteristics,
    SequentialDesign, SimulatedRun,
};
use bisect_harness::core::stats;
use comfy_table::Table;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const DEFAULT_REPETITIONS: usize = 5000;
const SEED: u64 = 20_260_501;
const BLOCK: u64 = 20;
const FIXED_SMALL: u64 = 80;
/// The verdict's interval for `cleared` in the fixed designs.
const FIXED_CONFIDENCE: f64 = 0.95;

struct Scenario {
    p_on: f64,
    p_off: f64,
}

impl Scenario {
    fn name(&self) -> String {
        let kind = if self.p_on == self.p_off { "A/A " } else { "" };
        format!(
            "{kind}{:.0}% vs {:.0}%",
            100.0 * self.p_on,
            100.0 * self.p_off
        )
    }

    fn is_null(&self) -> bool {
        self.p_on == self.p_off
    }
}

const SCENARIOS: [Scenario; 8] = [
    Scenario {
        p_on: 0.18,
        p_off: 0.01,
    },
    Scenario {
        p_on: 0.17,
        p_off: 0.0,
    },
    Scenario {
        p_on: 0.12,
        p_off: 0.0,
    },
    Scenario {
        p_on: 0.05,
        p_off: 0.01,
    },
    Scenario {
        p_on: 0.03,
        p_off: 0.0,
    },
    Scenario {
        p_on: 0.0,
        p_off: 0.0,
    },
    Scenario {
        p_on: 0.05,
        p_off: 0.05,
    },
    Scenario {
        p_on: 0.18,
        p_off: 0.18,
    },
];

/// The group-sequential comparator: boundaries for rejecting (at alpha) and for the
/// repeated intervals that clear (at clear_alpha), at K equally spaced looks.
struct GroupSequential {
    looks: u64,
    reject: Vec<f64>,
    clear_confidence: Vec<f64>,
}

impl GroupSequential {
    /// Cap = fixed design x inflation factor for K looks, K = cap / BLOCK, to a fixed point.
    fn plan(goal: &DesignGoal, fixed_n: u64) -> Self {
        let mut looks = fixed_n.div_ceil(BLOCK);
        loop {
            let fractions: Vec<f64> = (1..=looks).map(|k| k as f64 / looks as f64).collect();
            let reject = group_sequential::spending_boundaries(goal.alpha, &fractions);
            let inflation =
                group_sequential::inflation_factor(goal.alpha, goal.power, &reject, &fractions);
            let needed = ((fixed_n as f64 * inflation).ceil() as u64).div_ceil(BLOCK);
            if needed <= looks {
                let clear = group_sequential::spending_boundaries(goal.clear_alpha, &fractions);
                let clear_confidence = clear.iter().map(|&c| 1.0 - normal_sf(c) * 2.0).collect();
                return GroupSequential {
                    looks,
                    reject,
                    clear_confidence,
                };
            }
            looks = needed;
        }
    }

    fn run(&self, goal: &DesignGoal, scenario: &Scenario, rng: &mut ChaCha8Rng) -> SimulatedRun {
        let (mut k_on, mut k_off, mut n) = (0u64, 0u64, 0u64);
        for look in 1..=self.looks {
            k_on += draw_binomial(rng, BLOCK, scenario.p_on);
            k_off += draw_binomial(rng, BLOCK, scenario.p_off);
            n += BLOCK;
            let index = (look - 1) as usize;
            let z = pooled_z(k_on, k_off, n);
            let decision = if z.abs() >= self.reject[index] {
                Decision::Implicated {
                    direction: direction(z),
                }
            } else if inside(
                stats::newcombe_diff(k_on, n, k_off, n, self.clear_confidence[index]),
                goal.min_effect,
            ) {
                Decision::Cleared
            } else if look == self.looks {
                Decision::Underpowered {
                    interval: [f64::NAN; 2],
                }
            } else {
                continue;
            };
            return SimulatedRun {
                decision,
                sessions: 2 * n,
                looks: look,
            };
        }
        unreachable!("the last look always decides")
    }
}

fn normal_sf(z: f64) -> f64 {
    0.5 * statrs::function::erf::erfc(z / std::f64::consts::SQRT_2)
}

fn pooled_z(k_on: u64, k_off: u64, n: u64) -> f64 {
    let pooled = (k_on + k_off) as f64 / (2 * n) as f64;
    let variance = pooled * (1.0 - pooled) * 2.0 / n as f64;
    if variance == 0.0 {
        return 0.0;
    }
    (k_on as f64 - k_off as f64) / n as f64 / variance.sqrt()
}

fn direction(diff: f64) -> Direction {
    if diff > 0.0 {
        Direction::On
    } else {
        Direction::Off
    }
}

fn inside((_, lower, upper): (f64, f64, f64), min_effect: f64) -> bool {
    lower > -min_effect && upper < min_effect
}

/// One fixed-size experiment decided as `bisect run`'s verdict does (docs/design.md 3.7).
fn run_fixed(n: u64, goal: &DesignGoal, scenario: &Scenario, rng: &mut ChaCha8Rng) -> SimulatedRun {
    let k_on = draw_binomial(rng, n, scenario.p_on);
    let k_off = draw_binomial(rng, n, scenario.p_off);
    let p = stats::fisher_exact_two_sided(k_on, n - k_on, k_off, n - k_off);
    let decision = if p < goal.alpha {
        Decision::Implicated {
            direction: direction(k_on as f64 - k_off as f64),
        }
    } else if inside(
        stats::newcombe_diff(k_on, n, k_off, n, FIXED_CONFIDENCE),
        goal.min_effect,
    ) {
        Decision::Cleared
    } else {
        Decision::Underpowered {
            interval: [f64::NAN; 2],
        }
    };
    SimulatedRun {
        decision,
        sessions: 2 * n,
        looks: 1,
    }
}

struct Row {
    alpha: f64,
    scenario: String,
    null: bool,
    method: &'static str,
    oc: OperatingCharacteristics,
    ratio: f64,
}

fn simulate(
    repetitions: usize,
    seed: u64,
    scenario: &Scenario,
    mut run: impl FnMut(&mut ChaCha8Rng) -> SimulatedRun,
) -> OperatingCharacteristics {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let runs: Vec<SimulatedRun> = (0..repetitions).map(|_| run(&mut rng)).collect();
    OperatingCharacteristics::from_runs(&runs, scenario.p_on - scenario.p_off)
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn header() -> Vec<&'static str> {
    vec![
        "alpha",
        "scenario (on vs off)",
        "design",
        "implicated",
        "cleared",
        "undecided",
        "mean sessions",
        "p95 sessions",
        "mean looks",
        "mean restarts",
        "sessions / fixed N",
    ]
}

fn cells(row: &Row) -> Vec<String> {
    let implicated = if row.null {
        format!("{} (FP)", percent(row.oc.implicated))
    } else if row.oc.wrong_direction > 0.0 {
        format!(
            "{} ({} wrong way)",
            percent(row.oc.implicated),
            percent(row.oc.wrong_direction)
        )
    } else {
        percent(row.oc.implicated)
    };
    vec![
        format!("{}", row.alpha),
        row.scenario.clone(),
        row.method.to_string(),
        implicated,
        percent(row.oc.cleared),
        percent(row.oc.underpowered),
        format!("{:.0}", row.oc.mean_sessions),
        format!("{}", row.oc.p95_sessions),
        format!("{:.1}", row.oc.mean_looks),
        format!("{:.1}", row.oc.mean_restarts()),
        format!("{:.2}", row.ratio),
    ]
}

/// Illustrative cost models: the embedded engine on one machine, and a large
/// disaggregated deployment whose engines take minutes to reload.
const COST_MODELS: [(&str, CostModel); 2] = [
    (
        "embedded (0.5 s/session, 5 s/restart)",
        CostModel {
            session_s: 0.5,
            restart_s: 5.0,
        },
    ),
    (
        "large (7.5 s/session, 600 s/restart)",
        CostModel {
            session_s: 7.5,
            restart_s: 600.0,
        },
    ),
];

/// The e-process at alpha 0.01 with other block sizes: fewer looks cost fewer restarts
/// and more sessions (`SequentialDesign::plan_for_cost` makes this choice).
fn block_sizes(repetitions: usize) {
    let scenarios = [&SCENARIOS[1], &SCENARIOS[3], &SCENARIOS[5]];
    let mut header = vec!["block per arm".to_string(), "cap per arm".to_string()];
    for scenario in scenarios {
        header.push(format!("{}: sessions / restarts", scenario.name()));
    }
    for (name, _) in COST_MODELS {
        header.push(format!("mean hours, {name}"));
    }
    let mut table = Table::new();
    table.set_header(header.clone());
    let mut markdown = vec![
        format!("| {} |", header.join(" | ")),
        format!("|{}", "---|".repeat(header.len())),
    ];
    for block_per_arm in [10, 20, 40, 80] {
        let design = SequentialDesign::plan(DesignGoal {
            block_per_arm,
            ..DesignGoal::default()
        })
        .expect("the default goal is plannable");
        let mut row = vec![block_per_arm.to_string(), design.max_per_arm.to_string()];
        let mut hours = [0.0; COST_MODELS.len()];
        for (index, scenario) in scenarios.iter().enumerate() {
            let oc = design.simulate(
                scenario.p_on,
                scenario.p_off,
                repetitions,
                SEED + 77 * index as u64,
            );
            row.push(format!(
                "{:.0} / {:.1}",
                oc.mean_sessions,
                oc.mean_restarts()
            ));
            for (slot, (_, cost)) in hours.iter_mut().zip(COST_MODELS) {
                *slot +=
                    cost.seconds(oc.mean_sessions, oc.mean_looks) / 3600.0 / scenarios.len() as f64;
            }
        }
        row.extend(hours.iter().map(|h| format!("{h:.2}")));
        markdown.push(format!("| {} |", row.join(" | ")));
        table.add_row(row);
    }
    println!();
    println!("e-process block size at alpha 0.01 (hours: mean over the three scenarios)");
    println!("{table}");
    println!();
    for line in markdown {
        println!("{line}");
    }
}

fn main() {
    let repetitions: usize = std::env::var("BISECT_SEQ_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_REPETITIONS);
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut designs = Vec::new();
    for alpha in [0.01, 0.05] {
        let goal = DesignGoal {
            alpha,
            block_per_arm: BLOCK,
            ..DesignGoal::default()
        };
        let fixed_n = stats::sessions_per_arm(goal.baseline, goal.min_effect, alpha, goal.power);
        let design = SequentialDesign::plan(goal).expect("the default goal is plannable");
        let mixture = SequentialDesign::plan_with_bet(goal, Bet::DesignMixture)
            .expect("the default goal is plannable");
        let group = GroupSequential::plan(&goal, fixed_n);
        designs.push(format!(
            "alpha {alpha}: power {} at {:.0}% vs {:.0}%; e-process cap {} per arm ({} looks); \
             e-process mix cap {} per arm; group-seq cap {} per arm ({} looks); fixed N {} per arm",
            goal.power,
            100.0 * (goal.baseline + goal.min_effect),
            100.0 * goal.baseline,
            design.max_per_arm,
            design.max_looks(),
            mixture.max_per_arm,
            group.looks * BLOCK,
            group.looks,
            fixed_n
        ));
        for (index, scenario) in SCENARIOS.iter().enumerate() {
            let seed = SEED + 1000 * index as u64 + (alpha * 1000.0) as u64;
            let methods: [(&'static str, OperatingCharacteristics); 5] = [
                (
                    "e-process",
                    design.simulate(scenario.p_on, scenario.p_off, repetitions, seed),
                ),
                (
                    "e-process mix",
                    mixture.simulate_with_bet(
                        Bet::DesignMixture,
                        scenario.p_on,
                        scenario.p_off,
                        repetitions,
                        seed,
                    ),
                ),
                (
                    "group-seq",
                    simulate(repetitions, seed, scenario, |rng| {
                        group.run(&goal, scenario, rng)
                    }),
                ),
                (
                    "fixed 80",
                    simulate(repetitions, seed, scenario, |rng| {
                        run_fixed(FIXED_SMALL, &goal, scenario, rng)
                    }),
                ),
                (
                    "fixed N",
                    simulate(repetitions, seed, scenario, |rng| {
                        run_fixed(fixed_n, &goal, scenario, rng)
                    }),
                ),
            ];
            for (method, oc) in methods {
                rows.push(Row {
                    alpha,
                    scenario: scenario.name(),
                    null: scenario.is_null(),
                    method,
                    ratio: oc.mean_sessions / (2 * fixed_n) as f64,
                    oc,
                });
            }
        }
    }

    let mut table = Table::new();
    table.set_header(header());
    for row in &rows {
        table.add_row(cells(row));
    }
    println!(
        "sequential A/B: {repetitions} experiments per cell, blocks of {BLOCK} per arm, \
         seed {SEED}, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for line in &designs {
        println!("{line}");
    }
    println!("{table}");

    println!();
    println!("| {} |", header().join(" | "));
    println!("|{}", "---|".repeat(header().len()));
    for row in &rows {
        println!("| {} |", cells(row).join(" | "));
    }

    block_sizes(repetitions);

    println!();
    for row in rows.iter().filter(|r| r.null) {
        // Three standard errors of the simulation above alpha count as a breach.
        let slack = 3.0 * (row.alpha * (1.0 - row.alpha) / repetitions as f64).sqrt();
        if row.oc.implicated > row.alpha + slack {
            println!(
                "FALSE POSITIVES ABOVE ALPHA: {} {} alpha {}: {}",
                row.method,
                row.scenario,
                row.alpha,
                percent(row.oc.implicated)
            );
        }
    }
    how_close_to_the_bound(&rows, repetitions);
    for alpha in [0.01, 0.05] {
        for method in ["e-process", "e-process mix"] {
            let effects: Vec<&Row> = rows
                .iter()
                .filter(|r| r.alpha == alpha && !r.null && r.method == method)
                .collect();
            let mean_ratio = effects.iter().map(|r| r.ratio).sum::<f64>() / effects.len() as f64;
            let worst = effects.iter().map(|r| r.ratio).fold(0.0, f64::max);
            println!(
                "alpha {alpha}: {method} sessions / fixed N over the effects: mean \
                 {mean_ratio:.2}, worst {worst:.2}"
            );
        }
    }
}

/// Against Wald's bound (`stats::wald_min_sessions_per_arm`): for each effect, the fewest
/// sessions any level-alpha test can expect to spend at the power the e-process reached
/// there, and at power 0.8, both as shares of the fixed design (sized for power 0.8 at
/// 6% vs 1%); beside them what the e-process spent, the mixture bet, and the oracle bet
/// (`Bet::Fixed` at the true rates, cap planned with the bet fixed at the design point).
/// A design below 0.6x at an effect where the bound itself is above 0.6x cannot exist.
fn how_close_to_the_bound(rows: &[Row], repetitions: usize) {
    let oracle_designs: Vec<(f64, SequentialDesign)> = [0.01, 0.05]
        .iter()
        .map(|&alpha| {
            let goal = DesignGoal {
                alpha,
                block_per_arm: BLOCK,
                ..DesignGoal::default()
            };
            let at_design = Bet::Fixed {
                on: goal.baseline + goal.min_effect,
                off: goal.baseline,
            };
            let design = SequentialDesign::plan_with_bet(goal, at_design)
                .expect("the default goal is plannable");
            (alpha, design)
        })
        .collect();
    println!();
    println!("How close to the bound (sessions, both arms, as shares of fixed N):");
    for (alpha, design) in &oracle_designs {
        println!(
            "alpha {alpha}: oracle cap {} per arm (planned with the bet at the design point)",
            design.max_per_arm
        );
    }
    println!(
        "| alpha | scenario | e-process implicated | e-process mean / fixed N | mix implicated | mix / fixed N | oracle implicated | oracle / fixed N | bound at e-process's power / fixed N | bound at power 0.8 / fixed N | e-process / bound at its power |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (index, row) in rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.null && r.method == "e-process")
    {
        let fixed = row.oc.mean_sessions / row.ratio;
        let scenario = SCENARIOS
            .iter()
            .find(|s| s.name() == row.scenario)
            .expect("the row's scenario");
        let mix = rows
            .iter()
            .find(|r| {
                r.alpha == row.alpha && r.scenario == row.scenario && r.method == "e-process mix"
            })
            .expect("the mixture's row");
        let (_, oracle_design) = oracle_designs
            .iter()
            .find(|(alpha, _)| *alpha == row.alpha)
            .expect("an oracle design per alpha");
        let oracle = oracle_design.simulate_with_bet(
            Bet::Fixed {
                on: scenario.p_on,
                off: scenario.p_off,
            },
            scenario.p_on,
            scenario.p_off,
            repetitions,
            SEED + 31 * index as u64,
        );
        let power = row.oc.implicated.clamp(1e-6, 1.0 - 1e-6);
        let at_power =
            2.0 * stats::wald_min_sessions_per_arm(scenario.p_on, scenario.p_off, row.alpha, power);
        let at_80 =
            2.0 * stats::wald_min_sessions_per_arm(scenario.p_on, scenario.p_off, row.alpha, 0.8);
        println!(
            "| {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.1}x |",
            row.alpha,
            row.scenario,
            percent(row.oc.implicated),
            row.ratio,
            percent(mix.oc.implicated),
            mix.ratio,
            percent(oracle.implicated),
            oracle.mean_sessions / fixed,
            at_power / fixed,
            at_80 / fixed,
            row.oc.mean_sessions / at_power
        );
    }
}
