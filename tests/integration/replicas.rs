//! Both arms at once on two replica sets (issue: engine-hours per verdict): a target
//! with `[[replica]]` runs each pair of arm blocks at the same time, `on` on one set and
//! `off` on the other, crossing over every pair; each set's launch config is restored
//! byte for byte; a set that corrupts more whatever the flag is caught as the replica
//! confound and cancels under crossover, and blocks the verdict without it.
//!
//! The engines are the mock (`bisect mock-engine`), spawned by bisect from each set's
//! launch config: flag `LEAK` makes a third of the sessions leak markup in their first
//! round (a known `implicated`), flag `NOTHING` is read by no one (no effect), and
//! replica b's build can be planted with wrong arguments on a quarter of its sessions.

use std::path::Path;

use serde_json::Value;

use crate::common::{mock_replicas_target, MockFlag};

const FLAGS: [MockFlag<'static>; 2] = [
    MockFlag {
        name: "LEAK",
        env: "BISECT_MOCK_LEAK_FIRST_ROUND",
        start: "0",
        doc: "round 1 of the sessions with crc32 % M == 0 leaks DSML markup (0: never)",
        on: "3",
        off: "0",
    },
    MockFlag {
        name: "NOTHING",
        env: "BISECT_MOCK_NOTHING",
        start: "0",
        doc: "a variable the mock never reads",
        on: "1",
        off: "0",
    },
];

/// `bisect run --flag FLAG --workload smoke --concurrency 6 EXTRA` on `profile`, which
/// must exit 0: (run.json, stderr).
fn run(dir: &Path, profile: &Path, flag: &str, extra: &[&str]) -> (Value, String) {
    let mut args = vec!["--flag", flag, "--workload", "smoke", "--concurrency", "6"];
    args.extend(extra);
    let (code, record, stderr) = crate::common::run_record(dir, profile, &args);
    assert_eq!(code, Some(0), "{stderr}");
    (record, stderr)
}

/// (label, repeat, replica) of every block, in the record's order.
fn blocks(record: &Value) -> Vec<(String, u64, String)> {
    record["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["label"].as_str().unwrap().to_string(),
                b["repeat"].as_u64().unwrap(),
                b["replica"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn replica_confound(record: &Value) -> &Value {
    record["confounds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "replica")
        .unwrap_or_else(|| panic!("no replica confound: {:#}", record["confounds"]))
}

/// Two pairs by default: on a / off b, then off a / on b; the known answer found; both
/// sets' launch configs restored; the cost counts four restarts on two sets.
#[test]
fn arms_run_at_once_on_two_replicas_and_cross_over() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 0, &FLAGS, "");
    let before: Vec<Vec<u8>> = ["serve-a.sh", "serve-b.sh"]
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).unwrap())
        .collect();
    let (record, stderr) = run(dir.path(), &profile, "LEAK", &["--sessions", "24"]);
    assert_eq!(
        blocks(&record),
        [
            ("on".into(), 0, "a".into()),
            ("off".into(), 0, "b".into()),
            ("off".into(), 1, "a".into()),
            ("on".into(), 1, "b".into()),
        ],
        "{stderr}"
    );
    assert_eq!(
        record["verdict"]["status"], "implicated",
        "{:#}",
        record["verdict"]
    );
    let c = replica_confound(&record);
    assert_eq!(c["severity"], "info", "{c:#}");
    for (f, was) in ["serve-a.sh", "serve-b.sh"].iter().zip(&before) {
        assert_eq!(
            &std::fs::read(dir.path().join(f)).unwrap(),
            was,
            "{f} restored"
        );
    }
    // Each set's block wrote its own set's launch config into launch/.
    let snap = dir
        .path()
        .join("results")
        .join(record["id"].as_str().unwrap());
    let on_b = std::fs::read_to_string(snap.join("launch/on-r1/server--serve-b.sh")).unwrap();
    assert!(on_b.contains("BISECT_MOCK_LEAK_FIRST_ROUND=3"), "{on_b}");
    assert_eq!(record["cost"]["restarts"], 4);
    assert_eq!(record["cost"]["replicas"], 2);
    assert!(
        stderr.contains("replicas a, b: each pair of arm blocks runs at once"),
        "{stderr}"
    );
    assert!(stderr.contains("replica b: arm on"), "{stderr}");
}

/// Replica b's build corrupts a quarter of its sessions whatever the flag: under
/// crossover that is a warning and the flag that does nothing is not implicated; with
/// one pair (on a, off b) the arms differ by the replica alone, and the verdict is
/// inconclusive with the replica confound blocking, never `implicated`.
#[test]
fn a_replica_that_differs_is_caught_and_cancels_under_crossover() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 0, &FLAGS, "--wrong-args-every 4");
    let (record, _) = run(dir.path(), &profile, "NOTHING", &["--sessions", "40"]);
    let c = replica_confound(&record);
    assert_eq!(c["severity"], "warning", "{c:#}");
    assert!(
        c["note"]
            .as_str()
            .unwrap()
            .starts_with("replica b differs from the others whatever the flag"),
        "{c:#}"
    );
    assert_ne!(
        record["verdict"]["status"], "implicated",
        "{:#}",
        record["verdict"]
    );
    // The arms' rates are alike: the replica's corruption entered both.
    let (on, off) = (&record["arms"][0], &record["arms"][1]);
    assert_eq!(on["counts"], off["counts"], "{on:#} {off:#}");

    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 0, &FLAGS, "--wrong-args-every 4");
    let (record, stderr) = run(
        dir.path(),
        &profile,
        "NOTHING",
        &["--sessions", "40", "--repeats", "1"],
    );
    assert!(
        stderr.contains("with an odd number of pairs the arms run unevenly"),
        "{stderr}"
    );
    let c = replica_confound(&record);
    assert_eq!(c["severity"], "blocking", "{c:#}");
    assert_eq!(
        record["verdict"]["status"], "inconclusive",
        "{:#}",
        record["verdict"]
    );
}

/// `--adaptive` on two sets: each set runs whole pairs (both arms on the same set, so a
/// set's difference never lies between the arms of a look), the sets at the same time,
/// the pairs fed to the e-process in order; the known answer is found.
#[test]
fn an_adaptive_run_gives_each_set_whole_pairs_at_once() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 0, &FLAGS, "--wrong-args-every 4");
    let (record, stderr) = run(
        dir.path(),
        &profile,
        "LEAK",
        &["--adaptive", "--sessions", "24"],
    );
    assert_eq!(
        record["verdict"]["status"], "implicated",
        "{:#}\n{stderr}",
        record["verdict"]
    );
    let b = blocks(&record);
    assert!(b.len() >= 4 && b.len() % 4 == 0, "{b:?}");
    for round in b.chunks(4) {
        let pair = |i: usize| (round[i].1, round[i].2.as_str());
        // Pair 2k+1 on set a (on, off), pair 2k+2 on set b (off, on).
        assert_eq!(
            (round[0].0.as_str(), round[1].0.as_str()),
            ("on", "off"),
            "{b:?}"
        );
        assert_eq!(
            (round[2].0.as_str(), round[3].0.as_str()),
            ("off", "on"),
            "{b:?}"
        );
        assert_eq!(pair(0).1, "a");
        assert_eq!(pair(1), pair(0));
        assert_eq!(pair(2).1, "b");
        assert_eq!(pair(3), pair(2));
    }
    // Each set ran both arms alike: the planted set's difference is no confound.
    let c = replica_confound(&record);
    assert_ne!(c["severity"], "blocking", "{c:#}");
    assert!(
        stderr.contains("for the first pair of blocks on each replica set"),
        "{stderr}"
    );
}
