//! A load cell against its baseline night's: did the threshold move, and is the move
//! shown ([`crate::core::load::compare`]); and the two table columns that say so.
//!
//! A lower threshold on a level the baseline showed flat is a regression; a lower one on
//! a level the baseline left undecided, or a night whose sweep gave no answer, is
//! inconclusive (no pass); a threshold unchanged or higher is ok, unless tonight's
//! engine-side load fell short at or below it (a lower threshold is then not ruled out).

use super::empty;
use crate::commands::matrix::record::{
    CellComparison, CellRecord, CellStatus, ThresholdComparison,
};
#[cfg(test)]
use crate::core::load::compare::threshold_words;
use crate::core::load::compare::{movement, short_levels, threshold_level, Moved};
use crate::core::load::Answer;

/// A comparable load cell (same sweep, same workload, both finished) against its
/// baseline cell.
pub(in crate::commands::matrix) fn compare(
    cell: &CellRecord,
    old: &CellRecord,
    alpha: f64,
) -> CellComparison {
    let mut cmp = empty(CellStatus::Ok, Some(old), Vec::new());
    let (Some(now), Some(then)) = (&cell.load, &old.load) else {
        cmp.status = CellStatus::NotComparable;
        cmp.reasons = vec!["the baseline cell is not a load sweep".into()];
        return cmp;
    };
    let moved = match (&now.answer, &then.answer) {
        (Some(a), Some(b)) => movement(a, b, &now.shown, &then.shown, alpha),
        _ => None,
    };
    cmp.threshold = Some(ThresholdComparison {
        baseline: then.threshold.clone(),
        moved: moved.as_ref().map(|m| m.moved),
        shown: moved.as_ref().is_some_and(|m| m.shown),
    });
    let Some(m) = moved else {
        cmp.status = CellStatus::Inconclusive;
        for (side, l) in [("this night's", now), ("the baseline's", then)] {
            if matches!(l.answer, None | Some(Answer::NoBaseline)) {
                cmp.reasons.push(format!(
                    "{side} sweep gave no answer ({}): the thresholds cannot be compared",
                    l.threshold
                ));
            }
        }
        return cmp;
    };
    cmp.reasons.push(m.words);
    let tonight = now.answer.as_ref().and_then(threshold_level);
    let short = short_levels(&now.shown, tonight);
    if m.moved == Moved::Lower {
        cmp.status = if m.shown {
            CellStatus::Regressed
        } else {
            CellStatus::Inconclusive
        };
    } else if !short.is_empty() {
        cmp.status = CellStatus::Inconclusive;
        let short: Vec<String> = short.iter().map(u32::to_string).collect();
        cmp.reasons.push(format!(
            "tonight's engine-side load fell short at {} in flight: a lower threshold is not ruled out",
            short.join(", ")
        ));
    }
    cmp
}

/// The baseline column of a load cell: the baseline night's threshold.
pub(in crate::commands::matrix) fn baseline_words(c: &CellRecord) -> String {
    match &c.comparison {
        None => String::new(),
        Some(x) if x.status == CellStatus::New => "new".into(),
        Some(x) => x.threshold.as_ref().map_or_else(
            || x.status.name().to_string(),
            |t| format!("threshold {}", t.baseline),
        ),
    }
}

