//! Target profiles (docs/design.md 3.2): where the engine's API, launch configs, restart
//! commands and health/metrics endpoints are. Without `--target` the CLI builds the
//! embedded profile. This module owns the profile file format and its validation;
//! `engine = "..."` fills per-role defaults from the preset table in `engine.rs`.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::engine::Engine;
use super::{read_text, ConfigError, Source};
use crate::core::classify::rejection::{self, BadRejection, RejectionPattern};
use crate::core::classify::{MarkupFamily, RejectionSet};
use crate::core::effective::EffectivePointer;

#[derive(Debug, Clone, PartialEq)]
pub struct TargetProfile {
    pub name: String,
    /// OpenAI-compatible base URL, e.g. `http://127.0.0.1:8000/v1`.
    pub api: String,
    pub model: String,
    /// Name of the environment variable holding the API key; the key itself is never written.
    pub api_key_env: Option<String>,
    pub roles: Vec<RoleSpec>,
    /// The profile file (None for the built-in embedded profile).
    pub source: Option<PathBuf>,
    /// The engine preset the roles' defaults came from (`custom` when none was named).
    pub engine: Engine,
    /// Tool-call markup families counted as leaks (the preset's unless `markup = [...]`).
    pub markup: Vec<MarkupFamily>,
    /// The profile's own flag catalog (`flags_dir`, relative to the profile), loaded
    /// after the built-in flags and before any `--flags-dir`.
    pub flags_dir: Option<PathBuf>,
    /// Error replies that are the engine rejecting the model's tool call (class
    /// `rejected`): the preset's, as the profile's `[[reject]]` tables amend them.
    pub rejections: Vec<RejectionPattern>,
    /// Launch scripts this profile brings with it (path, contents): the embedded
    /// engine's, generated for each results directory. Written by
    /// [`TargetProfile::write_launch_scripts`] when the command starts, never while the
    /// command line is parsed; empty for a profile loaded from a file.
    pub launch_scripts: Vec<(PathBuf, String)>,
    /// This replica set's name where the target lists several (`replica_name`, default
    /// `a`); `None` on a single replica.
    pub replica: Option<String>,
    /// The other replica sets (`[[replica]]`): each the same roles with launch configs,
    /// ports and restart commands of its own (docs/design.md 3.2, "Replicas").
    pub replicas: Vec<ReplicaSet>,
}

/// One more replica set of a target: the same roles as the profile's own, on engines of
/// their own.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSet {
    pub name: String,
    /// Its OpenAI-compatible base URL.
    pub api: String,
    pub roles: Vec<RoleSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoleSpec {
    pub name: String,
    /// Launch config, resolved relative to the profile file.
    pub launch: PathBuf,
    /// Restart command; without it bisect spawns `sh LAUNCH` itself.
    pub restart: Option<String>,
    /// With a restart command: a command that prints the role's log from now on until
    /// stopped (`journalctl -u UNIT -f -n 0 -o cat`, `kubectl logs -f deploy/NAME`),
    /// followed into the run's logs after every restart, so log witnesses can read it.
    pub log: Option<String>,
    pub health: String,
    pub metrics: Option<String>,
    pub health_timeout_s: u64,
    /// How long the restart command may run before it is killed (its process group).
    pub restart_timeout_s: u64,
    /// Where the engine reports its effective configuration (a JSON document); `None`
    /// probes `/server_info` then `/get_server_info` beside the health URL.
    pub effective_url: Option<String>,
    /// Flag name -> where its value is in that document (a JSON pointer, and the engine's
    /// words for on and off where they are not the flag's); a flag not listed is looked
    /// up at `/flags/KEY` then `/KEY` (docs/design.md 3.2).
    pub effective_pointers: BTreeMap<String, EffectivePointer>,
    /// Whether engines bisect starts for this role (spawned or by `restart`) inherit
    /// the API key's environment variable; by default it is removed from theirs.
    pub pass_api_key: bool,
    /// Prometheus gauge of requests running in this role (the engine preset's unless
    /// the role sets `running_metric`).
    pub running_metric: String,
    /// Prometheus gauge of requests queued in this role.
    pub queued_metric: String,
    /// The role's prefill/decode hand-over queues (its engine preset's), named in the
    /// load gap's words, and the parts of its queue by reason.
    pub wait_gauges: Vec<crate::core::transport::WaitGauge>,
    /// The engine's own counters read over each block (its preset's).
    pub counters: Vec<(String, crate::core::engine_counts::EngineCounter)>,
}

impl RoleSpec {
    /// A role with the `custom` preset's defaults (tests and built-in targets).
    pub fn new(name: &str, launch: PathBuf, health: String, metrics: Option<String>) -> Self {
        let preset = Engine::Custom.preset();
        RoleSpec {
            name: name.to_string(),
            launch,
            restart: None,
            log: None,
            health,
            metrics,
            health_timeout_s: DEFAULT_HEALTH_TIMEOUT_S,
            restart_timeout_s: DEFAULT_RESTART_TIMEOUT_S,
            running_metric: preset.running_metric.to_string(),
            queued_metric: preset.queued_metric.to_string(),
            effective_url: None,
            effective_pointers: BTreeMap::new(),
            pass_api_key: false,
            wait_gauges: Vec::new(),
            counters: Vec::new(),
        }
    }
}

/// How long a role may take to answer /health after a restart unless the profile says.
pub(crate) const DEFAULT_HEALTH_TIMEOUT_S: u64 = 600;

/// How long a role's restart command may run unless the profile says.
pub(crate) const DEFAULT_RESTART_TIMEOUT_S: u64 = 300;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Spanned<String>,
    api: Spanned<String>,
    model: Spanned<String>,
    api_key_env: Option<Spanned<String>>,
    engine: Option<Spanned<String>>,
    markup: Option<Spanned<Vec<String>>>,
    flags_dir: Option<Spanned<String>>,
    #[serde(default)]
    reject: Vec<Spanned<RawReject>>,
    #[serde(default)]
    role: Vec<Spanned<RawRole>>,
    replica_name: Option<Spanned<String>>,
    #[serde(default)]
    replica: Vec<Spanned<RawReplica>>,
}

