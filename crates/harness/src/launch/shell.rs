//! A small shell lexer for launch configs: words (with quotes, escapes, `$(...)`,
//! backslash-continued lines and comments handled, each word keeping its byte span) and
//! simple commands, and how a command's words divide into assignments and the command
//! word. `edit` finds and rewrites settings with it. Not handled: here-documents.

use std::ops::Range;

/// One shell word: its raw bytes in the text and its value with quotes removed.
#[derive(Debug, Clone)]
pub(super) struct Word {
    pub span: Range<usize>,
    pub value: String,
    /// The target of a redirection (`> log`) or its fd (`2>`): not a program argument.
    pub(crate) redirect: bool,
}

/// A simple command: the words between two separators (newline, `;`, `&`, `|`, ...).
#[derive(Debug)]
pub(super) struct Command {
    pub words: Vec<Word>,
}

impl Command {
    pub fn start(&self) -> usize {
        self.words[0].span.start
    }
}

/// Reserved words that may precede a command on the same line (`then exec ...`).
const KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "do", "while", "until", "!", "{", "time",
];
/// Builtins that declare variables: their `NAME=VALUE` operands are assignments.
const DECLARATION_BUILTINS: &[&str] = &["export", "readonly", "declare", "typeset", "local"];
/// Builtins that are never the engine's launch command.
pub(super) const NOT_LAUNCH: &[&str] = &[
    "set", "cd", "source", ".", "trap", "echo", "printf", "wait", "exit", "fi", "done", "esac",
    "}", "shift", "ulimit", "umask", "unset", "true", "false", ":", "test", "[", "[[", "return",
    "sleep", "mkdir", "export", "readonly", "declare", "typeset", "local",
];

fn is_op_byte(b: u8) -> bool {
    matches!(b, b';' | b'&' | b'|' | b'(' | b')' | b'<' | b'>')
}

