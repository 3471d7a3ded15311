//! The history's evidence against an independent computation, its validity under the
//! null by a seeded simulation, and each state rule, reset and ending.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use statrs::function::beta::ln_beta;

use super::*;
use crate::sequential::draw_binomial;

/// [`assess`] with the nights labelled `n0`, `n1`, ...
fn assess_all(grid: &[Vec<CellNight>], policy: &HistoryPolicy) -> HistoryAssessment {
    let labels: Vec<String> = (0..grid[0].len()).map(|i| format!("n{i}")).collect();
    assess(grid, &labels, policy)
}

fn measured(chain: &str, corrupted: u64, judged: u64) -> CellNight {
    CellNight {
        chain: chain.into(),
        observation: Observation::Measured {
            tally: Tally::new(corrupted, judged),
            insufficient: None,
        },
    }
}

/// ln of the Jeffreys marginal by quadrature (u -> p = u^2, dense near 0).
fn ln_marginal_by_quadrature(t: Tally) -> f64 {
    let n = 200_000;
    let norm = ln_beta(0.5, 0.5);
    let (k, m) = (t.corrupted as f64, (t.judged - t.corrupted) as f64);
    let mut sum = 0.0;
    for i in 0..n {
        let u = (i as f64 + 0.5) / n as f64;
        let p = u * u;
        let ln = (k - 0.5) * p.ln() + (m - 0.5) * (1.0 - p).ln() - norm;
        sum += ln.exp() * 2.0 * u / n as f64;
    }
    sum.ln()
}

fn ln_lik(p: f64, t: Tally) -> f64 {
    let k = t.corrupted as f64;
    let m = (t.judged - t.corrupted) as f64;
    (if k > 0.0 { k * p.ln() } else { 0.0 }) + (if m > 0.0 { m * (1.0 - p).ln() } else { 0.0 })
}

#[test]
fn the_split_e_value_matches_its_integral() {
    for (low, high) in [
        (Tally::new(0, 40), Tally::new(3, 40)),
        (Tally::new(1, 60), Tally::new(6, 30)),
        (Tally::new(2, 50), Tally::new(2, 50)),
        (Tally::new(5, 50), Tally::new(0, 50)),
    ] {
        let ln_q = ln_marginal_by_quadrature(low) + ln_marginal_by_quadrature(high);
        let ln_d = if high.rate() <= low.rate() {
            ln_lik(low.rate(), low) + ln_lik(high.rate(), high)
        } else {
            let p = (low + high).rate();
            ln_lik(p, low) + ln_lik(p, high)
        };
        let reference = (ln_q - ln_d).exp();
        let ours = evidence::split_e_value(low, high);
        assert!(
            (ours / reference - 1.0).abs() < 1e-3,
            "{low:?} {high:?}: {ours} vs {reference}"
        );
    }
    // Magnitudes: 0/40 then 3/40 is no evidence, 1/60 then 6/30 some (the mixture pays
    // for not knowing either rate), 1/200 then 12/60 strong, equal rates and a fall none.
    let weak = evidence::split_e_value(Tally::new(0, 40), Tally::new(3, 40));
    assert!(weak < 1.0, "{weak}");
    let some = evidence::split_e_value(Tally::new(1, 60), Tally::new(6, 30));
    assert!((1.0..20.0).contains(&some), "{some}");
    let strong = evidence::split_e_value(Tally::new(1, 200), Tally::new(12, 60));
    assert!(strong > 1000.0, "{strong}");
    assert!(evidence::split_e_value(Tally::new(2, 50), Tally::new(2, 50)) < 1.0);
    assert!(evidence::split_e_value(Tally::new(5, 50), Tally::new(0, 50)) < 0.05);
}

#[test]
fn under_a_constant_rate_the_evidence_seldom_ever_crosses() {
    // 2000 histories of 20 nights of 64 sessions at a constant 2%: the share whose
    // mixture e-value ever reaches 1/alpha is at most alpha (Ville), here far below.
    let mut rng = ChaCha8Rng::seed_from_u64(46);
    let alpha = 0.05;
    let mut crossed = 0;
    for _ in 0..2000 {
        let mut chain = Vec::new();
        for _ in 0..20 {
            chain.push(Tally::new(draw_binomial(&mut rng, 64, 0.02), 64));
            if chain_evidence(&chain, Change::Rise).e_value.unwrap_or(0.0) >= 1.0 / alpha {
                crossed += 1;
                break;
            }
        }
    }
    assert!(crossed <= 100, "{crossed} of 2000 crossed 1/alpha");
}

