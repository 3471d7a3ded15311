//! The tool-call probe's judgement (docs/design.md 3.13, "Does the engine parse tool
//! calls"): before an A/B is spent, and in `bisect check`, the engine is asked the first
//! rounds of a workload's first sessions (the requests the sessions send, with their
//! tools), and one reply at least must come back as parsed OpenAI `tool_calls`. An
//! engine without a tool-call parser (SGLang started without `--tool-call-parser`, vLLM
//! without `--enable-auto-tool-choice`, llama-server without a template that carries
//! tools) returns every call as text: every round of both arms is `leak` (or
//! `no_tool`), and no flag can ever be implicated. The probe names that before a
//! session is spent.
//!
//! Pure: the requests are sent by the caller (`driver::toolprobe`): the first round of
//! [`TRIES`] sessions, one at a time, every one of them asked (the probe does not stop
//! at the first reply). This reads the classes of their replies ([`Tally`]). Rules: one
//! parsed call among them (`ok`, `wrong_args`, `bad_args`: the parser produced
//! `tool_calls`) proves a parser runs, and so does the engine's own rejection
//! (`rejected`); the command then proceeds whatever the other replies were. An engine
//! whose parser works but whose first rounds are sometimes corrupted even alone (one
//! request in flight) is still testable: its other replies, markup in the text (`leak`)
//! or no call (`no_tool`, `truncated`), are said in a note ([`Tally::tolerated`], "1 of
//! 3 first rounds came back as text alone"), since such sessions count in both arms.
//! Only when no reply came back parsed is the run refused: markup in any text (`leak`)
//! says calls come back as text ([`ProbeFinding::AsText`]); replies with neither call
//! nor markup say the model does not call tools when asked ([`ProbeFinding::NoCall`]).
//! An `error`, `timeout` or `crashed` reply is not an answer about the parser: when no
//! reply gave one, the probe could not judge ([`ProbeFinding::Unanswered`]).

use serde::{Deserialize, Serialize};

use crate::session::RoundClass;

/// Sessions asked, every one of them: their first rounds, one at a time. Three keep
/// the probe cheap (three replies, once per command: about a minute on a CPU engine
/// answering in 20 s) while an engine that corrupts a third of its first rounds alone
/// refuses a run only when all three are corrupted (about 1 time in 27), not whenever
/// the first one is.
pub const TRIES: u32 = 3;

/// One reply of the probe: its round class and the classifier's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReply {
    pub class: RoundClass,
    pub evidence: String,
}

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeFinding {
    /// A reply came back as parsed `tool_calls`.
    Parsed,
    /// The engine refused the model's call as unparseable: a parser ran.
    Rejected,
    /// No reply came back parsed, and a call came back as text (markup in `content`):
    /// no parser, or the wrong one.
    AsText,
    /// No reply held a call or markup: the model does not call tools when asked (the
    /// template does not show it the tools, or it ignores them).
    NoCall,
    /// Every reply was a transport error or a timeout: nothing was learnt.
    Unanswered,
}

impl ProbeFinding {
    /// Whether the engine can show the corruption bisect hunts: its replies carry
    /// parsed calls (or its parser's rejections).
    pub fn proves_parsing(self) -> bool {
        matches!(self, ProbeFinding::Parsed | ProbeFinding::Rejected)
    }

    /// Whether an A/B on this engine could only ever see `leak` or `no_tool` in both
    /// arms: a run refuses to start.
    pub fn refuses_a_run(self) -> bool {
        matches!(self, ProbeFinding::AsText | ProbeFinding::NoCall)
    }

    /// In words, for the check's row and the run's refusal.
    pub fn describe(self) -> &'static str {
        match self {
            ProbeFinding::Parsed => "the reply came back as parsed tool_calls",
            ProbeFinding::Rejected => {
                "the engine's tool-call parser rejected the model's call (a parser runs)"
            }
            ProbeFinding::AsText => {
                "the tool calls came back as text in the replies' content, none as tool_calls: the engine parses no tool calls"
            }
            ProbeFinding::NoCall => {
                "the model answered without calling the tool it was asked to call"
            }
            ProbeFinding::Unanswered => "no reply could be judged (errors or timeouts)",
        }
    }

    /// What to do about a refusing finding: `engine_fix` (the engine's way to parse
    /// calls). A model that answers without calling may also be the workload's doing,
    /// not the engine's: the probe asks with the workload's own first round, filler
    /// context and all, and a small model may answer "DONE" under a long filler where it
    /// calls at none (vLLM on CPU, the 1.5B Qwen: `tiny` called at ctx 0 and answered
    /// "DONE" at ctx 1500, 2026-12-04). Said where the workload has filler.
    pub fn fix(self, engine_fix: &str, ctx: u32) -> String {
        match self {
            ProbeFinding::NoCall if ctx > 0 => format!(
                "{engine_fix}; or the model does not call tools under this workload's {ctx} \
                 filler tokens of earlier conversation: if the probe passes with a smaller \
                 --ctx, the engine parses calls and the workload is what the model cannot \
                 follow"
            ),
            _ => engine_fix.to_string(),
        }
    }
}

