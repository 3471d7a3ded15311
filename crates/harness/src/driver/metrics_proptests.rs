//! Property tests of the Prometheus text parser (docs/property-tests.md): it never
//! panics and reports odd lines by number; an exposition rendered from generated
//! metrics (HELP/TYPE lines and comments, label values with quotes, backslashes and
//! newlines escaped, NaN/±Inf and every float notation, timestamps, blank lines, CRLF)
//! parses back to exactly the samples rendered.

use proptest::prelude::*;
use proptest::sample::select;

use super::metrics::{parse_exposition, Sample};
use crate::proptest_config::config;

fn metric_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
        select(vec![
            "sglang:num_running_reqs".to_string(),
            "sglang:num_queue_reqs".to_string(),
            "process_cpu_seconds_total".to_string(),
        ]),
    ]
}

fn label_name() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_]{0,10}"
}

/// Label values: anything, including the characters the format escapes.
fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z\"\\\\\n{},= ]{0,12}",
        Just(String::new()),
    ]
}

fn sample_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        1 => (-1000i64..1000).prop_map(|n| n as f64),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-0.0),
    ]
}

/// How a value is written: the exporters' notations (`12`, `1.5e1`, `1.5E+01`, Go's
/// `1.5e+06`).
#[derive(Debug, Clone, Copy)]
enum Notation {
    Plain,
    LowerExp,
    UpperExp,
    GoExp,
}

fn render_value(v: f64, notation: Notation) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    match notation {
        Notation::Plain => format!("{v}"),
        Notation::LowerExp => format!("{v:e}"),
        Notation::UpperExp => format!("{v:E}"),
        Notation::GoExp => {
            let s = format!("{v:e}");
            match s.split_once('e') {
                Some((mantissa, exp)) if !exp.starts_with('-') => {
                    format!("{mantissa}e+{exp:0>2}")
                }
                _ => s,
            }
        }
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[derive(Debug, Clone)]
struct GenSample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    notation: Notation,
    timestamp: Option<i64>,
    /// Blanks between the parts (` ` or tabs, one or more).
    gap: &'static str,
    trailing_comma: bool,
    /// Spaces after `{` and `,` (the parser allows them).
    label_padding: bool,
}