/// End (exclusive) of a `$(...)` / `${...}` starting at `open` (the `(` or `{`).
fn matching_close(bytes: &[u8], open: usize) -> usize {
    let (o, c) = if bytes[open] == b'(' {
        (b'(', b')')
    } else {
        (b'{', b'}')
    };
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        if bytes[i] == o {
            depth += 1;
        } else if bytes[i] == c {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        } else if bytes[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    bytes.len()
}

/// Length of a line continuation (`\` + LF or CRLF) at `i`, or 0.
fn continuation_len(bytes: &[u8], i: usize) -> usize {
    if bytes.get(i) != Some(&b'\\') {
        0
    } else if bytes.get(i + 1) == Some(&b'\n') {
        2
    } else if bytes.get(i + 1) == Some(&b'\r') && bytes.get(i + 2) == Some(&b'\n') {
        3
    } else {
        0
    }
}

/// Splits a shell script into simple commands.
pub(super) fn commands(text: &str) -> Vec<Command> {
    let bytes = text.as_bytes();
    let n = bytes.len();
    let mut out = Vec::new();
    let mut current: Vec<Word> = Vec::new();
    let mut redirect_next = false;
    let mut i = 0;
    let mut finish = |current: &mut Vec<Word>| {
        if !current.is_empty() {
            out.push(Command {
                words: std::mem::take(current),
            });
        }
    };
    while i < n {
        let c = bytes[i];
        let cont = continuation_len(bytes, i);
        if cont > 0 {
            i += cont;
            continue;
        }
        match c {
            b' ' | b'\t' | b'\r' => i += 1,
            b'\n' => {
                finish(&mut current);
                redirect_next = false;
                i += 1;
            }
            b'#' => {
                while i < n && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            _ if is_op_byte(c) => {
                let start = i;
                while i < n && is_op_byte(bytes[i]) {
                    i += 1;
                }
                let op = &text[start..i];
                if op.contains('<') || op.contains('>') {
                    // `2>&1`: the fd glued to the operator is not an argument either.
                    if let Some(prev) = current.last_mut() {
                        if prev.span.end == start && prev.value.chars().all(|c| c.is_ascii_digit())
                        {
                            prev.redirect = true;
                        }
                    }
                    redirect_next = true;
                } else {
                    finish(&mut current);
                    redirect_next = false;
                }
            }
            _ => {
                let (word, next) = lex_word(text, i);
                i = next;
                current.push(Word {
                    redirect: redirect_next,
                    ..word
                });
                redirect_next = false;
            }
        }
    }
    finish(&mut current);
    out
}

/// Lexes one word starting at `start`; returns it and the offset after it.
fn lex_word(text: &str, start: usize) -> (Word, usize) {
    let bytes = text.as_bytes();
    let n = bytes.len();
    let mut value = String::new();
    let mut i = start;
    while i < n {
        let cont = continuation_len(bytes, i);
        if cont > 0 {
            i += cont;
            continue;
        }
        let c = bytes[i];
        match c {
            b' ' | b'\t' | b'\r' | b'\n' => break,
            _ if is_op_byte(c) => break,
            b'\\' => {
                if let Some(ch) = text[i + 1..].chars().next() {
                    value.push(ch);
                    i += 1 + ch.len_utf8();
                } else {
                    i += 1;
                }
            }
            b'\'' => {
                let close = text[i + 1..].find('\'').map(|p| i + 1 + p).unwrap_or(n);
                value.push_str(&text[i + 1..close]);
                i = (close + 1).min(n);
            }
            b'"' => {
                i += 1;
                while i < n && bytes[i] != b'"' {
                    let cont = continuation_len(bytes, i);
                    if cont > 0 {
                        i += cont;
                    } else if bytes[i] == b'\\'
                        && matches!(bytes.get(i + 1), Some(b'$' | b'`' | b'"' | b'\\'))
                    {
                        value.push(bytes[i + 1] as char);
                        i += 2;
                    } else {
                        let ch = text[i..].chars().next().expect("in bounds");
                        value.push(ch);
                        i += ch.len_utf8();
                    }
                }
                i = (i + 1).min(n);
            }
            b'$' if matches!(bytes.get(i + 1), Some(b'(' | b'{')) => {
                let end = matching_close(bytes, i + 1);
                value.push_str(&text[i..end]);
                i = end;
            }
            b'`' => {
                let close = text[i + 1..].find('`').map(|p| i + 1 + p).unwrap_or(n);
                let end = (close + 1).min(n);
                value.push_str(&text[i..end]);
                i = end;
            }
            _ => {
                let ch = text[i..].chars().next().expect("in bounds");
                value.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    (
        Word {
            span: start..i,
            value,
            redirect: false,
        },
        i,
    )
}

fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `NAME` if the word is a literal `NAME=...` assignment.
pub(super) fn assignment_name<'t>(text: &'t str, w: &Word) -> Option<&'t str> {
    let raw = &text[w.span.clone()];
    let eq = raw.find('=')?;
    let name = &raw[..eq];
    is_var_name(name).then_some(name)
}

/// How a command's words divide: assignments, and the command word if any.
pub(super) struct Parsed<'c> {
    pub(crate) assignments: Vec<&'c Word>,
    /// Index of the command word (after keywords and prefix assignments).
    pub command: Option<usize>,
    /// True for `export A=1`, `A=1` and the like: a line that only sets variables.
    pub(crate) pure_assignment: bool,
}

pub(super) fn parse_command<'c>(text: &str, cmd: &'c Command) -> Parsed<'c> {
    let words = &cmd.words;
    let mut k = 0;
    while k < words.len() && KEYWORDS.contains(&words[k].value.as_str()) {
        k += 1;
    }
    if k < words.len() && DECLARATION_BUILTINS.contains(&words[k].value.as_str()) {
        let assignments = words[k + 1..]
            .iter()
            .filter(|w| !w.redirect && assignment_name(text, w).is_some())
            .collect();
        return Parsed {
            assignments,
            command: Some(k),
            pure_assignment: true,
        };
    }
    let mut assignments = Vec::new();
    while k < words.len() && assignment_name(text, &words[k]).is_some() {
        assignments.push(&words[k]);
        k += 1;
    }
    let command = (k < words.len()).then_some(k);
    // `[exec] env [-i] VAR=VALUE prog ...` sets VAR for prog just like a prefix does.
    let mut j = k;
    if words.get(j).is_some_and(|w| w.value == "exec") {
        j += 1;
    }
    if words.get(j).is_some_and(|w| w.value == "env") {
        j += 1;
        while let Some(w) = words.get(j) {
            if assignment_name(text, w).is_some() {
                assignments.push(w);
            } else if matches!(w.value.as_str(), "-u" | "--unset" | "-C" | "--chdir") {
                j += 1; // the option's operand
            } else if !w.value.starts_with('-') {
                break;
            }
            j += 1;
        }
    }
    Parsed {
        pure_assignment: command.is_none() && !assignments.is_empty(),
        assignments,
        command,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexer_keeps_quoted_and_substituted_words_whole() {
        let text = "X=\"a b\" Y=$(nproc --all) exec srv --name 'my model' 2>&1 | tee log # c\n";
        let cmds = commands(text);
        assert_eq!(cmds.len(), 2);
        let values: Vec<&str> = cmds[0].words.iter().map(|w| w.value.as_str()).collect();
        assert_eq!(
            values,
            [
                "X=a b",
                "Y=$(nproc --all)",
                "exec",
                "srv",
                "--name",
                "my model",
                "2",
                "1"
            ]
        );
        assert!(cmds[0].words[6].redirect && cmds[0].words[7].redirect);
        let p = parse_command(text, &cmds[0]);
        assert_eq!(p.assignments.len(), 2);
        assert_eq!(p.command, Some(2));
    }
}
