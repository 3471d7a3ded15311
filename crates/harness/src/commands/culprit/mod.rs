//! `bisect culprit --flags A,B,C [--budget SESSIONS]`: which of many flags causes the
//! corruption, on a fixed session budget.
//!
//! Each flag is flipped individually between its catalog `on` and `off` values, every
//! other flag held as in the launch configs, through exactly the protocol of `bisect run`
//! ([`crate::commands::run::run`]: journal, write and read back every role, restart, drive,
//! restore byte for byte). Every A/B pair is a normal run directory under
//! `<culprit dir>/flags/<FLAG>/` (screening) and `flags/<FLAG>-look<j>/` (extra looks), so
//! `bisect report` and `bisect diff` work on each.
//!
//! Refused before any edit (exit 2): an unknown flag, a flag given twice, fewer than two
//! flags, a half-applied flag, a budget too small for one screening pair per flag.
//!
//! Allocation and stopping rule ([`allocate`]):
//! 1. Screening: every flag gets one pair of n0 = max(8, round(budget / 4k)) sessions per
//!    arm (about half the budget).
//! 2. The rest of the budget is cut, in advance and independently of the data, into extra
//!    looks of min(n0, remaining / 2) sessions per arm while that is at least 8. L = 1 +
//!    their number bounds how many times a decision is taken.
//! 3. After every look, each flag's counts are pooled over its looks and assessed: a
//!    blocking confound (an arm over 10% error+timeout: "degraded, not a same-speed
//!    toggle"; a readback mismatch) makes it inconclusive and closes it; otherwise it is
//!    implicated when its Fisher p, Holm-adjusted across all k flags, is below alpha / L;
//!    cleared when the Newcombe 95% interval of the difference lies inside +-min_effect;
//!    else it stays open. A decided flag's status is frozen.
//! 4. The next extra look goes to the open flag with the smallest raw p (ties: fewest
//!    sessions, then the order given). The search stops when no flag is open or the looks
//!    are spent; whatever is still open is inconclusive with the sessions that would
//!    resolve it.
//!
//! Repeated looks at accumulating data inflate the type-I error: testing at alpha after
//! every look would implicate a harmless flag more often than alpha. The bound used here
//! is a Bonferroni split across looks on top of Holm across flags: at each of the at most
//! L looks the family of k flags is tested at alpha / L, so by the union bound the chance
//! of wrongly implicating any flag over the whole search stays at most alpha. It is
//! conservative (a group-sequential spending function would be sharper). Clearing is
//! judged on uncorrected 95% intervals at every look, so "cleared" carries the same
//! optimism as in `bisect run`, slightly more with several looks.
//!
//! Look j of a flag runs the workload with seed + j - 1: the tasks of a session index are
//! a function of the seed, so each look draws fresh sessions instead of replaying the same
//! ones (pooling replays would count one session several times).

pub mod allocate;
pub mod record;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::arm::settle;
use crate::commands::run::{self as experiment, Progress, RunPlan};
use crate::config::{FlagSpec, TargetProfile, Workload};
use crate::control::EngineControl;
use crate::core::arm_stats::{ArmLabel, ArmStats, RecordStatus};
use crate::core::verdict::{Policy, Severity, Status};
use crate::exit::Failure;
use crate::results::run_record::TargetInfo;
use allocate::{Assessment, Tally};
use record::{Culprit, CulpritRecord, FlagResult, Look, PooledArm, SCHEMA};

/// The budget when `--budget` is not given.
pub const DEFAULT_BUDGET: u64 = 640;

/// Everything `bisect culprit` needs, validated by [`CulpritPlan::validate`].
#[derive(Debug, Clone)]
pub struct CulpritPlan {
    pub id: String,
    pub command: String,
    pub flags: Vec<FlagSpec>,
    pub target: TargetProfile,
    /// The base workload; its `sessions` is replaced by each look's size.
    pub workload: Workload,
    /// Sessions, both arms and all flags together.
    pub budget: u64,
    pub policy: Policy,
    /// `results/<id>/`.
    pub dir: PathBuf,
    pub journal_dir: PathBuf,
    /// Where the target's state lives (lock, journal, spawned groups); `None`:
    /// `$XDG_STATE_HOME/bisect`. Tests point it into their temp dir.
    pub state_root: Option<PathBuf>,
    pub allow_partial: bool,
    pub api_key: Option<String>,
    pub metrics_period: Duration,
}

