//! The solo oracle's reference pass on the testbed (docs/oracle.md): a block's sessions
//! run one at a time on the engines just started, kept in the block's results and in a
//! reference cache keyed by what they stand for (launch configs, engine builds, bisect,
//! workload), reused by later blocks and runs once a session run alone again agrees;
//! any command that drives blocks can judge them against it ([`Testbed::judge_against`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::{BlockDrive, BlockName, Testbed};
use crate::config::Workload;
use crate::core::classify::Classifier;
use crate::core::session::SessionResult;
use crate::core::solo::{ReferencePass, SoloOracle};
use crate::results::ResultsDir;

impl Testbed<'_> {
    /// The block's reference for the solo oracle: its sessions run one at a time on the
    /// engines just started (the same configuration as the block), kept in the block's
    /// results (`reference/<arm>/`) and in the reference cache under [`ReferenceKey`]'s
    /// entry. A later block or run whose key matches (the same launch configs, engine
    /// builds, bisect and workload; any load) reuses the entry once one of its sessions,
    /// run alone again now, gives the same tokens; otherwise (a stale entry: the check
    /// parted) the whole pass runs again. A session whose reference failed (error,
    /// timeout) has none: it is judged by the classifier alone.
    pub(crate) async fn reference(
        &mut self,
        d: BlockDrive<'_>,
        solo: SoloOracle,
    ) -> anyhow::Result<(Arc<crate::driver::Oracle>, ReferencePass)> {
        let (block, workload) = (d.block, d.workload);
        let kept = ResultsDir::create(&d.results.root().join("reference").join(block.label))?;
        let threshold = solo.threshold_for(self.determinism.batch_invariant());
        let mut alone = workload.clone();
        alone.concurrency = Some(1);
        let key = self.reference_key(&alone)?;
        let cache_root = self
            .reference_cache
            .clone()
            .unwrap_or_else(|| d.results.root().join("reference-cache"));
        let entry = cache_root.join(format!("{:08x}", crc32fast::hash(key.as_bytes())));
        let mut pass = ReferencePass {
            threshold: threshold.is_finite().then_some(threshold),
            cache: entry.file_name().map(|n| n.to_string_lossy().into_owned()),
            determinism: Some(self.determinism.clone()),
            ..ReferencePass::default()
        };
        let label = format!("{}-alone", block.label);
        let name = BlockName {
            label: &label,
            ..block
        };
        let started = Instant::now();
        let sessions = match cached(&entry, &key, alone.sessions) {
            Some(sessions) => {
                pass.checked = 1;
                if self
                    .still_stands(name, &alone, d.classifier, &kept, &sessions)
                    .await?
                {
                    pass.reused = 1;
                    self.progress().note(&format!(
                        "arm {}: the solo oracle's reference reused ({} sessions; one run alone again gave the same tokens)",
                        block.label,
                        sessions.len()
                    ));
                    copy_sessions(&entry, kept.root())?;
                    Some(sessions)
                } else {
                    pass.stale = 1;
                    self.progress().note(&format!(
                        "warning: arm {}: the solo oracle's kept reference is stale (a session run alone again parted from it): running it again",
                        block.label
                    ));
                    None
                }
            }
            None => None,
        };
        let sessions = match sessions {
            Some(sessions) => sessions,
            None => {
                self.progress().note(&format!(
                    "arm {}: the solo oracle's reference, {} sessions one at a time",
                    block.label, workload.sessions
                ));
                let sessions = self
                    .run_alone(BlockDrive {
                        block: name,
                        workload: &alone,
                        classifier: d.classifier,
                        results: &kept,
                    })
                    .await?;
                pass.sessions = sessions.len() as u64;
                // A pass with a failed session (a timeout, an engine error) is this
                // block's only: kept, a later block would never judge that session.
                if sessions.iter().all(|s| !s.class.is_failure()) {
                    keep(&entry, &key, kept.root())?;
                } else {
                    pass.cache = None;
                }
                sessions
            }
        };
        // The check's session counts in the reference's cost.
        pass.wall_s = started.elapsed().as_secs_f64();
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

    /// The reference cache's key for `alone` on the engines as they run now
    /// ([`ReferenceKey`]), as the text kept beside the entry.
    fn reference_key(&self, alone: &Workload) -> anyhow::Result<String> {
        let mut launch = BTreeMap::new();
        for role in &self.target().roles {
            let text = std::fs::read_to_string(&role.launch)
                .with_context(|| format!("reading {}", role.launch.display()))?;
            launch.insert(
                role.name.clone(),
                LaunchKey {
                    path: role.launch.display().to_string(),
                    text: crate::redact::scrub(&text).into_owned(),
                },
            );
        }
        // An engine that names no build could have been rebuilt in place: its references
        // stand for this bisect process only.
        let process = self.builds.values().any(Option::is_none).then(this_process);
        let key = ReferenceKey {
            bisect: env!("CARGO_PKG_VERSION"),
            target: self.target().name.clone(),
            launch,
            builds: self.builds.clone(),
            process,
            workload: alone.params_json(),
        };
        Ok(serde_json::to_string_pretty(&key)? + "\n")
    }

    /// Run `alone`'s sessions one at a time into `kept` (anew: what an interrupted pass
    /// left would be appended to).
    async fn run_alone(&mut self, d: BlockDrive<'_>) -> anyhow::Result<Vec<SessionResult>> {
        let file = d.results.root().join("sessions.jsonl");
        if file.exists() {
            std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        }
        let mut sessions = Vec::new();
        self.drive_observed(d, &mut |s| sessions.push(s.clone()))
            .await?;
        Ok(sessions)
    }

    /// Whether a kept reference still stands: its first session run alone again now
    /// (into `kept`'s `check/`) gives the same tokens ([`crate::core::solo::still_stands`]).
    async fn still_stands(
        &mut self,
        name: BlockName<'_>,
        alone: &Workload,
        classifier: &Arc<Classifier>,
        kept: &ResultsDir,
        sessions: &[SessionResult],
    ) -> anyhow::Result<bool> {
        let mut one = alone.clone();
        one.sessions = 1;
        let check = ResultsDir::create(&kept.root().join("check"))?;
        let again = self
            .run_alone(BlockDrive {
                block: name,
                workload: &one,
                classifier,
                results: &check,
            })
            .await?;
        let first = sessions.iter().find(|s| s.index == 0);
        Ok(match (first, again.first()) {
            (Some(kept), Some(again)) => crate::core::solo::still_stands(kept, again),
            _ => false,
        })
    }

    /// [`Testbed::drive`], with `oracle` (when given) judging every session also against
    /// the same session alone: the block's reference pass first, then the sessions under
    /// load. Returns the block's statistics and, with the oracle, its reference pass.
    pub(crate) async fn drive_judged(
        &mut self,
        d: BlockDrive<'_>,
        oracle: Option<SoloOracle>,
    ) -> anyhow::Result<(crate::core::arm_stats::ArmStats, Option<ReferencePass>)> {
        let (stats, _, pass) = self.drive_judged_observed(d, oracle, &mut |_| {}).await?;
        Ok((stats, pass))
    }

    /// [`Testbed::drive_judged`], also handing every finished session under load to
    /// `observe` and returning the driver's totals (as [`Testbed::drive_observed`]).
    pub(crate) async fn drive_judged_observed(
        &mut self,
        d: BlockDrive<'_>,
        oracle: Option<SoloOracle>,
        observe: &mut (dyn FnMut(&SessionResult) + Send),
    ) -> anyhow::Result<(
        crate::core::arm_stats::ArmStats,
        crate::driver::DriveStats,
        Option<ReferencePass>,
    )> {
        let Some(solo) = oracle else {
            let (stats, driven) = self.drive_observed(d, observe).await?;
            return Ok((stats, driven, None));
        };
        let (references, mut pass) = self.reference(d, solo).await?;
        self.judge_against(Some(references));
        let mut count = |session: &SessionResult| {
            pass.count(session);
            observe(session);
        };
        let driven = self.drive_observed(d, &mut count).await;
        self.judge_against(None);
        let (stats, driven) = driven?;
        // Every command's block keeps what its reference cost and found beside it (run
        // and commits also put it in their records).
        let kept = d
            .results
            .root()
            .join("reference")
            .join(d.block.label)
            .join(PASS_FILE);
        let text = serde_json::to_string_pretty(&pass)? + "\n";
        crate::results::write_atomic(&kept, text.as_bytes())?;
        Ok((stats, driven, Some(pass)))
    }
}

