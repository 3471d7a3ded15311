//! Property tests of the launch-config editor (docs/property-tests.md): whatever a
//! launch config holds, an edit either fails with a clear [`LaunchError`] or changes
//! the setting and nothing else, reads back to the written value, and toggling between
//! two values is exact.
//!
//! Two kinds of input: generated shell scripts whose structure is known (export lines,
//! quoted values, comments, decoys, continuation lines, `--arg value`, `--arg=value`,
//! switches, CRLF), checked against the exact text the edit must produce; and arbitrary
//! text (random Unicode and a soup of shell fragments), checked for the invariants that
//! hold whatever the text is. The journal is exercised on files: restore gives back
//! the original bytes whatever the edit did.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::select;

use super::{check_partial, read_setting, write_setting, Editor, LaunchError};
use crate::config::{line_of, validate_value, FlagSpec, RoleSpec, Setting};
use crate::proptest_config::{config, scratch_dir};

const PATH: &str = "conf/serve.sh";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Env,
    Arg,
    Switch,
}

fn spec(kind: Kind, key: &str, on: &str, off: &str) -> FlagSpec {
    let setting = match kind {
        Kind::Env => Setting::Env(key.to_string()),
        Kind::Arg => Setting::Arg(key.to_string()),
        Kind::Switch => Setting::Switch(key.to_string()),
    };
    FlagSpec {
        name: "GEN".into(),
        doc: String::new(),
        setting,
        roles: vec!["prefill".into()],
        on: on.into(),
        off: off.into(),
        source: PathBuf::from("flags/GEN.toml"),
        mechanism: None,
    }
}

fn write(text: &str, flag: &FlagSpec, value: &str) -> Result<String, LaunchError> {
    write_setting(text, flag, value, Path::new(PATH))
}

fn read(text: &str, flag: &FlagSpec) -> Option<String> {
    read_setting(text, &flag.setting, flag)
}

// ---------------------------------------------------------------------------------
// Generated scripts with a known structure.
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    Bare,
    Single,
    Double,
}

impl Quote {
    fn mark(self) -> &'static str {
        match self {
            Quote::Bare => "",
            Quote::Single => "'",
            Quote::Double => "\"",
        }
    }
}

/// A value as written in the script: bare values use only flag-value characters
/// (never empty, so a bare arg value is a word); quoted ones may hold spaces too.
fn old_value() -> impl Strategy<Value = (String, Quote)> {
    prop_oneof![
        "[A-Za-z0-9._:/,=+-]{1,6}".prop_map(|v| (v, Quote::Bare)),
        "[A-Za-z0-9 ._:/,=+-]{0,6}".prop_map(|v| (v, Quote::Single)),
        "[A-Za-z0-9 ._:/,=+-]{0,6}".prop_map(|v| (v, Quote::Double)),
    ]
}

/// A trailing `# comment`, sometimes mentioning the setting so comments are seen to be
/// ignored.
fn comment(key: String) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        1 => "[a-z ]{0,10}".prop_map(|c| Some(format!("# {c}"))),
        1 => Just(Some(format!("# {key}=1 {key} 32"))),
    ]
}

