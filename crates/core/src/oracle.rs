//! The solo oracle's comparison (issue 32): a session's replies under load against the
//! same session's replies run alone at temperature 0, round by round.
//!
//! At temperature 0 a request's output should not depend on what else is in the batch.
//! The first round whose reply differs is where the two runs part: it gives the position,
//! the two tokens (or texts) and the reference's margin there (its top-1 minus top-2
//! log-probability). A wide margin means the alone run's choice was not a near-tie, so a
//! different token under load is evidence of a bug (`Diverged`); a near-tie on an engine
//! that is not batch-invariant is expected numerical drift (`Drifted`), recorded but not
//! corruption. Rounds after the first difference are never compared: the conversations
//! have parted, and every later difference would follow from the first.
//!
//! Without log-probabilities (an engine that serves none) the comparison is exact-match
//! only: any difference is `Diverged` and `Drifted` is never claimed, and the mode says
//! so. Pure: no I/O.

use serde::{Deserialize, Serialize};

use crate::session::{ChatMessage, SessionClass, SessionResult};

/// One generated token as the engine reported it (`choices[0].logprobs.content[i]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenChoice {
    pub token: String,
    pub logprob: f64,
    /// The engine's `top_logprobs` at this position (the chosen token among them or not),
    /// in any order.
    #[serde(default)]
    pub top: Vec<(String, f64)>,
}

impl TokenChoice {
    /// The chosen token's log-probability minus the best other candidate's: how clearly
    /// it won. `None` when the engine named no other candidate (asked for too few).
    pub fn margin(&self) -> Option<f64> {
        self.top
            .iter()
            .filter(|(token, _)| *token != self.token)
            .map(|(_, lp)| *lp)
            .max_by(f64::total_cmp)
            .map(|runner_up| self.logprob - runner_up)
    }
}

/// One round's reply as compared: its text (content and tool calls rendered in one
/// canonical form by the caller) and, where the engine served them, its tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyTokens {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<TokenChoice>>,
}

/// How a session was compared with its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OracleMode {
    /// Tokens and margins from the reference's log-probabilities.
    Logprobs,
    /// Texts only (no log-probabilities on one side): any difference diverges.
    ExactMatch,
}

/// Where a session under load first parted from its reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parting {
    /// 1-based round.
    pub round: u32,
    /// Token index in the round's reply (log-probability mode) or character index.
    pub position: usize,
    /// What the reference had there (`None`: the reference reply ended there).
    pub reference: Option<String>,
    /// What the loaded reply had there (`None`: the loaded reply ended there).
    pub loaded: Option<String>,
    /// The reference's top-1 minus top-2 log-probability at the position; `None` where
    /// not known (exact-match mode, the reference ended, or no runner-up was served).
    pub margin: Option<f64>,
}

/// The comparison of one session under load with its reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Comparison {
    /// Every round compared was identical.
    Same { rounds: u32, mode: OracleMode },
    /// Parted where the reference's choice was clear (margin above the threshold, or
    /// unknown, or exact-match mode): corruption.
    Diverged { parting: Parting, mode: OracleMode },
    /// Parted at a near-tie (margin at or below the threshold): drift, not corruption.
    Drifted { parting: Parting, mode: OracleMode },
}

/// Compare `loaded` with `reference` round by round up to the shorter of the two (a
/// session that ended early is judged by its classifier, not here). `threshold` is the
/// margin in nats at or below which a parting is a near-tie.
pub fn compare(reference: &[ReplyTokens], loaded: &[ReplyTokens], threshold: f64) -> Comparison {
    let mode = if reference
        .iter()
        .zip(loaded)
        .all(|(r, l)| r.tokens.is_some() && l.tokens.is_some())
    {
        OracleMode::Logprobs
    } else {
        OracleMode::ExactMatch
    };
    let mut rounds = 0;
    for (i, (r, l)) in reference.iter().zip(loaded).enumerate() {
        let round = i as u32 + 1;
        if r.text == l.text {
            rounds = round;
            continue;
        }
        let parting = match (mode, &r.tokens, &l.tokens) {
            (OracleMode::Logprobs, Some(rt), Some(lt)) => token_parting(round, rt, lt),
            _ => None,
        }
        .unwrap_or_else(|| text_parting(round, &r.text, &l.text));
        let near_tie =
            mode == OracleMode::Logprobs && parting.margin.is_some_and(|m| m <= threshold);
        return if near_tie {
            Comparison::Drifted { parting, mode }
        } else {
            Comparison::Diverged { parting, mode }
        };
    }
    Comparison::Same { rounds, mode }
}

