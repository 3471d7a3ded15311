//! When the engine never ran the target concurrency (docs/design.md 3.7, "load"): the
//! shortfall `cleared` needs, run on the arm as a whole or on its busiest engine role.

use std::collections::BTreeMap;

use crate::workload::WorkloadParams;

use super::checked;
use crate::evidence::{ArmObservation, Policy};

/// The concurrency an arm was meant to run at: the workload's `concurrency`, else its
/// `sessions` (all at once); `None` when the workload says neither.
fn target_concurrency(arm: &ArmObservation) -> Option<u64> {
    WorkloadParams::read(arm.workload)
        .target_concurrency()
        .map(u64::from)
}

/// Why the achieved load does not support `cleared`, for every arm or block checked
/// ([`checked`]: a pooled arm's peak is its best block's) that falls short: the engine
/// side (the busiest role's peak running requests) below `min_load_fraction` of the
/// target, or no engine role reporting its load at all.
pub(crate) fn load_shortfalls(
    on: &ArmObservation,
    off: &ArmObservation,
    blocks: &[ArmObservation],
    policy: &Policy,
) -> Vec<String> {
    checked(on, off, blocks)
        .iter()
        .filter_map(|c| load_shortfall(c, policy))
        .collect()
}

/// Why one arm's (or block's) achieved load does not support `cleared`, if it does not.
pub fn load_shortfall(arm: &ArmObservation, policy: &Policy) -> Option<String> {
    let target = target_concurrency(arm)?;
    let why = engine_load_shortfall(&arm.stats.peak_running, target, policy.min_load_fraction)?;
    let mut text = format!("{} {why}", arm.subject());
    // Where the load went, so the user knows whether to look at the client, the
    // server's front door or the engine's queue.
    if let Some(gap) = &arm.stats.load_gap {
        text.push_str(&format!("; where the gap is: {}", gap.describe()));
    }
    if let Some(transport) = &arm.stats.transport {
        for problem in transport.problems() {
            text.push_str(&format!("; {problem}"));
        }
    }
    Some(text)
}

/// The load rule itself, worded to follow its subject ("arm on ...", "this night's
/// cell ..."): the busiest engine role's peak running requests (`peak_running` by role;
/// the client's is not the engine's) below `min_load_fraction` of `target` in flight,
/// or no engine role reporting its load at all.
pub fn engine_load_shortfall(
    peak_running: &BTreeMap<String, u64>,
    target: u64,
    min_load_fraction: f64,
) -> Option<String> {
    let engine_peak = peak_running
        .iter()
        .filter(|(role, _)| role.as_str() != "client")
        .map(|(role, peak)| (*peak, role))
        .max();
    let needed = (min_load_fraction * target as f64).ceil() as u64;
    match engine_peak {
        None => Some(format!(
            "has no engine-side load measurement (no role's metrics reported running \
             requests), so the target concurrency {target} is unconfirmed"
        )),
        Some((peak, role)) if peak < needed => Some(format!(
            "reached at most {peak} running requests ({role}), below {needed} \
             ({}% of the target concurrency {target})",
            (min_load_fraction * 100.0).round()
        )),
        Some(_) => None,
    }
}
