//! `bisect check --target FILE` (docs/design.md 3.13): validates a target profile
//! without touching anything. It owns the dry run of every catalog flag against every
//! launch config (the real editor's `write_setting` on the text in memory, then the
//! real read-back; nothing is written), the list of flags that do not apply, and the
//! URL checks (health, metrics with the preset's gauges, effective configuration, and
//! for llama.cpp whether `/props` says its chat template carries tool calls), each
//! failure a [`Problem`] with its fix in words. The profile and catalog are loaded by
//! the caller with the ordinary loaders, so a syntax error is the same `ConfigError`
//! (file, line, fix) every command gives.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::config::{line_of, Coverage, Engine, FlagCatalog, FlagSpec, RoleSpec, TargetProfile};
use crate::driver::metrics::parse_exposition;
use crate::launch::{check_partial, read_setting, setting_line, write_setting};
use crate::results::run_record;

/// What to check.
pub struct CheckPlan<'a> {
    pub target: &'a TargetProfile,
    pub catalog: &'a FlagCatalog,
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
    pub error: Option<String>,
}

/// One URL asked.
#[derive(Debug, Clone, Serialize)]
pub struct UrlCheck {
    pub role: String,
    /// `health`, `metrics`, `effective`, or `tools` (llama.cpp: does `/props` say its
    /// chat template carries tool calls).
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

    // The files as they are now are what every dry run below starts from: if a run
    // is editing them, or died with an arm's edits in them, "now" is not the original.
    let files: Vec<_> = target.roles.iter().map(|r| r.launch.clone()).collect();
    if let Some(journal) = crate::launch::pending_journal(&plan.state_root, &files) {
        problems.push(Problem {
            subject: "launch configs".into(),
            message: format!(
                "a bisect journal of edits to these launch configs exists ({}): a run on this target is in progress, or one died and left an arm's values in the files",
                journal.display()
            ),
            fix: "if no bisect is running on this target, `bisect restore` puts the original launch configs back; then check again".into(),
        });
    }