/// The first token that differs, with the reference's margin there. `None` when the
/// token streams agree though the texts do not (the caller's rendering differs, e.g. a
/// tool call's arguments re-serialised): the text comparison decides then.
fn token_parting(round: u32, reference: &[TokenChoice], loaded: &[TokenChoice]) -> Option<Parting> {
    let at = (0..reference.len().max(loaded.len()))
        .find(|&i| reference.get(i).map(|t| &t.token) != loaded.get(i).map(|t| &t.token))?;
    let chosen = reference.get(at);
    Some(Parting {
        round,
        position: at,
        reference: chosen.map(|t| t.token.clone()),
        loaded: loaded.get(at).map(|t| t.token.clone()),
        margin: chosen.and_then(TokenChoice::margin),
    })
}

/// The margin in nats at or below which a parting is a near-tie when the user names
/// none. Provisional: chosen on the embedded engine, whose reads win by several nats
/// and which is batch-invariant (any parting there is a bug, whatever its margin); the
/// real-engine measurement that should set it (margins at first partings on llama-server
/// with no known bug) is not done yet (docs/oracle.md).
pub const DEFAULT_THRESHOLD: f64 = 1.0;

/// `--oracle solo`: every arm block's sessions are also run one at a time on the same
/// configuration, and each session under load is compared with its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoloOracle {
    /// The margin in nats at or below which a parting is a near-tie (`drifted`).
    pub threshold: f64,
}

impl SoloOracle {
    /// The threshold a comparison on `batch_invariant` engines uses: none at all there
    /// (every parting is a bug, however close alone's choice was), this oracle's on
    /// engines whose numerics follow the batch.
    pub fn threshold_for(self, batch_invariant: bool) -> f64 {
        match batch_invariant {
            true => f64::NEG_INFINITY,
            false => self.threshold,
        }
    }
}

/// The request fields the oracle asks for when the workload does not set them:
/// log-probabilities with this many alternatives a token.
pub const TOP_LOGPROBS: u8 = 5;

/// An arm block's reference pass and what its comparisons found (run.json's `oracle`
/// on each block, summed over blocks on a pooled arm).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReferencePass {
    /// The near-tie threshold used; `None` where none applied (a batch-invariant
    /// engine, where every parting diverges).
    pub threshold: Option<f64>,
    /// Sessions run alone for this block (0 where an earlier block's were reused).
    pub sessions: u64,
    /// Seconds the reference sessions took.
    pub wall_s: f64,
    /// Blocks that reused an earlier block's reference (same arm, same configuration).
    pub reused: u64,
    /// Sessions under load compared with a reference, by outcome.
    pub same: u64,
    pub diverged: u64,
    pub drifted: u64,
    /// Of `diverged`/`drifted`/`same`: compared on log-probabilities (the rest by text).
    pub by_logprobs: u64,
    /// Sessions the classifier called corrupted whose replies were the same alone: the
    /// model's own slip, not the load's.
    pub corrupted_same_alone: u64,
}

impl ReferencePass {
    /// Count one session under load once it was judged.
    pub fn count(&mut self, session: &SessionResult) {
        let Some(comparison) = &session.oracle else {
            return;
        };
        let mode = match comparison {
            Comparison::Same { mode, .. } => {
                self.same += 1;
                if session.class.is_corrupted() {
                    self.corrupted_same_alone += 1;
                }
                mode
            }
            Comparison::Diverged { mode, .. } => {
                self.diverged += 1;
                mode
            }
            Comparison::Drifted { mode, .. } => {
                self.drifted += 1;
                mode
            }
        };
        if *mode == OracleMode::Logprobs {
            self.by_logprobs += 1;
        }
    }

    /// Several blocks' passes as one (a pooled arm).
    pub fn pooled<'a>(passes: impl IntoIterator<Item = &'a ReferencePass>) -> Option<Self> {
        let mut total: Option<ReferencePass> = None;
        for p in passes {
            let t = total.get_or_insert_with(|| ReferencePass {
                threshold: p.threshold,
                ..ReferencePass::default()
            });
            t.sessions += p.sessions;
            t.wall_s += p.wall_s;
            t.reused += p.reused;
            t.same += p.same;
            t.diverged += p.diverged;
            t.drifted += p.drifted;
            t.by_logprobs += p.by_logprobs;
            t.corrupted_same_alone += p.corrupted_same_alone;
        }
        total
    }
}

