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

use serde_json::Value;

use crate::config::{FlagSpec, Setting};

/// The key an engine reports a setting under: env variables as they are, command-line
/// arguments and switches the way argument parsers name them (`--enable-hierarchical-cache`
/// -> `enable_hierarchical_cache`).
pub fn report_key(setting: &Setting) -> String {
    match setting {
        Setting::Env(var) => var.clone(),
        Setting::Arg(arg) | Setting::Switch(arg) => arg.trim_start_matches('-').replace('-', "_"),
    }
}

/// JSON pointers tried, in order, in an engine's configuration document.
pub fn pointers(flag: &FlagSpec) -> Vec<String> {
    let key = report_key(&flag.setting)
        .replace('~', "~0")
        .replace('/', "~1");
    vec![format!("/flags/{key}"), format!("/{key}")]
}

/// The flag's value as the engine reports it, as text; `None` when it does not say.
pub fn reported(doc: &Value, flag: &FlagSpec) -> Option<String> {
    pointers(flag)
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
