//! Scripted outcome oracles for the culprit search: a block runner that draws every
//! session's class from a known model of which flag values break the engine, so the real
//! search code ([`search()`]) can be run thousands of times and scored
//! (`cargo bench --bench culprit`, and the deterministic tests in `tests.rs`). Beside it, the
//! baseline it replaces: plain one-at-a-time A/B, each flag flipped alone against the
//! configuration as it is, 80 + 80 sessions per flag, Fisher's exact test with Holm's
//! adjustment across the flags at alpha (the implicated flags are the answer).
//!
//! Sessions are independent draws (ChaCha8 from a fixed seed): an error/timeout share
//! when a degrading flag is flipped, else a corruption rate (background, plus the bug's
//! rate when its rule holds at the block's concurrency), corrupted sessions split among
//! leak / bad_args / wrong_args / no_tool by the failure's class mix.

use std::collections::BTreeSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{search, Answer, BlockOutcome, BlockRequest, FlagValues, SearchParams};
use crate::session::SessionClass;
use crate::stats;

/// When the bug fires.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// When every one of these flags is at its failing value (an interaction for 2+).
    All(Vec<usize>),
    /// Whatever the listed flags: the bug lives elsewhere.
    Always,
    /// When any one of these is at its failing value (two independent causes).
    Any(Vec<usize>),
}

/// What a correct search answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// Any of these sets (several when the failure has more than one minimal cause).
    Culprit(Vec<Vec<usize>>),
    NoCulprit,
    CouldNotReproduce,
}

/// A scripted engine.
#[derive(Debug, Clone)]
pub struct Oracle {
    pub name: String,
    pub flags: usize,
    pub rule: Rule,
    /// Corruption rate when the rule holds (added to the background).
    pub rate: f64,
    pub background: f64,
    /// The bug fires only at this many sessions in flight or more.
    pub(crate) min_concurrency: u32,
    /// Flags whose flip degrades the engine: this share of sessions times out, and the
    /// engine runs `slowdown` times slower.
    pub(crate) degraders: Vec<usize>,
    pub(crate) timeout_share: f64,
    pub(crate) slowdown: f64,
    /// Completion tokens per second of a same-speed block; each block draws its own speed
    /// uniformly within +-`speed_noise` of it (a machine shared with other work).
    pub speed: f64,
    pub(crate) speed_noise: f64,
    /// Class mix of corrupted sessions: leak, bad_args, wrong_args, no_tool.
    pub(crate) mix: [f64; 4],
    pub expected: Expected,
}

impl Oracle {
    pub fn new(name: &str, flags: usize, rule: Rule, rate: f64, expected: Expected) -> Self {
        Oracle {
            name: name.into(),
            flags,
            rule,
            rate,
            background: 0.0,
            min_concurrency: 0,
            degraders: Vec::new(),
            timeout_share: 0.9,
            slowdown: 1.0,
            speed: 5000.0,
            speed_noise: 0.3,
            // The race's salad: leaked DSML, wrong arguments, some broken ones.
            mix: [0.5, 0.1, 0.4, 0.0],
            expected,
        }
    }

    /// Flags named F0, F1, ... failing at "1", passing at "0".
    pub fn flag_values(&self) -> Vec<FlagValues> {
        (0..self.flags)
            .map(|i| FlagValues {
                name: format!("F{i}"),
                failing: "1".into(),
                passing: "0".into(),
            })
            .collect()
    }

    pub(super) fn failing_set(&self, request: &BlockRequest) -> BTreeSet<usize> {
        request
            .failing
            .iter()
            .filter_map(|n| n.strip_prefix('F')?.parse().ok())
            .collect()
    }

    fn degraded(&self, failing: &BTreeSet<usize>) -> bool {
        self.degraders.iter().any(|d| !failing.contains(d))
    }

    /// (corruption rate, error/timeout share) of a configuration at a load.
    fn rates(&self, failing: &BTreeSet<usize>, concurrency: u32) -> (f64, f64) {
        if self.degraded(failing) {
            return (self.background, self.timeout_share);
        }
        let fires = concurrency >= self.min_concurrency
            && match &self.rule {
                Rule::All(set) => set.iter().all(|f| failing.contains(f)),
                Rule::Any(set) => set.iter().any(|f| failing.contains(f)),
                Rule::Always => true,
            };
        (self.background + if fires { self.rate } else { 0.0 }, 0.0)
    }

