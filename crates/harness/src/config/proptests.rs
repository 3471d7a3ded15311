//! Property tests of the TOML loaders (docs/property-tests.md): target profiles, flag
//! files and workloads. Generated valid documents load to the values written; a
//! document with one bad value is refused at that value's line; any other text (a
//! valid document mutated, TOML-ish soup, random Unicode) loads or fails with an error
//! that names the file and a line inside it, and never panics.

use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::select;

use super::{line_of, ConfigError, FlagCatalog, Setting, TargetProfile, Workload};
use crate::proptest_config::{config, scratch_dir};

/// A TOML basic string holding `s`, escapes and all.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Text with something besides blanks in it, surrounded by anything.
fn non_blank() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9_.-]{1,10}",
        1 => (any::<String>(), "[a-z]", any::<String>()).prop_map(|(a, b, c)| format!("{a}{b}{c}")),
        1 => "[ \t]{0,2}[a-z\"\\\\ ]{1,6}[ \t]{0,2}"
            .prop_filter("not blank", |s| !s.trim().is_empty()),
    ]
}

fn host_url(path: &'static str) -> impl Strategy<Value = String> {
    (
        select(vec!["127.0.0.1", "localhost", "10.0.0.7", "[::1]"]),
        1u16..,
    )
        .prop_map(move |(host, port)| format!("http://{host}:{port}{path}"))
}

/// A document as lines, with the line number of each key worth pointing at.
#[derive(Debug, Clone, Default)]
struct Doc {
    lines: Vec<String>,
    /// (what, 1-based line).
    at: Vec<(String, usize)>,
}

impl Doc {
    fn key(&mut self, what: &str, line: String) {
        self.lines.push(line);
        self.at.push((what.to_string(), self.lines.len()));
    }
    fn raw(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }
    fn line_of(&self, what: &str) -> usize {
        self.at
            .iter()
            .rev()
            .find(|(w, _)| w == what)
            .map(|(_, l)| *l)
            .unwrap_or_else(|| panic!("{what} is not in the document"))
    }
    fn text(&self, crlf: bool) -> String {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut text = self.lines.join(nl);
        text.push_str(nl);
        text
    }
    /// The document with the line of `what` replaced.
    fn with_line(&self, what: &str, line: String) -> Doc {
        let mut doc = self.clone();
        let n = self.line_of(what);
        doc.lines[n - 1] = line;
        doc
    }
}

/// A scratch directory per test thread, reused across its cases.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = scratch_dir();
        for file in ["prefill.sh", "decode.sh"] {
            fs::write(dir.path().join(file), "exec srv\n").unwrap();
        }
        fs::create_dir(dir.path().join("flags")).unwrap();
        Scratch { dir }
    }
    fn write(&self, name: &str, text: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        fs::write(&path, text).unwrap();
        path
    }
}

thread_local! {
    static SCRATCH: Scratch = Scratch::new();
}

fn with_scratch<T>(f: impl FnOnce(&Scratch) -> T) -> T {
    SCRATCH.with(f)
}

// --- Target profiles --------------------------------------------------------------

#[derive(Debug, Clone)]
struct GenRole {
    name: String,
    launch: &'static str,
    restart: Option<String>,
    health: String,
    metrics: Option<String>,
    health_timeout_s: Option<i64>,
}

#[derive(Debug, Clone)]
struct GenTarget {
    name: String,
    api: String,
    model: String,
    api_key_env: Option<String>,
    roles: Vec<GenRole>,
}

fn gen_target() -> impl Strategy<Value = GenTarget> {
    let role = (
        non_blank(),
        select(vec!["prefill.sh", "decode.sh"]),
        proptest::option::of(non_blank()),
        host_url("/health"),
        proptest::option::of(host_url("/metrics")),
        proptest::option::of(1i64..100_000),
    )
        .prop_map(
            |(name, launch, restart, health, metrics, health_timeout_s)| GenRole {
                name,
                launch,
                restart,
                health,
                metrics,
                health_timeout_s,
            },
        );
    (
        non_blank(),
        host_url("/v1"),
        non_blank(),
        proptest::option::of("[A-Z_][A-Z0-9_]{0,10}"),
        prop::collection::vec(role, 1..4).prop_filter("distinct role names", |roles| {
            let mut names: Vec<&str> = roles.iter().map(|r| r.name.trim()).collect();
            names.sort();
            names.windows(2).all(|w| w[0] != w[1])
        }),
    )
        .prop_map(|(name, api, model, api_key_env, roles)| GenTarget {
            name,
            api,
            model,
            api_key_env,
            roles,
        })
}