/// A session's replies as the comparison reads them: each assistant message after its
/// task (the last user message: the assistant turns before it are the prompt's filler
/// and examples, the same in both runs), as text, with its round's tokens where the
/// engine served them (the rounds that got a reply, in order).
pub fn replies(session: &SessionResult) -> Vec<ReplyTokens> {
    let tokens = session
        .rounds
        .iter()
        .filter(|r| r.class.carries_reply())
        .map(|r| r.logprobs.clone());
    let task = session
        .transcript
        .iter()
        .rposition(|m| m.role == "user")
        .map_or(0, |i| i + 1);
    session.transcript[task..]
        .iter()
        .filter(|m| m.role == "assistant")
        .zip(tokens)
        .map(|(message, tokens)| ReplyTokens {
            text: reply_text(message),
            tokens,
        })
        .collect()
}

/// One canonical text of an assistant message: its content, then each tool call as
/// `name(arguments)` with the arguments as the engine sent them.
fn reply_text(message: &ChatMessage) -> String {
    let mut text = message.content.clone().unwrap_or_default();
    for call in message.tool_calls.iter().flatten() {
        text.push_str(&format!(
            "\n{}({})",
            call.function.name, call.function.arguments
        ));
    }
    text
}

/// Judge `loaded` against the same session run alone (`reference`): record the
/// comparison on it and, where the classifier found it clean (done, maxrounds), make a
/// parting its class: `diverged` (corruption) or `drifted` (a near-tie, not
/// corruption). A session the classifier already called corrupted, failed, truncated
/// or crashed keeps its class (its own evidence is the stronger), with the comparison
/// beside it: "the same alone" there says the slip is the model's, not the load's.
pub fn judge(loaded: &mut SessionResult, reference: &SessionResult, threshold: f64) {
    let comparison = compare(&replies(reference), &replies(loaded), threshold);
    apply(loaded, comparison);
}

/// Put `comparison` on `loaded` and decide its class as [`judge`] does: what
/// `bisect reclassify` calls after the classifier judged a session again, so a new rule
/// never erases what the oracle saw.
pub fn apply(loaded: &mut SessionResult, comparison: Comparison) {
    let clean = matches!(loaded.class, SessionClass::Done | SessionClass::Maxrounds);
    if clean {
        let (class, parting) = match &comparison {
            Comparison::Diverged { parting, .. } => (SessionClass::Diverged, parting),
            Comparison::Drifted { parting, .. } => (SessionClass::Drifted, parting),
            Comparison::Same { .. } => {
                loaded.oracle = Some(comparison);
                return;
            }
        };
        loaded.class = class;
        loaded.first_bad_round = Some(parting.round);
        loaded.evidence = parting.describe();
    }
    loaded.oracle = Some(comparison);
}

impl Parting {
    /// One line of evidence: where, what each run had, and how clearly alone won.
    pub fn describe(&self) -> String {
        let show = |t: &Option<String>| match t {
            Some(t) => format!("{t:?}"),
            None => "(end of reply)".to_string(),
        };
        let margin = match self.margin {
            Some(m) => format!(", alone's margin {m:.2} nats"),
            None => String::new(),
        };
        format!(
            "round {} at {}: alone {}, under load {}{margin}",
            self.round,
            self.position,
            show(&self.reference),
            show(&self.loaded)
        )
    }
}