    fn draw(&self, rng: &mut ChaCha8Rng, corrupt: f64, fail: f64) -> SessionClass {
        if rng.random::<f64>() < fail {
            return SessionClass::Timeout;
        }
        if rng.random::<f64>() >= corrupt {
            return SessionClass::Done;
        }
        let mut u = rng.random::<f64>() * self.mix.iter().sum::<f64>();
        for (class, w) in SessionClass::corrupted().zip(self.mix) {
            if u < w {
                return class;
            }
            u -= w;
        }
        SessionClass::Leak
    }
}

/// Runs blocks against an [`Oracle`]; block b of a search draws from seed ^ b.
pub struct OracleRunner<'a> {
    pub oracle: &'a Oracle,
    pub seed: u64,
}

impl OracleRunner<'_> {
    /// One block of `request`, drawn from the oracle.
    pub fn run_block(&self, request: &BlockRequest) -> BlockOutcome {
        let failing = self.oracle.failing_set(request);
        let (corrupt, fail) = self.oracle.rates(&failing, request.concurrency);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ request.seed.rotate_left(17));
        let classes = (0..request.sessions)
            .map(|_| self.oracle.draw(&mut rng, corrupt, fail))
            .collect();
        let o = self.oracle;
        let slowdown = if o.degraded(&failing) {
            o.slowdown
        } else {
            1.0
        };
        let noise = 1.0 + o.speed_noise * (2.0 * rng.random::<f64>() - 1.0);
        BlockOutcome {
            classes,
            peak_engine: Some(u64::from(request.concurrency)),
            wall_s: 0.0,
            tokens_per_s: Some(o.speed * noise / slowdown),
            warnings: Vec::new(),
            mechanisms: Vec::new(),
            sets: Vec::new(),
        }
    }
}

/// One simulated search: whether it answered as expected, and what it spent.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub correct: bool,
    pub sessions: u64,
    pub restarts: u64,
    pub answer: String,
    /// The steps in order, one per line: kind, failing flags, outcome, reason (empty
    /// for the baseline): what to read when a simulated search goes wrong.
    pub path: String,
}

fn matches(expected: &Expected, answer: &Answer, oracle: &Oracle, untestable: &[usize]) -> bool {
    let mut held: Vec<usize> = untestable.to_vec();
    held.sort_unstable();
    let mut degraders = oracle.degraders.clone();
    degraders.sort_unstable();
    held == degraders
        && match (expected, answer) {
            (Expected::Culprit(sets), Answer::Culprit { flags }) => {
                let mut got = flags.clone();
                got.sort_unstable();
                sets.iter().any(|s| {
                    let mut s = s.clone();
                    s.sort_unstable();
                    s == got
                })
            }
            (Expected::NoCulprit, Answer::NoCulprit) => true,
            (Expected::CouldNotReproduce, Answer::CouldNotReproduce) => true,
            _ => false,
        }
}

/// Run the real search once against `oracle` at `concurrency`.
pub fn simulate_search(oracle: &Oracle, concurrency: u32, budget: u64, seed: u64) -> Scored {
    let params = SearchParams::new(oracle.flag_values(), concurrency, budget, seed);
    simulate_with(oracle, &params)
}

/// Run the real search once against `oracle` with `params` (the flags are the oracle's).
pub fn simulate_with(oracle: &Oracle, params: &SearchParams) -> Scored {
    let runner = OracleRunner {
        oracle,
        seed: params.seed,
    };
    let report = search(params.clone())
        .run(|r| runner.run_block(r), drop)
        .expect("the oracle runner gives every session asked for");
    let untestable: Vec<usize> = report.untestable.iter().map(|u| u.flag).collect();
    Scored {
        correct: matches(&oracle.expected, &report.answer, oracle, &untestable),
        sessions: report.sessions_spent,
        restarts: report.restarts,
        answer: report.verdict,
        path: report
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{:?} {{{}}} {:?}: {}",
                    s.kind,
                    s.failing.join(","),
                    s.outcome,
                    s.reason
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\nblocks: "
            + &report
                .blocks
                .iter()
                .map(|(r, o)| {
                    let bad = o.classes.iter().filter(|c| c.is_corrupted()).count();
                    format!("{{{}}} {bad}", r.failing.join(","))
                })
                .collect::<Vec<_>>()
                .join(" | "),
    }
}

/// Sessions per arm of the baseline's fixed pairs.
const BASELINE_PER_ARM: u64 = 80;

