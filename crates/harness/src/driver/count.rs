//! The engine's own count of a session's opening request (`usage.prompt_tokens`), which
//! pressure's sizing reads (core::pressure::Tokens::counted): session 0's first request
//! sent alone, as a session would send it, the reply cut to one token since only the
//! prompt's count is read.

use std::time::Instant;

use super::body::Transcript;
use super::client::{ChatOutcome, Connection, InFlight};
use super::drive::DrivePlan;
use crate::core::task::initial_conversation;

/// The prompt tokens the engine counted for session 0's opening request of
/// `plan.workload`, or why there is no count (the engine failed, timed out, or serves no
/// `usage.prompt_tokens`).
pub(crate) async fn prompt_tokens(plan: &DrivePlan) -> Result<u64, String> {
    let client = plan.client(1).map_err(|e| format!("{e:#}"))?;
    let (_, messages) = initial_conversation(&plan.workload, 0);
    let started = Instant::now();
    let outcome = client
        .complete(
            &mut Connection::new(),
            &Transcript::new(messages),
            &InFlight::new(),
            None,
        )
        .await;
    match outcome {
        ChatOutcome::Reply(reply) => reply
            .prompt_tokens
            .ok_or_else(|| "the engine's reply carries no usage.prompt_tokens".to_string()),
        ChatOutcome::Error(text) => Err(format!("the request failed: {text}")),
        ChatOutcome::Status { status, body, .. } => {
            Err(format!("the engine answered {status}: {body}"))
        }
        ChatOutcome::Timeout => Err(format!(
            "no reply within {:.0} s",
            started.elapsed().as_secs_f64()
        )),
    }
}