/// How the replies of a probe fell, by what each says about the engine's parser.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Replies asked for (every session's first round, errors included).
    pub asked: u32,
    /// Parsed calls: `ok`, `wrong_args`, `bad_args`.
    pub parsed: u32,
    /// The engine's parser refused the model's call: `rejected`.
    pub rejected: u32,
    /// Markup in the text: `leak`.
    pub as_text: u32,
    /// Neither a call nor markup: `no_tool`, `truncated`.
    pub no_call: u32,
    /// No answer about the parser: `error`, `timeout`, `crashed`.
    pub unanswered: u32,
}

impl Tally {
    /// The tally of `replies`.
    pub fn of(replies: &[ProbeReply]) -> Tally {
        let mut tally = Tally::default();
        for reply in replies {
            tally.asked += 1;
            *tally.slot(reply.class) += 1;
        }
        tally
    }

    fn slot(&mut self, class: RoundClass) -> &mut u32 {
        match finding_of(class) {
            Some(ProbeFinding::Parsed) => &mut self.parsed,
            Some(ProbeFinding::Rejected) => &mut self.rejected,
            Some(ProbeFinding::AsText) => &mut self.as_text,
            Some(ProbeFinding::NoCall) => &mut self.no_call,
            Some(ProbeFinding::Unanswered) | None => &mut self.unanswered,
        }
    }

    /// The finding: `Parsed` when any reply came back parsed, else `Rejected` when the
    /// parser refused any; else (nothing proves a parser) `AsText` when any reply held
    /// markup, `NoCall` when any came back without a call, `Unanswered` when none came
    /// back. The order the replies came in does not matter.
    pub fn finding(&self) -> ProbeFinding {
        if self.parsed > 0 {
            ProbeFinding::Parsed
        } else if self.rejected > 0 {
            ProbeFinding::Rejected
        } else if self.as_text > 0 {
            ProbeFinding::AsText
        } else if self.no_call > 0 {
            ProbeFinding::NoCall
        } else {
            ProbeFinding::Unanswered
        }
    }

