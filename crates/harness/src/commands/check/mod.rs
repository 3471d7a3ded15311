//! `bisect check --target FILE` (docs/design.md 3.13): validates a target profile
//! without touching anything. It owns the dry run of every catalog flag against every
//! launch config (the real editor's `write_setting` on the text in memory, then the
//! real read-back; nothing is written), the list of flags that do not apply, and the
//! URL checks (health, metrics with the preset's gauges, effective configuration, what
//! the engine says of its tool-call parsing), the tool-call probe (of three sessions'
//! first rounds through the target's API, one must come back as parsed `tool_calls`;
//! the others, as text or without a call, are a note), each failure a [`Problem`] with
//! its fix in words. The profile and catalog are loaded by
//! the caller with the ordinary loaders, so a syntax error is the same `ConfigError`
//! (file, line, fix) every command gives.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::config::{Coverage, FlagCatalog, RoleSpec, TargetProfile};
use crate::results::run_record;

/// What to check.
pub struct CheckPlan<'a> {
    pub target: &'a TargetProfile,
    pub catalog: &'a FlagCatalog,
    /// The workload whose sessions' first rounds the tool-call probe sends (its tools, request
    /// options and classifier); `None` skips the probe.
    pub workload: Option<&'a crate::config::Workload>,
    /// Skip the URL checks (CI, or a profile written before its engines exist).
    pub offline: bool,
    /// The key `api_key_env` names; `None` also when that variable is unset (then
    /// `api_key_missing` names it).
    pub api_key: Option<String>,
    pub api_key_missing: Option<String>,
    /// Per URL: an engine that is down must not hang the check.
    pub timeout: Duration,
    /// Where bisect keeps per-target state (`launch::state_root()`), to find a journal
    /// of edits a run left in the launch configs.
    pub state_root: std::path::PathBuf,
}

/// One failed check: what it concerns, what is wrong, and how to fix it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub subject: String,
    pub message: String,
    pub fix: String,
}

impl Problem {
    /// A refusal's problem (what is wrong and its fix, apart) about `subject`.
    pub(crate) fn of(subject: String, problem: crate::exit::Problem) -> Problem {
        Problem {
            subject,
            message: problem.message,
            fix: problem.fix.unwrap_or_default(),
        }
    }
}

/// The outcome of `bisect check`; `problems` empty means every check passed.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub profile: String,
    pub name: String,
    pub engine: String,
    pub roles: Vec<RoleInfo>,
    /// Catalog flags with at least one of their roles in the target, in catalog order.
    pub flags: Vec<FlagCheck>,
    /// Catalog flags none of whose roles the target has (as `bisect flags --target`).
    pub not_applying: Vec<NotApplying>,
    pub offline: bool,
    /// Empty with `--offline`.
    pub urls: Vec<UrlCheck>,
    /// Things worth knowing that do not fail the check.
    pub notes: Vec<String>,
    pub problems: Vec<Problem>,
}

/// A role as the check reports it: what a run records of it (`run.json`'s
/// `target.roles`, the one [`run_record::RoleInfo`], so the two cannot drift), and,
/// beside its metrics URL, the queued gauge the metrics check also looks for.
#[derive(Debug, Clone, Serialize)]
pub struct RoleInfo {
    #[serde(flatten)]
    pub recorded: run_record::RoleInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_metric: Option<String>,
}

