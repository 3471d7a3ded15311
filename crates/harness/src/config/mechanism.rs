//! The `[mechanism]` table of a flag file (docs/design.md 3.3 "Mechanism witnesses"):
//! what shows the path the flag controls ran, checked as the rest of the file is, each
//! error naming the file, the line and the fix. core::mechanism owns what the table
//! means; this reads it.

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Engine, Source};
use crate::core::mechanism::{Arms, Mechanism, Watch, Witness, WitnessKind};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMechanism {
    name: Spanned<String>,
    #[serde(rename = "in")]
    arms: Option<Spanned<String>>,
    #[serde(default)]
    fix: String,
    unobservable: Option<Spanned<String>>,
    #[serde(default)]
    witness: Vec<RawWitness>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWitness {
    engine: Option<Spanned<String>>,
    role: Option<Spanned<String>>,
    counter: Option<Spanned<String>>,
    log: Option<Spanned<String>>,
    endpoint: Option<Spanned<String>>,
    field: Option<Spanned<String>>,
    level: Option<String>,
    min: Option<u64>,
    source: Option<String>,
}

const WITNESS_FIX: &str = "a witness is one of counter = 'name{label=\"v\"}', log = 'regex' or \
                           endpoint = \"/path\" with field = \"/json/pointer\", and source = \
                           \"upstream file:line\" (see targets/llama-cpp-12253/flags/DEFRAG.toml)";

/// Checks a flag file's `[mechanism]` against the flag's `roles`.
pub(super) fn parse(
    src: &Source,
    raw: RawMechanism,
    roles: &[String],
) -> Result<Mechanism, ConfigError> {
    let name = raw.name.get_ref().trim().to_string();
    if name.is_empty() {
        return Err(src.invalid(
            raw.name.span(),
            "[mechanism] name is empty",
            "name what runs, e.g. name = \"defrag\"",
        ));
    }
    let arms =
        match raw.arms.as_ref().map(|a| (a.get_ref().as_str(), a.span())) {
            None | Some(("on", _)) => Arms::On,
            Some(("off", _)) => Arms::Off,
            Some(("both", _)) => Arms::Both,
            Some((other, span)) => return Err(src.invalid(
                span,
                format!("[mechanism] in = {other:?} is not an arm"),
                "in = \"on\" (the on value enables it), \"off\" (the off value does) or \"both\"",
            )),
        };
    let watch = match (&raw.unobservable, raw.witness.is_empty()) {
        (Some(why), true) if !why.get_ref().trim().is_empty() => {
            Watch::Unobservable(why.get_ref().trim().to_string())
        }
        (Some(why), true) => {
            return Err(src.invalid(
                why.span(),
                "[mechanism] unobservable is empty",
                "say in words why the engine shows this mechanism nowhere",
            ))
        }
        (Some(why), false) => {
            return Err(src.invalid(
                why.span(),
                "[mechanism] has both unobservable and witnesses",
                "keep the witnesses, or remove them and keep unobservable",
            ))
        }
        (None, true) => {
            return Err(src.invalid(
                raw.name.span(),
                "[mechanism] names no witness and does not say it is unobservable",
                WITNESS_FIX,
            ))
        }
        (None, false) => Watch::Witnesses(
            raw.witness
                .into_iter()
                .map(|w| witness(src, w, roles))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(Mechanism {
        name,
        arms,
        fix: raw.fix.trim().to_string(),
        watch,
    })
}

/// A counter selector as the metrics poller reads it: a Prometheus name, optionally
/// with `{label="value",...}` that a sample's labels must include.
fn check_selector(selector: &str) -> Result<(), &'static str> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        let label = r#"\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*"#;
        regex::Regex::new(&format!(
            r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{{{label}(?:,{label})*,?\}})?$"
        ))
        .expect("static selector pattern")
    });
    if re.is_match(selector) {
        Ok(())
    } else {
        Err("not a Prometheus name with optional {label=\"value\",...}")
    }
}

