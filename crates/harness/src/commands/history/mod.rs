//! `bisect history DIR` (docs/history.md): the nightly matrices under DIR read as a
//! history. Per cell: the series (rate and interval, a load cell's threshold, sessions,
//! build) and a state per night (regression, suspicious, ok, insufficient, missing) by
//! the rules of [`crate::core::history`]; regressions with their last good and first bad
//! night; the `bisect commits` search between those nights' builds, prepared, and with
//! `--auto-bisect` run, its answer landed beside the regression ([`bisect`]).
//!
//! - [`read`]: the nights (records, absent dates) and each cell's observations.
//! - [`record`]: what `history.json` holds.
//! - [`export`]: history.json, history.html (the dashboard), history.md, junit.xml.
//! - [`bisect`]: the searches between a regression's builds.

pub mod bisect;
pub mod export;
pub mod read;
pub mod record;

use std::path::PathBuf;

use crate::commands::matrix::record::CellStatus;
use crate::core::history::{assess, Assessment, HistoryPolicy, State};
use crate::core::stats;
use read::{cell_ids, observe, read_nights, Night};
use record::{CellHistory, CellKind, CellPoint, HistoryRecord, NightRef, RegressionEntry};

/// What `bisect history` reads and how.
#[derive(Debug, Clone)]
pub struct HistoryJob {
    pub dir: PathBuf,
    /// The plan's name; `None`: the only plan under `dir`.
    pub plan: Option<String>,
    pub policy: HistoryPolicy,
    /// Dates missing between the first and the last night are absent nights.
    pub gaps: bool,
    pub command: String,
}

/// Read the nights and assess them. Searches are prepared, not run.
pub fn assemble(job: &HistoryJob) -> anyhow::Result<(HistoryRecord, Vec<Night>)> {
    let read = read_nights(&job.dir, job.plan.as_deref(), job.gaps)?;
    let nights = read.nights;
    let ids = cell_ids(&nights);
    // The newest record's plan: a cell no longer in it is history, not a failing test.
    let newest_plan: Vec<String> = nights
        .iter()
        .rev()
        .find_map(|n| n.record.as_ref())
        .map(|r| r.plan.cells.clone())
        .unwrap_or_default();
    let rate_ids: Vec<&String> = ids
        .iter()
        .filter(|(_, k)| *k == CellKind::Rate)
        .map(|(id, _)| id)
        .collect();

    // Each rate cell's nights, with the judged sessions of its earlier measured nights
    // (the under-sampling reference).
    let grid: Vec<Vec<_>> = rate_ids
        .iter()
        .map(|id| {
            let mut earlier: Vec<u64> = Vec::new();
            nights
                .iter()
                .map(|night| {
                    let observed = observe(night, id, &earlier);
                    if let crate::core::history::Observation::Measured { tally, .. } =
                        &observed.observation
                    {
                        earlier.push(tally.judged);
                    }
                    observed
                })
                .collect()
        })
        .collect();
    let labels: Vec<String> = nights.iter().map(|n| n.entry.label.clone()).collect();
    let assessed = assess(&grid, &labels, &job.policy);

    let mut cells = Vec::new();
    for (id, kind) in &ids {
        let series = match kind {
            CellKind::Rate => {
                let c = rate_ids.iter().position(|r| *r == id).expect("a rate cell");
                nights
                    .iter()
                    .zip(&assessed.cells[c])
                    .map(|(night, a)| point(night, id, a.clone()))
                    .collect()
            }
            CellKind::Load => nights
                .iter()
                .map(|night| point(night, id, load_assessment(night, id)))
                .collect(),
        };
        cells.push(CellHistory {
            id: id.clone(),
            kind: *kind,
            retired: !newest_plan.iter().any(|c| c == id),
            series,
        });
    }

    let night_ref = |n: usize| NightRef {
        night: n,
        label: nights[n].entry.label.clone(),
        build: nights[n].entry.build_words().map(str::to_string),
    };
    let regressions = assessed
        .events
        .iter()
        .map(|event| {
            let cell = rate_ids[event.cell].clone();
            let search = bisect::prepare(&nights, &cell, event);
            let landed = bisect::landed(&job.dir, &search);
            RegressionEntry {
                cell,
                event: event.clone(),
                last_good: night_ref(event.last_good_night),
                first_bad: night_ref(event.first_bad_night),
                flagged: night_ref(event.flagged_night),
                search,
                landed,
            }
        })
        .collect();

    let record = HistoryRecord {
        schema: record::SCHEMA.into(),
        command: job.command.clone(),
        generated_at: crate::commands::matrix::record::now(),
        plan: read.plan,
        policy: job.policy,
        family: assessed.family,
        nights: nights.iter().map(|n| n.entry.clone()).collect(),
        cells,
        regressions,
        skipped: read.skipped,
    };
    Ok((record, nights))
}

