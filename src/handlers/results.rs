//! The commands that read results directories instead of running engines:
//! `bisect diff A B`, `bisect reclassify DIR` and `bisect report DIR` (re-render the
//! record's companions, report.html included, for a run, a load sweep or a matrix).

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use crate::cli::{DiffArgs, ReclassifyArgs};
use bisect_harness::commands::diff;
use bisect_harness::commands::matrix::export::html;
use bisect_harness::commands::matrix::record::read_matrix;
use bisect_harness::exit::{Failure, Problem};
use bisect_harness::results::{export, load, Exporter, ResultsDir};

pub(crate) fn diff(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let d = diff::diff_dirs(&args.a, &args.b)?;
    print!("{}", diff::render(&d, args.format())?);
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn reclassify(args: &ReclassifyArgs) -> anyhow::Result<ExitCode> {
    let summary =
        bisect_harness::commands::reclassify::reclassify_dir(&args.dir, args.workload.as_deref())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary.record)?);
        return Ok(ExitCode::SUCCESS);
    }
    print!(
        "{}",
        bisect_harness::results::table::render(&summary.record)
    );
    println!(
        "reclassified {} session(s) under the current rules: {} changed class, {} incomplete (ended on a round now ok)",
        summary.record.runs.iter().map(|r| r.sessions).sum::<u64>(),
        summary.changed.len(),
        summary.incomplete
    );
    if let Some(note) = &summary.markup_note {
        println!("note: {note}");
    }
    for (label, repeat, index, old, new) in &summary.changed {
        println!(
            "  {label} r{repeat} #{index}: {} -> {}",
            old.name(),
            new.name()
        );
    }
    let now = summary
        .record
        .verdict
        .as_ref()
        .map(|v| v.status.as_str().to_string());
    println!(
        "verdict: {} -> {}",
        summary.previous_verdict.as_deref().unwrap_or("none"),
        now.as_deref().unwrap_or("none")
    );
    println!(
        "kept the originals as {} and {}",
        summary.sessions_backup.display(),
        summary.run_json_backup.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A results directory bisect cannot read: bad input, with what it reads.
fn bad(e: anyhow::Error) -> Failure {
    Failure::bad_input(
        format!("{e:#}"),
        "pass a results directory written by `bisect run`, `bisect load` or `bisect matrix`",
    )
}

/// `bisect report DIR`: a run's run.json (keeping keys such as `reclassified`),
/// summary.md and report.html; a load sweep's summary.md and report.html (its load.json
/// as written); or a matrix's report.html.
pub(crate) fn report(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let run_json = dir.join("run.json");
    let matrix_json = dir.join("matrix.json");
    if !run_json.is_file() && matrix_json.is_file() {
        let record = read_matrix(dir)
            .map_err(|e| Failure::BadInput(Problem::message_only(format!("{e:#}"))))?;
        let report = &html::MatrixHtml;
        export::write_all(dir, &record, &[report])?;
        let out = dir.join(report.file_name());
        if json {
            println!("{}", serde_json::to_string_pretty(&record)?);
        } else {
            println!("wrote {}", out.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !run_json.is_file() && dir.join("load.json").is_file() {
        let record = load::rerender(dir).map_err(bad)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&record)?);
        } else {
            print!("{}", load::table::LoadTable.render(&record)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let results = ResultsDir::open(dir);
    let record = results.read_record().map_err(bad)?;
    let raw: Value = std::fs::read_to_string(&run_json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    bisect_harness::commands::reclassify::write_record_keeping(
        &results,
        &record,
        &raw,
        Default::default(),
    )?;
    if json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!("{}", bisect_harness::results::table::render(&record));
    }
    Ok(ExitCode::SUCCESS)
}