/// `[[replica]]`: another replica set, with its own `[[replica.role]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    name: Spanned<String>,
    api: Spanned<String>,
    #[serde(default)]
    role: Vec<Spanned<RawRole>>,
}

/// `[[reject]]`: a rejection pattern of the profile's own, or one that replaces
/// (same name) or turns off (`off = true`) one of the preset's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReject {
    name: Spanned<String>,
    status: Option<Spanned<i64>>,
    body: Option<Spanned<String>>,
    #[serde(default)]
    off: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    name: Spanned<String>,
    launch: Spanned<String>,
    restart: Option<Spanned<String>>,
    log: Option<Spanned<String>>,
    health: Spanned<String>,
    metrics: Option<Spanned<String>>,
    health_timeout_s: Option<Spanned<i64>>,
    restart_timeout_s: Option<Spanned<i64>>,
    effective_url: Option<Spanned<String>>,
    #[serde(default)]
    effective_pointers: BTreeMap<String, Spanned<RawPointer>>,
    #[serde(default)]
    pass_api_key: bool,
    engine: Option<Spanned<String>>,
    running_metric: Option<Spanned<String>>,
    queued_metric: Option<Spanned<String>>,
}

const PROFILE_FIX: &str = "see docs/design.md 3.2: name, api, model, optional api_key_env, engine, markup, flags_dir, [[reject]] tables (name, status, body, off), then one [[role]] table per engine role (name, launch, health, optional restart and log, metrics, health_timeout_s, restart_timeout_s, engine, running_metric, queued_metric, effective_url, effective_pointers, pass_api_key); for replicas, optional replica_name (the profile's own set, default \"a\") and [[replica]] tables (name, api, then [[replica.role]] tables like [[role]])";

fn parse_engine(src: &Source, v: &Spanned<String>) -> Result<Engine, ConfigError> {
    v.get_ref().parse::<Engine>().map_err(|e| {
        src.invalid(
            v.span(),
            e.to_string(),
            "set engine to the serving engine (sglang, vllm, llamacpp, embedded), or custom and name running_metric / queued_metric / effective_url per role",
        )
    })
}

/// A Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
fn metric_name(src: &Source, key: &str, v: &Spanned<String>) -> Result<String, ConfigError> {
    let name = v.get_ref().trim();
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !valid {
        return Err(src.invalid(
            v.span(),
            format!("{key} = {name:?} is not a Prometheus metric name"),
            format!(
                "name the gauge as /metrics writes it, e.g. {key} = \"vllm:num_requests_running\""
            ),
        ));
    }
    Ok(name.to_string())
}

/// Checks an endpoint URL: plain http only, because this build has no TLS.
fn check_url(src: &Source, key: &str, url: &Spanned<String>) -> Result<String, ConfigError> {
    let u = url.get_ref().trim();
    if let Some(rest) = u.strip_prefix("http://") {
        if rest.is_empty() || rest.starts_with('/') {
            return Err(src.invalid(
                url.span(),
                format!("{key} = {u:?} has no host"),
                format!("write {key} as http://HOST:PORT/..., e.g. http://127.0.0.1:30000/health"),
            ));
        }
        return Ok(u.to_string());
    }
    if u.starts_with("https://") {
        return Err(src.invalid(
            url.span(),
            format!("{key} = {u:?} uses https://, but this build of bisect has no TLS support"),
            "use the engine's plain http:// endpoint (e.g. from the serving host, or through an ssh tunnel: ssh -L 8000:127.0.0.1:8000 HOST)",
        ));
    }
    Err(src.invalid(
        url.span(),
        format!("{key} = {u:?} is not an http:// URL"),
        format!("write {key} as http://HOST:PORT/..., e.g. http://127.0.0.1:30000/health"),
    ))
}

fn non_empty(
    src: &Source,
    key: &str,
    v: &Spanned<String>,
    example: &str,
) -> Result<String, ConfigError> {
    let s = v.get_ref().trim();
    if s.is_empty() {
        return Err(src.invalid(
            v.span(),
            format!("{key} is empty"),
            format!("set {key}, e.g. {key} = {example:?}"),
        ));
    }
    Ok(s.to_string())
}

const REJECT_FIX: &str = "a [[reject]] table names an error reply that is the engine refusing the model's tool call: name = \"...\", status = 500 (optional: any non-2xx when absent), body = \"a regular expression its body matches\" (Rust regex syntax; in a TOML \"...\" string a regex backslash is written \\\\, in a '...' string as it is); or name = \"<a preset pattern>\" with off = true to turn that one off";

/// The preset's rejection patterns amended by the profile's `[[reject]]` tables: a
/// table with a preset pattern's name replaces it (or, with `off = true`, removes it);
/// any other is added. Every regex is compiled here, so a bad one is refused at its line.
fn rejections(
    src: &Source,
    engine: Engine,
    tables: &[Spanned<RawReject>],
) -> Result<Vec<RejectionPattern>, ConfigError> {
    let mut patterns = engine.rejections();
    let mut seen = HashSet::new();
    for table in tables {
        let t = table.get_ref();
        let line_of = |e: BadRejection| src.invalid(table.span(), e.to_string(), REJECT_FIX);
        let name = non_empty(src, "reject name", &t.name, "llamacpp.format")?;
        if !seen.insert(name.clone()) {
            return Err(src.invalid(
                t.name.span(),
                format!("[[reject]] {name:?} is defined twice"),
                "give every [[reject]] table a distinct name",
            ));
        }
        let at = patterns.iter().position(|p| p.name == name);
        if t.off {
            if t.status.is_some() || t.body.is_some() {
                return Err(src.invalid(
                    table.span(),
                    format!("[[reject]] {name:?} has off = true and a status or body"),
                    "write off = true alone to turn a preset pattern off, or status and body without off to define one",
                ));
            }
            let Some(at) = at else {
                let known: Vec<&str> = patterns.iter().map(|p| p.name.as_str()).collect();
                return Err(src.invalid(
                    t.name.span(),
                    format!(
                        "[[reject]] {name:?} turns off a pattern the {engine} preset does not have (it has: {})",
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ),
                    "name one of the preset's patterns, or remove the table",
                ));
            };
            patterns.remove(at);
            continue;
        }
        let Some(body) = &t.body else {
            return Err(src.invalid(
                table.span(),
                format!("[[reject]] {name:?} has no body pattern"),
                REJECT_FIX,
            ));
        };
        let status = match &t.status {
            None => None,
            Some(v) => match u16::try_from(*v.get_ref()) {
                Ok(s) => Some(s),
                Err(_) => {
                    return Err(src.invalid(
                        v.span(),
                        format!("[[reject]] {name:?}: status = {} is not an HTTP status", v.get_ref()),
                        "give the error status the engine answers with (400-599), or leave status out to match any",
                    ))
                }
            },
        };
        let pattern = RejectionPattern::new(&name, status, body.get_ref());
        rejection::check(&pattern).map_err(line_of)?;
        RejectionSet::new(std::slice::from_ref(&pattern))
            .map_err(|e| src.invalid(body.span(), e.to_string(), REJECT_FIX))?;
        match at {
            Some(at) => patterns[at] = pattern,
            None => patterns.push(pattern),
        }
    }
    Ok(patterns)
}

