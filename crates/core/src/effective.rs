//! The effective-configuration check (docs/design.md 3.7, "effective"): what an engine
//! says it runs with, compared with the value its arm wrote into the launch config.
//!
//! A read-back of the launch file proves the text changed; it does not prove the engine
//! honoured it (a dead `[ -f /x ] && export FLAG=0`, a variable the engine ignores, an
//! engine that was never restarted). Engines that report their configuration (the
//! embedded engine's `/server_info` under `flags`, SGLang's `/get_server_info` with the
//! server arguments at the top level) close that gap: a reported value that disagrees
//! with the arm's value blocks the verdict.
//!
//! Pure: the documents are fetched by the arm lifecycle.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::flag::{FlagSpec, Setting};

/// The key an engine reports a setting under: env variables as they are, command-line
/// arguments and switches the way argument parsers name them (`--enable-hierarchical-cache`
/// -> `enable_hierarchical_cache`).
pub fn report_key(setting: &Setting) -> String {
    match setting {
        Setting::Env(var) => var.clone(),
        Setting::Arg(arg) | Setting::Switch(arg) => arg.trim_start_matches('-').replace('-', "_"),
    }
}

/// An effective-configuration document from a Prometheus text exposition, for engines
/// whose only self-report is `/metrics` (vLLM): every info metric (a name ending in
/// `_info`) becomes `{"<name>": {label: value}}`, so a profile points at
/// `/vllm:cache_config_info/cache_dtype`; `process_start_time_seconds` (the Python
/// client's process collector) becomes `start_time`, which names the process for the
/// check that one engine served a whole block. `None` when the text has neither.
pub(crate) fn prometheus_doc(text: &str) -> Option<Value> {
    let mut doc = serde_json::Map::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        if name == "process_start_time_seconds" {
            let value = line[name_end..].split_whitespace().next();
            if let Some(v) = value.and_then(|v| v.parse::<f64>().ok()) {
                doc.insert("start_time".into(), serde_json::json!(v));
            }
        } else if name.ends_with("_info") && line[name_end..].starts_with('{') {
            if let Some(labels) = prometheus_labels(&line[name_end + 1..]) {
                doc.insert(name.to_string(), Value::Object(labels));
            }
        }
    }
    (!doc.is_empty()).then_some(Value::Object(doc))
}

/// An engine's self-report as served: a JSON document, else the info metrics of a
/// Prometheus exposition ([`prometheus_doc`], vLLM); with which of the two it was. The
/// one reading of an effective-config URL, for `run` and `bisect check` alike.
pub fn parse_document(text: &str) -> Option<(Value, &'static str)> {
    serde_json::from_str(text)
        .ok()
        .map(|doc| (doc, "a JSON document"))
        .or_else(|| prometheus_doc(text).map(|doc| (doc, "Prometheus info metrics")))
}

/// `a="1",b="x\"y"} 1.0` -> {a: "1", b: "x\"y"}; `None` when the braces do not close.
fn prometheus_labels(text: &str) -> Option<serde_json::Map<String, Value>> {
    let mut labels = serde_json::Map::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            let _ = after;
            return Some(labels);
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        labels.insert(key, Value::String(value));
        rest = &rest[end?..];
    }
}

/// Where a role's engine reports a flag's value (a target profile's `effective_pointers`
/// entry), and, where the engine's word for it is not the flag's, the word it uses in
/// each arm: vLLM reports `enable_prefix_caching="False"` when NO_PREFIX_CACHING is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectivePointer {
    /// A JSON pointer into the role's effective-config document.
    pub pointer: String,
    /// (what the engine reports when the flag is on, when it is off).
    pub reports: Option<(String, String)>,
}

impl EffectivePointer {
    /// A pointer whose value is the flag's own.
    pub fn plain(pointer: &str) -> Self {
        EffectivePointer {
            pointer: pointer.to_string(),
            reports: None,
        }
    }

    /// The value at the pointer in the flag's terms: the flag's on (off) value where the
    /// engine reported its word for on (off), [`agrees`]-wise; any other report as it is,
    /// so it disagrees with both arms.
    pub fn read(&self, doc: &Value, flag: &FlagSpec) -> Option<String> {
        let raw = reported_at(doc, std::slice::from_ref(&self.pointer))?;
        Some(match &self.reports {
            Some((on, _)) if agrees(on, &raw) => flag.on.clone(),
            Some((_, off)) if agrees(off, &raw) => flag.off.clone(),
            _ => raw,
        })
    }
}