    let mut flags = Vec::new();
    let mut not_applying = Vec::new();
    for flag in &plan.catalog.flags {
        match FlagCatalog::coverage(flag, target) {
            Coverage::None => not_applying.push(NotApplying {
                name: flag.name.clone(),
                roles: flag.roles.clone(),
            }),
            coverage => flags.push(check_flag(
                flag,
                coverage,
                target,
                &texts,
                &mut problems,
                &mut notes,
            )),
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

    if let Some(var) = &plan.api_key_missing {
        let message = format!(
            "api_key_env names ${var}, which is not set: every command would refuse to run"
        );
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
    }
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

/// The program a restart command starts with (after `VAR=value` words), when this
/// machine does not have it: by path, or on `$PATH`.
fn missing_program(command: &str) -> Option<String> {
    let program = command.split_whitespace().find(|w| !w.contains('='))?;
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
    };
    (!found).then(|| program.to_string())
}

fn role_names(target: &TargetProfile) -> String {
    target
        .roles
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `LaunchError`'s text split into what is wrong and its `fix:` line.
fn split_fix(text: &str) -> (String, String) {
    match text.split_once("\n  fix: ") {
        Some((message, fix)) => (message.to_string(), fix.to_string()),
        None => (text.to_string(), String::new()),
    }
}

fn check_flag(
    flag: &FlagSpec,
    coverage: Coverage,
    target: &TargetProfile,
    texts: &[(String, std::path::PathBuf, String)],
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> FlagCheck {
    let subject = format!("flag {}", flag.name);
    let missing_roles = match &coverage {
        Coverage::Partial { missing } => missing.clone(),
        _ => Vec::new(),
    };
    if !missing_roles.is_empty() {
        problems.push(Problem {
            subject: subject.clone(),
            message: format!(
                "applies partially: it lists roles {} but the target has no role {} (its roles: {}); `bisect flags --target` lists it as not applying, and a run would flip it only where the target has the role",
                flag.roles.join(", "),
                missing_roles.join(", "),
                role_names(target)
            ),
            fix: format!(
                "add the missing role(s) to the profile, or list only the target's roles in {} (for a built-in flag, a copy in the profile's flags_dir)",
                flag.source.display()
            ),
        });
    }
    if let Err(e) = check_partial(flag, texts) {
        let (message, fix) = split_fix(&e.to_string());
        problems.push(Problem {
            subject: subject.clone(),
            message,
            fix,
        });
    }

    let mut edits = Vec::new();
    for (role, path, text) in texts {
        if !flag.roles.iter().any(|r| r == role) {
            continue;
        }
        let current = read_setting(text, &flag.setting, flag);
        let line = setting_line(text, &flag.setting);
        let mut arms = Vec::new();
        for (arm, value) in [("on", &flag.on), ("off", &flag.off)] {
            let edit = dry_run(flag, path, text, arm, value);
            if let Some(error) = &edit.error {
                let (message, fix) = split_fix(error);
                problems.push(Problem {
                    subject: format!("{subject} ({arm}, role {role})"),
                    message,
                    fix,
                });
            }
            arms.push(edit);
        }
        edits.push(RoleEdit {
            role: role.clone(),
            launch: path.display().to_string(),
            current,
            line,
            arms,
        });
    }

    // A key found in none of the launch configs is most often a misspelt name: bisect
    // would add it, the read-back would agree, and an engine that does not know the
    // name would run unchanged. A switch's absence is its `off` value, so only a note.
    if !edits.is_empty() && edits.iter().all(|e| e.line.is_none()) {
        let files: Vec<&str> = edits.iter().map(|e| e.launch.as_str()).collect();
        let key = flag.setting.key();
        if matches!(flag.setting, crate::config::Setting::Switch(_)) {
            notes.push(format!(
                "flag {}: switch {key} is absent from {} (reads as {}); the on arm adds it to the launch command",
                flag.name,
                files.join(", "),
                flag.off
            ));
        } else {
            problems.push(Problem {
                subject: subject.clone(),
                message: format!(
                    "{key} matches no line of {}: a run would add it, and an engine that does not know that name would run unchanged while the read-back agrees",
                    files.join(", ")
                ),
                fix: format!(
                    "check the spelling of {key} in {} against the engine's documentation, and set it explicitly (its default, {}) in each role's launch config so an edit replaces a line the engine reads",
                    flag.source.display(),
                    flag.on
                ),
            });
        }
    }

    FlagCheck {
        name: flag.name.clone(),
        kind: flag.setting.kind().into(),
        key: flag.setting.key().into(),
        on: flag.on.clone(),
        off: flag.off.clone(),
        roles: flag.roles.clone(),
        coverage: if missing_roles.is_empty() {
            "full".into()
        } else {
            "partial".into()
        },
        missing_roles,
        source: flag.source.display().to_string(),
        edits,
    }
}

/// One arm's edit computed with the real editor on the text in memory, then read back
/// the way a run reads back the file it wrote.
fn dry_run(flag: &FlagSpec, path: &Path, text: &str, arm: &str, value: &str) -> ArmEdit {
    let refused = |error: String| ArmEdit {
        arm: arm.into(),
        value: value.into(),
        change: "refused".into(),
        line: 0,
        before: Vec::new(),
        after: Vec::new(),
        error: Some(error),
    };
    let edited = match write_setting(text, flag, value, path) {
        Ok(edited) => edited,
        Err(e) => return refused(e.to_string()),
    };
    let found = read_setting(&edited, &flag.setting, flag);
    if found.as_deref() != Some(value) {
        let key = flag.setting.key();
        return refused(format!(
            "{}: after writing {key}={value}, reading it back gives {}\n  fix: check the launch config for a later or conditional setting of {key} that bisect cannot see, or set it by hand once",
            path.display(),
            found.map(|f| format!("{f:?}")).unwrap_or_else(|| "nothing".into())
        ));
    }
    let (line, before, after) = changed_lines(text, &edited);
    let change = match (before.is_empty(), after.is_empty()) {
        _ if edited == text => "unchanged",
        (true, false) => "insert",
        (false, true) => "remove",
        _ => "replace",
    };
    let (line, before, after) = if edited == text {
        // Nothing changes: show the line that already says so, where there is one.
        match setting_line(text, &flag.setting) {
            Some(l) => {
                let shown: Vec<String> = text
                    .lines()
                    .nth(l - 1)
                    .map(str::to_string)
                    .into_iter()
                    .collect();
                (l, shown.clone(), shown)
            }
            None => (0, Vec::new(), Vec::new()),
        }
    } else {
        (line, before, after)
    };
    ArmEdit {
        arm: arm.into(),
        value: value.into(),
        change: change.into(),
        line,
        before,
        after,
        error: None,
    }
}

/// The whole lines that differ between `old` and `new`: (first line number in `old`,
/// its lines, the lines replacing them). An insertion has no `old` lines; its number
/// is the line the new ones go before.
pub fn changed_lines(old: &str, new: &str) -> (usize, Vec<String>, Vec<String>) {
    let (a, b) = (old.as_bytes(), new.as_bytes());
    let mut prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    while !old.is_char_boundary(prefix) {
        prefix -= 1;
    }
    let room = a.len().min(b.len()) - prefix;
    let mut suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(room)
        .take_while(|(x, y)| x == y)
        .count();
    while !old.is_char_boundary(a.len() - suffix) || !new.is_char_boundary(b.len() - suffix) {
        suffix -= 1;
    }
    let start = old[..prefix].rfind('\n').map_or(0, |p| p + 1);
    let span_end = |text: &str, end: usize| {
        if end <= start || text.as_bytes()[end - 1] == b'\n' {
            end.max(start)
        } else {
            text[end..].find('\n').map_or(text.len(), |p| end + p + 1)
        }
    };
    let old_end = span_end(old, a.len() - suffix);
    let new_end = span_end(new, b.len() - suffix);
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.trim_end_matches('\r').to_string())
            .collect()
    };
    let (mut before, mut after) = (lines(&old[start..old_end]), lines(&new[start..new_end]));
    // Byte-level matching can start or end inside a line the edit left alone (a new
    // `export` line before `exec` shares its first letters): drop such whole lines.
    let mut line = line_of(old, start);
    while !before.is_empty() && !after.is_empty() && before[0] == after[0] {
        before.remove(0);
        after.remove(0);
        line += 1;
    }
    while !before.is_empty() && !after.is_empty() && before.last() == after.last() {
        before.pop();
        after.pop();
    }
    (line, before, after)
}

/// The line of `profile_text` where `needle` (a URL) first appears, for fixes.
fn profile_line(profile_text: &str, needle: &str) -> Option<usize> {
    profile_text
        .find(needle)
        .map(|at| line_of(profile_text, at))
}

/// What a GET answered: the status and body, or why there was no answer.
async fn get(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> Result<(u16, String), String> {
    let mut request = http.get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| describe(&e))?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|e| describe(&e))?;
    Ok((status, body))
}

/// A transport error in words (reqwest's own text nests the cause).
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "no answer before the timeout".into();
    }
    if e.is_connect() {
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    return "connection refused: nothing listens there".into();
                }
            }
            cause = c.source();
        }
        return format!("cannot connect: {e}");
    }
    format!("{e}")
}

fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => "the server wants an API key: set api_key_env in the profile and export that variable",
        404 => "nothing is served at that path: check the URL (llama-server needs --metrics for /metrics)",
        503 => "the engine answers but is not ready (still loading, or a peer such as prefill is down)",
        _ => "check the engine's log",
    }
}

#[allow(clippy::too_many_arguments)]
async fn check_role_urls(
    http: &reqwest::Client,
    plan: &CheckPlan<'_>,
    role: &RoleSpec,
    profile_text: &str,
    profile_path: &str,
    urls: &mut Vec<UrlCheck>,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    let key = plan.api_key.as_deref();
    let start_hint = match &role.restart {
        Some(cmd) => format!("start it (`{cmd}`)"),
        None => format!("start it (`sh {}`; a run spawns it itself, so a stopped role is only a problem for this check)", role.launch.display()),
    };
    let at = |url: &str| match profile_line(profile_text, url) {
        Some(line) => format!("{profile_path}:{line}"),
        None => profile_path.to_string(),
    };
    let mut record = |kind: &str, url: &str, result: Result<String, (String, String)>| {
        let (ok, detail) = match result {
            Ok(detail) => (true, detail),
            Err((message, fix)) => {
                problems.push(Problem {
                    subject: format!("role {} {kind}", role.name),
                    message: format!("{url}: {message}"),
                    fix,
                });
                (false, message)
            }
        };
        urls.push(UrlCheck {
            role: role.name.clone(),
            kind: kind.into(),
            url: url.into(),
            ok,
            detail,
        });
    };

    let health = match get(http, &role.health, key).await {
        Ok((status, _)) if (200..300).contains(&status) => Ok(format!("HTTP {status}")),
        Ok((status, _)) => Err((
            format!("HTTP {status}"),
            format!("{}; the health URL is at {}", status_hint(status), at(&role.health)),
        )),
        Err(why) => Err((
            why,
            format!(
                "{start_hint}, or correct the host/port of health at {} (--offline skips the URL checks)",
                at(&role.health)
            ),
        )),
    };
    let engine_up = health.is_ok();
    record("health", &role.health, health);

    if let Some(url) = &role.metrics {
        let result = match get(http, url, key).await {
            Ok((status, body)) if (200..300).contains(&status) => {
                let exposition = parse_exposition(&body);
                let has = |name: &str| exposition.samples.iter().any(|s| s.name == name);
                let missing: Vec<&str> = [&role.running_metric, &role.queued_metric]
                    .into_iter()
                    .map(String::as_str)
                    .filter(|m| !has(m))
                    .collect();
                if missing.is_empty() {
                    Ok(format!(
                        "HTTP {status}, {} = {}, {} = {}",
                        role.running_metric,
                        exposition.sum(&role.running_metric).unwrap_or(f64::NAN),
                        role.queued_metric,
                        exposition.sum(&role.queued_metric).unwrap_or(f64::NAN)
                    ))
                } else {
                    let mut similar: Vec<&str> = exposition
                        .samples
                        .iter()
                        .map(|s| s.name.as_str())
                        .filter(|n| {
                            ["running", "queue", "waiting", "processing", "deferred"]
                                .iter()
                                .any(|w| n.contains(w))
                        })
                        .collect();
                    similar.sort_unstable();
                    similar.dedup();
                    similar.truncate(6);
                    Err((
                        format!(
                            "HTTP {status}, but no {} among its {} samples (the {} preset's gauge{})",
                            missing.join(" or "),
                            exposition.samples.len(),
                            plan.target.engine,
                            if missing.len() > 1 { "s" } else { "" }
                        ),
                        format!(
                            "set engine to this role's serving engine, or name its gauges in the [[role]] table (running_metric = \"...\", queued_metric = \"...\"){}",
                            if similar.is_empty() {
                                String::new()
                            } else {
                                format!("; it exposes {}", similar.join(", "))
                            }
                        ),
                    ))
                }
            }
            Ok((status, _)) => Err((
                format!("HTTP {status}"),
                format!("{}; the metrics URL is at {}", status_hint(status), at(url)),
            )),
            Err(why) => Err((
                why,
                if engine_up {
                    format!(
                        "the engine answers health but not this: correct metrics at {}",
                        at(url)
                    )
                } else {
                    format!("{start_hint}, or correct metrics at {}", at(url))
                },
            )),
        };
        record("metrics", url, result);
    }

    // Filled while `record` holds `problems`; appended after the effective URL's row.
    let mut disagreements = Vec::new();
    let mut tool_support = None;
    if let Some(url) = &role.effective_url {
        let result = match get(http, url, key).await {
                Ok((status, body)) if (200..300).contains(&status) => {
                    match crate::core::effective::parse_document(&body) {
                        Some((doc, kind)) => {
                            compare_effective(plan, role, &doc, &mut disagreements, notes);
                            if plan.target.engine == Engine::Llamacpp {
                                tool_support = Some(llamacpp_tool_calls(role, &doc));
                            }
                            Ok(format!("HTTP {status}, {kind}"))
                        }
                        None => Err((
                            format!("HTTP {status}, but not JSON"),
                            format!(
                                "point effective_url at the engine's configuration document (SGLang: /get_server_info) at {}",
                                at(url)
                            ),
                        )),
                    }
                }
                Ok((status, _)) => Err((
                    format!("HTTP {status}"),
                    format!(
                        "{}; effective_url (or the {} preset's) at {} should name the engine's configuration document",
                        status_hint(status),
                        plan.target.engine,
                        at(url)
                    ),
                )),
                Err(why) => Err((
                    why,
                    if engine_up {
                        format!("the engine answers health but not this: correct effective_url at {}", at(url))
                    } else {
                        format!("{start_hint}, or correct effective_url at {}", at(url))
                    },
                )),
            };
        record("effective", url, result);
        if let Some(result) = tool_support {
            record("tools", url, result);
        }
    }
    problems.extend(disagreements);
}