/// `api_key_env`: the name of the variable that holds the key, never the key itself.
fn api_key_env(src: &Source, raw: &RawProfile) -> Result<Option<String>, ConfigError> {
    let Some(v) = &raw.api_key_env else {
        return Ok(None);
    };
    let var = v.get_ref().trim();
    let valid = var
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(src.invalid(
            v.span(),
            format!("api_key_env = {var:?} is not an environment variable name"),
            "name the variable that holds the key (api_key_env = \"OPENAI_API_KEY\"), never the key itself",
        ));
    }
    Ok(Some(var.to_string()))
}

/// The markup families that count as leaks: the profile's list without repeats, else
/// the engine preset's.
fn markup(
    src: &Source,
    engine: Engine,
    raw: &RawProfile,
) -> Result<Vec<MarkupFamily>, ConfigError> {
    let Some(list) = &raw.markup else {
        return Ok(engine.preset().markup.to_vec());
    };
    let mut families = Vec::new();
    for name in list.get_ref() {
        let family = name.parse::<MarkupFamily>().map_err(|e| {
            src.invalid(
                list.span(),
                e.to_string(),
                "list the tool-call markup families to count as leaks, e.g. markup = [\"dsml\", \"hermes\"]",
            )
        })?;
        if !families.contains(&family) {
            families.push(family);
        }
    }
    Ok(families)
}

/// `flags_dir`, resolved relative to the profile's directory; it must be a directory.
fn flags_dir(src: &Source, base: &Path, raw: &RawProfile) -> Result<Option<PathBuf>, ConfigError> {
    let Some(v) = &raw.flags_dir else {
        return Ok(None);
    };
    let dir = base.join(non_empty(src, "flags_dir", v, "flags")?);
    if !dir.is_dir() {
        return Err(src.invalid(
            v.span(),
            format!(
                "flags_dir {} is not a directory (resolved relative to this profile's directory)",
                dir.display()
            ),
            "point flags_dir at the directory of this target's flag files (*.toml), or remove it",
        ));
    }
    Ok(Some(dir))
}

/// One `[[role]]` table, checked; the profile's `engine` is the default of its own.
fn role(
    src: &Source,
    base: &Path,
    engine: Engine,
    r: &RawRole,
    role_name: String,
) -> Result<RoleSpec, ConfigError> {
    let launch = launch_path(src, base, r, &role_name)?;
    let restart = match &r.restart {
        None => None,
        Some(cmd) => Some(non_empty(
            src,
            "restart",
            cmd,
            "systemctl restart sglang-prefill",
        )?),
    };
    let log = match (&r.log, &restart) {
        (None, _) => None,
        (Some(cmd), None) => {
            return Err(src.invalid(
                cmd.span(),
                format!(
                    "role {role_name}: `log` applies to a role started by its `restart` command"
                ),
                "drop `log`: bisect captures the output of the roles it spawns itself",
            ))
        }
        (Some(cmd), Some(_)) => Some(non_empty(
            src,
            "log",
            cmd,
            "journalctl -u sglang-prefill -f -n 0 -o cat",
        )?),
    };
    let health = check_url(src, "health", &r.health)?;
    let metrics = match &r.metrics {
        None => None,
        Some(m) => Some(check_url(src, "metrics", m)?),
    };
    let health_timeout_s = positive_seconds(
        src,
        "health_timeout_s",
        &r.health_timeout_s,
        DEFAULT_HEALTH_TIMEOUT_S,
        "give seconds to wait for /health after a restart",
    )?;
    let restart_timeout_s = positive_seconds(
        src,
        "restart_timeout_s",
        &r.restart_timeout_s,
        DEFAULT_RESTART_TIMEOUT_S,
        "give seconds the restart command may run before it is killed",
    )?;
    let effective_pointers = effective_pointers(src, r)?;
    let role_engine = match &r.engine {
        None => engine,
        Some(v) => parse_engine(src, v)?,
    };
    let preset = role_engine.preset();
    let running_metric = match &r.running_metric {
        None => preset.running_metric.to_string(),
        Some(v) => metric_name(src, "running_metric", v)?,
    };
    let queued_metric = match &r.queued_metric {
        None => preset.queued_metric.to_string(),
        Some(v) => metric_name(src, "queued_metric", v)?,
    };
    let effective_url = match &r.effective_url {
        None => role_engine.effective_url(&health),
        Some(v) => Some(check_url(src, "effective_url", v)?),
    };
    Ok(RoleSpec {
        name: role_name,
        launch,
        restart,
        log,
        health,
        metrics,
        health_timeout_s,
        restart_timeout_s,
        effective_url,
        effective_pointers,
        pass_api_key: r.pass_api_key,
        running_metric,
        queued_metric,
        wait_gauges: role_engine.wait_gauges(),
        counters: role_engine.counters(),
    })
}

/// The name of the profile's own replica set when it lists others and names none.
pub const FIRST_REPLICA: &str = "a";

