//! Two sweeps of the same levels compared: did the threshold move, and does the evidence
//! show it (the nightly matrix's load cells, docs/load.md "In the matrix").
//!
//! The position of a sweep is its threshold, the lowest level shown to rise; a sweep
//! without one is above every level. A lower position is worse (the bug appears at a
//! lower load). The move is **shown** only when the baseline showed tonight's threshold
//! level flat (within min-effect of its baseline, explicitly or implied by the monotone
//! model): one night shows the level rise, the other showed it flat, each at its own
//! alpha. A lower threshold whose level the baseline left undecided (open, capped, short)
//! is a move the tests do not back: the two thresholds are each the first level to cross
//! a significance line, and noise moves that crossing by a level. Nothing is pooled
//! across nights and no new test is run: the statements are those of each night's sweep.

use serde::{Deserialize, Serialize};

use super::report::{Answer, LoadReport};
use super::threshold::{fisher_greater, Status};

/// What a sweep showed at one level: `None` for the baseline level of a sweep without a
/// flag (nothing to test), else its status, the monotone model's implication first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelShown {
    pub level: u32,
    pub status: Option<Status>,
    /// The counted arm's (corrupted, judged) at this level, for the direct comparison of
    /// two nights; absent in records written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<(u64, u64)>,
}

/// Every level's [`LevelShown`] of a report.
pub fn shown(report: &LoadReport) -> Vec<LevelShown> {
    report
        .levels
        .iter()
        .map(|l| LevelShown {
            level: l.level,
            status: l.implied.or(l.status),
            count: Some((l.arm.corrupted, l.arm.judged)),
        })
        .collect()
}

/// Which way tonight's threshold lies from the baseline's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Moved {
    /// At a lower load (or one appeared): worse.
    Lower,
    Unchanged,
    /// At a higher load (or none any more): better.
    Higher,
}

impl Moved {
    pub fn as_str(self) -> &'static str {
        match self {
            Moved::Lower => "lower (worse)",
            Moved::Unchanged => "unchanged",
            Moved::Higher => "higher (better)",
        }
    }
}

/// Tonight's threshold against the baseline's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Movement {
    pub moved: Moved,
    /// The move is backed by the tests: for a lower threshold, the baseline showed that
    /// level flat. Always false for [`Moved::Unchanged`].
    pub shown: bool,
    /// The move in words, with what backs it or what it lacks.
    pub words: String,
}

/// The threshold level of an answer; `None` when no level was shown to rise.
pub fn threshold_level(answer: &Answer) -> Option<u32> {
    match answer {
        Answer::Threshold { level, .. } => Some(*level),
        _ => None,
    }
}

/// An answer as a matrix cell shows it: the level, "rises at lowest", or "none shown".
pub fn threshold_words(answer: Option<&Answer>) -> String {
    match answer {
        None => "no block finished".into(),
        Some(Answer::NoBaseline) => "no answer (the baseline level's load fell short)".into(),
        Some(Answer::Threshold {
            level,
            at_lowest: true,
            ..
        }) => format!("rises at lowest ({level})"),
        Some(Answer::Threshold {
            level,
            above: Some(a),
            ..
        }) => format!("{level} (rise between {a} and {level})"),
        Some(Answer::Threshold { level, .. }) => level.to_string(),
        Some(Answer::NoThreshold { all_flat: true, .. }) => "none (every level flat)".into(),
        Some(Answer::NoThreshold { .. }) => "none shown".into(),
    }
}

