//! `bisect load` end to end: on the embedded engine (its index-K race corrupts only
//! under load, and not at all with the synchronous load-back), asserted with wide
//! margins; and the command line's refusals (exit 2, the flag and the fix named).

use crate::common::{bisect, bisect_json};

use serde_json::Value;

fn level(record: &Value, in_flight: u64) -> &Value {
    record["report"]["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["level"] == in_flight)
        .unwrap()
}

#[test]
fn the_embedded_race_has_a_threshold_and_the_sync_load_back_has_none() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let args = ["load", "--levels", "1,80", "--sessions", "160", "--json"];
    let out = bisect(&args, dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // Blocks are named by level and arm, not in culprit's words (its runner drives them).
    assert!(err.contains("load block 1: 1 in flight"), "{err}");
    assert!(!err.contains("culprit block"), "{err}");
    let record: Value = serde_json::from_slice(&out.stdout).expect("the record on stdout");
    assert_eq!(record["status"], "finished", "{record}");
    let (one, eighty) = (level(&record, 1), level(&record, 80));
    assert!(one["arm"]["corrupted"].as_u64().unwrap() <= 2, "{one}");
    let bad = eighty["arm"]["corrupted"].as_u64().unwrap();
    assert!(bad >= 8, "the race corrupts at 80 in flight: {bad}/160");
    assert!(
        eighty["arm"]["peak_engine"].as_u64().unwrap() >= 72,
        "{eighty}"
    );
    let answer = &record["report"]["answer"];
    assert_eq!(
        answer["kind"], "threshold",
        "{}",
        record["report"]["verdict"]
    );
    assert_eq!(answer["level"], 80);
    let verdict = record["report"]["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("lowest reproducing load: 80 in flight"),
        "{verdict}"
    );
    // Every block in its own directory, and the three files.
    let run_dir = dir
        .path()
        .join("results")
        .join(record["id"].as_str().unwrap());
    assert!(run_dir.join("blocks/b001/sessions.jsonl").is_file());
    assert!(run_dir.join("blocks/b002/metrics.csv").is_file());
    let html = std::fs::read_to_string(run_dir.join("report.html")).unwrap();
    assert!(html.contains("<svg class=\"load-chart\"") && html.contains("threshold 80"));
    let md = std::fs::read_to_string(run_dir.join("summary.md")).unwrap();
    assert!(md.contains("lowest reproducing load: 80"), "{md}");

    let sync = [&args[..], &["--set", "SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1"]].concat();
    let record = bisect_json(&sync, dir.path());
    let eighty = level(&record, 80);
    assert!(
        eighty["arm"]["corrupted"].as_u64().unwrap() <= 2,
        "{eighty}"
    );
    assert_eq!(
        record["report"]["answer"]["kind"], "no_threshold",
        "{}",
        record["report"]["verdict"]
    );
}

/// `--pressures`: every block at 40 in flight, each level's filler sized to its share
/// of prefill's pool; HiCache's load-back (the flag's mechanism) runs only when the
/// sessions overflow the pool, and the answer names where it ran and where corruption
/// appears (docs/load.md, "Pressure").
#[test]
fn a_pressure_sweep_names_where_the_mechanism_runs_and_where_it_corrupts() {
    // Its engines at 40 in flight beside the race test's would change the race's rate
    // there (a full run on 2026-12-06 saw 7/160 at 80 in flight against 26-31 alone).
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "load",
        "--flag",
        "HICACHE",
        "--pressures",
        "70,150",
        "--concurrency",
        "40",
        // Three times the load, for margin: the race corrupted 4 to 14 of 40 per block.
        "--sessions",
        "120",
        "--rounds",
        "2",
        "--json",
    ];
    let out = bisect(&args, dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("40 in flight at 150% of the KV cache"),
        "{err}"
    );
    let record: Value = serde_json::from_slice(&out.stdout).expect("the record on stdout");
    assert_eq!(
        record["params"]["axis"]["kind"], "pressure",
        "{}",
        record["params"]
    );
    let sizings = record["pressure"].as_array().unwrap();
    assert_eq!(sizings.len(), 2);
    assert!(sizings[1]["ctx"].as_u64() > sizings[0]["ctx"].as_u64());
    assert!(sizings.iter().all(|s| s["in_flight"] == 40));
    let (low, high) = (level(&record, 70), level(&record, 150));
    assert_eq!(low["mechanism"], "no", "{low}");
    assert_eq!(high["mechanism"], "yes", "{high}");
    assert!(high["arm"]["corrupted"].as_u64().unwrap() >= 8, "{high}");
    assert_eq!(high["off"]["corrupted"], 0, "{high}");
    assert!(high["arm"]["peak_engine"].as_u64().unwrap() >= 36, "{high}");
    let report = &record["report"];
    assert_eq!(report["answer"]["level"], 150, "{}", report["verdict"]);
    assert_eq!(report["mechanism"]["from"], 150);
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("lowest reproducing pressure: 150% of the KV cache")
            && verdict.contains("ran from 150% of the KV cache (never at 70% of the KV cache)"),
        "{verdict}"
    );
    // A level no filler can reach (at 40 in flight a session's opening alone is more
    // than 25% of the pool) is refused before its first block, with what it reaches.
    let low = [&args[..4], &["25,150"], &args[5..]].concat();
    let out = bisect(&low, dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("these levels cannot be reached: 25% (sized to 6")
            && err.contains("fix: drop them"),
        "{err}"
    );
}