    /// The replies in words: "3 asked: 2 parsed, 1 as text".
    pub fn in_words(&self) -> String {
        let parts: Vec<String> = [
            (self.parsed, "parsed"),
            (self.rejected, "rejected by the parser"),
            (self.as_text, "as text"),
            (self.no_call, "without a call"),
            (self.unanswered, "an error or timeout"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if parts.is_empty() {
            return "none asked".into();
        }
        format!("{} asked: {}", self.asked, parts.join(", "))
    }

    /// The note of a probe that proved a parser although some first rounds came back as
    /// text or without a call, alone (one request in flight): the command proceeds, and
    /// says so. `None` when nothing was tolerated (every reply parsed, or errors only
    /// beside the parsed ones), and when the probe refuses or could not judge.
    pub fn tolerated(&self) -> Option<String> {
        if !self.finding().proves_parsing() || self.as_text + self.no_call == 0 {
            return None;
        }
        let n = self.asked;
        let mut corrupted = Vec::new();
        if self.as_text > 0 {
            corrupted.push(format!(
                "{} of {n} first rounds came back as text alone (one request in flight)",
                self.as_text
            ));
        }
        if self.no_call > 0 {
            corrupted.push(format!(
                "{} of {n} first rounds came back without a call alone (one request in flight)",
                self.no_call
            ));
        }
        let how = match (self.parsed > 0, self.rejected > 0) {
            (true, false) => "as parsed tool_calls",
            (false, true) => "rejected by the engine's tool-call parser",
            _ => "as parsed tool_calls or rejected by the engine's tool-call parser",
        };
        Some(format!(
            "the tool-call probe: {}; {} of {n} came back {how}, so the engine parses tool \
             calls and the command proceeds. Its first rounds are sometimes corrupted even \
             without load: such sessions count in both arms",
            corrupted.join("; "),
            self.parsed + self.rejected,
        ))
    }
}

/// What one reply says about the parser; `None` for a reply that says nothing
/// (an error, a timeout, a death).
fn finding_of(class: RoundClass) -> Option<ProbeFinding> {
    match class {
        RoundClass::Ok | RoundClass::WrongArgs | RoundClass::BadArgs => Some(ProbeFinding::Parsed),
        RoundClass::Rejected => Some(ProbeFinding::Rejected),
        RoundClass::Leak => Some(ProbeFinding::AsText),
        RoundClass::NoTool | RoundClass::Truncated => Some(ProbeFinding::NoCall),
        RoundClass::Error | RoundClass::Timeout | RoundClass::Crashed => None,
    }
}

/// Whether another session must be asked after `replies`: until [`TRIES`] were, every
/// one of them, so that a corrupted first round decides nothing alone.
pub fn wants_another(replies: &[ProbeReply]) -> bool {
    replies.len() < TRIES as usize
}

/// The finding of `replies` ([`Tally::finding`]).
pub fn judge(replies: &[ProbeReply]) -> ProbeFinding {
    Tally::of(replies).finding()
}

/// [`Tally::tolerated`]'s note of `replies`, quoting the first corrupted reply's
/// evidence: what a command that proceeds says (its progress, `bisect check`'s notes).
pub fn tolerated(replies: &[ProbeReply]) -> Option<String> {
    let tally = Tally::of(replies);
    let note = tally.tolerated()?;
    let corrupted = if tally.as_text > 0 {
        ProbeFinding::AsText
    } else {
        ProbeFinding::NoCall
    };
    Some(format!(
        "{note} (the first such reply: {})",
        evidence(replies, corrupted)
    ))
}

/// The evidence to quote for `finding`: the first reply that gave it (a refusal quotes
/// a call that came back as text), else the last reply's.
pub fn evidence(replies: &[ProbeReply], finding: ProbeFinding) -> &str {
    replies
        .iter()
        .find(|r| finding_of(r.class) == Some(finding))
        .or(replies.last())
        .map_or("", |r| r.evidence.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_that_ignores_the_tools_under_filler_is_named_as_a_cause() {
        let engine = "start the engine with a tool-call parser";
        assert_eq!(ProbeFinding::NoCall.fix(engine, 0), engine);
        assert_eq!(ProbeFinding::AsText.fix(engine, 1500), engine);
        let with_filler = ProbeFinding::NoCall.fix(engine, 1500);
        assert!(with_filler.starts_with(engine), "{with_filler}");
        assert!(with_filler.contains("1500 filler tokens"), "{with_filler}");
        assert!(with_filler.contains("smaller --ctx"), "{with_filler}");
    }

    fn reply(class: RoundClass) -> ProbeReply {
        ProbeReply {
            class,
            evidence: String::new(),
        }
    }

    fn replies(classes: &[RoundClass]) -> Vec<ProbeReply> {
        classes
            .iter()
            .enumerate()
            .map(|(i, class)| ProbeReply {
                class: *class,
                evidence: format!("reply {i}: {class:?}"),
            })
            .collect()
    }

    #[test]
    fn every_try_is_asked_whatever_the_first_replies_were() {
        for class in [RoundClass::Ok, RoundClass::Leak, RoundClass::Rejected] {
            let mut asked = vec![reply(class)];
            assert!(wants_another(&asked), "{class:?}");
            asked.push(reply(class));
            assert!(wants_another(&asked), "{class:?}");
            asked.push(reply(class));
            assert!(!wants_another(&asked), "{class:?}");
        }
    }

    #[test]
    fn a_parsed_call_or_a_rejection_proves_a_parser() {
        for class in [RoundClass::Ok, RoundClass::WrongArgs, RoundClass::BadArgs] {
            let all = replies(&[class; 3]);
            assert_eq!(judge(&all), ProbeFinding::Parsed);
            assert_eq!(Tally::of(&all).tolerated(), None, "nothing to tolerate");
        }
        assert_eq!(
            judge(&replies(&[RoundClass::Rejected; 3])),
            ProbeFinding::Rejected
        );
        assert!(ProbeFinding::Rejected.proves_parsing());
        assert!(!ProbeFinding::Parsed.refuses_a_run());
    }

    /// An engine whose parser works but whose first rounds are sometimes corrupted even
    /// alone is testable: one parsed call among the replies proves the parser, in any
    /// position, and the corrupted ones are said in the note.
    #[test]
    fn one_parsed_call_among_leaks_proves_a_parser_and_the_leaks_are_noted() {
        use RoundClass::*;
        for (classes, finding, note) in [
            (
                vec![Leak, Ok, Ok],
                ProbeFinding::Parsed,
                "1 of 3 first rounds came back as text alone (one request in flight); \
                 2 of 3 came back as parsed tool_calls",
            ),
            (
                vec![Leak, Leak, WrongArgs],
                ProbeFinding::Parsed,
                "2 of 3 first rounds came back as text alone (one request in flight); \
                 1 of 3 came back as parsed tool_calls",
            ),
            (
                vec![NoTool, BadArgs, Leak],
                ProbeFinding::Parsed,
                "1 of 3 first rounds came back as text alone (one request in flight); \
                 1 of 3 first rounds came back without a call alone (one request in flight); \
                 1 of 3 came back as parsed tool_calls",
            ),
            (
                vec![Leak, Rejected, Timeout],
                ProbeFinding::Rejected,
                "1 of 3 first rounds came back as text alone (one request in flight); \
                 1 of 3 came back rejected by the engine's tool-call parser",
            ),
            (
                vec![Rejected, Ok, Truncated],
                ProbeFinding::Parsed,
                "1 of 3 first rounds came back without a call alone (one request in flight); \
                 2 of 3 came back as parsed tool_calls or rejected by the engine's tool-call parser",
            ),
        ] {
            let asked = replies(&classes);
            assert_eq!(judge(&asked), finding, "{classes:?}");
            assert!(!finding.refuses_a_run());
            let tally = Tally::of(&asked);
            let said = tally.tolerated().unwrap();
            assert!(
                said.starts_with(&format!("the tool-call probe: {note}, so the engine parses tool calls and the command proceeds")),
                "{classes:?}: {said}"
            );
            assert!(said.ends_with("such sessions count in both arms"), "{said}");
        }
        // Errors beside parsed calls are nothing to tolerate: they said nothing.
        let mixed = replies(&[Ok, NoTool, Leak]);
        let said = tolerated(&mixed).unwrap();
        assert!(
            said.ends_with("count in both arms (the first such reply: reply 2: Leak)"),
            "{said}"
        );
        let erring = Tally::of(&replies(&[Error, Ok, Crashed]));
        assert_eq!(erring.finding(), ProbeFinding::Parsed);
        assert_eq!(erring.tolerated(), None);
        assert_eq!(
            erring.in_words(),
            "3 asked: 1 parsed, 2 an error or timeout"
        );
    }

    #[test]
    fn no_parsed_reply_refuses_as_today_and_quotes_a_call_that_came_back_as_text() {
        use RoundClass::*;
        for (classes, finding) in [
            (vec![Leak, Leak, Leak], ProbeFinding::AsText),
            (vec![NoTool, Leak, Error], ProbeFinding::AsText),
            (vec![Timeout, Error, Leak], ProbeFinding::AsText),
            (vec![NoTool, Timeout, Truncated], ProbeFinding::NoCall),
            (vec![NoTool, NoTool, NoTool], ProbeFinding::NoCall),
        ] {
            let asked = replies(&classes);
            assert_eq!(judge(&asked), finding, "{classes:?}");
            assert!(finding.refuses_a_run(), "{classes:?}");
            assert_eq!(Tally::of(&asked).tolerated(), None, "{classes:?}");
        }
        let asked = replies(&[NoTool, Leak, Error]);
        assert_eq!(evidence(&asked, ProbeFinding::AsText), "reply 1: Leak");
        assert_eq!(
            Tally::of(&asked).in_words(),
            "3 asked: 1 as text, 1 without a call, 1 an error or timeout"
        );
        // Where no reply gave the finding, the last reply is quoted.
        assert_eq!(evidence(&asked, ProbeFinding::Parsed), "reply 2: Error");
        assert_eq!(evidence(&[], ProbeFinding::Parsed), "");
    }

    #[test]
    fn the_order_of_the_replies_does_not_matter() {
        use RoundClass::*;
        let classes = [Leak, NoTool, Ok, Rejected, Error];
        for a in classes {
            for b in classes {
                for c in classes {
                    let one = judge(&replies(&[a, b, c]));
                    for order in [[a, c, b], [b, a, c], [b, c, a], [c, a, b], [c, b, a]] {
                        assert_eq!(judge(&replies(&order)), one, "{a:?} {b:?} {c:?}");
                    }
                    let parsed_or_rejected = [a, b, c].iter().any(|x| matches!(x, Ok | Rejected));
                    assert_eq!(
                        one.proves_parsing(),
                        parsed_or_rejected,
                        "{a:?} {b:?} {c:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn errors_alone_judge_nothing_and_refuse_nothing() {
        let errors = vec![reply(RoundClass::Error); TRIES as usize];
        assert!(!wants_another(&errors));
        assert_eq!(judge(&errors), ProbeFinding::Unanswered);
        assert!(!ProbeFinding::Unanswered.refuses_a_run());
        assert!(!ProbeFinding::Unanswered.proves_parsing());
        assert_eq!(judge(&[]), ProbeFinding::Unanswered);
        assert_eq!(Tally::of(&[]).in_words(), "none asked");
    }
}
