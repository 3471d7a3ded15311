//! The commit search on scripted ranges, scored against what a correct search answers,
//! side by side with plain bisection (`git bisect run bisect probe`: one block per
//! commit, the probe's decision rule, "could not tell" skipped as git skips exit 125) and
//! bisection with each probe repeated r times (r blocks pooled, the same rule): the
//! benchmark of `bisect commits --simulate` (docs/commits.md).
//!
//! A range has N commits after the good end (indices 0..=N). Sessions are independent
//! draws (ChaCha8 from a fixed seed) at the rate of the commit's side; a block whose load
//! falls short runs at the good rate (a load-dependent bug does not fire), which the
//! search sees as "could not tell" and a probe counts as it comes; unbuildable commits
//! cost a build and give nothing. Costs: [`BUILD_S`] per build, [`BLOCK_S`] per block.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::observation::judge_pair;
use super::posterior::answer_sets;
use super::search::{Action, Answer, Observation, Params, Search, Spent};
use crate::sequential::draw_binomial;
use crate::stats;

/// Seconds of one build in the cost model (an engine's wheel or image).
pub(crate) const BUILD_S: f64 = 600.0;
/// Seconds of one block of sessions at the load, restart included.
pub(crate) const BLOCK_S: f64 = 120.0;
/// `bisect probe`'s defaults: corrupted above this background...
pub(crate) const PROBE_BACKGROUND: f64 = 0.02;
/// ...clean below this bug rate (Wilson 95% bounds).
pub(crate) const PROBE_BUG_RATE: f64 = 0.10;

/// A kind of range.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    /// Rate before the (first) culprit, and the background of the whole range.
    pub good: f64,
    /// Rate from the (last) culprit on; equal to `good` for a flake-only range.
    pub bad: f64,
    /// Two culprits: the rate between them.
    pub mid: Option<f64>,
    /// Share of blocks whose load falls short (they run at `good`).
    pub(crate) short_load: f64,
    /// Unbuildable commits just before the culprit, and just after it.
    pub(crate) unbuildable: (usize, usize),
    /// Share of blocks that reach the load yet run at a quarter of their rate, with
    /// nothing to tell them apart (the machine got busy and the race fired less): a rate
    /// that drifts between blocks.
    pub(crate) dip: f64,
    /// `--flag`: each step is the flag's A/B, the rates above the on arm's and this the
    /// off arm's everywhere (a pair whose off arm corrupts above the background could
    /// not tell). Bisection probes the on arm alone.
    pub(crate) off_arm: Option<f64>,
}

impl Scenario {
    const fn new(name: &'static str, good: f64, bad: f64) -> Self {
        Scenario {
            name,
            good,
            bad,
            mid: None,
            short_load: 0.0,
            unbuildable: (0, 0),
            dip: 0.0,
            off_arm: None,
        }
    }

    fn has_culprit(&self) -> bool {
        self.bad != self.good
    }
}

/// The scenarios of the issue.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario::new("deterministic", 0.0, 1.0),
        Scenario::new("18% vs 0%", 0.0, 0.18),
        Scenario::new("12% vs 1%", 0.01, 0.12),
        Scenario::new("5% vs 1%", 0.01, 0.05),
        Scenario::new("flake-only 2%", 0.02, 0.02),
        Scenario {
            short_load: 0.2,
            ..Scenario::new("15% only at load, 20% of blocks short", 0.0, 0.15)
        },
        Scenario {
            unbuildable: (4, 2),
            ..Scenario::new("15% vs 0%, 6 unbuildable around it", 0.0, 0.15)
        },
        Scenario {
            mid: Some(0.09),
            ..Scenario::new("two culprits 0% -> 9% -> 18%", 0.0, 0.18)
        },
        Scenario {
            dip: 0.2,
            ..Scenario::new("15% vs 0%, 20% of blocks at a quarter of it", 0.0, 0.15)
        },
        Scenario {
            off_arm: Some(0.01),
            ..Scenario::new("--flag: on 15% vs 0%, off 1% everywhere", 0.0, 0.15)
        },
    ]
}

/// One drawn range.
struct Range {
    n: usize,
    /// First culprit, and the second (equal when one).
    culprits: (usize, usize),
    unbuildable: Vec<bool>,
}

