//! The regression rule: one-sided Fisher, the cell statuses and their reasons.

use super::*;

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= 1e-9 * expected
}

#[test]
fn one_sided_fisher_matches_exact_tails() {
    // Exact tails, sum over x >= a of C(K,x) C(N-K,n-x) / C(N,n), in rational arithmetic;
    // R's fisher.test(..., alternative = "greater") gives the same.
    assert!(close(
        fisher_one_sided_greater(14, 66, 0, 80),
        3.2766807188776036e-05
    ));
    assert!(close(
        fisher_one_sided_greater(9, 11, 1, 19),
        0.00418086708409289
    ));
    // R: fisher.test(matrix(c(3, 7, 1, 9), 2, byrow=TRUE), alternative="greater") -> 0.2910217
    assert!(close(
        fisher_one_sided_greater(3, 7, 1, 9),
        0.29102167182662536
    ));
    // A drop is never significant in this direction.
    assert!(fisher_one_sided_greater(0, 80, 14, 66) > 0.999);
    assert_eq!(fisher_one_sided_greater(0, 5, 0, 5), 1.0);
    assert_eq!(fisher_one_sided_greater(0, 0, 3, 5), 1.0);
}

#[test]
fn one_sided_is_half_of_two_sided_for_symmetric_margins() {
    // Equal arms and a single corrupted total margin make the null symmetric.
    let one = fisher_one_sided_greater(9, 11, 1, 19);
    let two = crate::core::stats::fisher_exact_two_sided(9, 11, 1, 19);
    assert!((two - 2.0 * one).abs() < 1e-12, "{one} {two}");
}

fn cell(id: &str, done: u64, leak: u64, timeout: u64, tokens_per_s: f64) -> CellRecord {
    let mut c = measured(id, done, leak, 0, timeout);
    c.stats.tokens_per_s = tokens_per_s;
    c
}

/// A finished cell of `done + leak + truncated + timeout` sessions, all in flight at
/// once, decode's metrics having seen every one of them.
fn measured(id: &str, done: u64, leak: u64, truncated: u64, timeout: u64) -> CellRecord {
    let sessions = done + leak + truncated + timeout;
    let mut c: CellRecord = serde_json::from_value(serde_json::json!({
        "id": id, "group": 0, "flags": {}, "sessions": sessions, "rounds": 4,
        "config_hash": "c", "workload_hash": "w", "status": "finished", "readback": {},
        "counts": {"done": done, "maxrounds": 0, "leak": leak, "bad_args": 0,
                   "wrong_args": 0, "no_tool": 0, "error": 0, "timeout": timeout,
                   "truncated": truncated},
        "corrupted": 0, "corruption_rate": 0.0, "ci95": [0.0, 1.0],
        "peak_running": {"client": sessions, "decode": sessions},
        "wall_s": 1.0, "completion_tokens": 0, "tokens_per_s": 100.0,
        "health_wait_s": 0.0, "dir": "cells/x", "comparison": null
    }))
    .unwrap();
    c.rederive();
    c
}

fn compared(old: Vec<CellRecord>, new: Vec<CellRecord>) -> MatrixRecord {
    let base = Baseline {
        dir: PathBuf::from("b"),
        record: night(old),
        chosen: "explicit",
    };
    let mut n = night(new);
    compare(&mut n, &base, &RegressionPolicy::default());
    n
}

fn status_and_reasons(c: &CellRecord) -> (CellStatus, String) {
    let cmp = c.comparison.as_ref().unwrap();
    (cmp.status, cmp.reasons.join("; "))
}

#[test]
fn a_cell_whose_engine_died_is_never_ok() {
    let death: crate::core::deaths::EngineDeath = serde_json::from_value(serde_json::json!({
        "role": "decode", "at_s": 2.0, "in_flight": 40,
        "exit": {"signal": 11, "signal_name": "SIGSEGV"}
    }))
    .unwrap();
    let mut dying = measured("c", 60, 0, 0, 0);
    dying.stats.deaths = vec![death];
    // Tonight's engine dies where the baseline's never did: a regression, whatever
    // its surviving sessions say.
    let n = compared(vec![measured("c", 80, 0, 0, 0)], vec![dying.clone()]);
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Regressed, "{why}");
    assert!(
        why.contains("the engine died 1 time (SIGSEGV) where the baseline's never did"),
        "{why}"
    );
    // It died in both nights: not a new regression, never ok either.
    let n = compared(vec![dying.clone()], vec![dying]);
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(why.contains("an engine that dies is never ok"), "{why}");
}

