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

/// `bisect matrix` in `dir` of a plan of four restart groups (LEAK x NOTHING, 12
/// sessions each) on the replicated mock target there, without a baseline, with `extra`.
fn replica_matrix(dir: &Path, extra: &[&str]) -> std::process::Output {
    std::fs::write(
        dir.join("plan.toml"),
        "name = \"replica-nightly\"\ntarget = \"target.toml\"\nworkload = \"smoke\"\nflags_dir = [\"flags\"]\n\
         sessions = [12]\n\n[axes]\nLEAK = [\"3\", \"0\"]\nNOTHING = [\"0\", \"1\"]\n",
    )
    .unwrap();
    let mut args = vec![
        "matrix",
        "plan.toml",
        "--results",
        "results",
        "--no-baseline",
    ];
    args.extend(extra);
    let args: Vec<&std::ffi::OsStr> = args.into_iter().map(std::ffi::OsStr::new).collect();
    crate::common::bisect_in(dir, &args)
}

/// Both sets' launch configs, byte for byte.
fn launch_configs(dir: &Path) -> Vec<Vec<u8>> {
    ["serve-a.sh", "serve-b.sh"]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
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
    let before = launch_configs(dir.path());
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
    assert_eq!(
        launch_configs(dir.path()),
        before,
        "both sets' configs restored"
    );
    // Each set's block wrote its own set's launch config into launch/.
    let snap = crate::common::record_dir(dir.path(), &record);
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

/// A whole `bisect matrix` on two replica sets: the restart groups dealt to the sets
/// (group g on set g mod 2), run at once, merged into the matrix directory with every
/// cell; both sets' launch configs restored; the cost counts both sets. The LEAK cell
/// leaks on whichever set ran it, the clean cell is clean.
#[test]
fn a_matrix_deals_its_groups_to_the_replica_sets_and_merges_them() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    mock_replicas_target(dir.path(), 0, &FLAGS, "");
    let before = launch_configs(dir.path());
    let out = replica_matrix(dir.path(), &["--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let record: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert!(
        stderr.contains("replicas a, b: the restart groups dealt to the sets"),
        "{stderr}"
    );
    assert!(
        record["shard"].is_null(),
        "a whole matrix: {:#}",
        record["shard"]
    );
    let cells = record["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    for cell in cells {
        assert_eq!(cell["status"], "finished", "{cell:#}");
        let leaked = cell["corrupted"].as_u64().unwrap();
        let leaking = cell["flags"]["LEAK"] == "3";
        assert_eq!(leaked > 0, leaking, "{cell:#}");
    }
    // Each set ran its own groups: two shards merged, their folders kept.
    let merged: Vec<&str> = record["merged_from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["dir"].as_str().unwrap())
        .collect();
    assert_eq!(merged.len(), 2, "{merged:?}");
    assert!(merged[0].ends_with("replicas/a") && merged[1].ends_with("replicas/b"));
    assert_eq!(record["cost"]["replicas"], 2, "{:#}", record["cost"]);
    assert_eq!(record["cost"]["restarts"], 4, "{:#}", record["cost"]);
    assert_eq!(
        launch_configs(dir.path()),
        before,
        "both sets' configs restored"
    );
    // Every cell's sessions are in the matrix directory, as an unsharded night's.
    let night = crate::common::record_dir(dir.path(), &record);
    for cell in cells {
        let sessions = night
            .join(cell["dir"].as_str().unwrap())
            .join("sessions.jsonl");
        assert!(sessions.is_file(), "{}", sessions.display());
    }
}

/// A set whose engine cannot start fails the matrix (exit 3, the set named), stops the
/// other set, restores both sets' launch configs, and still leaves a matrix.json in the
/// matrix directory that says so (`bisect history` reads that level only).
#[test]
fn a_matrix_whose_set_fails_says_so_and_restores_both_sets() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    mock_replicas_target(dir.path(), 0, &FLAGS, "");
    // Set b's engine exits at once: its shard cannot run.
    std::fs::write(
        dir.path().join("serve-b.sh"),
        "#!/bin/sh\nexport BISECT_MOCK_LEAK_FIRST_ROUND=0\nexport BISECT_MOCK_NOTHING=0\nexit 1\n",
    )
    .unwrap();
    let before = launch_configs(dir.path());
    let out = replica_matrix(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("replica set b"), "{stderr}");
    assert_eq!(
        launch_configs(dir.path()),
        before,
        "both sets' configs restored"
    );
    let nights: Vec<_> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(nights.len(), 1, "{nights:?}");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(nights[0].join("matrix.json")).unwrap())
            .unwrap();
    assert_eq!(record["status"], "failed", "{:#}", record["error"]);
    assert!(
        record["error"].as_str().unwrap().contains("replica set b"),
        "{:#}",
        record["error"]
    );
    assert_eq!(record["cells"].as_array().unwrap().len(), 4);
}

