//! report.html of a real run against the fake engine, opened in headless Chromium: it must
//! render without console or network errors, carry its SVG charts in the DOM, and give a
//! screenshot with content. Also the summary.md snapshot of the same kind of run.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{fake_race_victims, FakeTarget};

/// The Chromium binary, or why the test cannot run: fails under CI, skips elsewhere.
pub(crate) fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    });
    if found.is_none() {
        let how =
            "headless Chromium is not installed: apt-get update && apt-get install -y chromium";
        if std::env::var_os("CI").is_some() {
            panic!("{how}");
        }
        eprintln!("skipping the browser check: {how}");
    }
    found
}

pub(crate) fn chromium_run(
    browser: &Path,
    profile: &Path,
    extra: &[String],
    page: &Path,
) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("running chromium")
}

/// `page` rendered by headless Chromium into `shot` at `size` ("W,H"), with a profile
/// under `scratch`: it must exit 0 with no console or network error. Its PNG bytes.
pub(crate) fn screenshot(
    browser: &Path,
    scratch: &Path,
    page: &Path,
    shot: &Path,
    size: &str,
) -> Vec<u8> {
    let out = chromium_run(
        browser,
        &scratch.join("profile-shot"),
        &[
            format!("--screenshot={}", shot.display()),
            format!("--window-size={size}"),
        ],
        page,
    );
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "chromium failed: {log}");
    for bad in [":CONSOLE(", "Uncaught", "net::ERR_"] {
        assert!(!log.contains(bad), "browser reported {bad}: {log}");
    }
    std::fs::read(shot).expect("screenshot written")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_html_renders_in_headless_chromium() {
    let t = FakeTarget::new().await;
    let plan = t.plan("FAKE_BF16", 48, 4);
    let victims = fake_race_victims(&plan.workload, 48);
    let mut control = t.engine.control();
    crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let page = plan.run_dir.join("report.html");
    let html = crate::common::read(&page);
    // Rate bars, first bad round, one timeline per arm block, corruption against time.
    let charts = html.matches("<svg").count();
    assert_eq!(charts, 5, "charts in the page");
    assert_eq!(
        html.matches("<details class=\"session corrupted\">")
            .count() as u64,
        victims.min(bisect_harness::results::html::WORST_SESSIONS as u64)
    );
    assert!(
        html.contains("&lt;｜DSML｜parameter"),
        "evidence shown escaped"
    );
    assert!(
        !html.contains("<｜DSML｜"),
        "engine text must never reach the page raw"
    );
    assert!(html.contains("Verdict: implicated"));
    for external in ["<script", "<link", "@import", "url("] {
        assert!(!html.contains(external), "self-contained: found {external}");
    }

    let Some(browser) = chromium() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let shot = scratch.path().join("report.png");
    let png = screenshot(&browser, scratch.path(), &page, &shot, "1280,2000");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    assert!(
        png.len() > 40_000,
        "screenshot too plain to hold charts: {} bytes",
        png.len()
    );
    if let Some(dest) = std::env::var_os("BISECT_SAVE_SCREENSHOT") {
        std::fs::copy(&shot, dest).unwrap();
    }

    let dom = chromium_run(
        &browser,
        &scratch.path().join("profile-dom"),
        &["--dump-dom".into()],
        &page,
    );
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.status.success());
    assert_eq!(
        dom_text.matches("<svg").count(),
        charts,
        "every chart in the page reaches the DOM"
    );
    assert!(dom_text.matches("<rect").count() > 10);
    assert!(dom_text.contains("<details"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_md_snapshot() {
    let t = FakeTarget::new().await;
    let plan = t.plan("FAKE_BF16", 32, 3);
    let mut control = t.engine.control();
    crate::common::run_quiet(&plan, &mut control).await.unwrap();
    let summary = crate::common::read(&plan.run_dir.join("summary.md"));
    insta::with_settings!({filters => redactions()}, {
        insta::assert_snapshot!("summary_md_fake_bf16", summary);
    });
}

/// insta filters for results that vary from run to run: ports, temp paths, times, and the
/// load figures (wall time, tokens/s, peak concurrency) a busy machine changes.
pub fn redactions() -> Vec<(&'static str, &'static str)> {
    vec![
        (r"127\.0\.0\.1:\d+", "127.0.0.1:[port]"),
        (r"/[^\s|`)]*/\.tmp[^\s|`)]*", "[tmp]"),
        (r"/tmp/[^\s|`)]*", "[tmp]"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "[time]"),
        // The phase accounting is all timings.
        (r"(?m)^wall \d[^\n]*", "[phases]"),
        // What the run cost: its restarts stay, the times and engine-hours go.
        (r"(?m)^(cost: \d+ restarts?) \([^\n]*", "$1 [times]"),
        (r"\b\d+\.\d+s\b", "[wall]"),
        (r"(client|prefill|decode) \d+", "$1 [peak]"),
        (r"\| \d+ \|\n", "| [tok/s] |\n"),
        // Load warnings come and go with the machine's speed; the counts do not.
        (r" \(warnings: [^)]*\)", ""),
        (r"(?m)^- warning: [^\n]*\n", ""),
        (
            r"\| (peak_running\.[a-z]+|wall_s|tokens_per_s) \|[^\n]*",
            "| $1 | [load] |",
        ),
        // The load gap is noted only when the engine fell behind the client (a busy
        // machine): a measurement of one execution, like the wall time.
        (r"(?m)^\| load_gap \|[^\n]*\n", ""),
    ]
}
