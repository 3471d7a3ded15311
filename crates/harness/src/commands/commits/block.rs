//! One block of sessions on one commit's build: the target as that commit runs it, a
//! read-only [`Testbed`] over it (restart, health, the engines' self-reports, drive at the
//! load into `blocks/bNNN/`, stop), and the three-valued judgement of what came back.
//!
//! How a commit's build reaches the target (docs/commits.md): every role whose launch
//! config lies inside the repository is launched from the same path inside the commit's
//! worktree (so a launch script, and whatever it runs beside it, is the commit's);
//! `{commit}` and `{commit_dir}` in a role's restart command are replaced by the commit
//! id and its worktree (the search's folder for `--artifact`). Without `--flag` and
//! `--set`, nothing of the user's is written: the worktree is bisect's, and the testbed
//! opens read-only. With them, the block writes the pins and the arm's value of the flag
//! into the launch configs it launches from (the commit's worktree's, or, for roles
//! outside the repository and with `--artifact`, the user's), journaled, read back and
//! checked against the engines' self-reports after the restart, and restores them byte
//! for byte when the block ends: the arm lifecycle of `bisect run`.
//!
//! The judgement ([`judge`]) is the core's one judgement of a block
//! ([`crate::core::judgement`], which `bisect probe` decides on too), each check voiding
//! the block ("could not tell", weighing nothing): an engine that was another process at
//! the end than after the restart, a degraded block (error+timeout over the policy's
//! share), no judged session (all truncated or failed); and, here, a load that fell
//! short of the policy's share of the target (or was never measured), since a
//! load-dependent bug can hide below its load. Rejected replies count as corrupted, as
//! everywhere.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::arm::{BlockDrive, BlockName, Progress, Testbed, TestbedOptions};
use crate::config::Pin;
use crate::config::{FlagSpec, RoleSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::ArmLabel;
use crate::core::commits::Observation;
use crate::core::evidence::Policy;
use crate::core::judgement::judge_block;
use crate::exit::Failure;
use crate::results::run_record::ArmRecord;
use crate::results::ResultsDir;

/// Builds the engine control for one commit's target, its logs under the given folder.
pub type ControlFactory<'f> =
    dyn Fn(&TargetProfile, &Path) -> anyhow::Result<Box<dyn EngineControl>> + Send + Sync + 'f;

/// The target as `sha` runs it: launch configs inside `repo` moved into `folder`,
/// `{commit}` / `{commit_dir}` filled into restart commands.
pub(crate) fn commit_target(
    target: &TargetProfile,
    repo: Option<&Path>,
    folder: Option<&Path>,
    sha: &str,
    search_dir: &Path,
) -> TargetProfile {
    let commit_dir = folder.unwrap_or(search_dir).display().to_string();
    let mut out = target.clone();
    for role in &mut out.roles {
        let inside = repo.and_then(|repo| launch_inside(role, repo));
        if let (Some(folder), Some(inside)) = (folder, inside) {
            role.launch = folder.join(inside);
        }
        if let Some(cmd) = &role.restart {
            role.restart = Some(
                cmd.replace("{commit}", sha)
                    .replace("{release}", sha)
                    .replace("{commit_dir}", &commit_dir),
            );
        }
    }
    out
}

/// Where `role`'s launch config lies inside `repo`: its path relative to the repository
/// (both made absolute), or `None` when it lies outside.
pub(crate) fn launch_inside(role: &RoleSpec, repo: &Path) -> Option<PathBuf> {
    let repo = std::path::absolute(repo).unwrap_or_else(|_| repo.to_path_buf());
    let launch = std::path::absolute(&role.launch).unwrap_or_else(|_| role.launch.clone());
    launch.strip_prefix(&repo).ok().map(Path::to_path_buf)
}

/// Whether the target runs what a commit built: a role's launch config inside `repo`, or
/// a restart command naming `{commit}` or `{commit_dir}`. Without either, every commit
/// would be measured on the same engine.
pub(crate) fn runs_the_commit(target: &TargetProfile, repo: &Path) -> bool {
    target.roles.iter().any(|role| {
        launch_inside(role, repo).is_some()
            || role
                .restart
                .as_deref()
                .is_some_and(|c| c.contains("{commit}") || c.contains("{commit_dir}"))
    })
}

/// What one block gave, for the record.
#[derive(Debug, Clone)]
pub(crate) struct Ran {
    pub(crate) observation: Observation,
    pub arm: Option<ArmRecord>,
    pub wall_s: f64,
    pub engine_info: serde_json::Map<String, serde_json::Value>,
    /// What the block's testbed spent (restarts, driving): the search's cost.
    pub spent: crate::core::cost::Spent,
}

impl Ran {
    /// The busiest engine role's peak running requests (the client's is not the engine's).
    pub(crate) fn peak_engine(&self) -> Option<u64> {
        self.arm.as_ref().and_then(|a| {
            a.stats
                .peak_running
                .iter()
                .filter(|(role, _)| role.as_str() != "client")
                .map(|(_, peak)| *peak)
                .max()
        })
    }
}

/// What every block writes into its target's launch configs before the restart: the
/// `--set` pins, journaled and restored as `bisect run` does (nothing is written, and the
/// testbed opens read-only, when there are no pins and no flag under test).
pub(crate) struct Writes<'w> {
    pub pins: &'w [Pin],
    pub testbed: &'w TestbedOptions,
}

