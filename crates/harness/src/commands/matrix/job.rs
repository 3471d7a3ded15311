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
}

impl MatrixJob {
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