impl Range {
    fn draw(s: &Scenario, n: usize, rng: &mut ChaCha8Rng) -> Self {
        let (before, after) = s.unbuildable;
        let c = rng.random_range(1 + before..=n - after);
        let second = if s.mid.is_some() {
            let mut d = rng.random_range(1..=n);
            while d == c {
                d = rng.random_range(1..=n);
            }
            d
        } else {
            c
        };
        let mut unbuildable = vec![false; n + 1];
        for flag in &mut unbuildable[c.saturating_sub(before)..c] {
            *flag = true;
        }
        for flag in unbuildable
            .iter_mut()
            .take((c + after).min(n - 1) + 1)
            .skip(c + 1)
        {
            *flag = true;
        }
        Range {
            n,
            culprits: (c.min(second), c.max(second)),
            unbuildable,
        }
    }

    fn rate(&self, s: &Scenario, i: usize) -> f64 {
        if i < self.culprits.0 {
            s.good
        } else if i < self.culprits.1 {
            s.mid.unwrap_or(s.bad)
        } else {
            s.bad
        }
    }

    /// The answer sets a correct search may name (empty: "no culprit").
    fn expected(&self, s: &Scenario) -> Vec<(usize, usize)> {
        if !s.has_culprit() {
            return Vec::new();
        }
        let sets = answer_sets(&self.unbuildable);
        let holding = |c: usize| sets.iter().copied().find(|&(f, l)| f <= c && c <= l);
        let mut out: Vec<_> = [self.culprits.0, self.culprits.1]
            .into_iter()
            .filter_map(holding)
            .collect();
        out.dedup();
        out
    }

    /// One block at commit i: (the search's observation, what a probe counts).
    fn block(&self, s: &Scenario, i: usize, n: u64, rng: &mut ChaCha8Rng) -> (Observation, u64) {
        let short = rng.random::<f64>() < s.short_load;
        let rate = if short { s.good } else { self.rate(s, i) };
        // Drawn only where the scenario has dips, so the other scenarios' draws stay.
        let rate = if s.dip > 0.0 && rng.random::<f64>() < s.dip {
            rate / 4.0
        } else {
            rate
        };
        let k = draw_binomial(rng, n, rate);
        let obs = if short {
            Observation::CouldNotTell {
                reason: "the load fell short".into(),
            }
        } else {
            Observation::Block {
                corrupted: k,
                judged: n,
            }
        };
        (obs, k)
    }
}

/// How one search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Right,
    Wrong,
    /// Inconclusive, or a culprit whose verification failed.
    NoAnswer,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    verdict: Verdict,
    builds: u64,
    sessions: u64,
    /// Rounds of blocks run side by side (a bisection's probe is one).
    rounds: u64,
}

/// One method's results over many searches.
#[derive(Debug, Clone, Serialize)]
pub struct Scored {
    pub method: String,
    pub searches: usize,
    pub accuracy: f64,
    pub wrong: f64,
    pub mean_builds: f64,
    pub(crate) p95_builds: u64,
    pub mean_sessions: f64,
    pub p95_sessions: u64,
    pub mean_rounds: f64,
    pub(crate) p95_rounds: u64,
}