/// A cell's point on a night: its counts, rate and interval, threshold, directory.
fn point(night: &Night, id: &str, assessment: Assessment) -> CellPoint {
    let cell = night
        .record
        .as_ref()
        .and_then(|r| r.cells.iter().find(|c| c.id == id))
        .filter(|c| c.is_finished());
    let (sessions, judged, corrupted) = cell.map_or((0, 0, 0), |c| {
        (c.stats.sessions(), c.stats.judged(), c.stats.corrupted)
    });
    let rate = (judged > 0).then(|| stats::rate(corrupted, judged));
    let ci95 = (judged > 0).then(|| {
        let (lo, hi) = stats::wilson(corrupted, judged, 0.95);
        [lo, hi]
    });
    let dir = match (&night.entry.dir, cell) {
        (Some(d), Some(c)) => Some(format!("{d}/{}", c.dir)),
        _ => None,
    };
    CellPoint {
        sessions,
        judged,
        corrupted,
        rate,
        ci95,
        threshold: cell
            .and_then(|c| c.load.as_ref())
            .map(|l| l.threshold.clone()),
        dir,
        assessment,
    }
}

/// A load cell's night: a threshold is not a count, so it is judged as its night judged
/// it against the night before (docs/matrix.md): regressed, inconclusive (here
/// insufficient) or ok; missing when it did not run.
fn load_assessment(night: &Night, id: &str) -> Assessment {
    let cell = night
        .record
        .as_ref()
        .and_then(|r| r.cells.iter().find(|c| c.id == id));
    let (state, reasons) = match cell {
        None if night.record.is_none() => (
            State::Missing,
            vec!["no record of this night (the nightly did not run)".into()],
        ),
        None => (State::Missing, vec!["not in this night's plan".into()]),
        Some(c) if !c.is_finished() => (
            State::Missing,
            vec![format!("did not finish (status {:?})", c.status)],
        ),
        Some(c) => match c.comparison.as_ref() {
            Some(cmp) => match cmp.status {
                CellStatus::Regressed => (State::Regression, cmp.reasons.clone()),
                CellStatus::Inconclusive => (State::Insufficient, cmp.reasons.clone()),
                CellStatus::Blocked => (State::Missing, cmp.reasons.clone()),
                _ => (State::Ok, cmp.reasons.clone()),
            },
            None => (
                State::Ok,
                vec!["no earlier night compared (its threshold stands alone)".into()],
            ),
        },
    };
    Assessment {
        state,
        e_rise: None,
        e_drop: None,
        chain_nights: 0,
        reasons,
        reset: None,
        event: None,
    }
}

/// What the newest nights say: the cells with a regression open, and how many cannot
/// be shown ok or are suspicious. Its [`Outcome::exit_code`] is `bisect history`'s, and
/// the summary and the dashboard word it.
pub struct Outcome<'a> {
    pub regressed: Vec<&'a str>,
    /// Missing or insufficient on the newest night: no pass without data.
    pub unshown: usize,
    pub suspicious: usize,
}

impl<'a> Outcome<'a> {
    pub fn of(r: &'a HistoryRecord) -> Outcome<'a> {
        // A regression still open counts on a night whose cell went unmeasured too: the
        // newest night's state is then missing, but the regression is not gone.
        let latest: Vec<(&str, State)> = r
            .cells
            .iter()
            .filter(|c| !c.retired)
            .filter_map(|c| {
                let p = c.latest()?;
                let state = match p.assessment.event {
                    Some(_) => State::Regression,
                    None => p.state(),
                };
                Some((c.id.as_str(), state))
            })
            .collect();
        let count = |f: fn(State) -> bool| latest.iter().filter(|(_, s)| f(*s)).count();
        Outcome {
            regressed: latest
                .iter()
                .filter(|(_, s)| *s == State::Regression)
                .map(|(id, _)| *id)
                .collect(),
            unshown: count(|s| matches!(s, State::Missing | State::Insufficient)),
            suspicious: count(|s| s == State::Suspicious),
        }
    }

    /// 1 when a regression is open on the newest night, else 3 when a cell's newest
    /// night is missing or insufficient (no pass without data), else 0 (suspicious cells
    /// pass, said in the summary).
    pub fn exit_code(&self) -> u8 {
        if !self.regressed.is_empty() {
            crate::exit::REGRESSION
        } else if self.unshown > 0 {
            crate::exit::COULD_NOT_RUN
        } else {
            crate::exit::OK
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::history::export::html::tests::sample_record;

    #[test]
    fn the_exit_code_keeps_an_open_regression_on_an_unmeasured_night_and_skips_retired_cells() {
        let mut r = sample_record();
        // The sample's newest night: a regression open in its first cell.
        assert_eq!(Outcome::of(&r).exit_code(), crate::exit::REGRESSION);
        // The same cell unmeasured on the newest night, the regression still open: 1.
        let newest = r.cells[0].series.last_mut().unwrap();
        newest.assessment.state = State::Missing;
        assert_eq!(Outcome::of(&r).exit_code(), crate::exit::REGRESSION);
        // No regression open: the unmeasured and insufficient newest nights make it 3.
        r.cells[0].series.last_mut().unwrap().assessment.event = None;
        assert_eq!(Outcome::of(&r).exit_code(), crate::exit::COULD_NOT_RUN);
        // Cells no longer in the plan do not count; the others are ok or suspicious: 0.
        for c in &mut r.cells {
            let state = c.latest().map(CellPoint::state);
            c.retired = matches!(state, Some(State::Missing | State::Insufficient));
        }
        assert_eq!(Outcome::of(&r).exit_code(), crate::exit::OK);
    }
}
