//! The nightly matrix against the fake engine, whose bugs are known exactly: per-cell
//! counts, restart grouping, shards merged == unsharded, baselines (regression named,
//! identical nights clean, changed workload not comparable), the exit code through the
//! real binary, and snapshots of summary.md and junit.xml with times and paths redacted.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use bisect_harness::commands::diff;
use bisect_harness::commands::matrix::baseline::{self, Baseline};
use bisect_harness::commands::matrix::export::{self, junit::JunitXml, markdown::MatrixSummary};
use bisect_harness::commands::matrix::job::MatrixJob;
use bisect_harness::commands::matrix::record::{read_matrix, CellStatus, MatrixRecord};
use bisect_harness::commands::matrix::run as matrix_run;
use bisect_harness::commands::matrix::{merge, Plan, Shard};
use bisect_harness::commands::run::Quiet;
use bisect_harness::core::arm_stats::RecordStatus;
use bisect_harness::results::Exporter;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::{fake_race_victims, read, FakeTarget};
use bisect_harness::core::session::SessionClass;

/// The fake's race as a flag, so a test can flip it between nights in the launch config.
const RACE_FLAG: &str = "doc = \"the fake's race\"\nenv = \"FAKE_RACE\"\nroles = [\"decode\"]\non = \"1\"\noff = \"0\"\n";

/// 2 flags x 2 session counts. FAKE_NOISE changes nothing in the fake (a same-speed
/// toggle); the race needs FAKE_INDEX_BF16=1. tokens/s of an in-process fake is machine
/// noise only, so the speed rule is set out of reach here (and tested in unit tests).
fn plan_text(extra: &str) -> String {
    format!(
        "name = \"fake-nightly\"\nworkload = \"smoke\"\nflags_dir = [\"flags\"]\ntimeout_s = 5\n\
         sessions = [4, 64]\ntokens_per_s_noise = 0.95\n{extra}\n\
         [axes]\nFAKE_BF16 = [\"1\", \"0\"]\nFAKE_NOISE = [\"0\", \"3\"]\n"
    )
}

pub(crate) fn load_plan(t: &FakeTarget, text: &str) -> Plan {
    std::fs::write(t.dir.path().join("flags/FAKE_RACE.toml"), RACE_FLAG).unwrap();
    let path = t.dir.path().join("nightly.toml");
    std::fs::write(&path, text).unwrap();
    Plan::load(&path).unwrap()
}

pub(crate) fn job(t: &FakeTarget, plan: &Plan, shard: Option<Shard>, id: &str) -> MatrixJob {
    let results = t.dir.path().join("results");
    MatrixJob {
        id: id.into(),
        command: format!("bisect matrix nightly.toml ({id})"),
        plan: plan.clone(),
        target: t.target.clone(),
        shard,
        dir: results.join(id),
        testbed: t.testbed(),
        api_key: None,
        oracle: None,
        night: Default::default(),
    }
}

pub(crate) async fn run(t: &FakeTarget, job: &MatrixJob) -> MatrixRecord {
    hold_for_the_poller(t);
    let mut control = t.engine.control();
    matrix_run::run_matrix(job, &mut control, &Quiet, CancellationToken::new())
        .await
        .unwrap()
}

/// Requests held long enough for the metrics poller to see a cell's load: a compared
/// cell is "ok" only at its target load, as measured on the engine side.
fn hold_for_the_poller(t: &FakeTarget) {
    t.engine.hold_requests(150);
}

pub(crate) fn set_race(t: &FakeTarget, on: bool) {
    let decode = &t.target.roles[1].launch;
    let text = read(decode);
    let (from, to) = if on {
        ("FAKE_RACE=0", "FAKE_RACE=1")
    } else {
        ("FAKE_RACE=1", "FAKE_RACE=0")
    };
    std::fs::write(decode, text.replace(from, to)).unwrap();
    t.engine.reload().unwrap();
}