/// Everything a block needs besides its commit.
pub(crate) struct BlockContext<'c> {
    pub workload: &'c Workload,
    pub policy: &'c Policy,
    pub api_key: Option<String>,
    pub progress: &'c dyn Progress,
    pub cancel: tokio_util::sync::CancellationToken,
    pub controls: &'c ControlFactory<'c>,
    pub writes: Writes<'c>,
    /// `--oracle solo`: each block's sessions also run alone first.
    pub oracle: Option<crate::core::solo::SoloOracle>,
}

impl<'c> BlockContext<'c> {
    /// The same context for a lane of a round on replica sets: its notes through
    /// `progress` (which names the set), stopped by `cancel`.
    pub(crate) fn on_lane<'l>(
        &self,
        progress: &'l dyn Progress,
        cancel: tokio_util::sync::CancellationToken,
    ) -> BlockContext<'l>
    where
        'c: 'l,
    {
        BlockContext {
            workload: self.workload,
            policy: self.policy,
            api_key: self.api_key.clone(),
            progress,
            cancel,
            controls: self.controls,
            writes: Writes {
                pins: self.writes.pins,
                testbed: self.writes.testbed,
            },
            oracle: self.oracle,
        }
    }
}

/// One block at the commit's target into `dir`, with `flag` (the flag under test and
/// this arm's value) and the pins written and read back first, and the engines' own
/// reports checked against them after the restart. Errors only for what stops the search
/// (Ctrl-C, another bisect holding the target, bad input); an engine that does not start,
/// a value that does not read back or does not take effect, or a drive that fails is
/// "could not tell".
pub(crate) async fn run_block(
    ctx: &BlockContext<'_>,
    target: &TargetProfile,
    flag: Option<(&FlagSpec, &str)>,
    label: &str,
    dir: &Path,
) -> anyhow::Result<Ran> {
    let started = Instant::now();
    let results = ResultsDir::create(dir)?;
    let mut control = (ctx.controls)(target, &dir.join("logs"))?;
    let w = &ctx.writes;
    let written: Vec<&FlagSpec> = w
        .pins
        .iter()
        .map(|p| &p.flag)
        .chain(flag.map(|(f, _)| f))
        .collect();
    let spec = if written.is_empty() {
        w.testbed.read_only(target, ctx.api_key.clone())
    } else {
        w.testbed.spec(target, ctx.api_key.clone(), written)
    };
    let mut bed = Testbed::open(spec, control.as_mut(), ctx.progress, ctx.cancel.clone())?;
    let outcome = async {
        let what = format!("block {label}");
        bed.pin(w.pins)?;
        if let Some((flag, value)) = flag {
            bed.set_read_back(flag, value, &what)?;
        }
        let restarted = bed.restart(label).await?;
        restarted.refuse_disagreements(&what)?;
        results.snapshot_launch(label, 0, target)?;
        let classifier = Arc::new(target.classifier(ctx.workload)?);
        let block = BlockName {
            label,
            value: flag.map_or("", |(_, value)| value),
            repeat: 0,
        };
        let mut arm = ArmRecord::new(ArmLabel::Probe, label, Some(0));
        (arm.stats, arm.oracle) = bed
            .drive_judged(
                BlockDrive {
                    block,
                    workload: ctx.workload,
                    classifier: &classifier,
                    results: &results,
                },
                ctx.oracle,
            )
            .await?;
        arm.stats.health_wait_s = restarted.health_wait_s;
        arm.finish();
        anyhow::Ok((arm, restarted.engine_info))
    }
    .await;
    let closed = bed.close().await;
    let spent = closed.spent;
    let outcome = closed.combine(outcome);
    let wall_s = started.elapsed().as_secs_f64();
    match outcome {
        Ok((arm, info)) => Ok(Ran {
            // The flag's off block is the pair's control: the search counts the on
            // block, and only there must the path have run.
            observation: judge(
                &arm,
                &ctx.workload.params_json(),
                ctx.policy,
                flag.is_none_or(|(f, value)| value != f.off),
            ),
            arm: Some(arm),
            wall_s,
            engine_info: info.into_iter().collect(),
            spent,
        }),
        Err(e) if stops_the_search(&e) => Err(e),
        Err(e) => Ok(Ran {
            observation: Observation::CouldNotTell {
                reason: format!("the block could not run: {e:#}"),
            },
            arm: None,
            wall_s,
            engine_info: Default::default(),
            spent,
        }),
    }
}