fn target_doc(t: &GenTarget) -> Doc {
    let mut doc = Doc::default();
    doc.raw("# generated target profile");
    doc.key("name", format!("name = {}", toml_str(&t.name)));
    doc.key("api", format!("api = {}", toml_str(&t.api)));
    doc.key("model", format!("model   =   {}", toml_str(&t.model)));
    if let Some(var) = &t.api_key_env {
        doc.key("api_key_env", format!("api_key_env = {}", toml_str(var)));
    }
    for r in &t.roles {
        doc.raw("");
        doc.raw("[[role]]");
        doc.key("role.name", format!("name = {}", toml_str(&r.name)));
        doc.key("launch", format!("launch = {}", toml_str(r.launch)));
        if let Some(cmd) = &r.restart {
            doc.key("restart", format!("restart = {}", toml_str(cmd)));
        }
        doc.key(
            "health",
            format!("health = {}  # polled", toml_str(&r.health)),
        );
        if let Some(m) = &r.metrics {
            doc.key("metrics", format!("metrics = {}", toml_str(m)));
        }
        if let Some(t) = r.health_timeout_s {
            doc.key("health_timeout_s", format!("health_timeout_s = {t}"));
        }
    }
    doc
}

// --- Flags ------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct GenFlag {
    with_name: bool,
    doc: String,
    kind: &'static str,
    key: String,
    roles: Vec<String>,
    on: String,
    off: String,
}

fn gen_flag() -> impl Strategy<Value = GenFlag> {
    select(vec!["env", "arg", "switch"])
        .prop_flat_map(|kind| {
            let key = if kind == "env" {
                "[A-Za-z_][A-Za-z0-9_]{0,16}".boxed()
            } else {
                "--?[a-z0-9][a-z0-9._-]{0,16}".boxed()
            };
            let value = if kind == "arg" {
                "[A-Za-z0-9._:/,=+-]{1,6}"
            } else {
                "[A-Za-z0-9._:/,=+-]{0,6}"
            };
            (
                any::<bool>(),
                any::<String>(),
                Just(kind),
                key,
                prop::collection::btree_set("[a-z][a-z0-9_-]{0,8}", 1..4),
                value,
                value,
            )
        })
        .prop_filter("on and off differ", |t| t.5 != t.6)
        .prop_map(|(with_name, doc, kind, key, roles, on, off)| GenFlag {
            with_name,
            doc,
            kind,
            key,
            roles: roles.into_iter().collect(),
            on,
            off,
        })
}

const FLAG_STEM: &str = "GEN_FLAG";

fn flag_doc(f: &GenFlag) -> Doc {
    let mut doc = Doc::default();
    if f.with_name {
        doc.key("name", format!("name = {}", toml_str(FLAG_STEM)));
    }
    doc.key("doc", format!("doc = {}", toml_str(&f.doc)));
    doc.key("key", format!("{} = {}", f.kind, toml_str(&f.key)));
    let roles: Vec<String> = f.roles.iter().map(|r| toml_str(r)).collect();
    doc.key("roles", format!("roles = [{}]", roles.join(", ")));
    doc.key("on", format!("on = {}", toml_str(&f.on)));
    doc.key("off", format!("off = {}", toml_str(&f.off)));
    doc
}

// --- Workloads ----------------------------------------------------------------------

