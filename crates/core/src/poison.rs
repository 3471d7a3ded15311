//! Engines poisoned by their first failure (docs/design.md 3.7, "Poisoned engines"):
//! some engines, once a request has failed, answer every later request with garbage
//! until they restart (xgrammar #460, vLLM #35718, SGLang #23020). Such an engine's arm
//! rate (say 40 of 40) is not the rate of a load-dependent corruption, and must not be
//! read as one.
//!
//! The test is a canary: once a block's engine life has served a corrupted session,
//! one session is run alone on that same engine (no restart, nothing else in flight).
//! Its task is one that came back clean on this engine: before the first failure where
//! there is one, else at any time (a task clean on this engine), else the first
//! failure's own task ([`Chosen`]). Clean alone, the engine is not
//! poisoned. Corrupted alone, the same task is run alone once more on a freshly
//! restarted engine: clean there, the engine the failure left behind was what corrupted
//! it, so it was poisoned ([`Canary::poisoned`]); corrupted there too, the task
//! corrupts with nothing else in flight on this configuration (a corruption that needs
//! no load, or a task that always fails), and nothing was carried: not poisoned. The
//! block's sessions are then counted apart: those that ended before the first failure
//! and those that started after it ([`split`]).
//!
//! Pure: the canary is run by the arm lifecycle; this chooses its task, splits the
//! sessions and words the finding.

use serde::{Deserialize, Serialize};

use crate::session::{SessionClass, SessionTiming};

/// One session of an engine life, as the canary's choice reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ran {
    pub index: u32,
    pub class: SessionClass,
    pub timing: SessionTiming,
}

/// The first failure of an engine life: the corrupted session that ended first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FirstFailure {
    /// The session's index.
    pub index: u32,
    /// Seconds into the block when it ended.
    pub at_s: f64,
    /// The request index of the session's first request on its engine life.
    pub request_seq: u64,
    pub class: SessionClass,
}

/// Why the canary's task was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Chosen {
    /// It came back clean on this engine before the first failure.
    CleanBefore,
    /// It came back clean on this engine, ending after the first failure (no session
    /// had ended clean before it).
    CleanOnEngine,
    /// The first failure's own task: no session came back clean on this engine.
    FirstFailure,
}

impl Chosen {
    fn words(self) -> &'static str {
        match self {
            Chosen::CleanBefore => "clean on this engine before the first failure",
            Chosen::CleanOnEngine => "clean on this engine, ending after the first failure",
            Chosen::FirstFailure => {
                "the first failure's own task: none had come back clean on this engine"
            }
        }
    }
}

/// The canary's task: which session index, and why it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CanaryTask {
    pub first_failure: FirstFailure,
    pub index: u32,
    pub chosen: Chosen,
}

/// Judged and corrupted sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub judged: u64,
    pub corrupted: u64,
}

impl Tally {
    fn add(&mut self, class: SessionClass) {
        if class.is_judged() {
            self.judged += 1;
            self.corrupted += u64::from(class.is_corrupted());
        }
    }
}

/// What the canary found, with the block's sessions counted before and after the first
/// failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Canary {
    /// The engine life it ran on.
    pub life: u32,
    pub first_failure: FirstFailure,
    /// The canary's session index.
    pub index: u32,
    /// Why that task.
    pub chosen: Chosen,
    /// The canary's class, alone on the same engine.
    pub class: SessionClass,
    pub evidence: String,
    /// The same task's class alone on a freshly restarted engine, run when the canary
    /// came back corrupted (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh: Option<SessionClass>,
    /// Sessions of the life that ended before the first failure (it included).
    pub before: Tally,
    /// Sessions of the life that started after the first failure.
    pub after: Tally,
}

impl Canary {
    /// Corrupted alone on the engine that had failed, clean alone on a fresh one: it is
    /// poisoned.
    pub fn poisoned(&self) -> bool {
        self.class.is_corrupted() && self.fresh.is_some_and(|f| !f.is_corrupted())
    }

    /// The finding in words, for a record, a table note and the verdict.
    pub fn describe(&self) -> String {
        let task = format!("session {} ({})", self.index, self.chosen.words());
        let outcome = match self.fresh {
            _ if !self.class.is_corrupted() => format!(
                "came back {} alone: the engine was not poisoned",
                self.class.name()
            ),
            Some(fresh) if !fresh.is_corrupted() => format!(
                "came back {} alone, and {} alone on a freshly restarted engine: the engine was poisoned after the first failure",
                self.class.name(),
                fresh.name()
            ),
            Some(fresh) => format!(
                "came back {} alone, and {} alone on a freshly restarted engine too: the task corrupts with nothing else in flight, the engine was not poisoned",
                self.class.name(),
                fresh.name()
            ),
            None => format!(
                "came back {} alone; no fresh engine was asked, so poisoning is not told from a corruption that needs no load",
                self.class.name()
            ),
        };
        format!(
            "first failure ({}) at {:.1} s, request {}; a canary, {task}, run alone on the same engine afterwards {outcome}; before the first failure {} of {} judged sessions corrupted, after it {} of {}",
            self.first_failure.class.name(),
            self.first_failure.at_s,
            self.first_failure.request_seq,
            self.before.corrupted,
            self.before.judged,
            self.after.corrupted,
            self.after.judged,
        )
    }
}

