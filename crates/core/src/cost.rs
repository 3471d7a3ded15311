//! What a verdict costs in the units a user of real engines pays (issue 45, docs/design.md
//! 3.6 "Cost"): engine restarts and the time they took (health wait included), the time
//! spent driving sessions, the wall time, and engine-hours: every replica set the command
//! holds, for as long as it holds it (one set today, so engine-hours are the wall time in
//! hours). And before a command starts, its planned cost ([`plan`]), from a cost per
//! restart and a cost per wave of sessions, each given (`--restart-cost`,
//! `--session-cost`) or measured by this target's earlier commands ([`Rates`]).
//!
//! Pure: the command layer measures (core::phases) and keeps the rates.

use serde::{Deserialize, Serialize};

use crate::phases::Phases;

/// A finished (or stopped) command's cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub restarts: u64,
    /// Restarting and waiting for health, seconds.
    pub restart_s: f64,
    pub drive_s: f64,
    pub wall_s: f64,
    /// Replica sets held for the wall time.
    pub replicas: u32,
    pub engine_hours: f64,
}

impl Cost {
    /// The cost of a command whose phases are `phases` (finished), on `replicas` sets.
    pub fn of(phases: &Phases, replicas: u32) -> Cost {
        Cost {
            restarts: phases.restarts,
            restart_s: phases.restart_s + phases.health_wait_s,
            drive_s: phases.drive_s,
            wall_s: phases.wall_s,
            replicas,
            engine_hours: f64::from(replicas) * phases.wall_s / 3600.0,
        }
    }

    /// `cost: 3 restarts (757 s, 52% of the wall), driving 633 s, 0.41 engine-hours (1
    /// replica set x 24.4 min)`.
    pub fn line(&self) -> String {
        format!(
            "cost: {} restart{} ({:.0} s, {:.0}% of the wall), driving {:.0} s, {} engine-hours \
             ({} replica set{} x {})",
            self.restarts,
            if self.restarts == 1 { "" } else { "s" },
            self.restart_s,
            share(self.restart_s, self.wall_s),
            self.drive_s,
            hours_words(self.engine_hours),
            self.replicas,
            if self.replicas == 1 { "" } else { "s" },
            duration_words(self.wall_s)
        )
    }
}

/// What a command's testbed spent as it went (each restart and each block's drive, as
/// the testbed measured them): the same for every command that drives engines, so a
/// search's cost is counted as a run's is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub restarts: u64,
    /// Restarting and waiting for health, seconds.
    pub restart_s: f64,
    pub drive_s: f64,
    pub sessions: u64,
    /// Sessions over the concurrency they ran at, summed over blocks (core::cost::Rates).
    pub waves: f64,
    /// What failed and measured nothing (a restart never healthy, a block stopped while
    /// it drove): the engines were held, so it is cost, never a rate.
    #[serde(default, skip_serializing_if = "Failed::is_empty")]
    pub failed: Failed,
}

/// Restarts and driving that failed part way: counted in [`Cost`], left out of
/// [`Rates`] (a timed-out health wait is no restart's time, a stopped drive drove no
/// whole wave).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Failed {
    pub restarts: u64,
    pub restart_s: f64,
    pub drive_s: f64,
}

impl Failed {
    fn is_empty(&self) -> bool {
        *self == Failed::default()
    }
}

impl Spent {
    /// Adds what `other` spent after this (one after the other).
    pub fn add(&mut self, other: &Spent) {
        self.restarts += other.restarts;
        self.restart_s += other.restart_s;
        self.drive_s += other.drive_s;
        self.sessions += other.sessions;
        self.waves += other.waves;
        self.failed.restarts += other.failed.restarts;
        self.failed.restart_s += other.failed.restart_s;
        self.failed.drive_s += other.failed.drive_s;
    }
}

impl Cost {
    /// The cost of a command that held one replica set per entry of `lanes` for
    /// `wall_s` seconds, each lane having spent what it says: restarts are every lane's,
    /// restarting and driving the longest lane's (they ran side by side).
    pub fn spent(lanes: &[Spent], wall_s: f64) -> Cost {
        let longest = |f: fn(&Spent) -> f64| lanes.iter().map(f).fold(0.0, f64::max);
        let replicas = lanes.len().max(1) as u32;
        Cost {
            restarts: lanes.iter().map(|l| l.restarts + l.failed.restarts).sum(),
            restart_s: longest(|l| l.restart_s + l.failed.restart_s),
            drive_s: longest(|l| l.drive_s + l.failed.drive_s),
            wall_s,
            replicas,
            engine_hours: f64::from(replicas) * wall_s / 3600.0,
        }
    }
}