impl CulpritPlan {
    /// Refuse, before any edit, what cannot give a meaningful search (exit 2): the checks
    /// of [`check_request`], then a half-applied flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        check_request(&self.flags, self.budget)?;
        check_load(&self.workload, self.flags.len(), self.budget)?;
        if !self.allow_partial {
            let flags: Vec<&FlagSpec> = self.flags.iter().collect();
            crate::arm::refuse_half_applied(&self.target, &flags)?;
        }
        Ok(())
    }
}

/// The checks that need no launch config: at least two flags, none twice, and a budget
/// that pays one screening pair per flag.
pub fn check_request(flags: &[FlagSpec], budget: u64) -> Result<(), Failure> {
    let k = flags.len();
    if k < 2 {
        return Err(Failure::BadInput(format!(
            "culprit search needs at least 2 flags, got {k}\n  fix: pass --flags A,B[,C...], or use `bisect run --flag NAME` for one flag"
        )));
    }
    for (i, f) in flags.iter().enumerate() {
        if flags[..i].iter().any(|g| g.name == f.name) {
            return Err(Failure::BadInput(format!(
                "flag {} is given twice in --flags\n  fix: name each flag once",
                f.name
            )));
        }
    }
    let needed = allocate::screening_cost(budget, k);
    if budget < needed {
        return Err(Failure::BadInput(format!(
            "--budget {budget} is too small for one screening pair of {} sessions per arm for each of {k} flags ({needed} sessions)\n  fix: pass --budget {needed} or more, or fewer flags",
            allocate::MIN_SESSIONS_PER_ARM
        )));
    }
    Ok(())
}

/// Directory of look `look` (1-based) of `flag`, relative to the culprit directory.
/// Refuse a budget whose screening looks would run below the load the bug needs: a
/// search at a lower load than the failing configuration's can only answer "no
/// culprit" for a load-dependent bug (docs/design.md 3.10).
pub fn check_load(workload: &Workload, flags: usize, budget: u64) -> Result<(), Failure> {
    let load = u64::from(workload.target_concurrency());
    let n0 = allocate::screening_sessions_per_arm(budget, flags);
    if n0 < load {
        let needed = 4 * flags as u64 * load;
        return Err(Failure::BadInput(format!(
            "--budget {budget} gives each of {flags} flags a screening look of {n0} sessions per arm, below the load of {load} sessions in flight that the experiment runs at: a load-dependent bug would not reproduce\n  fix: pass --budget {needed} or more, or a lower --concurrency (the load at which the failure still reproduces)"
        )));
    }
    Ok(())
}

pub fn look_dir(flag: &str, look: u32) -> String {
    if look <= 1 {
        format!("flags/{flag}")
    } else {
        format!("flags/{flag}-look{look}")
    }
}

