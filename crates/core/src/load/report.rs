//! What a load sweep found, as load.json records it: per level the counts of each arm,
//! the engine-side peak, the test's status and evidence, the isotonic fit and its band;
//! every block; the answer (the threshold and the interval it lies in) and the verdict
//! in words.

use serde::{Deserialize, Serialize};

use super::threshold::Status;
use super::Axis;
use crate::format::percent_digits;
use crate::mechanism::Ran;
use crate::sequential::Tally;
use crate::session::SessionClass;

/// Which arm of a level a block ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arm {
    /// The configuration as it is (a sweep without a flag).
    Level,
    On,
    Off,
}

impl Arm {
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::Level => "level",
            Arm::On => "on",
            Arm::Off => "off",
        }
    }
}

/// One arm of one level, over its blocks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArmCount {
    pub sessions: u64,
    /// Neither failed nor truncated: the rate's denominator.
    pub judged: u64,
    pub corrupted: u64,
    /// Error or timeout.
    pub failed: u64,
    pub blocks: u64,
    /// The busiest engine role's peak running requests, the highest over the blocks.
    pub peak_engine: Option<u64>,
}

impl ArmCount {
    pub fn tally(&self) -> Tally {
        Tally {
            corrupted: self.corrupted,
            sessions: self.judged,
        }
    }

    pub fn rate(&self) -> f64 {
        crate::stats::rate(self.corrupted, self.judged)
    }

    pub(crate) fn add(&mut self, classes: &[SessionClass], peak: Option<u64>) {
        self.sessions += classes.len() as u64;
        self.judged += classes.iter().filter(|c| c.is_judged()).count() as u64;
        self.corrupted += classes.iter().filter(|c| c.is_corrupted()).count() as u64;
        self.failed += classes.iter().filter(|c| c.is_failure()).count() as u64;
        self.blocks += 1;
        self.peak_engine = self.peak_engine.max(peak);
    }
}

/// One block as run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRecord {
    pub block: u64,
    pub level: u32,
    pub arm: Arm,
    pub sessions: u64,
    pub judged: u64,
    pub corrupted: u64,
    pub failed: u64,
    pub peak_engine: Option<u64>,
    pub seed: u64,
    pub wall_s: f64,
    /// Why its engine-side load fell short of the level, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
}

/// One level of load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelReport {
    /// Sessions in flight asked for.
    pub level: u32,
    /// The level's sessions (a sweep without a flag) or its `on` arm.
    pub arm: ArmCount,
    /// The `off` arm at this level (a sweep of a flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off: Option<ArmCount>,
    /// Why this level is not reported as this level: its engine-side load fell short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
    /// The test against the baseline; `None` for the baseline level itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// What the monotone model says of an open level: `flat` below a level shown flat,
    /// `rises` above a level shown to rise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implied: Option<Status>,
    /// Fixed allocation: one-sided Fisher p and its Holm adjustment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holm_p: Option<f64>,
    /// Adaptive allocation: the level's e-value against its baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_value: Option<f64>,
    /// Upper bound of (level - baseline) behind "flat".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) diff_upper: Option<f64>,
    /// Wilson 95% interval of the arm's rate.
    pub wilson: [f64; 2],
    /// The isotonic fit and the simultaneous band at this level (not for short levels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band: Option<[f64; 2]>,
    /// Whether the flag's mechanism ran in this level's blocks whose value enables it
    /// (core::mechanism; any block that ran it counts); `None`: no such block yet, or
    /// the flag names no witness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Ran>,
}

/// Where in the levels the flag's mechanism ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reach {
    /// The mechanism's name (the flag's name when its file names none).
    pub name: String,
    /// The lowest level at which it ran; `None`: at none of those read.
    pub from: Option<u32>,
    /// Levels read and found not to run it.
    pub never: Vec<u32>,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Answer {
    /// `level` is the lowest level shown to rise; the rise starts above `above` (the
    /// highest level shown flat below it; `None`: not shown anywhere below).
    Threshold {
        level: u32,
        above: Option<u32>,
        /// `level` is the lowest level tested (for a sweep without a flag: the lowest
        /// above the baseline).
        at_lowest: bool,
    },
    /// No level shown to rise; `flat_through`: every level up to it shown flat.
    NoThreshold {
        flat_through: Option<u32>,
        all_flat: bool,
    },
    /// The baseline level's engine-side load fell short: nothing can be compared.
    NoBaseline,
}

/// What the sweep found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub levels: Vec<LevelReport>,
    pub blocks: Vec<BlockRecord>,
    pub answer: Answer,
    pub verdict: String,
    /// Why the sweep stopped.
    pub stopped: String,
    pub sessions_spent: u64,
    pub restarts: u64,
    /// Confidence of the band, all levels at once.
    pub(crate) band_confidence: f64,
    /// The band's lower bound passes its upper bound somewhere: the counts are not
    /// those of a rate that never falls with load.
    pub contradicts_monotone: bool,
    pub warnings: Vec<String>,
    /// What the levels' levels are (sessions in flight, or pressure).
    #[serde(default)]
    pub axis: Axis,
    /// Where the flag's mechanism ran, when its blocks were watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Reach>,
}