impl Cost {
    /// The cost of commands that ran side by side, each on replica sets of its own (a
    /// matrix's shards): restarts, sets and engine-hours add up; restarting, driving
    /// and the wall are the longest one's.
    pub fn together(costs: &[Cost]) -> Cost {
        let longest = |f: fn(&Cost) -> f64| costs.iter().map(f).fold(0.0, f64::max);
        Cost {
            restarts: costs.iter().map(|c| c.restarts).sum(),
            restart_s: longest(|c| c.restart_s),
            drive_s: longest(|c| c.drive_s),
            wall_s: longest(|c| c.wall_s),
            replicas: costs.iter().map(|c| c.replicas).sum(),
            engine_hours: costs.iter().map(|c| c.engine_hours).sum(),
        }
    }
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

fn hours_words(h: f64) -> String {
    if h >= 10.0 {
        format!("{h:.0}")
    } else if h >= 0.1 {
        format!("{h:.2}")
    } else {
        format!("{h:.4}")
    }
}

/// `24.4 min`, `3.1 s`, `2.5 h`.
pub fn duration_words(s: f64) -> String {
    if s >= 7200.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 120.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{s:.1} s")
    }
}

/// The seconds a restart and a wave of sessions cost, as the command line gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostUnits {
    pub restart_s: Option<f64>,
    pub session_s: Option<f64>,
}

/// One target's costs as measured by its earlier commands: the mean seconds per restart
/// (health wait included) and per wave of sessions (a block's driving time over its
/// sessions divided by its concurrency: the time for as many sessions as run at once to
/// pass through).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub restarts: u64,
    pub restart_s: f64,
    pub waves: f64,
    pub drive_s: f64,
}

impl Rates {
    /// Adds a finished command's measurements: `phases`, having run `sessions` sessions
    /// in blocks of `concurrency` in flight.
    pub fn observe(&mut self, phases: &Phases, sessions: u64, concurrency: u32) {
        self.restarts += phases.restarts;
        self.restart_s += phases.restart_s + phases.health_wait_s;
        if sessions > 0 && concurrency > 0 {
            self.waves += sessions as f64 / f64::from(concurrency);
            self.drive_s += phases.drive_s;
        }
    }

    /// Adds what a command's testbed measured (every command that drives engines).
    pub fn take(&mut self, spent: &Spent) {
        self.restarts += spent.restarts;
        self.restart_s += spent.restart_s;
        if spent.waves > 0.0 {
            self.waves += spent.waves;
            self.drive_s += spent.drive_s;
        }
    }

    /// Mean seconds per restart, if one was measured.
    pub fn per_restart(&self) -> Option<f64> {
        (self.restarts > 0).then(|| self.restart_s / self.restarts as f64)
    }

    /// Mean seconds per wave of sessions, if one was measured.
    pub fn per_wave(&self) -> Option<f64> {
        (self.waves > 0.0).then(|| self.drive_s / self.waves)
    }
}

/// Where a planned cost's unit came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Given on the command line.
    Given(f64),
    /// Measured: the mean over `n` earlier restarts (or waves) on this target.
    Measured { seconds: f64, n: f64 },
    /// Neither: the plan cannot price it.
    Unknown,
}

impl Unit {
    /// `given` if any, else what `measured` (mean, count) says.
    pub fn pick(given: Option<f64>, measured: Option<(f64, f64)>) -> Unit {
        match (given, measured) {
            (Some(s), _) => Unit::Given(s),
            (None, Some((seconds, n))) => Unit::Measured { seconds, n },
            (None, None) => Unit::Unknown,
        }
    }

    fn seconds(&self) -> Option<f64> {
        match self {
            Unit::Given(s) | Unit::Measured { seconds: s, .. } => Some(*s),
            Unit::Unknown => None,
        }
    }

    fn words(&self, what: &str, flag: &str) -> String {
        match self {
            Unit::Given(s) => format!(
                "{} a {what} ({} given)",
                duration_words(*s),
                flag.split(' ').next().unwrap_or(flag)
            ),
            Unit::Measured { seconds, n } => format!(
                "{} a {what} (measured over this target's last {n:.0})",
                duration_words(*seconds)
            ),
            Unit::Unknown => format!("the cost of a {what} unknown (pass {flag})"),
        }
    }
}

/// A command's planned blocks: how many restarts, and each block's sessions and
/// sessions in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocks {
    pub restarts: u64,
    /// (sessions, in flight) per block.
    pub blocks: Vec<(u64, u32)>,
}