/// Cells as JSON without the fields that measure one execution.
fn untimed(cells: &[bisect_harness::commands::matrix::CellRecord]) -> Vec<Value> {
    cells
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap();
            let o = v.as_object_mut().unwrap();
            for k in ["wall_s", "tokens_per_s", "health_wait_s", "peak_running"] {
                assert!(o.remove(k).is_some(), "cell field {k} exists");
            }
            // Connect times and the load gap measure one execution too (absent in a
            // blocked cell, which drove nothing).
            o.remove("transport");
            o.remove("load_gap");
            // What ran when (the trend's bins, the canary's task and the first
            // failure's time) and how often the poller found a role busy measure one
            // execution as well.
            o.remove("trend");
            o.remove("canaries");
            o.remove("busy_samples");
            v
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_cells_have_exact_counts_and_one_restart_per_group() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = load_plan(&t, &plan_text(""));
    let job = job(&t, &plan, None, "night");
    // Priced before it runs (`matrix --dry-run`): a restart per group, a block per cell.
    let planned = job.planned_cost(bisect_harness::core::cost::CostUnits {
        restart_s: Some(900.0),
        session_s: Some(600.0),
    });
    assert!(
        planned
            .words
            .starts_with("planned: 4 restarts, 272 sessions in 8 blocks (8 waves);"),
        "{}",
        planned.words
    );
    assert_eq!(planned.wall_s, Some(4.0 * 900.0 + 8.0 * 600.0));
    let mut control = t.engine.control();
    let record = matrix_run::run_matrix(&job, &mut control, &Quiet, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(record.header.status, RecordStatus::Finished);
    assert_eq!(
        control.restarts.load(Ordering::Relaxed),
        4,
        "one restart per flag combination, not per cell"
    );
    // And says what it cost: the testbed counted the same restarts.
    let cost = record.cost.as_ref().expect("the matrix's cost");
    assert_eq!((cost.restarts, cost.replicas), (4, 1));
    assert_eq!(
        t.launch_bytes(),
        before,
        "launch configs restored byte for byte"
    );

    let ids: Vec<&str> = record.cells.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "FAKE_BF16=1,FAKE_NOISE=0,s4",
            "FAKE_BF16=1,FAKE_NOISE=0,s64",
            "FAKE_BF16=1,FAKE_NOISE=3,s4",
            "FAKE_BF16=1,FAKE_NOISE=3,s64",
            "FAKE_BF16=0,FAKE_NOISE=0,s4",
            "FAKE_BF16=0,FAKE_NOISE=0,s64",
            "FAKE_BF16=0,FAKE_NOISE=3,s4",
            "FAKE_BF16=0,FAKE_NOISE=3,s64",
        ]
    );
    for cell in &record.cells {
        let n = cell.sessions;
        let racy = cell.flags["FAKE_BF16"] == "1";
        let victims = if racy {
            fake_race_victims(&plan.workload, n)
        } else {
            0
        };
        assert_eq!(cell.status, RecordStatus::Finished, "{}", cell.id);
        assert_eq!(cell.stats.counts.total(), n as u64, "{}", cell.id);
        assert_eq!(
            cell.stats.counts[SessionClass::Leak],
            victims,
            "{}",
            cell.id
        );
        assert_eq!(
            cell.stats.counts[SessionClass::Done],
            n as u64 - victims,
            "{}",
            cell.id
        );
        assert_eq!(cell.stats.corrupted, victims, "{}", cell.id);
        assert_eq!(cell.rounds, plan.workload.rounds);
        assert_eq!(
            cell.readback["FAKE_BF16"]["prefill"],
            cell.flags["FAKE_BF16"]
        );
        assert_eq!(
            cell.readback["FAKE_BF16"]["decode"],
            cell.flags["FAKE_BF16"]
        );
        assert_eq!(
            cell.readback["FAKE_NOISE"]["decode"],
            cell.flags["FAKE_NOISE"]
        );
        assert!(
            cell.stats.ci95[0] <= cell.stats.corruption_rate
                && cell.stats.corruption_rate <= cell.stats.ci95[1]
        );
        assert!(cell.stats.peak_running["client"] >= 1);
        let sessions = read(&job.dir.join(&cell.dir).join("sessions.jsonl"));
        assert_eq!(sessions.lines().count(), n as usize, "{}", cell.id);
        assert!(sessions
            .lines()
            .all(|l| l.contains(&format!("\"label\":\"{}\"", cell.id))));
        assert!(read(&job.dir.join(&cell.dir).join("metrics.csv")).starts_with("t_s,role,running"));
        let applied = read(
            &job.dir
                .join(&cell.dir)
                .join("launch/cell-r0/decode--decode.sh"),
        );
        assert!(applied.contains(&format!(
            "export FAKE_INDEX_BF16={}",
            cell.flags["FAKE_BF16"]
        )));
    }
    assert!(
        record.cells[1].stats.corrupted >= 10,
        "the 64-session racy cell needs enough victims for the baseline tests"
    );
    assert_eq!(
        record.cells[1].stats.first_bad_round,
        vec![0, record.cells[1].stats.corrupted]
    );

    let on_disk: Value = serde_json::from_str(&read(&job.dir.join("matrix.json"))).unwrap();
    assert_eq!(on_disk["schema"], "bisect.matrix/1");
    assert_eq!(on_disk["plan"]["name"], "fake-nightly");
    assert_eq!(on_disk["plan"]["cells"].as_array().unwrap().len(), 8);
    assert_eq!(
        on_disk["cells"][1]["counts"]["leak"],
        record.cells[1].stats.corrupted
    );
    assert_eq!(on_disk["cells"][0]["flags"]["FAKE_NOISE"], "0");
    assert!(on_disk["cells"][0]["config_hash"].as_str().unwrap().len() == 16);
    let csv = read(&job.dir.join("matrix.csv"));
    assert_eq!(csv.lines().count(), 9, "{csv}");
    assert!(
        csv.starts_with("cell,group,flag:FAKE_BF16,flag:FAKE_NOISE,sessions"),
        "{csv}"
    );
    let junit = read(&job.dir.join("junit.xml"));
    assert_eq!(junit.matches("<testcase ").count(), 8);
    assert!(
        !junit.contains("<failure"),
        "no baseline, no failure: {junit}"
    );
    assert!(read(&job.dir.join("summary.md")).contains("baseline: none"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_merge_into_the_unsharded_matrix() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = load_plan(&t, &plan_text(""));
    let _unsharded = run(&t, &job(&t, &plan, None, "whole")).await;

    let mut shard_dirs: Vec<PathBuf> = Vec::new();
    let mut restarts = Vec::new();
    // Every control of one fake engine shares its restart counter: count per shard.
    let mut restarts_before = t.engine.restarts.load(Ordering::Relaxed);
    for i in 0..2 {
        let j = job(
            &t,
            &plan,
            Some(Shard { index: i, count: 2 }),
            &format!("shard{i}"),
        );
        let mut control = t.engine.control();
        let r = matrix_run::run_matrix(&j, &mut control, &Quiet, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(r.cells.len(), 4, "shard {i} runs two whole groups");
        assert!(read(&j.dir.join("summary.md")).contains(&format!("shard {i}/2")));
        let now = control.restarts.load(Ordering::Relaxed);
        restarts.push(now - restarts_before);
        restarts_before = now;
        shard_dirs.push(j.dir.clone());
    }
    assert_eq!(restarts, [2, 2], "shards never split a restart group");
    assert_eq!(t.launch_bytes(), before);

    // Merge in reverse order: the merged order comes from the plan, not the arguments.
    let reversed: Vec<PathBuf> = shard_dirs.iter().rev().cloned().collect();
    let merged = merge::join(&reversed, "merged", "bisect merge").unwrap();
    let out = t.dir.path().join("results/merged");
    merge::write(&merged, &out).unwrap();
    let merged = read_matrix(&out).unwrap();
    // Both as written to matrix.json (reading JSON back may round floats in the last place).
    let whole = read_matrix(&t.dir.path().join("results/whole")).unwrap();
    assert_eq!(untimed(&merged.cells), untimed(&whole.cells));
    assert_eq!(merged.plan.hash, whole.plan.hash);
    assert!(merged.shard.is_none() && merged.is_complete());
    assert_eq!(merged.merged_from.len(), 2);
    for c in &merged.cells {
        let lines = read(&out.join(&c.dir).join("sessions.jsonl"))
            .lines()
            .count();
        assert_eq!(
            lines, c.sessions as usize,
            "transcripts copied for {}",
            c.id
        );
    }

    let refuse = |dirs: &[PathBuf]| {
        let err = merge::join(dirs, "x", "bisect merge")
            .err()
            .expect("merge refused");
        assert_eq!(
            bisect_harness::commands::code_for_error(&err),
            bisect_harness::exit::BAD_INPUT
        );
        format!("{err:#}")
    };
    let missing = refuse(&shard_dirs[..1]);
    assert!(
        missing.contains("4 of 8 cells are in no finished shard")
            && missing.contains("FAKE_BF16=1,FAKE_NOISE=3,s4"),
        "{missing}"
    );
    let overlap = refuse(&[
        shard_dirs[0].clone(),
        shard_dirs[0].clone(),
        shard_dirs[1].clone(),
    ]);
    assert!(
        overlap.contains("overlapping shards: cell FAKE_BF16=1,FAKE_NOISE=0,s4"),
        "{overlap}"
    );
    let other_plan = load_plan(&t, &plan_text("").replace("[4, 64]", "[4, 32]"));
    let other = run(
        &t,
        &job(&t, &other_plan, Some(Shard { index: 1, count: 2 }), "other"),
    )
    .await;
    assert_eq!(other.cells.len(), 4);
    let mixed = refuse(&[shard_dirs[0].clone(), t.dir.path().join("results/other")]);
    assert!(mixed.contains("shards of different plans"), "{mixed}");
    let Err(again) = merge::write(&merge::join(&shard_dirs, "again", "m").unwrap(), &out) else {
        panic!("an existing matrix is never overwritten");
    };
    assert!(format!("{again:#}").contains("already holds a matrix"));
}

/// Redact what differs between executions and machines, then render.
fn redacted(record: &MatrixRecord, exporter: &dyn Exporter<MatrixRecord>) -> String {
    let mut r = record.clone();
    r.header.id = "[id]".into();
    r.header.started_at = "[time]".into();
    r.header.finished_at = Some("[time]".into());
    r.plan.path = "[path]/nightly.toml".into();
    r.plan.hash = "[hash]".into();
    r.workload_hash = "[hash]".into();
    r.header.target.api = "http://[addr]/v1".into();
    r.cost = None;
    for c in &mut r.cells {
        c.stats.wall_s = 1.0;
        c.stats.tokens_per_s = 100.0;
        c.stats.health_wait_s = 0.0;
        c.stats.peak_running = [("client".to_string(), c.sessions as u64)].into();
        if let Some(cmp) = &mut c.comparison {
            cmp.baseline_tokens_per_s = 100.0;
            cmp.tokens_per_s_ratio = Some(1.0);
            for reason in &mut cmp.reasons {
                // Hashes of a changed configuration depend on the builtin workload's text.
                if let Some(at) = reason.find("(hash ") {
                    reason.truncate(at);
                    reason.push_str("(hash [old] -> [new])");
                }
            }
        }
    }
    if let Some(b) = &mut r.baseline {
        b.dir = "[path]/baseline".into();
        b.id = "[baseline-id]".into();
        b.started_at = "[time]".into();
    }
    exporter.render(&r).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_turned_on_regresses_against_a_clean_baseline() {
    let t = FakeTarget::new().await;
    let plan = load_plan(&t, &plan_text(""));
    set_race(&t, false);
    let clean = run(&t, &job(&t, &plan, None, "clean")).await;
    assert!(clean.cells.iter().all(|c| c.stats.corrupted == 0));
    set_race(&t, true);
    let racy_job = job(&t, &plan, None, "racy");
    let mut racy = run(&t, &racy_job).await;

    let base =
        baseline::load_explicit(&t.dir.path().join("results/clean"), "fake-nightly").unwrap();
    baseline::compare(&mut racy, &base, &plan.policy);
    assert!(
        fake_race_victims(&plan.workload, 4) <= 2,
        "4-session cells are too small to be significant"
    );
    assert_eq!(
        racy.regressions,
        [
            "FAKE_BF16=1,FAKE_NOISE=0,s64",
            "FAKE_BF16=1,FAKE_NOISE=3,s64"
        ],
        "exactly the big racy cells regress"
    );
    let info = racy.baseline.as_ref().unwrap();
    assert_eq!(
        (info.compared, info.regressed, info.not_comparable),
        (8, 2, 0)
    );
    assert_eq!(info.test, "fisher_exact_one_sided_greater");
    let regressed = &racy.cells[1];
    let cmp = regressed.comparison.as_ref().unwrap();
    assert!(cmp.p_adjusted.unwrap() < 0.01 && cmp.p_value.unwrap() <= cmp.p_adjusted.unwrap());
    assert!(
        cmp.reasons[0].starts_with("corruption rose from 0/64 (0.0%)"),
        "{:?}",
        cmp.reasons
    );
    export::write_all(&racy_job.dir, &racy).unwrap();
    let junit = read(&racy_job.dir.join("junit.xml"));
    assert_eq!(junit.matches("<failure").count(), 2, "{junit}");
    assert!(read(&racy_job.dir.join("summary.md"))
        .contains("**`FAKE_BF16=1,FAKE_NOISE=0,s64` REGRESSED**"));

    insta::assert_snapshot!(
        "matrix_regressed_summary_md",
        redacted(&racy, &MatrixSummary)
    );
    insta::assert_snapshot!("matrix_regressed_junit_xml", redacted(&racy, &JunitXml));

    // `bisect diff` of the two nights pairs every cell with its own counterpart, and
    // names the launch config that turned the race on.
    let d = diff::diff_dirs(&t.dir.path().join("results/clean"), &racy_job.dir).unwrap();
    assert_eq!(d.rows.len(), 8);
    for (row, cell) in d.rows.iter().zip(&racy.cells) {
        assert_eq!(row.key, cell.id);
        assert_eq!(row.b.as_ref().unwrap().corrupted, cell.stats.corrupted);
        assert_eq!(row.a.as_ref().unwrap().corrupted, 0, "{}", row.key);
    }
    let launch: Vec<_> = d.confounds.iter().filter(|c| c.scope == "launch").collect();
    assert!(!launch.is_empty(), "{:?}", d.confounds);
    assert!(
        launch
            .iter()
            .all(|c| c.name.contains("/launch/cell-r0/decode--")
                && c.b.as_str().unwrap().contains("FAKE_RACE=1")),
        "{launch:?}"
    );

    // The other direction is an improvement, never a regression.
    let fixed_base = Baseline {
        dir: racy_job.dir.clone(),
        record: read_matrix(&racy_job.dir).unwrap(),
        chosen: "explicit",
    };
    let mut fixed = clean.clone();
    baseline::compare(&mut fixed, &fixed_base, &plan.policy);
    assert!(fixed.regressions.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_nights_pass_and_a_changed_workload_is_not_comparable() {
    let t = FakeTarget::new().await;
    let plan = load_plan(&t, &plan_text(""));
    let first = run(&t, &job(&t, &plan, None, "n1")).await;
    let mut second = run(&t, &job(&t, &plan, None, "n2")).await;
    let root = t.dir.path().join("results");
    let dir2 = root.join("n2");
    let found = baseline::find_newest(&root, "fake-nightly", &second.header.started_at, &dir2)
        .unwrap()
        .expect("the first night is found as the baseline");
    assert_eq!(found.record.header.id, first.header.id);
    assert_eq!(found.chosen, "newest");
    baseline::compare(&mut second, &found, &plan.policy);
    assert!(second.regressions.is_empty(), "{:?}", second.regressions);
    assert!(second
        .cells
        .iter()
        .all(|c| c.verdict() == Some(CellStatus::Ok)));

    // Same cells, other ctx: every cell is not comparable, even though the race corrupts.
    let changed_plan = load_plan(&t, &plan_text("ctx = 150"));
    assert_eq!(changed_plan.cells[0].config_hash, plan.cells[0].config_hash);
    let mut changed = run(&t, &job(&t, &changed_plan, None, "n3")).await;
    let base = baseline::load_explicit(&t.dir.path().join("results/n1"), "fake-nightly").unwrap();
    let mut clean_base = base.record.clone();
    for c in &mut clean_base.cells {
        c.stats.counts = Default::default();
        c.stats.counts[SessionClass::Done] = c.sessions as u64;
        c.stats.corrupted = 0;
        c.stats.corruption_rate = 0.0;
    }
    let clean_base = Baseline {
        record: clean_base,
        ..base
    };
    baseline::compare(&mut changed, &clean_base, &changed_plan.policy);
    assert!(changed.regressions.is_empty());
    for c in &changed.cells {
        let cmp = c.comparison.as_ref().unwrap();
        assert_eq!(cmp.status, CellStatus::NotComparable, "{}", c.id);
        assert!(
            cmp.reasons[0].starts_with("workload changed"),
            "{:?}",
            cmp.reasons
        );
    }
    let junit = JunitXml.render(&changed).unwrap();
    assert_eq!(junit.matches("<skipped ").count(), 8, "{junit}");
    assert!(!junit.contains("<failure"));
}

/// The fake as a profile file; each restart command touches the fake's restart marker,
/// so the fake re-reads its launch configs like a restarted engine.
fn write_target(t: &FakeTarget) -> PathBuf {
    crate::crash::write_profile_with(t, "", "", "")
}

async fn bisect_cli(args: Vec<String>, cwd: &Path) -> std::process::Output {
    let cwd = cwd.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let state = tempfile::tempdir().unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_bisect"))
            .args(&args)
            .env("XDG_STATE_HOME", state.path())
            .current_dir(cwd)
            .output()
            .expect("running bisect")
    })
    .await
    .unwrap()
}

/// Through the binary: the newest earlier night is the baseline, and the exit code says
/// whether a cell regressed (1), none did (0), or none did but the cells' load was never
/// measured (3). The nights differ by decode's `FAKE_RACE`, which the fake re-reads at
/// every restart, and the last by its profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_is_one_on_regression_zero_when_identical_three_when_unmeasured() {
    let t = FakeTarget::new().await;
    write_target(&t);
    let plan = plan_text("target = \"target.toml\"")
        .replace("FAKE_BF16 = [\"1\", \"0\"]\n", "")
        .replace("[4, 64]", "[64]");
    load_plan(&t, &plan);
    hold_for_the_poller(&t);
    let before = t.launch_bytes();
    let night = || {
        bisect_cli(
            ["matrix", "nightly.toml", "--results", "results"]
                .map(String::from)
                .to_vec(),
            t.dir.path(),
        )
    };
    set_race(&t, false);
    let clean_bytes = t.launch_bytes();
    let first = night().await;
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(t.launch_bytes(), clean_bytes, "restored after the night");
    set_race(&t, true);
    let second = night().await;
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert_eq!(
        second.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        stdout.contains("Regressions in 2 cells: `FAKE_NOISE=0,s64`, `FAKE_NOISE=3,s64`"),
        "{stdout}"
    );
    let third = night().await;
    let stdout = String::from_utf8_lossy(&third.stdout);
    assert_eq!(third.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("**No regressions.**"), "{stdout}");
    assert_eq!(t.launch_bytes(), before);

    // The same clean night on a profile whose roles serve no metrics: no regression,
    // but no cell can show it ran at its load, so the night is no pass (exit 3).
    let profile = t.dir.path().join("target.toml");
    let blind: String = read(&profile)
        .lines()
        .filter(|l| !l.starts_with("metrics ="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&profile, blind).unwrap();
    let fourth = night().await;
    let stdout = String::from_utf8_lossy(&fourth.stdout);
    let stderr = String::from_utf8_lossy(&fourth.stderr);
    assert_eq!(fourth.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("2 cell(s) inconclusive") && stderr.contains("FAKE_NOISE=0,s64"),
        "{stderr}"
    );
    assert!(
        stdout.contains("**No regressions found, but 2 cells inconclusive**")
            && stdout.contains("## Inconclusive (no regression found, but not shown ok)")
            && stdout.contains("this night's cell has no engine-side load measurement"),
        "{stdout}"
    );
    assert_eq!(t.launch_bytes(), before);

    let bad = bisect_cli(
        ["matrix", "nightly.toml", "--shard", "2/2"]
            .map(String::from)
            .to_vec(),
        t.dir.path(),
    )
    .await;
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("0 <= I < N"));
}

/// The effective-config check of `bisect run`, per restart group: the fake's prefill
/// keeps reporting the first restart's `FAKE_INDEX_BF16` (an engine that does not honour
/// its launch config), so the groups that wrote 0 are blocked with the reason, never
/// driven, never compared; the flag no engine reports is a warning on every cell. A
/// blocked shard cell merges exactly as the unsharded run recorded it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_ignores_its_config_blocks_the_cells() {
    let t = FakeTarget::new().await;
    let before = t.launch_bytes();
    let plan = load_plan(&t, &plan_text(""));
    let clean = run(&t, &job(&t, &plan, None, "clean")).await;
    assert!(clean
        .cells
        .iter()
        .all(|c| c.is_finished() && c.blocked.is_empty()));
    assert_eq!(clean.cells[4].effective["FAKE_BF16"]["prefill"], "0");

    t.engine.ignore_restarts();
    let night_job = job(&t, &plan, None, "ignoring");
    let mut night = run(&t, &night_job).await;
    assert_eq!(night.header.status, RecordStatus::Finished);
    assert_eq!(t.launch_bytes(), before, "launch configs restored");
    let noise_warning = format!("FAKE_NOISE: {}", bisect_harness::arm::NO_EFFECTIVE_WARNING);
    for cell in &night.cells {
        assert_eq!(
            cell.warnings,
            std::slice::from_ref(&noise_warning),
            "{}",
            cell.id
        );
        assert_eq!(cell.effective["FAKE_BF16"]["prefill"], "1", "{}", cell.id);
        assert_eq!(
            cell.readback["FAKE_BF16"]["prefill"], cell.flags["FAKE_BF16"],
            "the launch file says what was written: {}",
            cell.id
        );
        let sessions = night_job.dir.join(&cell.dir).join("sessions.jsonl");
        if cell.flags["FAKE_BF16"] == "1" {
            assert_eq!(cell.status, RecordStatus::Finished, "{}", cell.id);
            assert!(cell.blocked.is_empty());
            assert!(sessions.is_file());
        } else {
            assert_eq!(cell.status, RecordStatus::Blocked, "{}", cell.id);
            assert_eq!(cell.blocked.len(), 1, "{:?}", cell.blocked);
            assert!(
                cell.blocked[0].starts_with(
                    "FAKE_BF16=0 was written and read back, but the prefill engine reports it runs with \"1\""
                ),
                "{:?}",
                cell.blocked
            );
            assert_eq!(cell.stats.counts.total(), 0, "a blocked cell is not driven");
            assert!(!sessions.exists(), "{}", sessions.display());
        }
    }

    // Compared with the clean night: the blocked cells are neither passes nor regressions.
    let base =
        baseline::load_explicit(&t.dir.path().join("results/clean"), "fake-nightly").unwrap();
    baseline::compare(&mut night, &base, &plan.policy);
    let info = night.baseline.as_ref().unwrap();
    assert_eq!((info.compared, info.blocked, info.regressed), (4, 4, 0));
    for cell in night.cells.iter().filter(|c| c.is_blocked()) {
        let cmp = cell.comparison.as_ref().unwrap();
        assert_eq!(cmp.status, CellStatus::Blocked);
        assert_eq!(cmp.reasons, cell.blocked);
        assert!(cmp.p_value.is_none() && cmp.p_adjusted.is_none());
    }
    export::write_all(&night_job.dir, &night).unwrap();
    let junit = read(&night_job.dir.join("junit.xml"));
    assert_eq!(junit.matches("<error ").count(), 4, "{junit}");
    assert!(
        junit.contains("blocked: FAKE_BF16=0 was written"),
        "{junit}"
    );
    let summary = read(&night_job.dir.join("summary.md"));
    assert!(
        summary.contains("## Blocked cells (not driven, never compared)")
            && summary.contains("- `FAKE_BF16=0,FAKE_NOISE=3,s64`: FAKE_BF16=0 was written")
            && summary.contains(&format!("## Warnings\n\n- {noise_warning}\n")),
        "{summary}"
    );

    // Shards of the same engine: the merge takes blocked cells as settled, unchanged.
    let shards: Vec<PathBuf> = (0..2u32)
        .map(|i| t.dir.path().join(format!("results/ignoring-shard{i}")))
        .collect();
    for (i, dir) in (0..2u32).zip(&shards) {
        let j = job(
            &t,
            &plan,
            Some(Shard { index: i, count: 2 }),
            dir.file_name().unwrap().to_str().unwrap(),
        );
        run(&t, &j).await;
    }
    let merged = merge::join(&shards, "merged", "bisect merge").unwrap();
    let out = t.dir.path().join("results/ignoring-merged");
    merge::write(&merged, &out).unwrap();
    let whole = read_matrix(&night_job.dir).unwrap();
    let mut whole_cells = whole.cells.clone();
    for c in &mut whole_cells {
        c.comparison = None;
    }
    assert_eq!(
        untimed(&read_matrix(&out).unwrap().cells),
        untimed(&whole_cells)
    );
    assert_eq!(t.launch_bytes(), before);

    // A later night against the blocked one: its blocked cells are not comparable.
    let blocked_base = Baseline {
        dir: night_job.dir.clone(),
        record: whole,
        chosen: "explicit",
    };
    let mut later = clean.clone();
    baseline::compare(&mut later, &blocked_base, &plan.policy);
    for cell in &later.cells {
        let cmp = cell.comparison.as_ref().unwrap();
        if cell.flags["FAKE_BF16"] == "0" {
            assert_eq!(cmp.status, CellStatus::NotComparable, "{}", cell.id);
            assert!(
                cmp.reasons[0]
                    .starts_with("the baseline cell was blocked: FAKE_BF16=0 was written"),
                "{:?}",
                cmp.reasons
            );
        } else {
            assert_eq!(cmp.status, CellStatus::Ok, "{}", cell.id);
        }
    }
}

/// Cells classify with the target profile's markup families, as `bisect run` does: the
/// fake's race leaks DSML, a leak only where the profile counts DSML.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_classify_with_the_profiles_markup() {
    use bisect_harness::core::classify::MarkupFamily;
    let t = FakeTarget::new().await;
    let plan = load_plan(
        &t,
        &plan_text("")
            .replace("FAKE_NOISE = [\"0\", \"3\"]\n", "")
            .replace("[4, 64]", "[64]"),
    );
    let victims = fake_race_victims(&plan.workload, 64);
    assert!(victims >= 10);
    let all = run(&t, &job(&t, &plan, None, "all-families")).await;
    assert_eq!(all.cells[0].stats.counts[SessionClass::Leak], victims);
    let mut hermes_only = job(&t, &plan, None, "hermes-only");
    hermes_only.target.markup = vec![MarkupFamily::Hermes];
    let hermes = run(&t, &hermes_only).await;
    let counts = &hermes.cells[0].stats.counts;
    assert_eq!(
        counts[SessionClass::Leak],
        0,
        "DSML is not a family this profile counts"
    );
    assert_eq!(counts.total(), 64);
    assert_eq!(
        hermes.cells[1].stats.corrupted, 0,
        "the clean cell stays clean"
    );
}

