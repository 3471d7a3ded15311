//! A matrix with a load cell (`[[cell]] kind = "load"`, docs/load.md "In the matrix"):
//! against the fake engine, whose race is a deterministic function of the task text,
//! the sweep of `bisect load` runs in the cell's directory with exact counts per block,
//! and its answer lands in matrix.json and summary.md; on the embedded engine through the
//! binary, with the synchronous load-back pinned, the sweep finds no threshold and
//! `bisect report` re-renders the cell's directory unchanged.

use std::path::Path;

use bisect_harness::commands::matrix::baseline;
use bisect_harness::commands::matrix::record::CellStatus;
use bisect_harness::core::arm_stats::RecordStatus;
use bisect_harness::results::load::{rerender, LoadRecord};
use serde_json::Value;

use crate::common::{bisect, bisect_json, fake_race_victims, read, FakeTarget};
use crate::matrix::{job, load_plan, run, set_race};

const LOAD_ID: &str = "load,ab=FAKE_BF16,l8+16,s32,r2";

/// One plain cell and a load sweep of FAKE_BF16 at 8 and 16 in flight (two rounds: the
/// fake's race leaks in round 2), at alpha 0.05 (the race hits 7 and 6 of 32 sessions:
/// too few for 0.01 over two levels).
const PLAN: &str = "name = \"fake-load\"\nworkload = \"smoke\"\nflags_dir = [\"flags\"]\n\
    alpha = 0.05\ntimeout_s = 5\nsessions = [4]\nrounds = [2]\ntokens_per_s_noise = 0.95\n\n\
    [axes]\nFAKE_BF16 = [\"1\"]\n\n\
    [[cell]]\nkind = \"load\"\nflag = \"FAKE_BF16\"\nlevels = [8, 16]\nsessions = 32\nrounds = 2\n";