/// Tonight's answer against the baseline's, both over the same levels. `None` when
/// either sweep gave no answer (its baseline level's load fell short). A lower threshold
/// is shown only where the baseline showed its level flat *and* tonight's counts there
/// exceed the baseline's (one-sided Fisher below `alpha`): "flat" allows a rise below
/// min-effect and "rises" any rise above 0, so the two statements alone can hold on two
/// nights at one unchanged rate.
pub fn movement(
    tonight: &Answer,
    baseline: &Answer,
    tonight_levels: &[LevelShown],
    baseline_levels: &[LevelShown],
    alpha: f64,
) -> Option<Movement> {
    if matches!(tonight, Answer::NoBaseline) || matches!(baseline, Answer::NoBaseline) {
        return None;
    }
    let (t, b) = (threshold_level(tonight), threshold_level(baseline));
    let name = |x: Option<u32>| x.map_or("none".to_string(), |l| format!("{l} in flight"));
    // No threshold lies above every level.
    let moved = match (t, b) {
        (x, y) if x == y => Moved::Unchanged,
        (Some(_), None) => Moved::Lower,
        (None, Some(_)) => Moved::Higher,
        (Some(x), Some(y)) if x < y => Moved::Lower,
        _ => Moved::Higher,
    };
    let movement = match (moved, t) {
        (Moved::Lower, Some(level)) => {
            let at = |levels: &[LevelShown]| levels.iter().find(|l| l.level == level).copied();
            let (now, then) = (at(tonight_levels), at(baseline_levels));
            let there = then.and_then(|l| l.status);
            let p = match (now.and_then(|l| l.count), then.and_then(|l| l.count)) {
                (Some((k1, n1)), Some((k0, n0))) => Some(fisher_greater(k1, n1, k0, n0)),
                _ => None,
            };
            let shown = there == Some(Status::Flat) && p.is_some_and(|p| p < alpha);
            let words = if shown {
                format!(
                    "the threshold fell from {} to {}: {level} in flight rises tonight, was shown flat in the baseline, and corrupts more than it did then (one-sided Fisher p = {})",
                    name(b),
                    name(t),
                    crate::format::p_value(p.unwrap_or(1.0))
                )
            } else if there == Some(Status::Flat) {
                format!(
                    "the threshold is lower tonight ({} against the baseline's {}), but {level} in flight does not corrupt significantly more than it did in the baseline ({}): a rise below min-effect can read flat one night and rising the next; not shown to have moved",
                    name(t),
                    name(b),
                    p.map_or("no counts recorded".into(), |p| format!("one-sided Fisher p = {}", crate::format::p_value(p)))
                )
            } else {
                format!(
                    "the threshold is lower tonight ({} against the baseline's {}), but the baseline did not show {level} in flight flat (it was {}): not shown to have moved; more sessions per level would tell",
                    name(t),
                    name(b),
                    there.map_or("untested".into(), Status::word)
                )
            };
            Movement {
                moved,
                shown,
                words,
            }
        }
        (Moved::Higher, _) => Movement {
            moved,
            shown: false,
            words: format!(
                "the threshold rose from {} to {} (better)",
                name(b),
                name(t)
            ),
        },
        _ => Movement {
            moved: Moved::Unchanged,
            shown: false,
            words: format!("the threshold is unchanged ({})", name(t)),
        },
    };
    Some(movement)
}

