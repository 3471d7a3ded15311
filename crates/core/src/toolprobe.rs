//! The tool-call probe's judgement (docs/design.md 3.13, "Does the engine parse tool
//! calls"): before an A/B is spent, and in `bisect check`, the engine is asked the first
//! round of a workload's session (the request a session sends, with its tools), and the
//! reply must come back as parsed OpenAI `tool_calls`. An engine without a tool-call
//! parser (SGLang started without `--tool-call-parser`, vLLM without
//! `--enable-auto-tool-choice`, llama-server without a template that carries tools)
//! returns every call as text: every round of both arms is `leak` (or `no_tool`), and no
//! flag can ever be implicated. The probe names that before a session is spent.
//!
//! Pure: the requests are sent by the caller ([`crate::driver`]); this reads the
//! classes of their replies. Rules, per reply: a parsed call (`ok`, `wrong_args`,
//! `bad_args`: the parser produced `tool_calls`) proves it; the engine's own rejection
//! (`rejected`) proves a parser ran; markup in the text (`leak`) proves calls come back
//! as text. A reply with no call and no markup (`no_tool`, `truncated`) says nothing
//! about the parser, so the next session is asked, up to [`TRIES`]; after that many
//! the model does not call tools when asked. An `error` or `timeout` reply is not an
//! answer about the parser either: when no reply gave one, the probe could not judge.

use serde::{Deserialize, Serialize};

use crate::session::RoundClass;

/// Sessions asked at most before a probe with no decisive reply ends.
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
    /// The reply came back as parsed `tool_calls`.
    Parsed,
    /// The engine refused the model's call as unparseable: a parser ran.
    Rejected,
    /// The call came back as text (markup in `content`): no parser, or the wrong one.
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
                "the tool call came back as text in the reply's content, not as tool_calls: the engine parses no tool calls"
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

/// A reply's finding, where it decides one; `None` for a reply that says nothing about
/// the parser (ask the next session).
fn decisive(class: RoundClass) -> Option<ProbeFinding> {
    match class {
        RoundClass::Ok | RoundClass::WrongArgs | RoundClass::BadArgs => Some(ProbeFinding::Parsed),
        RoundClass::Rejected => Some(ProbeFinding::Rejected),
        RoundClass::Leak => Some(ProbeFinding::AsText),
        RoundClass::NoTool
        | RoundClass::Truncated
        | RoundClass::Error
        | RoundClass::Timeout
        | RoundClass::Crashed => None,
    }
}

/// Whether another session must be asked after `replies`.
pub fn wants_another(replies: &[ProbeReply]) -> bool {
    replies.len() < TRIES as usize && !replies.iter().any(|r| decisive(r.class).is_some())
}

/// The finding of `replies` (in the order asked): the first decisive reply's; else
/// `NoCall` when some reply came back without a call, `Unanswered` when none came back.
pub fn judge(replies: &[ProbeReply]) -> ProbeFinding {
    if let Some(found) = replies.iter().find_map(|r| decisive(r.class)) {
        return found;
    }
    let answered = replies
        .iter()
        .any(|r| matches!(r.class, RoundClass::NoTool | RoundClass::Truncated));
    if answered {
        ProbeFinding::NoCall
    } else {
        ProbeFinding::Unanswered
    }
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

    #[test]
    fn a_parsed_call_or_a_rejection_proves_a_parser_and_ends_the_probe() {
        for class in [RoundClass::Ok, RoundClass::WrongArgs, RoundClass::BadArgs] {
            let replies = [reply(class)];
            assert_eq!(judge(&replies), ProbeFinding::Parsed);
            assert!(!wants_another(&replies));
        }
        assert_eq!(
            judge(&[reply(RoundClass::Rejected)]),
            ProbeFinding::Rejected
        );
        assert!(ProbeFinding::Rejected.proves_parsing());
        assert!(!ProbeFinding::Parsed.refuses_a_run());
    }

    #[test]
    fn a_call_in_the_text_refuses_at_once() {
        let replies = [reply(RoundClass::Leak)];
        assert!(!wants_another(&replies));
        assert_eq!(judge(&replies), ProbeFinding::AsText);
        assert!(ProbeFinding::AsText.refuses_a_run());
    }

    #[test]
    fn no_call_asks_again_up_to_the_tries_then_says_the_model_does_not_call() {
        let mut replies = vec![reply(RoundClass::NoTool)];
        assert!(wants_another(&replies));
        replies.push(reply(RoundClass::Ok));
        assert_eq!(judge(&replies), ProbeFinding::Parsed);
        let silent = vec![
            reply(RoundClass::NoTool),
            reply(RoundClass::Timeout),
            reply(RoundClass::Truncated),
        ];
        assert!(!wants_another(&silent));
        assert_eq!(judge(&silent), ProbeFinding::NoCall);
        assert!(ProbeFinding::NoCall.refuses_a_run());
    }

    #[test]
    fn errors_alone_judge_nothing_and_refuse_nothing() {
        let errors = vec![reply(RoundClass::Error); TRIES as usize];
        assert!(!wants_another(&errors));
        assert_eq!(judge(&errors), ProbeFinding::Unanswered);
        assert!(!ProbeFinding::Unanswered.refuses_a_run());
        assert!(!ProbeFinding::Unanswered.proves_parsing());
        assert_eq!(judge(&[]), ProbeFinding::Unanswered);
    }
}
