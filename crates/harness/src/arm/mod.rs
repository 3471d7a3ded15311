//! The one arm lifecycle that `run`, `probe`, `matrix` and `culprit` share
//! (docs/design.md 2.2): a [`Testbed`] is a target under bisect's control for the
//! length of one command.
//!
//! 1. [`Testbed::open`]: refuse a half-applied flag before touching anything, then
//!    journal the launch configs (a probe opens read-only: nothing is journaled or
//!    written).
//! 2. [`Testbed::pin`] / [`Testbed::set`]: write flag values into every role's launch
//!    config and read them back.
//! 3. [`Testbed::restart`]: restart the engines, wait for health, record what each
//!    engine reports about itself.
//! 4. [`Testbed::drive`]: drive one arm block's sessions with the metrics poller beside
//!    them; the one collector aggregates into an [`ArmStats`] and streams
//!    `sessions.jsonl` and `metrics.csv`.
//! 5. [`Testbed::close`]: stop the engines and restore the configs byte for byte, on
//!    every path; [`settle`] turns the command's outcome into the record's status.
//!
//! Commands differ only in which values they set, how blocks are ordered (ABBA repeats,
//! restart groups, looks) and what they decide from the stats.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Pin;
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::{ArmStats, RecordStatus};
use crate::core::classify::Classifier;
use crate::core::poison::Ran;
use crate::core::session::SessionResult;
use crate::driver::{metrics, DrivePlan, InFlight};
use crate::exit::{Failure, Problem};
use crate::launch::Editor;
use crate::results::ResultsDir;

mod capacity;
mod deaths;
mod engines;
mod oracle;
mod witness;
pub(crate) use capacity::{get_json, get_text};
pub(crate) use witness::sum_at as witness_sum_at;

pub(crate) use engines::Restarted;
use engines::Written;
pub use engines::NO_EFFECTIVE_WARNING;

/// Role -> the value read back from its launch config after an edit.
pub(crate) type Readback = BTreeMap<String, String>;

/// One arm block as progress output names it: a run's `on`/`off` arm with its flag
/// value, or a matrix cell / probe (empty value).
#[derive(Debug, Clone, Copy)]
pub struct BlockName<'a> {
    pub label: &'a str,
    pub value: &'a str,
    pub repeat: u32,
}

/// One block's drive: which block, the workload its sessions run, how they are judged,
/// and the results directory its files go to. What every `Testbed::drive*` takes.
#[derive(Clone, Copy)]
pub(crate) struct BlockDrive<'a> {
    pub block: BlockName<'a>,
    pub workload: &'a Workload,
    pub classifier: &'a Arc<Classifier>,
    pub results: &'a ResultsDir,
}

/// Where progress goes: a bar on a TTY, plain lines otherwise, nothing in tests.
pub trait Progress: Send + Sync {
    fn arm_started(&self, block: BlockName<'_>, sessions: u64);
    fn session_done(&self, result: &SessionResult);
    fn arm_finished(&self, block: BlockName<'_>, stats: &ArmStats);
    fn note(&self, message: &str);
}

/// Progress sink that says nothing.
pub struct Quiet;
impl Progress for Quiet {
    fn arm_started(&self, _: BlockName<'_>, _: u64) {}
    fn session_done(&self, _: &SessionResult) {}
    fn arm_finished(&self, _: BlockName<'_>, _: &ArmStats) {}
    fn note(&self, _: &str) {}
}

/// How a command opens its testbed: built by [`TestbedSpec::read_only`], then
/// [`TestbedSpec::editing`] for a command that writes flags.
pub(crate) struct TestbedSpec<'a> {
    target: &'a TargetProfile,
    /// Where the launch-config journal lives; `None` opens read-only (probe).
    journal_dir: Option<&'a Path>,
    /// Where the target's state lives; `None`: `$XDG_STATE_HOME/bisect`.
    state_root: Option<&'a Path>,
    /// Every flag the command may write: refused up front if half-applied.
    flags: Vec<&'a FlagSpec>,
    allow_partial: bool,
    api_key: Option<String>,
    metrics_period: Duration,
    /// Where the solo oracle's references are kept across blocks and runs; `None`: a
    /// `reference-cache/` beside each block's results.
    reference_cache: Option<&'a Path>,
}

impl<'a> TestbedSpec<'a> {
    /// A testbed over `target` that edits nothing: no journal, no flag to refuse (a
    /// probe). Commands that write flags add [`TestbedSpec::editing`].
    pub(crate) fn read_only(
        target: &'a TargetProfile,
        api_key: Option<String>,
        metrics_period: Duration,
    ) -> Self {
        TestbedSpec {
            target,
            journal_dir: None,
            state_root: None,
            flags: Vec::new(),
            allow_partial: true,
            api_key,
            metrics_period,
            reference_cache: None,
        }
    }

    /// Writes `flags` (each refused up front if half-applied, unless `allow_partial`),
    /// the launch configs journaled in `journal_dir`, the target's state under
    /// `state_root`.
    pub fn editing(
        self,
        journal_dir: &'a Path,
        state_root: Option<&'a Path>,
        flags: Vec<&'a FlagSpec>,
        allow_partial: bool,
    ) -> Self {
        TestbedSpec {
            journal_dir: Some(journal_dir),
            state_root,
            flags,
            allow_partial,
            ..self
        }
    }
}

/// Where an editing command keeps its testbed's journal and state, and how often it
/// polls the engines' metrics: what only opening the testbed reads of `culprit`'s and
/// `load`'s plans.
#[derive(Debug, Clone)]
pub struct TestbedOptions {
    pub journal_dir: PathBuf,
    /// Where the target's state lives (lock, journal, spawned groups); `None`:
    /// `$XDG_STATE_HOME/bisect`. Tests point it into their temp dir.
    pub state_root: Option<PathBuf>,
    /// Allow a flag whose setting also appears in a role it does not list.
    pub allow_partial: bool,
    pub metrics_period: Duration,
    /// Where the solo oracle keeps its references for later blocks and runs to reuse
    /// (the CLI: `reference-cache/` in the results directory); `None`: beside each
    /// block's results.
    pub reference_cache: Option<PathBuf>,
}

impl TestbedOptions {
    /// Where the target's state lives (the lock, the journal, its measured costs).
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.state_root
            .clone()
            .unwrap_or_else(crate::launch::state_root)
    }

    /// The spec of a testbed over `target` that writes nothing.
    pub(crate) fn read_only<'a>(
        &'a self,
        target: &'a TargetProfile,
        api_key: Option<String>,
    ) -> TestbedSpec<'a> {
        TestbedSpec {
            reference_cache: self.reference_cache.as_deref(),
            ..TestbedSpec::read_only(target, api_key, self.metrics_period)
        }
    }