/// docs/design.md 3.7: a cell whose flag's path never ran is never ok; where it ran,
/// the same cell is ok.
#[test]
fn a_cell_whose_mechanism_never_ran_is_never_ok() {
    let defrags = |count: u64| {
        vec![crate::core::testing::witnessed(
            ("DEFRAG", "defrag"),
            ("0.1", true),
            "log /requesting defrag/",
            count,
        )]
    };
    let mut idle = measured("c", 80, 0, 0, 0);
    idle.stats.mechanisms = defrags(0);
    let n = compared(vec![measured("c", 80, 0, 0, 0)], vec![idle]);
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(
        why.contains(
            "the mechanism never ran: defrag (log /requesting defrag/): this night's cell 0"
        ) && why.contains("a cell whose path never ran is never ok"),
        "{why}"
    );
    let mut ran = measured("c", 80, 0, 0, 0);
    ran.stats.mechanisms = defrags(5);
    let n = compared(vec![measured("c", 80, 0, 0, 0)], vec![ran]);
    assert_eq!(status_and_reasons(&n.cells[0]).0, CellStatus::Ok);
}

#[test]
fn a_cell_that_judged_nothing_is_never_ok() {
    // The baseline corrupted 14 of 80; tonight a wordier model runs into max_tokens in
    // every session: 0/0 judged, Fisher p = 1, no regression rule fires. Not "ok".
    let n = compared(
        vec![measured("c", 66, 14, 0, 0)],
        vec![measured("c", 0, 0, 80, 0)],
    );
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(
        why.contains("this night's cell judged only 0 of 80 sessions (80 truncated"),
        "{why}"
    );
    assert!(
        why.contains("replies truncated at max_tokens rose from 0/80"),
        "{why}"
    );
    assert!(n.regressions.is_empty());
    assert_eq!(n.baseline.as_ref().unwrap().inconclusive, 1);
    // A baseline that judged nothing cannot vouch for tonight either (an empty row
    // gives p = 1 whatever tonight's rate).
    let n = compared(
        vec![measured("c", 0, 0, 80, 0)],
        vec![measured("c", 66, 14, 0, 0)],
    );
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(
        why.contains("the baseline cell judged only 0 of 80"),
        "{why}"
    );
    // Half judged is enough, and truncation that did not rise is no reason.
    let n = compared(
        vec![measured("c", 40, 0, 40, 0)],
        vec![measured("c", 40, 0, 40, 0)],
    );
    assert_eq!(n.cells[0].verdict(), Some(CellStatus::Ok));
}

#[test]
fn truncation_well_above_the_baselines_withholds_ok() {
    // 60 of 80 judged tonight (above half), but 20 truncated against none: the
    // truncated sessions are the ones that could have gone wrong.
    let n = compared(
        vec![measured("c", 80, 0, 0, 0)],
        vec![measured("c", 60, 0, 20, 0)],
    );
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(
        why.starts_with("replies truncated at max_tokens rose from 0/80 (0.0%) to 20/80"),
        "{why}"
    );
    // 2 more truncated than the baseline: noise, ok.
    let n = compared(
        vec![measured("c", 80, 0, 0, 0)],
        vec![measured("c", 78, 0, 2, 0)],
    );
    assert_eq!(n.cells[0].verdict(), Some(CellStatus::Ok));
}