/// Ctrl-C, another bisect on the target, bad input: not a property of the commit.
fn stops_the_search(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<Failure>(),
            Some(Failure::Interrupted | Failure::Busy(_) | Failure::BadInput(_))
        ) || c.downcast_ref::<crate::config::ConfigError>().is_some()
    })
}

/// The block's observation by the checks of this module's header: the core's one
/// judgement of a block, a load short of the target voiding it too, and, for a block
/// the search counts (`counted`: not a `--flag` pair's off control), a clean block
/// whose flag's path never ran (core::mechanism) could not tell: a commit is never
/// good for a path that never ran.
pub fn judge(
    arm: &ArmRecord,
    workload: &serde_json::Value,
    policy: &Policy,
    counted: bool,
) -> Observation {
    let facts = crate::commands::judge::block_facts(arm, workload, policy);
    let observation = Observation::of_block(judge_block(&facts, policy.degraded_fraction));
    let never_ran = crate::core::mechanism::coverage(&[("the block", &arm.stats.mechanisms)])
        .and_then(|c| c.refusal())
        .filter(|_| counted);
    match (observation, never_ran) {
        (Observation::Block { corrupted: 0, .. }, Some(refusal)) => {
            Observation::CouldNotTell { reason: refusal }
        }
        (observation, _) => observation,
    }
}

