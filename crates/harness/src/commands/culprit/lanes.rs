//! A culprit search on replica sets (docs/culprit.md, "Replica sets"): every block the
//! search asks for is split over the sets ([`crate::core::culprit::split_sets`]), each
//! set running its share through the one block lifecycle on its own testbed (write and
//! read back, restart, identity and effective values, probe, death watch, drive at the
//! block's load, stop) at the same time as the others, and the shares are merged into
//! the block the search asked for ([`BlockOutcome::merge`]). The search itself is
//! unchanged: it sees one block, in which every set holds its even share.
//!
//! A set that fails stops the others; the failure reported is its own
//! ([`first_failure`]).

use tokio_util::sync::CancellationToken;

use super::runner::TestbedRunner;
use crate::commands::blocks::BlockRunner;
use crate::commands::replicas::first_failure;
use crate::core::culprit::{BlockOutcome, BlockRequest};

/// The runners of every set a block is split over, in the target's order (one: whole
/// blocks on the first set).
pub(crate) struct SplitRunner<'t, 'a> {
    pub(crate) sets: Vec<TestbedRunner<'t, 'a>>,
    /// Cancelled when a set fails, so the others stop at their next check.
    pub(crate) stop: CancellationToken,
    /// The user's Ctrl-C.
    pub(crate) cancel: CancellationToken,
}

impl BlockRunner<BlockRequest, BlockOutcome> for SplitRunner<'_, '_> {
    async fn run_block(&mut self, request: &BlockRequest) -> anyhow::Result<BlockOutcome> {
        if let [only] = self.sets.as_mut_slice() {
            return only.run_block(request).await;
        }
        let shares = request.shares(self.sets.len());
        let stop = &self.stop;
        let runs = self
            .sets
            .iter_mut()
            .zip(shares)
            .map(|(runner, share)| async move {
                let name = runner.bed.target().replica_name().to_string();
                runner.run_block(&share).await.map_err(|e| {
                    stop.cancel();
                    e.context(format!("replica set {name}"))
                })
            });
        let mut outcomes = Vec::new();
        let mut failures = Vec::new();
        for ran in futures::future::join_all(runs).await {
            match ran {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => failures.push(e),
            }
        }
        if !failures.is_empty() {
            return Err(first_failure(failures, &self.cancel));
        }
        Ok(BlockOutcome::merge(outcomes))
    }
}
