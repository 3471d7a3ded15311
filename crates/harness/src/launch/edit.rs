//! Reading and writing one flag's setting in a launch config's text (docs/design.md 3.3).
//!
//! The shell lexer (`shell`) finds words and simple commands; edits then replace only
//! the bytes of the setting's value, so comments, quoting style, line endings and the
//! trailing newline survive. Not handled: here-documents and settings made indirectly
//! (a `source`d file, `eval`); the readback after each edit catches what this misses.

use std::ops::Range;
use std::path::Path;

use crate::config::{line_of, validate_value, FlagSpec, Setting};

use super::shell::{assignment_name, commands, parse_command, Command, Word, NOT_LAUNCH};
use super::LaunchError;

/// Where a setting's value sits and how to rewrite it.
#[derive(Debug)]
struct Occurrence {
    /// Bytes replaced on write.
    span: Range<usize>,
    /// Written before the value inside the quotes (`--arg=` when the whole word is quoted).
    prefix: String,
    /// Quote character kept around the new value (empty when unquoted).
    quote: &'static str,
    value: String,
    /// Offset of the setting's key, for line numbers.
    key_at: usize,
}

impl Occurrence {
    fn render(&self, value: &str) -> String {
        format!("{q}{p}{value}{q}", q = self.quote, p = self.prefix)
    }
}

/// The quoting style of a raw value: `'v'`, `"v"` or bare (anything mixed counts as bare).
fn quote_of(raw: &str) -> &'static str {
    for (q, qs) in [('\'', "'"), ('"', "\"")] {
        if raw.len() >= 2
            && raw.starts_with(q)
            && raw.ends_with(q)
            && !raw[1..raw.len() - 1].contains(q)
            && !raw[1..raw.len() - 1].contains('\\')
        {
            return qs;
        }
    }
    ""
}

/// An occurrence whose value is the part of `w` after a literal `key=` prefix, or the
/// whole word re-rendered as `key=VALUE` when the prefix itself is quoted.
fn after_equals(text: &str, w: &Word, key: &str) -> Occurrence {
    let raw = &text[w.span.clone()];
    let value = w.value[key.len() + 1..].to_string();
    if raw.starts_with(key) && raw.as_bytes().get(key.len()) == Some(&b'=') {
        let at = w.span.start + key.len() + 1;
        let span = at..w.span.end;
        Occurrence {
            quote: quote_of(&text[span.clone()]),
            span,
            prefix: String::new(),
            value,
            key_at: w.span.start,
        }
    } else {
        Occurrence {
            span: w.span.clone(),
            prefix: format!("{key}="),
            quote: quote_of(raw),
            value,
            key_at: w.span.start,
        }
    }
}

fn env_occurrences(text: &str, cmds: &[Command], var: &str) -> Vec<Occurrence> {
    let mut out = Vec::new();
    for cmd in cmds {
        for w in parse_command(text, cmd).assignments {
            if assignment_name(text, w) == Some(var) {
                out.push(after_equals(text, w, var));
            }
        }
    }
    out
}

/// Whether a command's words can be options of the engine: not those of a builtin like
/// `echo "--arg=1 is the default"`, whose arguments are text (editing them would leave
/// the engine's own setting unchanged while the readback agrees).
fn may_pass_options(text: &str, cmd: &Command) -> bool {
    parse_command(text, cmd)
        .command
        .is_none_or(|k| !NOT_LAUNCH.contains(&cmd.words[k].value.as_str()))
}

fn arg_occurrences(text: &str, cmds: &[Command], arg: &str) -> Vec<Occurrence> {
    let mut out = Vec::new();
    let with_eq = format!("{arg}=");
    for cmd in cmds.iter().filter(|c| may_pass_options(text, c)) {
        let words = &cmd.words;
        for (i, w) in words.iter().enumerate() {
            if w.redirect {
                continue;
            }
            if w.value == arg {
                if let Some(next) = words.get(i + 1).filter(|n| !n.redirect) {
                    out.push(Occurrence {
                        quote: quote_of(&text[next.span.clone()]),
                        span: next.span.clone(),
                        prefix: String::new(),
                        value: next.value.clone(),
                        key_at: w.span.start,
                    });
                }
            } else if w.value.starts_with(&with_eq) {
                out.push(after_equals(text, w, arg));
            }
        }
    }
    out
}