/// Through the binary: a whole matrix with blocked cells exits 3 (no pass), naming them;
/// a shard exits 0, leaving the night's result to the merge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_cells_exit_three_for_a_whole_matrix_and_zero_for_a_shard() {
    let t = FakeTarget::new().await;
    write_target(&t);
    let plan = plan_text("target = \"target.toml\"")
        .replace("FAKE_NOISE = [\"0\", \"3\"]\n", "")
        .replace("[4, 64]", "[4]");
    load_plan(&t, &plan);
    let before = t.launch_bytes();
    t.engine.ignore_restarts();
    let whole = bisect_cli(
        [
            "matrix",
            "nightly.toml",
            "--results",
            "results",
            "--no-baseline",
        ]
        .map(String::from)
        .to_vec(),
        t.dir.path(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&whole.stderr);
    assert_eq!(whole.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("1 cell(s) blocked") && stderr.contains("FAKE_BF16=0,s4"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&whole.stdout).contains("## Blocked cells"));
    let shard = bisect_cli(
        [
            "matrix",
            "nightly.toml",
            "--results",
            "results",
            "--shard",
            "1/2",
        ]
        .map(String::from)
        .to_vec(),
        t.dir.path(),
    )
    .await;
    assert_eq!(
        shard.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&shard.stderr)
    );
    assert!(String::from_utf8_lossy(&shard.stdout).contains("## Blocked cells"));
    assert_eq!(t.launch_bytes(), before);
}