    /// The spec of a testbed over `target` that writes `flags`.
    pub(crate) fn spec<'a>(
        &'a self,
        target: &'a TargetProfile,
        api_key: Option<String>,
        flags: Vec<&'a FlagSpec>,
    ) -> TestbedSpec<'a> {
        self.read_only(target, api_key).editing(
            &self.journal_dir,
            self.state_root.as_deref(),
            flags,
            self.allow_partial,
        )
    }

    /// [`Self::spec`] for each replica set of `sets` (a command's lanes), every one
    /// writing `flags`.
    pub(crate) fn lane_specs<'a>(
        &'a self,
        sets: &'a [TargetProfile],
        api_key: Option<&str>,
        flags: &[&'a FlagSpec],
    ) -> Vec<TestbedSpec<'a>> {
        sets.iter()
            .map(|set| self.spec(set, api_key.map(str::to_string), flags.to_vec()))
            .collect()
    }
}

/// What closing found: both are reported, the restore first (configs matter most).
pub(crate) struct Closed {
    pub stopped: anyhow::Result<()>,
    pub restored: anyhow::Result<()>,
    /// What the testbed spent while open (restarts, driving): its command's cost.
    pub spent: crate::core::cost::Spent,
}

impl Closed {
    /// The command's result once the testbed is closed: a failed restore wins, then the
    /// command's own error, then a failed stop.
    pub(crate) fn combine<T>(self, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
        self.restored
            .context("restoring the original launch configs")?;
        let value = outcome?;
        self.stopped.context("stopping the engines")?;
        Ok(value)
    }
}

/// A command's result once its record is written: `result` (its outcome combined with
/// the close, [`Closed::combine`]) and `written`, the record's write. A failure of the
/// write never hides the result's error: a full disk fails a restore and then the
/// record, and the restore (the launch configs still edited) is what the user must
/// read first. When both failed, the message is the result's, then the write's.
pub(crate) fn record_written<T>(
    result: anyhow::Result<T>,
    written: anyhow::Result<()>,
) -> anyhow::Result<T> {
    match (result, written) {
        (result, Ok(())) => result,
        (Ok(_), Err(unwritten)) => Err(unwritten),
        (Err(first), Err(unwritten)) => Err(anyhow::anyhow!(
            "{first:#}\n  and the results could not be written either: {unwritten:#}"
        )),
    }
}