/// Run the search. Launch configs are restored after every A/B pair (by
/// [`experiment::run`]) and culprit.json is rewritten after each, so an interrupted search
/// keeps every finished pair.
pub async fn run(
    plan: &CulpritPlan,
    control: &mut dyn EngineControl,
    progress: &dyn Progress,
    cancel: CancellationToken,
) -> anyhow::Result<CulpritRecord> {
    plan.validate()?;
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("creating {}", plan.dir.display()))?;
    let k = plan.flags.len();
    let looks = allocate::max_looks(plan.budget, k);
    let mut record = CulpritRecord {
        schema: SCHEMA.into(),
        id: plan.id.clone(),
        command: plan.command.clone(),
        started_at: experiment::now(),
        finished_at: None,
        status: RecordStatus::Running,
        target: TargetInfo::of(&plan.target),
        workload: plan.workload.params_json(),
        budget: plan.budget,
        sessions_spent: 0,
        screening_sessions_per_arm: allocate::screening_sessions_per_arm(plan.budget, k),
        max_looks: looks,
        alpha: plan.policy.alpha,
        alpha_per_look: allocate::alpha_per_look(plan.policy.alpha, looks),
        min_effect: plan.policy.min_effect,
        flags: Vec::new(),
        culprits: Vec::new(),
        looks: Vec::new(),
        error: None,
    };
    let mut search = Search {
        plan,
        tallies: plan
            .flags
            .iter()
            .map(|f| Tally::new(&f.on, &f.off))
            .collect(),
        frozen: vec![None; k],
        pooled: vec![Default::default(); k],
    };
    search.summarise(&mut record);
    record.write(&plan.dir)?;

    let outcome = search
        .drive(control, progress, &cancel, &mut record, looks)
        .await;
    search.summarise(&mut record);
    record.finished_at = Some(experiment::now());
    (record.status, record.error) = settle(&outcome);
    record.write(&plan.dir)?;
    outcome?;
    Ok(record)
}

struct Search<'a> {
    plan: &'a CulpritPlan,
    tallies: Vec<Tally>,
    /// Per flag, `on` and `off` stats pooled over its looks.
    pooled: Vec<[ArmStats; 2]>,
    /// The assessment that decided a flag, kept as it was when it was taken.
    frozen: Vec<Option<Assessment>>,
}