/// `12/80 = 15.0%`.
pub fn rate_words(arm: &ArmCount) -> String {
    format!(
        "{}/{} = {}%",
        arm.corrupted,
        arm.judged,
        percent_digits(arm.rate())
    )
}

/// The verdict in words: the answer, its evidence and every level that fell short.
pub(crate) fn verdict_words(
    answer: &Answer,
    levels: &[LevelReport],
    ab: Option<&str>,
    min_effect: f64,
    axis: Axis,
    reach: Option<&Reach>,
) -> String {
    let at = |level: u32| levels.iter().find(|l| l.level == level);
    let words = |level: u32| axis.words(level);
    let noun = axis.noun();
    let baseline = |l: &LevelReport| match (&l.off, ab) {
        (Some(off), Some(_)) => format!("off {}", rate_words(off)),
        _ => format!("{} {}", words(levels[0].level), rate_words(&levels[0].arm)),
    };
    let evidence = |l: &LevelReport| match (l.holm_p, l.e_value) {
        (Some(p), _) => format!("Holm-adjusted one-sided Fisher p = {}", p_words(p)),
        (_, Some(e)) => format!("e-value {}", e_words(e)),
        _ => String::new(),
    };
    let subject = ab.map_or("the corruption rate".to_string(), |f| format!("{f} on"));
    let points = percent_digits(min_effect);
    let base = if ab.is_some() {
        "its off arm"
    } else {
        "the baseline"
    };
    let mut text = match answer {
        Answer::NoBaseline => {
            "no answer: the baseline level's engine-side load fell short, so no level can be compared with it".to_string()
        }
        Answer::Threshold { level, above, at_lowest } => {
            let l = at(*level).expect("the threshold is a level");
            let mut t = format!(
                "lowest reproducing {noun}: {} ({subject} {} vs {}, {})",
                words(*level),
                rate_words(&l.arm),
                baseline(l),
                evidence(l)
            );
            match (above, at_lowest) {
                (_, true) if ab.is_some() => t.push_str("; it rises already at the lowest level tried"),
                (_, true) => t.push_str("; it rises already at the lowest level above the baseline"),
                (Some(a), false) => t.push_str(&format!(
                    "; at {} it is within {points} points of the baseline, so the rise starts between {} and {}",
                    words(*a),
                    words(*a),
                    words(*level)
                )),
                (None, false) => t.push_str(&format!(
                    "; no level below {} is shown within {points} points of the baseline, so the rise may start lower",
                    words(*level)
                )),
            }
            t
        }
        Answer::NoThreshold { flat_through, all_flat } => match (flat_through, all_flat) {
            (_, true) => format!(
                "no threshold in the levels tried: every level up to {} is within {points} points of {base}",
                words(levels.last().map_or(0, |l| l.level))
            ),
            (Some(f), false) => format!(
                "no threshold shown in the levels tried: no level corrupts more than {base}; levels up to {} are within {points} points of it, higher ones undecided",
                words(*f)
            ),
            (None, false) => format!(
                "no threshold shown in the levels tried: no level corrupts more than {base}, and none is shown within {points} points of it (more sessions would tell)"
            ),
        },
    };
    if let Some(reach) = reach {
        let never = reach
            .never
            .iter()
            .map(|&l| words(l))
            .collect::<Vec<_>>()
            .join(", ");
        match reach.from {
            Some(from) => {
                let (below, above): (Vec<u32>, Vec<u32>) =
                    reach.never.iter().partition(|&&l| l < from);
                let list =
                    |levels: Vec<u32>| levels.into_iter().map(words).collect::<Vec<_>>().join(", ");
                text.push_str(&format!(
                    "; the mechanism ({}) ran from {}",
                    reach.name,
                    words(from)
                ));
                if !below.is_empty() {
                    text.push_str(&format!(" (never at {})", list(below)));
                }
                if !above.is_empty() {
                    text.push_str(&format!(", yet not at {}", list(above)));
                }
            }
            None if !reach.never.is_empty() => text.push_str(&format!(
                "; the mechanism ({}) never ran at any level read ({never})",
                reach.name
            )),
            None => {}
        }
    }
    for l in levels {
        if let Some(why) = &l.short {
            let as_what = match axis {
                Axis::InFlight => l.level.to_string(),
                Axis::Pressure { .. } => words(l.level),
            };
            text.push_str(&format!(
                "; level {} is not reported as {as_what}: {why}",
                l.level
            ));
        }
    }
    text
}

pub fn p_words(p: f64) -> String {
    if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
    }
}

pub fn e_words(e: f64) -> String {
    if e >= 1e3 {
        format!("{e:.1e}")
    } else {
        format!("{e:.1}")
    }
}