fn switch_words<'c>(text: &str, cmds: &'c [Command], switch: &str) -> Vec<&'c Word> {
    cmds.iter()
        .filter(|c| may_pass_options(text, c))
        .flat_map(|c| c.words.iter())
        .filter(|w| !w.redirect && w.value == switch)
        .collect()
}

/// The setting's current value in `text`.
///
/// env: the value of the last `export VAR=VALUE` / `VAR=VALUE` (also `VAR=VALUE cmd`)
/// assignment, quotes removed; arg: the value of the last `--arg VALUE` or
/// `--arg=VALUE`; `None` when the variable or argument does not appear (outside
/// comments). switch: `flag.on` when the switch is present, else `flag.off` (never None).
pub(crate) fn read_setting(text: &str, setting: &Setting, flag: &FlagSpec) -> Option<String> {
    let cmds = commands(text);
    match setting {
        Setting::Env(var) => env_occurrences(text, &cmds, var).pop().map(|o| o.value),
        Setting::Arg(arg) => arg_occurrences(text, &cmds, arg).pop().map(|o| o.value),
        Setting::Switch(sw) => Some(if switch_words(text, &cmds, sw).is_empty() {
            flag.off.clone()
        } else {
            flag.on.clone()
        }),
    }
}

/// Offset of the start of the line holding `at`.
fn line_start(text: &str, at: usize) -> usize {
    text[..at].rfind('\n').map(|p| p + 1).unwrap_or(0)
}

/// Offset just past the newline ending the line holding `at` (or the text's end).
fn next_line_start(text: &str, at: usize) -> usize {
    text[at..]
        .find('\n')
        .map(|p| at + p + 1)
        .unwrap_or(text.len())
}

fn newline_style(text: &str) -> &'static str {
    if text.contains("\r\n") {
        "\r\n"
    } else {
        "\n"
    }
}

/// The command an argument or switch belongs to: the last `exec ...`, else the last
/// command passing `--options`, else the last command that is not a shell builtin.
fn launch_command<'c>(text: &str, cmds: &'c [Command]) -> Option<&'c Command> {
    let candidates: Vec<&Command> = cmds
        .iter()
        .filter(|c| {
            let p = parse_command(text, c);
            // A bare redirection (`> server.log`) has no word to add an argument after.
            c.words.iter().any(|w| !w.redirect)
                && !p.pure_assignment
                && p.command
                    .is_some_and(|k| !NOT_LAUNCH.contains(&c.words[k].value.as_str()))
        })
        .collect();
    let is_exec = |c: &&&Command| {
        parse_command(text, c)
            .command
            .is_some_and(|k| c.words[k].value == "exec")
    };
    let has_options = |c: &&&Command| c.words.iter().any(|w| w.value.starts_with("--"));
    candidates
        .iter()
        .rev()
        .find(is_exec)
        .or_else(|| candidates.iter().rev().find(has_options))
        .or_else(|| candidates.last())
        .copied()
}

/// Where a new `export VAR=VALUE` line goes: after the last variable-only line before
/// the launch command, else after the shebang and leading comments.
fn env_insert_at(text: &str, cmds: &[Command]) -> usize {
    let launch_line = launch_command(text, cmds).map(|c| line_start(text, c.start()));
    let limit = launch_line.unwrap_or(text.len());
    let anchor = cmds
        .iter()
        .rfind(|c| c.start() < limit && parse_command(text, c).pure_assignment);
    if let Some(cmd) = anchor {
        let end = cmd.words.last().expect("non-empty command").span.end;
        // `export A=1; exec ...` on one line: go before that line, not after the exec.
        return next_line_start(text, end).min(limit);
    }
    let mut at = 0;
    let mut pos = 0;
    while pos < text.len() {
        let next = next_line_start(text, pos);
        let line = text[pos..next].trim();
        if line.starts_with('#') {
            at = next;
        } else if !line.is_empty() {
            break;
        }
        pos = next;
    }
    at.min(limit)
}

