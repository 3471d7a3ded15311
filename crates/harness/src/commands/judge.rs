//! The adapter from an arm's record to the core's one judgement of a block
//! ([`crate::core::judgement`]): the plain values `probe` and `commits` both judge.

use crate::core::confounds::load_shortfall;
use crate::core::evidence::Policy;
use crate::core::judgement::BlockFacts;
use crate::results::run_record::ArmRecord;

/// The arm's counts, its replaced engines, and its load's shortfall against the target
/// of `workload` (its `concurrency`, else `sessions`) by `policy`'s load rule.
pub(crate) fn block_facts(
    arm: &ArmRecord,
    workload: &serde_json::Value,
    policy: &Policy,
) -> BlockFacts {
    BlockFacts {
        counts: arm.stats.counts,
        engine_replaced: arm.stats.engine_replaced.clone(),
        deaths: arm.stats.deaths.iter().map(|d| d.describe()).collect(),
        load_shortfall: load_shortfall(&arm.observe(workload), policy),
    }
}