/// The change column of a load cell: which way the threshold moved, and the status.
pub(in crate::commands::matrix) fn change_words(c: &CellRecord) -> String {
    let Some(x) = &c.comparison else {
        return String::new();
    };
    let moved = x.threshold.as_ref().and_then(|t| t.moved);
    match (moved, x.status) {
        (Some(m), CellStatus::Ok) => format!("threshold {}", m.as_str()),
        (Some(m), status) => format!("threshold {}: {}", m.as_str(), status.name()),
        (None, status) => status.name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::commands::diff::tests::{cell, matrix};
    use crate::commands::matrix::baseline::{compare as compare_nights, Baseline};
    use crate::commands::matrix::export::markdown::MatrixSummary;
    use crate::commands::matrix::export::{csv::MatrixCsv, html::MatrixHtml};
    use crate::commands::matrix::plan::LoadSweep;
    use crate::commands::matrix::plan::RegressionPolicy;
    use crate::commands::matrix::record::{LoadCellRecord, MatrixRecord};
    use crate::core::evidence::Policy;
    use crate::core::load::simulate::{sweep_curve, Curve};
    use crate::core::load::{Allocation, LoadParams};
    use crate::results::Exporter;

    const ID: &str = "load,l1+16+32+64,s320";

    fn sweep() -> LoadSweep {
        LoadSweep {
            levels: vec![1, 16, 32, 64],
            flag: None,
            allocation: Allocation::Fixed { sessions: 320 },
        }
    }

    /// A finished load cell whose sessions corrupt 20% from `at` in flight on (seeded:
    /// 320 sessions per level name the step's level every time).
    fn swept(at: u32) -> CellRecord {
        let params = LoadParams::new(
            sweep().levels,
            false,
            sweep().allocation,
            &Policy::default(),
            5,
        );
        let curve = Curve::Step {
            at,
            rate: 0.2,
            background: 0.0,
        };
        let report = sweep_curve(curve, &params, 3);
        let mut c = cell(ID, 0, 0);
        c.load = Some(LoadCellRecord::of(&sweep(), Some(&report)));
        c.stats.wall_s = 9.0;
        c
    }

    /// Tonight's cells compared with the baseline's, beside a plain cell on both nights.
    fn night(base: CellRecord, tonight: CellRecord) -> MatrixRecord {
        let baseline = Baseline {
            dir: PathBuf::from("old"),
            record: matrix(vec![cell("plain", 0, 40), base]),
            chosen: "explicit",
        };
        let mut n = matrix(vec![cell("plain", 0, 40), tonight]);
        compare_nights(&mut n, &baseline, &RegressionPolicy::default());
        n
    }

    #[test]
    fn a_threshold_that_fell_onto_a_level_the_baseline_showed_flat_regresses() {
        let n = night(swept(64), swept(32));
        let c = &n.cells[1];
        assert_eq!(
            c.load.as_ref().unwrap().threshold,
            "32 (rise between 16 and 32)"
        );
        let cmp = c.comparison.as_ref().unwrap();
        assert_eq!(cmp.status, CellStatus::Regressed, "{:?}", cmp.reasons);
        assert!(
            cmp.reasons[0].starts_with("the threshold fell from 64 in flight to 32 in flight"),
            "{:?}",
            cmp.reasons
        );
        let t = cmp.threshold.as_ref().unwrap();
        assert_eq!(
            (t.baseline.as_str(), t.moved, t.shown),
            ("64 (rise between 32 and 64)", Some(Moved::Lower), true)
        );
        assert_eq!(n.regressions, [ID]);
        // The plain cell's Fisher family is its own: Holm over one cell leaves its p.
        let plain = n.cells[0].comparison.as_ref().unwrap();
        assert_eq!(plain.p_adjusted, plain.p_value);
        assert_ne!(plain.status, CellStatus::Regressed);
        let info = n.baseline.as_ref().unwrap();
        assert_eq!((info.compared, info.regressed), (2, 1));
        // Every rendering shows the threshold and the move.
        let md = MatrixSummary.render(&n).unwrap();
        assert!(md.contains(&format!("**`{ID}` REGRESSED** |")), "{md}");
        assert!(
            md.contains(
                "| threshold 32 (rise between 16 and 32) | levels 1+16+32+64, 320 per level |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| threshold 64 (rise between 32 and 64) | threshold lower (worse): regressed |"
            ),
            "{md}"
        );
        assert!(md.contains("## Load sweeps"), "{md}");
        let html = MatrixHtml.render(&n).unwrap();
        assert!(html.contains("<h2>Load sweeps</h2>"), "{html}");
        assert!(
            html.contains("threshold lower (worse): regressed"),
            "{html}"
        );
        let csv = MatrixCsv.render(&n).unwrap();
        assert!(csv
            .lines()
            .next()
            .unwrap()
            .ends_with(",load_threshold,load_baseline_threshold,load_moved"));
        assert!(
            csv.contains(",32 (rise between 16 and 32),64 (rise between 32 and 64),lower (worse)"),
            "{csv}"
        );
    }

    #[test]
    fn unchanged_and_higher_thresholds_are_ok_and_no_answer_is_inconclusive() {
        let n = night(swept(32), swept(32));
        let cmp = n.cells[1].comparison.as_ref().unwrap();
        assert_eq!(cmp.status, CellStatus::Ok, "{:?}", cmp.reasons);
        assert_eq!(cmp.reasons, ["the threshold is unchanged (32 in flight)"]);
        let n = night(swept(32), swept(64));
        let cmp = n.cells[1].comparison.as_ref().unwrap();
        assert_eq!(cmp.status, CellStatus::Ok);
        assert_eq!(cmp.threshold.as_ref().unwrap().moved, Some(Moved::Higher));
        assert!(n.regressions.is_empty());
        // Tonight's baseline level fell short: no answer, no pass.
        let mut blind = swept(32);
        let load = blind.load.as_mut().unwrap();
        load.answer = Some(Answer::NoBaseline);
        load.threshold = threshold_words(load.answer.as_ref());
        let n = night(swept(32), blind);
        let cmp = n.cells[1].comparison.as_ref().unwrap();
        assert_eq!(cmp.status, CellStatus::Inconclusive);
        assert!(
            cmp.reasons[0].starts_with("this night's sweep gave no answer (no answer (the baseline level's load fell short))"),
            "{:?}",
            cmp.reasons
        );
        // Another sweep (levels, allocation, alpha...) is another configuration.
        let mut other = swept(32);
        other.config_hash = "other".into();
        let n = night(swept(32), other);
        assert_eq!(n.cells[1].verdict(), Some(CellStatus::NotComparable));
    }
}