/// `blocks/b007` for block 7.
pub(crate) fn block_dir(root: &Path, block: u64) -> PathBuf {
    root.join(format!("blocks/b{block:03}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::{Counts, SessionClass};

    fn arm(corrupted: u64, failed: u64, sessions: u64, peak: u64) -> ArmRecord {
        let mut arm = ArmRecord::new(ArmLabel::Probe, "b001", Some(0));
        arm.stats.counts = Counts::from([
            (SessionClass::BadArgs, corrupted),
            (SessionClass::Timeout, failed),
            (SessionClass::Done, sessions - corrupted - failed),
        ]);
        arm.stats.peak_running = [("client".into(), sessions), ("decode".into(), peak)].into();
        arm.finish();
        arm
    }

    #[test]
    fn a_block_counts_only_when_every_check_holds() {
        let w = serde_json::json!({ "sessions": 80 });
        let p = Policy::default();
        assert_eq!(
            judge(&arm(12, 0, 80, 80), &w, &p, true),
            Observation::Block {
                corrupted: 12,
                judged: 80
            }
        );
        // Two timeouts leave the denominator, within the degraded share.
        assert_eq!(
            judge(&arm(12, 2, 80, 80), &w, &p, true),
            Observation::Block {
                corrupted: 12,
                judged: 78
            }
        );
        let why = |a: &ArmRecord| match judge(a, &w, &p, true) {
            Observation::CouldNotTell { reason } => reason,
            other => panic!("{other:?}"),
        };
        assert!(why(&arm(12, 20, 80, 80)).starts_with("degraded: 20/80"));
        assert!(
            why(&arm(0, 0, 80, 10)).starts_with("the load fell short"),
            "{}",
            why(&arm(0, 0, 80, 10))
        );
        let mut replaced = arm(12, 0, 80, 80);
        replaced
            .stats
            .engine_replaced
            .push("role decode is another process (pid 1 -> 2)".into());
        assert!(why(&replaced).contains("pid 1 -> 2"));
        // A clean block whose flag's path never ran says nothing of the commit; one
        // that corrupted still counts.
        let defrags = vec![crate::core::testing::witnessed(
            ("DEFRAG", "defrag"),
            ("0.1", true),
            "log /requesting defrag/",
            0,
        )];
        let mut idle = arm(0, 0, 80, 80);
        idle.stats.mechanisms = defrags.clone();
        assert!(
            why(&idle).starts_with(
                "the mechanism never ran: defrag (log /requesting defrag/): the block 0"
            ),
            "{}",
            why(&idle)
        );
        // The off control of a --flag pair is not what the search counts.
        assert!(matches!(
            judge(&idle, &w, &p, false),
            Observation::Block { corrupted: 0, .. }
        ));
        let mut corrupted = arm(12, 0, 80, 80);
        corrupted.stats.mechanisms = defrags;
        assert!(matches!(
            judge(&corrupted, &w, &p, true),
            Observation::Block { corrupted: 12, .. }
        ));
    }

    #[test]
    fn launch_configs_inside_the_repository_move_into_the_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        use crate::config::{Engine, RoleSpec};
        let mut target = TargetProfile {
            name: "t".into(),
            api: "http://h/v1".into(),
            model: "m".into(),
            api_key_env: None,
            roles: vec![
                RoleSpec::new(
                    "decode",
                    repo.join("launch/decode.sh"),
                    "http://h".into(),
                    None,
                ),
                RoleSpec::new(
                    "router",
                    dir.path().join("router.sh"),
                    "http://h".into(),
                    None,
                ),
            ],
            source: None,
            engine: Engine::Custom,
            markup: Vec::new(),
            flags_dir: None,
            rejections: Vec::new(),
            launch_scripts: Vec::new(),
            replica: None,
            replicas: Vec::new(),
        };
        target.roles[1].restart =
            Some("systemctl restart engine@{commit} --dir {commit_dir}".into());
        let tree = dir.path().join("worktrees/abc");
        let t = commit_target(&target, Some(&repo), Some(&tree), "abc123", dir.path());
        assert!(runs_the_commit(&target, &repo));
        let mut elsewhere = target.clone();
        elsewhere.roles[0].launch = dir.path().join("decode.sh");
        assert!(
            runs_the_commit(&elsewhere, &repo),
            "the restart names {{commit}}"
        );
        elsewhere.roles[1].restart = None;
        assert!(!runs_the_commit(&elsewhere, &repo));
        assert_eq!(t.roles[0].launch, tree.join("launch/decode.sh"));
        assert_eq!(t.roles[1].launch, dir.path().join("router.sh"));
        assert_eq!(
            t.roles[1].restart.as_deref(),
            Some(format!("systemctl restart engine@abc123 --dir {}", tree.display()).as_str())
        );
    }
}