/// What a plan is expected to cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub restarts: u64,
    pub sessions: u64,
    pub restart_s: Option<f64>,
    pub drive_s: Option<f64>,
    /// Restart plus driving (the harness's own time is a few percent, core::phases).
    pub wall_s: Option<f64>,
    pub engine_hours: Option<f64>,
    pub words: String,
}

/// The planned cost of `blocks` on `replicas` replica sets running blocks at the same
/// time (their restarts `replicas` at once, their waves spread over the sets), at
/// `restart` seconds per restart and `wave` seconds per wave of sessions (see
/// [`Rates`]): the wall time falls by the sets, the engine-hours do not.
pub fn plan(blocks: &Blocks, replicas: u32, restart: &Unit, wave: &Unit) -> Planned {
    let lanes = u64::from(replicas.max(1));
    let sessions: u64 = blocks.blocks.iter().map(|b| b.0).sum();
    let waves: f64 = blocks
        .blocks
        .iter()
        .map(|&(s, c)| (s as f64 / f64::from(c.max(1))).ceil())
        .sum();
    let restart_s = restart
        .seconds()
        .map(|s| s * blocks.restarts.div_ceil(lanes) as f64);
    let drive_s = wave.seconds().map(|s| s * waves / lanes as f64);
    let wall_s = restart_s.zip(drive_s).map(|(r, d)| r + d);
    let engine_hours = wall_s.map(|w| f64::from(replicas) * w / 3600.0);
    let words = format!(
        "planned: {} restart{}, {} sessions in {} block{} ({waves:.0} waves){}; {}; {}; {}",
        blocks.restarts,
        if blocks.restarts == 1 { "" } else { "s" },
        sessions,
        blocks.blocks.len(),
        if blocks.blocks.len() == 1 { "" } else { "s" },
        if lanes > 1 {
            format!(" on {lanes} replica sets at once")
        } else {
            String::new()
        },
        restart.words("restart", "--restart-cost SECONDS"),
        wave.words("wave of sessions", "--session-cost SECONDS"),
        match (wall_s, engine_hours) {
            (Some(w), Some(h)) => format!(
                "about {} wall, {} engine-hours",
                duration_words(w),
                hours_words(h)
            ),
            _ => match restart_s {
                Some(r) => format!("restarts alone about {}", duration_words(r)),
                None => "no estimate".to_string(),
            },
        }
    );
    Planned {
        restarts: blocks.restarts,
        sessions,
        restart_s,
        drive_s,
        wall_s,
        engine_hours,
        words,
    }
}