#[derive(Debug, Clone)]
enum Line {
    Shebang,
    Comment(String),
    Blank,
    /// Assignment of a variable that is not the flag's.
    OtherAssign {
        export: bool,
        name: String,
        value: (String, Quote),
        comment: Option<String>,
    },
    /// Assignment of the flag's variable (env flags only).
    KeyAssign {
        export: bool,
        value: (String, Quote),
        comment: Option<String>,
    },
    /// A builtin that is never the launch command (some mention the key as a decoy).
    Builtin(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sep {
    Space,
    Continuation,
}

/// One argument of the launch command.
#[derive(Debug, Clone)]
enum Item {
    /// An option that is not the flag's (`--port 30000`, `--KEY-extra 1`).
    Other(String),
    /// `--arg VALUE`.
    ArgSpaced((String, Quote)),
    /// `--arg=VALUE`, the value quoted or not.
    ArgEq((String, Quote)),
    /// `'--arg=VALUE'`: the whole word quoted.
    ArgWordQuoted((String, Quote)),
    Switch,
}

#[derive(Debug, Clone)]
struct Launch {
    /// `KEY=VALUE exec ...` (env flags only).
    prefix_assign: Option<(String, Quote)>,
    exec: bool,
    items: Vec<(Sep, Item)>,
    redirect: bool,
    background: bool,
    comment: Option<String>,
}

impl Launch {
    /// What follows the last argument: redirections, `&`, a comment; each piece opens
    /// with a blank.
    fn tail(&self) -> String {
        let mut tail = String::new();
        if self.redirect {
            tail.push_str(" > server.log 2>&1");
        }
        if self.background {
            tail.push_str(" &");
        }
        if let Some(c) = &self.comment {
            tail.push_str("  ");
            tail.push_str(c);
        }
        tail
    }
}

#[derive(Debug, Clone)]
struct Script {
    kind: Kind,
    key: String,
    crlf: bool,
    pre: Vec<Line>,
    launch: Option<Launch>,
    post: Vec<Line>,
    trailing_newline: bool,
}

/// Where a setting's value sits in the rendered text and how an edit re-renders it.
#[derive(Debug, Clone)]
struct Occurrence {
    span: std::ops::Range<usize>,
    quote: Quote,
    /// Written inside the quotes before the value (`--arg=` for a quoted whole word).
    prefix: String,
    value: String,
}

/// The rendered script and what the edit needs to know about it.
#[derive(Debug, Clone, Default)]
struct Rendered {
    text: String,
    occurrences: Vec<Occurrence>,
    /// Offset where ` --arg VALUE` / ` --switch` is appended (after the last argument).
    append_at: Option<usize>,
    /// Offset where a new `export` line goes.
    env_insert_at: usize,
    /// Offset of the first switch word, for check_partial's line.
    first_switch: Option<usize>,
}

impl Script {
    fn nl(&self) -> &'static str {
        if self.crlf {
            "\r\n"
        } else {
            "\n"
        }
    }

    fn push_value(out: &mut String, (value, quote): &(String, Quote)) -> std::ops::Range<usize> {
        let start = out.len();
        out.push_str(quote.mark());
        out.push_str(value);
        out.push_str(quote.mark());
        start..out.len()
    }

    /// Writes the setting's `value` with its quotes and records where it sits.
    fn push_setting_value(out: &mut String, r: &mut Rendered, value: &(String, Quote)) {
        let span = Self::push_value(out, value);
        r.occurrences.push(Occurrence {
            span,
            quote: value.1,
            prefix: String::new(),
            value: value.0.clone(),
        });
    }

    /// Renders the script; `skip[i]` drops switch item `i` (in item order) together with
    /// the separator before it (`Some(true)`) or after it (`Some(false)`).
    fn render_with(&self, drop_switch: &[Option<bool>]) -> Rendered {
        let nl = self.nl();
        let mut r = Rendered::default();
        let mut out = String::new();
        // Leading comment block (shebang, comments, blanks) ends where a new export
        // line goes when there is no assignment to go after.
        let mut leading_comments_end = 0;
        let mut in_leading = true;
        let mut last_pure_assign_end: Option<usize> = None;
        for line in &self.pre {
            self.render_line(&mut out, &mut r, line);
            let is_comment = matches!(line, Line::Shebang | Line::Comment(_));
            let is_blank = matches!(line, Line::Blank);
            out.push_str(nl);
            if in_leading && is_comment {
                leading_comments_end = out.len();
            } else if !is_blank {
                in_leading = false;
            }
            if matches!(line, Line::OtherAssign { .. } | Line::KeyAssign { .. }) {
                last_pure_assign_end = Some(out.len());
            }
        }
        let launch_line_start = out.len();
        if let Some(launch) = &self.launch {
            if let Some(value) = &launch.prefix_assign {
                out.push_str(&self.key);
                out.push('=');
                Self::push_setting_value(&mut out, &mut r, value);
                out.push(' ');
            }
            if launch.exec {
                out.push_str("exec ");
            }
            out.push_str("python3 -m sglang.launch_server");
            let mut after_last_word = out.len();
            // Which items survive, and with which separator before them.
            let mut kept: Vec<(Sep, &Item)> = Vec::new();
            let mut switch_index = 0;
            let mut pending_sep: Option<Sep> = None;
            for (sep, item) in &launch.items {
                if matches!(item, Item::Switch) {
                    let choice = drop_switch.get(switch_index).copied().flatten();
                    switch_index += 1;
                    match choice {
                        // Dropped with the separator before it: nothing of it remains.
                        Some(true) => continue,
                        // Dropped with the separator after it: its own separator goes
                        // to the next kept item.
                        Some(false) => {
                            pending_sep = Some(pending_sep.unwrap_or(*sep));
                            continue;
                        }
                        None => {}
                    }
                }
                let sep = pending_sep.take().unwrap_or(*sep);
                kept.push((sep, item));
            }
            for (sep, item) in kept {
                Self::push_sep(&mut out, sep, nl);
                let key = &self.key;
                match item {
                    Item::Other(text) => out.push_str(text),
                    Item::ArgSpaced(value) | Item::ArgEq(value) => {
                        out.push_str(key);
                        out.push(if matches!(item, Item::ArgEq(_)) {
                            '='
                        } else {
                            ' '
                        });
                        Self::push_setting_value(&mut out, &mut r, value);
                    }
                    Item::ArgWordQuoted((value, quote)) => {
                        let start = out.len();
                        out.push_str(quote.mark());
                        out.push_str(key);
                        out.push('=');
                        out.push_str(value);
                        out.push_str(quote.mark());
                        r.occurrences.push(Occurrence {
                            span: start..out.len(),
                            quote: *quote,
                            prefix: format!("{key}="),
                            value: value.clone(),
                        });
                    }
                    Item::Switch => {
                        r.first_switch.get_or_insert(out.len());
                        out.push_str(key);
                    }
                }
                after_last_word = out.len();
            }
            // A last switch dropped with the separator after it: that separator is the
            // blank opening the tail.
            let tail = launch.tail();
            let eat_tail_blank = pending_sep.is_some() && !tail.is_empty();
            if let Some(sep) = pending_sep.filter(|_| eat_tail_blank) {
                Self::push_sep(&mut out, sep, nl);
            }
            r.append_at = Some(after_last_word);
            out.push_str(if eat_tail_blank { &tail[1..] } else { &tail });
            out.push_str(nl);
        }
        for line in &self.post {
            self.render_line(&mut out, &mut r, line);
            out.push_str(nl);
        }
        if !self.trailing_newline && out.ends_with(nl) {
            out.truncate(out.len() - nl.len());
        }
        let limit = if self.launch.is_some() {
            launch_line_start
        } else {
            out.len()
        };
        r.env_insert_at = last_pure_assign_end
            .unwrap_or(leading_comments_end)
            .min(limit)
            .min(out.len());
        r.text = out;
        r
    }

    fn push_sep(out: &mut String, sep: Sep, nl: &str) {
        match sep {
            Sep::Space => out.push(' '),
            Sep::Continuation => {
                out.push_str(" \\");
                out.push_str(nl);
                out.push_str("  ");
            }
        }
    }

    fn render_line(&self, out: &mut String, r: &mut Rendered, line: &Line) {
        match line {
            Line::Shebang => out.push_str("#!/bin/sh"),
            Line::Comment(c) => out.push_str(c),
            Line::Blank => {}
            Line::OtherAssign {
                export,
                name,
                value,
                comment,
            } => {
                if *export {
                    out.push_str("export ");
                }
                out.push_str(name);
                out.push('=');
                Self::push_value(out, value);
                if let Some(c) = comment {
                    out.push_str("   ");
                    out.push_str(c);
                }
            }
            Line::KeyAssign {
                export,
                value,
                comment,
            } => {
                if *export {
                    out.push_str("export ");
                }
                out.push_str(&self.key);
                out.push('=');
                Self::push_setting_value(out, r, value);
                if let Some(c) = comment {
                    out.push_str("  ");
                    out.push_str(c);
                }
            }
            Line::Builtin(text) => out.push_str(text),
        }
    }

    fn render(&self) -> Rendered {
        self.render_with(&[])
    }

    fn switch_count(&self) -> usize {
        self.launch.as_ref().map_or(0, |l| {
            l.items
                .iter()
                .filter(|(_, i)| matches!(i, Item::Switch))
                .count()
        })
    }

    /// Every text removing all switches may leave: each switch goes with the blank (or
    /// continuation) before or after it.
    fn switch_removals(&self) -> Vec<String> {
        let n = self.switch_count();
        let launch = self.launch.as_ref().expect("switches are in the launch");
        let items = &launch.items;
        let tail_empty = launch.tail().is_empty();
        let positions: Vec<usize> = items
            .iter()
            .enumerate()
            .filter(|(_, (_, i))| matches!(i, Item::Switch))
            .map(|(k, _)| k)
            .collect();
        let mut out = Vec::new();
        for mask in 0..(1u32 << n) {
            let choice: Vec<Option<bool>> = (0..n)
                .map(|b| {
                    let with_before = mask & (1 << b) == 0;
                    // The last item has no separator after it, unless a tail follows.
                    let last = positions[b] + 1 == items.len() && tail_empty;
                    Some(with_before || last)
                })
                .collect();
            out.push(self.render_with(&choice).text);
        }
        out.sort();
        out.dedup();
        out
    }
}

/// An environment variable name, an option (`--name`, `-n`) for args and switches.
/// Words the generated scripts use for other purposes (the launch command's `-m`, the
/// builtins' options, the other options, the other variables).
const TAKEN: &[&str] = &[
    "-m",
    "-n",
    "-p",
    "-e",
    "--port",
    "--tp",
    "--model-path",
    "--name",
    "--disable-radix-cache",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
];

fn key_for(kind: Kind) -> BoxedStrategy<String> {
    let key = match kind {
        Kind::Env => "[A-Z_][A-Z0-9_]{0,12}".boxed(),
        Kind::Arg | Kind::Switch => prop_oneof![
            4 => "--[a-z][a-z0-9-]{0,12}",
            1 => "-[a-zA-Z]",
        ]
        .boxed(),
    };
    key.prop_filter("the key is not a word the scripts use otherwise", |k| {
        !TAKEN.contains(&k.as_str())
    })
    .boxed()
}

fn line(kind: Kind, key: String) -> impl Strategy<Value = Line> {
    let other_names = vec![
        format!("{}_X", key.trim_start_matches('-').replace('-', "_")),
        format!("X{}", key.trim_start_matches('-').replace('-', "_")),
        "CUDA_VISIBLE_DEVICES".to_string(),
        "PYTHONPATH".to_string(),
    ];
    let builtins = vec![
        "set -e".to_string(),
        "cd /srv/app".to_string(),
        "ulimit -n 65536".to_string(),
        format!("echo \"{key}=1 {key} 32\""),
        format!("echo '{key} on'"),
        format!("echo {key} 32"),
        format!("printf '%s\\n' {key}=1"),
        "mkdir -p /tmp/logs".to_string(),
    ];
    let key_assign = if kind == Kind::Env { 3 } else { 0 };
    prop_oneof![
        1 => "[a-z ]{0,12}".prop_map(|c| Line::Comment(format!("# {c}"))),
        1 => Just(Line::Comment(format!("# export {key}=0"))),
        1 => Just(Line::Blank),
        2 => (any::<bool>(), select(other_names), old_value(), comment(key.clone())).prop_map(
            |(export, name, value, comment)| Line::OtherAssign { export, name, value, comment }
        ),
        key_assign => (any::<bool>(), old_value(), comment(key.clone()))
            .prop_map(|(export, value, comment)| Line::KeyAssign { export, value, comment }),
        1 => select(builtins).prop_map(Line::Builtin),
    ]
}

fn item(kind: Kind, key: String) -> impl Strategy<Value = Item> {
    let others = vec![
        "--port 30000".to_string(),
        "--tp=8".to_string(),
        "--model-path /models/dsv4".to_string(),
        format!("{key}-extra 1"),
        format!("{key}x=2"),
        format!("'{key} 3'"),
        "--name 'my model'".to_string(),
        "--disable-radix-cache".to_string(),
    ];
    let (arg, switch) = match kind {
        Kind::Env => (0, 0),
        Kind::Arg => (2, 0),
        Kind::Switch => (0, 2),
    };
    let arg_word_quoted = (
        "[A-Za-z0-9._:/,=+-]{0,6}",
        select(vec![Quote::Single, Quote::Double]),
    );
    prop_oneof![
        3 => select(others).prop_map(Item::Other),
        arg => old_value().prop_map(Item::ArgSpaced),
        arg => old_value().prop_map(Item::ArgEq),
        arg => arg_word_quoted.prop_map(Item::ArgWordQuoted),
        switch => Just(Item::Switch),
    ]
}

fn launch(kind: Kind, key: String) -> impl Strategy<Value = Launch> {
    let prefix = if kind == Kind::Env {
        proptest::option::weighted(0.3, old_value()).boxed()
    } else {
        Just(None).boxed()
    };
    let sep = prop_oneof![3 => Just(Sep::Space), 1 => Just(Sep::Continuation)];
    (
        prefix,
        any::<bool>(),
        prop::collection::vec((sep, item(kind, key.clone())), 0..6),
        any::<bool>(),
        comment(key),
    )
        .prop_flat_map(|(prefix_assign, exec, items, redirect, comment)| {
            let background = if exec {
                Just(false).boxed()
            } else {
                any::<bool>().boxed()
            };
            (
                Just(prefix_assign),
                Just(exec),
                Just(items),
                Just(redirect),
                background,
                Just(comment),
            )
        })
        .prop_map(
            |(prefix_assign, exec, items, redirect, background, comment)| Launch {
                prefix_assign,
                exec,
                items,
                redirect,
                background,
                comment,
            },
        )
}

fn script() -> impl Strategy<Value = Script> {
    select(vec![Kind::Env, Kind::Arg, Kind::Switch])
        .prop_flat_map(|kind| (Just(kind), key_for(kind)))
        .prop_flat_map(|(kind, key)| {
            let post = prop::collection::vec(
                prop_oneof![
                    Just(Line::Blank),
                    Just(Line::Comment("# started".into())),
                    Just(Line::Builtin("echo started".into())),
                    Just(Line::Builtin("wait".into())),
                ],
                0..3,
            );
            (
                Just(kind),
                Just(key.clone()),
                any::<bool>(),
                any::<bool>(),
                prop::collection::vec(line(kind, key.clone()), 0..7),
                proptest::option::weighted(0.85, launch(kind, key)),
                post,
                prop_oneof![4 => Just(true), 1 => Just(false)],
            )
        })
        .prop_map(
            |(kind, key, crlf, shebang, mut pre, launch, mut post, trailing_newline)| {
                // Lines after the launch command only make sense with one (and would
                // otherwise count as the leading comment block).
                if launch.is_none() {
                    post.clear();
                }
                if shebang {
                    pre.insert(0, Line::Shebang);
                }
                Script {
                    kind,
                    key,
                    crlf,
                    pre,
                    launch,
                    post,
                    trailing_newline,
                }
            },
        )
}

/// A value the editor accepts for an env or arg flag.
fn new_value() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:/,=+-]{1,8}"
}