/// The one lifecycle of every command that drives engines (run, run --adaptive, probe,
/// culprit, load, matrix), on the testbed it opened: run `body` on it, close it whatever
/// happened (engines stopped, launch configs restored), then let `end` settle the
/// command's record in `state` from the outcome combined with the close
/// ([`Closed::combine`]: a failed restore is what the record and the user read first)
/// and write it; a failed write never hides the outcome ([`record_written`]). `end` also
/// gets the seconds closing took and what each testbed spent ([`Ending`]).
pub(crate) async fn lifecycle<S, T>(
    bed: Testbed<'_>,
    state: &mut S,
    body: impl AsyncFnOnce(&mut Testbed<'_>, &mut S) -> anyhow::Result<T>,
    end: impl FnOnce(&mut S, &anyhow::Result<T>, &Ending) -> anyhow::Result<()>,
) -> anyhow::Result<T> {
    lifecycle_lanes(
        vec![bed],
        state,
        async move |beds: &mut [Testbed<'_>], state: &mut S| body(&mut beds[0], state).await,
        end,
    )
    .await
}

/// [`lifecycle`] over several testbeds at once, one per replica set (lanes): `body`
/// drives them, then every one is closed (at the same time) whatever happened, and
/// every close's failures come before the outcome's.
pub(crate) async fn lifecycle_lanes<S, T>(
    mut beds: Vec<Testbed<'_>>,
    state: &mut S,
    body: impl AsyncFnOnce(&mut [Testbed<'_>], &mut S) -> anyhow::Result<T>,
    end: impl FnOnce(&mut S, &anyhow::Result<T>, &Ending) -> anyhow::Result<()>,
) -> anyhow::Result<T> {
    let outcome = body(&mut beds, state).await;
    let closing = std::time::Instant::now();
    let closed = futures::future::join_all(beds.into_iter().map(Testbed::close)).await;
    let ending = Ending {
        close_s: closing.elapsed().as_secs_f64(),
        spent: closed.iter().map(|c| c.spent).collect(),
    };
    let outcome = closed
        .into_iter()
        .rev()
        .fold(outcome, |outcome, closed| closed.combine(outcome));
    let written = end(state, &outcome, &ending);
    record_written(outcome, written)
}

/// What a command's end is told besides its outcome: how long closing took and what
/// each of its testbeds (one per replica set) spent while open.
pub(crate) struct Ending {
    pub close_s: f64,
    pub spent: Vec<crate::core::cost::Spent>,
}

impl Ending {
    /// The command's cost (core::cost) over `wall_s` seconds of wall time.
    pub(crate) fn cost(&self, wall_s: f64) -> crate::core::cost::Cost {
        crate::core::cost::Cost::spent(&self.spent, wall_s)
    }

    /// The target's measured rates (core::cost::Rates, kept in `state_dir`) take in what
    /// every testbed spent, so the next command's planned cost is priced on them.
    pub(crate) fn keep_rates(&self, state_dir: &Path, target: &str) {
        crate::results::rates::update(state_dir, target, |r| {
            for spent in &self.spent {
                r.take(spent);
            }
        });
    }
}

/// Opens one testbed per lane (`specs[i]` over `controls[i]`, its progress
/// `progress[i]`); when one cannot open, those already open are closed (their configs
/// restored) and its error returned.
pub(crate) async fn open_lanes<'a>(
    specs: Vec<TestbedSpec<'a>>,
    controls: Vec<&'a mut dyn EngineControl>,
    progress: &'a [Box<dyn Progress + 'a>],
    cancel: CancellationToken,
) -> anyhow::Result<Vec<Testbed<'a>>> {
    let mut beds = Vec::new();
    for ((spec, control), progress) in specs.into_iter().zip(controls).zip(progress) {
        match Testbed::open(spec, control, progress.as_ref(), cancel.clone()) {
            Ok(bed) => beds.push(bed),
            Err(e) => {
                let closed = futures::future::join_all(beds.into_iter().map(Testbed::close)).await;
                let mut outcome = Err(e);
                for closed in closed {
                    outcome = closed.combine(outcome);
                }
                return outcome;
            }
        }
    }
    Ok(beds)
}

/// A target under bisect's control for the length of one command.
pub(crate) struct Testbed<'a> {
    target: &'a TargetProfile,
    editor: Option<Editor>,
    control: &'a mut dyn EngineControl,
    progress: &'a dyn Progress,
    cancel: CancellationToken,
    api_key: Option<String>,
    metrics_period: Duration,
    /// For the lifecycle's own probes of the engines (health, self-reported config).
    probe_http: reqwest::Client,
    /// Role -> which process it was after the last restart
    /// ([`crate::control::identity`]): checked again at the end of every block.
    identities: BTreeMap<String, crate::core::effective::Identity>,
    /// Every flag written or pinned, by first write, with its latest value: what each
    /// restart checks the engines' self-reports against.
    written: Vec<Written>,
    /// Flags not written whose mechanisms are counted ([`Testbed::watch_mechanism`]).
    watched: Vec<(FlagSpec, String)>,
    /// Whether the engines were shown to parse tool calls (the probe before the first
    /// block, [`Testbed::prove_tool_calls`]); asked once per command.
    tool_calls_probed: std::sync::atomic::AtomicBool,
    /// The solo oracle's references for the next drives ([`Testbed::judge_against`]).
    oracle: Option<Arc<crate::driver::Oracle>>,
    /// Whether the engines said after the last restart that they are batch-invariant.
    determinism: crate::core::determinism::Determinism,
    /// Role -> the build its engine named after the last restart
    /// ([`crate::core::effective::build_identity`]).
    builds: BTreeMap<String, Option<String>>,
    reference_cache: Option<PathBuf>,
    /// Every restart and drive so far, as measured here: the cost of any command.
    spent: crate::core::cost::Spent,
}

impl<'a> Testbed<'a> {
    /// Judge the sessions of the drives that follow against `oracle`'s references too
    /// (`None`: by the classifier alone, as without `--oracle`).
    pub(crate) fn judge_against(&mut self, oracle: Option<Arc<crate::driver::Oracle>>) {
        self.oracle = oracle;
    }