#[test]
fn a_persistent_three_point_rise_adds_up_and_one_such_night_does_not() {
    // Five nights at 0 of 128, then 3.5% (about 4-5 of 128) every night.
    let policy = HistoryPolicy::default();
    let base = [0, 0, 0, 0, 0];
    let after = [5, 4, 5, 4, 5, 4];
    let cell = |tail: &[u64]| -> Vec<CellNight> {
        base.iter()
            .chain(tail)
            .map(|&k| measured("c", k, 128))
            .collect()
    };
    let persistent = cell(&after);
    let one_night: Vec<CellNight> = cell(&[5, 0, 0, 0, 0, 0]);
    let quiet: Vec<CellNight> = cell(&[0; 6]);
    let out = assess_all(&[persistent, one_night, quiet], &policy);
    let states = |c: usize| -> Vec<State> { out.cells[c].iter().map(|a| a.state).collect() };
    let first = states(0)
        .iter()
        .position(|&s| s == State::Regression)
        .unwrap();
    assert!(first > 5, "flagged on the first bad night: {:?}", states(0));
    // Five nights of 128 sessions at 3.5% add up to a verdict (e-BH over 3 cells).
    assert!(
        first <= 10,
        "not flagged within five nights: {:?}",
        states(0)
    );
    assert_eq!(out.events[0].first_bad_night, 5);
    assert_eq!(out.events[0].last_good_night, 4);
    assert!(
        states(1).iter().all(|&s| s != State::Regression),
        "{:?}",
        states(1)
    );
    // The noisy night itself is suspicious (alone above its chain), not a regression.
    assert_eq!(states(1)[5], State::Suspicious);
    assert!(states(2).iter().all(|&s| s == State::Ok));
}

#[test]
fn a_large_rise_is_flagged_on_its_night_and_not_before() {
    let policy = HistoryPolicy::default();
    let rates = [0, 0, 1, 0, 0, 0, 0, 12, 14, 11];
    let cell: Vec<CellNight> = rates.iter().map(|&k| measured("c", k, 96)).collect();
    let out = assess_all(
        &[cell, (0..10).map(|_| measured("d", 0, 96)).collect()],
        &policy,
    );
    let states: Vec<State> = out.cells[0].iter().map(|a| a.state).collect();
    assert_eq!(
        states.iter().position(|&s| s == State::Regression),
        Some(7),
        "{states:?}"
    );
    let e = &out.events[0];
    assert_eq!(
        (e.flagged_night, e.first_bad_night, e.last_good_night),
        (7, 7, 6)
    );
    // Open afterwards: still a regression on the later nights.
    assert_eq!(states[8..], [State::Regression, State::Regression]);
    assert!(out.events[0].is_open());
}

#[test]
fn missing_and_insufficient_nights_are_labelled() {
    let policy = HistoryPolicy::default();
    let mut cell: Vec<CellNight> = (0..6).map(|_| measured("c", 0, 128)).collect();
    cell[2] = CellNight::missing("no record of this night");
    cell[4] = CellNight {
        chain: "c".into(),
        observation: Observation::Measured {
            tally: Tally::new(0, 40),
            insufficient: Some("judged 40 of 128 planned sessions".into()),
        },
    };
    cell[5] = CellNight {
        chain: "c".into(),
        observation: Observation::Unfit {
            tally: Tally::new(9, 128),
            why: vec!["the engine died 2 times".into()],
        },
    };
    let out = assess_all(&[cell], &policy);
    let a = &out.cells[0];
    assert_eq!(a[2].state, State::Missing);
    assert_eq!(a[2].reasons[0], "no record of this night");
    assert_eq!(a[4].state, State::Insufficient);
    // Under-sampled sessions count: 3 nights of 128 (night 2 is missing) and one of 40.
    assert_eq!(a[4].chain_nights, 4);
    // An unfit night's sessions do not, whatever they show.
    assert_eq!(a[5].state, State::Insufficient);
    assert_eq!(a[5].chain_nights, 4);
    assert!(out.events.is_empty());
}

