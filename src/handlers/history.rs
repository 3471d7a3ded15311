//! `bisect history DIR`: read the nights, assess them, run the searches `--auto-bisect`
//! asks for (each in-process through the commits lifecycle), write history.json,
//! history.md, history.html and history-junit.xml into DIR, print the summary, and map
//! the newest night to the exit code (1 regression, 3 missing or insufficient, else 0).

use std::process::ExitCode;

use super::recover_journal;
use crate::cli::HistoryArgs;
use bisect_harness::commands::commits;
use bisect_harness::commands::history::record::SearchPlan;
use bisect_harness::commands::history::{self, bisect, export};
use bisect_harness::exit::Failure;
use bisect_harness::results::Exporter;

pub(crate) fn history(args: &HistoryArgs) -> anyhow::Result<ExitCode> {
    let job = args.job()?;
    let (mut record, nights) = history::assemble(&job)?;
    if args.auto_bisect {
        let mut searched = false;
        for entry in &record.regressions {
            let SearchPlan::Prepared { dir, .. } = &entry.search else {
                if let SearchPlan::Unavailable { why } = &entry.search {
                    stderr_line!(
                        "no search for {} (first bad night {}): {why}",
                        entry.cell,
                        entry.first_bad.label
                    );
                }
                continue;
            };
            if entry.landed.is_some() {
                continue;
            }
            recover_journal(&args.testbed().journal_dir)?;
            // One search that cannot run is said and skipped: the history is still
            // written and its exit code still says what the nights say.
            if let Err(e) = search(args, &job, &nights, entry, dir) {
                // Ctrl-C stops the reading (exit 130), not just this search.
                if matches!(e.downcast_ref::<Failure>(), Some(Failure::Interrupted)) {
                    return Err(e);
                }
                stderr_line!("auto-bisect of {} failed: {e:#}", entry.cell);
                continue;
            }
            searched = true;
        }
        if searched {
            // The answers land: read the history again, searches included.
            record = history::assemble(&job)?.0;
        }
    }
    export::write_all(&job.dir, &record)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!("{}", export::markdown::HistorySummary.render(&record)?);
        println!("\nhistory: {}", job.dir.join("history.html").display());
    }
    Ok(ExitCode::from(history::Outcome::of(&record).exit_code()))
}

/// Run one prepared search in-process, through the commits lifecycle.
fn search(
    args: &HistoryArgs,
    job: &history::HistoryJob,
    nights: &[history::read::Night],
    entry: &bisect_harness::commands::history::record::RegressionEntry,
    dir: &str,
) -> anyhow::Result<()> {
    let plan = bisect::commits_plan(
        &job.dir,
        nights,
        &entry.cell,
        &entry.event,
        args.testbed(),
        &job.command,
    )?;
    stderr_line!(
        "auto-bisect: {} regressed between night {} ({}) and night {} ({}): bisect commits into {}",
        entry.cell,
        entry.last_good.label,
        entry.last_good.build.as_deref().unwrap_or("-"),
        entry.first_bad.label,
        entry.first_bad.build.as_deref().unwrap_or("-"),
        job.dir.join(dir).display()
    );
    let found = super::commits::search(&plan, true)?;
    stderr_line!(
        "auto-bisect: {}",
        commits::export::CommitsLine.render(&found)?.trim_end()
    );
    Ok(())
}