fn insert_line(text: &str, at: usize, line: &str) -> String {
    let nl = newline_style(text);
    let mut out = String::with_capacity(text.len() + line.len() + 2);
    out.push_str(&text[..at]);
    if at == text.len() && !text.is_empty() && !text.ends_with('\n') {
        out.push_str(nl);
        out.push_str(line);
    } else {
        out.push_str(line);
        out.push_str(nl);
    }
    out.push_str(&text[at..]);
    out
}

fn replace(text: &str, span: Range<usize>, with: &str) -> String {
    let mut out = String::with_capacity(text.len() + with.len());
    out.push_str(&text[..span.start]);
    out.push_str(with);
    out.push_str(&text[span.end..]);
    out
}

/// Appends ` addition` to the launch command, after its last argument (before a
/// trailing comment or redirection, at the end of a backslash-continued command).
fn append_to_command(
    text: &str,
    cmds: &[Command],
    flag: &FlagSpec,
    addition: &str,
    path: &Path,
) -> Result<String, LaunchError> {
    let Some(cmd) = launch_command(text, cmds) else {
        return Err(LaunchError::NoPlace {
            path: path.to_path_buf(),
            line: line_of(text, text.trim_end().len()),
            flag: flag.name.clone(),
            key: flag.setting.key().to_string(),
        });
    };
    let last = cmd
        .words
        .iter()
        .rev()
        .find(|w| !w.redirect)
        .expect("a launch command has a command word");
    let at = last.span.end;
    Ok(replace(text, at..at, &format!(" {addition}")))
}

/// Removes a switch word: its whole line when it stands alone on a continued line,
/// else the word and one adjacent blank.
fn remove_word(text: &str, w: &Word) -> String {
    let start = line_start(text, w.span.start);
    let next = next_line_start(text, w.span.end);
    let content_end = text[..next]
        .trim_end_matches(['\n', '\r'])
        .len()
        .max(w.span.end);
    let before = &text[start..w.span.start];
    let after = text[w.span.end..content_end].trim();
    if before.trim().is_empty() && (after.is_empty() || after == "\\") {
        if after == "\\" || start == 0 {
            return replace(text, start..next, "");
        }
        // The switch ended a continued command: the line above must stop continuing.
        let prev_content = text[..start].trim_end_matches(['\n', '\r']);
        let prev_trimmed = prev_content.trim_end();
        if let Some(stripped) = prev_trimmed.strip_suffix('\\') {
            // Cut from the ` \` ending the line above through the switch, keeping the
            // switch line's own line ending as the command's new end.
            let cut = stripped.trim_end().len();
            return format!("{}{}", &text[..cut], &text[content_end..]);
        }
        return replace(text, start..next, "");
    }
    let bytes = text.as_bytes();
    let is_blank = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    if !before.trim().is_empty() && is_blank(bytes.get(w.span.start.wrapping_sub(1))) {
        replace(text, w.span.start - 1..w.span.end, "")
    } else if is_blank(bytes.get(w.span.end)) {
        replace(text, w.span.start..w.span.end + 1, "")
    } else {
        replace(text, w.span.clone(), "")
    }
}