fn witness(src: &Source, raw: RawWitness, roles: &[String]) -> Result<Witness, ConfigError> {
    let kinds: Vec<&Spanned<String>> = [&raw.counter, &raw.log, &raw.endpoint]
        .into_iter()
        .flatten()
        .collect();
    let anchor = |raw: &RawWitness| {
        [
            &raw.counter,
            &raw.log,
            &raw.endpoint,
            &raw.role,
            &raw.engine,
        ]
        .into_iter()
        .flatten()
        .map(|s| s.span())
        .next()
        .unwrap_or(0..0)
    };
    let kind = match kinds.as_slice() {
        [] => {
            return Err(src.invalid(
                anchor(&raw),
                "a [[mechanism.witness]] has none of counter, log, endpoint",
                WITNESS_FIX,
            ))
        }
        [_, second, ..] => {
            return Err(src.invalid(
                second.span(),
                "a [[mechanism.witness]] has more than one of counter, log, endpoint",
                "make each kind its own [[mechanism.witness]]",
            ))
        }
        [_] => {
            if let Some(c) = &raw.counter {
                check_selector(c.get_ref()).map_err(|why| {
                    src.invalid(
                        c.span(),
                        format!("counter {:?}: {why}", c.get_ref()),
                        "a Prometheus name, optionally with labels: vllm:num_preemptions_total or name{outcome=\"x\"}",
                    )
                })?;
                WitnessKind::Counter {
                    selector: c.get_ref().clone(),
                }
            } else if let Some(l) = &raw.log {
                regex::Regex::new(l.get_ref()).map_err(|e| {
                    src.invalid(
                        l.span(),
                        format!("log pattern {:?} is not a regex: {e}", l.get_ref()),
                        "write a Rust regex in a literal string: log = 'requesting defrag'",
                    )
                })?;
                WitnessKind::Log {
                    pattern: l.get_ref().clone(),
                    level: raw.level.clone(),
                }
            } else {
                let e = raw.endpoint.as_ref().expect("one kind");
                let Some(field) = &raw.field else {
                    return Err(src.invalid(
                        e.span(),
                        "an endpoint witness needs field (a JSON pointer to a number)",
                        "add field = \"/pointer\"; a * segment sums every element: \"/*/n_decoded\"",
                    ));
                };
                if !e.get_ref().starts_with('/') || !field.get_ref().starts_with('/') {
                    return Err(src.invalid(
                        e.span(),
                        "endpoint and field must start with /",
                        "endpoint = \"/slots\", field = \"/*/n_past\"",
                    ));
                }
                WitnessKind::Endpoint {
                    path: e.get_ref().clone(),
                    field: field.get_ref().clone(),
                }
            }
        }
    };
    if let (Some(f), false) = (&raw.field, matches!(kind, WitnessKind::Endpoint { .. })) {
        return Err(src.invalid(
            f.span(),
            "field belongs to an endpoint witness",
            "remove field, or make the witness endpoint = \"/path\"",
        ));
    }
    if let Some(engine) = &raw.engine {
        engine.get_ref().parse::<Engine>().map_err(|e| {
            src.invalid(
                engine.span(),
                e.to_string(),
                "engine = one of the presets: embedded, sglang, vllm, llamacpp",
            )
        })?;
    }
    if let Some(role) = &raw.role {
        if !roles.contains(role.get_ref()) {
            return Err(src.invalid(
                role.span(),
                format!(
                    "witness role {:?} is not one of the flag's roles",
                    role.get_ref()
                ),
                format!("use one of {roles:?}, or leave role out to add every role up"),
            ));
        }
    }
    let source = raw.source.clone().unwrap_or_default();
    if source.trim().is_empty() {
        return Err(src.invalid(
            anchor(&raw),
            "a witness without source: nobody can check it against the engine",
            "add source = \"upstream file:line at the pinned version, and what is there\"",
        ));
    }
    Ok(Witness {
        kind,
        engine: raw.engine.map(|e| e.into_inner()),
        role: raw.role.map(|r| r.into_inner()),
        min: raw.min.unwrap_or(1).max(1),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::config::FlagCatalog;
    use crate::core::mechanism::{Arms, Watch, WitnessKind};

    /// Every flag directory the project ships: the built-in catalog and each target's.
    fn shipped_dirs() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("targets"))
            .unwrap()
            .map(|e| e.unwrap().path().join("flags"))
            .filter(|d| d.is_dir())
            .collect();
        dirs.sort();
        dirs.push(root.join("flags"));
        dirs
    }

    #[test]
    fn every_shipped_flag_names_its_mechanism_with_sourced_witnesses() {
        let mut seen = 0;
        for dir in shipped_dirs() {
            let catalog = FlagCatalog::load(std::slice::from_ref(&dir)).unwrap();
            for flag in &catalog.flags {
                let m = flag
                    .mechanism
                    .as_ref()
                    .unwrap_or_else(|| panic!("{} has no [mechanism]", flag.source.display()));
                assert!(!m.fix.is_empty() || matches!(m.watch, Watch::Unobservable(_)));
                if let Watch::Witnesses(ws) = &m.watch {
                    for w in ws {
                        assert!(w.source.contains(':'), "{}: {}", flag.name, w.source);
                    }
                }
                seen += 1;
            }
        }
        // Six built-in flags and twenty of the targets' (three, seven, five, five).
        assert!(seen >= 26, "{seen}");
        let dir = shipped_dirs()
            .into_iter()
            .find(|d| d.ends_with("llama-cpp-12253/flags"))
            .unwrap();
        let defrag = FlagCatalog::load(&[dir]).unwrap();
        let defrag = defrag.get("DEFRAG").unwrap().mechanism.clone().unwrap();
        assert_eq!(defrag.arms, Arms::On);
        let Watch::Witnesses(ws) = &defrag.watch else {
            panic!("DEFRAG has witnesses")
        };
        assert!(
            matches!(&ws[0].kind, WitnessKind::Log { pattern, .. } if pattern == "requesting defrag")
        );
    }

    #[test]
    fn selectors_are_names_with_optional_labels() {
        for ok in [
            "vllm:num_preemptions_total",
            "sglang:load_back_tokens_total{pool=\"kv\"}",
            "x{a=\"1\", b=\"q\\\"t\"}",
        ] {
            assert_eq!(super::check_selector(ok), Ok(()), "{ok}");
        }
        for bad in ["9lives", "x{a=\"1\"", "x{a=1}", "x y", ""] {
            assert!(super::check_selector(bad).is_err(), "{bad}");
        }
    }

    fn refused(mechanism: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "name = \"X\"\nenv = \"X\"\nroles = [\"server\"]\non = \"1\"\noff = \"0\"\n\n{mechanism}"
        );
        std::fs::write(dir.path().join("X.toml"), text).unwrap();
        FlagCatalog::load(&[dir.path().to_path_buf()])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_bad_mechanism_table_names_the_line_and_the_fix() {
        let head = "[mechanism]\nname = \"defrag\"\n";
        let w = |body: &str| format!("{head}[[mechanism.witness]]\n{body}");
        let cases = [
            (format!("{head}in = \"sometimes\"\n"), ":9", "is not an arm"),
            (
                head.to_string(),
                ":8",
                "names no witness and does not say it is unobservable",
            ),
            (
                w("log = 'a'\ncounter = 'b_total'\nsource = \"f.c:1\"\n"),
                ":10",
                "more than one of counter, log, endpoint",
            ),
            (
                w("log = '(a'\nsource = \"f.c:1\"\n"),
                ":10",
                "is not a regex",
            ),
            (
                w("log = 'a'\nrole = \"decode\"\nsource = \"f.c:1\"\n"),
                ":11",
                "not one of the flag's roles",
            ),
            (w("log = 'a'\n"), ":10", "a witness without source"),
            (
                w("endpoint = \"/slots\"\nsource = \"f.c:1\"\n"),
                ":10",
                "needs field",
            ),
            (
                w("counter = 'x{a=\"1\"'\nsource = \"f.c:1\"\n"),
                ":10",
                "counter",
            ),
            (
                w("log = 'a'\nengine = \"tgi\"\nsource = \"f.c:1\"\n"),
                ":11",
                "tgi",
            ),
        ];
        for (table, line, words) in cases {
            let e = refused(&table);
            assert!(e.contains(&format!("X.toml{line}")), "{line} in {e}");
            assert!(e.contains(words), "{words} in {e}");
        }
    }
}
