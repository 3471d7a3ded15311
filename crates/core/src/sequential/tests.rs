//! The e-values and always-valid intervals (against hand computation and closed forms),
//! the decisions of a sequential experiment, the planned cap (by seeded simulation),
//! and the group-sequential boundaries it was chosen over.

use statrs::function::beta::ln_beta;

use super::*;

fn goal() -> DesignGoal {
    DesignGoal::default()
}

fn capped(max_per_arm: u64) -> SequentialDesign {
    SequentialDesign::with_cap(goal(), max_per_arm).unwrap()
}

macro_rules! assert_close {
    ($actual:expr, $expected:expr, $tolerance:expr) => {{
        let (actual, expected): (f64, f64) = ($actual, $expected);
        assert!(
            (actual - expected).abs() <= $tolerance,
            "{} = {actual}, expected {expected} +- {}",
            stringify!($actual),
            $tolerance
        );
    }};
}

fn tally(corrupted: u64, sessions: u64) -> Tally {
    Tally {
        corrupted,
        sessions,
    }
}

fn ln_binomial_pmf(k: u64, n: u64, p: f64) -> f64 {
    let ln_choose = statrs::function::factorial::ln_binomial(n, k);
    let (kf, nf) = (k as f64, n as f64);
    let term = |count: f64, q: f64| if count == 0.0 { 0.0 } else { count * q.ln() };
    ln_choose + term(kf, p) + term(nf - kf, 1.0 - p)
}

#[test]
fn the_first_block_carries_no_evidence() {
    // No past: both plug-in rates are the prior mean 1/2, so the ratio is 1 whatever
    // the block holds.
    for (on, off) in [((5, 20), (0, 20)), ((0, 20), (20, 20)), ((3, 7), (1, 11))] {
        let e = block_log_e_value(
            Tally::default(),
            Tally::default(),
            tally(on.0, on.1),
            tally(off.0, off.1),
        );
        assert_close!(e, 0.0, 1e-12);
    }
    assert_eq!(
        block_log_e_value(tally(3, 20), tally(0, 20), tally(0, 0), tally(0, 0)),
        0.0
    );
}

// Hand computation (Python floats): ta = 5.18/20.36, tb = 0.18/20.36, t0 = (ta+tb)/2,
// log e = 4 ln(ta/t0) + 16 ln((1-ta)/(1-t0)) + 20 ln((1-tb)/(1-t0)).
#[test]
fn second_block_matches_hand_computation() {
    let log_e = block_log_e_value(tally(5, 20), tally(0, 20), tally(4, 20), tally(0, 20));
    assert_close!(log_e, 2.8418276374415976, 1e-12);
    let mut state = SequentialState::new(capped(400));
    state.look((5, 20), (0, 20)).unwrap();
    state.look((4, 20), (0, 20)).unwrap();
    assert_close!(state.e_value(), 17.14707555404747, 1e-9);
    assert_close!(state.looks()[1].block_e_value, 17.14707555404747, 1e-9);
}

