//! Property tests of leaked-markup detection and the round classifier
//! (docs/property-tests.md): no input panics; tool-call markup of every family, as
//! templates write it and as corruption garbles it, is found whatever text surrounds
//! it, in `content`, in `reasoning_content` and inside argument strings; evidence stays
//! short and on one line.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};

use super::markup::{MarkupFamily, MarkupSet};
use super::{Classifier, ExpectedCall, RoundOutcome, EVIDENCE_MAX_CHARS};
use crate::proptest_config::config;
use crate::session::{ChatMessage, FunctionCall, RoundClass, ToolCall};
use crate::workload::{CheckArgs, ToolSpec};

fn tools() -> Vec<ToolSpec> {
    let tool = |name: &str, parameters: Value| ToolSpec {
        name: name.to_string(),
        description: String::new(),
        parameters,
        arg_values: BTreeMap::new(),
        result: String::new(),
    };
    vec![
        super::tests::read_file_tool(),
        tool(
            "grep",
            json!({
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            }),
        ),
    ]
}

/// Compiled once: building the regexes and schema validators costs far more than a
/// case.
fn classifier() -> &'static Classifier {
    static CLASSIFIER: OnceLock<Classifier> = OnceLock::new();
    CLASSIFIER.get_or_init(|| Classifier::with_defaults(&tools()).unwrap())
}

/// The set of every family, compiled once.
fn all_families() -> &'static MarkupSet {
    static SET: OnceLock<MarkupSet> = OnceLock::new();
    SET.get_or_init(|| MarkupSet::new(&MarkupFamily::ALL).unwrap())
}

/// The set of one family, compiled once.
fn one_family(family: MarkupFamily) -> &'static MarkupSet {
    static SETS: OnceLock<Vec<(MarkupFamily, MarkupSet)>> = OnceLock::new();
    let sets = SETS.get_or_init(|| {
        MarkupFamily::ALL
            .iter()
            .map(|f| (*f, MarkupSet::new(&[*f]).unwrap()))
            .collect()
    });
    &sets
        .iter()
        .find(|(f, _)| *f == family)
        .expect("every family")
        .1
}

/// One bar of a special token as corruption leaves it: `｜` or `|`, once or twice,
/// each maybe followed by blanks.
fn bar() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (select(vec!["｜", "|"]), select(vec!["", " ", "  "])),
        1..=2,
    )
    .prop_map(|parts| parts.into_iter().map(|(b, s)| format!("{b}{s}")).collect())
}

fn blank() -> impl Strategy<Value = &'static str> {
    select(vec!["", "", " ", "\n"])
}

/// `DSML` in any letter case (the pattern ignores case).
fn dsml_word() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<bool>(), 4).prop_map(|upper| {
        "dsml"
            .chars()
            .zip(upper)
            .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
            .collect()
    })
}

/// A piece of tool-call markup that must count as a leak, for some family.
fn leaked_markup() -> impl Strategy<Value = (MarkupFamily, String)> {
    let keyword = select(vec!["function_calls", "tool_calls", "invoke", "parameter"]);
    let dsml_tag = (
        blank(),
        any::<bool>(),
        bar(),
        dsml_word(),
        bar(),
        keyword.clone(),
    )
        .prop_map(|(b, close, bar1, word, bar2, kw)| {
            let slash = if close { "/" } else { "" };
            format!("<{b}{slash}{bar1}{word}{bar2}{kw}>")
        });
    let dsml_fragment = (
        bar(),
        select(vec!["DSML", "dsml"]),
        bar(),
        select(vec!["function_calls", "invoke", "parameter"]),
    )
        .prop_map(|(b1, w, b2, kw)| format!("{b1}{w}{b2}{kw}>"));
    let stripped = select(vec![
        "<function_calls>".to_string(),
        "</function_calls>".to_string(),
        "<invoke name=\"read_file\">".to_string(),
        "</invoke>".to_string(),
        "<parameter name=\"path\" string=\"true\">".to_string(),
        "</parameter>".to_string(),
        "string=\"false\">".to_string(),
        "string = \"true\" >".to_string(),
    ]);
    let v31 = (
        blank(),
        bar(),
        select(vec!["▁", "_", " "]),
        select(vec!["calls", "call", "sep", "outputs", "output"]),
        select(vec!["", "▁begin", "▁end", "_begin", "_end"]),
        blank(),
        bar(),
    )
        .prop_map(|(b1, bar1, sep, name, suffix, b2, bar2)| {
            format!("<{b1}{bar1}tool{sep}{name}{suffix}{b2}{bar2}>")
        });
    let v31_fragment = select(vec!["calls", "call", "sep", "outputs", "output"])
        .prop_map(|name| format!("tool▁{name}"));
    let hermes = (blank(), any::<bool>(), blank(), blank()).prop_map(|(b1, close, b2, b3)| {
        let slash = if close { "/" } else { "" };
        format!("<{b1}{slash}{b2}tool_call{b3}>")
    });
    prop_oneof![
        3 => dsml_tag.prop_map(|m| (MarkupFamily::Dsml, m)),
        1 => dsml_fragment.prop_map(|m| (MarkupFamily::Dsml, m)),
        2 => stripped.prop_map(|m| (MarkupFamily::Dsml, m)),
        2 => v31.prop_map(|m| (MarkupFamily::DeepSeekV31, m)),
        1 => v31_fragment.prop_map(|m| (MarkupFamily::DeepSeekV31, m)),
        2 => hermes.prop_map(|m| (MarkupFamily::Hermes, m)),
    ]
}