/// llama-server's word on whether its chat template can carry tool calls: `/props`'
/// `chat_template_caps.supports_tool_calls`. Without it llama-server never shows the
/// model the tools and parses no call, so every session of a run would end `no_tool` or
/// `truncated` and nothing could be judged (issue 23: Gemma 3 270M's template, 0 judged
/// sessions per arm). The fix names the template the launch config passes, with its line.
fn llamacpp_tool_calls(
    role: &RoleSpec,
    doc: &serde_json::Value,
) -> Result<String, (String, String)> {
    const POINTER: &str = "/chat_template_caps/supports_tool_calls";
    match doc.pointer(POINTER).and_then(serde_json::Value::as_bool) {
        Some(true) => Ok("chat_template_caps.supports_tool_calls = true".into()),
        reported => {
            let said = match reported {
                Some(_) => "chat_template_caps.supports_tool_calls = false".to_string(),
                None => "no chat_template_caps.supports_tool_calls in /props (a llama-server without --jinja, or one too old to say)".to_string(),
            };
            let launch = std::fs::read_to_string(&role.launch).unwrap_or_default();
            let template = match chat_template_file(&launch) {
                Some((line, file)) => {
                    format!("the template {file} ({}:{line})", role.launch.display())
                }
                None => format!(
                    "the model's own template ({} passes no --chat-template-file)",
                    role.launch.display()
                ),
            };
            Err((
                format!("{said}: with {template} llama-server shows the model no tools and parses no tool call, so no session could be judged"),
                format!(
                    "give llama-server a chat template that renders the tools and the assistant's tool_calls, with `--jinja --chat-template-file FILE` in {} (targets/llama-cpp/qwen2.5-coder-tools.jinja is one, for Qwen2.5-Coder), then restart the role",
                    role.launch.display()
                ),
            ))
        }
    }
}