fn score(method: String, runs: &[Run]) -> Scored {
    let share = |v: Verdict| {
        runs.iter().filter(|r| r.verdict == v).count() as f64 / runs.len().max(1) as f64
    };
    let p95 = |mut xs: Vec<u64>| {
        xs.sort_unstable();
        xs.get(((xs.len() as f64 * 0.95).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0)
    };
    let mean = |xs: &[u64]| xs.iter().sum::<u64>() as f64 / xs.len().max(1) as f64;
    let builds: Vec<u64> = runs.iter().map(|r| r.builds).collect();
    let sessions: Vec<u64> = runs.iter().map(|r| r.sessions).collect();
    let rounds: Vec<u64> = runs.iter().map(|r| r.rounds).collect();
    Scored {
        method,
        searches: runs.len(),
        accuracy: share(Verdict::Right),
        wrong: share(Verdict::Wrong),
        mean_builds: mean(&builds),
        p95_builds: p95(builds.clone()),
        mean_sessions: mean(&sessions),
        p95_sessions: p95(sessions),
        mean_rounds: mean(&rounds),
        p95_rounds: p95(rounds),
    }
}

/// The commit search on one range.
fn run_search(s: &Scenario, range: &Range, params: &Params, rng: &mut ChaCha8Rng) -> Run {
    let mut search = Search::new(Params {
        commits: range.n + 1,
        build_s_guess: BUILD_S,
        block_s_guess: BLOCK_S,
        flag: s.off_arm.map(|_| "FLAG".to_string()),
        ..params.clone()
    });
    let mut built = vec![false; range.n + 1];
    let mut rounds = 0;
    let answer = loop {
        let round = match search.next_round() {
            Action::Done(answer) => break answer,
            Action::Round(round) => round,
        };
        rounds += 1;
        for test in round {
            let commit = test.commit;
            let build_s = (!built[commit]).then_some(BUILD_S);
            built[commit] = true;
            if range.unbuildable[commit] {
                let obs = Observation::Untestable {
                    reason: "build failed".into(),
                };
                let spent = Spent {
                    build_s,
                    ..Spent::default()
                };
                search.observe(test, &obs, spent);
                continue;
            }
            let (obs, _) = range.block(s, commit, params.block, rng);
            let obs = match s.off_arm {
                None => obs,
                Some(rate) => {
                    let off = Observation::Block {
                        corrupted: draw_binomial(rng, params.block, rate),
                        judged: params.block,
                    };
                    judge_pair("FLAG", obs, Some(off), search.params().background)
                }
            };
            let spent = Spent {
                build_s,
                block_s: Some(BLOCK_S),
                sessions: search.params().step_sessions(),
            };
            search.observe(test, &obs, spent);
        }
    };
    let expected = range.expected(s);
    let verdict = match answer {
        Answer::Culprit {
            verified: false, ..
        }
        | Answer::Inconclusive { .. } => Verdict::NoAnswer,
        // A range is right when it holds a culprit: commits the search could not test
        // (a build, or a load that kept falling short) widen it, and it says so.
        Answer::Culprit { first, last, .. }
            if expected.contains(&(first, last))
                || [range.culprits.0, range.culprits.1]
                    .iter()
                    .any(|c| (first..=last).contains(c)) =>
        {
            Verdict::Right
        }
        Answer::NoCulprit { .. } | Answer::CouldNotReproduce { .. } if expected.is_empty() => {
            Verdict::Right
        }
        _ => Verdict::Wrong,
    };
    Run {
        verdict,
        builds: built.iter().filter(|b| **b).count() as u64,
        sessions: search.sessions(),
        rounds,
    }
}

/// `bisect probe`'s rule on `k` of `n`: Some(true) corrupted, Some(false) clean, None
/// could not tell (the Wilson 95% interval against the background and the bug rate).
pub(crate) fn probe_rule(k: u64, n: u64) -> Option<bool> {
    let (lo, hi) = stats::wilson(k, n, 0.95);
    if lo > PROBE_BACKGROUND {
        Some(true)
    } else if hi < PROBE_BUG_RATE {
        Some(false)
    } else {
        None
    }
}

/// Bisection trusting the ends, each probe `repeats` blocks pooled; "could not tell" and
/// unbuildable commits skipped (the nearest to the middle is tried instead, as git does).
fn run_bisection(
    s: &Scenario,
    range: &Range,
    block: u64,
    repeats: u64,
    rng: &mut ChaCha8Rng,
) -> Run {
    let (mut lo, mut hi) = (0, range.n);
    let mut skipped = vec![false; range.n + 1];
    let (mut builds, mut sessions, mut rounds) = (0, 0, 0);
    loop {
        let mid = (lo + hi) / 2;
        let Some(c) = (lo + 1..hi)
            .filter(|&c| !skipped[c])
            .min_by_key(|&c| (c.abs_diff(mid), c))
        else {
            break;
        };
        builds += 1;
        rounds += 1;
        if range.unbuildable[c] {
            skipped[c] = true;
            continue;
        }
        let k: u64 = (0..repeats).map(|_| range.block(s, c, block, rng).1).sum();
        sessions += repeats * block;
        match probe_rule(k, repeats * block) {
            Some(true) => hi = c,
            Some(false) => lo = c,
            None => skipped[c] = true,
        }
    }
    let expected = range.expected(s);
    let verdict = if expected.contains(&(lo + 1, hi)) {
        Verdict::Right
    } else {
        Verdict::Wrong
    };
    Run {
        verdict,
        builds,
        sessions,
        rounds,
    }
}

/// `searches` ranges of `n` commits per method: the commit search, then bisection with
/// each of `repeats` blocks per probe (1 is plain bisection). The same ranges for every
/// method (the range's seed is the search's).
pub fn benchmark(
    s: &Scenario,
    n: usize,
    searches: usize,
    params: &Params,
    repeats: &[u64],
    seed: u64,
) -> Vec<Scored> {
    let ranges = |rng: &mut ChaCha8Rng| Range::draw(s, n, rng);
    let mut out = Vec::new();
    let runs: Vec<Run> = (0..searches as u64)
        .map(|i| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let range = ranges(&mut rng);
            run_search(s, &range, params, &mut rng)
        })
        .collect();
    out.push(score("commit search".into(), &runs));
    for &r in repeats {
        let runs: Vec<Run> = (0..searches as u64)
            .map(|i| {
                let mut rng =
                    ChaCha8Rng::seed_from_u64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let range = ranges(&mut rng);
                run_bisection(s, &range, params.block, r, &mut rng)
            })
            .collect();
        let name = if r == 1 {
            "plain bisection".to_string()
        } else {
            format!("bisection, {r} blocks per probe")
        };
        out.push(score(name, &runs));
    }
    out
}