/// The files of a directory a re-render writes, as they are.
fn renders(dir: &Path) -> [String; 3] {
    ["load.json", "summary.md", "report.html"].map(|f| read(&dir.join(f)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_cell_sweeps_in_its_directory_and_compares_its_threshold() {
    let t = FakeTarget::new().await;
    let plan = load_plan(&t, PLAN);
    assert_eq!(plan.cells[1].id, LOAD_ID);
    set_race(&t, false);
    let clean = run(&t, &job(&t, &plan, None, "clean")).await;
    assert_eq!(
        clean.header.status,
        RecordStatus::Finished,
        "{:?}",
        clean.error
    );
    let cell = &clean.cells[1];
    let load = cell.load.as_ref().unwrap();
    assert_eq!(cell.status, RecordStatus::Finished);
    assert_eq!(load.sessions_spent, 4 * 32);
    assert_eq!(load.threshold, "none shown", "{}", load.verdict);

    set_race(&t, true);
    let racy_job = job(&t, &plan, None, "racy");
    let mut racy = run(&t, &racy_job).await;
    // Every block in blocks/bNNN/ of the cell, the sweep's record beside them: the on
    // arm corrupts exactly the sessions the fake's race hits, the off arm none.
    let dir = racy_job.dir.join(&racy.cells[1].dir);
    let record = LoadRecord::read(&dir).unwrap();
    let report = record.report.as_ref().unwrap();
    assert_eq!(report.blocks.len(), 4);
    for b in &report.blocks {
        assert!(dir
            .join(format!("blocks/b{:03}/sessions.jsonl", b.block))
            .is_file());
        let mut w = plan.workload.clone();
        (w.seed, w.rounds) = (b.seed, 2);
        let expected = match b.arm.as_str() {
            "on" => fake_race_victims(&w, 32),
            _ => 0,
        };
        assert_eq!((b.sessions, b.corrupted), (32, expected), "{b:?}");
        assert!(b.short.is_none(), "{b:?}");
    }
    let load = racy.cells[1].load.clone().unwrap();
    assert_eq!(load.verdict, report.verdict);

    // Against the clean night: a threshold where there was none is lower; the clean
    // night's 0 of 16 cannot show a level flat, so the move is not shown.
    let base = baseline::load_explicit(&t.dir.path().join("results/clean"), "fake-load").unwrap();
    baseline::compare(&mut racy, &base, &plan.policy);
    assert_eq!(load.threshold, "rises at lowest (8)", "{}", load.verdict);
    let cmp = racy.cells[1].comparison.as_ref().unwrap();
    let threshold = cmp.threshold.as_ref().unwrap();
    assert_eq!(threshold.baseline, "none shown");
    assert_eq!(cmp.status, CellStatus::Inconclusive, "{:?}", cmp.reasons);
    assert!(
        cmp.reasons[0].starts_with(
            "the threshold is lower tonight (8 in flight against the baseline's none), but the baseline did not show 8 in flight flat (it was open)"
        ),
        "{:?}",
        cmp.reasons
    );
    assert!(racy.regressions.is_empty());
    let md = read(&racy_job.dir.join("summary.md"));
    assert!(
        md.contains(&format!(
            "`{LOAD_ID}` (A/B of FAKE_BF16 at 8+16, 32 per level): threshold rises at lowest (8)"
        )),
        "{md}"
    );
    let before = renders(&dir);
    rerender(&dir).unwrap();
    assert_eq!(renders(&dir), before, "a re-render changes nothing");
}

/// The embedded engine through the binary: the synchronous load-back pinned, its race
/// cannot fire, so the sweep finds no threshold on either night and the second night's
/// threshold is unchanged; `bisect report` re-renders the cell's directory unchanged.
#[test]
fn a_load_cell_on_the_embedded_engine_with_the_sync_load_back_has_no_threshold() {
    let _one = crate::common::heavy();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("plan.toml"),
        "name = \"embedded-load\"\nworkload = \"smoke\"\n\n[set]\nINDEX_K_HICACHE_SYNC = \"1\"\n\n\
         [[cell]]\nkind = \"load\"\nlevels = [1, 32]\nsessions = 8\n",
    )
    .unwrap();
    let first = bisect_json(&["matrix", "plan.toml", "--json"], tmp.path());
    let cell = &first["cells"][0];
    assert_eq!(cell["id"], "load,l1+32,s8");
    assert_eq!(cell["status"], "finished", "{first}");
    let answer = &cell["load"]["answer"];
    assert_eq!(
        answer["kind"], "no_threshold",
        "{}",
        cell["load"]["verdict"]
    );
    assert_eq!(cell["load"]["sessions_spent"], 8 + 32);
    let matrix_dir = tmp
        .path()
        .join("results")
        .join(first["id"].as_str().unwrap());
    let dir = matrix_dir.join(cell["dir"].as_str().unwrap());
    assert!(dir.join("blocks/b002/sessions.jsonl").is_file());
    let load: Value = serde_json::from_str(&read(&dir.join("load.json"))).unwrap();
    assert_eq!(load["report"]["answer"], *answer);
    assert_eq!(load["pinned"][0], "INDEX_K_HICACHE_SYNC=1");

    // `bisect report DIR` of the cell: its table and verdict, files as they were.
    let before = renders(&dir);
    let out = bisect(&["report", dir.to_str().unwrap()], tmp.path());
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.contains("| in flight") || table.contains("in flight"),
        "{table}"
    );
    assert!(table.contains("verdict: no threshold"), "{table}");
    assert_eq!(renders(&dir), before);
    let json = bisect_json(&["report", dir.to_str().unwrap(), "--json"], tmp.path());
    assert_eq!(json, load);

    // The next night finds the first as its baseline: the threshold is unchanged, ok
    // unless its engine fell short of 32 in flight on this machine (inconclusive, 3).
    let out = bisect(&["matrix", "plan.toml", "--json"], tmp.path());
    let second: Value = serde_json::from_slice(&out.stdout).expect("matrix.json on stdout");
    let cmp = &second["cells"][0]["comparison"];
    assert_eq!(cmp["threshold"]["moved"], "unchanged", "{cmp}");
    assert_eq!(
        cmp["threshold"]["baseline"],
        first["cells"][0]["load"]["threshold"]
    );
    match out.status.code() {
        Some(0) => assert_eq!(cmp["status"], "ok", "{cmp}"),
        code => {
            assert_eq!(code, Some(3), "{}", String::from_utf8_lossy(&out.stderr));
            assert!(cmp["reasons"].to_string().contains("fell short"), "{cmp}");
        }
    }
}