#[test]
fn bad_levels_and_options_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    for (args, words) in [
        (&["load", "--levels", "8,1"][..], "not strictly ascending"),
        (&["load", "--levels", "8"][..], "at least 2"),
        (
            &["load", "--concurrency", "8"][..],
            "--concurrency does not apply",
        ),
        (
            &["load", "--adaptive", "--max-sessions", "40"][..],
            "below the highest level 80",
        ),
        (
            &["load", "--pressures", "50,25", "--concurrency", "4"][..],
            "--pressures: levels [50, 25] are not strictly ascending",
        ),
        (
            &["load", "--pressures", "50", "--ctx", "100"][..],
            "cannot be given with --ctx",
        ),
        (
            &["load", "--pressures", "50,5000", "--concurrency", "4"][..],
            "5000% is more than 1000% of the KV cache",
        ),
    ] {
        let out = bisect(args, dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(words), "{args:?}: {err}");
        assert!(
            err.contains("fix") || err.contains("e.g."),
            "{args:?}: {err}"
        );
    }
    assert!(!dir.path().join("results").exists(), "nothing ran");
}

#[test]
fn the_solo_oracle_judges_every_load_block_against_itself_alone() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let workload = crate::embedded::schema_only_workload(dir.path());
    let args = [
        "load",
        "--flag",
        "BF16_INDEX_K",
        "--levels",
        "1,80",
        "--oracle",
        "solo",
        "--workload",
        &workload,
        "--json",
    ];
    let record = bisect_json(&args, dir.path());
    let (one, eighty) = (level(&record, 1), level(&record, 80));
    assert!(one["arm"]["corrupted"].as_u64().unwrap() <= 2, "{one}");
    assert!(
        eighty["arm"]["corrupted"].as_u64().unwrap() >= 8,
        "{eighty}"
    );
    let run_dir = dir
        .path()
        .join("results")
        .join(record["id"].as_str().unwrap());
    // Every block ran its sessions alone first, and at 80 in flight sessions the
    // schema-only classifier passed were caught as diverged.
    let mut diverged = 0;
    let (mut ran_alone, mut reused) = (0, 0);
    for block in ["b001", "b002", "b003", "b004"] {
        let blocks = run_dir.join("blocks").join(block);
        let alone: Vec<_> = std::fs::read_dir(blocks.join("reference"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(alone.len(), 1, "{block}: one reference");
        // What the block's reference cost is kept beside it.
        let pass: Value =
            serde_json::from_str(&std::fs::read_to_string(alone[0].join("pass.json")).unwrap())
                .unwrap();
        ran_alone += pass["sessions"].as_u64().unwrap();
        reused += pass["reused"].as_u64().unwrap();
        let sessions = std::fs::read_to_string(blocks.join("sessions.jsonl")).unwrap();
        diverged += sessions
            .lines()
            .filter(|l| l.contains("\"class\":\"diverged\""))
            .count();
    }
    assert!(diverged >= 4, "{diverged} diverged sessions in all blocks");
    // Each load block draws its own seed (its own tasks): none can reuse another's
    // reference, and every one ran its sessions alone.
    assert_eq!(reused, 0);
    assert!(
        ran_alone >= 4 * 8,
        "{ran_alone} sessions alone in all blocks"
    );
    assert_eq!(
        answer_level(&record),
        Some(80),
        "{}",
        record["report"]["verdict"]
    );
}

fn answer_level(record: &Value) -> Option<u64> {
    record["report"]["answer"]["level"].as_u64()
}