#[derive(Debug, Clone)]
enum Entry {
    Help(String, String),
    Type(String, &'static str),
    Comment(String),
    Blank(&'static str),
    Sample(GenSample),
}

fn gen_sample() -> impl Strategy<Value = GenSample> {
    (
        metric_name(),
        prop::collection::vec((label_name(), label_value()), 0..4),
        sample_value(),
        select(vec![
            Notation::Plain,
            Notation::LowerExp,
            Notation::UpperExp,
            Notation::GoExp,
        ]),
        proptest::option::of(any::<i64>()),
        select(vec![" ", "  ", "\t", " \t "]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(name, labels, value, notation, timestamp, gap, trailing_comma, label_padding)| {
                GenSample {
                    name,
                    labels,
                    value,
                    notation,
                    timestamp,
                    gap,
                    trailing_comma,
                    label_padding,
                }
            },
        )
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        1 => (metric_name(), "[ -~]{0,30}")
            .prop_map(|(n, h)| Entry::Help(n, h.replace('\\', "\\\\"))),
        1 => (metric_name(), select(vec!["gauge", "counter", "histogram", "summary", "untyped"]))
            .prop_map(|(n, t)| Entry::Type(n, t)),
        1 => any::<String>().prop_map(|c| Entry::Comment(c.replace(['\n', '\r'], " "))),
        1 => select(vec!["", "  ", "\t"]).prop_map(Entry::Blank),
        6 => gen_sample().prop_map(Entry::Sample),
    ]
}

fn render(entries: &[Entry], crlf: bool, final_newline: bool) -> String {
    let nl = if crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for entry in entries {
        match entry {
            Entry::Help(name, help) => out.push_str(&format!("# HELP {name} {help}")),
            Entry::Type(name, kind) => out.push_str(&format!("# TYPE {name} {kind}")),
            Entry::Comment(text) => out.push_str(&format!("#{text}")),
            Entry::Blank(blank) => out.push_str(blank),
            Entry::Sample(s) => {
                out.push_str(&s.name);
                if !s.labels.is_empty() {
                    let pad = if s.label_padding { " " } else { "" };
                    let labels: Vec<String> = s
                        .labels
                        .iter()
                        .map(|(k, v)| format!("{pad}{k}=\"{}\"", escape_label(v)))
                        .collect();
                    let comma = if s.trailing_comma { "," } else { "" };
                    out.push_str(&format!("{{{}{comma}}}", labels.join(",")));
                }
                out.push_str(s.gap);
                out.push_str(&render_value(s.value, s.notation));
                if let Some(ts) = s.timestamp {
                    out.push_str(s.gap);
                    out.push_str(&ts.to_string());
                }
            }
        }
        out.push_str(nl);
    }
    if !final_newline && out.ends_with(nl) {
        out.truncate(out.len() - nl.len());
    }
    out
}

fn same_value(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Text made of exposition fragments, likelier than random Unicode to reach the
/// parser's corners (unterminated label sets, dangling escapes, stray braces).
fn exposition_soup() -> impl Strategy<Value = String> {
    let fragments: Vec<&'static str> = vec![
        "a",
        "sglang:x",
        "_",
        "9",
        " ",
        "\t",
        "\n",
        "\r\n",
        "{",
        "}",
        "=",
        "\"",
        "\\",
        "\\\"",
        "\\n",
        ",",
        "#",
        "# HELP ",
        "1",
        "-1",
        "1e5",
        "NaN",
        "+Inf",
        "-Inf",
        "x=\"y\"",
        ".",
        "é",
        "｜",
        "1712345678000",
        "-",
    ];
    prop::collection::vec(select(fragments), 0..48).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(config())]

    /// Any text parses without panicking; every non-blank, non-comment line is either
    /// a sample or a malformed line reported with its 1-based number, in order.
    #[test]
    fn any_text_parses_without_panic(text in prop_oneof![any::<String>(), exposition_soup()]) {
        let exp = parse_exposition(&text);
        let lines: Vec<&str> = text.lines().collect();
        let data_lines = lines
            .iter()
            .filter(|l| !l.trim().is_empty() && !l.trim().starts_with('#'))
            .count();
        prop_assert_eq!(exp.samples.len() + exp.malformed.len(), data_lines);
        let numbers: Vec<usize> = exp.malformed.iter().map(|(n, _)| *n).collect();
        prop_assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{:?}", numbers);
        for (n, reason) in &exp.malformed {
            prop_assert!(*n >= 1 && *n <= lines.len());
            prop_assert!(!reason.is_empty());
        }
        for s in &exp.samples {
            prop_assert!(!s.name.is_empty());
            let sum = exp.sum(&s.name);
            prop_assert_eq!(
                sum.is_some(),
                exp.samples.iter().any(|t| t.name == s.name && !t.value.is_nan()),
            );
        }
    }

    /// Rendering generated metrics and parsing them back gives the same samples, in
    /// order, with no malformed line; sums agree with the samples.
    #[test]
    fn rendered_metrics_parse_back_to_the_same_samples(
        entries in prop::collection::vec(entry(), 0..12),
        crlf in any::<bool>(),
        final_newline in any::<bool>(),
    ) {
        let text = render(&entries, crlf, final_newline);
        let exp = parse_exposition(&text);
        prop_assert!(exp.malformed.is_empty(), "{:?} in {:?}", exp.malformed, text);
        let want: Vec<&GenSample> = entries
            .iter()
            .filter_map(|e| match e {
                Entry::Sample(s) => Some(s),
                _ => None,
            })
            .collect();
        prop_assert_eq!(exp.samples.len(), want.len(), "{:?}", text);
        for (got, want) in exp.samples.iter().zip(&want) {
            let expected = Sample {
                name: want.name.clone(),
                labels: want.labels.clone(),
                value: want.value,
            };
            prop_assert_eq!(&got.name, &expected.name);
            prop_assert_eq!(&got.labels, &expected.labels, "{:?}", text);
            prop_assert!(
                same_value(got.value, expected.value),
                "{} != {} in {:?}",
                got.value,
                expected.value,
                text,
            );
        }
        for s in &want {
            let values: Vec<f64> = want
                .iter()
                .filter(|t| t.name == s.name && !t.value.is_nan())
                .map(|t| t.value)
                .collect();
            let expected = (!values.is_empty()).then(|| values.iter().sum::<f64>());
            let got = exp.sum(&s.name);
            prop_assert!(
                match (got, expected) {
                    (Some(a), Some(b)) => same_value(a, b),
                    (None, None) => true,
                    _ => false,
                },
                "sum of {}: {:?} != {:?}", s.name, got, expected
            );
        }
    }
}