// The GROW property the e-process rests on: under any common rate p, a block's
// e-variable has expectation <= 1, with equality at p = t0 (exact sums over outcomes).
#[test]
fn informed_priors_keep_the_e_value_at_most_one_under_every_null() {
    // Priors from a design or from another configuration's data (the culprit search's
    // steps): wrong guesses, right guesses, guesses of 0 and 1.
    let priors = [
        (ArmPrior::guess(0.18, 20.0), ArmPrior::guess(0.0, 20.0)),
        (ArmPrior::guess(0.0, 40.0), ArmPrior::guess(0.3, 10.0)),
        (ArmPrior::guess(1.0, 80.0), ArmPrior::guess(0.0, 80.0)),
    ];
    for (on, off) in priors {
        let prior = PlugInPrior { on, off };
        for (past_on, past_off) in [(tally(0, 0), tally(0, 0)), (tally(2, 13), tally(7, 17))] {
            for (na, nb) in [(10, 10), (20, 10), (5, 9)] {
                for p in [0.0, 0.01, 0.05, 0.18, 0.5, 1.0] {
                    let mut expectation = 0.0;
                    for ya in 0..=na {
                        for yb in 0..=nb {
                            let ln_probability =
                                ln_binomial_pmf(ya, na, p) + ln_binomial_pmf(yb, nb, p);
                            let log_e = block_log_e_value_with(
                                past_on,
                                past_off,
                                prior,
                                tally(ya, na),
                                tally(yb, nb),
                            );
                            expectation += (ln_probability + log_e).exp();
                        }
                    }
                    assert!(expectation <= 1.0 + 1e-9, "p {p}: E[e] = {expectation}");
                }
            }
        }
    }
    // A guess moves the first look's plug-in from 1/2 to near the guess.
    let prior = PlugInPrior {
        on: ArmPrior::guess(0.18, 20.0),
        off: ArmPrior::guess(0.0, 20.0),
    };
    assert!(
        block_log_e_value_with(tally(0, 0), tally(0, 0), prior, tally(2, 10), tally(0, 10)) > 0.5
    );
    assert_eq!(
        block_log_e_value(tally(0, 0), tally(0, 0), tally(2, 10), tally(0, 10)),
        0.0
    );
}

#[test]
fn block_e_value_has_expectation_at_most_one_under_every_null() {
    let pasts = [
        (tally(5, 20), tally(0, 20)),
        (tally(0, 40), tally(1, 40)),
        (tally(9, 60), tally(9, 60)),
        (tally(2, 13), tally(7, 17)),
    ];
    for (past_on, past_off) in pasts {
        for (na, nb) in [(20, 20), (20, 17), (5, 9)] {
            for p in [0.0, 0.001, 0.01, 0.05, 0.18, 0.5, 0.93, 1.0] {
                let mut expectation = 0.0;
                for ya in 0..=na {
                    for yb in 0..=nb {
                        let ln_probability =
                            ln_binomial_pmf(ya, na, p) + ln_binomial_pmf(yb, nb, p);
                        let log_e =
                            block_log_e_value(past_on, past_off, tally(ya, na), tally(yb, nb));
                        expectation += (ln_probability + log_e).exp();
                    }
                }
                assert!(expectation <= 1.0 + 1e-9, "p {p}: E[e] = {expectation}");
            }
            let (ta, tb) = (past_on.plug_in(), past_off.plug_in());
            let t0 = (na as f64 * ta + nb as f64 * tb) / (na + nb) as f64;
            let at_t0: f64 = (0..=na)
                .flat_map(|ya| (0..=nb).map(move |yb| (ya, yb)))
                .map(|(ya, yb)| {
                    (ln_binomial_pmf(ya, na, t0)
                        + ln_binomial_pmf(yb, nb, t0)
                        + block_log_e_value(past_on, past_off, tally(ya, na), tally(yb, nb)))
                    .exp()
                })
                .sum();
            assert_close!(at_t0, 1.0, 1e-9);
        }
    }
}

