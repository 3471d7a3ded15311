//! The solo oracle's reference pass on the testbed (docs/oracle.md): a block's sessions
//! run one at a time on the engines just started, kept under the results directory and
//! reused while the configuration, workload and seed stay the same; any command that
//! drives blocks can judge them against it ([`Testbed::judge_against`]).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::{BlockName, Testbed};
use crate::config::Workload;
use crate::core::classify::Classifier;
use crate::core::session::SessionResult;
use crate::core::solo::{ReferencePass, SoloOracle};
use crate::results::ResultsDir;

impl Testbed<'_> {
    /// The block's reference for the solo oracle: its sessions run one at a time on the
    /// engines just started (the same configuration as the block), written under
    /// `reference/<arm>/` in the results directory; an earlier block of the same arm (a later
    /// repeat) reuses what is there, since the arm's configuration, the workload and its
    /// seed are the same. A session whose reference failed (error, timeout) has none: it is
    /// judged by the classifier alone.
    pub(crate) async fn reference(
        &mut self,
        results: &ResultsDir,
        classifier: &Arc<Classifier>,
        block: BlockName<'_>,
        workload: &Workload,
        solo: SoloOracle,
    ) -> anyhow::Result<(Arc<crate::driver::Oracle>, ReferencePass)> {
        let dir = ResultsDir::create(&results.root().join("reference").join(block.label))?;
        let threshold = solo.threshold_for(self.target().engine.batch_invariant());
        let mut pass = ReferencePass {
            threshold: threshold.is_finite().then_some(threshold),
            ..ReferencePass::default()
        };
        // What the kept sessions were run with: reused only for the same workload and
        // seed (the arm's configuration is the directory's, one per arm of a run).
        let key_path = dir.root().join("workload.json");
        let key = serde_json::to_string(&workload.params_json())?;
        let same_key = std::fs::read_to_string(&key_path).is_ok_and(|kept| kept == key);
        let mut sessions = dir.read_sessions().unwrap_or_default();
        if same_key && sessions.len() == workload.sessions as usize {
            pass.reused = 1;
            self.progress().note(&format!(
                "arm {}: the solo oracle's reference reused ({} sessions)",
                block.label,
                sessions.len()
            ));
        } else {
            self.progress().note(&format!(
                "arm {}: the solo oracle's reference, {} sessions one at a time",
                block.label, workload.sessions
            ));
            let mut alone = workload.clone();
            alone.concurrency = Some(1);
            let started = Instant::now();
            let label = format!("{}-alone", block.label);
            let name = BlockName {
                label: &label,
                ..block
            };
            // What an interrupted pass left would be appended to: start the file anew.
            sessions.clear();
            let kept = dir.root().join("sessions.jsonl");
            if kept.exists() {
                std::fs::remove_file(&kept)
                    .with_context(|| format!("removing {}", kept.display()))?;
            }
            self.drive_observed(name, &alone, classifier, &dir, &mut |s| {
                sessions.push(s.clone())
            })
            .await?;
            crate::results::write_atomic(&key_path, key.as_bytes())?;
            pass.sessions = sessions.len() as u64;
            pass.wall_s = started.elapsed().as_secs_f64();
        }
        let references = sessions
            .into_iter()
            .filter(|s: &SessionResult| !s.class.is_failure())
            .map(|s| (s.index, s))
            .collect();
        let oracle = crate::driver::Oracle {
            references,
            threshold,
        };
        Ok((Arc::new(oracle), pass))
    }

    /// [`Testbed::drive`], with `oracle` (when given) judging every session also against
    /// the same session alone: the block's reference pass first, then the sessions under
    /// load. Returns the block's statistics and, with the oracle, its reference pass.
    pub(crate) async fn drive_judged(
        &mut self,
        block: BlockName<'_>,
        workload: &Workload,
        classifier: &Arc<Classifier>,
        results: &ResultsDir,
        oracle: Option<SoloOracle>,
    ) -> anyhow::Result<(crate::core::arm_stats::ArmStats, Option<ReferencePass>)> {
        let Some(solo) = oracle else {
            let stats = self.drive(block, workload, classifier, results).await?;
            return Ok((stats, None));
        };
        let (references, mut pass) = self
            .reference(results, classifier, block, workload, solo)
            .await?;
        self.judge_against(Some(references));
        let mut count = |session: &SessionResult| pass.count(session);
        let driven = self
            .drive_observed(block, workload, classifier, results, &mut count)
            .await;
        self.judge_against(None);
        let (stats, _) = driven?;
        Ok((stats, Some(pass)))
    }
}