/// A repository in `dir/engine` of the replicated mock target's files (both sets'
/// launch scripts, flags, target.toml), then `commits` commits of a notes file, of
/// which `culprit` turns LEAK on in both scripts: the commits' ids, good end first.
fn replicated_repo(dir: &Path, commits: usize, culprit: usize) -> Vec<String> {
    use crate::commits::git;
    let repo = dir.join("engine");
    std::fs::create_dir_all(&repo).unwrap();
    mock_replicas_target(&repo, 10, &FLAGS, "");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("NOTES"), "notes\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "good"]);
    let mut shas = vec![git(&repo, &["rev-parse", "HEAD"])];
    for i in 1..=commits {
        if i == culprit {
            for script in ["serve-a.sh", "serve-b.sh"] {
                let path = repo.join(script);
                let text = std::fs::read_to_string(&path).unwrap().replace(
                    "export BISECT_MOCK_LEAK_FIRST_ROUND=0\n",
                    "export BISECT_MOCK_LEAK_FIRST_ROUND=3\n",
                );
                std::fs::write(&path, text).unwrap();
            }
        } else {
            std::fs::write(repo.join("NOTES"), format!("change {i}\n")).unwrap();
        }
        git(&repo, &["commit", "-q", "-am", &format!("change {i}")]);
        shas.push(git(&repo, &["rev-parse", "HEAD"]));
    }
    shas
}

/// `bisect commits` on a target with two replica sets runs each search round's two
/// commits at once, one per set (no Slurm, no --parallel given), keeps the ends and the
/// verifying A/B on set a, finds and verifies the culprit, and leaves the repository's
/// scripts as they were.
#[test]
fn a_commits_search_runs_its_rounds_on_the_replica_sets() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let shas = replicated_repo(dir.path(), 12, 7);
    let repo = dir.path().join("engine");
    let before = launch_configs(&repo);
    let out = crate::common::bisect_in(
        dir.path(),
        &[
            "commits",
            "--repo",
            "engine",
            "main~12",
            "main",
            "--build",
            "sh -n serve-a.sh && sh -n serve-b.sh",
            "--target",
            "engine/target.toml",
            "--workload",
            "smoke",
            "--sessions",
            "24",
            "--concurrency",
            "6",
            "--results",
            "results",
            "--json",
        ]
        .map(std::ffi::OsStr::new),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("replicas a, b: each round's 2 commits at once"),
        "{stderr}"
    );
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["answer"], "culprit", "{}", record["verdict"]);
    assert_eq!(record["culprit"]["sha"], shas[7].as_str());
    assert_eq!(record["params"]["parallel"], 2);
    let steps = record["steps"].as_array().unwrap();
    let mut search_sets = std::collections::BTreeSet::new();
    for st in steps {
        let set = st["replica"].as_str().unwrap_or_else(|| panic!("{st:#}"));
        assert!(st["round"].is_u64(), "{st:#}");
        match st["purpose"].as_str().unwrap() {
            "search" => {
                search_sets.insert(set.to_string());
            }
            // A comparison never spans two sets.
            "ends" | "verify" => assert_eq!(set, "a", "{st:#}"),
            other => panic!("purpose {other}"),
        }
    }
    assert_eq!(
        search_sets.into_iter().collect::<Vec<_>>(),
        vec!["a", "b"],
        "search rounds dealt to both sets"
    );
    assert_eq!(record["cost"]["replicas"], 2, "{:#}", record["cost"]);
    assert_eq!(
        launch_configs(&repo),
        before,
        "the repository's scripts untouched"
    );
    let summary =
        std::fs::read_to_string(crate::common::record_dir(dir.path(), &record).join("summary.md"))
            .unwrap();
    assert!(summary.contains("one per replica set (a, b"), "{summary}");
    assert!(summary.contains(", set b)"), "{summary}");
}