/// Text around a leak: prose, markdown, code, or anything at all.
fn surrounding() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        1 => "[a-zA-Z0-9 .,:;|<>/\"=_\n-]{0,40}",
        1 => select(vec![
            "I'll read the configuration first.\n\n".to_string(),
            "| a | b |\n|---|---|\n".to_string(),
            "if x<y || z>w { return }".to_string(),
            String::new(),
        ]),
    ]
}

/// Text made of markup pieces and separators in any order.
fn markup_soup() -> impl Strategy<Value = String> {
    let fragments = vec![
        "<",
        ">",
        "/",
        "｜",
        "|",
        " ",
        "\n",
        "DSML",
        "dsml",
        "invoke",
        "parameter",
        "function_calls",
        "tool_calls",
        "name=\"",
        "\"",
        "string=\"true\"",
        "false\"",
        ">1",
        "tool",
        "▁",
        "_",
        "calls",
        "sep",
        "begin",
        "end",
        "tool_call",
        "=",
        "é",
        "x",
    ];
    prop::collection::vec(select(fragments), 0..40).prop_map(|parts| parts.concat())
}

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: "call_0".into(),
        kind: "function".into(),
        function: FunctionCall {
            name: name.into(),
            arguments: arguments.into(),
        },
    }
}

fn reply(content: Option<String>, reasoning: Option<String>, calls: Vec<ToolCall>) -> ChatMessage {
    ChatMessage {
        role: "assistant".into(),
        content,
        reasoning_content: reasoning,
        tool_calls: (!calls.is_empty()).then_some(calls),
        ..Default::default()
    }
}