/// The canary's task for an engine life's sessions: `None` when none was corrupted or
/// none carries its timing (module doc).
pub fn canary_task(sessions: &[Ran]) -> Option<CanaryTask> {
    let first = sessions
        .iter()
        .filter(|s| s.class.is_corrupted())
        .min_by(|a, b| a.timing.ended_s.total_cmp(&b.timing.ended_s))?;
    let first_failure = FirstFailure {
        index: first.index,
        at_s: first.timing.ended_s,
        request_seq: first.timing.request_seq,
        class: first.class,
    };
    let clean = |s: &&Ran| s.class.is_judged() && !s.class.is_corrupted();
    let before = sessions
        .iter()
        .filter(clean)
        .filter(|s| s.timing.ended_s <= first_failure.at_s)
        .min_by_key(|s| s.index);
    let later = || {
        sessions
            .iter()
            .filter(clean)
            .min_by(|a, b| a.timing.ended_s.total_cmp(&b.timing.ended_s))
    };
    let (index, chosen) = match (before, later()) {
        (Some(s), _) => (s.index, Chosen::CleanBefore),
        (None, Some(s)) => (s.index, Chosen::CleanOnEngine),
        (None, None) => (first.index, Chosen::FirstFailure),
    };
    Some(CanaryTask {
        first_failure,
        index,
        chosen,
    })
}

/// The life's sessions counted apart: (ended at or before the first failure, started
/// after it). Sessions that spanned it are in neither.
pub fn split(sessions: &[Ran], first: &FirstFailure) -> (Tally, Tally) {
    let (mut before, mut after) = (Tally::default(), Tally::default());
    for s in sessions {
        if s.timing.ended_s <= first.at_s {
            before.add(s.class);
        } else if s.timing.started_s > first.at_s {
            after.add(s.class);
        }
    }
    (before, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(index: u32, class: SessionClass, started_s: f64, ended_s: f64) -> Ran {
        Ran {
            index,
            class,
            timing: SessionTiming {
                life: 0,
                started_s,
                uptime_s: started_s,
                request_seq: u64::from(index) * 2,
                ended_s,
            },
        }
    }

    #[test]
    fn the_canary_is_a_task_that_was_clean_before_the_first_failure() {
        use SessionClass::*;
        let sessions = [
            ran(3, Done, 0.0, 1.0),
            ran(1, Done, 0.0, 1.5),
            ran(5, WrongArgs, 1.0, 2.0),
            ran(0, Leak, 0.5, 3.0),
            ran(7, Done, 2.5, 4.0),
        ];
        let task = canary_task(&sessions).unwrap();
        assert_eq!(task.first_failure.index, 5);
        assert_eq!(task.first_failure.at_s, 2.0);
        assert_eq!(task.first_failure.request_seq, 10);
        assert_eq!((task.index, task.chosen), (1, Chosen::CleanBefore));
        let (before, after) = split(&sessions, &task.first_failure);
        assert_eq!(
            before,
            Tally {
                judged: 3,
                corrupted: 1
            }
        );
        // Session 0 spanned the failure: in neither; session 7 started after it.
        assert_eq!(
            after,
            Tally {
                judged: 1,
                corrupted: 0
            }
        );
    }

    #[test]
    fn without_a_task_clean_before_it_a_later_clean_one_then_the_failure_itself() {
        use SessionClass::*;
        let sessions = [
            ran(2, Leak, 0.0, 0.5),
            ran(4, Timeout, 0.0, 0.4),
            ran(6, Done, 0.0, 0.9),
            ran(1, Done, 0.0, 0.7),
        ];
        let task = canary_task(&sessions).unwrap();
        assert_eq!((task.index, task.chosen), (1, Chosen::CleanOnEngine));
        let task = canary_task(&sessions[..2]).unwrap();
        assert_eq!((task.index, task.chosen), (2, Chosen::FirstFailure));
        assert!(canary_task(&[ran(1, Done, 0.0, 1.0)]).is_none());
    }

    #[test]
    fn a_corrupted_canary_names_the_engine_poisoned() {
        let canary = Canary {
            life: 0,
            first_failure: FirstFailure {
                index: 5,
                at_s: 2.0,
                request_seq: 10,
                class: SessionClass::WrongArgs,
            },
            index: 1,
            chosen: Chosen::CleanBefore,
            class: SessionClass::WrongArgs,
            evidence: String::new(),
            fresh: Some(SessionClass::Done),
            before: Tally {
                judged: 3,
                corrupted: 1,
            },
            after: Tally {
                judged: 40,
                corrupted: 40,
            },
        };
        assert!(canary.poisoned());
        let words = canary.describe();
        assert!(
            words.contains("the engine was poisoned after the first failure"),
            "{words}"
        );
        assert!(words.contains("at 2.0 s, request 10"), "{words}");
        assert!(
            words.ends_with(
                "before the first failure 1 of 3 judged sessions corrupted, after it 40 of 40"
            ),
            "{words}"
        );
        // Corrupted alone on a fresh engine too: the task corrupts without load (a
        // fault the task always meets), nothing was carried.
        let always = Canary {
            fresh: Some(SessionClass::WrongArgs),
            ..canary.clone()
        };
        assert!(!always.poisoned());
        assert!(
            always
                .describe()
                .contains("the task corrupts with nothing else in flight"),
            "{}",
            always.describe()
        );
        let clean = Canary {
            class: SessionClass::Done,
            fresh: None,
            ..canary
        };
        assert!(!clean.poisoned());
        assert!(clean.describe().contains("was not poisoned"));
    }
}