#[test]
fn a_changed_chain_starts_the_evidence_again_and_closes_an_open_regression() {
    let policy = HistoryPolicy::default();
    // Strong rise at night 4, then the plan changes at night 6 (chain "c2").
    let mut cell: Vec<CellNight> = [0, 0, 0, 0, 20, 22]
        .iter()
        .map(|&k| measured("c1", k, 96))
        .collect();
    cell.push(measured("c2", 21, 96));
    cell.push(measured("c2", 20, 96));
    let out = assess_all(&[cell], &policy);
    let a = &out.cells[0];
    assert_eq!(a[4].state, State::Regression);
    assert_eq!(
        a[6].reset.as_deref().map(|r| r.contains("starts again")),
        Some(true)
    );
    assert_eq!(a[6].chain_nights, 1);
    assert_eq!(a[6].e_rise, None);
    // The new chain has its high rate from its start: no rise within it.
    assert_eq!(a[6].state, State::Ok);
    assert_eq!(a[7].state, State::Ok);
    assert_eq!(out.events[0].ended, Some((6, Ending::Reset)));
    // Without the change, the same counts stay an open regression.
    let same: Vec<CellNight> = [0, 0, 0, 0, 20, 22, 21, 20]
        .iter()
        .map(|&k| measured("c1", k, 96))
        .collect();
    let out = assess_all(&[same], &policy);
    assert_eq!(out.cells[0][7].state, State::Regression);
}

#[test]
fn a_regression_that_falls_back_is_mended() {
    let policy = HistoryPolicy::default();
    let cell: Vec<CellNight> = [0, 0, 0, 0, 20, 22, 18, 0, 0, 0, 0]
        .iter()
        .map(|&k| measured("c", k, 96))
        .collect();
    let out = assess_all(&[cell], &policy);
    let states: Vec<State> = out.cells[0].iter().map(|a| a.state).collect();
    let mended = out.events[0].ended.expect("mended");
    assert_eq!(mended.1, Ending::Mended);
    assert!(mended.0 >= 7 && mended.0 <= 9, "{mended:?}");
    assert_eq!(states[mended.0], State::Ok);
    assert_eq!(states[10], State::Ok);
    assert!(out.cells[0][mended.0].reasons[0].contains("mended"));
}

#[test]
fn a_second_rise_on_an_open_regression_supersedes_it() {
    let policy = HistoryPolicy::default();
    let cell: Vec<CellNight> = [0, 0, 0, 0, 10, 9, 11, 10, 40, 42]
        .iter()
        .map(|&k| measured("c", k, 128))
        .collect();
    let out = assess_all(&[cell], &policy);
    assert_eq!(out.events.len(), 2, "{:?}", out.events);
    assert_eq!(out.events[0].ended.map(|e| e.1), Some(Ending::Superseded));
    assert_eq!(out.events[1].first_bad_night, 8);
    assert_eq!(out.events[1].last_good_night, 7);
}

#[test]
fn e_bh_across_cells_holds_back_a_lone_borderline_cell() {
    // The same borderline evidence passes with one cell and not with forty.
    let policy = HistoryPolicy::default();
    let borderline: Vec<CellNight> = [0, 0, 0, 0, 0, 5, 4, 5, 4, 5]
        .iter()
        .map(|&k| measured("c", k, 128))
        .collect();
    let alone = assess_all(std::slice::from_ref(&borderline), &policy);
    let e = alone.cells[0][9].e_rise.unwrap();
    assert_eq!(alone.cells[0][9].state, State::Regression);
    let mut many = vec![borderline];
    many.extend((0..39).map(|_| (0..10).map(|_| measured("q", 0, 128)).collect()));
    let crowd = assess_all(&many, &policy);
    assert!((100.0..4000.0).contains(&e), "pick a borderline case: {e}");
    assert_ne!(crowd.cells[0][9].state, State::Regression);
    assert_eq!(crowd.cells[0][9].state, State::Suspicious);
    assert_eq!(crowd.family, 40);
}