// The mixture bets (`Bet::DesignMixture`, `Bet::Fixed`): each look multiplies the
// mixture by a factor whose expectation is at most 1 under every common rate, whatever
// the past (exact sums over all outcomes of small blocks).
#[test]
fn mixture_bets_keep_the_block_factor_at_most_one_under_every_null() {
    let designs = [
        capped(1000),
        SequentialDesign::with_cap(
            DesignGoal {
                baseline: 0.0,
                min_effect: 0.03,
                ..goal()
            },
            1000,
        )
        .unwrap(),
    ];
    let bets = [
        Bet::DesignMixture,
        Bet::Fixed {
            on: 0.06,
            off: 0.01,
        },
        Bet::Fixed { on: 0.0, off: 0.2 },
    ];
    // Earlier looks: (on, off) as (corrupted, sessions).
    type Looks<'a> = &'a [((u64, u64), (u64, u64))];
    let pasts: [Looks; 3] = [
        &[],
        &[((2, 20), (0, 20)), ((1, 20), (0, 20))],
        &[((0, 20), (3, 20)), ((4, 17), (4, 20))],
    ];
    for design in designs {
        for bet in bets {
            for past in pasts {
                let mut state = SequentialState::with_bet(design, bet);
                for &(on, off) in past {
                    assert_eq!(state.look(on, off).unwrap(), Decision::Continue);
                }
                let before = state.e_value();
                for (na, nb) in [(10, 10), (20, 20), (5, 9)] {
                    let factors: Vec<(u64, u64, f64)> = (0..=na)
                        .flat_map(|ya| (0..=nb).map(move |yb| (ya, yb)))
                        .map(|(ya, yb)| {
                            let mut next = state.clone();
                            next.look((ya, na), (yb, nb)).unwrap();
                            (ya, yb, next.e_value() / before)
                        })
                        .collect();
                    for p in [0.0, 0.001, 0.01, 0.035, 0.18, 0.5, 1.0] {
                        let expectation: f64 = factors
                            .iter()
                            .map(|&(ya, yb, factor)| {
                                (ln_binomial_pmf(ya, na, p) + ln_binomial_pmf(yb, nb, p)).exp()
                                    * factor
                            })
                            .sum();
                        assert!(
                            expectation <= 1.0 + 1e-9,
                            "{bet:?} after {past:?}, p {p}: E[factor] = {expectation}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_design_mixture_is_never_more_than_twice_behind_the_plug_in() {
    let blocks = [(0, 0), (3, 0), (1, 0), (0, 1), (4, 0), (2, 2), (5, 1)];
    let mut plug_in = SequentialState::new(capped(1000));
    let mut mixture = SequentialState::with_bet(capped(1000), Bet::DesignMixture);
    for (on, off) in blocks {
        let a = plug_in.look((on, 20), (off, 20)).unwrap();
        let b = mixture.look((on, 20), (off, 20)).unwrap();
        assert!(mixture.e_value() >= plug_in.e_value() / 2.0 * (1.0 - 1e-12));
        if a.is_final() || b.is_final() {
            break;
        }
    }
    // The mixture is half the plug-in plus an eighth of each fixed alternative's
    // e-process: 6% vs 1%, 1% vs 6%, 5.1% vs 0.1%, 0.1% vs 5.1%.
    let alternatives = [(0.06, 0.01), (0.01, 0.06), (0.051, 0.001), (0.001, 0.051)];
    let mut expected = plug_in.e_value() / 2.0;
    for (on, off) in alternatives {
        let mut fixed = SequentialState::with_bet(capped(1000), Bet::Fixed { on, off });
        let mut by_hand = 0.0;
        for look in mixture.looks() {
            let (past_on, past_off) = fixed.tallies();
            let (block_on, block_off) = (
                (look.on.corrupted - past_on.corrupted, 20),
                (look.off.corrupted - past_off.corrupted, 20),
            );
            by_hand +=
                block_log_likelihood_ratio(on, off, tally(block_on.0, 20), tally(block_off.0, 20));
            fixed.look(block_on, block_off).unwrap();
        }
        assert_close!(fixed.e_value(), by_hand.exp(), 1e-9 * by_hand.exp());
        expected += fixed.e_value() / 8.0;
    }
    assert_close!(mixture.e_value(), expected, 1e-9 * expected);
    // The record's block factors multiply to the mixture.
    let product: f64 = mixture.looks().iter().map(|l| l.block_e_value).product();
    assert_close!(product, mixture.e_value(), 1e-9 * mixture.e_value());
    // Bets other than the default round-trip through run.json; the default's record has no
    // new fields.
    let json = serde_json::to_value(&mixture).unwrap();
    assert_eq!(json["bet"]["kind"], "design_mixture");
    assert_eq!(json["log_wealth"].as_array().unwrap().len(), 5);
    let resumed: SequentialState = serde_json::from_value(json).unwrap();
    assert_eq!(resumed, mixture);
    let json = serde_json::to_value(&plug_in).unwrap();
    assert!(json.get("bet").is_none() && json.get("log_wealth").is_none());
}

#[test]
fn mixture_false_positive_rate_stays_far_below_alpha() {
    for alpha in [0.01, 0.05] {
        let goal = DesignGoal { alpha, ..goal() };
        let design = SequentialDesign::plan_with_bet(goal, Bet::DesignMixture).unwrap();
        for p in [0.0, 0.01, 0.05, 0.18] {
            let null = design.simulate_with_bet(Bet::DesignMixture, p, p, 2000, 13);
            assert!(
                null.implicated <= alpha / 2.0,
                "alpha {alpha}, A/A at {p}: {null:?}"
            );
        }
    }
}

#[test]
fn more_corruption_in_the_arm_bet_on_raises_the_e_value() {
    let (past_on, past_off) = (tally(4, 40), tally(0, 40));
    let values: Vec<f64> = (0..=20)
        .map(|ya| block_log_e_value(past_on, past_off, tally(ya, 20), tally(0, 20)))
        .collect();
    assert!(values.windows(2).all(|w| w[1] > w[0]), "{values:?}");
    // Corruption in the arm the plug-in expects to be clean lowers it.
    let against: Vec<f64> = (0..=5)
        .map(|yb| block_log_e_value(past_on, past_off, tally(2, 20), tally(yb, 20)))
        .collect();
    assert!(against.windows(2).all(|w| w[1] < w[0]), "{against:?}");
}

// k = 0 has a closed form: the upper bound solves B(a, a+n)/B(a, a) / (1-p)^n = 1/alpha.
#[test]
fn confidence_sequence_matches_closed_form_at_zero() {
    for n in [1_u64, 20, 100, 140, 1000] {
        let log_marginal = ln_beta(0.5, 0.5 + n as f64) - ln_beta(0.5, 0.5);
        let expected = 1.0 - (-(-(0.025_f64).ln() - log_marginal) / n as f64).exp();
        let [lower, upper] = mixture_confidence_sequence(0, n, 0.025);
        assert_eq!(lower, 0.0);
        assert_close!(upper, expected, 1e-10);
        // All corrupted mirrors it.
        let [lower, upper] = mixture_confidence_sequence(n, n, 0.025);
        assert_close!(lower, 1.0 - expected, 1e-10);
        assert_eq!(upper, 1.0);
    }
    // Python: 1 - exp(-(ln 40 - ln(B(1/2, 140.5)/B(1/2, 1/2)))/140).
    assert_close!(
        mixture_confidence_sequence(0, 140, 0.025)[1],
        0.04695443133591026,
        1e-10
    );
    assert_eq!(mixture_confidence_sequence(0, 0, 0.05), [0.0, 1.0]);
}

#[test]
fn confidence_sequence_is_monotone_and_wider_than_a_fixed_interval() {
    for n in [20_u64, 80, 400] {
        let bounds: Vec<[f64; 2]> = (0..=n / 4)
            .map(|k| mixture_confidence_sequence(k, n, 0.025))
            .collect();
        assert!(bounds
            .windows(2)
            .all(|w| w[1][0] > w[0][0] || w[0][0] == 0.0 && w[1][0] >= 0.0));
        assert!(bounds.windows(2).all(|w| w[1][1] > w[0][1]));
        for (k, [lower, upper]) in bounds.iter().enumerate() {
            let (cp_lower, cp_upper) = stats::clopper_pearson(k as u64, n, 0.95);
            assert!(
                *lower <= cp_lower + 1e-12 && *upper >= cp_upper - 1e-12,
                "{k}/{n}: [{lower}, {upper}] vs Clopper-Pearson [{cp_lower}, {cp_upper}]"
            );
        }
    }
    // More sessions at the same rate narrow it; a larger alpha narrows it.
    let wide = mixture_confidence_sequence(2, 40, 0.025);
    let narrow = mixture_confidence_sequence(20, 400, 0.025);
    assert!(narrow[1] - narrow[0] < wide[1] - wide[0]);
    let looser = mixture_confidence_sequence(20, 400, 0.1);
    assert!(looser[0] > narrow[0] && looser[1] < narrow[1]);
}

#[test]
fn the_seed_incident_is_implicated_in_the_right_direction() {
    // 14/80 vs 0/80 arriving in blocks of 20.
    let mut state = SequentialState::new(SequentialDesign::plan(goal()).unwrap());
    let on_blocks = [4, 3, 4, 3];
    let mut decisions = Vec::new();
    for corrupted in on_blocks {
        decisions.push(state.look((corrupted, 20), (0, 20)).unwrap());
        if decisions.last().unwrap().is_final() {
            break;
        }
    }
    assert_eq!(
        decisions.last(),
        Some(&Decision::Implicated {
            direction: Direction::On
        })
    );
    let last = state.looks().last().unwrap();
    assert!(last.e_value >= 100.0 && last.threshold == 100.0);
    assert!(state.looks()[..state.looks().len() - 1]
        .iter()
        .all(|l| l.e_value < 100.0 && l.decision == Decision::Continue));
    assert_eq!(state.decision(), decisions.last().copied());

    // The same data with the arms swapped implicate `off`, at the same look.
    let mut swapped = SequentialState::new(*state.design());
    for corrupted in on_blocks.iter().take(state.looks().len()) {
        swapped.look((0, 20), (*corrupted, 20)).unwrap();
    }
    assert_eq!(
        swapped.decision(),
        Some(Decision::Implicated {
            direction: Direction::Off
        })
    );
    assert_close!(swapped.e_value(), state.e_value(), 1e-9);
}

#[test]
fn clean_arms_are_cleared_when_the_interval_fits() {
    // 0/n vs 0/n: the difference interval is [-U(n), U(n)] with U the k = 0 bound at
    // clear_alpha / 2; U(120) > 0.05 > U(140) = 0.04695 (closed-form test above).
    let mut state = SequentialState::new(capped(400));
    let mut decision = Decision::Continue;
    while !decision.is_final() {
        decision = state.look((0, 20), (0, 20)).unwrap();
    }
    assert_eq!(decision, Decision::Cleared);
    assert_eq!(state.looks().len(), 7);
    let last = state.looks().last().unwrap();
    assert_close!(last.diff_interval[1], 0.04695443133591026, 1e-10);
    assert_close!(last.diff_interval[0], -0.04695443133591026, 1e-10);
    assert!(state.looks()[5].diff_interval[1] >= 0.05);
    assert_eq!(last.e_value, 1.0);
}

#[test]
fn the_cap_ends_undecided_with_the_interval() {
    let mut state = SequentialState::new(capped(60));
    assert_eq!(state.look((1, 20), (1, 20)).unwrap(), Decision::Continue);
    assert_eq!(state.look((1, 20), (1, 20)).unwrap(), Decision::Continue);
    let decision = state.look((1, 20), (1, 20)).unwrap();
    let Decision::Underpowered { interval } = decision else {
        panic!("expected underpowered, got {decision:?}");
    };
    assert_eq!(interval, state.looks()[2].diff_interval);
    assert!(interval[0] < -0.05 && interval[1] > 0.05);
    assert_eq!(state.tallies(), (tally(3, 60), tally(3, 60)));
    // A look after the end is refused rather than silently extending the experiment.
    assert_eq!(
        state.look((0, 20), (0, 20)),
        Err(LookError::Decided(decision))
    );
    // Bigger blocks than planned reach the cap by sessions.
    let mut state = SequentialState::new(capped(60));
    assert!(matches!(
        state.look((2, 60), (2, 60)).unwrap(),
        Decision::Underpowered { .. }
    ));
}

#[test]
fn intervals_never_widen_across_looks() {
    let mut state = SequentialState::new(capped(1000));
    for (on, off) in [(3, 1), (0, 2), (5, 0), (1, 1), (0, 0), (2, 3)] {
        state.look((on, 20), (off, 20)).unwrap();
    }
    for pair in state.looks().windows(2) {
        assert!(pair[1].diff_interval[0] >= pair[0].diff_interval[0]);
        assert!(pair[1].diff_interval[1] <= pair[0].diff_interval[1]);
    }
}

#[test]
fn impossible_counts_are_refused() {
    let mut state = SequentialState::new(capped(100));
    assert_eq!(
        state.look((21, 20), (0, 20)),
        Err(LookError::Counts {
            arm: "on",
            corrupted: 21,
            sessions: 20
        })
    );
    assert!(state.looks().is_empty());
    // Empty or uneven blocks (failed sessions) are fine.
    assert_eq!(state.look((0, 0), (0, 0)).unwrap(), Decision::Continue);
    assert_eq!(state.look((1, 17), (0, 20)).unwrap(), Decision::Continue);
    assert_eq!(state.tallies(), (tally(1, 17), tally(0, 20)));
}

#[test]
fn invalid_goals_are_refused() {
    let bad = |goal: DesignGoal| SequentialDesign::plan(goal).unwrap_err();
    assert!(matches!(
        bad(DesignGoal {
            alpha: 0.0,
            ..goal()
        }),
        DesignError::Invalid { name: "alpha", .. }
    ));
    assert!(matches!(
        bad(DesignGoal {
            baseline: 0.97,
            ..goal()
        }),
        DesignError::Invalid {
            name: "baseline",
            ..
        }
    ));
    assert!(matches!(
        bad(DesignGoal {
            block_per_arm: 0,
            ..goal()
        }),
        DesignError::Invalid {
            name: "block_per_arm",
            ..
        }
    ));
    assert!(SequentialDesign::with_cap(goal(), 0).is_err());
    // A difference too small to resolve within the planning horizon.
    assert_eq!(
        bad(DesignGoal {
            min_effect: 0.002,
            baseline: 0.3,
            block_per_arm: 500,
            ..goal()
        }),
        DesignError::Unreachable {
            power: 0.8,
            max_per_arm: 20_000
        }
    );
}

#[test]
fn records_serialise_for_run_json() {
    let mut state = SequentialState::new(capped(40));
    state.look((2, 20), (0, 20)).unwrap();
    state.look((3, 20), (1, 20)).unwrap();
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["design"]["max_per_arm"], 40);
    let look = &json["looks"][1];
    for key in [
        "look",
        "on",
        "off",
        "block_e_value",
        "e_value",
        "threshold",
        "rate_diff",
        "diff_interval",
        "decision",
    ] {
        assert!(look.get(key).is_some(), "{key}");
    }
    assert_eq!(
        look["on"],
        serde_json::json!({"corrupted": 5, "sessions": 40})
    );
    assert_eq!(look["decision"]["status"], "underpowered");
    let implicated = Decision::Implicated {
        direction: Direction::Off,
    };
    assert_eq!(
        serde_json::to_value(implicated).unwrap(),
        serde_json::json!({"status": "implicated", "direction": "off"})
    );
    let back: LookRecord = serde_json::from_value(look.clone()).unwrap();
    assert_eq!(back, state.looks()[1]);
    let resumed: SequentialState = serde_json::from_value(json).unwrap();
    assert_eq!(resumed, state);
}

#[test]
fn the_planned_cap_gives_the_power_and_is_deterministic() {
    let design = SequentialDesign::plan(goal()).unwrap();
    assert_eq!(design, SequentialDesign::plan(goal()).unwrap());
    assert_eq!(design.max_per_arm % design.block_per_arm, 0);
    let fixed = stats::sessions_per_arm(0.01, 0.05, 0.01, 0.8);
    assert!(
        design.max_per_arm > fixed && design.max_per_arm < 2 * fixed,
        "cap {} vs fixed {fixed}",
        design.max_per_arm
    );
    // An independent simulation at the design point reaches the power.
    let at_design = design.simulate(0.06, 0.01, 2000, 7);
    assert!(at_design.implicated >= 0.78, "{at_design:?}");
    assert_eq!(at_design.wrong_direction, 0.0);
}

#[test]
fn simulated_false_positive_rate_stays_below_alpha() {
    let design = SequentialDesign::plan(DesignGoal {
        alpha: 0.05,
        ..goal()
    })
    .unwrap();
    for p in [0.02, 0.18] {
        let null = design.simulate(p, p, 2000, 11);
        assert!(null.implicated <= 0.05, "A/A at {p}: {null:?}");
    }
}

#[test]
fn cost_model_trades_restarts_for_sessions() {
    let blocks = [10, 40];
    let cheap_restarts = CostModel {
        session_s: 10.0,
        restart_s: 0.0,
    };
    let dear_restarts = CostModel {
        session_s: 1.0,
        restart_s: 10_000.0,
    };
    assert_eq!(
        SequentialDesign::plan_for_cost(goal(), cheap_restarts, &blocks)
            .unwrap()
            .block_per_arm,
        10
    );
    assert_eq!(
        SequentialDesign::plan_for_cost(goal(), dear_restarts, &blocks)
            .unwrap()
            .block_per_arm,
        40
    );
    assert!(SequentialDesign::plan_for_cost(goal(), dear_restarts, &[]).is_err());
    assert_eq!(cheap_restarts.seconds(100.0, 3.0), 1000.0);
    assert_eq!(dear_restarts.seconds(100.0, 3.0), 60_100.0);
}

mod group_sequential_boundaries {
    use super::super::group_sequential::*;

    fn assert_all_close(actual: &[f64], expected: &[f64], tolerance: f64) {
        assert_eq!(actual.len(), expected.len());
        for (a, e) in actual.iter().zip(expected) {
            assert!((a - e).abs() <= tolerance, "{actual:?} vs {expected:?}");
        }
    }

    // O'Brien and Fleming (1979); Jennison and Turnbull (2000) Table 2.3:
    // C_B(5, 0.05) = 2.040, boundaries C sqrt(5/k).
    #[test]
    fn classical_obrien_fleming_five_looks() {
        let boundaries = classical_obrien_fleming(0.05, 5);
        assert_all_close(&boundaries, &[4.562, 3.226, 2.634, 2.281, 2.040], 0.002);
    }

    // Lan-DeMets O'Brien-Fleming-type spending, 5 equally spaced looks, two-sided 0.05
    // (gsDesign sfLDOF and rpact typeOfDesign "asOF" print 4.877, 3.357, 2.680, 2.290,
    // 2.031).
    #[test]
    fn lan_demets_obrien_fleming_five_looks() {
        let fractions = [0.2, 0.4, 0.6, 0.8, 1.0];
        let boundaries = spending_boundaries(0.05, &fractions);
        assert_all_close(&boundaries, &[4.877, 3.357, 2.680, 2.290, 2.031], 0.002);
        let total = rejection_probability(&boundaries, &fractions, 0.0);
        assert!((total - 0.05).abs() < 1e-5, "{total}");
    }

    #[test]
    fn one_look_is_the_fixed_test() {
        assert!((spending_boundaries(0.05, &[1.0])[0] - 1.959964).abs() < 1e-5);
        assert!((obrien_fleming_spent(0.01, 1.0) - 0.01).abs() < 1e-12);
        assert_eq!(obrien_fleming_spent(0.01, 0.0), 0.0);
    }

    // Jennison and Turnbull (2000) Table 2.3: R_B(5, 0.05, 0.2) = 1.028 for the
    // classical O'Brien-Fleming test.
    #[test]
    fn inflation_factor_matches_the_table() {
        let fractions = [0.2, 0.4, 0.6, 0.8, 1.0];
        let boundaries = classical_obrien_fleming(0.05, 5);
        let r = inflation_factor(0.05, 0.8, &boundaries, &fractions);
        assert!((r - 1.028).abs() < 0.002, "{r}");
    }
}