/// Tonight's levels whose engine-side load fell short at or below `up_to` (every level
/// when `None`): a threshold there is not ruled out.
pub fn short_levels(tonight: &[LevelShown], up_to: Option<u32>) -> Vec<u32> {
    tonight
        .iter()
        .filter(|l| l.status == Some(Status::Short) && up_to.is_none_or(|u| l.level <= u))
        .map(|l| l.level)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::simulate::{sweep_curve, Curve};
    use super::super::{Allocation, LoadParams};
    use super::*;
    use crate::evidence::Policy;

    fn params() -> LoadParams {
        LoadParams::new(
            vec![1, 16, 32, 64],
            false,
            Allocation::Fixed { sessions: 320 },
            &Policy::default(),
            5,
        )
    }

    fn step(at: u32) -> LoadReport {
        let curve = Curve::Step {
            at,
            rate: 0.2,
            background: 0.0,
        };
        sweep_curve(curve, &params(), 3)
    }

    #[test]
    fn a_threshold_that_fell_onto_a_level_shown_flat_is_shown() {
        // Last night 20% from 64 on, tonight from 32 on: 320 sessions per level find
        // both (seeded), and last night's 32 was flat.
        let (base, night) = (step(64), step(32));
        assert_eq!(threshold_level(&base.answer), Some(64), "{}", base.verdict);
        assert_eq!(
            threshold_level(&night.answer),
            Some(32),
            "{}",
            night.verdict
        );
        let m = movement(
            &night.answer,
            &base.answer,
            &shown(&night),
            &shown(&base),
            0.01,
        )
        .unwrap();
        assert_eq!((m.moved, m.shown), (Moved::Lower, true), "{}", m.words);
        assert!(
            m.words
                .starts_with("the threshold fell from 64 in flight to 32 in flight"),
            "{}",
            m.words
        );
        // The other way round is better, and the same night is unchanged.
        let m = movement(
            &base.answer,
            &night.answer,
            &shown(&base),
            &shown(&night),
            0.01,
        )
        .unwrap();
        assert_eq!(m.moved, Moved::Higher, "{}", m.words);
        let m = movement(
            &night.answer,
            &night.answer,
            &shown(&night),
            &shown(&night),
            0.01,
        )
        .unwrap();
        assert_eq!((m.moved, m.shown), (Moved::Unchanged, false));
        assert_eq!(m.words, "the threshold is unchanged (32 in flight)");
    }

    #[test]
    fn a_lower_threshold_on_a_level_the_baseline_left_open_is_not_shown() {
        let night = step(32);
        let base_answer = Answer::NoThreshold {
            flat_through: Some(16),
            all_flat: false,
        };
        let open = [
            LevelShown {
                level: 1,
                status: None,
                count: Some((0, 320)),
            },
            LevelShown {
                level: 16,
                status: Some(Status::Flat),
                count: Some((0, 320)),
            },
            LevelShown {
                level: 32,
                status: Some(Status::Open),
                count: Some((0, 320)),
            },
            LevelShown {
                level: 64,
                status: Some(Status::Open),
                count: Some((0, 320)),
            },
        ];
        let tonight = shown(&night);
        let m = movement(&night.answer, &base_answer, &tonight, &open, 0.01).unwrap();
        assert_eq!((m.moved, m.shown), (Moved::Lower, false));
        assert!(m.words.contains("(it was open)"), "{}", m.words);
        // A threshold appearing where the baseline showed the level flat is shown.
        let mut flat = open;
        flat[2].status = Some(Status::Flat);
        let m = movement(&night.answer, &base_answer, &tonight, &flat, 0.01).unwrap();
        assert_eq!((m.moved, m.shown), (Moved::Lower, true));
        assert!(m.words.contains("fell from none to 32"), "{}", m.words);
        // Flat then, rising tonight, at one rate: each night's statement holds (a rise
        // below min-effect is both), the two nights' counts do not differ: not shown.
        let mut same = flat;
        same[2].count = tonight[2].count;
        let m = movement(&night.answer, &base_answer, &tonight, &same, 0.01).unwrap();
        assert_eq!((m.moved, m.shown), (Moved::Lower, false));
        assert!(
            m.words.contains("does not corrupt significantly more"),
            "{}",
            m.words
        );
        // No answer on either side: nothing to compare.
        assert!(movement(&Answer::NoBaseline, &base_answer, &tonight, &flat, 0.01).is_none());
        assert!(movement(&night.answer, &Answer::NoBaseline, &tonight, &flat, 0.01).is_none());
        assert_eq!(short_levels(&flat, None), Vec::<u32>::new());
    }

    #[test]
    fn thresholds_in_words() {
        let words = |a: Answer| threshold_words(Some(&a));
        assert_eq!(
            words(Answer::Threshold {
                level: 64,
                above: Some(32),
                at_lowest: false
            }),
            "64 (rise between 32 and 64)"
        );
        assert_eq!(
            words(Answer::Threshold {
                level: 8,
                above: None,
                at_lowest: true
            }),
            "rises at lowest (8)"
        );
        assert_eq!(
            words(Answer::NoThreshold {
                flat_through: None,
                all_flat: false
            }),
            "none shown"
        );
        assert_eq!(threshold_words(None), "no block finished");
    }
}
