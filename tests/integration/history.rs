//! `bisect history` end to end on the embedded engine: nightly matrices run by the
//! binary on the commits test fixture (the engine's launch scripts in a git repository,
//! the bf16 index-K default turned on by one commit), then the history: the regression
//! flagged on the first night of the bad build and not before, its last good and first
//! bad night named with their builds, and `--auto-bisect` finding and verifying the
//! commit through `bisect commits`, its answer landed in history.json. The race depends
//! on how requests interleave, so the assertions are states and the answer, never counts.

use std::path::Path;

use bisect_harness::commands::answer::SearchAnswer;
use bisect_harness::commands::history::record::{HistoryRecord, NightStatus, SearchPlan};
use bisect_harness::core::history::State;

use crate::commits::{git, scripted_repo, Change, BF16_OFF, BF16_ON};
use crate::common::read;
use crate::report_html::{chromium, chromium_run, screenshot};

/// The dashboard in headless Chromium: no console or network errors, its charts in the
/// DOM, a screenshot with content (`BISECT_SAVE_HISTORY_SCREENSHOT=FILE` keeps it).
fn dashboard_renders_in_chromium(page: &Path) {
    let Some(browser) = chromium() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let shot = scratch.path().join("history.png");
    let png = screenshot(&browser, scratch.path(), page, &shot, "1280,1600");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    if let Some(dest) = std::env::var_os("BISECT_SAVE_HISTORY_SCREENSHOT") {
        std::fs::copy(&shot, dest).unwrap();
    }
    let dom = chromium_run(
        &browser,
        &scratch.path().join("profile-dom"),
        &["--dump-dom".into()],
        page,
    );
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.status.success());
    assert!(
        dom_text.matches("<svg").count() >= 2,
        "the grid and a trend reach the DOM"
    );
}

/// The profile's roles as a target file: the search needs one on disk.
fn write_target(dir: &Path, profile: &bisect_harness::config::TargetProfile) -> std::path::PathBuf {
    let mut text = format!(
        "name = \"engine-repo\"\napi = \"{}\"\nmodel = \"{}\"\nengine = \"embedded\"\n",
        profile.api, profile.model
    );
    for role in &profile.roles {
        text.push_str(&format!(
            "[[role]]\nname = \"{}\"\nlaunch = \"{}\"\nhealth = \"{}\"\nmetrics = \"{}\"\n",
            role.name,
            role.launch.display(),
            role.health,
            role.metrics.as_deref().unwrap_or_default()
        ));
    }
    let path = dir.join("target.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn bisect(dir: &Path, args: &[&str]) -> std::process::Output {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    crate::common::bisect_in(dir, &args)
}

#[test]
fn a_regression_across_nights_is_flagged_on_its_night_and_bisected_to_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // 8 commits after the good end; commit 6 turns bf16 index-K on.
    let (repo, profile, shas) = scripted_repo(
        dir,
        8,
        &[(BF16_ON, BF16_OFF)],
        Some(Change {
            commit: 6,
            edits: &[(BF16_OFF, BF16_ON)],
            subject: "turn the bf16 index-K default on (needle recall)",
        }),
    );
    let target = write_target(dir, &profile);
    std::fs::write(
        dir.join("plan.toml"),
        format!(
            "name = \"history-test\"\ntarget = \"{}\"\nworkload = \"agentic\"\nsessions = [80]\nrepeats = 2\n\
             [axes]\nHICACHE = [\"on\"]\n\
             [commits]\nrepo = \"{}\"\nbuild = \"sh -n prefill.sh && sh -n decode.sh\"\nsessions = 80\nmax_sessions = 4000\n",
            target.display(),
            repo.display()
        ),
    )
    .unwrap();
    // Nights 1-3 on commits 1-3 (good), night 4 on commit 8 (bad): the launch scripts the
    // target starts from are the repository's working tree, checked out per night.
    let nights = [
        (1, "2026-11-01"),
        (2, "2026-11-02"),
        (3, "2026-11-03"),
        (8, "2026-11-04"),
    ];
    for (commit, date) in nights {
        git(&repo, &["checkout", "-q", &shas[commit]]);
        let out = bisect(
            dir,
            &[
                "matrix",
                "plan.toml",
                "--night",
                date,
                "--build",
                &shas[commit],
                "--results",
                "results",
            ],
        );
        assert!(
            matches!(out.status.code(), Some(0 | 1 | 3)),
            "night {date}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    git(&repo, &["checkout", "-q", "main"]);

    let out = bisect(dir, &["history", "results", "--auto-bisect", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an open regression exits 1: {stderr}"
    );
    let record: HistoryRecord = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("history.json on stdout ({e}): {stderr}"));
    assert_eq!(record.nights.len(), 4);
    assert!(record
        .nights
        .iter()
        .all(|n| n.status == NightStatus::Finished));
    assert_eq!(record.nights[3].build.as_deref(), Some(shas[8].as_str()));
    let cell = &record.cells[0];
    let states: Vec<State> = cell.series.iter().map(|p| p.state()).collect();
    assert_eq!(states[3], State::Regression, "{states:?}");
    assert!(
        states[..3].iter().all(|&s| s != State::Regression),
        "{states:?}"
    );

    assert_eq!(record.regressions.len(), 1);
    let r = &record.regressions[0];
    assert_eq!(
        (r.last_good.night, r.first_bad.night, r.flagged.night),
        (2, 3, 3)
    );
    assert_eq!(r.last_good.build.as_deref(), Some(shas[3].as_str()));
    assert_eq!(r.first_bad.build.as_deref(), Some(shas[8].as_str()));
    let SearchPlan::Prepared {
        command,
        dir: search_dir,
        good,
        bad,
    } = &r.search
    else {
        panic!("no search prepared: {:?}", r.search);
    };
    assert_eq!((good, bad), (&shas[3], &shas[8]));
    assert!(command.starts_with("bisect commits --repo"), "{command}");
    assert!(command.contains("--set HICACHE=on"), "{command}");
    let landed = r
        .landed
        .as_ref()
        .unwrap_or_else(|| panic!("no answer landed: {stderr}"));
    assert_eq!(
        landed.answer,
        Some(SearchAnswer::Culprit),
        "{}",
        landed.words
    );
    assert_eq!(
        landed.culprit.as_deref(),
        Some(shas[6].as_str()),
        "{}",
        landed.words
    );
    assert!(dir
        .join("results")
        .join(search_dir)
        .join("commits.json")
        .is_file());

    // The files: the dashboard links each night's report, JUnit fails the cell.
    let page = dir.join("results/history.html");
    let html = read(&page);
    for night in &record.nights {
        let link = format!("{}/report.html", night.dir.as_deref().unwrap());
        assert!(html.contains(&link), "no link to {link}");
    }
    let junit = read(&dir.join("results/history-junit.xml"));
    assert!(junit.contains("<failure"), "{junit}");
    dashboard_renders_in_chromium(&page);
    // A second reading lands the same answer without searching again.
    let again = bisect(dir, &["history", "results", "--auto-bisect", "--json"]);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("auto-bisect:"));
    let again: HistoryRecord = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        again.regressions[0]
            .landed
            .as_ref()
            .and_then(|l| l.culprit.clone()),
        Some(shas[6].clone())
    );
}
