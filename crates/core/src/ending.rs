//! How a session ends (docs/design.md 3.4/3.5), decided in one place for the live driver
//! (`driver::conversation`) and for `bisect reclassify`, which replays stored rounds, so
//! that a stored run reclassifies to exactly the classes it was given live.
//!
//! Round by round: the first non-ok round ends the session with that round's class; an ok
//! text answer ends it `done`; an ok reply with tool calls advances the task one step (one
//! step even for several calls: the classifier judges a round against one expected call).
//! A session no round ended is `maxrounds`.

use crate::session::{ChatMessage, RoundClass, RoundRecord, SessionClass};

/// Whether a session goes on after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// An ok reply with tool calls: the next round is judged against the next step.
    Continue,
    /// The session has its class; later rounds are not run.
    Stop,
}

/// One session's rounds so far, the task step it is on, and its class once decided.
#[derive(Debug, Clone)]
pub struct SessionProgress {
    steps: usize,
    step: usize,
    rounds: Vec<RoundRecord>,
    ended: Option<(SessionClass, String)>,
}

/// How a session ended: its class, the evidence, its first bad round and its rounds.
#[derive(Debug, Clone)]
pub struct Ending {
    pub class: SessionClass,
    pub evidence: String,
    pub first_bad_round: Option<u32>,
    pub rounds: Vec<RoundRecord>,
    /// `maxrounds` with rounds left: the last round recorded is ok yet nothing came after
    /// it. Only a replay sees this (its stored last round was non-ok and is now judged ok);
    /// the rounds after it were never run, so the session is incomplete.
    pub cut_short: bool,
}

impl Ending {
    /// The client latency of every round, in milliseconds.
    pub fn latency_ms(&self) -> Vec<u64> {
        self.rounds.iter().map(|r| r.latency_ms).collect()
    }
}

impl SessionProgress {
    /// A session whose task has `steps` steps, before its first round.
    pub fn new(steps: usize) -> Self {
        SessionProgress {
            steps,
            step: 0,
            rounds: Vec::new(),
            ended: None,
        }
    }

    /// The task step the next round is judged against (0-based; `steps` once all are done).
    pub fn step(&self) -> usize {
        self.step
    }

    /// Record one judged round. `reply` is the assistant message the round was judged on,
    /// `None` when the round had no reply (a transport error or timeout).
    pub fn record(&mut self, round: RoundRecord, reply: Option<&ChatMessage>) -> Flow {
        debug_assert!(
            self.ended.is_none(),
            "a round recorded after the session ended"
        );
        let class = round.class;
        let evidence = round.evidence.clone();
        self.rounds.push(round);
        let ended = match (SessionClass::from_round(class), reply) {
            (Some(class), _) => class,
            // A classifier that calls a transport failure ok is a bug; never go on after it.
            (None, None) => SessionClass::Error,
            (None, Some(reply)) if has_tool_calls(reply) => {
                self.step = (self.step + 1).min(self.steps);
                return Flow::Continue;
            }
            (None, Some(_)) => SessionClass::Done,
        };
        self.ended = Some((ended, evidence));
        Flow::Stop
    }

    /// The session's ending once its rounds are recorded; `max_rounds` is the workload's
    /// round limit.
    pub fn finish(self, max_rounds: u32) -> Ending {
        let used = self.rounds.len() as u32;
        let (steps, step) = (self.steps, self.step);
        let (class, evidence, cut_short) = match self.ended {
            Some((class, evidence)) => (class, evidence, false),
            None if used < max_rounds => (
                SessionClass::Maxrounds,
                format!(
                    "round {used} is ok, but the session ended there ({step} of {steps} steps done); its later rounds were never run"
                ),
                true,
            ),
            None => (
                SessionClass::Maxrounds,
                format!("{step} of {steps} steps done when the {max_rounds} rounds ran out"),
                false,
            ),
        };
        let first_bad_round = self
            .rounds
            .iter()
            .find(|r| r.class != RoundClass::Ok)
            .map(|r| r.round);
        Ending {
            class,
            evidence,
            first_bad_round,
            rounds: self.rounds,
            cut_short,
        }
    }
}

/// An ok reply with at least one tool call goes on; one without any is a final answer.
fn has_tool_calls(reply: &ChatMessage) -> bool {
    reply.tool_calls.as_ref().is_some_and(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{FunctionCall, ToolCall};

    fn round(n: u32, class: RoundClass) -> RoundRecord {
        RoundRecord {
            round: n,
            class,
            latency_ms: n as u64,
            completion_tokens: 1,
            evidence: format!("round {n}"),
            finish_reason: None,
            http: None,
            logprobs: None,
        }
    }

    fn call() -> ChatMessage {
        ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(vec![ToolCall {
                id: "c".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "read_file".into(),
                    arguments: "{}".into(),
                },
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn ok_calls_advance_and_a_text_answer_is_done() {
        let mut p = SessionProgress::new(2);
        assert_eq!(
            p.record(round(1, RoundClass::Ok), Some(&call())),
            Flow::Continue
        );
        assert_eq!(p.step(), 1);
        assert_eq!(
            p.record(round(2, RoundClass::Ok), Some(&call())),
            Flow::Continue
        );
        assert_eq!(
            p.record(round(3, RoundClass::Ok), Some(&call())),
            Flow::Continue
        );
        assert_eq!(p.step(), 2, "the step stops at the last one");
        let text = ChatMessage::new("assistant", "DONE");
        assert_eq!(p.record(round(4, RoundClass::Ok), Some(&text)), Flow::Stop);
        let e = p.finish(8);
        assert_eq!(
            (e.class, e.first_bad_round, e.cut_short),
            (SessionClass::Done, None, false)
        );
        assert_eq!(e.evidence, "round 4");
        assert_eq!(e.latency_ms(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn the_first_bad_round_decides_with_or_without_a_reply() {
        let mut p = SessionProgress::new(3);
        p.record(round(1, RoundClass::Ok), Some(&call()));
        assert_eq!(
            p.record(round(2, RoundClass::Leak), Some(&call())),
            Flow::Stop
        );
        let e = p.finish(4);
        assert_eq!((e.class, e.first_bad_round), (SessionClass::Leak, Some(2)));

        let mut p = SessionProgress::new(3);
        assert_eq!(p.record(round(1, RoundClass::Timeout), None), Flow::Stop);
        assert_eq!(p.finish(4).class, SessionClass::Timeout);
    }

    #[test]
    fn an_ok_round_without_a_reply_is_an_error() {
        let mut p = SessionProgress::new(3);
        assert_eq!(p.record(round(1, RoundClass::Ok), None), Flow::Stop);
        let e = p.finish(4);
        assert_eq!((e.class, e.first_bad_round), (SessionClass::Error, None));
    }

    #[test]
    fn running_out_of_rounds_is_maxrounds_and_stopping_early_is_cut_short() {
        let mut p = SessionProgress::new(3);
        p.record(round(1, RoundClass::Ok), Some(&call()));
        p.record(round(2, RoundClass::Ok), Some(&call()));
        let full = p.clone().finish(2);
        assert_eq!(
            (full.class, full.cut_short),
            (SessionClass::Maxrounds, false)
        );
        assert_eq!(full.evidence, "2 of 3 steps done when the 2 rounds ran out");
        let cut = p.finish(4);
        assert_eq!((cut.class, cut.cut_short), (SessionClass::Maxrounds, true));
        assert!(cut.evidence.contains("never run"), "{}", cut.evidence);
    }
}