/// The search at each `--parallel` of `ks` beside plain bisection, on the same ranges:
/// accuracy, wrong answers, rounds (blocks run side by side count once), builds and
/// sessions; a markdown table per size.
pub fn parallel_markdown(searches: usize, sizes: &[usize], ks: &[u32], seed: u64) -> String {
    let mut out = format!(
        "Commit search with K blocks per round, {searches} ranges per scenario, seed {seed}; \
         a round's blocks run side by side (plain bisection: one probe a round).\n"
    );
    let picked: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| ["18% vs 0%", "12% vs 1%", "5% vs 1%", "flake-only 2%"].contains(&s.name))
        .collect();
    for &n in sizes {
        out += &format!(
            "\n### {n} commits, K blocks a round\n\n| scenario | method | accuracy | wrong | rounds mean / p95 | builds mean / p95 | sessions mean / p95 |\n|---|---|---|---|---|---|---|\n"
        );
        for s in &picked {
            let (mut rows, mut bisection) = (Vec::new(), Vec::new());
            for (i, &k) in ks.iter().enumerate() {
                let mut params = Params::new(2, 80, 80);
                params.parallel = k;
                // Plain bisection once, beside the first K (its rows do not depend on K).
                let repeats: &[u64] = if i == 0 { &[1] } else { &[] };
                let mut scored = benchmark(s, n, searches, &params, repeats, seed);
                scored[0].method = format!("commit search, K = {k}");
                bisection.extend(scored.drain(1..));
                rows.push(scored.remove(0));
            }
            rows.extend(bisection);
            for r in rows {
                out += &format!(
                    "| {} | {} | {:.3} | {:.3} | {:.1} / {} | {:.1} / {} | {:.0} / {} |\n",
                    s.name,
                    r.method,
                    r.accuracy,
                    r.wrong,
                    r.mean_rounds,
                    r.p95_rounds,
                    r.mean_builds,
                    r.p95_builds,
                    r.mean_sessions,
                    r.p95_sessions
                );
            }
        }
    }
    out
}

/// Blocks per probe of the repeated bisections the benchmark sets beside the search.
pub(crate) const REPEATS: [u64; 4] = [1, 2, 3, 5];