/// The profile's `[[replica]]` sets, checked: distinct names, the same roles as the
/// profile's own (a flag is written alike on every set), and launch configs and health
/// URLs of their own (two sets sharing a file would edit one engine's config for both).
fn replicas(
    src: &Source,
    base: &Path,
    engine: Engine,
    raw: &RawProfile,
    own: &[RoleSpec],
) -> Result<Vec<ReplicaSet>, ConfigError> {
    let own_names: Vec<&str> = own.iter().map(|r| r.name.as_str()).collect();
    let mut launches: Vec<(PathBuf, String)> = own
        .iter()
        .map(|r| (canonical(&r.launch), "the profile's own set".to_string()))
        .collect();
    let mut healths: Vec<(String, String)> = own
        .iter()
        .map(|r| (r.health.clone(), "the profile's own set".to_string()))
        .collect();
    let mut sets: Vec<ReplicaSet> = Vec::new();
    for spanned in &raw.replica {
        let r = spanned.get_ref();
        let name = non_empty(src, "replica name", &r.name, "b")?;
        if sets.iter().any(|s| s.name == name) {
            return Err(src.invalid(
                r.name.span(),
                format!("replica {name:?} is defined twice"),
                "give every [[replica]] a distinct name",
            ));
        }
        let api = check_url(src, "api", &r.api)?;
        let mut roles = Vec::new();
        for role_table in &r.role {
            let t = role_table.get_ref();
            let role_name = non_empty(src, "role name", &t.name, "prefill")?;
            if roles.iter().any(|x: &RoleSpec| x.name == role_name) {
                return Err(src.invalid(
                    t.name.span(),
                    format!("replica {name:?}: role {role_name:?} is defined twice"),
                    "give every [[replica.role]] of a set a distinct name",
                ));
            }
            let spec = role(src, base, engine, t, role_name)?;
            let at = |what: &str| format!("replica {name:?} role {:?}'s {what}", spec.name);
            let launch = canonical(&spec.launch);
            if let Some((_, owner)) = launches.iter().find(|(l, _)| *l == launch) {
                return Err(src.invalid(
                    t.launch.span(),
                    format!(
                        "{} {} is {owner}'s launch config too: bisect would write one arm's value into both sets",
                        at("launch config"),
                        spec.launch.display()
                    ),
                    "give every replica set a launch config of its own (a copy that serves on its own port)",
                ));
            }
            if let Some((_, owner)) = healths.iter().find(|(h, _)| *h == spec.health) {
                return Err(src.invalid(
                    t.health.span(),
                    format!(
                        "{} {} is {owner}'s too: bisect could not tell the two sets' engines apart",
                        at("health URL"),
                        spec.health
                    ),
                    "point every replica set's roles at their own engines' ports",
                ));
            }
            launches.push((launch, format!("replica {name:?}")));
            healths.push((spec.health.clone(), format!("replica {name:?}")));
            roles.push(spec);
        }
        let mut names: Vec<&str> = roles.iter().map(|x| x.name.as_str()).collect();
        let mut expected = own_names.clone();
        names.sort_unstable();
        expected.sort_unstable();
        if names != expected {
            return Err(src.invalid(
                spanned.span(),
                format!(
                    "replica {name:?} has the roles [{}] but the profile's own are [{}]: every replica set runs the same roles, so a flag is written alike on each",
                    names.join(", "),
                    expected.join(", ")
                ),
                "give the replica one [[replica.role]] table per role of the profile, same names",
            ));
        }
        sets.push(ReplicaSet { name, api, roles });
    }
    Ok(sets)
}

/// A launch path as the file system names it (itself where it cannot be resolved).
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A timeout in seconds: `default` when absent; zero or less is refused with `fix`
/// (and the default).
fn positive_seconds(
    src: &Source,
    key: &str,
    value: &Option<Spanned<i64>>,
    default: u64,
    fix: &str,
) -> Result<u64, ConfigError> {
    match value {
        None => Ok(default),
        Some(t) if *t.get_ref() > 0 => Ok(*t.get_ref() as u64),
        Some(t) => Err(src.invalid(
            t.span(),
            format!("{key} = {} must be positive", t.get_ref()),
            format!("{fix} (default {default})"),
        )),
    }
}

/// A role's launch config, resolved relative to the profile's directory: it must exist
/// and be a shell script.
fn launch_path(
    src: &Source,
    base: &Path,
    r: &RawRole,
    role_name: &str,
) -> Result<PathBuf, ConfigError> {
    let launch_str = non_empty(src, "launch", &r.launch, "serve_prefill.sh")?;
    let launch = base.join(&launch_str);
    if !launch.is_file() {
        return Err(src.invalid(
            r.launch.span(),
            format!(
                "launch config {} of role {role_name:?} does not exist (resolved relative to this profile's directory)",
                launch.display()
            ),
            "point launch at the role's launch script, relative to the profile file or absolute",
        ));
    }
    // The editor lexes shell. A YAML or JSON manifest would be edited as if it
    // were a script (an `export` line added to a Deployment) and could even read
    // back as agreeing, so it is refused here rather than found out at restart.
    let ext = launch
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if let Some(ext @ ("yaml" | "yml" | "json")) = ext.as_deref() {
        return Err(src.invalid(
            r.launch.span(),
            format!(
                "launch config {} of role {role_name:?} is a .{ext} file, but bisect edits shell launch configs only (`export VAR=...` lines and the launch command's options)",
                launch.display()
            ),
            "keep the engine's options in a shell script that the manifest runs (a ConfigMap or a mounted directory; see targets/vllm/target-k8s.toml and targets/sglang-pd/target-compose.toml) and point launch at that script",
        ));
    }
    Ok(launch)
}

/// One `effective_pointers` entry as written: a JSON pointer, or a table with the
/// pointer and the engine's words for the flag's on and off values.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawPointer {
    Plain(String),
    Mapped {
        pointer: String,
        on: String,
        off: String,
    },
}

/// A role's `effective_pointers`: each a JSON pointer (or empty), by flag name, with the
/// engine's words for on and off where given.
fn effective_pointers(
    src: &Source,
    r: &RawRole,
) -> Result<BTreeMap<String, EffectivePointer>, ConfigError> {
    let mut effective_pointers = BTreeMap::new();
    for (flag, entry) in &r.effective_pointers {
        let (p, reports) = match entry.get_ref() {
            RawPointer::Plain(p) => (p.trim(), None),
            RawPointer::Mapped { pointer, on, off } => {
                (pointer.trim(), Some((on.clone(), off.clone())))
            }
        };
        if !p.is_empty() && !p.starts_with('/') {
            return Err(src.invalid(
                entry.span(),
                format!("effective_pointers.{flag} = {p:?} is not a JSON pointer"),
                "write a JSON pointer (RFC 6901) into the effective-config document, e.g. \"/server_args/enable_hierarchical_cache\", or a table { pointer = \"/...\", on = \"<what the engine reports when the flag is on>\", off = \"...\" }",
            ));
        }
        effective_pointers.insert(
            flag.clone(),
            EffectivePointer {
                pointer: p.to_string(),
                reports,
            },
        );
    }
    Ok(effective_pointers)
}