    /// Refuse half-applied flags (unless allowed), then journal the launch configs.
    /// Nothing has been written when this fails.
    pub fn open(
        spec: TestbedSpec<'a>,
        control: &'a mut dyn EngineControl,
        progress: &'a dyn Progress,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
        if let Some(key) = &spec.api_key {
            crate::redact::register(key);
        }
        if !spec.allow_partial {
            refuse_half_applied(spec.target, &spec.flags)?;
        }
        let editor = match spec.journal_dir {
            None => None,
            Some(dir) => {
                let files: Vec<_> = spec.target.roles.iter().map(|r| r.launch.clone()).collect();
                let root = spec
                    .state_root
                    .map_or_else(crate::launch::state_root, Path::to_path_buf);
                let mut editor = Editor::begin_at(&root, dir, &files)
                    .with_context(|| format!("journaling launch configs in {}", dir.display()))?;
                for file in editor.recovered() {
                    progress.note(&format!(
                        "restored {} from the journal of an earlier run that did not finish",
                        file.display()
                    ));
                }
                for group in editor.killed() {
                    progress.note(&format!(
                        "stopped role {} (process group {}), left running by an earlier run that did not finish",
                        group.role, group.pgid
                    ));
                }
                for kept in editor.take_kept() {
                    progress.note(&format!("warning: {kept}"));
                }
                Some(editor)
            }
        };
        Ok(Testbed {
            target: spec.target,
            editor,
            control,
            progress,
            cancel,
            api_key: spec.api_key,
            metrics_period: spec.metrics_period,
            probe_http: reqwest::Client::builder()
                .no_proxy()
                // No idle connection kept to an engine that may be stopped next: one open
                // when it stops lingers unacknowledged on its port.
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(2))
                .build()?,
            identities: BTreeMap::new(),
            written: Vec::new(),
            watched: Vec::new(),
            oracle: None,
            determinism: Default::default(),
            builds: BTreeMap::new(),
            reference_cache: spec.reference_cache.map(Path::to_path_buf),
            tool_calls_probed: std::sync::atomic::AtomicBool::new(false),
            spent: Default::default(),
        })
    }

    pub fn target(&self) -> &TargetProfile {
        self.target
    }

    pub fn progress(&self) -> &dyn Progress {
        self.progress
    }

    /// Err(Interrupted) once Ctrl-C / SIGTERM / SIGHUP arrived: checked between blocks.
    pub(crate) fn check_cancelled(&self) -> anyhow::Result<()> {
        if self.cancel.is_cancelled() {
            return Err(Failure::Interrupted.into());
        }
        Ok(())
    }

    /// Write `value` for `flag` into every role it lists and read it back.
    pub fn set(&mut self, flag: &FlagSpec, value: &str) -> anyhow::Result<Readback> {
        let editor = self
            .editor
            .as_mut()
            .context("this command opened the launch configs read-only")?;
        let readback = editor.apply(flag, value, &self.target.roles)?;
        match self.written.iter_mut().find(|w| w.flag.name == flag.name) {
            Some(w) => w.value = value.to_string(),
            None => self.written.push(Written {
                flag: flag.clone(),
                value: value.to_string(),
                pinned: false,
            }),
        }
        Ok(readback)
    }

    /// [`Testbed::set`], refusing a role whose launch config does not read back `value`
    /// (an error naming `what`, e.g. "block 3").
    pub(crate) fn set_read_back(
        &mut self,
        flag: &FlagSpec,
        value: &str,
        what: &str,
    ) -> anyhow::Result<Readback> {
        let readback = self.set(flag, value)?;
        if let Some((role, got)) = readback.iter().find(|(_, got)| *got != value) {
            return Err(Failure::could_not_run(
                format!(
                    "{what}: {} reads back as {got} in role {role}'s launch config, not {value}",
                    flag.name
                ),
                "check the flag's catalog entry against the launch config",
            )
            .into());
        }
        Ok(readback)
    }

    /// Pin flags for every arm (`--set`, a plan's `[set]`): written, read back, noted.
    /// Returns flag -> read-back.
    pub fn pin(&mut self, sets: &[Pin]) -> anyhow::Result<BTreeMap<String, Readback>> {
        let mut pinned = BTreeMap::new();
        for Pin { flag, value } in sets {
            let readback = self.set(flag, value)?;
            if let Some(w) = self.written.iter_mut().find(|w| w.flag.name == flag.name) {
                w.pinned = true;
            }
            self.progress.note(&format!(
                "pinned {}={value} (read back: {})",
                flag.name,
                fmt_readback(&readback)
            ));
            pinned.insert(flag.name.clone(), readback);
        }
        Ok(pinned)
    }

    /// Restart every role with its launch config as it is now, wait for health, and ask
    /// each engine what it runs with. `label` names the block in log file names.
    ///
    /// Before anything is spawned, the roles bisect spawns itself must be silent: an
    /// engine that answers there is not ours (a run killed with -9 left it, or another
    /// deployment uses the port), and measuring it would be measuring the wrong engine.
    pub async fn restart(&mut self, label: &str) -> anyhow::Result<Restarted> {
        // A signal that arrived while the configs were written starts no engine.
        self.check_cancelled()?;
        // Someone else's edit since bisect's last write would be measured as this arm's.
        if let Some(editor) = &self.editor {
            editor.check_unchanged()?;
        }
        let started = Instant::now();
        // The restart's one stop: the control's restart expects its engines stopped, so
        // that what answers now is not ours.
        self.control.stop().await?;
        self.refuse_foreign_engines().await?;
        let waits = match self.control.restart(label, &self.cancel).await {
            Ok(waits) => waits,
            Err(e) => {
                // A restart that failed (an engine never healthy, a Ctrl-C while it
                // waited) held the engines all the same: its time is the command's cost.
                self.spent.failed.restarts += 1;
                self.spent.failed.restart_s += started.elapsed().as_secs_f64();
                return Err(e);
            }
        };
        let mut restarted = Restarted {
            health_wait_s: waits.values().sum(),
            health_padding_s: self.control.health_padding().values().sum(),
            restart_s: 0.0,
            engine_info: BTreeMap::new(),
            identities: BTreeMap::new(),
            effective: BTreeMap::new(),
            disagreements: Vec::new(),
        };
        self.identities.clear();
        for role in &self.target.roles {
            let info = self.self_report(role).await;
            if info.is_none() {
                if let Some(url) = &role.effective_url {
                    self.progress.note(&format!(
                        "warning: role {} did not answer its effective-config URL {url} with JSON: \
                         what it runs with is not checked (set effective_url in the profile)",
                        role.name
                    ));
                }
            }
            let identity = crate::control::identity::identify(
                &self.probe_http,
                role,
                self.api_key.as_deref(),
                info.as_ref(),
            )
            .await;
            self.identities.insert(role.name.clone(), identity.clone());
            restarted.identities.insert(role.name.clone(), identity);
            if let Some(info) = info {
                restarted.engine_info.insert(role.name.clone(), info);
            }
        }
        self.check_written(&mut restarted);
        self.determinism = crate::control::determinism::read(self.target, &restarted.engine_info);
        self.builds = self
            .target
            .roles
            .iter()
            .map(|role| {
                let build = restarted
                    .engine_info
                    .get(&role.name)
                    .and_then(crate::core::effective::build_identity);
                (role.name.clone(), build)
            })
            .collect();
        restarted.restart_s = (started.elapsed().as_secs_f64() - restarted.health_wait_s).max(0.0);
        self.spent.restarts += 1;
        self.spent.restart_s += restarted.restart_s + restarted.health_wait_s;
        Ok(restarted)
    }

    /// The KV capacity the engines report now (core::pressure; arm/capacity.rs).
    pub(crate) async fn capacity(&self) -> Result<crate::core::pressure::Capacity, String> {
        capacity::read(self.target.engine, &self.target.roles, &self.probe_http).await
    }

    /// The engine's count of session 0's opening request at ctx 0 and at `ctx` of
    /// filler (core::pressure::Counted), two requests one after the other, or why
    /// there is none.
    pub(crate) async fn count_prompt(
        &self,
        workload: &Workload,
        ctx: u32,
    ) -> Result<crate::core::pressure::Counted, String> {
        let at = |ctx: u32| {
            let mut w = workload.clone();
            w.ctx = ctx;
            let name = BlockName {
                label: "pressure-count",
                value: "",
                repeat: 0,
            };
            self.drive_plan(name, &w)
        };
        let at_zero = crate::driver::count::prompt_tokens(&at(0)).await?;
        let at_ctx = crate::driver::count::prompt_tokens(&at(ctx)).await?;
        Ok(crate::core::pressure::Counted {
            at_zero,
            ctx,
            at_ctx,
        })
    }

    /// Stop the engines this testbed started (between restart groups). Idempotent.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.control.stop().await
    }

    /// Drive one arm block against engines that are up: all sessions of `workload`,
    /// the metrics poller, and the one collector that aggregates into the returned
    /// stats and streams `sessions.jsonl` and `metrics.csv` into `results`. The stats
    /// come back finished (derived fields computed); `health_wait_s` is the caller's.
    pub(crate) async fn drive(&mut self, d: BlockDrive<'_>) -> anyhow::Result<ArmStats> {
        self.drive_observed(d, &mut |_| {})
            .await
            .map(|(stats, _)| stats)
    }

    /// [`Testbed::drive`], also handing every finished session to `observe` (in the
    /// order they finish) and returning the driver's own totals (classification time).
    ///
    /// An engine that dies is evidence, and the block goes on (docs/design.md 3.7,
    /// "Engine deaths"): after a death the engines are restarted (timed, their identity
    /// and effective values read again as at any restart) and the sessions the death
    /// cut short or kept from starting run on the new engine life at the same
    /// concurrency, until every session has run or the block has seen
    /// [`DEATH_BUDGET`](crate::core::deaths::DEATH_BUDGET) deaths; the block's stats
    /// pool its lives, so deaths count against every request served in the block.
    pub(crate) async fn drive_observed(
        &mut self,
        d: BlockDrive<'_>,
        observe: &mut (dyn FnMut(&SessionResult) + Send),
    ) -> anyhow::Result<(ArmStats, crate::driver::DriveStats)> {
        use crate::core::deaths::{DeathRestart, DEATH_BUDGET};
        let BlockDrive {
            block,
            workload,
            classifier,
            results,
        } = d;
        let probe_deaths = self
            .prove_tool_calls(workload, classifier, block.label)
            .await?;
        self.progress
            .arm_started(block, u64::from(workload.sessions));
        let drive_plan = self.drive_plan(block, workload);
        let block_started = Instant::now();
        let mut life = crate::driver::Life {
            life: 0,
            indices: (0..drive_plan.sessions).collect(),
            block_started,
            life_started: block_started,
        };
        let mut lives = Vec::new();
        let mut driven = crate::driver::DriveStats::default();
        let mut restarts = Vec::new();
        let mut deaths = probe_deaths.len();
        let mut unrun = 0;
        loop {
            let lived = self
                .drive_life(block, &drive_plan, &life, classifier, results, observe)
                .await;
            let (mut stats, life_driven, unfinished, ran) = match lived {
                Ok(lived) => lived,
                Err(e) => {
                    // A block cancelled or failed while driving held the engines for
                    // as long as it drove: its earlier lives and this one so far (the
                    // restarts between lives are the restarts' own).
                    self.spent.failed.drive_s +=
                        driven.wall_s + life.life_started.elapsed().as_secs_f64();
                    return Err(e);
                }
            };
            let died = !stats.deaths.is_empty();
            // A poisoned engine is told apart from load on the engine that failed: a
            // dead one is restarted anyway, and the restart clears what it carried.
            if !died {
                stats.canaries.extend(
                    self.canary(block, &drive_plan, &life, classifier, &ran)
                        .await?,
                );
            }
            deaths += stats.deaths.len();
            lives.push(stats);
            driven = if life.life == 0 {
                life_driven
            } else {
                crate::driver::DriveStats {
                    wall_s: driven.wall_s + life_driven.wall_s,
                    classify_s: driven.classify_s + life_driven.classify_s,
                    ..driven
                }
            };
            if !died || unfinished.is_empty() {
                break;
            }
            if deaths >= DEATH_BUDGET {
                unrun = unfinished.len() as u64;
                self.progress.note(&format!(
                    "warning: block {}-r{}: {deaths} engine deaths, the budget of {DEATH_BUDGET}: \
                     the block ends with {unrun} of its sessions not run",
                    block.label, block.repeat
                ));
                break;
            }
            self.check_cancelled()?;
            let at_s = block_started.elapsed().as_secs_f64();
            let restarting = Instant::now();
            let what = format!(
                "block {}-r{} after engine death {deaths}",
                block.label, block.repeat
            );
            let restarted = self
                .restart(&format!(
                    "{}-r{}-life{}",
                    block.label,
                    block.repeat,
                    life.life + 1
                ))
                .await
                .with_context(|| format!("restarting the engines for {what}"))?;
            restarted.refuse_disagreements(&what)?;
            restarts.push(DeathRestart {
                at_s,
                restart_s: restarting.elapsed().as_secs_f64(),
                sessions: unfinished.len() as u64,
            });
            self.progress.note(&format!(
                "{what}: engines restarted in {:.1} s; {} session{} go on on the new engine life",
                restarting.elapsed().as_secs_f64(),
                unfinished.len(),
                if unfinished.len() == 1 { "" } else { "s" }
            ));
            life = crate::driver::Life {
                life: life.life + 1,
                indices: unfinished,
                block_started,
                life_started: Instant::now(),
            };
        }
        let mut stats = ArmStats::pool(&lives);
        // The block's trend bins its sessions across its lives (core::trend orders them
        // by request index within their life), not life by life.
        stats.timeline = lives
            .iter()
            .flat_map(|l| l.timeline.iter().copied())
            .collect();
        stats.deaths = probe_deaths;
        stats
            .deaths
            .extend(lives.iter().flat_map(|l| l.deaths.iter().cloned()));
        stats.restarts = restarts;
        stats.unrun = unrun;
        stats.finish();
        self.spent.drive_s += driven.wall_s;
        self.spent.sessions += u64::from(drive_plan.sessions);
        // Concurrency 0 (or at least the sessions) starts them all at once: one wave. A
        // part wave counts whole, as the planned cost prices it (core::cost::plan).
        let in_flight = match drive_plan.concurrency {
            0 => drive_plan.sessions,
            c => c.min(drive_plan.sessions),
        };
        self.spent.waves += (f64::from(drive_plan.sessions) / f64::from(in_flight.max(1))).ceil();
        self.progress.arm_finished(block, &stats);
        Ok((stats, driven))
    }

    /// Session `index` alone (nothing else in flight) on the engines as they are, its
    /// result not written to sessions.jsonl; `None` if it was not run (cancelled).
    async fn alone(
        &mut self,
        block: BlockName<'_>,
        drive_plan: &DrivePlan,
        life: &crate::driver::Life,
        classifier: &Arc<Classifier>,
        index: u32,
    ) -> anyhow::Result<Option<SessionResult>> {
        let plan = DrivePlan {
            label: format!("{}-canary", block.label),
            concurrency: 1,
            sessions: 1,
            ..drive_plan.clone()
        };
        let alone = crate::driver::Life {
            indices: vec![index],
            ..life.clone()
        };
        let (tx, mut rx) = mpsc::channel::<SessionResult>(1);
        let driven = crate::driver::drive_life(
            &plan,
            &alone,
            classifier.clone(),
            tx,
            Arc::new(InFlight::default()),
            self.cancel.clone(),
        );
        let (driven, session) = tokio::join!(driven, rx.recv());
        driven?;
        self.check_cancelled()?;
        Ok(session)
    }

    /// One engine life of a block ([`Testbed::drive_observed`]): `life`'s sessions with
    /// the metrics poller and the death watch beside them. Returns the life's stats,
    /// the driver's totals, and the sessions still to run: those a death cut short
    /// (`crashed`) or kept from starting.
    async fn drive_life(
        &mut self,
        block: BlockName<'_>,
        drive_plan: &DrivePlan,
        life: &crate::driver::Life,
        classifier: &Arc<Classifier>,
        results: &ResultsDir,
        observe: &mut (dyn FnMut(&SessionResult) + Send),
    ) -> anyhow::Result<(ArmStats, crate::driver::DriveStats, Vec<u32>, Vec<Ran>)> {
        let inflight = Arc::new(InFlight::default());
        let witnesses = witness::Window::open(
            &self.watched_flags(),
            self.target.engine.name(),
            &self.role_access(),
            &self.probe_http,
        )
        .await;
        let poll_cancel = self.cancel.child_token();
        let poller = tokio::spawn(metrics::poll(
            self.metrics_endpoints(&witnesses),
            self.api_key.clone(),
            inflight.clone(),
            self.metrics_period,
            poll_cancel.clone(),
        ));
        let (watch, watch_cancel, watcher) = self.spawn_death_watch(&inflight, life.block_started);
        let (tx, rx) = mpsc::channel::<SessionResult>(256);
        let started = Instant::now();
        let driver = {
            let classifier = classifier.clone();
            let inflight = inflight.clone();
            let cancel = self.cancel.clone();
            let (plan, life) = (drive_plan.clone(), life.clone());
            tokio::spawn(async move {
                crate::driver::drive_life(&plan, &life, classifier, tx, inflight, cancel).await
            })
        };
        let mut done = std::collections::HashSet::new();
        let mut ran = Vec::new();
        let mut stats = self
            .collect_sessions(rx, &watch, results, &mut |session: &SessionResult| {
                if session.class != crate::core::session::SessionClass::Crashed {
                    done.insert(session.index);
                }
                if let Some(timing) = session.timing {
                    ran.push(Ran {
                        index: session.index,
                        class: session.class,
                        timing,
                    });
                }
                observe(session)
            })
            .await?;
        let driven = driver.await.context("workload driver panicked")??;
        watch_cancel.cancel();
        let _ = watcher.await;
        watch.poll().await;
        stats.deaths = watch.deaths();
        for death in &stats.deaths {
            self.progress.note(&format!(
                "warning: block {}-r{}: {}",
                block.label,
                block.repeat,
                death.describe()
            ));
        }
        stats.wall_s = driven
            .wall_s
            .max(started.elapsed().as_secs_f64().min(driven.wall_s.max(1e-9)));
        poll_cancel.cancel();
        let log = poller.await.context("metrics poller panicked")?;
        let lost = self.control.lost_logs();
        stats.mechanisms = witnesses.close(&log, &self.probe_http, &lost).await;
        self.record_load(block, &mut stats, &inflight, &driven, log, results)?;
        self.check_cancelled()?;
        // A role that died is evidence (its death), not a replaced engine.
        let died: Vec<&str> = stats.deaths.iter().map(|d| d.role.as_str()).collect();
        stats.engine_replaced = self.engines_replaced(&died).await;
        for line in &stats.engine_replaced {
            self.progress.note(&format!("warning: {line}"));
        }
        let unfinished = life
            .indices
            .iter()
            .copied()
            .filter(|i| !done.contains(i))
            .collect();
        Ok((stats, driven, unfinished, ran))
    }

    /// After a corrupted session, is the engine poisoned (core::poison)? One session
    /// alone on the same engine, no restart: a task that was clean on it before the
    /// first failure, where there is one. Corrupted alone, the same task alone once more
    /// on freshly restarted engines tells a poisoned engine from a task that corrupts
    /// without load. The canary's sessions are kept in the record (not in
    /// sessions.jsonl: they are not the block's sessions).
    async fn canary(
        &mut self,
        block: BlockName<'_>,
        drive_plan: &DrivePlan,
        life: &crate::driver::Life,
        classifier: &Arc<Classifier>,
        ran: &[Ran],
    ) -> anyhow::Result<Option<crate::core::poison::Canary>> {
        let Some(task) = crate::core::poison::canary_task(ran) else {
            return Ok(None);
        };
        let Some(session) = self
            .alone(block, drive_plan, life, classifier, task.index)
            .await?
        else {
            return Ok(None);
        };
        let fresh = if session.class.is_corrupted() {
            let label = format!("{}-r{}-canary", block.label, block.repeat);
            let restarted = self.restart(&label).await?;
            restarted.refuse_disagreements(&format!(
                "block {}-r{}'s canary",
                block.label, block.repeat
            ))?;
            let fresh = crate::driver::Life {
                life: life.life + 1,
                life_started: Instant::now(),
                ..life.clone()
            };
            self.alone(block, drive_plan, &fresh, classifier, task.index)
                .await?
                .map(|s| s.class)
        } else {
            None
        };
        let (before, after) = crate::core::poison::split(ran, &task.first_failure);
        let canary = crate::core::poison::Canary {
            life: life.life,
            first_failure: task.first_failure,
            index: task.index,
            chosen: task.chosen,
            class: session.class,
            evidence: session.evidence,
            fresh,
            before,
            after,
        };
        let line = format!(
            "block {}-r{}: {}",
            block.label,
            block.repeat,
            canary.describe()
        );
        self.progress.note(&if canary.poisoned() {
            format!("warning: {line}")
        } else {
            line
        });
        Ok(Some(canary))
    }

    /// The driver's plan for one block: this target's endpoint and the workload's sessions.
    fn drive_plan(&self, block: BlockName<'_>, workload: &Workload) -> DrivePlan {
        DrivePlan {
            api: self.target.api.clone(),
            model: self.target.model.clone(),
            api_key: self.api_key.clone(),
            workload: workload.clone(),
            label: block.label.to_string(),
            repeat: block.repeat,
            sessions: workload.sessions,
            concurrency: workload.target_concurrency(),
            oracle: self.oracle.clone(),
        }
    }

    /// Count `flag`'s mechanism at `value` in every block from now on, a flag this
    /// command does not write (the probe's `--mechanism`, read as the configs hold it).
    pub(crate) fn watch_mechanism(&mut self, flag: &FlagSpec, value: &str) {
        self.watched.retain(|(f, _)| f.name != flag.name);
        self.watched.push((flag.clone(), value.to_string()));
    }

    /// The flags this command A/Bs (written, not pinned) at their values now, and those
    /// it was asked to watch: whose mechanisms each block's witnesses count.
    fn watched_flags(&self) -> Vec<(FlagSpec, String)> {
        self.written
            .iter()
            .filter(|w| !w.pinned)
            .map(|w| (w.flag.clone(), w.value.clone()))
            .chain(self.watched.iter().cloned())
            .collect()
    }

    /// What each role's witnesses may read now: the log of a role bisect spawned (or
    /// follows with the role's `log` command), and the origin of its health URL.
    fn role_access(&self) -> Vec<witness::RoleAccess> {
        let logs = self.control.logs();
        self.target
            .roles
            .iter()
            .map(|r| witness::RoleAccess {
                role: r.name.clone(),
                log: logs
                    .iter()
                    .find(|(role, _)| *role == r.name)
                    .map(|(_, log)| log.clone()),
                origin: crate::config::engine::origin(&r.health).map(String::from),
            })
            .collect()
    }

    /// The metrics endpoints the poller scrapes: every role that names one, with the
    /// witness counters of `witnesses` on it.
    fn metrics_endpoints(&self, witnesses: &witness::Window) -> Vec<metrics::MetricsEndpoint> {
        self.target
            .roles
            .iter()
            .filter_map(|r| {
                r.metrics.clone().map(|url| metrics::MetricsEndpoint {
                    role: r.name.clone(),
                    url,
                    running_metric: r.running_metric.clone(),
                    queued_metric: r.queued_metric.clone(),
                    wait_gauges: r.wait_gauges.clone(),
                    counters: r.counters.clone(),
                    witnesses: witnesses.counters_of(&r.name),
                })
            })
            .collect()
    }

    /// Start the block's death watch (deaths.rs): spawned roles by their exit, the
    /// others by their health port refusing; polled beside the sessions and at each
    /// failed one. Returns the watch, the token that stops its poller, and the poller.
    fn spawn_death_watch(
        &self,
        inflight: &Arc<InFlight>,
        block_started: Instant,
    ) -> (
        Arc<deaths::DeathWatch>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let spawned = self.control.spawned();
        let others = self
            .target
            .roles
            .iter()
            .filter(|r| !spawned.iter().any(|s| s.role == r.name))
            .map(|r| (r.name.clone(), r.health.clone()))
            .collect();
        let watch = Arc::new(
            deaths::DeathWatch::new(spawned, others, inflight.clone()).timed_from(block_started),
        );
        let watch_cancel = self.cancel.child_token();
        let watcher = {
            let (watch, stop) = (watch.clone(), watch_cancel.clone());
            tokio::spawn(async move {
                loop {
                    watch.poll().await;
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            })
        };
        (watch, watch_cancel, watcher)
    }

    /// The one collector: owns the block's aggregate and the sessions.jsonl stream,
    /// judging each finished session against the death watch as it arrives.
    async fn collect_sessions(
        &self,
        mut rx: mpsc::Receiver<SessionResult>,
        watch: &deaths::DeathWatch,
        results: &ResultsDir,
        observe: &mut (dyn FnMut(&SessionResult) + Send),
    ) -> anyhow::Result<ArmStats> {
        let mut stats = ArmStats::default();
        let mut sessions_out = results.sessions_writer()?;
        let mut received = 0u64;
        while let Some(mut result) = rx.recv().await {
            watch.judge(&mut result).await;
            stats.add_session(&result);
            sessions_out.append(&result)?;
            observe(&result);
            self.progress.session_done(&result);
            received += 1;
            if received == 1 {
                crate::fault::pause("workload");
            }
        }
        Ok(stats)
    }

    /// Fold the poller's log and the driver's transport into the block's stats, warn
    /// of what was not measured, and append the log to `metrics.csv`.
    fn record_load(
        &self,
        block: BlockName<'_>,
        stats: &mut ArmStats,
        inflight: &InFlight,
        driven: &crate::driver::DriveStats,
        mut log: metrics::MetricsLog,
        results: &ResultsDir,
    ) -> anyhow::Result<()> {
        stats.peak_running = log
            .peak_running
            .iter()
            .map(|(role, peak)| (role.clone(), peak.round() as u64))
            .collect();
        stats.peak_running.insert("client".into(), inflight.peak());
        stats.transport = Some(driven.transport.clone());
        stats.load_gap = log.load_gap().filter(|gap| gap.is_material());
        stats.engine_counts = log.engine_counts();
        stats.busy_samples = log.busy_samples();
        for line in driven.transport.problems() {
            self.progress.note(&format!(
                "warning: block {}-r{}: {line}",
                block.label, block.repeat
            ));
        }
        stats.metrics_failed = log.all_failed();
        for (role, why) in &stats.metrics_failed {
            self.progress.note(&format!(
                "warning: no load measured for role {role} in block {}-r{}: {why}",
                block.label, block.repeat
            ));
        }
        log.set_label(&format!("{}-r{}", block.label, block.repeat));
        results.append_metrics(&log)?;
        Ok(())
    }

    /// Stop the engines and restore the launch configs byte for byte. Call on every
    /// path; [`Closed::combine`] orders the errors.
    pub async fn close(mut self) -> Closed {
        let stopped = self.control.stop().await;
        let restored = match self.editor.as_mut() {
            Some(editor) => {
                let restored = editor.restore();
                for kept in editor.take_kept() {
                    self.progress.note(&format!("warning: {kept}"));
                }
                restored
            }
            None => Ok(()),
        };
        Closed {
            stopped,
            restored,
            spent: self.spent,
        }
    }
}