/// The flag's value as a role's engine reports it: at the profile's pointer for it
/// (mapped), else at the default [`pointers`].
pub fn reported_for(
    doc: &Value,
    flag: &FlagSpec,
    pointer: Option<&EffectivePointer>,
) -> Option<String> {
    match pointer {
        Some(p) => p.read(doc, flag),
        None => reported(doc, flag),
    }
}

/// JSON pointers tried, in order, in an engine's configuration document.
pub(crate) fn pointers(flag: &FlagSpec) -> Vec<String> {
    let key = report_key(&flag.setting)
        .replace('~', "~0")
        .replace('/', "~1");
    vec![format!("/flags/{key}"), format!("/{key}")]
}

/// The flag's value as the engine reports it, as text; `None` when it does not say.
pub fn reported(doc: &Value, flag: &FlagSpec) -> Option<String> {
    reported_at(doc, &pointers(flag))
}

/// The value at the first of `pointers` the document has, as text (a role's
/// `effective_pointers` from the target profile, or [`pointers`]).
pub(crate) fn reported_at(doc: &Value, pointers: &[String]) -> Option<String> {
    pointers
        .iter()
        .find_map(|p| doc.pointer(p))
        .and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::Null => Some("null".into()),
            _ => None,
        })
}

/// Where a role's process identity was read (docs/design.md 3.12): what run.json
/// names per role, so a reader knows what "the same engine served the block" rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    /// The engine's own self-report: `pid`/`started_at` (the embedded engine), or the
    /// process start time among vLLM's info metrics (`process_start_time_seconds`).
    EngineReport,
    /// llama-server's `Process-Start-Time-Unix` header on its `/metrics` reply.
    MetricsHeader,
    /// The operating system: the process listening on the role's health port, on this
    /// host (its pid and start time, read as `ss -ltnp` does).
    ListeningSocket,
    /// None of these: a restart is proven only by health going down, and a replacement
    /// during a block that never blinked health goes unseen.
    None,
}

impl IdentitySource {
    pub fn describe(self) -> &'static str {
        match self {
            IdentitySource::EngineReport => "the engine's self-report",
            IdentitySource::MetricsHeader => "the Process-Start-Time-Unix header of its /metrics",
            IdentitySource::ListeningSocket => "the process listening on its port (this host)",
            IdentitySource::None => "none: only health going down proves a restart",
        }
    }
}

/// Which process a role is: its pid and start time where known, the process listening
/// on its port where that can be read, and which of these was the best source. Every
/// part takes part in the comparison: an engine behind a proxy keeps its listener and
/// changes its report; a restarted engine that reports only a pid it got back changes
/// its listener's start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub source: IdentitySource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<String>,
    /// The start time as its source gives it (an engine's text or Unix seconds, or
    /// llama-server's monotonic start stamp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    /// The process listening on the role's port, on this host: `pid P started T` (T in
    /// clock ticks since boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
}

impl Identity {
    /// A role with no identity from any source.
    pub fn unknown() -> Identity {
        Identity {
            source: IdentitySource::None,
            pid: None,
            started: None,
            listener: None,
        }
    }

    pub fn is_known(&self) -> bool {
        self.pid.is_some() || self.started.is_some() || self.listener.is_some()
    }

    pub fn has_start_time(&self) -> bool {
        self.started.is_some() || self.listener.is_some()
    }

    /// `pid 41 started t1`, `?` for what is missing, then the listener where known
    /// (`... / listener pid 9 started 123`): the text a restart's proof and a
    /// replacement's warning compare and quote. A text that ends in ` started ?` has no
    /// start time ([`restart_proven`]).
    pub fn text(&self) -> String {
        let reported = (self.pid.is_some() || self.started.is_some()).then(|| {
            format!(
                "pid {} started {}",
                self.pid.as_deref().unwrap_or("?"),
                self.started.as_deref().unwrap_or("?")
            )
        });
        match (reported, &self.listener) {
            (Some(r), Some(l)) => format!("{r} / listener {l}"),
            (Some(r), None) => r,
            (None, Some(l)) => format!("listener {l}"),
            (None, None) => "nothing".into(),
        }
    }
}