/// `text` with the flag's setting changed to `value`, every other byte unchanged.
///
/// Present settings have only their value's bytes replaced (quoting style kept; env:
/// the last assignment, arg: the last occurrence). Absent ones are added: env as an
/// `export VAR=VALUE` line after the last variable-only line (or after the shebang and
/// leading comments), arg as ` --arg VALUE` and a switch as ` --switch` at the end of the
/// launch command. A switch is removed (every occurrence) for its `off` value.
pub(crate) fn write_setting(
    text: &str,
    flag: &FlagSpec,
    value: &str,
    path: &Path,
) -> Result<String, LaunchError> {
    validate_value(value).map_err(|reason| LaunchError::BadValue {
        flag: flag.name.clone(),
        reason,
    })?;
    let cmds = commands(text);
    match &flag.setting {
        Setting::Env(var) => match env_occurrences(text, &cmds, var).pop() {
            Some(occ) => Ok(replace(text, occ.span.clone(), &occ.render(value))),
            None => Ok(insert_line(
                text,
                env_insert_at(text, &cmds),
                &format!("export {var}={value}"),
            )),
        },
        Setting::Arg(arg) => {
            if value.is_empty() {
                return Err(LaunchError::BadValue {
                    flag: flag.name.clone(),
                    reason: format!("{arg} needs a non-empty value"),
                });
            }
            match arg_occurrences(text, &cmds, arg).pop() {
                Some(occ) => Ok(replace(text, occ.span.clone(), &occ.render(value))),
                None => append_to_command(text, &cmds, flag, &format!("{arg} {value}"), path),
            }
        }
        Setting::Switch(sw) => {
            let present = switch_words(text, &cmds, sw);
            if value == flag.on {
                if present.is_empty() {
                    append_to_command(text, &cmds, flag, sw, path)
                } else {
                    Ok(text.to_string())
                }
            } else if value == flag.off {
                let mut out = text.to_string();
                // Back to front, so earlier spans stay valid.
                for w in present.iter().rev() {
                    out = remove_word(&out, w);
                }
                Ok(out)
            } else {
                Err(LaunchError::BadValue {
                    flag: flag.name.clone(),
                    reason: format!(
                        "{sw} is a switch: its values are {:?} (present) and {:?} (absent)",
                        flag.on, flag.off
                    ),
                })
            }
        }
    }
}

/// Offset of the setting's key in `text` if the launch config sets it (env: assigned,
/// arg: passed, switch: present).
fn setting_at(text: &str, setting: &Setting) -> Option<usize> {
    let cmds = commands(text);
    match setting {
        Setting::Env(var) => env_occurrences(text, &cmds, var).last().map(|o| o.key_at),
        Setting::Arg(arg) => arg_occurrences(text, &cmds, arg).last().map(|o| o.key_at),
        Setting::Switch(sw) => switch_words(text, &cmds, sw).first().map(|w| w.span.start),
    }
}

/// The 1-based line where the launch config sets the setting (env: its last assignment,
/// arg: its last occurrence, switch: its first), if it does; for `bisect check`.
pub(crate) fn setting_line(text: &str, setting: &Setting) -> Option<usize> {
    setting_at(text, setting).map(|at| line_of(text, at))
}

