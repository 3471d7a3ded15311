//! The flag catalog (docs/design.md 3.3): `flags/NAME.toml` plus any `--flags-dir`.
//!
//! Owns the flag file format, its validation (one of env/arg/switch, roles, on/off,
//! value characters) and lookup by catalog name or by the setting's own key. The six
//! shipped flags are embedded so the binary works from any directory.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use super::{read_text, ConfigError, Source, TargetProfile};
pub use crate::core::flag::{FlagSpec, Pin, Setting};

/// How a flag's roles meet a target's roles ([`FlagCatalog::coverage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// The target has every role the flag lists.
    Full,
    /// The target lacks these of the flag's roles.
    Partial { missing: Vec<String> },
    /// The target has none of the flag's roles.
    None,
}

/// All known flags, by catalog name (later directories override earlier ones).
#[derive(Debug, Clone, Default)]
pub struct FlagCatalog {
    pub flags: Vec<FlagSpec>,
}

/// The shipped catalog, embedded at build time: (file name, contents).
const BUILTIN_FLAGS: &[(&str, &str)] = &[
    (
        "BF16_INDEX_K.toml",
        include_str!("../../../../flags/BF16_INDEX_K.toml"),
    ),
    (
        "HICACHE.toml",
        include_str!("../../../../flags/HICACHE.toml"),
    ),
    (
        "INDEX_K_HICACHE_SYNC.toml",
        include_str!("../../../../flags/INDEX_K_HICACHE_SYNC.toml"),
    ),
    (
        "MMA_FLASHMLA.toml",
        include_str!("../../../../flags/MMA_FLASHMLA.toml"),
    ),
    (
        "TOPK_V2.toml",
        include_str!("../../../../flags/TOPK_V2.toml"),
    ),
    (
        "CUDA_GRAPH_MAX_BS.toml",
        include_str!("../../../../flags/CUDA_GRAPH_MAX_BS.toml"),
    ),
];

/// Characters a flag value may hold: values are written into shell scripts unquoted, so
/// anything the shell would interpret (spaces, `$`, quotes, `;`, backticks...) is refused.
const VALUE_PATTERN: &str = "^[A-Za-z0-9._:/,=+-]*$";

fn value_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(VALUE_PATTERN).expect("static value pattern"))
}