fn replace(text: &str, span: std::ops::Range<usize>, with: &str) -> String {
    format!("{}{with}{}", &text[..span.start], &text[span.end..])
}

/// The text writing `value` must produce, from the script's known structure.
fn expected_write(s: &Script, r: &Rendered, flag: &FlagSpec, value: &str) -> Option<String> {
    let text = &r.text;
    match s.kind {
        Kind::Env | Kind::Arg => {
            if let Some(occ) = r.occurrences.last() {
                let q = occ.quote.mark();
                return Some(replace(
                    text,
                    occ.span.clone(),
                    &format!("{q}{}{value}{q}", occ.prefix),
                ));
            }
            if s.kind == Kind::Arg {
                let at = r.append_at?;
                return Some(replace(text, at..at, &format!(" {} {value}", s.key)));
            }
            let at = r.env_insert_at;
            let line = format!("export {}={value}", s.key);
            let nl = if text.contains("\r\n") { "\r\n" } else { "\n" };
            Some(
                if at == text.len() && !text.is_empty() && !text.ends_with('\n') {
                    format!("{text}{nl}{line}")
                } else {
                    format!("{}{line}{nl}{}", &text[..at], &text[at..])
                },
            )
        }
        Kind::Switch => {
            if value == flag.off || s.switch_count() > 0 {
                // Removal has several valid layouts; checked separately.
                return Some(text.clone());
            }
            let at = r.append_at?;
            Some(replace(text, at..at, &format!(" {}", s.key)))
        }
    }
}