/// What a kept reference stands for: bisect's version, the target, every role's launch
/// config as the block runs it (path and text, secrets masked), every role's engine
/// build as it names it, this process where some engine names none, and the workload
/// run alone (its sessions, seed, requests; not the load the block then applies).
#[derive(serde::Serialize)]
struct ReferenceKey {
    bisect: &'static str,
    target: String,
    launch: BTreeMap<String, LaunchKey>,
    builds: BTreeMap<String, Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<String>,
    workload: serde_json::Value,
}

#[derive(serde::Serialize)]
struct LaunchKey {
    path: String,
    text: String,
}

/// This bisect process: its pid and when it first asked (Unix nanoseconds), so a pid
/// reused by a later process names another.
fn this_process() -> String {
    static STARTED: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    format!("pid {} at {started}", std::process::id())
}

/// The cache entry's sessions, when its key is `key` and it holds all `sessions`.
fn cached(entry: &Path, key: &str, sessions: u32) -> Option<Vec<SessionResult>> {
    let kept_key = std::fs::read_to_string(entry.join(KEY_FILE)).ok()?;
    if kept_key != key {
        return None;
    }
    let kept = ResultsDir::create(entry).ok()?.read_sessions().ok()?;
    (kept.len() == sessions as usize).then_some(kept)
}

/// Put the block's reference into the cache entry: the sessions first, the key last, so
/// an entry with a key is a complete one.
fn keep(entry: &Path, key: &str, kept: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(entry).with_context(|| format!("creating {}", entry.display()))?;
    let _ = std::fs::remove_file(entry.join(KEY_FILE));
    copy_sessions(kept, entry)?;
    crate::results::write_atomic(&entry.join(KEY_FILE), key.as_bytes())
}

/// Copy `from/sessions.jsonl` to `to/sessions.jsonl` (atomically).
fn copy_sessions(from: &Path, to: &Path) -> anyhow::Result<()> {
    let source = from.join("sessions.jsonl");
    let bytes = std::fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    crate::results::write_atomic(&to.join("sessions.jsonl"), &bytes)
}

/// The key file of a cache entry.
const KEY_FILE: &str = "key.json";

/// A block's reference pass record, beside its reference sessions.
const PASS_FILE: &str = "pass.json";