/// Checks a flag value (from a catalog file or `--set NAME=VALUE`) against the allowed
/// characters `[A-Za-z0-9._:/,=+-]*`. The error says which character is refused.
pub fn validate_value(v: &str) -> Result<(), String> {
    if value_regex().is_match(v) {
        return Ok(());
    }
    let bad = v
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._:/,=+-".contains(*c)))
        .map(|c| format!("{c:?}"))
        .unwrap_or_else(|| "a character".into());
    Err(format!(
        "value {v:?} contains {bad}; flag values may only use letters, digits and . _ : / , = + - \
         (they are written into shell scripts unquoted)"
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFlag {
    name: Option<Spanned<String>>,
    doc: Option<String>,
    env: Option<Spanned<String>>,
    arg: Option<Spanned<String>>,
    switch: Option<Spanned<String>>,
    roles: Spanned<Vec<Spanned<String>>>,
    on: Spanned<String>,
    off: Spanned<String>,
    mechanism: Option<super::mechanism::RawMechanism>,
}

const FLAG_FIX: &str =
    "see flags/BF16_INDEX_K.toml for the format: name, doc, one of env/arg/switch, roles, on, off, [mechanism]";

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_option_name(s: &str) -> bool {
    let body = s.strip_prefix("--").or_else(|| s.strip_prefix('-'));
    match body {
        Some(b) => {
            b.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && b.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        }
        None => false,
    }
}

fn is_catalog_name(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// Parses and validates one catalog file. `stem` is the file name without `.toml`,
/// which is the catalog name.
fn parse_flag(path: &Path, text: &str, stem: &str) -> Result<FlagSpec, ConfigError> {
    let src = Source { path, text };
    let raw: RawFlag = src.parse(FLAG_FIX)?;

    if !is_catalog_name(stem) {
        return Err(src.invalid(
            0..0,
            format!("catalog file name `{stem}` is not a valid flag name"),
            "name the file NAME.toml with NAME made of letters, digits and _ (e.g. BF16_INDEX_K.toml)",
        ));
    }
    if let Some(name) = &raw.name {
        if name.get_ref() != stem {
            return Err(src.invalid(
                name.span(),
                format!(
                    "name = {:?} differs from the file name {stem}.toml (the file name is the catalog name)",
                    name.get_ref()
                ),
                format!("rename the file to {}.toml or set name = {stem:?}", name.get_ref()),
            ));
        }
    }

    let setting = setting(&src, &raw)?;
    let roles = roles(&src, &raw.roles)?;
    on_off(&src, &raw, &setting)?;
    let mechanism = match raw.mechanism {
        Some(m) => Some(super::mechanism::parse(&src, m, &roles)?),
        None => None,
    };

    Ok(FlagSpec {
        name: stem.to_string(),
        doc: raw.doc.unwrap_or_default().trim().to_string(),
        setting,
        roles,
        on: raw.on.into_inner(),
        off: raw.off.into_inner(),
        source: path.to_path_buf(),
        mechanism,
    })
}

/// Exactly one of `env`, `arg`, `switch`, with a key of its kind.
fn setting(src: &Source, raw: &RawFlag) -> Result<Setting, ConfigError> {
    let kinds: Vec<(&str, &Spanned<String>)> = [
        ("env", &raw.env),
        ("arg", &raw.arg),
        ("switch", &raw.switch),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    .collect();
    match kinds.as_slice() {
        [] => Err(src.invalid(
            raw.on.span(),
            "flag has none of env, arg, switch",
            "add exactly one: env = \"VAR\", arg = \"--arg\" or switch = \"--switch\"",
        )),
        [(kind, key)] => {
            let k = key.get_ref().clone();
            let ok = match *kind {
                "env" => is_env_name(&k),
                _ => is_option_name(&k),
            };
            if !ok {
                let expected = if *kind == "env" {
                    "an environment variable name like SGLANG_DSV4_BF16_INDEX_K"
                } else {
                    "a command-line option like --cuda-graph-max-bs"
                };
                return Err(src.invalid(
                    key.span(),
                    format!("{kind} = {k:?} is not {expected}"),
                    format!("set {kind} to {expected}"),
                ));
            }
            Ok(match *kind {
                "env" => Setting::Env(k),
                "arg" => Setting::Arg(k),
                _ => Setting::Switch(k),
            })
        }
        [_, (kind, key), ..] => Err(src.invalid(
            key.span(),
            format!(
                "flag sets more than one of env, arg, switch (found {})",
                kinds.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ),
            format!("keep exactly one; remove `{kind}` or the others"),
        )),
    }
}

/// `roles`: at least one, none empty, none twice.
fn roles(
    src: &Source,
    raw_roles: &Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<String>, ConfigError> {
    if raw_roles.get_ref().is_empty() {
        return Err(src.invalid(
            raw_roles.span(),
            "roles is empty: the flag would be written nowhere",
            "list the roles whose launch configs carry it, e.g. roles = [\"prefill\", \"decode\"]",
        ));
    }
    let mut seen = HashSet::new();
    let mut roles = Vec::new();
    for role in raw_roles.get_ref() {
        let r = role.get_ref().trim();
        if r.is_empty() {
            return Err(src.invalid(
                role.span(),
                "empty role name in roles",
                "use the role names of the target profile, e.g. \"prefill\"",
            ));
        }
        if !seen.insert(r.to_string()) {
            return Err(src.invalid(
                role.span(),
                format!("role {r:?} is listed twice"),
                "list each role once",
            ));
        }
        roles.push(r.to_string());
    }
    Ok(roles)
}

/// `on` and `off`: plain values that differ, non-empty for an arg flag.
fn on_off(src: &Source, raw: &RawFlag, setting: &Setting) -> Result<(), ConfigError> {
    for v in [&raw.on, &raw.off] {
        if let Err(msg) = validate_value(v.get_ref()) {
            return Err(src.invalid(v.span(), msg, "use a plain value such as 1, 0, 32, on, off"));
        }
        if matches!(setting, Setting::Arg(_)) && v.get_ref().is_empty() {
            return Err(src.invalid(
                v.span(),
                "an arg flag needs a non-empty value (`--arg VALUE`)",
                "give the value the argument takes, e.g. on = \"32\"",
            ));
        }
    }
    if raw.on.get_ref() == raw.off.get_ref() {
        return Err(src.invalid(
            raw.off.span(),
            format!(
                "on and off are both {:?}: the A/B would compare a value with itself",
                raw.on.get_ref()
            ),
            "set on to the engine's default value and off to the other one",
        ));
    }
    Ok(())
}

impl FlagCatalog {
    /// The six shipped flags (`flags/*.toml`, embedded in the binary).
    pub fn builtin() -> FlagCatalog {
        let mut catalog = FlagCatalog::default();
        for (file, text) in BUILTIN_FLAGS {
            let path = Path::new("flags").join(file);
            let stem = file.trim_end_matches(".toml");
            let spec = parse_flag(&path, text, stem)
                .unwrap_or_else(|e| panic!("shipped flag file is invalid: {e}"));
            catalog.insert(spec);
        }
        catalog
    }

    /// The builtin catalog plus every `*.toml` in `dirs`, in order; a later file with
    /// the same catalog name (case-insensitive) replaces the earlier one.
    pub fn load(dirs: &[PathBuf]) -> Result<FlagCatalog, ConfigError> {
        let mut catalog = FlagCatalog::builtin();
        for dir in dirs {
            let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::Read {
                path: dir.clone(),
                source,
            })?;
            let mut files = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|source| ConfigError::Read {
                    path: dir.clone(),
                    source,
                })?;
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
                    files.push(path);
                }
            }
            // Directory order is arbitrary; sorting keeps overrides reproducible.
            files.sort();
            for path in files {
                let text = read_text(&path)?;
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                catalog.insert(parse_flag(&path, &text, &stem)?);
            }
        }
        Ok(catalog)
    }

    fn insert(&mut self, spec: FlagSpec) {
        match self
            .flags
            .iter_mut()
            .find(|f| f.name.eq_ignore_ascii_case(&spec.name))
        {
            Some(existing) => *existing = spec,
            None => self.flags.push(spec),
        }
    }

    /// Whether `flag` can be flipped on `target`: every role it lists is one of the
    /// target's (the built-in SGLang flags name prefill and decode, which a one-role
    /// llama.cpp target does not have).
    pub(crate) fn applies_to(flag: &FlagSpec, target: &TargetProfile) -> bool {
        flag.roles.iter().all(|r| target.role(r).is_some())
    }

    /// Which of `flag`'s roles `target` has: all of them (the flag applies), some of
    /// them (a run would flip it in those only), or none. `bisect flags --target` and
    /// `bisect check` both say this from here, so they never disagree.
    pub fn coverage(flag: &FlagSpec, target: &TargetProfile) -> Coverage {
        let missing: Vec<String> = flag
            .roles
            .iter()
            .filter(|r| target.role(r).is_none())
            .cloned()
            .collect();
        if missing.is_empty() {
            Coverage::Full
        } else if missing.len() == flag.roles.len() {
            Coverage::None
        } else {
            Coverage::Partial { missing }
        }
    }

    /// The catalog's flags that apply to `target`, and those that do not, in catalog order.
    pub fn split_for<'a>(
        &'a self,
        target: &TargetProfile,
    ) -> (Vec<&'a FlagSpec>, Vec<&'a FlagSpec>) {
        self.flags
            .iter()
            .partition(|f| FlagCatalog::applies_to(f, target))
    }

    /// Catalog names, in catalog order.
    pub fn names(&self) -> Vec<&str> {
        self.flags.iter().map(|f| f.name.as_str()).collect()
    }

    /// Looks a flag up by catalog name (any case) or by its setting's key
    /// (`SGLANG_DSV4_BF16_INDEX_K`, `--cuda-graph-max-bs`).
    pub fn get(&self, name: &str) -> Result<&FlagSpec, ConfigError> {
        let wanted = name.trim();
        self.flags
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(wanted))
            .or_else(|| {
                self.flags
                    .iter()
                    .find(|f| f.setting.key().eq_ignore_ascii_case(wanted))
            })
            .ok_or_else(|| ConfigError::UnknownFlag {
                name: wanted.to_string(),
                known: self.names().join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, stem: &str) -> Result<FlagSpec, ConfigError> {
        parse_flag(Path::new("flags/X.toml"), text, stem)
    }

    fn invalid_line(err: ConfigError) -> (usize, String) {
        err.line_and_text()
    }

    #[test]
    fn builtin_has_the_six_shipped_flags_with_their_settings() {
        let c = FlagCatalog::builtin();
        assert_eq!(
            c.names(),
            [
                "BF16_INDEX_K",
                "HICACHE",
                "INDEX_K_HICACHE_SYNC",
                "MMA_FLASHMLA",
                "TOPK_V2",
                "CUDA_GRAPH_MAX_BS"
            ]
        );
        let f = c.get("BF16_INDEX_K").unwrap();
        assert_eq!(f.setting, Setting::Env("SGLANG_DSV4_BF16_INDEX_K".into()));
        assert_eq!((f.on.as_str(), f.off.as_str()), ("1", "0"));
        assert_eq!(f.roles, ["prefill", "decode"]);
        let h = c.get("HICACHE").unwrap();
        assert_eq!(
            h.setting,
            Setting::Switch("--enable-hierarchical-cache".into())
        );
        assert_eq!(h.roles, ["prefill"]);
        let s = c.get("INDEX_K_HICACHE_SYNC").unwrap();
        assert_eq!((s.on.as_str(), s.off.as_str()), ("0", "1"));
        let g = c.get("CUDA_GRAPH_MAX_BS").unwrap();
        assert_eq!(g.setting, Setting::Arg("--cuda-graph-max-bs".into()));
        assert_eq!((g.on.as_str(), g.off.as_str()), ("32", "64"));
        assert!(c.flags.iter().all(|f| !f.doc.is_empty()));
        assert!(c.flags.iter().all(|f| f.source.is_relative()));
    }

    #[test]
    fn get_accepts_any_case_and_the_setting_key() {
        let c = FlagCatalog::builtin();
        assert_eq!(c.get("bf16_index_k").unwrap().name, "BF16_INDEX_K");
        assert_eq!(
            c.get("SGLANG_DSV4_BF16_INDEX_K").unwrap().name,
            "BF16_INDEX_K"
        );
        assert_eq!(
            c.get("--cuda-graph-max-bs").unwrap().name,
            "CUDA_GRAPH_MAX_BS"
        );
        assert_eq!(
            c.get("--enable-hierarchical-cache").unwrap().name,
            "HICACHE"
        );
    }

    #[test]
    fn unknown_flag_lists_known_ones() {
        let err = FlagCatalog::builtin().get("FP4_KV").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ConfigError::UnknownFlag { .. }));
        assert!(text.contains("FP4_KV"), "{text}");
        for known in ["BF16_INDEX_K", "HICACHE", "TOPK_V2", "CUDA_GRAPH_MAX_BS"] {
            assert!(text.contains(known), "{text}");
        }
    }

    #[test]
    fn to_json_names_the_setting_kind() {
        let c = FlagCatalog::builtin();
        let j = c.get("CUDA_GRAPH_MAX_BS").unwrap().to_json();
        assert_eq!(j["arg"], "--cuda-graph-max-bs");
        assert_eq!(j["roles"], serde_json::json!(["decode"]));
        assert_eq!(j["on"], "32");
        assert!(j.get("env").is_none());
    }

    #[test]
    fn value_with_shell_metacharacters_is_refused_with_its_line() {
        let text = "name = \"X\"\nenv = \"X_VAR\"\nroles = [\"decode\"]\non = \"1; rm -rf /\"\noff = \"0\"\n";
        let (line, msg) = invalid_line(parse(text, "X").unwrap_err());
        assert_eq!(line, 4);
        assert!(msg.contains("';'") || msg.contains("' '"), "{msg}");
        for bad in [
            "$(id)", "a b", "`x`", "'q'", "a\"b", "x|y", "x&y", "a>b", "a\\b",
        ] {
            assert!(validate_value(bad).is_err(), "{bad}");
        }
        for good in ["1", "0", "bf16", "a.b:c/d,e=f+g-h_i", ""] {
            assert!(validate_value(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn exactly_one_setting_kind() {
        let two = "env = \"A\"\narg = \"--a\"\nroles = [\"x\"]\non = \"1\"\noff = \"0\"\n";
        let (line, msg) = invalid_line(parse(two, "X").unwrap_err());
        assert_eq!(line, 2);
        assert!(msg.contains("more than one"), "{msg}");
        let none = "roles = [\"x\"]\non = \"1\"\noff = \"0\"\n";
        let (line, msg) = invalid_line(parse(none, "X").unwrap_err());
        assert_eq!(line, 2);
        assert!(msg.contains("none of env, arg, switch"), "{msg}");
    }

    #[test]
    fn roles_on_off_and_names_are_checked() {
        let empty = "env = \"A\"\nroles = []\non = \"1\"\noff = \"0\"\n";
        assert_eq!(invalid_line(parse(empty, "X").unwrap_err()).0, 2);
        let same = "env = \"A\"\nroles = [\"d\"]\non = \"1\"\noff = \"1\"\n";
        let (line, msg) = invalid_line(parse(same, "X").unwrap_err());
        assert_eq!(line, 4);
        assert!(msg.contains("both"), "{msg}");
        let mismatch = "name = \"Y\"\nenv = \"A\"\nroles = [\"d\"]\non = \"1\"\noff = \"0\"\n";
        let (line, msg) = invalid_line(parse(mismatch, "X").unwrap_err());
        assert_eq!(line, 1);
        assert!(msg.contains("X.toml"), "{msg}");
        let bad_env = "env = \"A-B\"\nroles = [\"d\"]\non = \"1\"\noff = \"0\"\n";
        assert_eq!(invalid_line(parse(bad_env, "X").unwrap_err()).0, 1);
        let bad_arg = "arg = \"cuda\"\nroles = [\"d\"]\non = \"1\"\noff = \"0\"\n";
        assert_eq!(invalid_line(parse(bad_arg, "X").unwrap_err()).0, 1);
        let empty_arg = "arg = \"--a\"\nroles = [\"d\"]\non = \"\"\noff = \"0\"\n";
        assert_eq!(invalid_line(parse(empty_arg, "X").unwrap_err()).0, 3);
    }

    #[test]
    fn malformed_toml_reports_the_parser_line() {
        let text = "env = \"A\"\nroles = [\"d\"]\non = \"1\n\noff = \"0\"\n";
        let (line, _) = invalid_line(parse(text, "X").unwrap_err());
        assert_eq!(line, 3);
        let unknown_key =
            "env = \"A\"\nroles = [\"d\"]\non = \"1\"\noff = \"0\"\ndefault = \"1\"\n";
        let (line, msg) = invalid_line(parse(unknown_key, "X").unwrap_err());
        assert_eq!(line, 5);
        assert!(msg.contains("default"), "{msg}");
    }

    #[test]
    fn load_adds_and_overrides_from_dirs_in_order() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(
            a.path().join("NEW_FLAG.toml"),
            "doc = \"d\"\narg = \"--new\"\nroles = [\"decode\"]\non = \"a\"\noff = \"b\"\n",
        )
        .unwrap();
        std::fs::write(
            a.path().join("BF16_INDEX_K.toml"),
            "env = \"OTHER\"\nroles = [\"decode\"]\non = \"1\"\noff = \"0\"\n",
        )
        .unwrap();
        std::fs::write(
            b.path().join("BF16_INDEX_K.toml"),
            "env = \"THIRD\"\nroles = [\"prefill\"]\non = \"1\"\noff = \"0\"\n",
        )
        .unwrap();
        std::fs::write(b.path().join("README.md"), "not a flag").unwrap();
        let c = FlagCatalog::load(&[a.path().to_path_buf(), b.path().to_path_buf()]).unwrap();
        assert_eq!(c.flags.len(), 7);
        assert_eq!(c.get("new_flag").unwrap().on, "a");
        let f = c.get("BF16_INDEX_K").unwrap();
        assert_eq!(f.setting, Setting::Env("THIRD".into()));
        assert_eq!(f.source, b.path().join("BF16_INDEX_K.toml"));

        std::fs::write(
            b.path().join("BROKEN.toml"),
            "env = \"B\"\nroles = [\"d\"]\non = \"1\"\noff = \"x y\"\n",
        )
        .unwrap();
        let err = FlagCatalog::load(&[b.path().to_path_buf()]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("BROKEN.toml:4:"), "{text}");

        let missing = a.path().join("nope");
        assert!(matches!(
            FlagCatalog::load(&[missing]).unwrap_err(),
            ConfigError::Read { .. }
        ));
    }
}