/// What the script sets now, from its known structure.
fn expected_read(s: &Script, r: &Rendered, flag: &FlagSpec) -> Option<String> {
    match s.kind {
        Kind::Env | Kind::Arg => r.occurrences.last().map(|o| o.value.clone()),
        Kind::Switch => Some(if s.switch_count() > 0 {
            flag.on.clone()
        } else {
            flag.off.clone()
        }),
    }
}

/// Switch values: distinct flag values, never equal to one another.
fn switch_values() -> impl Strategy<Value = (String, String)> {
    ("[a-z0-9]{0,4}", "[a-z0-9]{0,4}").prop_filter("on and off differ", |(a, b)| a != b)
}

proptest! {
    #![proptest_config(config())]

    /// A generated script reads as built; writing a value yields exactly the text the
    /// structure predicts (only the setting's bytes differ), which reads back; writing
    /// another value and then the first again gives the same bytes.
    #[test]
    fn generated_scripts_edit_exactly_the_setting(
        s in script(),
        value in new_value(),
        other in new_value(),
        (on, off) in switch_values(),
        write_on in any::<bool>(),
    ) {
        let r = s.render();
        let text = &r.text;
        let flag = spec(s.kind, &s.key, &on, &off);
        prop_assert_eq!(read(text, &flag), expected_read(&s, &r, &flag), "reading {:?}", text);

        let (value, other) = match s.kind {
            Kind::Switch if write_on => (on.clone(), off.clone()),
            Kind::Switch => (off.clone(), on.clone()),
            _ => (value, other),
        };
        let written = write(text, &flag, &value);
        let Some(expected) = expected_write(&s, &r, &flag, &value) else {
            // No launch command to add the argument to: a NoPlace naming file and line.
            let err = written.expect_err("no place for the setting");
            prop_assert!(matches!(err, LaunchError::NoPlace { .. }), "{}", err);
            let want = format!("{PATH}:{}:", line_of(text, text.trim_end().len()));
            prop_assert!(err.to_string().starts_with(&want), "{} / {}", err, want);
            return Ok(());
        };
        let out = written.map_err(|e| TestCaseError::fail(format!("{e}")))?;
        if s.kind == Kind::Switch && value == off && s.switch_count() > 0 {
            let layouts = s.switch_removals();
            prop_assert!(
                layouts.contains(&out),
                "removing the switch from {:?} gave {:?}, not one of {:?}",
                text,
                out,
                layouts,
            );
        } else {
            prop_assert_eq!(&out, &expected, "writing {:?} into {:?}", value, text);
        }
        prop_assert_eq!(read(&out, &flag), Some(value.clone()), "readback of {:?}", out);

        if s.launch.is_none() {
            // Nothing to toggle in: only removing a switch (a no-op) got this far.
            return Ok(());
        }
        // Toggling is exact once the setting is in place.
        let toggled = write(&out, &flag, &other).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(read(&toggled, &flag), Some(other.clone()));
        let back = write(&toggled, &flag, &value).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        if s.kind == Kind::Switch && value == on && s.switch_count() > 0 {
            // A switch that was in the middle of the command comes back at its end.
            prop_assert_eq!(read(&back, &flag), Some(value.clone()));
        } else {
            prop_assert_eq!(&back, &out, "{:?} -> {:?} -> {:?}", value, other, value);
        }
    }

    /// check_partial refuses a flag whose setting appears in the config of a role it
    /// does not list, naming that file and the line of the setting.
    #[test]
    fn partial_flags_are_refused_at_the_line_of_the_setting(
        s in script(),
        (on, off) in switch_values(),
    ) {
        let r = s.render();
        let flag = spec(s.kind, &s.key, &on, &off);
        let roles = [("decode".to_string(), PathBuf::from("d.sh"), r.text.clone())];
        let at = match s.kind {
            Kind::Env | Kind::Arg => r.occurrences.last().map(|o| {
                // The key's own offset: the start of the word holding it.
                let before = &r.text[..o.span.start];
                match s.kind {
                    Kind::Env => before.len() - s.key.len() - 1,
                    _ if !o.prefix.is_empty() => o.span.start,
                    _ => before.rfind(s.key.as_str()).expect("key before its value"),
                }
            }),
            Kind::Switch => r.first_switch,
        };
        match (check_partial(&flag, &roles), at) {
            (Ok(()), None) => {}
            (Err(err), Some(at)) => {
                let want = format!("d.sh:{}:", line_of(&r.text, at));
                prop_assert!(matches!(err, LaunchError::Partial { .. }), "{}", err);
                prop_assert!(err.to_string().starts_with(&want), "{} / {}", err, want);
                prop_assert!(err.to_string().contains("--allow-partial"));
            }
            (got, want) => prop_assert!(
                false,
                "check_partial {:?}, setting at {:?} in {:?}",
                got,
                want,
                r.text
            ),
        }
    }
}

