//! An engine that dies is evidence (docs/design.md 3.7, "Engine deaths"): a role's
//! process that exits during a block (killed by a signal, or exiting by itself), or a
//! role that stops accepting connections. Its record ([`EngineDeath`]: the exit status
//! and signal, the time into the block, the requests in flight then, the log lines
//! before it) is kept per block, the sessions it cut short are `crashed` (neither clean,
//! nor timed out, nor corrupted by a classifier rule), and the verdict judges the deaths
//! by their own unit.
//!
//! The unit is the engine's life, not the session: a death takes every session in
//! flight with it, so counting those sessions would count one event many times. Each arm
//! exposes its engines to `served` requests (replies received; a restart after a death
//! starts a new life); deaths are modelled as Poisson events in that exposure, and two
//! arms are compared with the conditional test of two Poisson rates (Przyborowski and
//! Wilenski 1940, the "C-test"; Krishnamoorthy and Thomson 2004, J. Stat. Plann.
//! Inference 119:23-35): given `n = d_a + d_b` deaths, `d_a` is binomial with
//! probability `e_a / (e_a + e_b)` under equal rates, and the one-sided p-value is its
//! upper tail. An arm whose engine never died while the other's did `d` times therefore
//! has p = `(e_dying / (e_dying + e_other))^d`: one death in equal exposures proves
//! nothing (p = 0.5); an engine that dies after a few requests in every block while the
//! other serves hundreds does.
//!
//! Pure: the deaths are observed by the arm lifecycle.

use serde::{Deserialize, Serialize};

use crate::session::SessionClass;
use crate::stats;

/// How a role's process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitDesc {
    /// Its exit code, when it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that killed it (or, for a shell that ran the engine without `exec`,
    /// the signal its exit code 128+N reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The signal's name (`SIGSEGV`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_name: Option<String>,
}

impl ExitDesc {
    /// `killed by SIGSEGV (signal 11)`, `exit 1`, `exit 139 (the shell's report of
    /// SIGSEGV)`.
    pub fn describe(&self) -> String {
        let name = self.signal_name.as_deref().unwrap_or("a signal");
        match (self.code, self.signal) {
            (Some(code), Some(_)) => format!("exit {code} (the shell's report of {name})"),
            (None, Some(signal)) => format!("killed by {name} (signal {signal})"),
            (Some(code), None) => format!("exit {code}"),
            (None, None) => "exited (status unknown)".into(),
        }
    }
}

/// One role's death during a block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineDeath {
    pub role: String,
    /// Seconds into the block's drive when it was noticed.
    pub at_s: f64,
    /// Requests in flight at the client around the death: the most the client's own
    /// count held in the watch's last window before it noticed (the requests the death
    /// cut have left the count by then), never a sampled gauge.
    pub in_flight: u64,
    /// The role's running-requests gauge as the metrics poller last sampled it before
    /// the death, beside the client's count (absent when the role has no metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_running: Option<f64>,
    /// How the process ended, for a role bisect spawned; `None` for a role that stopped
    /// accepting connections (a restart command's engine: its exit is its supervisor's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitDesc>,
    /// The last lines of the role's log before it died (spawned roles).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tail: Vec<String>,
}

impl EngineDeath {
    /// `role decode killed by SIGSEGV (signal 11) at 3.2 s with 4 in flight`.
    pub fn describe(&self) -> String {
        let how = match &self.exit {
            Some(exit) => exit.describe(),
            None => "stopped accepting connections".into(),
        };
        format!(
            "role {} {how} at {:.1} s with {}",
            self.role,
            self.at_s,
            self.load_words()
        )
    }

    /// `4 in flight (the client's count; the engine last sampled 3 running)`: the
    /// client's count is the load; the engine's sample, when there is one, stands beside
    /// it as a sample, never in its place.
    pub fn load_words(&self) -> String {
        match self.engine_running {
            Some(running) => format!(
                "{} in flight (the client's count; the engine last sampled {} running)",
                self.in_flight,
                if running.fract() == 0.0 {
                    format!("{running:.0}")
                } else {
                    format!("{running:.1}")
                }
            ),
            None => format!("{} in flight (the client's count)", self.in_flight),
        }
    }

    /// A short name of how it died, for tables: `SIGSEGV`, `exit 1`, `refused`.
    pub fn short(&self) -> String {
        match &self.exit {
            Some(ExitDesc {
                signal_name: Some(name),
                ..
            }) => name.clone(),
            Some(ExitDesc {
                code: Some(code), ..
            }) => format!("exit {code}"),
            Some(_) => "exited".into(),
            None => "refused".into(),
        }
    }
}

/// Deaths an arm block takes before it stops restarting its engines and ends with the
/// sessions it has. Eight: an arm whose engines die while the other's never do is
/// judged by the conditional test (module doc), whose p-value at equal exposure is
/// `0.5^d`; `0.5^8 = 0.0039` is decisive at the default alpha 0.01 with room to spare
/// even when the dying arm served as many requests as the other (7 would leave 0.0078),
/// and an engine that dies at load serves fewer, so its p-value falls faster. More deaths
/// cost restarts and learn nothing the verdict needs.
pub const DEATH_BUDGET: usize = 8;

