//! Where a run's wall time went (`phases` in run.json, docs/design.md 3.6): editing launch
//! configs, restarting engines, waiting for health (and the health poller's padding, the
//! part of the wait that was bisect noticing late), driving sessions, classifying (inside
//! driving), writing results, planning a sequential design, and the rest. The overhead is
//! what lies outside restarting (health wait included) and driving: the harness's own
//! cost, which must stay a small fraction of the run.
//!
//! Pure: the command layer measures each phase and adds it here.

use serde::{Deserialize, Serialize};

/// Seconds per phase of one run; every field is a sum over the run's arm blocks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Phases {
    /// From the start of the command to the verdict (configs restored, engines stopped).
    pub wall_s: f64,
    /// Writing flag values into the launch configs and reading them back.
    pub edit_s: f64,
    /// Stopping, spawning or running restart commands, asking engines what they run with
    /// (the health wait excluded).
    pub restart_s: f64,
    pub health_wait_s: f64,
    /// Upper bound on the part of `health_wait_s` between an engine being ready and
    /// bisect noticing: the gap from the last probe that found it unhealthy to the one
    /// that found it healthy, summed over roles and restarts.
    pub health_padding_s: f64,
    /// Driving sessions, from the first request to the last block's collector finishing
    /// (metrics and sessions.jsonl are written while it runs).
    pub drive_s: f64,
    /// CPU seconds classifying replies; inside `drive_s`, concurrent with serving.
    pub classify_s: f64,
    /// Rewriting run.json, summary.md and report.html, copying launch snapshots.
    pub write_s: f64,
    /// Planning the sequential design (simulations of the stopping rule).
    pub plan_s: f64,
    /// Stopping the engines and restoring the launch configs at the end.
    pub close_s: f64,
    /// Engine restarts.
    pub restarts: u64,
    /// `wall_s` minus every phase above outside `drive_s` (which includes `classify_s`).
    pub(crate) other_s: f64,
    /// (wall - restart - health wait - drive) / wall.
    pub(crate) overhead_fraction: f64,
}

impl Phases {
    /// Sets the wall time and derives `other_s` and `overhead_fraction`.
    pub fn finish(&mut self, wall_s: f64) {
        self.wall_s = wall_s;
        let accounted = self.edit_s
            + self.restart_s
            + self.health_wait_s
            + self.drive_s
            + self.write_s
            + self.plan_s
            + self.close_s;
        self.other_s = (wall_s - accounted).max(0.0);
        self.overhead_fraction = if wall_s > 0.0 {
            ((wall_s - self.restart_s - self.health_wait_s - self.drive_s) / wall_s).max(0.0)
        } else {
            0.0
        };
    }

    /// Adds what lanes that ran at the same time spent (replica sets, each with its own
    /// engines): each phase's time is the longest lane's, the time the round took on the
    /// wall; restarts are every lane's.
    pub fn add_concurrent(&mut self, lanes: &[Phases]) {
        let longest = |f: fn(&Phases) -> f64| lanes.iter().map(f).fold(0.0, f64::max);
        self.edit_s += longest(|p| p.edit_s);
        self.restart_s += longest(|p| p.restart_s);
        self.health_wait_s += longest(|p| p.health_wait_s);
        self.health_padding_s += longest(|p| p.health_padding_s);
        self.drive_s += longest(|p| p.drive_s);
        self.classify_s += lanes.iter().map(|p| p.classify_s).sum::<f64>();
        self.write_s += longest(|p| p.write_s);
        self.plan_s += longest(|p| p.plan_s);
        self.restarts += lanes.iter().map(|p| p.restarts).sum::<u64>();
    }

    /// Adds `other`'s phases, field by field (one lane's time after another's).
    pub fn add(&mut self, other: &Phases) {
        self.edit_s += other.edit_s;
        self.restart_s += other.restart_s;
        self.health_wait_s += other.health_wait_s;
        self.health_padding_s += other.health_padding_s;
        self.drive_s += other.drive_s;
        self.classify_s += other.classify_s;
        self.write_s += other.write_s;
        self.plan_s += other.plan_s;
        self.close_s += other.close_s;
        self.restarts += other.restarts;
    }

    /// Mean padding per restart, seconds.
    pub(crate) fn padding_per_restart_s(&self) -> f64 {
        if self.restarts == 0 {
            0.0
        } else {
            self.health_padding_s / self.restarts as f64
        }
    }

    /// `wall 6.1 s: restart 1.2 s, health 0.8 s (padding 0.02 s over 2 restarts), ...`.
    pub fn line(&self) -> String {
        format!(
            "wall {:.2} s: drive {:.2} s (classify {:.3} s CPU), restart {:.2} s, health wait \
             {:.2} s (poll padding <= {:.0} ms per restart, {} restarts), edit {:.3} s, write \
             {:.3} s, plan {:.3} s, close {:.2} s, other {:.3} s; overhead outside restart and \
             drive {:.1}%",
            self.wall_s,
            self.drive_s,
            self.classify_s,
            self.restart_s,
            self.health_wait_s,
            self.padding_per_restart_s() * 1000.0,
            self.restarts,
            self.edit_s,
            self.write_s,
            self.plan_s,
            self.close_s,
            self.other_s,
            self.overhead_fraction * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_is_what_lies_outside_restart_and_drive() {
        let mut p = Phases {
            edit_s: 0.1,
            restart_s: 1.0,
            health_wait_s: 2.0,
            health_padding_s: 0.04,
            drive_s: 6.0,
            classify_s: 0.5,
            write_s: 0.2,
            plan_s: 0.3,
            close_s: 0.25,
            restarts: 2,
            ..Phases::default()
        };
        p.finish(10.0);
        // 10 - (0.1 + 1 + 2 + 6 + 0.2 + 0.3 + 0.25) = 0.15
        assert!((p.other_s - 0.15).abs() < 1e-12);
        // (10 - 1 - 2 - 6) / 10
        assert!((p.overhead_fraction - 0.1).abs() < 1e-12);
        assert!((p.padding_per_restart_s() - 0.02).abs() < 1e-12);
        assert!(p
            .line()
            .contains("overhead outside restart and drive 10.0%"));
    }

    /// Two lanes at once take the longer lane's time and both lanes' restarts; added
    /// one after the other they take both.
    #[test]
    fn concurrent_lanes_take_the_longest_time_and_every_restart() {
        let lane = |restart_s: f64, drive_s: f64| Phases {
            restart_s,
            drive_s,
            classify_s: 0.5,
            restarts: 1,
            ..Phases::default()
        };
        let mut p = Phases::default();
        p.add_concurrent(&[lane(3.0, 10.0), lane(5.0, 8.0)]);
        assert_eq!(
            (p.restart_s, p.drive_s, p.classify_s, p.restarts),
            (5.0, 10.0, 1.0, 2)
        );
        let mut serial = Phases::default();
        serial.add(&lane(3.0, 10.0));
        serial.add(&lane(5.0, 8.0));
        assert_eq!(
            (serial.restart_s, serial.drive_s, serial.restarts),
            (8.0, 18.0, 2)
        );
    }

    #[test]
    fn an_empty_run_has_no_overhead_and_old_records_load() {
        let mut p = Phases::default();
        p.finish(0.0);
        assert_eq!(p.overhead_fraction, 0.0);
        let old: Phases = serde_json::from_str(r#"{"wall_s": 3.0}"#).unwrap();
        assert_eq!(old.wall_s, 3.0);
        assert_eq!(old.restarts, 0);
    }
}
