//! A `run.json` written before the workspace reorganisation (a real embedded-engine
//! run of `bisect run --flag BF16_INDEX_K`, kept in `fixtures/run-v1/`) still loads
//! into the typed records and through `report`, `diff` and `reclassify`; reclassifying
//! it with today's classifier gives back exactly the classes it was written with.

use std::path::{Path, PathBuf};
use std::process::Command;

use bisect_harness::core::arm_stats::{ArmLabel, RecordStatus};
use bisect_harness::core::verdict::Status;
use bisect_harness::results::ResultsDir;

fn fixture_copy(into: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/fixtures/run-v1");
    let dst = into.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for file in ["run.json", "sessions.jsonl", "metrics.csv"] {
        std::fs::copy(src.join(file), dst.join(file)).unwrap();
    }
    dst
}

fn bisect(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bisect"))
        .args(args)
        .output()
        .expect("running bisect");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_run_json_from_before_the_reorganisation_loads_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_copy(tmp.path(), "old");
    let record = ResultsDir::open(&dir).read_record().unwrap();
    assert_eq!(record.header.status, RecordStatus::Finished);
    let on = record.arm(ArmLabel::On).unwrap();
    let off = record.arm(ArmLabel::Off).unwrap();
    assert_eq!((on.stats.corrupted, on.sessions), (22, 80));
    assert_eq!((off.stats.corrupted, off.sessions), (0, 80));
    assert_eq!(record.runs.len(), 2);
    assert_eq!(record.verdict.as_ref().unwrap().status, Status::Implicated);
    // Written back, the record keeps every key it was read with.
    let before: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let after = serde_json::to_value(&record).unwrap();
    for key in before.as_object().unwrap().keys() {
        assert!(after.get(key).is_some(), "key {key} lost on rewrite");
    }
    for (a, b) in before["arms"]
        .as_array()
        .unwrap()
        .iter()
        .zip(after["arms"].as_array().unwrap())
    {
        assert_eq!(a, b, "an arm changed shape on rewrite");
    }
}

#[test]
fn report_and_diff_read_an_old_run() {
    let tmp = tempfile::tempdir().unwrap();
    let a = fixture_copy(tmp.path(), "a");
    let b = fixture_copy(tmp.path(), "b");
    let (ok, stdout, stderr) = bisect(&["report".as_ref(), a.as_os_str()]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("implicated"), "{stdout}");
    assert!(a.join("report.html").exists() && a.join("summary.md").exists());
    let (ok, stdout, stderr) = bisect(&["diff".as_ref(), a.as_os_str(), b.as_os_str()]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("22/80"), "{stdout}");
}

#[test]
fn an_old_run_reclassifies_to_exactly_its_recorded_classes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_copy(tmp.path(), "old");
    let before = ResultsDir::open(&dir).read_sessions().unwrap();
    let (ok, stdout, stderr) = bisect(&["reclassify".as_ref(), dir.as_os_str()]);
    assert!(ok, "{stdout}\n{stderr}");
    let after = ResultsDir::open(&dir).read_sessions().unwrap();
    assert_eq!(before.len(), 160);
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            (&b.label, b.repeat, b.index, b.class, b.first_bad_round),
            (&a.label, a.repeat, a.index, a.class, a.first_bad_round),
            "session {} {} changed class on reclassify: {} -> {}",
            b.label,
            b.index,
            b.evidence,
            a.evidence
        );
    }
    let record = ResultsDir::open(&dir).read_record().unwrap();
    assert_eq!(record.arm(ArmLabel::On).unwrap().stats.corrupted, 22);
    assert_eq!(record.verdict.unwrap().status, Status::Implicated);
}