/// A search's planned cost: its blocks depend on what it finds, so it is priced at both
/// ends, its fewest blocks (the earliest answer it can give) and its most (its budget or
/// cap), each by [`plan`]; the numbers are the most's (what a user must be ready for),
/// the words say both.
pub fn plan_between(
    fewest: &Blocks,
    most: &Blocks,
    replicas: u32,
    restart: &Unit,
    wave: &Unit,
) -> Planned {
    let low = plan(fewest, replicas, restart, wave);
    let high = plan(most, replicas, restart, wave);
    let range = |a: u64, b: u64| {
        if a == b {
            a.to_string()
        } else {
            format!("{a} to {b}")
        }
    };
    let waves = |b: &Blocks| -> f64 {
        b.blocks
            .iter()
            .map(|&(s, c)| (s as f64 / f64::from(c.max(1))).ceil())
            .sum()
    };
    let lanes = replicas.max(1);
    // "a to b", or "a" where both ends say the same.
    let span = |a: String, b: String| if a == b { a } else { format!("{a} to {b}") };
    let estimate = match (low.wall_s, high.wall_s, low.engine_hours, high.engine_hours) {
        (Some(a), Some(b), Some(ha), Some(hb)) => format!(
            "about {} wall, {} engine-hours",
            span(duration_words(a), duration_words(b)),
            span(hours_words(ha), hours_words(hb))
        ),
        _ => match (low.restart_s, high.restart_s) {
            (Some(a), Some(b)) => format!(
                "restarts alone about {}",
                span(duration_words(a), duration_words(b))
            ),
            _ => "no estimate".to_string(),
        },
    };
    let words = format!(
        "planned: {} restarts, {} sessions in {} blocks ({} waves){}; {}; {}; {}",
        range(fewest.restarts, most.restarts),
        range(low.sessions, high.sessions),
        range(fewest.blocks.len() as u64, most.blocks.len() as u64),
        range(waves(fewest) as u64, waves(most) as u64),
        if lanes > 1 {
            format!(" on {lanes} replica sets at once")
        } else {
            String::new()
        },
        restart.words("restart", "--restart-cost SECONDS"),
        wave.words("wave of sessions", "--session-cost SECONDS"),
        estimate
    );
    Planned { words, ..high }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real vLLM CPU A/B of docs/real-engines.md: 3 restarts, 757 s restarting and
    /// waiting for health, 633 s driving, 1461 s in all.
    fn vllm() -> Phases {
        let mut p = Phases {
            restart_s: 4.38,
            health_wait_s: 752.72,
            drive_s: 632.69,
            restarts: 3,
            ..Phases::default()
        };
        p.finish(1461.49);
        p
    }

    #[test]
    fn a_commands_cost_is_its_restarts_driving_and_engine_hours() {
        let c = Cost::of(&vllm(), 1);
        assert_eq!(c.restarts, 3);
        assert!((c.restart_s - 757.1).abs() < 1e-9);
        assert!((c.engine_hours - 1461.49 / 3600.0).abs() < 1e-12);
        assert_eq!(
            c.line(),
            "cost: 3 restarts (757 s, 52% of the wall), driving 633 s, 0.41 engine-hours (1 replica set x 24.4 min)"
        );
        // Two replica sets held as long cost twice the engine-hours.
        assert!((Cost::of(&vllm(), 2).engine_hours - 2.0 * c.engine_hours).abs() < 1e-12);
    }

    #[test]
    fn rates_are_means_per_restart_and_per_wave() {
        let mut r = Rates::default();
        assert_eq!(r.per_restart(), None);
        r.observe(&vllm(), 16, 4);
        assert!((r.per_restart().unwrap() - 757.1 / 3.0).abs() < 1e-9);
        // 16 sessions at 4 in flight: 4 waves in 633 s.
        assert!((r.per_wave().unwrap() - 632.69 / 4.0).abs() < 1e-9);
        r.observe(&Phases::default(), 0, 4);
        assert!((r.per_wave().unwrap() - 632.69 / 4.0).abs() < 1e-9);
    }

    /// The SGLang-scale profile: a restart 15 min, a block of 80 sessions about
    /// 10 min. A fixed A/B of one block per arm: 2 restarts, 2 blocks.
    #[test]
    fn a_plan_is_priced_by_its_restarts_and_waves() {
        let blocks = Blocks {
            restarts: 2,
            blocks: vec![(80, 80), (80, 80)],
        };
        let p = plan(&blocks, 1, &Unit::Given(900.0), &Unit::Given(600.0));
        assert_eq!(p.restart_s, Some(1800.0));
        assert_eq!(p.drive_s, Some(1200.0));
        assert_eq!(p.wall_s, Some(3000.0));
        assert!((p.engine_hours.unwrap() - 3000.0 / 3600.0).abs() < 1e-12);
        assert!(
            p.words.starts_with("planned: 2 restarts, 160 sessions in 2 blocks (2 waves); 15.0 min a restart (--restart-cost given)"),
            "{}",
            p.words
        );
        assert!(
            p.words.ends_with("about 50.0 min wall, 0.83 engine-hours"),
            "{}",
            p.words
        );
        // Without a session cost the restarts alone are priced, and the plan says so.
        let partial = plan(&blocks, 1, &Unit::Given(900.0), &Unit::Unknown);
        assert_eq!(partial.wall_s, None);
        assert!(
            partial
                .words
                .contains("the cost of a wave of sessions unknown (pass --session-cost SECONDS)"),
            "{}",
            partial.words
        );
        assert!(
            partial.words.ends_with("restarts alone about 30.0 min"),
            "{}",
            partial.words
        );
        // Two replica sets: the four blocks of two pairs two at a time, half the wall of
        // serial arms and the same engine-hours.
        let pairs = Blocks {
            restarts: 4,
            blocks: vec![(80, 80); 4],
        };
        let serial = plan(&pairs, 1, &Unit::Given(900.0), &Unit::Given(600.0));
        let both = plan(&pairs, 2, &Unit::Given(900.0), &Unit::Given(600.0));
        assert_eq!((serial.wall_s, both.wall_s), (Some(6000.0), Some(3000.0)));
        assert_eq!(serial.engine_hours, both.engine_hours);
        assert!(
            both.words
                .starts_with("planned: 4 restarts, 320 sessions in 4 blocks (4 waves) on 2 replica sets at once;"),
            "{}",
            both.words
        );
        // A measured unit names where it came from.
        let measured = Unit::pick(None, Some((252.4, 3.0)));
        assert!(plan(&blocks, 1, &measured, &Unit::Unknown)
            .words
            .contains("4.2 min a restart (measured over this target's last 3)"));
        assert_eq!(
            Unit::pick(Some(60.0), Some((252.4, 3.0))),
            Unit::Given(60.0)
        );
    }

    /// A search priced at its fewest and its most blocks: the numbers are the most's,
    /// the words give both; at the SGLang-scale units a culprit search of one to thirty
    /// blocks of 80 is 25 minutes to 12.5 hours.
    #[test]
    fn a_search_is_priced_between_its_fewest_and_its_most_blocks() {
        let fewest = Blocks {
            restarts: 1,
            blocks: vec![(80, 80)],
        };
        let most = Blocks {
            restarts: 30,
            blocks: vec![(80, 80); 30],
        };
        let p = plan_between(&fewest, &most, 1, &Unit::Given(900.0), &Unit::Given(600.0));
        assert_eq!(p.wall_s, Some(30.0 * 1500.0));
        assert_eq!(p.sessions, 2400);
        assert!(
            p.words.starts_with("planned: 1 to 30 restarts, 80 to 2400 sessions in 1 to 30 blocks (1 to 30 waves); 15.0 min a restart"),
            "{}",
            p.words
        );
        assert!(
            p.words
                .ends_with("about 25.0 min to 12.5 h wall, 0.42 to 12 engine-hours"),
            "{}",
            p.words
        );
        // A fixed design is one plan: both ends the same.
        let exact = plan_between(&most, &most, 1, &Unit::Given(900.0), &Unit::Unknown);
        assert!(
            exact
                .words
                .starts_with("planned: 30 restarts, 2400 sessions in 30 blocks (30 waves);"),
            "{}",
            exact.words
        );
        assert!(
            exact.words.ends_with("restarts alone about 7.5 h"),
            "{}",
            exact.words
        );
    }

    #[test]
    fn commands_side_by_side_add_their_sets_and_engine_hours() {
        let a = Cost::spent(
            &[Spent {
                restarts: 2,
                restart_s: 10.0,
                drive_s: 50.0,
                sessions: 160,
                waves: 2.0,
                ..Spent::default()
            }],
            3600.0,
        );
        assert_eq!((a.replicas, a.restarts), (1, 2));
        assert!((a.engine_hours - 1.0).abs() < 1e-12);
        let b = Cost {
            wall_s: 1800.0,
            engine_hours: 0.5,
            ..a.clone()
        };
        let both = Cost::together(&[a, b]);
        assert_eq!((both.replicas, both.restarts), (2, 4));
        assert_eq!(both.wall_s, 3600.0);
        assert!((both.engine_hours - 1.5).abs() < 1e-12);
        // Two lanes of one command: restarts add, times are the longer lane's.
        let lanes = Cost::spent(
            &[
                Spent {
                    restarts: 1,
                    restart_s: 5.0,
                    ..Spent::default()
                },
                Spent {
                    restarts: 3,
                    restart_s: 9.0,
                    ..Spent::default()
                },
            ],
            100.0,
        );
        assert_eq!(
            (lanes.restarts, lanes.restart_s, lanes.replicas),
            (4, 9.0, 2)
        );
        assert!((lanes.engine_hours - 200.0 / 3600.0).abs() < 1e-12);
    }

    /// A restart that never got healthy and a block stopped while it drove are cost (the
    /// engines were held) but no rate: a timed-out health wait is no restart's time.
    #[test]
    fn what_failed_is_cost_and_never_a_rate() {
        let spent = Spent {
            restarts: 1,
            restart_s: 60.0,
            drive_s: 100.0,
            sessions: 80,
            waves: 1.0,
            failed: Failed {
                restarts: 1,
                restart_s: 600.0,
                drive_s: 30.0,
            },
        };
        let cost = Cost::spent(&[spent], 800.0);
        assert_eq!(
            (cost.restarts, cost.restart_s, cost.drive_s),
            (2, 660.0, 130.0)
        );
        let mut rates = Rates::default();
        rates.take(&spent);
        assert_eq!(rates.per_restart(), Some(60.0));
        assert_eq!(rates.per_wave(), Some(100.0));
        // Added up as a testbed's lanes are.
        let mut both = spent;
        both.add(&spent);
        assert_eq!(both.failed.restarts, 2);
        assert_eq!(both.failed.drive_s, 60.0);
    }
}
