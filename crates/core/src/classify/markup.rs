//! Tool-call markup that must never reach the client as text (docs/design.md 3.5, `leak`).
//!
//! Each [`MarkupFamily`] is one chat template's tool-call syntax; a serving engine's
//! parser turns that syntax into `tool_calls`, so any piece of it left in `content` or
//! `reasoning_content` means the parser saw something it could not parse (token salad)
//! or was bypassed. The patterns are deliberately loose about the separators the
//! corruption garbles (fullwidth vs ASCII bars, doubled bars, stray spaces) and strict
//! about the keyword they surround, so ordinary prose and markdown tables do not match.
//!
//! Besides the leak patterns, a family may define argument fragments: pieces of its
//! markup that show up inside an otherwise parseable argument string when the model
//! emitted salad (`false">1`, `string="`). Those feed the `bad_args` check.

use std::fmt;
use std::str::FromStr;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::ClassifierError;

/// A tool-call markup family, named as in target profiles (`dsml`, `deepseek_v31`, `hermes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MarkupFamily {
    /// DeepSeek V3.2/V4 DSML: the call block's wrapper (V3.2 `<｜DSML｜function_calls>`,
    /// V4 `<｜DSML｜tool_calls>`), `<｜DSML｜invoke name=..>`,
    /// `<｜DSML｜parameter name=.. string="true">`.
    #[serde(rename = "dsml")]
    Dsml,
    /// DeepSeek V3.1 special tokens: `<｜tool▁calls▁begin｜>`, `<｜tool▁sep｜>`, ...
    #[serde(rename = "deepseek_v31")]
    DeepSeekV31,
    /// Hermes / Qwen style `<tool_call>{json}</tool_call>` blocks.
    #[serde(rename = "hermes")]
    Hermes,
}

impl MarkupFamily {
    pub const ALL: [MarkupFamily; 3] = [
        MarkupFamily::Dsml,
        MarkupFamily::DeepSeekV31,
        MarkupFamily::Hermes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MarkupFamily::Dsml => "dsml",
            MarkupFamily::DeepSeekV31 => "deepseek_v31",
            MarkupFamily::Hermes => "hermes",
        }
    }
}

impl fmt::Display for MarkupFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown markup family `{0}`; known: dsml, deepseek_v31, hermes")]
pub struct UnknownFamily(pub String);

impl FromStr for MarkupFamily {
    type Err = UnknownFamily;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MarkupFamily::ALL
            .into_iter()
            .find(|family| family.name() == s.trim())
            .ok_or_else(|| UnknownFamily(s.to_string()))
    }
}

/// One bar of a special token as corruption leaves it: fullwidth `｜` (U+FF5C) or ASCII
/// `|`, once or doubled, with optional spaces around.
const BAR: &str = r"(?:[|｜]\s*){1,2}";

/// (pattern name, regex) pairs that mean "this family's markup is in the text".
fn leak_patterns(family: MarkupFamily) -> Vec<(&'static str, String)> {
    match family {
        MarkupFamily::Dsml => vec![
            // `<｜DSML｜`, `</｜DSML｜`, `<|DSML|`, `< | DSML | `, `<||DSML||`, `<｜｜DSML｜｜`.
            ("dsml_tag", format!(r"(?i)<\s*/?\s*{BAR}DSML\s*{BAR}")),
            // A tag whose `<` was lost or replaced: `｜DSML｜parameter>`.
            (
                "dsml_fragment",
                format!(
                    r"(?i){BAR}DSML\s*{BAR}\s*(?:function_calls|tool_calls|invoke|parameter)\b"
                ),
            ),
            // The V3.2 and V4 wrappers and their children with the DSML prefix stripped.
            ("function_calls", r"<\s*/?\s*function_calls\s*>".to_string()),
            ("tool_calls", r"<\s*/?\s*tool_calls\s*>".to_string()),
            (
                "invoke",
                r#"<\s*/?\s*invoke(?:\s+name\s*=\s*"|\s*>)"#.to_string(),
            ),
            (
                "parameter",
                r#"<\s*/?\s*parameter(?:\s+name\s*=\s*"|\s*>)"#.to_string(),
            ),
            // The dangling end of a parameter tag: `string="false">`.
            (
                "string_attr",
                r#"string\s*=\s*"(?:true|false)"\s*>"#.to_string(),
            ),
        ],
        MarkupFamily::DeepSeekV31 => vec![
            // `<｜tool▁calls▁begin｜>`, `<|tool_call_end|>`, `<｜tool▁sep｜>`, ...
            (
                "v31_token",
                format!(
                    r"<\s*{BAR}tool[▁_ ](?:calls?|sep|outputs?)(?:[▁_ ](?:begin|end))?\s*{BAR}>"
                ),
            ),
            // U+2581 never occurs in prose, so the bare token name is enough.
            ("v31_fragment", r"tool▁(?:calls?|sep|outputs?)".to_string()),
        ],
        MarkupFamily::Hermes => vec![("tool_call_tag", r"<\s*/?\s*tool_call\s*>".to_string())],
    }
}