// ---------------------------------------------------------------------------------
// Arbitrary text.
// ---------------------------------------------------------------------------------

/// Text made of shell fragments: quotes, escapes, continuations, substitutions,
/// operators, comments, assignments and options of the flag's key, in any order. Far
/// likelier than random Unicode to reach the lexer's corners.
fn shell_soup(key: String) -> impl Strategy<Value = String> {
    let fragments = vec![
        " ".to_string(),
        "  ".to_string(),
        "\t".to_string(),
        "\n".to_string(),
        "\r\n".to_string(),
        "\r".to_string(),
        "\\\n".to_string(),
        "\\\r\n".to_string(),
        "\\".to_string(),
        "'".to_string(),
        "\"".to_string(),
        "`".to_string(),
        "$(".to_string(),
        "${".to_string(),
        ")".to_string(),
        "}".to_string(),
        "#".to_string(),
        "# c".to_string(),
        ";".to_string(),
        "&".to_string(),
        "&&".to_string(),
        "|".to_string(),
        ">".to_string(),
        "2>&1".to_string(),
        "<".to_string(),
        "=".to_string(),
        "exec".to_string(),
        "export".to_string(),
        "env".to_string(),
        "-u".to_string(),
        "if".to_string(),
        "then".to_string(),
        "fi".to_string(),
        "echo".to_string(),
        "srv".to_string(),
        "python -m srv".to_string(),
        "--tp".to_string(),
        "8".to_string(),
        "x".to_string(),
        "é".to_string(),
        "｜".to_string(),
        key.clone(),
        format!("{key}="),
        format!("{key}=1"),
        format!("{key} 1"),
        format!("export {key}="),
        format!("'{key}=1'"),
    ];
    prop::collection::vec(select(fragments), 0..40).prop_map(|parts| parts.concat())
}

