//! The tool-call probe's requests (docs/design.md 3.13; the judgement is
//! [`crate::core::toolprobe`]): the first round of session 0, 1, ... of the workload,
//! sent one at a time as the sessions would send it, every one of
//! [`crate::core::toolprobe::TRIES`] asked whatever the first replies were.

use std::sync::Arc;

use super::conversation::first_round;
use super::drive::{session_context, DrivePlan};
use super::InFlight;
use crate::core::classify::Classifier;
use crate::core::toolprobe::{wants_another, ProbeReply};

/// Session 0's first round alone, asked as `plan` says: the tokens the engine served
/// with their log-probabilities (`None`: none came back).
pub(crate) async fn first_round_tokens(
    plan: &DrivePlan,
    classifier: Arc<Classifier>,
) -> anyhow::Result<Option<Vec<crate::core::oracle::TokenChoice>>> {
    let ctx = session_context(plan, classifier, Arc::new(InFlight::new()))?;
    Ok(first_round(&ctx, 0).await.logprobs)
}

/// The probe's replies, in the order asked. `plan` names the API, model, key and
/// workload (its label and repeat name nothing: no session is recorded).
pub async fn ask(plan: &DrivePlan, classifier: Arc<Classifier>) -> anyhow::Result<Vec<ProbeReply>> {
    let ctx = session_context(plan, classifier, Arc::new(InFlight::new()))?;
    let mut replies = Vec::new();
    let mut index = 0;
    while wants_another(&replies) {
        let record = first_round(&ctx, index).await;
        replies.push(ProbeReply {
            class: record.class,
            evidence: record.evidence,
        });
        index += 1;
    }
    Ok(replies)
}
