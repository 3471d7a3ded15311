//! Culprit accuracy on scripted outcome oracles, through the real search code
//! (`bisect_harness::core::culprit`): for each scenario of
//! `culprit::simulate::scenarios()` (six flags: a single culprit, 2- and 3-flag
//! interactions, one with a degrading flag, a flaky 5% background, no culprit, two
//! independent causes, a load-dependent bug searched at 80 and at 8 in flight), N
//! simulated searches from fixed seeds: the fraction answered correctly (the minimal set,
//! the untestable flags, or "no culprit" / "could not reproduce" where that is the
//! truth), mean and 95th-percentile sessions and mean restarts; beside them the baseline,
//! plain one-at-a-time A/B (80 + 80 per flag, Fisher with Holm across the flags).
//!
//! Run: `cargo bench --bench culprit`; `BISECT_CULPRIT_REPS=200` for fewer searches per
//! scenario (default 1000). Prints a table and the markdown for README and docs/culprit.md.

use std::time::Instant;

use bisect_harness::commands::culprit::DEFAULT_BUDGET;
use bisect_harness::core::culprit::simulate::{
    scenarios, simulate_one_at_a_time, simulate_search, simulate_with, Scored,
};
use bisect_harness::core::culprit::{navigate_alpha, SearchParams};

const SEED: u64 = 20_261_201;

struct Row {
    accuracy: f64,
    mean_sessions: f64,
    p95_sessions: u64,
    mean_restarts: f64,
}

fn summarise(runs: &[Scored]) -> Row {
    let n = runs.len().max(1) as f64;
    let mut sessions: Vec<u64> = runs.iter().map(|r| r.sessions).collect();
    sessions.sort_unstable();
    let p95 = sessions[((sessions.len() as f64 * 0.95).ceil() as usize)
        .saturating_sub(1)
        .min(sessions.len() - 1)];
    Row {
        accuracy: runs.iter().filter(|r| r.correct).count() as f64 / n,
        mean_sessions: runs.iter().map(|r| r.sessions as f64).sum::<f64>() / n,
        p95_sessions: p95,
        mean_restarts: runs.iter().map(|r| r.restarts as f64).sum::<f64>() / n,
    }
}

fn main() {
    let reps: u64 = std::env::var("BISECT_CULPRIT_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let started = Instant::now();
    let mut lines = vec![
        "| scenario | load | search: accuracy | mean sessions | p95 sessions | mean restarts | one-at-a-time: accuracy | sessions |".to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let (mut total_s, mut total_b, mut count) = (0.0, 0.0, 0.0);
    let only = std::env::var("BISECT_CULPRIT_ONLY").unwrap_or_default();
    for (oracle, load) in scenarios()
        .into_iter()
        .filter(|(o, _)| o.name.contains(&only))
    {
        let search: Vec<Scored> = (0..reps)
            .map(|i| simulate_search(&oracle, load, DEFAULT_BUDGET, SEED + i))
            .collect();
        let base: Vec<Scored> = (0..reps)
            .map(|i| simulate_one_at_a_time(&oracle, load, 0.01, SEED + i))
            .collect();
        if std::env::var_os("BISECT_CULPRIT_SHOW_WRONG").is_some() {
            let all = std::env::var_os("BISECT_CULPRIT_SHOW_ALL").is_some();
            // BISECT_CULPRIT_SHOW_OVER=880: also the searches that spent more sessions.
            let over: u64 = std::env::var("BISECT_CULPRIT_SHOW_OVER")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            for (i, r) in search
                .iter()
                .enumerate()
                .filter(|(_, r)| all || !r.correct || r.sessions > over)
            {
                println!(
                    "{} {} seed {} ({} sessions): {}\n{}\n",
                    if r.correct { "SHOWN" } else { "WRONG" },
                    oracle.name,
                    SEED + i as u64,
                    r.sessions,
                    r.answer,
                    r.path
                );
            }
        }
        let (s, b) = (summarise(&search), summarise(&base));
        total_s += s.accuracy;
        total_b += b.accuracy;
        count += 1.0;
        let line = format!(
            "| {} | {load} | {:.3} | {:.0} | {} | {:.1} | {:.3} | {:.0} |",
            oracle.name,
            s.accuracy,
            s.mean_sessions,
            s.p95_sessions,
            s.mean_restarts,
            b.accuracy,
            b.mean_sessions
        );
        println!("{line}");
        lines.push(line);
    }
    lines.push(format!(
        "| mean over scenarios | | {:.3} | | | | {:.3} | |",
        total_s / count,
        total_b / count
    ));
    println!(
        "\n{} searches per scenario, seed {SEED}, {:.1} s\n",
        reps,
        started.elapsed().as_secs_f64()
    );
    println!("{}", lines.join("\n"));

    // The navigation level: ddmin steps at 0.01 (= alpha), 0.02, 0.05 (the default,
    // 5 x alpha) and 0.1; ends, re-tests and confirmations stay at alpha 0.01. Fewer
    // searches per scenario (a fifth).
    let reps = (reps / 5).max(1);
    let mut lines = vec![
        "| ddmin steps at | mean accuracy | worst scenario | mean sessions | mean p95 sessions | wrong culprits reported |".to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    for level in [0.01, 0.02, navigate_alpha(0.01), 0.1] {
        let (mut acc, mut worst, mut sessions, mut p95, mut wrong, mut count) =
            (0.0, 1.0f64, 0.0, 0.0, 0usize, 0.0);
        for (oracle, load) in scenarios() {
            let runs: Vec<Scored> = (0..reps)
                .map(|i| {
                    let mut p =
                        SearchParams::new(oracle.flag_values(), load, DEFAULT_BUDGET, SEED + i);
                    p.navigate_alpha = level;
                    simulate_with(&oracle, &p)
                })
                .collect();
            let row = summarise(&runs);
            wrong += runs
                .iter()
                .filter(|r| !r.correct && r.answer.starts_with("culprit:"))
                .count();
            acc += row.accuracy;
            worst = worst.min(row.accuracy);
            sessions += row.mean_sessions;
            p95 += row.p95_sessions as f64;
            count += 1.0;
        }
        let line = format!(
            "| {level} | {:.3} | {worst:.3} | {:.0} | {:.0} | {wrong} of {} |",
            acc / count,
            sessions / count,
            p95 / count,
            reps as usize * count as usize
        );
        println!("{line}");
        lines.push(line);
    }
    println!("\n{}", lines.join("\n"));
}