/// A restart of a block's engines after a death, so the block goes on (the arm's
/// sessions not yet run, and those the death cut short, run on the new engine life).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeathRestart {
    /// Seconds into the block's drive when the restart began.
    pub at_s: f64,
    /// Seconds the restart took, the health wait included.
    pub restart_s: f64,
    /// Sessions the new life was given to run.
    pub sessions: u64,
}

/// Sessions a death cut short in a block that showed no corruption: the block is no
/// "no bug here" (never clean, a pass or a flat level: an engine that dies is evidence),
/// while corruption seen beside a death is still the bug seen. `None` when nothing was
/// cut short or something was corrupted.
pub fn crashed_without_corruption<'a>(
    classes: impl IntoIterator<Item = &'a SessionClass>,
) -> Option<u64> {
    let (mut crashed, mut corrupted) = (0u64, false);
    for class in classes {
        crashed += u64::from(*class == SessionClass::Crashed);
        corrupted |= class.is_corrupted();
    }
    (crashed > 0 && !corrupted).then_some(crashed)
}

/// One arm's engine lives: its deaths and the requests its engines served.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exposure<'a> {
    pub label: &'a str,
    pub deaths: &'a [EngineDeath],
    /// Blocks the arm ran, and how many of them saw a death.
    pub blocks: u64,
    pub blocks_died: u64,
    /// Replies the arm's engines served (every round that got an answer).
    pub served: u64,
    /// Restarts after deaths, each a new engine life that went on with the arm.
    pub restarts: u64,
}

/// What the deaths of two arms say.
#[derive(Debug, Clone, PartialEq)]
pub enum DeathFinding {
    /// No engine died.
    None,
    /// Only `dying`'s engines died, at conditional p-value `p` (one-sided).
    OneArm {
        dying: String,
        p: f64,
        /// The verdict's words.
        text: String,
        /// Every death was at one request in flight: nothing load-dependent.
        at_one_in_flight: bool,
    },
    /// Both arms' engines died: the flag is not what kills them.
    BothArms { text: String },
}

/// The one-sided conditional p-value of `d_a` or more of `d_a + d_b` deaths falling in
/// arm a, with exposures `e_a` and `e_b`: the binomial upper tail at `e_a / (e_a +
/// e_b)` (module doc). An arm with no exposure at all (it died before serving a reply)
/// is given one request of it, so a death at the first request is not infinitely
/// unlikely.
pub(crate) fn conditional_p(d_a: u64, e_a: u64, d_b: u64, e_b: u64) -> f64 {
    let (e_a, e_b) = (e_a.max(1) as f64, e_b.max(1) as f64);
    stats::binomial_upper_tail(d_a, d_a + d_b, e_a / (e_a + e_b))
}

fn arm_words(e: &Exposure<'_>) -> String {
    let kinds: Vec<String> = e.deaths.iter().map(EngineDeath::short).collect();
    let mut kinds_dedup = kinds.clone();
    kinds_dedup.dedup();
    let in_flight: Vec<u64> = e.deaths.iter().map(|d| d.in_flight).collect();
    let (lo, hi) = (
        in_flight.iter().min().copied().unwrap_or(0),
        in_flight.iter().max().copied().unwrap_or(0),
    );
    let load = if lo == hi {
        format!("{lo} in flight")
    } else {
        format!("{lo}-{hi} in flight")
    };
    let restarts = match e.restarts {
        0 => String::new(),
        1 => "1 restart, ".to_string(),
        n => format!("{n} restarts, "),
    };
    format!(
        "{} engine death{} ({}) at {load} (the client's count): {restarts}{} of {} blocks died, {} requests served ({} per death)",
        e.deaths.len(),
        if e.deaths.len() == 1 { "" } else { "s" },
        kinds_dedup.join(", "),
        e.blocks_died,
        e.blocks,
        e.served,
        per_death(e.served, e.deaths.len() as u64),
    )
}

/// Requests served per death, to one decimal where it is small.
fn per_death(served: u64, deaths: u64) -> String {
    let per = served as f64 / deaths.max(1) as f64;
    if per < 10.0 {
        format!("{per:.1}")
    } else {
        format!("{per:.0}")
    }
}