/// (pattern name, regex) pairs that mean "this argument value holds markup salad",
/// on top of the leak patterns.
fn fragment_patterns(family: MarkupFamily) -> Vec<(&'static str, String)> {
    match family {
        MarkupFamily::Dsml => vec![
            ("string_attr_open", r#"string\s*=\s*""#.to_string()),
            ("attr_close", r#"\b(?:true|false)"\s*>"#.to_string()),
        ],
        MarkupFamily::DeepSeekV31 | MarkupFamily::Hermes => Vec::new(),
    }
}

/// A compiled pattern and where it came from.
#[derive(Debug)]
pub(crate) struct Pattern {
    pub family: MarkupFamily,
    pub name: &'static str,
    pub regex: Regex,
}

/// A pattern hit: byte range in the searched text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub family: MarkupFamily,
    pub pattern: &'static str,
    pub start: usize,
    pub end: usize,
}

/// The compiled patterns of a set of families.
#[derive(Debug)]
pub(crate) struct MarkupSet {
    leak: Vec<Pattern>,
    fragments: Vec<Pattern>,
}

fn compile(
    family: MarkupFamily,
    specs: Vec<(&'static str, String)>,
) -> Result<Vec<Pattern>, ClassifierError> {
    specs
        .into_iter()
        .map(|(name, source)| {
            let regex = Regex::new(&source).map_err(|e| ClassifierError::Markup {
                family,
                name,
                reason: e.to_string(),
            })?;
            Ok(Pattern {
                family,
                name,
                regex,
            })
        })
        .collect()
}

impl MarkupSet {
    pub fn new(families: &[MarkupFamily]) -> Result<Self, ClassifierError> {
        let mut leak = Vec::new();
        let mut fragments = Vec::new();
        for &family in families {
            if leak.iter().any(|p: &Pattern| p.family == family) {
                continue;
            }
            leak.extend(compile(family, leak_patterns(family))?);
            fragments.extend(compile(family, fragment_patterns(family))?);
        }
        Ok(MarkupSet { leak, fragments })
    }

    /// The earliest leak-pattern hit in `text` (ties: the longest, then the first pattern).
    pub(crate) fn find_leak(&self, text: &str) -> Option<Hit> {
        earliest(self.leak.iter(), text)
    }

    /// The earliest hit of a leak or argument-fragment pattern in an argument string.
    pub(crate) fn find_fragment(&self, text: &str) -> Option<Hit> {
        earliest(self.leak.iter().chain(self.fragments.iter()), text)
    }
}

fn earliest<'p>(patterns: impl Iterator<Item = &'p Pattern>, text: &str) -> Option<Hit> {
    patterns
        .filter_map(|p| {
            p.regex.find(text).map(|m| Hit {
                family: p.family,
                pattern: p.name,
                start: m.start(),
                end: m.end(),
            })
        })
        .min_by_key(|hit| (hit.start, usize::MAX - hit.end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(family: MarkupFamily) -> MarkupSet {
        MarkupSet::new(&[family]).unwrap()
    }

    fn leak_pattern(family: MarkupFamily, text: &str) -> Option<&'static str> {
        set(family).find_leak(text).map(|h| h.pattern)
    }

    #[test]
    fn family_names_round_trip() {
        for family in MarkupFamily::ALL {
            assert_eq!(family.name().parse::<MarkupFamily>().unwrap(), family);
            assert_eq!(family.to_string(), family.name());
            let json = serde_json::to_string(&family).unwrap();
            assert_eq!(json, format!("\"{}\"", family.name()));
        }
        assert_eq!(
            "qwen".parse::<MarkupFamily>().unwrap_err().to_string(),
            "unknown markup family `qwen`; known: dsml, deepseek_v31, hermes"
        );
    }

    #[test]
    fn dsml_tag_variants_match() {
        for text in [
            "<｜DSML｜function_calls>",
            "</｜DSML｜parameter>",
            "<|DSML|invoke name=\"grep\">",
            "</|DSML|invoke>",
            "< | DSML | parameter",
            "<｜ DSML ｜invoke",
            "<||DSML||function_calls>",
            "<｜｜DSML｜｜parameter name=\"path\"",
            "< / ｜DSML｜parameter>",
            "<｜dsml｜invoke",
        ] {
            assert_eq!(
                leak_pattern(MarkupFamily::Dsml, text),
                Some("dsml_tag"),
                "{text}"
            );
        }
    }

    #[test]
    fn dsml_fragments_and_stripped_tags_match() {
        let cases = [
            ("x｜DSML｜parameter> y", "dsml_fragment"),
            ("| DSML | invoke", "dsml_fragment"),
            ("<function_calls>\n<invoke name=\"grep\">", "function_calls"),
            ("</function_calls>", "function_calls"),
            ("<invoke name=\"read_file\">", "invoke"),
            ("</invoke>", "invoke"),
            (
                "<parameter name=\"path\" string=\"true\">/a</parameter>",
                "parameter",
            ),
            ("40\" string=\"false\">1", "string_attr"),
            ("string = \"true\" >", "string_attr"),
        ];
        for (text, pattern) in cases {
            assert_eq!(
                leak_pattern(MarkupFamily::Dsml, text),
                Some(pattern),
                "{text}"
            );
        }
    }

    #[test]
    fn v31_tokens_match() {
        for text in [
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
            "<|tool_calls_begin|>",
            "<|tool_call_begin|>",
            "<| tool_sep |>",
            "<||tool_call_end||>",
        ] {
            assert_eq!(
                leak_pattern(MarkupFamily::DeepSeekV31, text),
                Some("v31_token"),
                "{text}"
            );
        }
        assert_eq!(
            leak_pattern(MarkupFamily::DeepSeekV31, "function tool▁call▁end"),
            Some("v31_fragment")
        );
    }

    #[test]
    fn hermes_tags_match() {
        for text in [
            "<tool_call>\n{\"name\": \"grep\"}\n</tool_call>",
            "</tool_call>",
            "< tool_call >",
        ] {
            assert_eq!(
                leak_pattern(MarkupFamily::Hermes, text),
                Some("tool_call_tag"),
                "{text}"
            );
        }
    }

    #[test]
    fn prose_does_not_match_any_family() {
        let all = MarkupSet::new(&MarkupFamily::ALL).unwrap();
        for text in [
            "The config sets max_lines to 40 and the tests pass.",
            "| Format | DSML | Hermes |\n|---|---|---|\n| tags | yes | yes |",
            "Use a tool_call when you need data; the parameter name is `path`.",
            "Call invoke() with the function_calls list.",
            "a < b | c > d",
            "if x<y || z>w { return }",
            "The DSML format wraps calls in function_calls blocks.",
            "",
        ] {
            assert_eq!(all.find_leak(text), None, "{text}");
        }
    }

    #[test]
    fn families_are_independent() {
        assert_eq!(
            leak_pattern(MarkupFamily::Hermes, "</｜DSML｜parameter>"),
            None
        );
        assert_eq!(leak_pattern(MarkupFamily::Dsml, "<tool_call>"), None);
        assert_eq!(leak_pattern(MarkupFamily::Dsml, "<｜tool▁sep｜>"), None);
        assert!(MarkupSet::new(&[])
            .unwrap()
            .find_leak("<｜DSML｜invoke")
            .is_none());
    }

    #[test]
    fn earliest_hit_wins_across_families() {
        let all = MarkupSet::new(&MarkupFamily::ALL).unwrap();
        let text = "ok <tool_call> then </｜DSML｜parameter>";
        let hit = all.find_leak(text).unwrap();
        assert_eq!(
            (hit.family, hit.pattern),
            (MarkupFamily::Hermes, "tool_call_tag")
        );
        assert_eq!(&text[hit.start..hit.end], "<tool_call>");
    }

    #[test]
    fn argument_fragments_match_salad_only() {
        let dsml = set(MarkupFamily::Dsml);
        let cases = [
            ("false\">1", Some("attr_close")),
            ("string=\"false\">false\">1", Some("string_attr")),
            ("x\" string=\"", Some("string_attr_open")),
            ("/srv/app</｜DSML｜parameter>", Some("dsml_tag")),
            ("/srv/app/config.yaml", None),
            ("TODO|FIXME", None),
            ("fn main() -> bool", None),
        ];
        for (text, pattern) in cases {
            assert_eq!(
                dsml.find_fragment(text).map(|h| h.pattern),
                pattern,
                "{text}"
            );
        }
    }
}