/// The status and error text a record gets from its command's outcome.
pub fn settle<T>(outcome: &anyhow::Result<T>) -> (RecordStatus, Option<String>) {
    match outcome {
        Ok(_) => (RecordStatus::Finished, None),
        Err(e) => {
            let status = if matches!(e.downcast_ref::<Failure>(), Some(Failure::Interrupted)) {
                RecordStatus::Interrupted
            } else {
                RecordStatus::Failed
            };
            (status, Some(format!("{e:#}")))
        }
    }
}

/// A role's launch config as text; unreadable is bad input naming the file.
pub(crate) fn read_launch(role: &crate::config::RoleSpec) -> anyhow::Result<String> {
    std::fs::read_to_string(&role.launch).map_err(|e| {
        Failure::BadInput(Problem::message_only(format!(
            "{}: cannot read launch config of role {}: {e}",
            role.launch.display(),
            role.name
        )))
        .into()
    })
}

/// Refuse, before any edit, a flag whose setting also appears in the launch config of a
/// role it does not list (docs/design.md 3.3): flipping it would half-apply it.
pub(crate) fn refuse_half_applied(
    target: &TargetProfile,
    flags: &[&FlagSpec],
) -> anyhow::Result<()> {
    let mut texts = Vec::new();
    for role in &target.roles {
        texts.push((role.name.clone(), role.launch.clone(), read_launch(role)?));
    }
    for flag in flags {
        crate::launch::check_partial(flag, &texts)?;
    }
    Ok(())
}

/// `prefill=1, decode=1`.
pub(crate) fn fmt_readback(readback: &Readback) -> String {
    readback
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