/// Who an engine says it is in its effective-config document: `pid` and `started_at`
/// (the embedded engine), or `start_time` (vLLM's `process_start_time_seconds`, read by
/// [`prometheus_doc`]); `None` when it says neither.
pub fn reported_identity(doc: &Value) -> Option<Identity> {
    let field = |key: &str| {
        doc.get(key).filter(|v| !v.is_null()).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let pid = field("pid");
    let started = field("started_at").or_else(|| field("start_time"));
    if pid.is_none() && started.is_none() {
        return None;
    }
    Some(Identity {
        source: IdentitySource::EngineReport,
        pid,
        started,
        listener: None,
    })
}

/// Which build of its engine a role runs, as its self-report names it: SGLang's
/// `version`, llama-server's `build_info` (`/props`), the embedded engine's `version`
/// and `build` (its executable's size and modification time); `None` when it names
/// none (vLLM's `/metrics`). The solo oracle's reference cache is keyed by it: a
/// reference is reused across runs only where every role names its build.
pub fn build_identity(doc: &Value) -> Option<String> {
    let parts: Vec<String> = ["version", "build_info", "build"]
        .iter()
        .filter_map(|key| match doc.get(*key)? {
            Value::String(s) if !s.is_empty() => Some(format!("{key} {s}")),
            Value::Null | Value::String(_) => None,
            other => Some(format!("{key} {other}")),
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// [`reported_identity`] as text (`pid 41 started t1`).
pub fn identity(doc: &Value) -> Option<String> {
    reported_identity(doc).map(|i| i.text())
}

/// Whether a restart by the role's own command is proven (docs/design.md 3.2): the
/// engine's reported identity changed, or, where it reports no start time to compare,
/// health went down and came back. An identity with a start time outranks health: a
/// role's health can fail for another role's restart (a decode that reports a dead
/// prefill) while its own command restarted nothing, and the same start time says the
/// same process answered. A pid alone does not: a restarted container's engine can get
/// its old pid back. Else why not.
pub fn restart_proven(
    before: Option<&str>,
    after: Option<&str>,
    went_down: bool,
) -> Result<(), String> {
    let with_start_time = |identity: &str| !identity.ends_with(" started ?");
    match (before, after) {
        (Some(b), Some(a)) if a != b => Ok(()),
        (Some(b), Some(_)) if with_start_time(b) => Err(if went_down {
            format!(
                "its health URL went down and came back, but the engine still reports {b}: \
                 the same process answered (its health may follow another role's restart)"
            )
        } else {
            format!("its health URL answered throughout and the engine still reports {b}")
        }),
        _ if went_down => Ok(()),
        (Some(b), Some(_)) => Err(format!(
            "its health URL answered throughout and the engine still reports {b}"
        )),
        (None, Some(a)) => Err(format!(
            "its health URL answered throughout; it now reports {a}, but reported no pid or \
             start time before the restart to compare with"
        )),
        (_, None) => Err(
            "its health URL answered throughout and the engine reports no `pid` or `started_at` \
             to tell a new process from the old one"
                .to_string(),
        ),
    }
}

fn truth(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" | "" | "null" => Some(false),
        _ => None,
    }
}

/// Whether an engine's reported value means the value the arm wrote: equal text,
/// equal numbers (`32` and `32.0`), or the same truth value (`1`, `true`, `on`).
pub fn agrees(intended: &str, reported: &str) -> bool {
    if intended.trim() == reported.trim() {
        return true;
    }
    if let (Ok(a), Ok(b)) = (
        intended.trim().parse::<f64>(),
        reported.trim().parse::<f64>(),
    ) {
        return a == b;
    }
    matches!((truth(intended), truth(reported)), (Some(a), Some(b)) if a == b)
}

/// A role whose engine reports a flag's value other than the one written for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    pub role: String,
    /// The value written into the role's launch config.
    pub expected: String,
    /// The value its engine reports.
    pub reported: String,
}

/// Every role of `reported` (role -> the value its engine reports) whose value does not
/// [`agrees`] with `expected`, in role order. The one comparison of a written value
/// with the engines' reports: `run`'s pins, the matrix's cells, the culprit search's
/// blocks and the run's `effective` confounds all judge with it, each in its own words.
pub fn disagreements(
    expected: &str,
    reported: &std::collections::BTreeMap<String, String>,
) -> Vec<Disagreement> {
    reported
        .iter()
        .filter(|(_, ran)| !agrees(expected, ran))
        .map(|(role, ran)| Disagreement {
            role: role.clone(),
            expected: expected.to_string(),
            reported: ran.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_named_by_the_fields_engines_report() {
        use serde_json::json;
        assert_eq!(
            build_identity(&json!({"version": "0.5.5", "tp_size": 1})).as_deref(),
            Some("version 0.5.5")
        );
        assert_eq!(
            build_identity(&json!({"build_info": "b5280-abc1234", "total_slots": 4})).as_deref(),
            Some("build_info b5280-abc1234")
        );
        assert_eq!(build_identity(&json!({"version": "", "pid": 4})), None);
        assert_eq!(
            build_identity(&json!({"vllm:num_requests_running": 0})),
            None
        );
    }

    #[test]
    fn a_mapped_pointer_reads_the_engine_s_words_as_the_flag_s_values() {
        // vLLM's info metric says enable_prefix_caching="False" when the disabling
        // switch NO_PREFIX_CACHING is on (written "on").
        let flag = FlagSpec {
            on: "on".into(),
            off: "off".into(),
            ..flag(Setting::Switch("--no-enable-prefix-caching".into()))
        };
        let doc =
            |v: &str| serde_json::json!({"vllm:cache_config_info": {"enable_prefix_caching": v}});
        let pointer = EffectivePointer {
            pointer: "/vllm:cache_config_info/enable_prefix_caching".into(),
            reports: Some(("False".into(), "True".into())),
        };
        assert_eq!(pointer.read(&doc("False"), &flag).as_deref(), Some("on"));
        assert_eq!(pointer.read(&doc("True"), &flag).as_deref(), Some("off"));
        // Neither word: as reported, so it disagrees with both arms.
        assert_eq!(pointer.read(&doc("maybe"), &flag).as_deref(), Some("maybe"));
        assert!(!agrees("on", "maybe") && !agrees("off", "maybe"));
        // Unmapped, the engine's own word: "False" against "on" disagrees (the fault a
        // negating flag had without the mapping).
        let plain = EffectivePointer::plain("/vllm:cache_config_info/enable_prefix_caching");
        assert!(!agrees("on", &plain.read(&doc("False"), &flag).unwrap()));
        assert_eq!(reported_for(&doc("False"), &flag, None), None);
        // A real vLLM's /metrics (tests/fixtures/engines/vllm/cpu-0.32.0/), prefix caching
        // on: the flag reads off.
        let real = prometheus_doc(&crate::testing::engine_fixture(
            "vllm/cpu-0.32.0/metrics.txt",
        ))
        .unwrap();
        assert_eq!(pointer.read(&real, &flag).as_deref(), Some("off"));
    }
    use serde_json::json;

    fn flag(setting: Setting) -> FlagSpec {
        FlagSpec {
            name: "F".into(),
            doc: String::new(),
            setting,
            roles: vec!["prefill".into()],
            on: "1".into(),
            off: "0".into(),
            source: "flags/F.toml".into(),
            mechanism: None,
        }
    }

    #[test]
    fn keys_follow_how_engines_name_settings() {
        assert_eq!(report_key(&Setting::Env("SGLANG_X".into())), "SGLANG_X");
        assert_eq!(
            report_key(&Setting::Switch("--enable-hierarchical-cache".into())),
            "enable_hierarchical_cache"
        );
        assert_eq!(
            report_key(&Setting::Arg("--cuda-graph-max-bs".into())),
            "cuda_graph_max_bs"
        );
    }

    #[test]
    fn reported_values_are_found_nested_or_at_the_top() {
        let embedded = json!({"flags": {"SGLANG_DSV4_BF16_INDEX_K": 1}});
        let f = flag(Setting::Env("SGLANG_DSV4_BF16_INDEX_K".into()));
        assert_eq!(reported(&embedded, &f).as_deref(), Some("1"));
        let sglang = json!({"enable_hierarchical_cache": true, "tp_size": 8});
        let s = flag(Setting::Switch("--enable-hierarchical-cache".into()));
        assert_eq!(reported(&sglang, &s).as_deref(), Some("true"));
        assert_eq!(reported(&json!({"other": 1}), &f), None);
        assert_eq!(
            reported(&json!({"flags": {"SGLANG_DSV4_BF16_INDEX_K": [1]}}), &f),
            None
        );
    }

    #[test]
    fn a_restart_is_proven_by_going_down_or_a_new_identity() {
        let old = identity(&json!({"pid": 41, "started_at": "t1"}));
        assert_eq!(old.as_deref(), Some("pid 41 started t1"));
        let new = identity(&json!({"pid": 42, "started_at": "t2"}));
        assert_eq!(identity(&json!({"role": "prefill"})), None);
        // vLLM's process start time, from its info metrics, names the process too.
        let vllm = reported_identity(&json!({"start_time": 1.7e9})).unwrap();
        assert_eq!(vllm.source, IdentitySource::EngineReport);
        assert!(vllm.has_start_time() && vllm.pid.is_none(), "{vllm:?}");
        assert_eq!(
            identity(&json!({"pid": 7})).as_deref(),
            Some("pid 7 started ?")
        );
        assert!(restart_proven(old.as_deref(), new.as_deref(), false).is_ok());
        assert!(restart_proven(None, None, true).is_ok());
        let same = restart_proven(old.as_deref(), old.as_deref(), false).unwrap_err();
        assert!(same.contains("still reports pid 41 started t1"), "{same}");
        let silent = restart_proven(None, None, false).unwrap_err();
        assert!(silent.contains("no `pid` or `started_at`"), "{silent}");
        assert!(restart_proven(None, new.as_deref(), false).is_err());
        // Health went down (another role's restart took it with it), yet the same
        // process, by its start time, answers: not proven.
        let followed = restart_proven(old.as_deref(), old.as_deref(), true).unwrap_err();
        assert!(
            followed.contains("went down and came back, but the engine still reports pid 41"),
            "{followed}"
        );
        // A pid alone may come back after a container restart: going down counts there.
        let pid_only = identity(&json!({"pid": 1}));
        assert!(restart_proven(pid_only.as_deref(), pid_only.as_deref(), true).is_ok());
        assert!(restart_proven(pid_only.as_deref(), pid_only.as_deref(), false).is_err());
    }

    /// vLLM's own exposition (tests/fixtures/engines/vllm/metrics.txt): the process start
    /// time of its one API server names the process.
    #[test]
    fn vllm_names_its_process_by_its_start_time() {
        let doc = prometheus_doc(&crate::testing::engine_fixture("vllm/metrics.txt")).unwrap();
        let identity = reported_identity(&doc).unwrap();
        assert_eq!(identity.started.as_deref(), Some("1796326980.0"));
        assert_eq!(identity.source, IdentitySource::EngineReport);
    }

    #[test]
    fn a_configured_pointer_reads_where_the_engine_reports() {
        let vllm = json!({"server_args": {"enable_prefix_caching": false}});
        let at = ["/server_args/enable_prefix_caching".to_string()];
        assert_eq!(reported_at(&vllm, &at).as_deref(), Some("false"));
        assert_eq!(reported_at(&vllm, &["/missing".to_string()]), None);
        assert_eq!(
            reported_at(&json!(7), &[String::new()]).as_deref(),
            Some("7")
        );
    }

    #[test]
    fn agreement_is_textual_numeric_or_boolean() {
        assert!(agrees("1", "1"));
        assert!(agrees("on", "true"));
        assert!(agrees("off", "false"));
        assert!(agrees("0", "false"));
        assert!(agrees("32", "32.0"));
        assert!(!agrees("1", "0"));
        assert!(!agrees("on", "false"));
        assert!(!agrees("32", "16"));
        assert!(!agrees("bf16", "fp8"));
    }

    #[test]
    fn disagreements_are_the_roles_whose_report_means_another_value() {
        let reported: std::collections::BTreeMap<String, String> =
            [("decode", "true"), ("prefill", "0"), ("router", "1.0")]
                .into_iter()
                .map(|(r, v)| (r.to_string(), v.to_string()))
                .collect();
        assert_eq!(
            disagreements("1", &reported),
            vec![Disagreement {
                role: "prefill".into(),
                expected: "1".into(),
                reported: "0".into(),
            }]
        );
        let roles: Vec<String> = disagreements("off", &reported)
            .into_iter()
            .map(|d| d.role)
            .collect();
        assert_eq!(roles, ["decode", "router"]);
        assert!(disagreements("1", &Default::default()).is_empty());
    }

    #[test]
    fn a_prometheus_exposition_becomes_a_document_of_its_info_metrics() {
        let text = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
            # TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\",enable_prefix_caching=\"True\",note=\"a \\\"q\\\" b\"} 1.0\n\
            vllm:num_requests_running{model_name=\"m\"} 3.0\n\
            process_start_time_seconds 1.7e9\n";
        let doc = prometheus_doc(text).unwrap();
        assert_eq!(
            reported_at(&doc, &["/vllm:cache_config_info/cache_dtype".to_string()]).as_deref(),
            Some("fp8")
        );
        assert_eq!(doc["vllm:cache_config_info"]["note"], "a \"q\" b");
        assert_eq!(doc["start_time"], 1.7e9);
        assert!(doc.get("vllm:num_requests_running").is_none());
        assert_eq!(prometheus_doc("up 1\n# only this\n"), None);
        // A label list that never closes is not half read.
        assert!(prometheus_doc("x_info{a=\"1\"").is_none());
    }
}