#[derive(Debug, Clone)]
enum PropType {
    Str(Vec<String>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

#[derive(Debug, Clone)]
struct GenTool {
    name: String,
    description: String,
    props: Vec<(String, PropType)>,
    result: String,
}

#[derive(Debug, Clone)]
struct GenWorkload {
    name: Option<String>,
    sessions: i64,
    rounds: i64,
    ctx: i64,
    max_tokens: i64,
    timeout_s: f64,
    temperature: Option<f64>,
    check_args: Option<&'static str>,
    barrier: Option<bool>,
    seed: Option<i64>,
    steps: i64,
    intro: String,
    outro: String,
    tools: Vec<GenTool>,
}

fn gen_tool() -> impl Strategy<Value = GenTool> {
    let prop_type = prop_oneof![
        prop::collection::vec(any::<String>(), 1..3).prop_map(PropType::Str),
        prop::collection::vec(any::<i64>(), 1..3).prop_map(PropType::Int),
        prop::collection::vec(any::<bool>(), 1..3).prop_map(PropType::Bool),
    ];
    (
        "[A-Za-z0-9_-]{1,20}",
        any::<String>(),
        prop::collection::btree_map("[a-z][a-z0-9_]{0,8}", prop_type, 1..4),
        "[a-z :]{0,10}",
    )
        .prop_map(|(name, description, props, text)| {
            let first = props.keys().next().cloned().unwrap_or_default();
            GenTool {
                name,
                description,
                result: format!("{text} {{tool}} {{{first}}} {{args}}"),
                props: props.into_iter().collect(),
            }
        })
}

fn gen_workload() -> impl Strategy<Value = GenWorkload> {
    (
        (
            proptest::option::of(non_blank()),
            1i64..=u32::MAX as i64,
            1i64..1000,
            0i64..100_000,
            1i64..100_000,
            (1e-3f64..1e6),
            proptest::option::of(0.0f64..=2.0),
        ),
        (
            proptest::option::of(select(vec!["strict", "schema"])),
            proptest::option::of(any::<bool>()),
            proptest::option::of(0i64..=i64::MAX),
            1i64..100,
            any::<String>(),
            non_blank(),
            prop::collection::vec(gen_tool(), 1..3).prop_filter("distinct tool names", |tools| {
                tools
                    .iter()
                    .enumerate()
                    .all(|(i, t)| tools[..i].iter().all(|u| u.name != t.name))
            }),
        ),
    )
        .prop_map(
            |(
                (name, sessions, rounds, ctx, max_tokens, timeout_s, temperature),
                (check_args, barrier, seed, steps, intro, outro, tools),
            )| GenWorkload {
                name,
                sessions,
                rounds,
                ctx,
                max_tokens,
                timeout_s,
                temperature,
                check_args,
                barrier,
                seed,
                steps,
                intro,
                outro,
                tools,
            },
        )
}

fn toml_float(v: f64) -> String {
    toml::Value::Float(v).to_string()
}

fn workload_doc(w: &GenWorkload) -> Doc {
    let mut doc = Doc::default();
    doc.raw("# generated workload");
    if let Some(name) = &w.name {
        doc.key("name", format!("name = {}", toml_str(name)));
    }
    doc.key("sessions", format!("sessions = {}", w.sessions));
    doc.key("rounds", format!("rounds = {}", w.rounds));
    doc.key("ctx", format!("ctx = {}", w.ctx));
    doc.key("max_tokens", format!("max_tokens = {}", w.max_tokens));
    doc.key(
        "timeout_s",
        format!("timeout_s = {}", toml_float(w.timeout_s)),
    );
    if let Some(t) = w.temperature {
        doc.key("temperature", format!("temperature = {}", toml_float(t)));
    }
    if let Some(c) = w.check_args {
        doc.key("check_args", format!("check_args = {}", toml_str(c)));
    }
    if let Some(b) = w.barrier {
        doc.key("barrier", format!("barrier = {b}"));
    }
    if let Some(s) = w.seed {
        doc.key("seed", format!("seed = {s}"));
    }
    doc.raw("");
    doc.raw("[task]");
    doc.key("steps", format!("steps = {}", w.steps));
    doc.key("intro", format!("intro = {}", toml_str(&w.intro)));
    doc.key("outro", format!("outro = {}", toml_str(&w.outro)));
    for t in &w.tools {
        doc.raw("");
        doc.raw("[[tool]]");
        doc.key("tool.name", format!("name = {}", toml_str(&t.name)));
        doc.key(
            "description",
            format!("description = {}", toml_str(&t.description)),
        );
        doc.key("result", format!("result = {}", toml_str(&t.result)));
        doc.raw("[tool.parameters]");
        doc.raw("type = \"object\"");
        for (prop, ty) in &t.props {
            doc.raw(format!("[tool.parameters.properties.{prop}]"));
            let kind = match ty {
                PropType::Str(_) => "string",
                PropType::Int(_) => "integer",
                PropType::Bool(_) => "boolean",
            };
            doc.raw(format!("type = \"{kind}\""));
        }
        doc.raw("[tool.values]");
        for (prop, ty) in &t.props {
            let values: Vec<String> = match ty {
                PropType::Str(v) => v.iter().map(|s| toml_str(s)).collect(),
                PropType::Int(v) => v.iter().map(i64::to_string).collect(),
                PropType::Bool(v) => v.iter().map(bool::to_string).collect(),
            };
            doc.key(
                &format!("values.{prop}"),
                format!("{prop} = [{}]", values.join(", ")),
            );
        }
    }
    doc
}

// --- Arbitrary text -------------------------------------------------------------------

/// TOML-ish lines: the loaders' own keys with values of every type, table headers,
/// comments and syntax debris.
fn toml_soup() -> impl Strategy<Value = String> {
    let keys = vec![
        "name",
        "api",
        "model",
        "api_key_env",
        "launch",
        "restart",
        "health",
        "metrics",
        "health_timeout_s",
        "env",
        "arg",
        "switch",
        "roles",
        "on",
        "off",
        "doc",
        "sessions",
        "rounds",
        "ctx",
        "max_tokens",
        "timeout_s",
        "temperature",
        "check_args",
        "barrier",
        "seed",
        "steps",
        "intro",
        "outro",
        "description",
        "result",
        "type",
        "colour",
    ];
    let values = vec![
        "\"x\"",
        "\"\"",
        "\" \"",
        "\"http://127.0.0.1:1/h\"",
        "\"https://a\"",
        "1",
        "0",
        "-1",
        "1.5",
        "nan",
        "inf",
        "-inf",
        "1e400",
        "true",
        "[]",
        "[\"a\", \"a\"]",
        "[1, \"a\"]",
        "{}",
        "{ type = \"string\" }",
        "\"prefill.sh\"",
        "\"missing.sh\"",
        "9223372036854775807",
        "\"\\u00e9\"",
        "'''x'''",
        "\"\\q\"",
        "\"",
        "[",
        "2024-01-01",
    ];
    let headers = vec![
        "[[role]]",
        "[task]",
        "[[tool]]",
        "[tool.parameters]",
        "[tool.parameters.properties.p]",
        "[tool.values]",
        "[task",
        "[[x]]",
        "",
    ];
    let line = prop_oneof![
        4 => (select(keys), select(vec![" = ", "=", " "]), select(values))
            .prop_map(|(k, eq, v)| format!("{k}{eq}{v}")),
        1 => select(headers).prop_map(str::to_string),
        1 => "#[ -~]{0,10}",
        1 => any::<String>(),
    ];
    prop::collection::vec(line, 0..16).prop_map(|lines| lines.join("\n"))
}

/// A valid document damaged: a byte range cut, a piece of soup spliced in, or a line
/// repeated.
fn mutated(doc: String) -> impl Strategy<Value = String> {
    let len = doc.len();
    (0..=len, 0..=len, 0..3u8, toml_soup()).prop_map(move |(a, b, how, soup)| {
        let (a, b) = (a.min(b), a.max(b));
        let bytes = doc.as_bytes();
        let mut out: Vec<u8> = Vec::with_capacity(len + soup.len());
        match how {
            0 => {
                out.extend_from_slice(&bytes[..a]);
                out.extend_from_slice(&bytes[b..]);
            }
            1 => {
                out.extend_from_slice(&bytes[..a]);
                out.extend_from_slice(soup.as_bytes());
                out.extend_from_slice(&bytes[a..]);
            }
            _ => {
                out.extend_from_slice(&bytes[..b]);
                out.extend_from_slice(&bytes[a..]);
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    })
}

fn any_document(valid: impl Strategy<Value = String> + 'static) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => valid.prop_flat_map(mutated).prop_map(String::into_bytes),
        2 => toml_soup().prop_map(String::into_bytes),
        1 => any::<String>().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// Checks a loader's error: it names `path`, and an `Invalid` one a line of the text.
fn check_error(err: &ConfigError, path: &Path, text: &[u8]) -> Result<(), TestCaseError> {
    let msg = err.to_string();
    prop_assert!(
        msg.starts_with(&format!("{}:", path.display())),
        "does not name the file: {}",
        msg
    );
    match err {
        ConfigError::Invalid {
            path: p, line, fix, ..
        } => {
            prop_assert_eq!(p.as_path(), path);
            let lines = text.iter().filter(|&&b| b == b'\n').count() + 1;
            prop_assert!(
                *line >= 1 && *line <= lines,
                "line {} of {}: {}",
                line,
                lines,
                msg
            );
            prop_assert!(
                msg.starts_with(&format!("{}:{line}: ", path.display())),
                "{}",
                msg
            );
            prop_assert!(!fix.is_empty());
        }
        ConfigError::Read { path: p, .. } => {
            prop_assert_eq!(p.as_path(), path);
            prop_assert!(
                std::str::from_utf8(text).is_err(),
                "a readable file gave {}",
                msg
            );
        }
        other => prop_assert!(false, "a file load gave {:?}", other),
    }
    Ok(())
}

/// Expects `err` to be `Invalid` at `line`.
fn invalid_at(err: ConfigError, line: usize, what: &str) -> Result<(), TestCaseError> {
    match err {
        ConfigError::Invalid { line: got, .. } if got == line => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "bad {what}: expected an error at line {line}, got {other}"
        ))),
    }
}

fn valid_target_text() -> impl Strategy<Value = String> {
    gen_target().prop_map(|t| target_doc(&t).text(false))
}

fn valid_flag_text() -> impl Strategy<Value = String> {
    gen_flag().prop_map(|f| flag_doc(&f).text(false))
}

fn valid_workload_text() -> impl Strategy<Value = String> {
    gen_workload().prop_map(|w| workload_doc(&w).text(false))
}

fn load_flag(s: &Scratch, text: &[u8]) -> (PathBuf, Result<FlagCatalog, ConfigError>) {
    let dir = s.dir.path().join("flags");
    let path = dir.join(format!("{FLAG_STEM}.toml"));
    fs::write(&path, text).unwrap();
    (path, FlagCatalog::load(&[dir]))
}

fn load_workload(s: &Scratch, text: &[u8]) -> (PathBuf, Result<Workload, ConfigError>) {
    let path = s.write("gen_workload.toml", text);
    let result = crate::config::load_workload(path.to_str().expect("UTF-8 scratch path"));
    (path, result)
}

proptest! {
    #![proptest_config(config())]

    /// A generated profile loads to what it says (strings trimmed, launch resolved
    /// beside the profile); one bad value is refused at its line.
    #[test]
    fn target_profiles_load_or_point_at_the_bad_line(
        t in gen_target(),
        crlf in any::<bool>(),
        bad in 0..6u8,
    ) {
        with_scratch(|s| {
            let doc = target_doc(&t);
            let path = s.write("target.toml", doc.text(crlf).as_bytes());
            let p = TargetProfile::load(&path).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&p.name, t.name.trim());
            prop_assert_eq!(&p.api, &t.api);
            prop_assert_eq!(&p.model, t.model.trim());
            prop_assert_eq!(&p.api_key_env, &t.api_key_env);
            prop_assert_eq!(p.roles.len(), t.roles.len());
            for (got, want) in p.roles.iter().zip(&t.roles) {
                prop_assert_eq!(&got.name, want.name.trim());
                prop_assert_eq!(&got.launch, &s.dir.path().join(want.launch));
                prop_assert_eq!(got.restart.as_deref(), want.restart.as_deref().map(str::trim));
                prop_assert_eq!(&got.health, &want.health);
                prop_assert_eq!(&got.metrics, &want.metrics);
                prop_assert_eq!(
                    got.health_timeout_s,
                    want.health_timeout_s
                        .map_or(super::target::DEFAULT_HEALTH_TIMEOUT_S, |v| v as u64),
                );
            }

            let (what, broken) = match bad {
                0 => ("api", doc.with_line("api", "api = \"https://127.0.0.1/v1\"".into())),
                1 => ("model", doc.with_line("model", "model = \"  \"".into())),
                2 => ("launch", doc.with_line("launch", "launch = \"missing.sh\"".into())),
                3 => ("health", doc.with_line("health", "health = \"127.0.0.1:1/health\"".into())),
                4 => {
                    let first = toml_str(t.roles[0].name.trim());
                    ("role.name", doc.with_line("role.name", format!("name = {first}")))
                }
                _ => ("name", doc.with_line("name", "name = 7".into())),
            };
            if what == "role.name" && t.roles.len() < 2 {
                return Ok(());
            }
            let path = s.write("target.toml", broken.text(crlf).as_bytes());
            let err = TargetProfile::load(&path).expect_err("a bad value loads");
            check_error(&err, &path, broken.text(crlf).as_bytes())?;
            invalid_at(err, broken.line_of(what), what)
        })?;
    }

    /// A generated flag file loads to its setting, roles and values; one bad value is
    /// refused at its line.
    #[test]
    fn flag_files_load_or_point_at_the_bad_line(
        f in gen_flag(),
        crlf in any::<bool>(),
        bad in 0..4u8,
    ) {
        with_scratch(|s| {
            let doc = flag_doc(&f);
            let (_, catalog) = load_flag(s, doc.text(crlf).as_bytes());
            let catalog = catalog.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let spec = catalog.get(FLAG_STEM).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = match f.kind {
                "env" => Setting::Env(f.key.clone()),
                "arg" => Setting::Arg(f.key.clone()),
                _ => Setting::Switch(f.key.clone()),
            };
            prop_assert_eq!(&spec.setting, &want);
            prop_assert_eq!(&spec.roles, &f.roles);
            prop_assert_eq!((&spec.on, &spec.off), (&f.on, &f.off));
            prop_assert_eq!(&spec.doc, f.doc.trim());

            let (what, broken) = match bad {
                0 => ("off", doc.with_line("off", format!("off = {}", toml_str(&f.on)))),
                1 => ("on", doc.with_line("on", "on = \"1; reboot\"".into())),
                2 => ("roles", doc.with_line("roles", "roles = []".into())),
                _ => ("key", doc.with_line("key", format!("{} = \"1 bad\"", f.kind))),
            };
            let (path, result) = load_flag(s, broken.text(crlf).as_bytes());
            let err = result.expect_err("a bad value loads");
            check_error(&err, &path, broken.text(crlf).as_bytes())?;
            invalid_at(err, broken.line_of(what), what)
        })?;
    }

    /// A generated workload loads to the values written; one bad value is refused at
    /// its line.
    #[test]
    fn workloads_load_or_point_at_the_bad_line(
        w in gen_workload(),
        crlf in any::<bool>(),
        bad in 0..8u8,
    ) {
        with_scratch(|s| {
            let doc = workload_doc(&w);
            let (_, loaded) = load_workload(s, doc.text(crlf).as_bytes());
            let got = loaded.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                got.name,
                w.name.as_deref().map_or("gen_workload".to_string(), |n| n.trim().to_string()),
            );
            prop_assert_eq!(
                (got.sessions as i64, got.rounds as i64, got.ctx as i64, got.max_tokens as i64),
                (w.sessions, w.rounds, w.ctx, w.max_tokens)
            );
            prop_assert_eq!(got.timeout_s.to_bits(), w.timeout_s.to_bits());
            prop_assert_eq!(got.temperature.to_bits(), w.temperature.unwrap_or(0.0).to_bits());
            prop_assert_eq!(got.check_args.as_str(), w.check_args.unwrap_or("strict"));
            prop_assert_eq!(got.barrier, w.barrier.unwrap_or(false));
            prop_assert_eq!(got.seed, w.seed.map_or(1, |s| s as u64));
            prop_assert_eq!(got.task.steps as i64, w.steps);
            prop_assert_eq!(&got.task.intro, w.intro.trim());
            prop_assert_eq!(&got.task.outro, w.outro.trim());
            prop_assert_eq!(got.tools.len(), w.tools.len());
            for (tool, want) in got.tools.iter().zip(&w.tools) {
                prop_assert_eq!(&tool.name, &want.name);
                prop_assert_eq!(&tool.description, want.description.trim());
                prop_assert_eq!(tool.property_names().len(), want.props.len());
                for (prop, ty) in &want.props {
                    let pool = &tool.arg_values[prop];
                    let expected: Vec<serde_json::Value> = match ty {
                        PropType::Str(v) => v.iter().map(|x| x.clone().into()).collect(),
                        PropType::Int(v) => v.iter().map(|x| (*x).into()).collect(),
                        PropType::Bool(v) => v.iter().map(|x| (*x).into()).collect(),
                    };
                    prop_assert_eq!(pool, &expected);
                }
            }

            let (what, broken) = match bad {
                0 => ("sessions", doc.with_line("sessions", "sessions = 0".into())),
                1 => ("timeout_s", doc.with_line("timeout_s", "timeout_s = -1.0".into())),
                2 => ("steps", doc.with_line("steps", "steps = 0".into())),
                3 => ("outro", doc.with_line("outro", "outro = \" \\t \"".into())),
                4 => ("tool.name", doc.with_line("tool.name", "name = \"read file\"".into())),
                5 => ("ctx", doc.with_line("ctx", "ctx = -5".into())),
                6 => ("timeout_s", doc.with_line("timeout_s", "timeout_s = nan".into())),
                _ => ("steps", doc.with_line("steps", "steps = \"two\"".into())),
            };
            let (path, result) = load_workload(s, broken.text(crlf).as_bytes());
            let err = result.expect_err("a bad value loads");
            check_error(&err, &path, broken.text(crlf).as_bytes())?;
            invalid_at(err, broken.line_of(what), what)
        })?;
    }