#[test]
fn a_cell_below_its_load_or_unmeasured_is_not_ok_but_regressions_stand() {
    // Tonight's build caps decode at 10 running requests at 80 in flight.
    let mut low = measured("c", 80, 0, 0, 0);
    low.stats.peak_running.insert("decode".into(), 10);
    let n = compared(vec![measured("c", 66, 14, 0, 0)], vec![low.clone()]);
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(
        why.starts_with(
            "this night's cell reached at most 10 running requests (decode), below 72 (90% of the target concurrency 80)"
        ),
        "{why}"
    );
    // No role's metrics answered: the load is unmeasured, the failure named.
    let mut blind = measured("c", 80, 0, 0, 0);
    blind.stats.peak_running.remove("decode");
    blind
        .stats
        .metrics_failed
        .insert("decode".into(), "connection refused".into());
    let n = compared(vec![measured("c", 80, 0, 0, 0)], vec![blind]);
    let (status, why) = status_and_reasons(&n.cells[0]);
    assert_eq!(status, CellStatus::Inconclusive, "{why}");
    assert!(why.contains("no engine-side load measurement"), "{why}");
    assert!(
        why.contains("metrics failed for decode: connection refused"),
        "{why}"
    );
    // The workload's concurrency, capped at the cell's sessions, is the target: 16
    // sessions under a concurrency of 64 need 15 running, not 58.
    let mut small = measured("c", 16, 0, 0, 0);
    small.stats.peak_running.insert("decode".into(), 15);
    let base = Baseline {
        dir: PathBuf::from("b"),
        record: night(vec![measured("c", 16, 0, 0, 0)]),
        chosen: "explicit",
    };
    let mut n = night(vec![small]);
    n.workload = serde_json::json!({ "concurrency": 64 });
    compare(&mut n, &base, &RegressionPolicy::default());
    assert_eq!(n.cells[0].verdict(), Some(CellStatus::Ok));
    // One session in flight cannot fall short of its load; the poller, sampling
    // between its requests, saw none running.
    let mut single = measured("c", 1, 0, 0, 0);
    single.stats.peak_running.insert("decode".into(), 0);
    let n = compared(vec![measured("c", 1, 0, 0, 0)], vec![single]);
    assert_eq!(n.cells[0].verdict(), Some(CellStatus::Ok));
    // Corruption that rose at a low load is still a regression.
    let mut racy = measured("c", 66, 14, 0, 0);
    racy.stats.peak_running.insert("decode".into(), 10);
    let n = compared(vec![measured("c", 80, 0, 0, 0)], vec![racy]);
    assert_eq!(n.cells[0].verdict(), Some(CellStatus::Regressed));
    assert_eq!(n.regressions, ["c"]);
}

fn night(cells: Vec<CellRecord>) -> MatrixRecord {
    let ids: Vec<String> = cells.iter().map(|c| c.id.clone()).collect();
    serde_json::from_value(serde_json::json!({
        "schema": "bisect.matrix/1", "id": "n", "command": "",
        "plan": {"name": "p", "path": "p.toml", "hash": "h", "repeats": 1,
                 "policy": RegressionPolicy::default(), "set": {}, "cells": ids},
        "shard": null, "started_at": "t", "finished_at": "t", "status": "finished",
        "target": {"name": "t", "api": "a", "model": "m", "profile": null, "roles": []},
        "workload": {}, "workload_hash": "w", "cells": cells, "baseline": null,
        "error": null
    }))
    .unwrap()
}

#[test]
fn speed_degradation_and_changes_each_decide_a_cell() {
    let base = Baseline {
        dir: PathBuf::from("b"),
        record: night(vec![
            cell("slow", 50, 0, 0, 100.0),
            cell("noisy", 50, 0, 0, 100.0),
            cell("degraded", 50, 0, 0, 100.0),
            cell("changed", 50, 0, 0, 100.0),
            cell("gone", 50, 0, 0, 100.0),
        ]),
        chosen: "explicit",
    };
    let mut changed = cell("changed", 0, 50, 0, 100.0);
    changed.config_hash = "other".into();
    let mut n = night(vec![
        cell("slow", 50, 0, 0, 74.0),
        cell("noisy", 50, 0, 0, 76.0),
        cell("degraded", 44, 0, 6, 100.0),
        changed,
        cell("new", 50, 0, 0, 100.0),
    ]);
    compare(&mut n, &base, &RegressionPolicy::default());
    let status: Vec<(&str, CellStatus)> = n
        .cells
        .iter()
        .map(|c| (c.id.as_str(), c.verdict().unwrap()))
        .collect();
    assert_eq!(
        status,
        [
            ("slow", CellStatus::Regressed),
            ("noisy", CellStatus::Ok),
            ("degraded", CellStatus::Regressed),
            ("changed", CellStatus::NotComparable),
            ("new", CellStatus::New),
        ]
    );
    assert!(n.cells[0].comparison.as_ref().unwrap().reasons[0]
        .starts_with("tokens/s fell from 100.0 to 74.0"));
    assert!(n.cells[2].comparison.as_ref().unwrap().reasons[0].starts_with("degraded: 6 of 50"));
    assert_eq!(n.regressions, ["slow", "degraded"]);
    let info = n.baseline.unwrap();
    assert_eq!((info.compared, info.not_comparable, info.new), (3, 1, 1));
    assert_eq!(info.missing, ["gone"]);
}
