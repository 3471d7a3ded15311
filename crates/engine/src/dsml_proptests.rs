//! Property tests of the DSML renderer and parser (docs/property-tests.md): the parser
//! never panics and never loses text (a block it cannot parse stays verbatim in the
//! content); rendering calls with arbitrary names and argument JSON and parsing the
//! result gives the same calls back, whatever text surrounds the block.
//!
//! The round trip holds for what the markup can carry: a name or key without `"`, `<`
//! or `>` (the header's attribute syntax) and no string inside the arguments holding a
//! DSML tag (`<｜DSML｜`, `</｜DSML｜`), which the parser rightly treats as salad.
//!
//! Cases per property: `BISECT_PROPTEST_CASES` (default 10,000); seed:
//! `BISECT_PROPTEST_SEED` (fixed by default so CI runs are reproducible).

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value};

use crate::dsml::{parse, render_calls, BLOCK_CLOSE, BLOCK_OPEN};

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().replace('_', "").parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={raw:?} is not a whole number"),
    }
}

/// The harness's `proptest_config::config`, repeated: the engine must not depend on the
/// harness.
fn config() -> Config {
    Config {
        rng_seed: RngSeed::Fixed(env_number("BISECT_PROPTEST_SEED").unwrap_or(0x00b1_5ec7)),
        max_shrink_iters: 4096,
        ..Config::with_cases(env_number("BISECT_PROPTEST_CASES").unwrap_or(10_000))
    }
}

fn holds_tag(text: &str) -> bool {
    text.contains("<｜DSML｜") || text.contains("</｜DSML｜")
}

/// Text the markup can carry as a name or key: anything but `"`, `<`, `>`, non-empty.
fn attribute() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z_][a-zA-Z0-9_.-]{0,16}",
        1 => any::<String>().prop_map(|s| s.replace(['"', '<', '>'], "")),
    ]
    .prop_filter("non-empty", |s| !s.is_empty())
}

/// A string argument: anything except a DSML tag, including the other markup pieces
/// corruption leaves (`string="false">`, bars, braces, newlines).
fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        1 => "[a-z /\"<>{}｜:=\n-]{0,20}",
        1 => select(vec![
            "false\">1".to_string(),
            " padded ".to_string(),
            "{\"not\": \"parsed\"}".to_string(),
            "｜DSML｜parameter>".to_string(),
            String::new(),
        ]),
    ]
    .prop_filter("no DSML tag inside", |s| !holds_tag(s))
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        (-1000i32..1000, 0u32..4).prop_map(|(n, d)| Value::from(n as f64 / 10f64.powi(d as i32))),
        string_value().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..4)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
    .prop_filter("no DSML tag inside", |v| !holds_tag(&v.to_string()))
}

fn arguments() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((attribute(), json_value()), 0..5)
        .prop_map(|pairs| pairs.into_iter().collect())
}

fn calls() -> impl Strategy<Value = Vec<(String, Map<String, Value>)>> {
    prop::collection::vec((attribute(), arguments()), 1..4)
}

/// Text around a block: anything without a block marker of its own.
fn surrounding() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        1 => "[a-zA-Z .\n]{0,30}",
        1 => Just(String::new()),
    ]
    .prop_filter("no block marker", |s| {
        !s.contains(BLOCK_OPEN) && !s.contains(BLOCK_CLOSE)
    })
}

/// Model output built from DSML pieces in any order: unclosed blocks, stray closes,
/// salad inside values, headers without bodies.
fn dsml_soup() -> impl Strategy<Value = String> {
    let fragments = vec![
        BLOCK_OPEN,
        BLOCK_CLOSE,
        "<｜DSML｜invoke name=\"f\">",
        "</｜DSML｜invoke>",
        "<｜DSML｜parameter name=\"p\" string=\"true\">",
        "<｜DSML｜parameter name=\"n\" string=\"false\">",
        "</｜DSML｜parameter>",
        "\n",
        " ",
        "1",
        "\"x\"",
        "{",
        "}",
        "[",
        "]",
        "text",
        "<｜DSML｜",
        "｜",
        "<",
        ">",
        "\"",
        "é",
    ];
    prop::collection::vec(select(fragments), 0..40).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(config())]

    /// Any output: no panic; every call's arguments are a JSON object; when nothing
    /// parses, the content is the whole output (trimmed), so no text is lost.
    #[test]
    fn parse_never_panics_and_never_loses_text(
        output in prop_oneof![any::<String>(), dsml_soup()],
    ) {
        let parsed = parse(&output);
        for call in &parsed.tool_calls {
            let args: Value = serde_json::from_str(&call.arguments).expect("arguments are JSON");
            prop_assert!(args.is_object());
            prop_assert!(!call.name.is_empty());
        }
        if let Some(content) = &parsed.content {
            prop_assert_eq!(content.trim(), content.as_str());
            prop_assert!(!content.is_empty());
        }
        if parsed.tool_calls.is_empty() {
            let trimmed = output.trim();
            prop_assert_eq!(parsed.content.as_deref(), (!trimmed.is_empty()).then_some(trimmed));
        }
    }

    /// Rendering calls and parsing the text (with anything around the block) gives the
    /// same names and the same arguments, as the same JSON text, key order included.
    #[test]
    fn rendered_calls_parse_back(
        calls in calls(),
        before in surrounding(),
        after in surrounding(),
    ) {
        let block = render_calls(&calls);
        let parsed = parse(&format!("{before}{block}{after}"));
        let names: Vec<&str> = parsed.tool_calls.iter().map(|c| c.name.as_str()).collect();
        let want: Vec<&str> = calls.iter().map(|(n, _)| n.as_str()).collect();
        prop_assert_eq!(names, want, "{}", block);
        for (got, (_, args)) in parsed.tool_calls.iter().zip(&calls) {
            prop_assert_eq!(&got.arguments, &Value::Object(args.clone()).to_string(), "{}", block);
        }
        let rest = format!("{before}{after}");
        let rest = rest.trim();
        prop_assert_eq!(parsed.content.as_deref(), (!rest.is_empty()).then_some(rest));
    }
}

/// Found by `rendered_calls_parse_back`: a float argument came back one ULP off,
/// because serde_json's default float parser is not exact (now built with
/// `float_roundtrip`).
#[test]
fn a_long_float_argument_survives_the_round_trip() {
    let args: Map<String, Value> = [("A".to_string(), Value::from(-2.741493794126661e287))]
        .into_iter()
        .collect();
    let parsed = parse(&render_calls(&[("A".to_string(), args.clone())]));
    assert_eq!(
        parsed.tool_calls[0].arguments,
        Value::Object(args).to_string()
    );
}