    /// Any bytes as a target profile: loads, or an error naming the file (and a line
    /// inside it for a bad document); never a panic.
    #[test]
    fn any_text_as_a_target_profile_fails_cleanly(text in any_document(valid_target_text())) {
        with_scratch(|s| {
            let path = s.write("any_target.toml", &text);
            match TargetProfile::load(&path) {
                Ok(p) => prop_assert!(!p.roles.is_empty()),
                Err(err) => check_error(&err, &path, &text)?,
            }
            Ok(())
        })?;
    }

    /// Any bytes as a flag file: as above.
    #[test]
    fn any_text_as_a_flag_file_fails_cleanly(text in any_document(valid_flag_text())) {
        with_scratch(|s| {
            let (path, result) = load_flag(s, &text);
            match result {
                Ok(catalog) => prop_assert!(catalog.get(FLAG_STEM).is_ok()),
                Err(err) => check_error(&err, &path, &text)?,
            }
            Ok(())
        })?;
    }

    /// Any bytes as a workload: as above.
    #[test]
    fn any_text_as_a_workload_fails_cleanly(text in any_document(valid_workload_text())) {
        with_scratch(|s| {
            let (path, result) = load_workload(s, &text);
            match result {
                Ok(w) => prop_assert!(!w.tools.is_empty() && w.sessions >= 1),
                Err(err) => check_error(&err, &path, &text)?,
            }
            Ok(())
        })?;
    }
}

#[test]
fn line_of_is_the_line_the_documents_count() {
    let mut doc = Doc::default();
    doc.raw("a");
    doc.key("b", "b = 1".into());
    let text = doc.text(true);
    assert_eq!(line_of(&text, text.find("b =").unwrap()), doc.line_of("b"));
}