fn check_evidence(evidence: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        evidence.chars().count() <= EVIDENCE_MAX_CHARS,
        "evidence of {} chars: {:?}",
        evidence.chars().count(),
        evidence
    );
    prop_assert!(
        !evidence.contains(['\n', '\r']),
        "evidence spans lines: {:?}",
        evidence
    );
    Ok(())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        markup_soup().prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arguments() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::collection::btree_map(
            prop_oneof![
                select(vec!["path".to_string(), "pattern".to_string(), "max_lines".to_string()]),
                any::<String>(),
            ],
            json_value(),
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()).to_string()),
        1 => any::<String>(),
        1 => markup_soup(),
        1 => Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Any text: no panic, hits are char-aligned ranges, the all-family set finds the
    /// earliest of the single families' hits, and argument fragments include leaks.
    #[test]
    fn markup_search_is_consistent_on_any_text(
        text in prop_oneof![any::<String>(), markup_soup()],
    ) {
        let all = all_families();
        let leak = all.find_leak(&text);
        if let Some(hit) = leak {
            prop_assert!(hit.start < hit.end && hit.end <= text.len());
            prop_assert!(text.is_char_boundary(hit.start) && text.is_char_boundary(hit.end));
        }
        let singles: Vec<_> = MarkupFamily::ALL
            .iter()
            .filter_map(|f| one_family(*f).find_leak(&text))
            .collect();
        let earliest = singles.iter().map(|h| (h.start, usize::MAX - h.end)).min();
        prop_assert_eq!(leak.map(|h| (h.start, usize::MAX - h.end)), earliest);
        let fragment = all.find_fragment(&text);
        if let Some(hit) = leak {
            let f = fragment.expect("a leak is also an argument fragment");
            prop_assert!(f.start <= hit.start);
        }
    }

    /// Markup of any family is a leak whatever text surrounds it, and the hit starts no
    /// later than the markup does; the classifier calls the round a leak whether the
    /// markup is in content or in reasoning, tool calls or not.
    #[test]
    fn leaked_markup_is_found_whatever_surrounds_it(
        (family, markup) in leaked_markup(),
        before in surrounding(),
        after in surrounding(),
        in_reasoning in any::<bool>(),
        with_call in any::<bool>(),
    ) {
        let alone = one_family(family).find_leak(&markup);
        let alone = alone.ok_or_else(|| {
            TestCaseError::fail(format!("{markup:?} alone is not a {family} leak"))
        })?;
        let text = format!("{before}{markup}{after}");
        let all = all_families();
        let hit = all
            .find_leak(&text)
            .ok_or_else(|| TestCaseError::fail(format!("no leak found in {text:?}")))?;
        prop_assert!(
            hit.start <= before.len() + alone.start,
            "hit {:?} after the markup in {:?}",
            hit,
            text,
        );
        // The family's own set finds it too.
        prop_assert!(one_family(family).find_leak(&text).is_some());

        let classifier = classifier();
        let calls = if with_call { vec![call("read_file", r#"{"path": "/a"}"#)] } else { vec![] };
        let message = if in_reasoning {
            reply(Some("ok".into()), Some(text.clone()), calls)
        } else {
            reply(Some(text.clone()), None, calls)
        };
        let verdict = classifier.classify(&RoundOutcome::Reply(&message), None, CheckArgs::Strict);
        prop_assert_eq!(verdict.class, RoundClass::Leak, "{:?}", verdict.evidence);
        prop_assert!(verdict.evidence.starts_with("leak["), "{}", verdict.evidence);
        prop_assert_eq!(in_reasoning, verdict.evidence.contains("in reasoning_content"));
        check_evidence(&verdict.evidence)?;
    }

    /// Markup inside an argument string is bad_args whatever surrounds it (unless the
    /// step itself asked for exactly that value).
    #[test]
    fn markup_inside_arguments_is_bad_args(
        (_, markup) in leaked_markup(),
        before in surrounding(),
        after in surrounding(),
    ) {
        let classifier = classifier();
        let path = format!("{before}{markup}{after}");
        let arguments = json!({"path": path}).to_string();
        let message = reply(None, None, vec![call("read_file", &arguments)]);
        let step_for = |path: Value| ExpectedCall {
            tool: "read_file".into(),
            args: Map::from_iter([("path".to_string(), path)]),
        };
        let step = step_for(json!("/a"));
        for check in [CheckArgs::Strict, CheckArgs::Schema] {
            let verdict = classifier.classify(&RoundOutcome::Reply(&message), Some(&step), check);
            prop_assert_eq!(verdict.class, RoundClass::BadArgs, "{:?}", verdict.evidence);
            prop_assert!(verdict.evidence.starts_with("bad_args[markup]"), "{}", verdict.evidence);
            check_evidence(&verdict.evidence)?;
        }
        let asked = step_for(json!(path));
        let outcome = RoundOutcome::Reply(&message);
        let verdict = classifier.classify(&outcome, Some(&asked), CheckArgs::Strict);
        prop_assert_eq!(verdict.class, RoundClass::Ok, "{:?}", verdict.evidence);
    }

    /// Any reply, error or step: no panic, and the evidence is short and on one line.
    #[test]
    fn classify_never_panics_and_evidence_stays_one_short_line(
        content in proptest::option::of(prop_oneof![any::<String>(), markup_soup()]),
        reasoning in proptest::option::of(prop_oneof![any::<String>(), markup_soup()]),
        calls in prop::collection::vec(
            (
                prop_oneof![
                    select(vec!["read_file".to_string(), "grep".to_string()]),
                    any::<String>(),
                ],
                arguments(),
            ),
            0..3,
        ),
        error in proptest::option::of(any::<String>()),
        step in proptest::option::of((select(vec!["read_file", "grep"]), any::<String>())),
        strict in any::<bool>(),
    ) {
        let classifier = classifier();
        let calls: Vec<ToolCall> = calls.iter().map(|(n, a)| call(n, a)).collect();
        let message = reply(content, reasoning, calls);
        let outcome = match &error {
            Some(e) if e.len() % 3 == 0 => RoundOutcome::Timeout,
            Some(e) => RoundOutcome::Error(e.clone()),
            None => RoundOutcome::Reply(&message),
        };
        let step = step.map(|(tool, path)| ExpectedCall {
            tool: tool.into(),
            args: Map::from_iter([("path".to_string(), Value::String(path))]),
        });
        let check = if strict { CheckArgs::Strict } else { CheckArgs::Schema };
        let verdict = classifier.classify(&outcome, step.as_ref(), check);
        check_evidence(&verdict.evidence)?;
    }
}