impl TargetProfile {
    /// Writes the launch scripts the profile brings (creating their folder); a profile
    /// loaded from a file brings none.
    pub fn write_launch_scripts(&self) -> anyhow::Result<()> {
        use anyhow::Context;
        for (path, text) in &self.launch_scripts {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// The classifier of every command that drives this target: the workload's tools,
    /// the profile's markup families (what counts as a leak on this engine) and its
    /// rejection patterns (which error replies are the engine refusing a tool call).
    pub fn classifier(
        &self,
        workload: &super::Workload,
    ) -> anyhow::Result<crate::core::classify::Classifier> {
        Ok(
            crate::core::classify::Classifier::new(&workload.tools, &self.markup)?
                .with_rejections(&self.rejections)?,
        )
    }

    /// Loads and validates a profile; launch paths are resolved relative to the
    /// profile's directory and must exist.
    pub fn load(path: &Path) -> Result<TargetProfile, ConfigError> {
        let text = read_text(path)?;
        let src = Source { path, text: &text };
        let raw: RawProfile = src.parse(PROFILE_FIX)?;
        let base = path.parent().unwrap_or(Path::new(""));

        let name = non_empty(&src, "name", &raw.name, "dsv4-pd")?;
        let api = check_url(&src, "api", &raw.api)?;
        let model = non_empty(&src, "model", &raw.model, "deepseek-v4-flash")?;
        let api_key_env = api_key_env(&src, &raw)?;

        let engine = match &raw.engine {
            None => Engine::default(),
            Some(v) => parse_engine(&src, v)?,
        };
        let markup = markup(&src, engine, &raw)?;
        let flags_dir = flags_dir(&src, base, &raw)?;
        let rejections = rejections(&src, engine, &raw.reject)?;

        if raw.role.is_empty() {
            return Err(src.invalid(
                text.len()..text.len(),
                "the profile has no [[role]]: bisect would have no launch config to edit",
                "add one [[role]] table per engine process (name, launch, health), e.g. prefill and decode",
            ));
        }

        let mut seen = HashSet::new();
        let mut roles = Vec::new();
        for spanned in &raw.role {
            let r = spanned.get_ref();
            let role_name = non_empty(&src, "role name", &r.name, "prefill")?;
            if !seen.insert(role_name.clone()) {
                return Err(src.invalid(
                    r.name.span(),
                    format!("role {role_name:?} is defined twice"),
                    "give every [[role]] a distinct name",
                ));
            }
            roles.push(role(&src, base, engine, r, role_name)?);
        }

        let replicas = replicas(&src, base, engine, &raw, &roles)?;
        let replica = match (&raw.replica_name, replicas.is_empty()) {
            (_, true) => None,
            (None, false) => Some(FIRST_REPLICA.to_string()),
            (Some(v), false) => Some(non_empty(&src, "replica_name", v, FIRST_REPLICA)?),
        };
        if let Some(first) = &replica {
            if let Some(twin) = raw
                .replica
                .iter()
                .find(|r| r.get_ref().name.get_ref().trim() == first)
            {
                return Err(src.invalid(
                    twin.get_ref().name.span(),
                    format!("replica {first:?} is the profile's own set (replica_name) and a [[replica]] too"),
                    "give every replica set a distinct name (replica_name names the profile's own [[role]] tables)",
                ));
            }
        }
        Ok(TargetProfile {
            name,
            api,
            model,
            api_key_env,
            roles,
            source: Some(path.to_path_buf()),
            engine,
            markup,
            flags_dir,
            rejections,
            launch_scripts: Vec::new(),
            replica,
            replicas,
        })
    }

    /// This set's name: its `replica`, else the first set's (a single replica is
    /// named as the first set of a target with several would be).
    pub fn replica_name(&self) -> &str {
        self.replica.as_deref().unwrap_or(FIRST_REPLICA)
    }

    /// The replica sets' names, in order, joined by ", " ("a, b"; "a" on one set).
    pub fn replica_names(&self) -> String {
        std::iter::once(self.replica_name())
            .chain(self.replicas.iter().map(|r| r.name.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every replica set as a target of its own (its name in `replica`, no other sets):
    /// the profile itself on a single replica. What a command opens one testbed per.
    pub fn replica_sets(&self) -> Vec<TargetProfile> {
        let own = TargetProfile {
            replicas: Vec::new(),
            ..self.clone()
        };
        let mut sets = vec![own.clone()];
        for r in &self.replicas {
            sets.push(TargetProfile {
                api: r.api.clone(),
                roles: r.roles.clone(),
                replica: Some(r.name.clone()),
                ..own.clone()
            });
        }
        sets
    }

    /// The role called `name`, if the profile has one.
    pub fn role(&self, name: &str) -> Option<&RoleSpec> {
        self.roles.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"name  = "dsv4-pd"
api   = "http://127.0.0.1:8000/v1"
model = "deepseek-v4-flash"
api_key_env = "OPENAI_API_KEY"

[[role]]
name    = "prefill"
launch  = "serve_prefill.sh"
restart = "systemctl restart sglang-dsv4-prefill"
health  = "http://127.0.0.1:30000/health"
metrics = "http://127.0.0.1:30000/metrics"
health_timeout_s = 120

[[role]]
name   = "decode"
launch = "scripts/serve_decode.sh"
health = "http://127.0.0.1:30002/health"
"#;

    fn write_profile(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("serve_prefill.sh"), "exec true\n").unwrap();
        std::fs::create_dir(dir.path().join("scripts")).unwrap();
        std::fs::write(dir.path().join("scripts/serve_decode.sh"), "exec true\n").unwrap();
        let path = dir.path().join("target.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn error_at(text: &str) -> (usize, String) {
        let (_dir, path) = write_profile(text);
        TargetProfile::load(&path).unwrap_err().line_and_text()
    }

    #[test]
    fn loads_profile_and_resolves_launch_relative_to_it() {
        let (dir, path) = write_profile(GOOD);
        let p = TargetProfile::load(&path).unwrap();
        assert_eq!(p.name, "dsv4-pd");
        assert_eq!(p.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(p.roles.len(), 2);
        assert_eq!(p.roles[0].launch, dir.path().join("serve_prefill.sh"));
        assert_eq!(p.roles[0].health_timeout_s, 120);
        assert_eq!(
            p.roles[1].launch,
            dir.path().join("scripts/serve_decode.sh")
        );
        assert_eq!(p.roles[1].health_timeout_s, DEFAULT_HEALTH_TIMEOUT_S);
        assert_eq!(p.roles[1].restart_timeout_s, DEFAULT_RESTART_TIMEOUT_S);
        assert_eq!(p.roles[1].restart, None);
        assert_eq!(p.role("decode").unwrap().metrics, None);
        assert_eq!(p.source.as_deref(), Some(path.as_path()));
    }

    #[test]
    fn a_yaml_manifest_as_launch_config_is_refused_with_the_script_form() {
        let (dir, path) = write_profile(GOOD);
        std::fs::write(dir.path().join("deployment.yaml"), "kind: Deployment\n").unwrap();
        std::fs::write(
            &path,
            GOOD.replace("scripts/serve_decode.sh", "deployment.yaml"),
        )
        .unwrap();
        let (line, msg) = TargetProfile::load(&path).unwrap_err().line_and_text();
        assert_eq!(line, 16);
        assert!(
            msg.contains(".yaml file") && msg.contains("targets/vllm/target-k8s.toml"),
            "{msg}"
        );
    }

    /// A role under a restart command can name a command that follows its log; a role
    /// bisect spawns cannot (its output is captured already), refused at the key's line.
    #[test]
    fn a_log_command_belongs_to_a_restarted_role() {
        let text = GOOD.replace(
            "restart = \"systemctl restart sglang-dsv4-prefill\"",
            "restart = \"systemctl restart sglang-dsv4-prefill\"\nlog = \"journalctl -u sglang-dsv4-prefill -f -n 0 -o cat\"",
        );
        let (_dir, path) = write_profile(&text);
        let p = TargetProfile::load(&path).unwrap();
        assert_eq!(
            p.roles[0].log.as_deref(),
            Some("journalctl -u sglang-dsv4-prefill -f -n 0 -o cat")
        );
        assert_eq!(p.roles[1].log, None);
        let text = GOOD.replace(
            "launch = \"scripts/serve_decode.sh\"",
            "launch = \"scripts/serve_decode.sh\"\nlog = \"tail -f /var/log/x\"",
        );
        let (line, msg) = error_at(&text);
        assert_eq!(line, 17);
        assert!(
            msg.contains("`log` applies to a role started by its `restart` command")
                && msg.contains("drop `log`"),
            "{msg}"
        );
    }

    /// A second replica set: the same roles on launch configs and ports of its own.
    const REPLICA_B: &str = r#"
[[replica]]
name = "b"
api  = "http://127.0.0.1:9000/v1"

[[replica.role]]
name    = "prefill"
launch  = "b/serve_prefill.sh"
restart = "systemctl restart sglang-dsv4-prefill-b"
health  = "http://127.0.0.1:31000/health"

[[replica.role]]
name   = "decode"
launch = "b/serve_decode.sh"
health = "http://127.0.0.1:31002/health"
"#;

    /// Replica sets load as targets of their own, the profile's own named `a`; a single
    /// replica is the profile itself, its record unchanged.
    #[test]
    fn replica_sets_are_targets_of_their_own() {
        let (dir, path) = write_profile(&format!("{GOOD}{REPLICA_B}"));
        std::fs::create_dir(dir.path().join("b")).unwrap();
        for f in ["serve_prefill.sh", "serve_decode.sh"] {
            std::fs::write(dir.path().join("b").join(f), "exec true\n").unwrap();
        }
        let p = TargetProfile::load(&path).unwrap();
        assert_eq!(p.replica.as_deref(), Some("a"));
        let sets = p.replica_sets();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].roles, p.roles);
        assert!(sets.iter().all(|s| s.replicas.is_empty()));
        assert_eq!(sets[1].replica.as_deref(), Some("b"));
        assert_eq!(sets[1].api, "http://127.0.0.1:9000/v1");
        assert_eq!(
            sets[1].roles[0].launch,
            dir.path().join("b/serve_prefill.sh")
        );
        assert_eq!(
            sets[1].roles[0].restart.as_deref(),
            Some("systemctl restart sglang-dsv4-prefill-b")
        );
        assert_eq!(sets[1].name, p.name);

        let (_dir, single) = write_profile(GOOD);
        let single = TargetProfile::load(&single).unwrap();
        assert_eq!(single.replica, None);
        assert_eq!(single.replica_sets(), vec![single.clone()]);
    }

    /// A replica set that shares a launch config or a health URL with another, or runs
    /// other roles, is refused at its line with the fix.
    #[test]
    fn a_replica_set_needs_the_same_roles_on_files_and_ports_of_its_own() {
        // (the line of the refusal, the line `needle` is on, the message)
        let with = |profile: String, needle: &str| {
            let (dir, path) = write_profile(&profile);
            std::fs::create_dir(dir.path().join("b")).unwrap();
            for f in ["serve_prefill.sh", "serve_decode.sh"] {
                std::fs::write(dir.path().join("b").join(f), "exec true\n").unwrap();
            }
            // The first line holding `needle` from the [[replica]] table on.
            let from = profile.lines().position(|l| l == "[[replica]]").unwrap();
            let at = from
                + 1
                + profile
                    .lines()
                    .skip(from)
                    .position(|l| l.contains(needle))
                    .unwrap();
            let (line, msg) = TargetProfile::load(&path).unwrap_err().line_and_text();
            (line, at, msg)
        };
        let shared = format!(
            "{GOOD}{}",
            REPLICA_B.replace("b/serve_decode.sh", "scripts/serve_decode.sh")
        );
        let (line, at, msg) = with(shared, "scripts/serve_decode.sh");
        assert_eq!(line, at, "{msg}");
        assert!(
            msg.contains("is the profile's own set's launch config too")
                && msg.contains("a launch config of its own"),
            "{msg}"
        );
        let (line, at, msg) = with(
            format!("{GOOD}{}", REPLICA_B.replace("31002", "30002")),
            "30002",
        );
        assert_eq!(line, at, "{msg}");
        assert!(
            msg.contains("could not tell the two sets' engines apart"),
            "{msg}"
        );
        let (line, at, msg) = with(
            format!(
                "{GOOD}{}",
                REPLICA_B.replace("name   = \"decode\"", "name   = \"router\"")
            ),
            "[[replica]]",
        );
        assert_eq!(line, at, "{msg}");
        assert!(
            msg.contains(
                "has the roles [prefill, router] but the profile's own are [decode, prefill]"
            ),
            "{msg}"
        );
        let (line, at, msg) = with(
            format!("replica_name = \"b\"\n{GOOD}{REPLICA_B}"),
            "name = \"b\"",
        );
        assert_eq!(line, at, "{msg}");
        assert!(
            msg.contains("is the profile's own set (replica_name) and a [[replica]] too"),
            "{msg}"
        );
    }

    #[test]
    fn duplicate_role_names_are_refused_at_the_second() {
        let text = GOOD.replace("name   = \"decode\"", "name   = \"prefill\"");
        let (line, msg) = error_at(&text);
        assert_eq!(line, 15);
        assert!(msg.contains("twice"), "{msg}");
    }

    #[test]
    fn https_is_refused_with_a_no_tls_note() {
        let text = GOOD.replace(
            "http://127.0.0.1:30002/health",
            "https://127.0.0.1:30002/health",
        );
        let (line, msg) = error_at(&text);
        assert_eq!(line, 17);
        assert!(msg.contains("no TLS"), "{msg}");
        let text = GOOD.replace("http://127.0.0.1:8000/v1", "127.0.0.1:8000/v1");
        assert_eq!(error_at(&text).0, 2);
    }

    #[test]
    fn missing_roles_and_missing_launch_files_are_refused() {
        let head: String = GOOD.lines().take(4).collect::<Vec<_>>().join("\n");
        let (_, msg) = error_at(&head);
        assert!(msg.contains("no [[role]]"), "{msg}");
        let text = GOOD.replace("scripts/serve_decode.sh", "scripts/missing.sh");
        let (line, msg) = error_at(&text);
        assert_eq!(line, 16);
        assert!(msg.contains("does not exist"), "{msg}");
    }

    #[test]
    fn a_pointer_may_map_the_engine_s_words_for_on_and_off() {
        let mapped = GOOD.replace(
            "health_timeout_s = 120\n",
            "health_timeout_s = 120\neffective_pointers = { HICACHE = { pointer = \"/vllm:cache_config_info/enable_prefix_caching\", on = \"False\", off = \"True\" } }\n",
        );
        let (_dir, path) = write_profile(&mapped);
        let profile = TargetProfile::load(&path).unwrap();
        assert_eq!(
            profile.roles[0].effective_pointers["HICACHE"],
            EffectivePointer {
                pointer: "/vllm:cache_config_info/enable_prefix_caching".into(),
                reports: Some(("False".into(), "True".into())),
            }
        );
        let bad = mapped.replace("{ pointer = \"/vllm", "{ pointer = \"vllm");
        let (line, msg) = error_at(&bad);
        assert_eq!(line, 13);
        assert!(msg.contains("is not a JSON pointer"), "{msg}");
    }

    #[test]
    fn bad_values_and_unknown_keys_point_at_their_line() {
        let text = GOOD.replace("health_timeout_s = 120", "health_timeout_s = 0");
        assert_eq!(error_at(&text).0, 12);
        let text = GOOD.replace("health_timeout_s = 120", "health_timeout = 120");
        let (line, msg) = error_at(&text);
        assert_eq!(line, 12);
        assert!(msg.contains("health_timeout"), "{msg}");
        let text = GOOD.replace(
            "api_key_env = \"OPENAI_API_KEY\"",
            "api_key_env = \"sk-123 abc\"",
        );
        assert_eq!(error_at(&text).0, 4);
        let text = GOOD.replace("model = \"deepseek-v4-flash\"", "model = = 1");
        assert_eq!(error_at(&text).0, 3);
    }

    #[test]
    fn effective_config_and_key_passing_are_per_role() {
        let text = GOOD.replace(
            "health_timeout_s = 120\n",
            "health_timeout_s = 120\neffective_url = \"http://127.0.0.1:30000/props\"\neffective_pointers = { HICACHE = \"/server_args/enable_hierarchical_cache\" }\npass_api_key = true\n",
        );
        let (_dir, path) = write_profile(&text);
        let p = TargetProfile::load(&path).unwrap();
        let prefill = &p.roles[0];
        assert_eq!(
            prefill.effective_url.as_deref(),
            Some("http://127.0.0.1:30000/props")
        );
        assert_eq!(
            prefill.effective_pointers["HICACHE"],
            EffectivePointer::plain("/server_args/enable_hierarchical_cache")
        );
        assert!(prefill.pass_api_key);
        let decode = &p.roles[1];
        assert_eq!(decode.effective_url, None);
        assert!(decode.effective_pointers.is_empty() && !decode.pass_api_key);

        let bad = text.replace("\"/server_args/", "\"server_args/");
        let (line, msg) = error_at(&bad);
        assert_eq!(line, 14);
        assert!(msg.contains("not a JSON pointer"), "{msg}");
        let bad = text.replace("http://127.0.0.1:30000/props", "https://x/props");
        assert_eq!(error_at(&bad).0, 13);
    }

    #[test]
    fn an_engine_preset_fills_role_defaults_and_roles_override_them() {
        let text = GOOD.replace(
            "api_key_env = \"OPENAI_API_KEY\"\n",
            "api_key_env = \"OPENAI_API_KEY\"\nengine = \"llamacpp\"\n",
        );
        let text = text.replace(
            "health_timeout_s = 120\n",
            "health_timeout_s = 120\nengine = \"vllm\"\n",
        ) + "running_metric = \"my:running\"\neffective_url = \"http://127.0.0.1:30002/config\"\n";
        let (_dir, path) = write_profile(&text);
        let p = TargetProfile::load(&path).unwrap();
        assert_eq!(p.engine, Engine::Llamacpp);
        assert_eq!(p.markup, MarkupFamily::ALL.to_vec());
        let prefill = p.role("prefill").unwrap();
        assert_eq!(prefill.running_metric, "vllm:num_requests_running");
        assert_eq!(prefill.queued_metric, "vllm:num_requests_waiting");
        assert_eq!(
            prefill.effective_url.as_deref(),
            Some("http://127.0.0.1:30000/metrics"),
            "vLLM's self-report is its /metrics (info metrics, process start time)"
        );
        let decode = p.role("decode").unwrap();
        assert_eq!(decode.running_metric, "my:running");
        assert_eq!(decode.queued_metric, "llamacpp:requests_deferred");
        assert_eq!(
            decode.effective_url.as_deref(),
            Some("http://127.0.0.1:30002/config")
        );

        // Without `engine` the profile keeps bisect's old defaults.
        let (_dir, path) = write_profile(GOOD);
        let p = TargetProfile::load(&path).unwrap();
        assert_eq!(p.engine, Engine::Custom);
        assert_eq!(p.roles[0].running_metric, "sglang:num_running_reqs");
        assert_eq!(p.roles[0].effective_url, None);

        let sglang = GOOD.replace("model = ", "engine = \"sglang\"\nmodel = ");
        let (_dir, path) = write_profile(&sglang);
        let p = TargetProfile::load(&path).unwrap();
        assert_eq!(
            p.roles[0].effective_url.as_deref(),
            Some("http://127.0.0.1:30000/server_info")
        );
    }

    #[test]
    fn bad_engines_metric_names_and_markup_point_at_their_line() {
        let text = GOOD.replace("model = ", "engine = \"tgi\"\nmodel = ");
        let (line, msg) = error_at(&text);
        assert_eq!(line, 3);
        assert!(msg.contains("unknown engine `tgi`"), "{msg}");
        let text = GOOD.replace("health_timeout_s = 120", "running_metric = \"num running\"");
        let (line, msg) = error_at(&text);
        assert_eq!(line, 12);
        assert!(msg.contains("not a Prometheus metric name"), "{msg}");
        let text = GOOD.replace("model = ", "markup = [\"dsml\", \"xml\"]\nmodel = ");
        let (line, msg) = error_at(&text);
        assert_eq!(line, 3);
        assert!(msg.contains("unknown markup family `xml`"), "{msg}");
    }

    #[test]
    fn reject_tables_add_replace_and_turn_off_the_presets_patterns() {
        let names = |text: &str| {
            let (_dir, path) = write_profile(text);
            let p = TargetProfile::load(&path).unwrap();
            p.rejections
                .iter()
                .map(|r| (r.name.clone(), r.status, r.body.clone()))
                .collect::<Vec<_>>()
        };
        // The preset's, untouched.
        let llama = GOOD.replace("model = ", "engine = \"llamacpp\"\nmodel = ");
        let preset: Vec<_> = names(&llama).into_iter().map(|r| r.0).collect();
        assert_eq!(preset, ["llamacpp.format", "llamacpp.pos"]);
        assert!(names(GOOD).is_empty(), "custom names none");
        // Added, replaced (same name) and turned off.
        let amended = format!(
            "{llama}\n[[reject]]\nname = \"proxy\"\nbody = 'tool call .* could not be parsed'\n\n\
             [[reject]]\nname = \"llamacpp.format\"\nstatus = 500\nbody = \"does not match\"\n\n\
             [[reject]]\nname = \"llamacpp.pos\"\noff = true\n"
        );
        assert_eq!(
            names(&amended),
            [
                (
                    "llamacpp.format".to_string(),
                    Some(500),
                    "does not match".to_string()
                ),
                (
                    "proxy".to_string(),
                    None,
                    "tool call .* could not be parsed".to_string()
                ),
            ]
        );
    }

    #[test]
    fn bad_reject_tables_name_the_file_line_and_fix() {
        // GOOD has 17 lines; the table's body is on line 22.
        let text = format!(
            "{GOOD}\n[[reject]]\nname = \"x\"\nstatus = 500\nbody = 'tool call (unclosed'\n"
        );
        let (_dir, path) = write_profile(&text);
        let err = TargetProfile::load(&path).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!("{}:22: ", path.display())),
            "{shown}"
        );
        assert!(shown.contains("not a regular expression"), "{shown}");
        assert!(shown.contains("unclosed"), "{shown}");
        assert!(shown.contains("fix: a [[reject]] table"), "{shown}");
        // Turning off what the preset lacks names what it has.
        let (line, msg) = error_at(&format!(
            "{GOOD}\n[[reject]]\nname = \"llamacpp.pos\"\noff = true\n"
        ));
        assert_eq!(line, 20);
        assert!(
            msg.contains("the custom preset does not have (it has: none)"),
            "{msg}"
        );
        for (table, says) in [
            (
                "name = \"x\"\nstatus = 200\nbody = \"a\"",
                "not an error status",
            ),
            (
                "name = \"x\"\nstatus = 70000\nbody = \"a\"",
                "not an HTTP status",
            ),
            ("name = \"x\"\nbody = \" \"", "body is empty"),
            ("name = \"x\"\nstatus = 500", "has no body pattern"),
            (
                "name = \"x\"\noff = true\nbody = \"a\"",
                "off = true and a status or body",
            ),
            ("name = \"x\"\nbody = \"a\"\nheader = 1", "unknown field"),
        ] {
            let (_dir, path) = write_profile(&format!("{GOOD}\n[[reject]]\n{table}\n"));
            let shown = TargetProfile::load(&path).unwrap_err().to_string();
            assert!(shown.contains(says), "{table}: {shown}");
            assert!(shown.contains("target.toml:"), "{shown}");
        }
        let twice = format!(
            "{GOOD}\n[[reject]]\nname = \"x\"\nbody = \"a\"\n\n[[reject]]\nname = \"x\"\nbody = \"b\"\n"
        );
        assert!(error_at(&twice).1.contains("defined twice"));
    }

    #[test]
    fn unreadable_profile_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = TargetProfile::load(&dir.path().join("none.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
    }
}
