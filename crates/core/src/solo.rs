//! The solo oracle applied to sessions (issue 32, docs/oracle.md): `--oracle solo`'s
//! parameters, a session's replies as [`crate::oracle::compare`] reads them, the class a
//! parting gives a session the classifier found clean, and a block's reference-pass
//! record. Pure: the reference pass itself is the testbed's.

use serde::{Deserialize, Serialize};

use crate::oracle::{compare, Comparison, OracleMode, ReplyTokens};
use crate::session::{ChatMessage, SessionClass, SessionResult};

/// The margin in nats at or below which a parting is a near-tie when the user names
/// none. Measured on llama-server on the CPU with no known bug (docs/oracle.md, 300
/// sessions at 4 in flight): 59 sessions' tokens parted from themselves alone, every one
/// at a margin of 0.155 nats or less (or a negative, grammar-forced one), so 1.0 leaves
/// six times that headroom and excused every measured parting.
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
    /// Sessions run alone for this block (0 where a kept reference was reused).
    pub sessions: u64,
    /// Seconds the reference took: its sessions alone, or the check of a kept one.
    pub wall_s: f64,
    /// Blocks that reused a kept reference (the same key, and the check agreed).
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
    /// The reference cache's entry this block's reference is kept in (its folder under
    /// `reference-cache/`); absent where a reference session failed (such a pass is not
    /// kept for others) and in records from before the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Sessions run alone again to check a kept reference before reusing it.
    #[serde(default)]
    pub checked: u64,
    /// Kept references the check found stale (run again in full).
    #[serde(default)]
    pub stale: u64,
    /// Of `same`: sessions whose token streams parted though every reply stayed the same
    /// (the engine's numerics at a near-tie, e.g. JSON spacing around the same call).
    #[serde(default)]
    pub same_reply_tokens_parted: u64,
    /// Whether the engines said they are batch-invariant (what set `threshold`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub determinism: Option<crate::determinism::Determinism>,
}

impl ReferencePass {
    /// Count one session under load once it was judged.
    pub fn count(&mut self, session: &SessionResult) {
        let Some(comparison) = &session.oracle else {
            return;
        };
        let mode = match comparison {
            Comparison::Same {
                mode,
                token_parting,
                ..
            } => {
                self.same += 1;
                if token_parting.is_some() {
                    self.same_reply_tokens_parted += 1;
                }
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
                cache: p.cache.clone(),
                determinism: p.determinism.clone(),
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
            t.checked += p.checked;
            t.stale += p.stale;
            t.same_reply_tokens_parted += p.same_reply_tokens_parted;
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

/// Whether a kept reference still stands: the same session run alone again now gave
/// the same replies, token for token (no near-tie excused, not even a token parting that
/// left the reply the same: alone twice on one build and configuration is the same
/// computation). A failed session on either side proves
/// nothing: the reference is not trusted.
pub fn still_stands(kept: &SessionResult, again: &SessionResult) -> bool {
    !kept.class.is_failure()
        && !again.class.is_failure()
        && matches!(
            compare(&replies(kept), &replies(again), f64::NEG_INFINITY),
            Comparison::Same {
                token_parting: None,
                ..
            }
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::tests::tok;

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
            timing: None,
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

    #[test]
    fn a_kept_reference_stands_only_when_alone_again_is_the_same_to_the_token() {
        let kept = session(SessionClass::Done, &["call(7)", "DONE"], 0.1);
        assert!(still_stands(&kept, &kept.clone()));
        // A near-tie flipped is excused under load, never between two runs alone.
        let again = session(SessionClass::Done, &["call(1)", "DONE"], 0.1);
        assert!(!still_stands(&kept, &again));
        // A failed run proves nothing either way.
        let failed = session(SessionClass::Error, &["call(7)", "DONE"], 0.1);
        assert!(!still_stands(&kept, &failed));
        assert!(!still_stands(&failed, &kept));
    }
}