/// The deaths of arms `a` and `b` judged (module doc).
pub fn judge(a: &Exposure<'_>, b: &Exposure<'_>) -> DeathFinding {
    let (da, db) = (a.deaths.len() as u64, b.deaths.len() as u64);
    match (da, db) {
        (0, 0) => DeathFinding::None,
        (_, 0) | (0, _) => {
            let (dying, other) = if da > 0 { (a, b) } else { (b, a) };
            let d = dying.deaths.len() as u64;
            let p = conditional_p(d, dying.served, 0, other.served);
            let at_one = dying.deaths.iter().all(|x| x.in_flight <= 1);
            let mut text = format!(
                "{} crashes the engine: {}; {} 0 of {} blocks died, {} requests served (conditional Poisson test, deaths per request served: p = {})",
                dying.label,
                arm_words(dying),
                other.label,
                other.blocks,
                other.served,
                crate::format::p_value(p)
            );
            if at_one {
                text.push_str(
                    "; every death came at 1 request in flight: the crash is not load-dependent",
                );
            }
            DeathFinding::OneArm {
                dying: dying.label.to_string(),
                p,
                text,
                at_one_in_flight: at_one,
            }
        }
        _ => DeathFinding::BothArms {
            text: format!(
                "the engine died in both arms ({}: {}; {}: {}): whatever kills it is not the flag alone, and the sessions it cut short leave both arms partial",
                a.label,
                arm_words(a),
                b.label,
                arm_words(b)
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn death(in_flight: u64) -> EngineDeath {
        EngineDeath {
            role: "server".into(),
            at_s: 1.5,
            in_flight,
            engine_running: None,
            exit: Some(ExitDesc {
                code: None,
                signal: Some(11),
                signal_name: Some("SIGSEGV".into()),
            }),
            log_tail: vec![],
        }
    }

    fn arm<'a>(
        label: &'a str,
        deaths: &'a [EngineDeath],
        blocks: u64,
        served: u64,
    ) -> Exposure<'a> {
        Exposure {
            label,
            deaths,
            blocks,
            blocks_died: deaths.len() as u64,
            served,
            restarts: 0,
        }
    }

    #[test]
    fn the_conditional_test_matches_the_binomial_tail() {
        // Equal exposure: each death is a fair coin; 1 death proves nothing.
        assert!((conditional_p(1, 100, 0, 100) - 0.5).abs() < 1e-12);
        assert!((conditional_p(3, 100, 0, 100) - 0.125).abs() < 1e-12);
        // 2 deaths in 6 requests against 0 in 160: (6/166)^2.
        assert!((conditional_p(2, 6, 0, 160) - (6.0f64 / 166.0).powi(2)).abs() < 1e-12);
        // Reference: P(X >= 3 | n = 5, p = 0.5) = 0.5.
        assert!((conditional_p(3, 10, 2, 10) - 0.5).abs() < 1e-12);
        // No exposure at all counts as one request.
        assert!((conditional_p(1, 0, 0, 99) - 0.01).abs() < 1e-12);
    }

    #[test]
    fn one_arm_dying_at_load_is_named_with_its_signal_and_blocks() {
        let on = [death(4), death(4)];
        let found = judge(&arm("on", &on, 2, 6), &arm("off", &[], 2, 160));
        let DeathFinding::OneArm {
            dying,
            p,
            text,
            at_one_in_flight,
        } = found
        else {
            panic!("{found:?}")
        };
        assert_eq!(dying, "on");
        assert!(p < 0.01, "{p}");
        assert!(!at_one_in_flight);
        assert!(
            text.starts_with("on crashes the engine: 2 engine deaths (SIGSEGV) at 4 in flight (the client's count): 2 of 2 blocks died, 6 requests served (3.0 per death); off 0 of 2 blocks died, 160 requests served"),
            "{text}"
        );
    }

    #[test]
    fn deaths_at_one_in_flight_and_in_both_arms_are_said() {
        let on = [death(1)];
        let DeathFinding::OneArm {
            at_one_in_flight,
            text,
            ..
        } = judge(&arm("on", &on, 1, 3), &arm("off", &[], 1, 40))
        else {
            panic!()
        };
        assert!(at_one_in_flight);
        assert!(text.contains("not load-dependent"), "{text}");
        let off = [death(8)];
        let DeathFinding::BothArms { text } =
            judge(&arm("on", &on, 1, 3), &arm("off", &off, 1, 30))
        else {
            panic!()
        };
        assert!(text.contains("died in both arms"), "{text}");
        assert!(text.contains("SIGSEGV"), "{text}");
        assert_eq!(
            judge(&arm("on", &[], 1, 3), &arm("off", &[], 1, 3)),
            DeathFinding::None
        );
    }

    #[test]
    fn a_block_that_only_crashed_is_told_from_one_that_also_corrupted() {
        use SessionClass::*;
        assert_eq!(
            crashed_without_corruption(&[Done, Crashed, Crashed]),
            Some(2)
        );
        assert_eq!(crashed_without_corruption(&[Leak, Crashed]), None);
        assert_eq!(crashed_without_corruption(&[Done, Timeout]), None);
    }

    #[test]
    fn exits_are_described_by_signal_or_code() {
        let segv = ExitDesc {
            code: None,
            signal: Some(11),
            signal_name: Some("SIGSEGV".into()),
        };
        assert_eq!(segv.describe(), "killed by SIGSEGV (signal 11)");
        let shell = ExitDesc {
            code: Some(139),
            signal: Some(11),
            signal_name: Some("SIGSEGV".into()),
        };
        assert_eq!(shell.describe(), "exit 139 (the shell's report of SIGSEGV)");
        let plain = ExitDesc {
            code: Some(1),
            signal: None,
            signal_name: None,
        };
        assert_eq!(plain.describe(), "exit 1");
        let refused = EngineDeath {
            exit: None,
            ..death(3)
        };
        assert_eq!(
            refused.describe(),
            "role server stopped accepting connections at 1.5 s with 3 in flight (the client's count)"
        );
    }
}