/// docs/matrix.md shows the Slurm scripts that scripts/slurm-ci.sh submits in CI, byte
/// for byte: the documented scripts are the tested ones.
#[test]
fn the_documented_slurm_scripts_are_the_ones_ci_submits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = read(&root.join("docs/matrix.md"));
    for name in ["nightly-shards.sbatch", "nightly-merge.sbatch"] {
        let script = read(&root.join("scripts/slurm").join(name));
        assert!(
            doc.contains(&format!("```sh\n{script}```\n")),
            "docs/matrix.md does not show scripts/slurm/{name} as it is: paste the file into its block"
        );
    }
    let ci = read(&root.join("scripts/slurm-ci.sh"));
    assert!(
        ci.contains("scripts/slurm/nightly-shards.sbatch")
            && ci.contains("scripts/slurm/nightly-merge.sbatch")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_solo_oracle_runs_each_cell_alone_first_and_leaves_classifier_counts_alone() {
    let t = FakeTarget::new().await;
    // Small cells: every reference session runs alone, held for the poller.
    let text = plan_text("").replace("sessions = [4, 64]", "sessions = [4, 16]");
    let plan = load_plan(&t, &text);
    let mut job = job(&t, &plan, None, "oracle-night");
    job.oracle = Some(bisect_harness::core::solo::SoloOracle { threshold: 1.0 });
    let record = run(&t, &job).await;
    assert_eq!(record.header.status, RecordStatus::Finished);
    for cell in &record.cells {
        let n = cell.sessions;
        let victims = match cell.flags["FAKE_BF16"] == "1" {
            true => fake_race_victims(&plan.workload, n),
            false => 0,
        };
        // The fake's corruption is the classifier's to see (leaks): the oracle's
        // comparison stands beside those sessions and adds no class of its own.
        assert_eq!(
            cell.stats.counts[SessionClass::Leak],
            victims,
            "{}",
            cell.id
        );
        assert_eq!(cell.stats.counts[SessionClass::Diverged], 0, "{}", cell.id);
        assert_eq!(cell.stats.corrupted, victims, "{}", cell.id);
        let alone = job.dir.join("cells").join(&cell.id).join("reference");
        assert!(alone.is_dir(), "{}: its reference pass", cell.id);
    }
    assert!(record.cells.iter().any(|c| c.stats.corrupted > 0));
}
