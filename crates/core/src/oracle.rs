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
//! so. Pure: no I/O, and no session: `core::solo` applies it to sessions.

use serde::{Deserialize, Serialize};

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
    /// Every round compared gave the same reply. `token_parting`: where the token streams
    /// first parted though the replies as the client reads them (content, parsed tool
    /// calls) stayed the same, e.g. compact against pretty-printed JSON around the same
    /// call: not corruption, but a difference the engine's numerics made, kept with the
    /// reference's margin there (what the threshold is measured from, docs/oracle.md).
    Same {
        rounds: u32,
        mode: OracleMode,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_parting: Option<Parting>,
    },
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
    let mut same_reply_parting = None;
    for (i, (r, l)) in reference.iter().zip(loaded).enumerate() {
        let round = i as u32 + 1;
        if r.text == l.text {
            rounds = round;
            if let (None, Some(rt), Some(lt)) = (&same_reply_parting, &r.tokens, &l.tokens) {
                same_reply_parting = token_parting(round, rt, lt);
            }
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
    Comparison::Same {
        rounds,
        mode,
        token_parting: same_reply_parting,
    }
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
pub(crate) mod tests {
    use super::*;

    /// A token chosen at `logprob` over one runner-up (shared with core::solo's tests).
    pub(crate) fn tok(token: &str, logprob: f64, runner_up: f64) -> TokenChoice {
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
                mode: OracleMode::Logprobs,
                token_parting: None,
            }
        );
    }

    /// Measured on llama-server (docs/oracle.md): under load the model wrote the same
    /// tool call pretty-printed where alone it wrote it compact, a 0.06-nat near-tie.
    /// The replies the client reads are the same, so the session is; the token parting
    /// is kept, with its margin.
    #[test]
    fn a_token_parting_that_leaves_the_reply_the_same_is_kept_beside_same() {
        let alone = ReplyTokens {
            text: "read_file({\"path\":\"a\"})".into(),
            tokens: Some(vec![tok("{\"", -0.70, -0.76), tok("path", -0.1, -5.0)]),
        };
        let loaded = ReplyTokens {
            text: alone.text.clone(),
            tokens: Some(vec![tok("{\n", -0.69, -0.75), tok("path", -0.1, -5.0)]),
        };
        match compare(&[alone], &[loaded], 0.0) {
            Comparison::Same {
                rounds: 1,
                token_parting: Some(parting),
                ..
            } => {
                assert_eq!((parting.round, parting.position), (1, 0));
                assert_eq!(parting.reference.as_deref(), Some("{\""));
                assert!((parting.margin.unwrap() - 0.06).abs() < 1e-9, "{parting:?}");
            }
            other => panic!("{other:?}"),
        }
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
                mode: OracleMode::ExactMatch,
                token_parting: None,
            }
        );
    }
}