/// `bisect load --flag LEAK --levels 2,4,6` in `dir` on `profile` (24 sessions a block),
/// which must exit 0: (load.json, stderr).
fn load_sweep(dir: &Path, profile: &Path) -> (Value, String) {
    let out = crate::common::bisect_in(
        dir,
        &[
            "load",
            "--flag",
            "LEAK",
            "--levels",
            "2,4,6",
            "--sessions",
            "24",
            "--workload",
            "smoke",
            "--target",
            profile.to_str().unwrap(),
            "--results",
            "results",
            "--json",
        ]
        .map(std::ffi::OsStr::new),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    (serde_json::from_slice(&out.stdout).unwrap(), stderr)
}

/// (level, on corrupted, off corrupted) of every level of a load record.
fn level_counts(record: &Value) -> Vec<(u64, u64, u64)> {
    record["report"]["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["level"].as_u64().unwrap(),
                l["arm"]["corrupted"].as_u64().unwrap(),
                l["off"]["corrupted"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// `bisect load --flag` (a fixed A/B sweep) on a target with two replica sets deals its
/// levels to the sets, both arms of a level on one set, runs the sets at once, and
/// answers as the same sweep on set a alone (the same sessions: the same counts, level
/// for level), naming each block's set and restoring both sets' launch configs.
#[test]
fn a_load_sweep_deals_its_levels_to_the_replica_sets() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 10, &FLAGS, "");
    // Set a alone: the profile without its [[replica]].
    let text = std::fs::read_to_string(&profile).unwrap();
    let alone = dir.path().join("set-a.toml");
    std::fs::write(&alone, &text[..text.find("[[replica]]").unwrap()]).unwrap();
    let before = launch_configs(dir.path());
    let (serial, stderr) = load_sweep(dir.path(), &alone);
    assert!(!stderr.contains("replicas a, b"), "{stderr}");
    assert!(serial["replicas"].is_null(), "one set names none");
    let (record, stderr) = load_sweep(dir.path(), &profile);
    assert!(
        stderr.contains("replicas a, b: the levels dealt to the sets"),
        "{stderr}"
    );
    assert_eq!(record["status"], "finished", "{:#}", record["error"]);
    let report = &record["report"];
    assert_eq!(level_counts(&record), level_counts(&serial));
    assert_eq!(report["answer"], serial["report"]["answer"]);
    assert!(
        matches!(report["answer"]["kind"].as_str(), Some("threshold")),
        "LEAK corrupts at every load: {}",
        report["verdict"]
    );
    let sets = record["replicas"].as_object().unwrap();
    assert_eq!(report["blocks"].as_array().unwrap().len(), 6);
    for block in report["blocks"].as_array().unwrap() {
        let set = sets[&block["block"].to_string()].as_str().unwrap();
        // The lowest level's 12 waves a block against 6 and 4: level 2 on a, 4 and 6
        // on b.
        let want = match block["level"].as_u64().unwrap() {
            2 => "a",
            _ => "b",
        };
        assert_eq!(set, want, "{block:#}");
    }
    assert_eq!(record["cost"]["replicas"], 2, "{:#}", record["cost"]);
    assert_eq!(serial["cost"]["replicas"], 1, "{:#}", serial["cost"]);
    assert_eq!(
        launch_configs(dir.path()),
        before,
        "both sets' configs restored"
    );
}

/// LEAK found at its failing value `3` and NOTHING at `1` (read by no one): the answer
/// is LEAK alone.
const CULPRIT_FLAGS: [MockFlag<'static>; 2] = [
    MockFlag {
        start: "3",
        ..FLAGS[0]
    },
    MockFlag {
        start: "1",
        ..FLAGS[1]
    },
];

/// `bisect culprit --flags LEAK,NOTHING --workload smoke --concurrency C --target
/// PROFILE EXTRA` in `dir`.
fn culprit(dir: &Path, profile: &Path, concurrency: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "culprit",
        "--flags",
        "LEAK,NOTHING",
        "--workload",
        "smoke",
        "--concurrency",
        concurrency,
        "--target",
        profile.to_str().unwrap(),
    ];
    args.extend(extra);
    let args: Vec<&std::ffi::OsStr> = args.into_iter().map(std::ffi::OsStr::new).collect();
    crate::common::bisect_in(dir, &args)
}

/// The culprit's flags as culprit.json names them.
fn culprit_flags(record: &Value) -> Vec<&str> {
    record["culprit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["flag"].as_str().unwrap())
        .collect()
}

/// [`culprit`] at 8 in flight into `dir/results`, which must exit 0: (culprit.json,
/// stderr).
fn culprit_search(dir: &Path, profile: &Path) -> (Value, String) {
    let out = culprit(dir, profile, "8", &["--results", "results", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    (serde_json::from_slice(&out.stdout).unwrap(), stderr)
}

/// A culprit search on two sets at 8 in flight splits every block of 80 sessions into
/// two shares of 40, one per set, run at once at the full load (each set's own
/// sessions under `blocks/bNNN/<set>/`), finds LEAK, checks that the sets corrupted
/// alike, counts a restart per set per block, and restores both sets' launch configs.
#[test]
fn a_culprit_search_splits_every_block_over_the_replica_sets() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 10, &CULPRIT_FLAGS, "");
    let before = launch_configs(dir.path());
    // Priced before it starts: every block restarts both sets and spreads its ten waves
    // of 8 over them (a restart of 15 min and 5 waves of 10 min: 65 min a block).
    let dry = |concurrency: &str| {
        let priced = [
            "--dry-run",
            "--restart-cost",
            "900",
            "--session-cost",
            "600",
        ];
        let out = culprit(dir.path(), &profile, concurrency, &priced);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = dry("8");
    assert!(
        said.contains("2 to 60 restarts, 80 to 2400 sessions in 1 to 30 blocks (10 to 300 waves) on 2 replica sets at once")
            && said.contains("about 65.0 min to 32.5 h wall, 2.17 to 65 engine-hours"),
        "{said}"
    );
    // At 40 in flight a block is two waves: a share of it would reach the load only to
    // drain it, so the search keeps to the first set.
    let said = dry("40");
    assert!(
        said.contains("1 to 30 restarts, 80 to 2400 sessions in 1 to 30 blocks (2 to 60 waves);"),
        "{said}"
    );
    let (record, stderr) = culprit_search(dir.path(), &profile);
    assert!(
        stderr.contains("replicas a, b: every block split over the sets at once, 40 sessions each at 8 in flight"),
        "{stderr}"
    );
    assert_eq!(record["answer"], "culprit", "{}", record["verdict"]);
    assert_eq!(culprit_flags(&record), ["LEAK"], "{}", record["verdict"]);
    assert_eq!(record["replica_sets"], serde_json::json!(["a", "b"]));
    let blocks = record["blocks"].as_array().unwrap();
    let run = crate::common::record_dir(dir.path(), &record);
    for b in blocks {
        let sets = b["sets"].as_array().unwrap_or_else(|| panic!("{b:#}"));
        assert_eq!(sets.len(), 2, "{b:#}");
        assert_eq!(b["sessions"], 80, "{b:#}");
        for (set, share) in ["a", "b"].iter().zip(sets) {
            assert_eq!(share["sessions"], 40, "{b:#}");
            let sessions = std::fs::read_to_string(
                run.join(b["dir"].as_str().unwrap())
                    .join(set)
                    .join("sessions.jsonl"),
            )
            .unwrap();
            assert_eq!(
                sessions.lines().count(),
                40,
                "block {} set {set}",
                b["block"]
            );
        }
        // Each engine reached the load.
        assert!(b["peak_engine"].as_u64().unwrap() >= 8, "{b:#}");
    }
    assert_eq!(
        record["restarts"],
        2 * blocks.len(),
        "a restart per set per block"
    );
    assert_eq!(
        record["replica_check"]["severity"], "info",
        "{:#}",
        record["replica_check"]
    );
    assert_eq!(record["cost"]["replicas"], 2, "{:#}", record["cost"]);
    assert_eq!(
        launch_configs(dir.path()),
        before,
        "both sets' configs restored"
    );
}

/// Replica b's build answers a quarter of its sessions' first round with a wrong argument
/// whatever the flags: every block holds b's share alike, so the search still finds LEAK,
/// and the replica check names b as a warning.
#[test]
fn a_culprit_search_names_a_replica_that_differs() {
    let _one = crate::common::heavy();
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 10, &CULPRIT_FLAGS, "--wrong-args-every 4");
    let (record, _) = culprit_search(dir.path(), &profile);
    let check = &record["replica_check"];
    assert_eq!(check["severity"], "warning", "{check:#}");
    assert_eq!(check["differs"], "b", "{check:#}");
    let summary =
        std::fs::read_to_string(crate::common::record_dir(dir.path(), &record).join("summary.md"))
            .unwrap();
    assert!(
        summary.contains("warning: replica b differs from the others whatever the configuration"),
        "{summary}"
    );
    assert_eq!(record["answer"], "culprit", "{}", record["verdict"]);
    assert_eq!(culprit_flags(&record), ["LEAK"], "{}", record["verdict"]);
}

/// Sets whose launch configs hold a listed flag at different values would run two
/// configurations under one split block: refused before anything starts, naming the
/// flag and both sets, both configs untouched.
#[test]
fn a_culprit_search_refuses_sets_that_disagree_on_a_flag() {
    let dir = tempfile::tempdir().unwrap();
    let profile = mock_replicas_target(dir.path(), 10, &CULPRIT_FLAGS, "");
    let b = dir.path().join("serve-b.sh");
    let text = std::fs::read_to_string(&b).unwrap().replace(
        "BISECT_MOCK_LEAK_FIRST_ROUND=3",
        "BISECT_MOCK_LEAK_FIRST_ROUND=0",
    );
    std::fs::write(&b, &text).unwrap();
    let before = launch_configs(dir.path());
    let out = culprit(dir.path(), &profile, "8", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("flag LEAK is 3 in replica a's launch configs but 0 in replica b's"),
        "{stderr}"
    );
    assert_eq!(launch_configs(dir.path()), before);
}
