//! The rate rows of a diff: arms paired by label, matrix cells paired by id, and for
//! each pair the change B - A with its Newcombe interval and a two-sided Fisher p.

use super::{Rate, Row};
use crate::commands::matrix::record::MatrixRecord;
use crate::core::arm_stats::ArmStats;
use crate::core::stats;
use crate::results::run_record::RunRecord;

/// The confidence of every interval a diff shows.
const CONFIDENCE: f64 = 0.95;

/// The rate of an arm or a cell, recomputed from its counts (the source of truth, which
/// `reclassify` rewrites) so the two sides are always computed alike.
pub(crate) fn rate_of(s: &ArmStats) -> Rate {
    // Judged sessions, as in a run's own rate (`Counts::judged`).
    let (sessions, corrupted) = (s.counts.judged(), s.counts.corrupted());
    let (lo, hi) = stats::wilson(corrupted, sessions, CONFIDENCE);
    Rate {
        sessions,
        corrupted,
        rate: stats::rate(corrupted, sessions),
        ci95: [lo, hi],
        counts: s.counts,
    }
}

fn row(key: String, a: Option<&ArmStats>, b: Option<&ArmStats>) -> Row {
    let (ra, rb) = (a.map(rate_of), b.map(rate_of));
    let (delta, delta_ci95, p_value) = match (&ra, &rb) {
        (Some(x), Some(y)) => {
            let (d, lo, hi) =
                stats::newcombe_diff(y.corrupted, y.sessions, x.corrupted, x.sessions, CONFIDENCE);
            let p = stats::fisher_exact_two_sided(
                y.corrupted,
                y.sessions.saturating_sub(y.corrupted),
                x.corrupted,
                x.sessions.saturating_sub(x.corrupted),
            );
            (Some(d), Some([lo, hi]), Some(p))
        }
        _ => (None, None, None),
    };
    Row {
        key,
        a: ra,
        b: rb,
        delta,
        delta_ci95,
        p_value,
    }
}

/// Pairs by key, in A's order, then B-only ones in B's order.
pub fn pair<'a, T, K: PartialEq>(
    a: &'a [T],
    b: &'a [T],
    key: impl Fn(&T) -> K,
) -> Vec<(K, Option<&'a T>, Option<&'a T>)> {
    let mut out: Vec<(K, Option<&T>, Option<&T>)> = Vec::new();
    for x in a {
        let k = key(x);
        let other = b.iter().find(|y| key(y) == k);
        out.push((k, Some(x), other));
    }
    for y in b {
        let k = key(y);
        if !out.iter().any(|(seen, _, _)| *seen == k) {
            out.push((k, None, Some(y)));
        }
    }
    out
}

pub(crate) fn run_rows(a: &RunRecord, b: &RunRecord) -> Vec<Row> {
    pair(&a.arms, &b.arms, |arm| arm.label)
        .into_iter()
        .map(|(label, x, y)| row(label.to_string(), x.map(|x| &x.stats), y.map(|y| &y.stats)))
        .collect()
}

/// Cells are the same configuration exactly when their ids are equal: the id names every
/// flag value, the sessions and the rounds of the cell.
pub(crate) fn matrix_rows(a: &MatrixRecord, b: &MatrixRecord) -> Vec<Row> {
    pair(&a.cells, &b.cells, |c| c.id.clone())
        .into_iter()
        .map(|(id, x, y)| row(id, x.map(|x| &x.stats), y.map(|y| &y.stats)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cell, matrix, run};
    use super::super::{diff_records, Record};
    use super::*;
    use std::path::Path;

    #[test]
    fn matched_arms_get_newcombe_delta_and_fisher_p() {
        let rows = run_rows(&run(14, 80, 80), &run(0, 80, 80));
        let on = &rows[0];
        assert_eq!(on.key, "on");
        assert_eq!(on.delta, Some(-14.0 / 80.0));
        let (_, lo, hi) = stats::newcombe_diff(0, 80, 14, 80, 0.95);
        assert_eq!(on.delta_ci95, Some([lo, hi]));
        assert_eq!(
            on.p_value,
            Some(stats::fisher_exact_two_sided(0, 80, 14, 66))
        );
        assert!(on.p_value.unwrap() < 1e-4);
        let off = &rows[1];
        assert_eq!((off.delta, off.p_value), (Some(0.0), Some(1.0)));
    }

    #[test]
    fn cells_pair_by_id_not_by_position() {
        // B lists its cells in another order, lacks one of A's and has one A lacks: each
        // cell must meet its own counterpart (the old diff paired every cell of A with
        // B's first cell).
        let a = matrix(vec![
            cell("BF16=1,s16", 5, 16),
            cell("BF16=0,s16", 0, 16),
            cell("BF16=1,s4", 1, 4),
        ]);
        let b = matrix(vec![
            cell("BF16=1,s64", 9, 64),
            cell("BF16=0,s16", 0, 16),
            cell("BF16=1,s16", 1, 16),
        ]);
        let rows = matrix_rows(&a, &b);
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            ["BF16=1,s16", "BF16=0,s16", "BF16=1,s4", "BF16=1,s64"]
        );
        let bf16 = &rows[0];
        assert_eq!(
            (
                bf16.a.as_ref().unwrap().corrupted,
                bf16.b.as_ref().unwrap().corrupted
            ),
            (5, 1)
        );
        assert_eq!(bf16.delta, Some(-4.0 / 16.0));
        assert_eq!(rows[1].delta, Some(0.0));
        assert!(rows[2].b.is_none() && rows[2].p_value.is_none());
        assert!(rows[3].a.is_none() && rows[3].b.as_ref().unwrap().sessions == 64);

        let d = diff_records(
            Path::new("a"),
            &Record::Matrix(Box::new(a)),
            Path::new("b"),
            &Record::Matrix(Box::new(b)),
        );
        assert_eq!(d.rows.len(), 4);
        let md = super::super::render(&d, super::super::Format::Markdown).unwrap();
        assert!(md.contains("| BF16=1,s64 | - | 9/64 = 14.1%"), "{md}");
    }

    #[test]
    fn the_rate_comes_from_the_counts() {
        let mut s = super::super::tests::stats(3, 10, 1, 1.0);
        s.corrupted = 99; // a stale derived field does not leak into the diff
        let r = rate_of(&s);
        assert_eq!((r.corrupted, r.sessions), (3, 10));
        assert_eq!(r.rate, 0.3);
    }
}