fn arbitrary_text(key: String) -> impl Strategy<Value = String> {
    prop_oneof![
        2 => shell_soup(key),
        1 => any::<String>(),
        1 => "[ -~\t\r\n]{0,80}",
    ]
}

/// Any flag value, valid or not.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9._:/,=+-]{0,8}",
        1 => any::<String>(),
        1 => "[ -~]{0,8}",
    ]
}

/// The part of `before` that `after` replaced: (common prefix length, removed, added).
fn diff_window<'a>(before: &'a str, after: &'a str) -> (usize, &'a str, &'a str) {
    let mut prefix = before
        .bytes()
        .zip(after.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !before.is_char_boundary(prefix) || !after.is_char_boundary(prefix) {
        prefix -= 1;
    }
    let max_suffix = before.len().min(after.len()) - prefix;
    let mut suffix = before
        .bytes()
        .rev()
        .zip(after.bytes().rev())
        .take(max_suffix)
        .take_while(|(a, b)| a == b)
        .count();
    while !before.is_char_boundary(before.len() - suffix)
        || !after.is_char_boundary(after.len() - suffix)
    {
        suffix -= 1;
    }
    (
        prefix,
        &before[prefix..before.len() - suffix],
        &after[prefix..after.len() - suffix],
    )
}

/// Whether `with` is `text` with `piece` inserted at one place.
fn is_insertion(text: &str, with: &str, piece: &str) -> bool {
    with.len() == text.len() + piece.len()
        && (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .any(|i| {
                with[..i] == text[..i]
                    && with[i..].starts_with(piece)
                    && with[i + piece.len()..] == text[i..]
            })
}

proptest! {
    #![proptest_config(config())]

    /// Whatever the text and value: no panic; a refused value is BadValue, a missing
    /// launch command NoPlace at a line of the file; an accepted edit changes one place
    /// only, and (when it reads back, which the journal checks after every edit) is
    /// idempotent.
    #[test]
    fn any_text_edits_cleanly_or_fails_clearly(
        (kind, key, text) in select(vec![Kind::Env, Kind::Arg, Kind::Switch])
            .prop_flat_map(|kind| (Just(kind), key_for(kind)))
            .prop_flat_map(|(kind, key)| (Just(kind), Just(key.clone()), arbitrary_text(key))),
        value in any_value(),
        (on, off) in switch_values(),
        switch_pick in 0..3u8,
    ) {
        let flag = spec(kind, &key, &on, &off);
        let before = read(&text, &flag);
        let value = match (kind, switch_pick) {
            (Kind::Switch, 0) => on.clone(),
            (Kind::Switch, 1) => off.clone(),
            _ => value,
        };
        let _ = check_partial(&flag, &[("decode".into(), PathBuf::from("d.sh"), text.clone())]);
        let out = match write(&text, &flag, &value) {
            Err(LaunchError::BadValue { .. }) => {
                let refused = validate_value(&value).is_err()
                    || (kind == Kind::Arg && value.is_empty())
                    || (kind == Kind::Switch && value != on && value != off);
                prop_assert!(refused, "value {:?} accepted by validation but refused", value);
                return Ok(());
            }
            Err(LaunchError::NoPlace { line, .. }) => {
                prop_assert!(kind != Kind::Env, "an env setting always has a place");
                prop_assert!(
                    line >= 1 && line <= text.split('\n').count(),
                    "line {} of {:?}",
                    line,
                    text,
                );
                return Ok(());
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected error {other}"))),
            Ok(out) => out,
        };
        prop_assert!(validate_value(&value).is_ok());
        let (_, removed, added) = diff_window(&text, &out);
        match (kind, before.as_deref()) {
            (Kind::Env, None) => {
                let line = format!("export {key}={value}");
                prop_assert!(
                    is_insertion(&text, &out, &format!("{line}\n"))
                        || is_insertion(&text, &out, &format!("{line}\r\n"))
                        || is_insertion(&text, &out, &format!("\n{line}"))
                        || is_insertion(&text, &out, &format!("\r\n{line}")),
                    "env insert into {:?} gave {:?}", text, out
                );
            }
            (Kind::Arg, None) => {
                prop_assert!(
                    is_insertion(&text, &out, &format!(" {key} {value}")),
                    "arg append to {:?} gave {:?}",
                    text,
                    out,
                );
            }
            (Kind::Switch, Some(v)) if v == off && value == on => {
                prop_assert!(
                    is_insertion(&text, &out, &format!(" {key}")),
                    "switch append to {:?} gave {:?}",
                    text,
                    out,
                );
            }
            (Kind::Switch, _) if value == off => {
                // Only blanks, continuations and the switch itself disappear.
                prop_assert!(out.len() <= text.len());
                prop_assert!(
                    added.is_empty() || removed.contains(key.as_str()),
                    "{:?} -> {:?}",
                    text,
                    out,
                );
            }
            (Kind::Switch, _) => prop_assert_eq!(&out, &text),
            (Kind::Env | Kind::Arg, Some(old)) => {
                // One word's value replaced in place: what the edit added lies within the
                // value as written (bare or quoted, with `KEY=` when the whole word is
                // rewritten); a line is never swallowed unless the old word spanned it
                // inside quotes or a continuation. (The window is narrowed by the bytes old
                // and new text share, so `added` may be any part of that rendering.)
                let renderings: Vec<String> = ["", "'", "\""]
                    .iter()
                    .flat_map(|q| [format!("{q}{value}{q}"), format!("{q}{key}={value}{q}")])
                    .collect();
                prop_assert!(
                    renderings.iter().any(|r| r.contains(added)),
                    "added {:?} (removed {:?}) is not the value as written, in {:?} -> {:?}",
                    added,
                    removed,
                    text,
                    out,
                );
                // A line break can only go with a continuation inside the word (whose
                // backslash the new text never holds) or inside the old value itself.
                prop_assert!(
                    !removed.contains('\n') || removed.contains('\\') || old.contains('\n'),
                    "the edit removed a line break outside the setting: {:?} -> {:?}",
                    text,
                    out,
                );
            }
        }
        // The journal refuses an edit that does not read back; one that does is stable.
        if read(&out, &flag).as_deref() == Some(value.as_str()) {
            let again = write(&out, &flag, &value)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(&again, &out, "writing the same value twice");
        }
    }

    /// The journal on real files: whatever bytes a launch config holds (even invalid
    /// UTF-8) and whatever the edit does, restore brings back the original bytes and
    /// permissions; an edit that succeeds wrote exactly what write_setting produces.
    #[test]
    fn journal_restores_any_original_bytes(
        s in script(),
        junk in prop_oneof![
            3 => Just(None),
            1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
        ],
        value in new_value(),
        (on, off) in switch_values(),
    ) {
        let r = s.render();
        let flag = spec(s.kind, &s.key, &on, &off);
        let value = if s.kind == Kind::Switch { on.clone() } else { value };
        let bytes = junk.unwrap_or_else(|| r.text.clone().into_bytes());
        let dir = scratch_dir();
        let path = dir.path().join("serve.sh");
        fs::write(&path, &bytes).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o751)).unwrap();
        let role = RoleSpec {
            name: "prefill".into(),
            launch: path.clone(),
            restart: None,
            health: "http://127.0.0.1:1/health".into(),
            metrics: None,
            health_timeout_s: 1,
            restart_timeout_s: 1,
            ..RoleSpec::new("prefill", PathBuf::new(), String::new(), None)
        };
        let journal = dir.path().join("journal");
        let mut editor = Editor::begin_at(&dir.path().join("state"), &journal, std::slice::from_ref(&path)).unwrap();
        let applied = editor.apply(&flag, &value, std::slice::from_ref(&role));
        let now = fs::read(&path).unwrap();
        match (&applied, std::str::from_utf8(&bytes)) {
            (Ok(readback), Ok(text)) => {
                prop_assert_eq!(readback.get("prefill").map(String::as_str), Some(value.as_str()));
                let want = write(text, &flag, &value).unwrap();
                prop_assert_eq!(String::from_utf8_lossy(&now), want);
            }
            (Ok(_), Err(_)) => prop_assert!(false, "an edit of invalid UTF-8 succeeded"),
            (Err(_), _) => {}
        }
        editor.restore().unwrap();
        prop_assert_eq!(fs::read(&path).unwrap(), bytes);
        prop_assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o751);
        prop_assert!(!journal.join(super::JOURNAL_FILE).exists());
    }
}