impl RoleInfo {
    fn of(role: &RoleSpec) -> RoleInfo {
        RoleInfo {
            recorded: run_record::RoleInfo::of(role),
            queued_metric: role.metrics.as_ref().map(|_| role.queued_metric.clone()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct NotApplying {
    pub name: String,
    pub roles: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlagCheck {
    pub name: String,
    pub kind: String,
    pub key: String,
    pub on: String,
    pub off: String,
    pub roles: Vec<String>,
    /// `full`, or `partial` with the listed roles the target lacks in `missing_roles`.
    pub coverage: String,
    pub missing_roles: Vec<String>,
    pub source: String,
    /// One per listed role the target has.
    pub edits: Vec<RoleEdit>,
    /// The flag's mechanism and its witnesses for this engine, each with whether it
    /// can be read now (commands/check/witness.rs).
    pub mechanism: Vec<String>,
}

/// How the flag would be written into one role's launch config.
#[derive(Debug, Clone, Serialize)]
pub struct RoleEdit {
    pub role: String,
    pub launch: String,
    /// The value the launch config has now (a switch: `on` present, `off` absent).
    pub current: Option<String>,
    /// Where the setting is now, when the launch config sets it.
    pub line: Option<usize>,
    /// The `on` arm, then the `off` arm.
    pub arms: Vec<ArmEdit>,
}

/// One arm's edit of one launch config, as the lines it changes.
#[derive(Debug, Clone, Serialize)]
pub struct ArmEdit {
    pub arm: String,
    pub value: String,
    /// `unchanged`, `replace`, `insert`, `remove`, or `refused` (then `error` says why).
    pub change: String,
    /// The first line changed (in the file as it is; for `insert`, where the new lines go).
    pub line: usize,
    pub before: Vec<String>,
    pub after: Vec<String>,
    /// Why the editor refused it (`change` is `refused`); written as the text it prints.
    pub error: Option<crate::exit::Problem>,
}

/// One URL asked.
#[derive(Debug, Clone, Serialize)]
pub struct UrlCheck {
    pub role: String,
    /// `health`, `metrics`, `effective`, `tools` (what the engine says of its tool-call
    /// parsing: llama.cpp's `/props`, SGLang's `tool_call_parser`), `tool_calls` (the
    /// probe: does a session's first round come back as parsed calls; role `api`), or
    /// `logprobs` (does the engine serve log-probabilities, and is it batch-invariant:
    /// what the solo oracle can judge with; informative, never a problem).
    pub kind: String,
    pub url: String,
    pub ok: bool,
    pub detail: String,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Runs every check of `plan`. Never writes a file and never restarts anything: the
/// edits are computed on the launch configs' text in memory.
pub async fn check(plan: &CheckPlan<'_>) -> CheckReport {
    let target = plan.target;
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let profile_text = target
        .source
        .as_deref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let profile_path = target
        .source
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "(built-in profile)".into());

    let texts = read_launch_configs(target, &profile_path, &mut problems);
    problems.extend(pending_journal_problem(plan));
    let (flags, not_applying) = check_flags(plan, &texts, &mut problems, &mut notes);
    check_api_key(plan, &profile_path, &mut problems, &mut notes);

    let mut urls = Vec::new();
    if !plan.offline {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(plan.timeout)
            .build()
            .expect("a client with a timeout builds");
        for role in &target.roles {
            check_role_urls(
                &http,
                plan,
                role,
                &profile_text,
                &profile_path,
                &mut urls,
                &mut problems,
                &mut notes,
            )
            .await;
        }
        for role in &target.roles {
            notes.push(identity_note(&http, plan, role).await);
        }
        if let Some(workload) = plan.workload {
            toolcalls::probe_row(plan, workload, &mut urls, &mut problems, &mut notes).await;
            if urls.last().is_some_and(|u| u.kind == "tool_calls" && u.ok) {
                let (row, warning) = toolcalls::logprobs_row(plan, workload, &http).await;
                urls.push(row);
                notes.extend(warning);
            }
        }
    }
    notes.extend(role_notes(target));
    let witness_http = (!plan.offline).then(|| {
        reqwest::Client::builder()
            .no_proxy()
            .timeout(plan.timeout)
            .build()
            .expect("a client with a timeout builds")
    });
    let mut flags = flags;
    for f in &mut flags {
        if let Some(spec) = plan.catalog.flags.iter().find(|s| s.name == f.name) {
            f.mechanism = witness::lines(spec, target, witness_http.as_ref()).await;
        }
    }

    CheckReport {
        profile: profile_path,
        name: target.name.clone(),
        engine: target.engine.to_string(),
        roles: target.roles.iter().map(RoleInfo::of).collect(),
        flags,
        not_applying,
        offline: plan.offline,
        urls,
        notes,
        problems,
    }
}

/// Every role's launch config as (role, path, text); one that cannot be read is a
/// problem.
fn read_launch_configs(
    target: &TargetProfile,
    profile_path: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(String, PathBuf, String)> {
    let mut texts = Vec::new();
    for role in &target.roles {
        match std::fs::read_to_string(&role.launch) {
            Ok(text) => texts.push((role.name.clone(), role.launch.clone(), text)),
            Err(e) => problems.push(Problem {
                subject: format!("role {}", role.name),
                message: format!(
                    "{}: cannot read the launch config: {e}",
                    role.launch.display()
                ),
                fix: format!(
                    "make {} readable by this user, or point launch at the role's launch config in {profile_path}",
                    role.launch.display()
                ),
            }),
        }
    }
    texts
}

/// The files as they are now are what every dry run starts from: if a run is editing
/// them, or died with an arm's edits in them, "now" is not the original.
fn pending_journal_problem(plan: &CheckPlan<'_>) -> Option<Problem> {
    let files: Vec<_> = plan.target.roles.iter().map(|r| r.launch.clone()).collect();
    let journal = crate::launch::pending_journal(&plan.state_root, &files)?;
    Some(Problem {
        subject: "launch configs".into(),
        message: format!(
            "a bisect journal of edits to these launch configs exists ({}): a run on this target is in progress, or one died and left an arm's values in the files",
            journal.display()
        ),
        fix: "if no bisect is running on this target, `bisect restore` puts the original launch configs back; then check again".into(),
    })
}

/// The dry run of every catalog flag that applies to the target, and the flags that do
/// not; a catalog of which none applies is a problem.
fn check_flags(
    plan: &CheckPlan<'_>,
    texts: &[(String, PathBuf, String)],
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> (Vec<FlagCheck>, Vec<NotApplying>) {
    let target = plan.target;
    let mut flags = Vec::new();
    let mut not_applying = Vec::new();
    for flag in &plan.catalog.flags {
        match FlagCatalog::coverage(flag, target) {
            Coverage::None => not_applying.push(NotApplying {
                name: flag.name.clone(),
                roles: flag.roles.clone(),
            }),
            coverage => flags.push(check_flag(flag, coverage, target, texts, problems, notes)),
        }
    }
    if flags.is_empty() {
        problems.push(Problem {
            subject: "flag catalog".into(),
            message: format!(
                "no flag of the catalog applies to this target (its roles: {}): there is nothing to flip",
                role_names(target)
            ),
            fix: "give the profile a flags_dir of flag files whose roles name this target's roles (see targets/*/flags/), or pass --flags-dir DIR".into(),
        });
    }
    (flags, not_applying)
}

/// An `api_key_env` whose variable is not set: a problem, or only a note with
/// `--offline`.
fn check_api_key(
    plan: &CheckPlan<'_>,
    profile_path: &str,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    let Some(var) = &plan.api_key_missing else {
        return;
    };
    let message =
        format!("api_key_env names ${var}, which is not set: every command would refuse to run");
    if plan.offline {
        notes.push(format!("{message} (not a problem with --offline)"));
    } else {
        problems.push(Problem {
            subject: "api key".into(),
            message,
            fix: format!("export {var}=... (the key the engines were started with), or remove api_key_env from {profile_path}"),
        });
    }
}

/// Which process the role is, and what a run's "the same engine served the block" rests
/// on for it (docs/design.md 3.12): the identity source a run would use.
async fn identity_note(http: &reqwest::Client, plan: &CheckPlan<'_>, role: &RoleSpec) -> String {
    let identity =
        crate::control::identity::identify(http, role, plan.api_key.as_deref(), None).await;
    if identity.is_known() {
        format!(
            "role {}: which process it is comes from {} ({}): a restart and a replacement during a block are told by it",
            role.name,
            identity.source.describe(),
            identity.text()
        )
    } else {
        format!(
            "role {}: nothing says which process it is (no pid or start time in its self-report, no Process-Start-Time-Unix header, not listening on this host): a run proves its restarts only by health going down, and a replacement during a block that never blinks health would go unseen",
            role.name
        )
    }
}

/// What a run from here could not do with each role, as notes: a restart program this
/// machine lacks, no effective-config URL, no metrics URL.
fn role_notes(target: &TargetProfile) -> Vec<String> {
    let mut notes = Vec::new();
    for role in &target.roles {
        if let Some(program) = role.restart.as_deref().and_then(missing_program) {
            notes.push(format!(
                "role {}: the restart command's program `{program}` is not on this machine's PATH: a run from here would fail at the first restart (fine where bisect runs on the serving host)",
                role.name
            ));
        }
        if role.effective_url.is_none() {
            notes.push(format!(
                "role {}: no effective-config URL (the {} preset knows of none): only the launch-file read-back says what it runs with; set effective_url where the engine reports its configuration",
                role.name, target.engine
            ));
        }
        if role.metrics.is_none() {
            notes.push(format!(
                "role {}: no metrics URL, so its running requests are not measured (a cleared verdict needs the load reached on some role)",
                role.name
            ));
        }
    }
    notes
}

/// The program a restart command starts with (after `VAR=value` words), when this
/// machine does not have it: by path, or on `$PATH`.
fn missing_program(command: &str) -> Option<String> {
    let program = command.split_whitespace().find(|w| !w.contains('='))?;
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        on_path(program)
    };
    (!found).then(|| program.to_string())
}

/// Whether `program` is a file in one of `$PATH`'s folders.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

pub(super) fn role_names(target: &TargetProfile) -> String {
    target
        .roles
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub mod export;
mod flags;
mod toolcalls;
mod urls;
mod witness;

#[cfg(test)]
use flags::changed_lines;
use flags::check_flag;
use urls::check_role_urls;

#[cfg(test)]
mod tests;
