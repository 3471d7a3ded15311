//! One `bisect matrix` invocation as it runs: its plan, target, shard, directory and
//! testbed settings ([`MatrixJob`]), and where each cell's files go.

use std::path::{Path, PathBuf};

use super::cells::{Cell, Shard};
use super::plan::Plan;
use crate::arm::TestbedOptions;
use crate::config::TargetProfile;

/// Everything one `bisect matrix` invocation needs, validated.
#[derive(Debug, Clone)]
pub struct MatrixJob {
    pub id: String,
    pub command: String,
    pub plan: Plan,
    pub target: TargetProfile,
    pub shard: Option<Shard>,
    /// The matrix directory (`results/<id>/`).
    pub dir: PathBuf,
    pub api_key: Option<String>,
    pub testbed: TestbedOptions,
    /// `--oracle solo`: every cell's sessions also run alone and are compared.
    pub oracle: Option<crate::core::solo::SoloOracle>,
    /// The night's label and build (`--night`, `--build`), for `bisect history`.
    pub night: super::record::NightInfo,
}

impl crate::commands::EnginePlan for MatrixJob {
    fn engines(&self) -> crate::commands::Engines<'_> {
        crate::commands::Engines::new(&self.target, &self.dir, self.api_key.as_deref())
    }

    /// A whole matrix runs on every replica set ([`super::lanes`]); a shard on set a.
    fn uses_replicas(&self) -> bool {
        self.shard.is_none()
    }
}

impl MatrixJob {
    /// What this invocation is planned to cost (`matrix --dry-run`): a restart per
    /// restart group and a block per cell and repeat, exactly; a load cell's sweep at
    /// its fewest and its most blocks; a whole matrix on replica sets runs them at once
    /// (the groups dealt to the sets, [`super::lanes`]).
    pub fn planned_cost(&self, given: crate::core::cost::CostUnits) -> crate::core::cost::Planned {
        use crate::core::cost::Blocks;
        let none = || Blocks {
            restarts: 0,
            blocks: Vec::new(),
        };
        let (mut fewest, mut most) = (none(), none());
        let mut plain_groups = std::collections::BTreeSet::new();
        for cell in self.cells() {
            let Some(sweep) = &cell.load else {
                plain_groups.insert(cell.group);
                let mut w = self.plan.workload.clone();
                w.sessions = cell.sessions;
                let blocks = vec![
                    (u64::from(cell.sessions), w.target_concurrency());
                    self.plan.repeats.max(1) as usize
                ];
                fewest.blocks.extend(&blocks);
                most.blocks.extend(blocks);
                continue;
            };
            let (low, high) = self.plan.sweep_params(sweep).planned_blocks();
            fewest.restarts += low.restarts;
            fewest.blocks.extend(low.blocks);
            most.restarts += high.restarts;
            most.blocks.extend(high.blocks);
        }
        fewest.restarts += plain_groups.len() as u64;
        most.restarts += plain_groups.len() as u64;
        let sets = if crate::commands::EnginePlan::uses_replicas(self) {
            self.target.replicas.len() as u32 + 1
        } else {
            1
        };
        let (restart, wave) = crate::commands::cost_units(&self.testbed, &self.target.name, given);
        crate::core::cost::plan_between(&fewest, &most, sets, &restart, &wave)
    }

    /// The cells this invocation runs: the shard's, or all.
    pub fn cells(&self) -> Vec<&Cell> {
        match &self.shard {
            Some(s) => s.select(&self.plan.cells),
            None => self.plan.cells.iter().collect(),
        }
    }
}

/// `cells/<cell-id>/` under a matrix directory.
pub(crate) fn cell_dir(matrix_dir: &Path, cell: &Cell) -> PathBuf {
    matrix_dir.join("cells").join(&cell.id)
}