// ---------------------------------------------------------------------------------
// Inputs the properties above found, kept as plain tests.
// ---------------------------------------------------------------------------------

/// Found by `any_text_edits_cleanly_or_fails_clearly`: a command made only of a
/// redirection (`>\`, or the common `> server.log` that truncates a log) was taken for
/// the launch command, and adding an argument to it panicked.
#[test]
fn a_bare_redirection_is_not_a_launch_command() {
    let switch = spec(Kind::Switch, "--a", "on", "off");
    let err = write(">\\", &switch, "on").unwrap_err();
    assert!(matches!(err, LaunchError::NoPlace { .. }), "{err}");
    let arg = spec(Kind::Arg, "--a", "1", "2");
    let text = "#!/bin/sh\n> /var/log/engine.log\n";
    let err = write(text, &arg, "1").unwrap_err();
    assert!(err.to_string().starts_with("conf/serve.sh:2:"), "{err}");
    let text = "exec srv --tp 8 2>&1\n> done.log\n";
    assert_eq!(
        write(text, &arg, "1").unwrap(),
        "exec srv --tp 8 --a 1 2>&1\n> done.log\n"
    );
}

/// Found by `generated_scripts_edit_exactly_the_setting`: an option inside a builtin's
/// arguments (`echo "--a=1 is the default"`) counted as the setting, so the edit changed
/// the echo, the readback agreed, and the engine kept its old value.
#[test]
fn options_in_builtin_arguments_are_not_settings() {
    let arg = spec(Kind::Arg, "--a", "1", "2");
    let text = "echo \"--a=1 --a 32\"\nexec srv --tp 8\n";
    assert_eq!(read(text, &arg), None);
    assert_eq!(
        write(text, &arg, "5").unwrap(),
        "echo \"--a=1 --a 32\"\nexec srv --tp 8 --a 5\n"
    );
    let switch = spec(Kind::Switch, "--sw", "on", "off");
    let text = "echo --sw\nexec srv\n";
    assert_eq!(read(text, &switch).as_deref(), Some("off"));
    assert_eq!(write(text, &switch, "off").unwrap(), text);
    assert_eq!(
        write(text, &switch, "on").unwrap(),
        "echo --sw\nexec srv --sw\n"
    );
    assert!(check_partial(
        &switch,
        &[("decode".into(), PathBuf::from("d.sh"), text.into())]
    )
    .is_ok());
}