impl Search<'_> {
    async fn drive(
        &mut self,
        control: &mut dyn EngineControl,
        progress: &dyn Progress,
        cancel: &CancellationToken,
        record: &mut CulpritRecord,
        looks: u32,
    ) -> anyhow::Result<()> {
        let k = self.plan.flags.len();
        let n0 = allocate::screening_sessions_per_arm(self.plan.budget, k);
        for i in 0..k {
            self.look(i, n0, control, progress, cancel, record).await?;
        }
        self.freeze_decided(looks);
        let load = u64::from(self.plan.workload.target_concurrency());
        // A look smaller than the load would run below it: such leftovers stay unspent.
        for size in allocate::extra_look_sizes(self.plan.budget, k)
            .into_iter()
            .filter(|&size| size >= load)
        {
            let assessments = self.assessments(looks);
            let frozen: Vec<bool> = self.frozen.iter().map(Option::is_some).collect();
            let Some(i) = allocate::next_flag(&self.tallies, &assessments, &frozen) else {
                progress.note("every flag is decided; the rest of the budget is not spent");
                break;
            };
            self.look(i, size, control, progress, cancel, record)
                .await?;
            self.freeze_decided(looks);
        }
        Ok(())
    }

    /// One more A/B pair of `sessions` per arm for flag `i`, pooled into its tally.
    async fn look(
        &mut self,
        i: usize,
        sessions: u64,
        control: &mut dyn EngineControl,
        progress: &dyn Progress,
        cancel: &CancellationToken,
        record: &mut CulpritRecord,
    ) -> anyhow::Result<()> {
        if cancel.is_cancelled() {
            return Err(Failure::Interrupted.into());
        }
        let flag = &self.plan.flags[i];
        let look = self.tallies[i].looks + 1;
        let mut workload = self.plan.workload.clone();
        // Every look runs at the experiment's load, whatever its sample size.
        workload.concurrency = Some(workload.target_concurrency());
        workload.sessions = u32::try_from(sessions).context("look size overflows u32")?;
        workload.seed = workload.seed.wrapping_add(u64::from(look - 1));
        let rel = look_dir(&flag.name, look);
        progress.note(&format!(
            "culprit: {} look {look}: {sessions} sessions per arm (seed {})",
            flag.name, workload.seed
        ));
        let run_plan = RunPlan {
            id: format!("{}-{}-look{look}", self.plan.id, flag.name),
            command: self.plan.command.clone(),
            flag: flag.clone(),
            target: self.plan.target.clone(),
            workload,
            repeats: 1,
            sets: Vec::new(),
            run_dir: self.plan.dir.join(&rel),
            journal_dir: self.plan.journal_dir.clone(),
            state_root: self.plan.state_root.clone(),
            policy: self.plan.policy,
            allow_partial: self.plan.allow_partial,
            api_key: self.plan.api_key.clone(),
            metrics_period: self.plan.metrics_period,
        };
        let seed = run_plan.workload.seed;
        let run = experiment::run_experiment(&run_plan, control, progress, cancel.clone())
            .await
            .with_context(|| {
                format!("{} look {look} ({})", flag.name, run_plan.run_dir.display())
            })?;
        let stats = |label| run.arm(label).map(|a| a.stats.clone()).unwrap_or_default();
        let (on, off) = (stats(ArmLabel::On), stats(ArmLabel::Off));
        let tally = &mut self.tallies[i];
        tally.add_look(&on.counts, &off.counts, self.plan.policy.degraded_fraction);
        let pooled = &mut self.pooled[i];
        *pooled = [
            ArmStats::pool([&pooled[0], &on]),
            ArmStats::pool([&pooled[1], &off]),
        ];
        if tally.blocked.is_none() {
            // Degraded arms are caught on pooled counts above; the other blocking
            // confounds (readback mismatch, differing workloads) come from the pair itself.
            tally.blocked = run
                .confounds
                .iter()
                .find(|c| c.severity == Severity::Blocking)
                .map(|c| format!("blocked: {}; given no more budget", c.note));
        }
        record.looks.push(Look {
            flag: flag.name.clone(),
            look,
            sessions_per_arm: sessions,
            seed,
            run_dir: rel,
            run_status: run.verdict.as_ref().map(|v| v.status),
        });
        self.summarise(record);
        record.write(&self.plan.dir)?;
        Ok(())
    }

    fn assessments(&self, looks: u32) -> Vec<Assessment> {
        allocate::assess(&self.tallies, &self.plan.policy, looks)
    }

    fn freeze_decided(&mut self, looks: u32) {
        let assessments = self.assessments(looks);
        for (slot, a) in self.frozen.iter_mut().zip(assessments) {
            if slot.is_none() && a.decided {
                *slot = Some(a);
            }
        }
    }

    /// Refresh the per-flag results, culprits and sessions spent in `record`. Frozen flags
    /// keep the status and reasons they were decided with; p-values are the current ones.
    fn summarise(&self, record: &mut CulpritRecord) {
        let current = self.assessments(record.max_looks);
        record.flags = self
            .plan
            .flags
            .iter()
            .zip(&self.tallies)
            .zip(current)
            .zip(&self.frozen)
            .zip(&self.pooled)
            .map(|((((flag, tally), now), frozen), pooled)| {
                let decided = frozen.as_ref().unwrap_or(&now);
                let mut reasons = decided.reasons.clone();
                if tally.looks == 0 {
                    reasons = vec!["not run".to_string()];
                }
                FlagResult {
                    name: flag.name.clone(),
                    on: flag.on.clone(),
                    off: flag.off.clone(),
                    arms: vec![
                        PooledArm::new(ArmLabel::On, &flag.on, pooled[0].clone()),
                        PooledArm::new(ArmLabel::Off, &flag.off, pooled[1].clone()),
                    ],
                    looks: tally.looks,
                    sessions: tally.sessions(),
                    p_value: now.p_value,
                    p_adjusted: now.p_adjusted,
                    rate_diff: now.rate_diff,
                    diff_ci95: now.diff_ci95,
                    status: if tally.looks == 0 {
                        Status::Inconclusive
                    } else {
                        decided.status
                    },
                    direction: decided.direction.clone(),
                    degraded: tally
                        .blocked
                        .as_deref()
                        .is_some_and(|b| b.starts_with("degraded")),
                    reasons,
                    runs: (1..=tally.looks).map(|j| look_dir(&flag.name, j)).collect(),
                }
            })
            .collect();
        record.culprits = record
            .flags
            .iter()
            .filter(|f| f.status == Status::Implicated)
            .map(|f| Culprit {
                flag: f.name.clone(),
                direction: f.direction.clone().unwrap_or_default(),
            })
            .collect();
        record.sessions_spent = self.tallies.iter().map(Tally::sessions).sum();
    }
}