/// The baseline: each flag flipped alone, one fixed pair per flag at `concurrency`.
pub fn simulate_one_at_a_time(oracle: &Oracle, concurrency: u32, alpha: f64, seed: u64) -> Scored {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let all: BTreeSet<usize> = (0..oracle.flags).collect();
    let mut p_values = Vec::new();
    let mut implicated_dir = Vec::new();
    let mut degraded = Vec::new();
    let count = |rng: &mut ChaCha8Rng, set: &BTreeSet<usize>| {
        let (corrupt, fail) = oracle.rates(set, concurrency);
        let mut k = 0;
        let mut n = 0;
        let mut failed = 0;
        for _ in 0..BASELINE_PER_ARM {
            let c = oracle.draw(rng, corrupt, fail);
            if c.is_failure() {
                failed += 1;
            } else {
                n += 1;
                k += u64::from(c.is_corrupted());
            }
        }
        (k, n, failed)
    };
    for flag in 0..oracle.flags {
        let (k_on, n_on, f_on) = count(&mut rng, &all);
        let mut flipped = all.clone();
        flipped.remove(&flag);
        let (k_off, n_off, f_off) = count(&mut rng, &flipped);
        let limit = 0.10 * BASELINE_PER_ARM as f64;
        degraded.push(f_on as f64 > limit || f_off as f64 > limit);
        p_values.push(stats::fisher_exact_two_sided(
            k_on,
            n_on - k_on,
            k_off,
            n_off - k_off,
        ));
        implicated_dir.push(stats::rate(k_on, n_on) > stats::rate(k_off, n_off));
    }
    let adjusted = stats::holm(&p_values);
    let culprit: Vec<usize> = (0..oracle.flags)
        .filter(|&i| !degraded[i] && adjusted[i] < alpha && implicated_dir[i])
        .collect();
    let untestable: Vec<usize> = (0..oracle.flags).filter(|&i| degraded[i]).collect();
    let answer = if culprit.is_empty() {
        Answer::NoCulprit
    } else {
        Answer::Culprit { flags: culprit }
    };
    Scored {
        correct: matches(&oracle.expected, &answer, oracle, &untestable),
        sessions: 2 * BASELINE_PER_ARM * oracle.flags as u64,
        restarts: 2 * oracle.flags as u64,
        answer: format!("{answer:?}"),
        path: String::new(),
    }
}

/// The scenarios of the accuracy table: six flags, the seeds' effect sizes.
pub fn scenarios() -> Vec<(Oracle, u32)> {
    let culprit = |sets: &[&[usize]]| Expected::Culprit(sets.iter().map(|s| s.to_vec()).collect());
    let mut out = vec![
        (
            Oracle::new(
                "single culprit (18%)",
                6,
                Rule::All(vec![2]),
                0.18,
                culprit(&[&[2]]),
            ),
            80,
        ),
        (
            Oracle::new(
                "2-flag interaction (17%)",
                6,
                Rule::All(vec![1, 4]),
                0.17,
                culprit(&[&[1, 4]]),
            ),
            80,
        ),
        (
            Oracle::new(
                "3-flag interaction (12%)",
                6,
                Rule::All(vec![0, 1, 2]),
                0.12,
                culprit(&[&[0, 1, 2]]),
            ),
            80,
        ),
    ];
    // The embedded engine's MMA_FLASHMLA: its flip alone is a slow fallback (17x), with
    // too few timeouts (4%) to be caught by the error+timeout rule.
    let mut catalog = Oracle::new(
        "3-flag interaction + a slow flag (18%; 17x, 4% timeouts)",
        6,
        Rule::All(vec![0, 1, 2]),
        0.18,
        culprit(&[&[0, 1, 2]]),
    );
    catalog.degraders = vec![3];
    catalog.timeout_share = 0.04;
    catalog.slowdown = 17.0;
    out.push((catalog, 80));
    let mut flaky = Oracle::new(
        "single culprit over a flaky 5% background",
        6,
        Rule::All(vec![4]),
        0.18,
        culprit(&[&[4]]),
    );
    flaky.background = 0.05;
    out.push((flaky, 80));
    out.push((
        Oracle::new(
            "no culprit: fails whatever the flags (18%)",
            6,
            Rule::Always,
            0.18,
            Expected::NoCulprit,
        ),
        80,
    ));
    out.push((
        Oracle::new(
            "two independent causes (18%)",
            6,
            Rule::Any(vec![1, 3]),
            0.18,
            culprit(&[&[1], &[3]]),
        ),
        80,
    ));
    let mut load = Oracle::new(
        "load-dependent, searched at 80 in flight",
        6,
        Rule::All(vec![0]),
        0.18,
        culprit(&[&[0]]),
    );
    load.min_concurrency = 40;
    out.push((load.clone(), 80));
    load.name = "load-dependent, searched at 8 in flight".into();
    load.expected = Expected::CouldNotReproduce;
    out.push((load, 8));
    out
}