/// The first character that differs (exact-match mode), with no margin.
fn text_parting(round: u32, reference: &str, loaded: &str) -> Parting {
    let mut r = reference.chars();
    let mut l = loaded.chars();
    let mut position = 0;
    loop {
        match (r.next(), l.next()) {
            (Some(a), Some(b)) if a == b => position += 1,
            (a, b) => {
                return Parting {
                    round,
                    position,
                    reference: a.map(|c| c.to_string()),
                    loaded: b.map(|c| c.to_string()),
                    margin: None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(token: &str, logprob: f64, runner_up: f64) -> TokenChoice {
        TokenChoice {
            token: token.into(),
            logprob,
            top: vec![(token.into(), logprob), ("<other>".into(), runner_up)],
        }
    }

    fn reply(tokens: &[TokenChoice]) -> ReplyTokens {
        ReplyTokens {
            text: tokens.iter().map(|t| t.token.as_str()).collect(),
            tokens: Some(tokens.to_vec()),
        }
    }

    fn text(s: &str) -> ReplyTokens {
        ReplyTokens {
            text: s.into(),
            tokens: None,
        }
    }

    #[test]
    fn the_margin_is_the_chosen_tokens_lead_over_the_best_other() {
        let t = TokenChoice {
            token: "a".into(),
            logprob: -0.1,
            top: vec![("b".into(), -3.0), ("a".into(), -0.1), ("c".into(), -2.5)],
        };
        assert!((t.margin().unwrap() - 2.4).abs() < 1e-12);
        let alone = TokenChoice {
            token: "a".into(),
            logprob: -0.1,
            top: vec![("a".into(), -0.1)],
        };
        assert_eq!(alone.margin(), None);
    }

    #[test]
    fn identical_replies_are_the_same_in_every_round() {
        let r = vec![
            reply(&[tok("x", -0.1, -5.0)]),
            reply(&[tok("y", -0.2, -4.0)]),
        ];
        assert_eq!(
            compare(&r, &r, 0.5),
            Comparison::Same {
                rounds: 2,
                mode: OracleMode::Logprobs
            }
        );
    }

    #[test]
    fn a_clear_choice_changed_under_load_diverges_at_its_token_with_its_margin() {
        let reference = vec![
            reply(&[tok("ok", -0.1, -6.0)]),
            reply(&[
                tok("path", -0.05, -7.0),
                tok("=", -0.01, -9.0),
                tok("a.py", -0.2, -5.2),
            ]),
        ];
        let loaded = vec![
            reply(&[tok("ok", -0.1, -6.0)]),
            reply(&[
                tok("path", -0.05, -7.0),
                tok("=", -0.01, -9.0),
                tok("b.py", -1.0, -1.1),
            ]),
        ];
        let Comparison::Diverged { parting, mode } = compare(&reference, &loaded, 0.5) else {
            panic!("not diverged")
        };
        assert_eq!(mode, OracleMode::Logprobs);
        assert_eq!((parting.round, parting.position), (2, 2));
        assert_eq!(parting.reference.as_deref(), Some("a.py"));
        assert_eq!(parting.loaded.as_deref(), Some("b.py"));
        assert!((parting.margin.unwrap() - 5.0).abs() < 1e-12);
    }

    #[test]
    fn a_near_tie_that_flipped_drifted_and_rounds_after_the_parting_are_not_compared() {
        let reference = vec![
            reply(&[tok("a", -0.69, -0.70)]),
            reply(&[tok("same", -0.1, -9.0)]),
        ];
        let loaded = vec![
            reply(&[tok("b", -0.69, -0.70)]),
            reply(&[tok("other", -0.1, -9.0)]),
        ];
        let Comparison::Drifted { parting, .. } = compare(&reference, &loaded, 0.5) else {
            panic!("not drifted")
        };
        assert_eq!((parting.round, parting.position), (1, 0));
        // The same parting above the threshold is a divergence.
        assert!(matches!(
            compare(&reference, &loaded, 0.001),
            Comparison::Diverged { .. }
        ));
    }

    #[test]
    fn a_reply_that_ends_early_or_runs_on_parts_where_one_stream_ends() {
        let reference = vec![reply(&[tok("a", -0.1, -4.0), tok("b", -0.1, -4.0)])];
        let short = vec![reply(&[tok("a", -0.1, -4.0)])];
        let Comparison::Diverged { parting, .. } = compare(&reference, &short, 0.5) else {
            panic!()
        };
        assert_eq!((parting.position, parting.loaded.as_deref()), (1, None));
        assert!((parting.margin.unwrap() - 3.9).abs() < 1e-12);
        // The reference ended where the loaded reply went on: its end-of-sequence choice
        // has no margin here, so no near-tie can be claimed.
        let Comparison::Diverged { parting, .. } = compare(&short, &reference, 0.5) else {
            panic!()
        };
        assert_eq!((parting.reference.as_deref(), parting.margin), (None, None));
    }

    #[test]
    fn without_logprobs_any_difference_diverges_and_drift_is_never_claimed() {
        let reference = vec![text("call read_file(path=a.py)")];
        let loaded = vec![text("call read_file(path=b.py)")];
        let Comparison::Diverged { parting, mode } = compare(&reference, &loaded, f64::INFINITY)
        else {
            panic!()
        };
        assert_eq!(mode, OracleMode::ExactMatch);
        assert_eq!(parting.position, "call read_file(path=".len());
        assert_eq!(
            (parting.reference.as_deref(), parting.loaded.as_deref()),
            (Some("a"), Some("b"))
        );
        assert_eq!(parting.margin, None);
        // One side without logprobs makes the whole session exact-match.
        let mixed = vec![reply(&[tok("x", -0.7, -0.71)])];
        assert!(matches!(
            compare(&mixed, &[text("y")], 1.0),
            Comparison::Diverged {
                mode: OracleMode::ExactMatch,
                ..
            }
        ));
    }

    #[test]
    fn equal_tokens_with_different_renderings_fall_back_to_the_text() {
        let mut a = reply(&[tok("{}", -0.1, -5.0)]);
        let mut b = a.clone();
        a.text = "{\"x\":1}".into();
        b.text = "{\"x\": 1}".into();
        let Comparison::Diverged { parting, .. } = compare(&[a], &[b], 0.5) else {
            panic!()
        };
        assert_eq!((parting.position, parting.margin), (5, None));
    }

    #[test]
    fn a_session_shorter_than_its_reference_is_compared_over_the_rounds_it_has() {
        let r = vec![text("a"), text("b"), text("c")];
        assert_eq!(
            compare(&r, &r[..1], 0.5),
            Comparison::Same {
                rounds: 1,
                mode: OracleMode::ExactMatch
            }
        );
    }

    fn session(class: SessionClass, replies: &[&str], margin: f64) -> SessionResult {
        // The prompt's filler turns come before the task: never compared.
        let mut transcript = vec![
            ChatMessage::new("user", "earlier"),
            ChatMessage::new("assistant", "Noted."),
            ChatMessage::new("user", "task"),
        ];
        let mut rounds = Vec::new();
        for (i, r) in replies.iter().enumerate() {
            transcript.push(ChatMessage::new("assistant", *r));
            transcript.push(ChatMessage::new("tool", "ok"));
            let tokens = r
                .chars()
                .map(|c| tok(&c.to_string(), -0.01, -0.01 - margin));
            rounds.push(crate::session::RoundRecord {
                round: i as u32 + 1,
                class: crate::session::RoundClass::Ok,
                latency_ms: 1,
                completion_tokens: r.len() as u64,
                evidence: String::new(),
                finish_reason: None,
                http: None,
                logprobs: Some(tokens.collect()),
            });
        }
        SessionResult {
            label: "on".into(),
            repeat: 0,
            index: 3,
            class,
            rounds_used: replies.len() as u32,
            first_bad_round: None,
            evidence: String::new(),
            transcript,
            rounds,
            latency_ms: Vec::new(),
            completion_tokens: 0,
            error: None,
            oracle: None,
        }
    }

    #[test]
    fn a_clean_session_that_parts_from_its_reference_is_diverged_with_the_evidence() {
        let reference = session(SessionClass::Done, &["call(7)", "DONE"], 6.0);
        let mut loaded = session(SessionClass::Done, &["call(1)", "DONE"], 6.0);
        judge(&mut loaded, &reference, DEFAULT_THRESHOLD);
        assert_eq!(loaded.class, SessionClass::Diverged);
        assert_eq!(loaded.first_bad_round, Some(1));
        assert_eq!(
            loaded.evidence,
            "round 1 at 5: alone \"7\", under load \"1\", alone's margin 6.00 nats"
        );
        assert!(matches!(loaded.oracle, Some(Comparison::Diverged { .. })));
    }

    #[test]
    fn a_near_tie_drifts_and_an_identical_session_keeps_its_class() {
        let reference = session(SessionClass::Maxrounds, &["call(7)"], 0.2);
        let mut drifted = session(SessionClass::Maxrounds, &["call(1)"], 0.2);
        judge(&mut drifted, &reference, DEFAULT_THRESHOLD);
        assert_eq!(drifted.class, SessionClass::Drifted);
        assert!(!drifted.class.is_corrupted() && drifted.class.is_judged());
        let mut same = reference.clone();
        judge(&mut same, &reference, DEFAULT_THRESHOLD);
        assert_eq!(same.class, SessionClass::Maxrounds);
        assert_eq!(same.first_bad_round, None);
        assert!(matches!(
            same.oracle,
            Some(Comparison::Same { rounds: 1, .. })
        ));
    }

    #[test]
    fn the_classifiers_class_stands_and_the_same_alone_is_recorded_beside_it() {
        // The model's own slip: the same no_tool reply alone and under load.
        let reference = session(SessionClass::NoTool, &["I will not"], 6.0);
        let mut loaded = reference.clone();
        loaded.evidence = "no call".into();
        judge(&mut loaded, &reference, DEFAULT_THRESHOLD);
        assert_eq!(loaded.class, SessionClass::NoTool);
        assert_eq!(loaded.evidence, "no call");
        assert!(matches!(loaded.oracle, Some(Comparison::Same { .. })));
        // A session corrupted by the classifier and parted keeps the classifier's class.
        let mut leak = session(SessionClass::Leak, &["<dsml"], 6.0);
        judge(&mut leak, &reference, DEFAULT_THRESHOLD);
        assert_eq!(leak.class, SessionClass::Leak);
        assert!(matches!(leak.oracle, Some(Comparison::Diverged { .. })));
    }
}