/// Refuses a half-applied flag: one whose variable or argument appears in the launch
/// config of a role the flag does not list (that role would keep the old value).
/// `roles` holds (role name, launch config path, its text) for every role of the target.
pub(crate) fn check_partial(
    flag: &FlagSpec,
    roles: &[(String, std::path::PathBuf, String)],
) -> Result<(), LaunchError> {
    for (role, path, text) in roles {
        if flag.roles.iter().any(|r| r == role) {
            continue;
        }
        if let Some(at) = setting_at(text, &flag.setting) {
            let key = flag.setting.key();
            return Err(LaunchError::Partial {
                role: role.clone(),
                path: path.clone(),
                line: line_of(text, at),
                message: format!(
                    "{key} (flag {}) is set in the launch config of role {role:?}, which the flag does not list (roles: {}); editing only the listed roles would half-apply it",
                    flag.name,
                    flag.roles.join(", ")
                ),
                fix: format!(
                    "add {role:?} to roles in {}, remove {key} from {}, or pass --allow-partial",
                    flag.source.display(),
                    path.display()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlagCatalog;
    use std::path::PathBuf;

    fn flag(name: &str) -> FlagSpec {
        FlagCatalog::builtin().get(name).unwrap().clone()
    }

    fn read(text: &str, f: &FlagSpec) -> Option<String> {
        read_setting(text, &f.setting, f)
    }

    fn write(text: &str, f: &FlagSpec, v: &str) -> String {
        write_setting(text, f, v, Path::new("serve.sh")).unwrap()
    }

    #[test]
    fn env_read_table() {
        let f = flag("BF16_INDEX_K");
        let cases: &[(&str, Option<&str>)] = &[
            ("export SGLANG_DSV4_BF16_INDEX_K=1\n", Some("1")),
            ("SGLANG_DSV4_BF16_INDEX_K=0\n", Some("0")),
            ("export SGLANG_DSV4_BF16_INDEX_K='1'\n", Some("1")),
            (
                "export SGLANG_DSV4_BF16_INDEX_K=\"0\"  # fp8 keys\n",
                Some("0"),
            ),
            (
                "export SGLANG_DSV4_BF16_INDEX_K=1 # note\nexport SGLANG_DSV4_BF16_INDEX_K=0\n",
                Some("0"),
            ),
            ("# export SGLANG_DSV4_BF16_INDEX_K=1\n", None),
            ("echo SGLANG_DSV4_BF16_INDEX_K=1\n", None),
            ("export SGLANG_DSV4_BF16_INDEX_KX=1\n", None),
            (
                "SGLANG_DSV4_BF16_INDEX_K=1 exec python -m sglang.launch_server\n",
                Some("1"),
            ),
            ("export A=1 \\\n  SGLANG_DSV4_BF16_INDEX_K=0\r\n", Some("0")),
            ("export SGLANG_DSV4_BF16_INDEX_K=1\r\nexec x\r\n", Some("1")),
            (
                "if true; then export SGLANG_DSV4_BF16_INDEX_K=0; fi\n",
                Some("0"),
            ),
            ("export SGLANG_DSV4_BF16_INDEX_K=\n", Some("")),
            (
                "exec env SGLANG_DSV4_BF16_INDEX_K=0 python -m srv\n",
                Some("0"),
            ),
            (
                "env -u X SGLANG_DSV4_BF16_INDEX_K=1 python -m srv\n",
                Some("1"),
            ),
            ("exec python -m srv SGLANG_DSV4_BF16_INDEX_K=1\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(read(text, &f).as_deref(), *want, "{text:?}");
        }
    }

    #[test]
    fn env_write_table() {
        let f = flag("BF16_INDEX_K");
        let cases: &[(&str, &str, &str)] = &[
            (
                "export SGLANG_DSV4_BF16_INDEX_K=1\n",
                "0",
                "export SGLANG_DSV4_BF16_INDEX_K=0\n",
            ),
            (
                "export SGLANG_DSV4_BF16_INDEX_K='1'   # bf16 keys\n",
                "0",
                "export SGLANG_DSV4_BF16_INDEX_K='0'   # bf16 keys\n",
            ),
            (
                "SGLANG_DSV4_BF16_INDEX_K=\"1\"\r\nexec x\r\n",
                "0",
                "SGLANG_DSV4_BF16_INDEX_K=\"0\"\r\nexec x\r\n",
            ),
            (
                "export SGLANG_DSV4_BF16_INDEX_K=1\nexport SGLANG_DSV4_BF16_INDEX_K=1",
                "0",
                "export SGLANG_DSV4_BF16_INDEX_K=1\nexport SGLANG_DSV4_BF16_INDEX_K=0",
            ),
            // Absent: after the last variable-only line.
            (
                "#!/bin/sh\nexport A=1\nexport B=2 # b\n\nexec python -m srv --port 1\n",
                "0",
                "#!/bin/sh\nexport A=1\nexport B=2 # b\nexport SGLANG_DSV4_BF16_INDEX_K=0\n\nexec python -m srv --port 1\n",
            ),
            // Absent, no assignments: after the shebang and leading comments.
            (
                "#!/bin/bash\n# decode role\n\nset -e\nexec python -m srv\n",
                "1",
                "#!/bin/bash\n# decode role\nexport SGLANG_DSV4_BF16_INDEX_K=1\n\nset -e\nexec python -m srv\n",
            ),
            // Absent, CRLF file keeps CRLF.
            (
                "#!/bin/sh\r\nexport A=1\r\nexec srv\r\n",
                "1",
                "#!/bin/sh\r\nexport A=1\r\nexport SGLANG_DSV4_BF16_INDEX_K=1\r\nexec srv\r\n",
            ),
            // Absent, the only assignment shares the exec line: go before that line.
            (
                "export A=1; exec srv --x 1\n",
                "1",
                "export SGLANG_DSV4_BF16_INDEX_K=1\nexport A=1; exec srv --x 1\n",
            ),
            // Absent, no trailing newline at the end of a comment-only file.
            ("# empty", "0", "# empty\nexport SGLANG_DSV4_BF16_INDEX_K=0"),
            ("", "0", "export SGLANG_DSV4_BF16_INDEX_K=0\n"),
        ];
        for (text, value, want) in cases {
            let got = write(text, &f, value);
            assert_eq!(&got, want, "writing {value} into {text:?}");
            assert_eq!(read(&got, &f).as_deref(), Some(*value));
        }
    }

    #[test]
    fn arg_read_table() {
        let f = flag("CUDA_GRAPH_MAX_BS");
        let cases: &[(&str, Option<&str>)] = &[
            ("exec python -m srv --cuda-graph-max-bs 32\n", Some("32")),
            (
                "exec python -m srv --cuda-graph-max-bs=64 --tp 8\n",
                Some("64"),
            ),
            (
                "exec python -m srv \\\n  --cuda-graph-max-bs \\\n  48 \\\n  --tp 8\n",
                Some("48"),
            ),
            ("exec srv --cuda-graph-max-bs '16' # small\n", Some("16")),
            ("exec srv \"--cuda-graph-max-bs=8\"\n", Some("8")),
            ("# exec srv --cuda-graph-max-bs 32\nexec srv\n", None),
            ("echo \"--cuda-graph-max-bs 32\"\n", None),
            ("exec srv --cuda-graph-max-bs-extra 32\n", None),
            ("exec srv --cuda-graph-max-bs 32\r\n", Some("32")),
        ];
        for (text, want) in cases {
            assert_eq!(read(text, &f).as_deref(), *want, "{text:?}");
        }
    }

    #[test]
    fn arg_write_table() {
        let f = flag("CUDA_GRAPH_MAX_BS");
        let cases: &[(&str, &str, &str)] = &[
            (
                "exec srv --cuda-graph-max-bs 64 --tp 8\n",
                "32",
                "exec srv --cuda-graph-max-bs 32 --tp 8\n",
            ),
            (
                "exec srv --cuda-graph-max-bs=64\n",
                "32",
                "exec srv --cuda-graph-max-bs=32\n",
            ),
            (
                "exec srv --cuda-graph-max-bs \"64\"  # graphs\n",
                "32",
                "exec srv --cuda-graph-max-bs \"32\"  # graphs\n",
            ),
            (
                "exec srv '--cuda-graph-max-bs=64'\n",
                "32",
                "exec srv '--cuda-graph-max-bs=32'\n",
            ),
            // Absent: appended to the exec line, before a trailing comment.
            (
                "#!/bin/sh\nexport A=1\nexec python -m srv --tp 8  # decode\n",
                "32",
                "#!/bin/sh\nexport A=1\nexec python -m srv --tp 8 --cuda-graph-max-bs 32  # decode\n",
            ),
            // Absent: at the end of a backslash-continued command.
            (
                "exec python -m srv \\\n  --port 30002 \\\n  --tp 8\n\necho started\n",
                "64",
                "exec python -m srv \\\n  --port 30002 \\\n  --tp 8 --cuda-graph-max-bs 64\n\necho started\n",
            ),
            // Absent, no exec: the command with options, before its redirections.
            (
                "cd /srv\npython -m srv --tp 8 > log.txt 2>&1 &\nwait\n",
                "32",
                "cd /srv\npython -m srv --tp 8 --cuda-graph-max-bs 32 > log.txt 2>&1 &\nwait\n",
            ),
            (
                "exec srv --cuda-graph-max-bs 64\r\n",
                "32",
                "exec srv --cuda-graph-max-bs 32\r\n",
            ),
            ("exec srv", "32", "exec srv --cuda-graph-max-bs 32"),
        ];
        for (text, value, want) in cases {
            let got = write(text, &f, value);
            assert_eq!(&got, want, "writing {value} into {text:?}");
            assert_eq!(read(&got, &f).as_deref(), Some(*value));
        }
    }

    #[test]
    fn switch_read_and_write_table() {
        let f = flag("HICACHE");
        assert_eq!(
            read("exec srv --enable-hierarchical-cache\n", &f).as_deref(),
            Some("on")
        );
        assert_eq!(read("exec srv\n", &f).as_deref(), Some("off"));
        assert_eq!(
            read("# exec srv --enable-hierarchical-cache\nexec srv\n", &f).as_deref(),
            Some("off")
        );
        let cases: &[(&str, &str, &str)] = &[
            (
                "exec srv --port 1 --enable-hierarchical-cache --tp 8\n",
                "off",
                "exec srv --port 1 --tp 8\n",
            ),
            (
                "exec srv --port 1 --enable-hierarchical-cache\n",
                "off",
                "exec srv --port 1\n",
            ),
            (
                "exec srv \\\n  --enable-hierarchical-cache \\\n  --tp 8\n",
                "off",
                "exec srv \\\n  --tp 8\n",
            ),
            (
                "exec srv \\\n  --tp 8 \\\n  --enable-hierarchical-cache\r\necho x\r\n",
                "off",
                "exec srv \\\n  --tp 8\r\necho x\r\n",
            ),
            (
                "exec srv \\\n  --enable-hierarchical-cache --tp 8\n",
                "off",
                "exec srv \\\n  --tp 8\n",
            ),
            (
                "exec srv --tp 8 # x\n",
                "on",
                "exec srv --tp 8 --enable-hierarchical-cache # x\n",
            ),
            (
                "exec srv --enable-hierarchical-cache\n",
                "on",
                "exec srv --enable-hierarchical-cache\n",
            ),
            ("exec srv\n", "off", "exec srv\n"),
        ];
        for (text, value, want) in cases {
            let got = write(text, &f, value);
            assert_eq!(&got, want, "writing {value} into {text:?}");
            assert_eq!(read(&got, &f).as_deref(), Some(*value));
        }
        let err = write_setting("exec srv\n", &f, "1", Path::new("p.sh")).unwrap_err();
        assert!(matches!(err, LaunchError::BadValue { .. }), "{err}");
    }

    #[test]
    fn round_trips_are_byte_identical() {
        let script = "#!/bin/sh\r\n# prefill\r\nexport A='x'   # keep\r\nexec python -m srv \\\r\n  --port 30000 \\\r\n  --tp 8  # tail\r\n";
        for name in ["BF16_INDEX_K", "CUDA_GRAPH_MAX_BS", "HICACHE", "TOPK_V2"] {
            let f = flag(name);
            let on = write(script, &f, &f.on);
            assert_ne!(on, script, "{name}: writing on changes the text");
            let off = write(&on, &f, &f.off);
            assert_eq!(read(&off, &f).as_deref(), Some(f.off.as_str()), "{name}");
            let on_again = write(&off, &f, &f.on);
            assert_eq!(on_again, on, "{name}: on -> off -> on is stable");
            // Only the setting's own bytes differ between the two arms.
            let common = on.len().min(off.len());
            let prefix = on
                .bytes()
                .zip(off.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            let suffix = on
                .bytes()
                .rev()
                .zip(off.bytes().rev())
                .take_while(|(a, b)| a == b)
                .count();
            assert!(
                prefix + suffix + 30 >= common,
                "{name}: edit is local\n{on:?}\n{off:?}"
            );
        }
        let f = flag("HICACHE");
        let on = write(script, &f, "on");
        assert_eq!(write(&on, &f, "off"), script);
    }

    #[test]
    fn no_place_to_add_an_argument_is_an_error_with_file_and_line() {
        let f = flag("CUDA_GRAPH_MAX_BS");
        let text = "#!/bin/sh\nexport A=1\nset -e\n";
        let err = write_setting(text, &f, "32", Path::new("conf/decode.sh")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, LaunchError::NoPlace { .. }));
        assert!(msg.starts_with("conf/decode.sh:3:"), "{msg}");
        assert!(msg.contains("fix:"), "{msg}");
        let h = flag("HICACHE");
        assert!(write_setting(text, &h, "on", Path::new("p.sh")).is_err());
        // Removing an absent switch needs no place.
        assert_eq!(
            write_setting(text, &h, "off", Path::new("p.sh")).unwrap(),
            text
        );
    }

    #[test]
    fn values_with_shell_metacharacters_are_refused() {
        let f = flag("BF16_INDEX_K");
        for bad in ["1; reboot", "$(id)", "`id`", "1 2", "'1'", "a\nb"] {
            let err = write_setting("export X=1\n", &f, bad, Path::new("p.sh")).unwrap_err();
            assert!(matches!(err, LaunchError::BadValue { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn partial_flag_is_refused_naming_role_file_and_line() {
        let hicache = flag("HICACHE");
        let prefill = (
            "prefill".to_string(),
            PathBuf::from("p.sh"),
            "exec srv --enable-hierarchical-cache\n".to_string(),
        );
        let decode_clean = (
            "decode".to_string(),
            PathBuf::from("d.sh"),
            "#!/bin/sh\nexec srv --tp 8\n".to_string(),
        );
        assert!(check_partial(&hicache, &[prefill.clone(), decode_clean.clone()]).is_ok());

        let decode_dirty = (
            "decode".to_string(),
            PathBuf::from("d.sh"),
            "#!/bin/sh\nexec srv \\\n  --enable-hierarchical-cache\n".to_string(),
        );
        let err = check_partial(&hicache, &[prefill.clone(), decode_dirty]).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, LaunchError::Partial { role, line: 3, .. } if role == "decode"),
            "{msg}"
        );
        assert!(msg.starts_with("d.sh:3:"), "{msg}");
        assert!(msg.contains("--allow-partial"), "{msg}");

        let sync = flag("INDEX_K_HICACHE_SYNC");
        let decode_env = (
            "decode".to_string(),
            PathBuf::from("d.sh"),
            "# SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1 is prefill-only\nexport SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1\n".to_string(),
        );
        let err = check_partial(&sync, &[prefill, decode_env]).unwrap_err();
        assert!(err.to_string().starts_with("d.sh:2:"), "{err}");
        let commented = (
            "decode".to_string(),
            PathBuf::from("d.sh"),
            "# export SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1\n".to_string(),
        );
        assert!(check_partial(&sync, &[commented]).is_ok());
    }

    #[test]
    fn every_shipped_flag_round_trips_on_the_embedded_launch_scripts() {
        let exe = "'/opt/my tools/bisect'";
        let scripts = [
            (
                "prefill".to_string(),
                PathBuf::from("prefill.sh"),
                crate::config::embedded::prefill_script(exe, 30000),
            ),
            (
                "decode".to_string(),
                PathBuf::from("decode.sh"),
                crate::config::embedded::decode_script(exe, 30002, 30000),
            ),
        ];
        for f in FlagCatalog::builtin().flags {
            check_partial(&f, &scripts).unwrap_or_else(|e| panic!("{}: {e}", f.name));
            for (role, path, text) in &scripts {
                if !f.roles.contains(role) {
                    continue;
                }
                assert_eq!(
                    read(text, &f).as_deref(),
                    Some(f.on.as_str()),
                    "{} default in {role}",
                    f.name
                );
                let off = write_setting(text, &f, &f.off, path).unwrap();
                assert_eq!(
                    read(&off, &f).as_deref(),
                    Some(f.off.as_str()),
                    "{} in {role}",
                    f.name
                );
                assert!(
                    off.starts_with("#!/bin/sh\n")
                        && off.contains("exec '/opt/my tools/bisect' engine")
                );
                assert_eq!(
                    write_setting(&off, &f, &f.on, path).unwrap(),
                    *text,
                    "{} in {role}",
                    f.name
                );
            }
        }
    }
}