/// Every scenario at every size: a markdown table per size (accuracy; wrong answers;
/// mean and p95 builds and sessions), `searches` ranges each, from `seed`.
pub fn benchmark_markdown(searches: usize, sizes: &[usize], seed: u64) -> String {
    let params = Params::new(2, 80, 80);
    let mut out = format!(
        "Commit search vs bisection, {searches} ranges per scenario, blocks of {} sessions, alpha {}, \
         cost model {BUILD_S:.0} s a build, {BLOCK_S:.0} s a block, seed {seed}.\n",
        params.block, params.alpha
    );
    for &n in sizes {
        out += &format!(
            "\n### {n} commits\n\n| scenario | method | accuracy | wrong | builds mean / p95 | sessions mean / p95 |\n|---|---|---|---|---|---|\n"
        );
        for s in scenarios() {
            for r in benchmark(&s, n, searches, &params, &REPEATS, seed) {
                out += &format!(
                    "| {} | {} | {:.3} | {:.3} | {:.1} / {} | {:.0} / {} |\n",
                    s.name,
                    r.method,
                    r.accuracy,
                    r.wrong,
                    r.mean_builds,
                    r.p95_builds,
                    r.mean_sessions,
                    r.p95_sessions
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params::new(65, 80, 80)
    }

    fn find<'a>(scored: &'a [Scored], method: &str) -> &'a Scored {
        scored.iter().find(|s| s.method == method).unwrap()
    }

    #[test]
    fn probe_rule_is_the_probes() {
        // As `bisect probe`'s decision table: 14/80 corrupted, 0/80 and 2/80 clean,
        // 3/80 and 0/10 could not tell.
        assert_eq!(probe_rule(14, 80), Some(true));
        assert_eq!(probe_rule(0, 80), Some(false));
        assert_eq!(probe_rule(2, 80), Some(false));
        assert_eq!(probe_rule(3, 80), None);
        assert_eq!(probe_rule(0, 10), None);
    }

    #[test]
    fn ranges_place_unbuildable_commits_around_the_culprit() {
        let s = &scenarios()[6];
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..50 {
            let r = Range::draw(s, 64, &mut rng);
            let c = r.culprits.0;
            assert!((c - 4..c).all(|i| r.unbuildable[i]));
            assert!(!r.unbuildable[c] && !r.unbuildable[64] && !r.unbuildable[0]);
            // The culprit's set reaches back over the four before it.
            assert_eq!(r.expected(s), vec![(c - 4, c)]);
        }
    }

    #[test]
    fn the_search_beats_plain_bisection_where_it_should() {
        // 50 ranges of 64 commits per scenario, fixed seed; margins far from the measured
        // figures (docs/commits.md).
        let all = scenarios();
        let strong = benchmark(&all[1], 64, 50, &params(), &[1], 7);
        assert!(find(&strong, "commit search").accuracy >= 0.9, "{strong:?}");
        assert_eq!(find(&strong, "commit search").wrong, 0.0, "{strong:?}");
        let flaky = benchmark(&all[4], 64, 50, &params(), &[1], 7);
        assert!(find(&flaky, "commit search").accuracy >= 0.9, "{flaky:?}");
        // Bisection has no "no culprit": it names a commit every time.
        assert_eq!(find(&flaky, "plain bisection").accuracy, 0.0);
        let unbuildable = benchmark(&all[6], 64, 50, &params(), &[1], 7);
        assert!(
            find(&unbuildable, "commit search").accuracy >= 0.9,
            "{unbuildable:?}"
        );
        let short = benchmark(&all[5], 64, 50, &params(), &[1], 7);
        let (search, plain) = (
            find(&short, "commit search"),
            find(&short, "plain bisection"),
        );
        assert!(search.accuracy >= 0.9 && plain.accuracy < 0.8, "{short:?}");
    }

    #[test]
    fn four_blocks_a_round_halve_the_rounds_and_stay_right() {
        // 50 ranges of 64 commits at 18% vs 0% and flake-only, fixed seed; the measured
        // figures (docs/commits.md) are 12.0 vs 6.0 rounds and 13.5 vs 6.8.
        let all = scenarios();
        for s in [&all[1], &all[4]] {
            let one = benchmark(s, 64, 50, &params(), &[], 7).remove(0);
            let mut four = params();
            four.parallel = 4;
            let four = benchmark(s, 64, 50, &four, &[], 7).remove(0);
            assert!(four.accuracy >= 0.9 && four.wrong == 0.0, "{four:?}");
            assert!(
                four.mean_rounds <= 0.6 * one.mean_rounds,
                "{one:?} {four:?}"
            );
        }
    }
}