/// The `--chat-template-file` (or `LLAMA_ARG_CHAT_TEMPLATE_FILE`) a launch script
/// passes, with its 1-based line.
fn chat_template_file(launch: &str) -> Option<(usize, String)> {
    launch.lines().enumerate().find_map(|(i, line)| {
        let line = line.trim_start();
        if line.starts_with('#') {
            return None;
        }
        let value = if let Some(at) = line.find("--chat-template-file") {
            line[at + "--chat-template-file".len()..]
                .trim_start_matches(['=', ' '])
                .split_whitespace()
                .next()
        } else if let Some(at) = line.find("LLAMA_ARG_CHAT_TEMPLATE_FILE=") {
            line[at + "LLAMA_ARG_CHAT_TEMPLATE_FILE=".len()..]
                .split_whitespace()
                .next()
        } else {
            None
        }?;
        let value = value.trim_matches(['"', '\'']);
        (!value.is_empty()).then(|| (i + 1, value.to_string()))
    })
}

/// Where the running engine already reports a catalog flag, its value must be the one
/// its launch config sets: otherwise the engine is not running from that file (never
/// restarted since an edit, a dead conditional, a variable it ignores), and every arm
/// would be measured on something else.
fn compare_effective(
    plan: &CheckPlan<'_>,
    role: &RoleSpec,
    doc: &serde_json::Value,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    let Ok(text) = std::fs::read_to_string(&role.launch) else {
        return;
    };
    let mut reported = Vec::new();
    for flag in &plan.catalog.flags {
        if !flag.roles.iter().any(|r| r == &role.name) {
            continue;
        }
        let pointers = match role.effective_pointers.get(&flag.name) {
            Some(p) => vec![p.clone()],
            None => crate::core::effective::pointers(flag),
        };
        let Some(value) = crate::core::effective::reported_at(doc, &pointers) else {
            continue;
        };
        let Some(launch) = read_setting(&text, &flag.setting, flag) else {
            reported.push(format!("{}={value}", flag.name));
            continue;
        };
        if crate::core::effective::agrees(&launch, &value) {
            reported.push(format!("{}={value}", flag.name));
        } else {
            problems.push(Problem {
                subject: format!("role {} flag {}", role.name, flag.name),
                message: format!(
                    "the engine reports {}={value} but {} sets {launch}: it is not running from its launch config as it is now",
                    crate::core::effective::report_key(&flag.setting),
                    role.launch.display()
                ),
                fix: "restart the role so it runs its launch config, or find the later or conditional setting that overrides it (the engine's own report is what a run checks each arm against)".into(),
            });
        }
    }
    if !reported.is_empty() {
        notes.push(format!(
            "role {}: the engine reports {}, as its launch config says",
            role.name,
            reported.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_lines_names_the_whole_lines_of_a_replacement() {
        let old = "#!/bin/sh\nexport A=1\nexec srv --x 32 --y\n";
        let new = "#!/bin/sh\nexport A=0\nexec srv --x 32 --y\n";
        assert_eq!(
            changed_lines(old, new),
            (2, vec!["export A=1".into()], vec!["export A=0".into()])
        );
        let new = "#!/bin/sh\nexport A=1\nexec srv --x 64 --y\n";
        assert_eq!(
            changed_lines(old, new),
            (
                3,
                vec!["exec srv --x 32 --y".into()],
                vec!["exec srv --x 64 --y".into()]
            )
        );
    }

    #[test]
    fn changed_lines_of_an_insertion_and_a_removal() {
        let old = "#!/bin/sh\nexport A=1\nexec srv\n";
        let new = "#!/bin/sh\nexport A=1\nexport B=0\nexec srv\n";
        assert_eq!(
            changed_lines(old, new),
            (3, vec![], vec!["export B=0".into()])
        );
        // The new line shares its first letters with the line it goes before.
        let new = "#!/bin/sh\nexport A=1\nexport EXEC=1\nexec srv\n";
        assert_eq!(
            changed_lines(old, new),
            (3, vec![], vec!["export EXEC=1".into()])
        );
        // A removed continuation line.
        let old = "exec srv \\\n  --sw \\\n  --x 1\n";
        let new = "exec srv \\\n  --x 1\n";
        assert_eq!(
            changed_lines(old, new),
            (2, vec!["  --sw \\".into()], vec![])
        );
        // No trailing newline, CRLF kept out of the lines.
        let old = "export A=1\r\nexec srv";
        let new = "export A=1\r\nexec srv --sw";
        assert_eq!(
            changed_lines(old, new),
            (2, vec!["exec srv".into()], vec!["exec srv --sw".into()])
        );
    }

    /// A two-role target in `dir` with the embedded engine's launch scripts.
    fn target_in(dir: &Path) -> TargetProfile {
        let prefill = dir.join("prefill.sh");
        let decode = dir.join("decode.sh");
        std::fs::write(&prefill, crate::config::embedded::prefill_script("srv", 1)).unwrap();
        std::fs::write(&decode, crate::config::embedded::decode_script("srv", 2, 1)).unwrap();
        TargetProfile {
            name: "t".into(),
            api: "http://127.0.0.1:2/v1".into(),
            model: "m".into(),
            api_key_env: None,
            roles: vec![
                RoleSpec::new("prefill", prefill, "http://127.0.0.1:1/health".into(), None),
                RoleSpec::new("decode", decode, "http://127.0.0.1:2/health".into(), None),
            ],
            source: None,
            engine: Default::default(),
            markup: Vec::new(),
            flags_dir: None,
            rejections: Vec::new(),
            launch_scripts: Vec::new(),
        }
    }

    fn offline<'a>(
        target: &'a TargetProfile,
        catalog: &'a FlagCatalog,
        root: &Path,
    ) -> CheckPlan<'a> {
        CheckPlan {
            target,
            catalog,
            offline: true,
            api_key: None,
            api_key_missing: Some("SOME_KEY".into()),
            timeout: Duration::from_secs(1),
            state_root: root.to_path_buf(),
        }
    }

    #[tokio::test]
    async fn a_journal_left_for_the_target_is_a_problem_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let target = target_in(dir.path());
        let catalog = FlagCatalog::builtin();
        let root = dir.path().join("state");
        let before: Vec<String> = target
            .roles
            .iter()
            .map(|r| std::fs::read_to_string(&r.launch).unwrap())
            .collect();

        let report = check(&offline(&target, &catalog, &root)).await;
        assert!(report.passed(), "{:#?}", report.problems);
        assert_eq!(report.flags.len(), 6);
        // Offline, an unset api_key_env is a note, not a problem.
        assert!(report.notes.iter().any(|n| n.contains("$SOME_KEY")));
        // The check created no state of its own.
        assert!(!root.exists());

        let files: Vec<_> = target.roles.iter().map(|r| r.launch.clone()).collect();
        let canonical: Vec<_> = {
            let mut c: Vec<_> = files.iter().map(|f| f.canonicalize().unwrap()).collect();
            c.sort();
            c
        };
        let state = crate::launch::state_root_for_tests(&root, &canonical);
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join(crate::launch::JOURNAL_FILE), "{}").unwrap();
        let report = check(&offline(&target, &catalog, &root)).await;
        assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
        assert!(report.problems[0].fix.contains("bisect restore"));

        let after: Vec<String> = target
            .roles
            .iter()
            .map(|r| std::fs::read_to_string(&r.launch).unwrap())
            .collect();
        assert_eq!(before, after);
    }

    #[tokio::test]
    async fn a_half_applied_flag_is_a_problem_with_its_fix() {
        let dir = tempfile::tempdir().unwrap();
        let target = target_in(dir.path());
        // MMA_FLASHMLA lists decode only; setting it in prefill too would half-apply it.
        let prefill = &target.roles[0].launch;
        let text = std::fs::read_to_string(prefill).unwrap();
        std::fs::write(
            prefill,
            text.replace("exec ", "export SGLANG_SM120_MMA_FLASHMLA=1\nexec "),
        )
        .unwrap();
        let catalog = FlagCatalog::builtin();
        let mut plan = offline(&target, &catalog, dir.path());
        plan.api_key_missing = None;
        let report = check(&plan).await;
        assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
        let p = &report.problems[0];
        assert_eq!(p.subject, "flag MMA_FLASHMLA");
        assert!(
            p.message
                .contains("prefill.sh:6: SGLANG_SM120_MMA_FLASHMLA")
                && p.message.contains("which the flag does not list"),
            "{p:?}"
        );
        assert!(p.fix.contains("--allow-partial"), "{p:?}");
    }

    /// A server that wants `Bearer KEY` on /health and /metrics; its metrics use vLLM's
    /// names, its /server_info reports bf16 index-K.
    async fn keyed_server() -> std::net::SocketAddr {
        use crate::test_http::authed;
        use axum::http::{HeaderMap, StatusCode};
        use axum::routing::get;
        let app = axum::Router::new()
            .route(
                "/health",
                get(|h: HeaderMap| async move {
                    if authed(&h) {
                        StatusCode::OK
                    } else {
                        StatusCode::UNAUTHORIZED
                    }
                }),
            )
            .route(
                "/metrics",
                get(|h: HeaderMap| async move {
                    if authed(&h) {
                        (
                            StatusCode::OK,
                            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 0\n",
                        )
                    } else {
                        (StatusCode::UNAUTHORIZED, "")
                    }
                }),
            )
            .route(
                "/server_info",
                get(|| async {
                    axum::Json(serde_json::json!({"flags": {"SGLANG_DSV4_BF16_INDEX_K": "1"}}))
                }),
            );
        crate::test_http::serve(app).await
    }

    #[tokio::test]
    async fn urls_are_asked_with_the_key_and_a_missing_gauge_names_the_ones_there() {
        let addr = keyed_server().await;
        let dir = tempfile::tempdir().unwrap();
        let mut target = target_in(dir.path());
        for role in &mut target.roles {
            role.health = format!("http://{addr}/health");
            role.metrics = Some(format!("http://{addr}/metrics"));
            role.effective_url = Some(format!("http://{addr}/server_info"));
            role.running_metric = "vllm:num_requests_running".into();
            // The SGLang name on a vLLM server: the gauge a wrong preset would expect.
            role.queued_metric = "sglang:num_queue_reqs".into();
        }
        let catalog = FlagCatalog::builtin();
        let mut plan = offline(&target, &catalog, dir.path());
        plan.offline = false;
        plan.api_key_missing = None;
        plan.api_key = Some(crate::test_http::KEY.into());

        let report = check(&plan).await;
        let kinds: Vec<(&str, &str, bool)> = report
            .urls
            .iter()
            .map(|u| (u.role.as_str(), u.kind.as_str(), u.ok))
            .collect();
        assert_eq!(
            kinds,
            [
                ("prefill", "health", true),
                ("prefill", "metrics", false),
                ("prefill", "effective", true),
                ("decode", "health", true),
                ("decode", "metrics", false),
                ("decode", "effective", true)
            ]
        );
        assert_eq!(report.problems.len(), 2, "{:#?}", report.problems);
        let p = &report.problems[0];
        assert_eq!(p.subject, "role prefill metrics");
        assert!(
            p.message
                .contains("no sglang:num_queue_reqs among its 2 samples"),
            "{p:?}"
        );
        assert!(
            p.fix.contains("queued_metric") && p.fix.contains("vllm:num_requests_waiting"),
            "{p:?}"
        );
        assert!(
            report.notes.iter().any(|n| n
                == "role decode: the engine reports BF16_INDEX_K=1, as its launch config says"),
            "{:#?}",
            report.notes
        );

        // Without the key the server refuses, and the fix says what it wants.
        plan.api_key = None;
        let report = check(&plan).await;
        let health = &report.problems[0];
        assert_eq!(health.subject, "role prefill health");
        assert!(health.message.ends_with("HTTP 401"), "{health:?}");
        assert!(health.fix.contains("api_key_env"), "{health:?}");
    }

    #[test]
    fn a_restart_program_this_machine_lacks_is_named() {
        assert_eq!(missing_program("sh -c true"), None);
        assert_eq!(
            missing_program("FOO=1 no-such-program-here restart x"),
            Some("no-such-program-here".into())
        );
        assert_eq!(
            missing_program("/no/such/kubectl rollout"),
            Some("/no/such/kubectl".into())
        );
    }

    #[test]
    fn dry_run_refuses_what_the_read_back_would() {
        let flag = FlagCatalog::builtin().get("BF16_INDEX_K").unwrap().clone();
        let text = "export SGLANG_DSV4_BF16_INDEX_K=1\nexec srv\n";
        let e = dry_run(&flag, Path::new("p.sh"), text, "off", "0");
        assert_eq!(e.change, "replace");
        assert_eq!(e.before, vec!["export SGLANG_DSV4_BF16_INDEX_K=1"]);
        assert_eq!(e.after, vec!["export SGLANG_DSV4_BF16_INDEX_K=0"]);
        let e = dry_run(&flag, Path::new("p.sh"), text, "on", "1");
        assert_eq!((e.change.as_str(), e.line), ("unchanged", 1));
        let bad = dry_run(&flag, Path::new("p.sh"), text, "off", "0 1");
        assert_eq!(bad.change, "refused");
        assert!(bad.error.unwrap().contains("fix:"));
    }

    /// A llama-server stand-in whose `/props` says whether its template carries tool
    /// calls (`None`: no `chat_template_caps` at all).
    async fn llama_server(tools: Option<bool>) -> std::net::SocketAddr {
        use axum::routing::get;
        let props = match tools {
            Some(t) => serde_json::json!({"chat_template_caps": {"supports_tool_calls": t}}),
            None => serde_json::json!({"total_slots": 4}),
        };
        let app = axum::Router::new()
            .route("/health", get(|| async { "{\"status\":\"ok\"}" }))
            .route(
                "/metrics",
                get(|| async { "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n" }),
            )
            .route(
                "/props",
                get(move || {
                    let props = props.clone();
                    async move { axum::Json(props) }
                }),
            );
        crate::test_http::serve(app).await
    }

    #[tokio::test]
    async fn a_llama_server_without_tool_calls_fails_naming_its_template() {
        let dir = tempfile::tempdir().unwrap();
        let serve = dir.path().join("serve.sh");
        std::fs::write(
            &serve,
            "#!/bin/sh\n# --chat-template-file commented.jinja\nexport LLAMA_ARG_N_PARALLEL=4\nexec \"$LLAMA_SERVER\" --jinja \\\n    --chat-template-file gemma3.jinja --metrics\n",
        )
        .unwrap();
        let catalog = FlagCatalog::builtin();
        for (tools, ok) in [(Some(true), true), (Some(false), false), (None, false)] {
            let addr = llama_server(tools).await;
            let preset = Engine::Llamacpp.preset();
            let mut role = RoleSpec::new(
                "server",
                serve.clone(),
                format!("http://{addr}/health"),
                Some(format!("http://{addr}/metrics")),
            );
            role.running_metric = preset.running_metric.into();
            role.queued_metric = preset.queued_metric.into();
            role.effective_url = Some(format!("http://{addr}/props"));
            let target = TargetProfile {
                name: "llama".into(),
                api: format!("http://{addr}/v1"),
                model: "m".into(),
                api_key_env: None,
                roles: vec![role],
                source: None,
                engine: Engine::Llamacpp,
                markup: Vec::new(),
                rejections: Vec::new(),
                flags_dir: None,
                launch_scripts: Vec::new(),
            };
            let mut plan = offline(&target, &catalog, dir.path());
            plan.offline = false;
            plan.api_key_missing = None;
            let report = check(&plan).await;
            let tools_row = report.urls.iter().find(|u| u.kind == "tools");
            assert_eq!(tools_row.map(|u| u.ok), Some(ok), "{:#?}", report.urls);
            // The builtin catalog has no flag for a role named "server" (a problem of its
            // own); only the tools check's problem is this test's.
            let tools: Vec<&Problem> = report
                .problems
                .iter()
                .filter(|p| p.subject.ends_with(" tools"))
                .collect();
            assert_eq!(tools.is_empty(), ok, "{:#?}", report.problems);
            if !ok {
                let p = tools[0];
                assert_eq!(p.subject, "role server tools");
                assert!(
                    p.message.contains("gemma3.jinja") && p.message.contains("serve.sh:5"),
                    "{p:?}"
                );
                assert!(p.fix.contains("--chat-template-file"), "{p:?}");
            }
        }
        assert_eq!(
            chat_template_file("exec srv --chat-template-file=t.jinja"),
            Some((1, "t.jinja".into()))
        );
        assert_eq!(
            chat_template_file("export LLAMA_ARG_CHAT_TEMPLATE_FILE=\"t.jinja\""),
            Some((1, "t.jinja".into()))
        );
    }
}
