//! The URL checks of `bisect check` (docs/design.md 3.13): each role's health, metrics
//! (with the preset's running and queued gauges), effective configuration (agreeing with
//! the launch config), and what the engine says of its tool-call parsing (llama.cpp:
//! whether its chat template carries tool calls; SGLang: its `tool_call_parser`).
//! Each answer is a [`UrlCheck`] row; each failure also a [`Problem`] with its fix.

use super::{CheckPlan, Problem, UrlCheck};
use crate::config::{line_of, Engine, RoleSpec};
use crate::driver::metrics::parse_exposition;
use crate::launch::read_setting;

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

/// An answer to one URL check: its detail, or what is wrong and the fix.
type UrlResult = Result<String, (String, String)>;

/// One role's URLs as [`check_role_urls`] asks them: the client, the key, and where the
/// profile names each URL, for the fixes.
struct RoleProbe<'p> {
    http: &'p reqwest::Client,
    plan: &'p CheckPlan<'p>,
    role: &'p RoleSpec,
    key: Option<&'p str>,
    profile_text: &'p str,
    profile_path: &'p str,
    /// How to start the role, for the fix of a URL nothing answers.
    start_hint: String,
}

impl RoleProbe<'_> {
    /// `profile.toml:12` where the profile names `url`, else the profile.
    fn at(&self, url: &str) -> String {
        match profile_line(self.profile_text, url) {
            Some(line) => format!("{}:{line}", self.profile_path),
            None => self.profile_path.to_string(),
        }
    }

    /// The fix when `url` did not answer: the engine is down, or the URL is wrong.
    fn unanswered_fix(&self, engine_up: bool, field: &str, url: &str) -> String {
        if engine_up {
            format!(
                "the engine answers health but not this: correct {field} at {}",
                self.at(url)
            )
        } else {
            format!(
                "{}, or correct {field} at {}",
                self.start_hint,
                self.at(url)
            )
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn check_role_urls(
    http: &reqwest::Client,
    plan: &CheckPlan<'_>,
    role: &RoleSpec,
    profile_text: &str,
    profile_path: &str,
    urls: &mut Vec<UrlCheck>,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    let start_hint = match &role.restart {
        Some(cmd) => format!("start it (`{cmd}`)"),
        None => format!("start it (`sh {}`; a run spawns it itself, so a stopped role is only a problem for this check)", role.launch.display()),
    };
    let probe = RoleProbe {
        http,
        plan,
        role,
        key: plan.api_key.as_deref(),
        profile_text,
        profile_path,
        start_hint,
    };
    let mut record = |kind: &str, url: &str, result: UrlResult| {
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

    let health = health_result(&probe).await;
    let engine_up = health.is_ok();
    record("health", &role.health, health);

    if let Some(url) = &role.metrics {
        record("metrics", url, metrics_result(&probe, url, engine_up).await);
    }

    // Filled while `record` holds `problems`; appended after the effective URL's row.
    let mut disagreements = Vec::new();
    if let Some(url) = &role.effective_url {
        let (result, tool_support) =
            effective_result(&probe, url, engine_up, &mut disagreements, notes).await;
        record("effective", url, result);
        if let Some(result) = tool_support {
            record("tools", url, result);
        }
    }
    problems.extend(disagreements);
}

/// Whether the role's health URL answers 2xx.
async fn health_result(probe: &RoleProbe<'_>) -> UrlResult {
    let role = probe.role;
    match get(probe.http, &role.health, probe.key).await {
        Ok((status, _)) if (200..300).contains(&status) => Ok(format!("HTTP {status}")),
        Ok((status, _)) => Err((
            format!("HTTP {status}"),
            format!(
                "{}; the health URL is at {}",
                status_hint(status),
                probe.at(&role.health)
            ),
        )),
        Err(why) => Err((
            why,
            format!(
                "{}, or correct the host/port of health at {} (--offline skips the URL checks)",
                probe.start_hint,
                probe.at(&role.health)
            ),
        )),
    }
}

/// Whether the role's metrics URL answers with the running and queued gauges.
async fn metrics_result(probe: &RoleProbe<'_>, url: &str, engine_up: bool) -> UrlResult {
    match get(probe.http, url, probe.key).await {
        Ok((status, body)) if (200..300).contains(&status) => {
            gauges_result(probe.plan, probe.role, status, &body)
        }
        Ok((status, _)) => Err((
            format!("HTTP {status}"),
            format!(
                "{}; the metrics URL is at {}",
                status_hint(status),
                probe.at(url)
            ),
        )),
        Err(why) => Err((why, probe.unanswered_fix(engine_up, "metrics", url))),
    }
}

/// Whether a metrics exposition carries the role's running and queued gauges; when not,
/// the fix names the gauges it has that look like them.
fn gauges_result(plan: &CheckPlan<'_>, role: &RoleSpec, status: u16, body: &str) -> UrlResult {
    let exposition = parse_exposition(body);
    let has = |name: &str| exposition.samples.iter().any(|s| s.name == name);
    let missing: Vec<&str> = [&role.running_metric, &role.queued_metric]
        .into_iter()
        .map(String::as_str)
        .filter(|m| !has(m))
        .collect();
    if missing.is_empty() {
        return Ok(format!(
            "HTTP {status}, {} = {}, {} = {}",
            role.running_metric,
            exposition.gauge(&role.running_metric).unwrap_or(f64::NAN),
            role.queued_metric,
            exposition.gauge(&role.queued_metric).unwrap_or(f64::NAN)
        ));
    }
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

/// Whether the role's effective-config URL answers with a configuration document; the
/// flags it reports are compared with the launch config (disagreements into
/// `disagreements`), and for llama.cpp the second result says whether its chat template
/// carries tool calls.
async fn effective_result(
    probe: &RoleProbe<'_>,
    url: &str,
    engine_up: bool,
    disagreements: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> (UrlResult, Option<UrlResult>) {
    let (plan, role) = (probe.plan, probe.role);
    let mut tool_support = None;
    let mut answer = get(probe.http, url, probe.key).await;
    // An SGLang from before `/server_info` serves only the deprecated `/get_server_info`:
    // asked there, and said.
    let legacy = crate::config::engine::legacy_effective_url(url);
    if let (Ok((404, _)), Some(old)) = (&answer, &legacy) {
        if let Ok((status, body)) = get(probe.http, old, probe.key).await {
            if (200..300).contains(&status) {
                notes.push(format!(
                    "role {}: {url} answered 404 and the deprecated {old} answered: an SGLang from before /server_info (a newer one serves only /server_info)",
                    role.name
                ));
                answer = Ok((status, body));
            }
        }
    }
    let result = match answer {
        Ok((status, body)) if (200..300).contains(&status) => {
            match crate::core::effective::parse_document(&body) {
                Some((doc, kind)) => {
                    compare_effective(plan, role, &doc, disagreements, notes);
                    if plan.target.engine == Engine::Llamacpp {
                        tool_support = Some(llamacpp_tool_calls(role, &doc));
                    }
                    if let Some(parser) =
                        super::toolcalls::sglang_parser(plan.target.engine, role, &doc)
                    {
                        tool_support = Some(parser);
                    }
                    Ok(format!("HTTP {status}, {kind}"))
                }
                None => Err((
                    format!("HTTP {status}, but not JSON"),
                    format!(
                        "point effective_url at the engine's configuration document (SGLang: /server_info, or /get_server_info before it) at {}",
                        probe.at(url)
                    ),
                )),
            }
        }
        Ok((status, _)) => Err((
            format!(
                "HTTP {status}{}",
                legacy
                    .as_deref()
                    .filter(|_| status == 404)
                    .map_or(String::new(), |old| format!(" (and {old} too)"))
            ),
            format!(
                "{}; effective_url (or the {} preset's) at {} should name the engine's configuration document (SGLang: /server_info, or /get_server_info before it; vLLM: /metrics; llama.cpp: /props)",
                status_hint(status),
                plan.target.engine,
                probe.at(url)
            ),
        )),
        Err(why) => Err((why, probe.unanswered_fix(engine_up, "effective_url", url))),
    };
    (result, tool_support)
}

/// llama-server's word on whether its chat template can carry tool calls: `/props`'
/// `chat_template_caps.supports_tool_calls`. Without it llama-server never shows the
/// model the tools and parses no call, so every session of a run would end `no_tool` or
/// `truncated` and nothing could be judged (issue 23: Gemma 3 270M's template, 0 judged
/// sessions per arm). The fix names the template the launch config passes, with its line.
pub(super) fn llamacpp_tool_calls(
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
pub(super) fn chat_template_file(launch: &str) -> Option<(usize, String)> {
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
pub(super) fn compare_effective(
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
        let pointer = role.effective_pointers.get(&flag.name);
        let Some(value) = crate::core::effective::reported_for(doc, flag, pointer) else {
            continue;
        };
        let Some(launch) = read_setting(&text, &flag.setting, flag) else {
            reported.push(format!("{}={value}", flag.name));
            continue;
        };
        let agrees = |v: &str| crate::core::effective::agrees(v, &value);
        if agrees(&launch) {
            reported.push(format!("{}={value}", flag.name));
        } else if !agrees(&flag.on) && !agrees(&flag.off) {
            // Neither arm's value: no restart will make it take effect (vLLM on CPU
            // replaces the attention backend), and a run refuses its first arm.
            problems.push(Problem {
                subject: format!("role {} flag {}", role.name, flag.name),
                message: format!(
                    "the engine reports {}={value}, neither of the flag's values (on {}, off {}) while {} sets {launch}: this engine puts its own value in place, so a run of {} is refused before its sessions",
                    crate::core::effective::report_key(&flag.setting),
                    flag.on,
                    flag.off,
                    role.launch.display(),
                    flag.name
                ),
                fix: "check whether this engine build honours the setting at all (its start log says what it chose), or leave the flag out of the hunt on this engine".into(),
            });
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

/// The line of `profile_text` where `needle` (a URL) first appears, for fixes.
fn profile_line(profile_text: &str, needle: &str) -> Option<usize> {
    profile_text
        .find(needle)
        .map(|at| line_of(profile_text, at))
}
