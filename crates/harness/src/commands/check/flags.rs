//! The dry run of `bisect check` (docs/design.md 3.13): every catalog flag written into
//! every launch config it covers, in memory, with the real editor and read-back; nothing
//! is written.

use std::path::Path;

use super::{role_names, ArmEdit, FlagCheck, Problem, RoleEdit};
use crate::config::{line_of, Coverage, FlagSpec, TargetProfile};
use crate::launch::{check_partial, read_setting, setting_line, write_setting};

pub(super) fn check_flag(
    flag: &FlagSpec,
    coverage: Coverage,
    target: &TargetProfile,
    texts: &[(String, std::path::PathBuf, String)],
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) -> FlagCheck {
    let subject = format!("flag {}", flag.name);
    let missing_roles = match &coverage {
        Coverage::Partial { missing } => missing.clone(),
        _ => Vec::new(),
    };
    check_coverage(flag, &missing_roles, target, texts, &subject, problems);
    let edits = role_edits(flag, texts, &subject, problems);
    check_key_found(flag, &edits, &subject, problems, notes);

    FlagCheck {
        name: flag.name.clone(),
        kind: flag.setting.kind().into(),
        key: flag.setting.key().into(),
        on: flag.on.clone(),
        off: flag.off.clone(),
        roles: flag.roles.clone(),
        coverage: if missing_roles.is_empty() {
            "full".into()
        } else {
            "partial".into()
        },
        missing_roles,
        source: flag.source.display().to_string(),
        edits,
        mechanism: Vec::new(),
    }
}

/// The flag's reach: roles it lists that the target lacks, and launch configs where
/// only part of it could be applied.
fn check_coverage(
    flag: &FlagSpec,
    missing_roles: &[String],
    target: &TargetProfile,
    texts: &[(String, std::path::PathBuf, String)],
    subject: &str,
    problems: &mut Vec<Problem>,
) {
    if !missing_roles.is_empty() {
        problems.push(Problem {
            subject: subject.to_string(),
            message: format!(
                "applies partially: it lists roles {} but the target has no role {} (its roles: {}); `bisect flags --target` lists it as not applying, and a run would flip it only where the target has the role",
                flag.roles.join(", "),
                missing_roles.join(", "),
                role_names(target)
            ),
            fix: format!(
                "add the missing role(s) to the profile, or list only the target's roles in {} (for a built-in flag, a copy in the profile's flags_dir)",
                flag.source.display()
            ),
        });
    }
    if let Err(e) = check_partial(flag, texts) {
        problems.push(Problem::of(subject.to_string(), e.problem()));
    }
}

/// Both arms' dry-run edits in every launch config of a role the flag lists; each
/// refused edit is also a problem.
fn role_edits(
    flag: &FlagSpec,
    texts: &[(String, std::path::PathBuf, String)],
    subject: &str,
    problems: &mut Vec<Problem>,
) -> Vec<RoleEdit> {
    let mut edits = Vec::new();
    for (role, path, text) in texts {
        if !flag.roles.iter().any(|r| r == role) {
            continue;
        }
        let current = read_setting(text, &flag.setting, flag);
        let line = setting_line(text, &flag.setting);
        let mut arms = Vec::new();
        for (arm, value) in [("on", &flag.on), ("off", &flag.off)] {
            let edit = dry_run(flag, path, text, arm, value);
            if let Some(error) = &edit.error {
                problems.push(Problem::of(
                    format!("{subject} ({arm}, role {role})"),
                    error.clone(),
                ));
            }
            arms.push(edit);
        }
        edits.push(RoleEdit {
            role: role.clone(),
            launch: path.display().to_string(),
            current,
            line,
            arms,
        });
    }
    edits
}

/// A key found in none of the launch configs is most often a misspelt name: bisect
/// would add it, the read-back would agree, and an engine that does not know the
/// name would run unchanged. A switch's absence is its `off` value, so only a note.
fn check_key_found(
    flag: &FlagSpec,
    edits: &[RoleEdit],
    subject: &str,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    if edits.is_empty() || edits.iter().any(|e| e.line.is_some()) {
        return;
    }
    let files: Vec<&str> = edits.iter().map(|e| e.launch.as_str()).collect();
    let key = flag.setting.key();
    if matches!(flag.setting, crate::config::Setting::Switch(_)) {
        notes.push(format!(
            "flag {}: switch {key} is absent from {} (reads as {}); the on arm adds it to the launch command",
            flag.name,
            files.join(", "),
            flag.off
        ));
    } else {
        problems.push(Problem {
            subject: subject.to_string(),
            message: format!(
                "{key} matches no line of {}: a run would add it, and an engine that does not know that name would run unchanged while the read-back agrees",
                files.join(", ")
            ),
            fix: format!(
                "check the spelling of {key} in {} against the engine's documentation, and set it explicitly in each role's launch config (the off arm's value, {}, if that is how the engine runs today) so an edit replaces a line the engine reads",
                flag.source.display(),
                flag.off
            ),
        });
    }
}

/// One arm's edit computed with the real editor on the text in memory, then read back
/// the way a run reads back the file it wrote.
pub(super) fn dry_run(flag: &FlagSpec, path: &Path, text: &str, arm: &str, value: &str) -> ArmEdit {
    let refused = |error: crate::exit::Problem| ArmEdit {
        arm: arm.into(),
        value: value.into(),
        change: "refused".into(),
        line: 0,
        before: Vec::new(),
        after: Vec::new(),
        error: Some(error),
    };
    let edited = match write_setting(text, flag, value, path) {
        Ok(edited) => edited,
        Err(e) => return refused(e.problem()),
    };
    let found = read_setting(&edited, &flag.setting, flag);
    if found.as_deref() != Some(value) {
        let key = flag.setting.key();
        return refused(crate::exit::Problem::new(
            format!(
                "{}: after writing {key}={value}, reading it back gives {}",
                path.display(),
                found.map(|f| format!("{f:?}")).unwrap_or_else(|| "nothing".into())
            ),
            format!(
                "check the launch config for a later or conditional setting of {key} that bisect cannot see, or set it by hand once"
            ),
        ));
    }
    let (line, before, after) = changed_lines(text, &edited);
    let change = match (before.is_empty(), after.is_empty()) {
        _ if edited == text => "unchanged",
        (true, false) => "insert",
        (false, true) => "remove",
        _ => "replace",
    };
    let (line, before, after) = if edited == text {
        // Nothing changes: show the line that already says so, where there is one.
        match setting_line(text, &flag.setting) {
            Some(l) => {
                let shown: Vec<String> = text
                    .lines()
                    .nth(l - 1)
                    .map(str::to_string)
                    .into_iter()
                    .collect();
                (l, shown.clone(), shown)
            }
            None => (0, Vec::new(), Vec::new()),
        }
    } else {
        (line, before, after)
    };
    ArmEdit {
        arm: arm.into(),
        value: value.into(),
        change: change.into(),
        line,
        before,
        after,
        error: None,
    }
}

/// The whole lines that differ between `old` and `new`: (first line number in `old`,
/// its lines, the lines replacing them). An insertion has no `old` lines; its number
/// is the line the new ones go before.
pub(crate) fn changed_lines(old: &str, new: &str) -> (usize, Vec<String>, Vec<String>) {
    let (a, b) = (old.as_bytes(), new.as_bytes());
    let mut prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    while !old.is_char_boundary(prefix) {
        prefix -= 1;
    }
    let room = a.len().min(b.len()) - prefix;
    let mut suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(room)
        .take_while(|(x, y)| x == y)
        .count();
    while !old.is_char_boundary(a.len() - suffix) || !new.is_char_boundary(b.len() - suffix) {
        suffix -= 1;
    }
    let start = old[..prefix].rfind('\n').map_or(0, |p| p + 1);
    let span_end = |text: &str, end: usize| {
        if end <= start || text.as_bytes()[end - 1] == b'\n' {
            end.max(start)
        } else {
            text[end..].find('\n').map_or(text.len(), |p| end + p + 1)
        }
    };
    let old_end = span_end(old, a.len() - suffix);
    let new_end = span_end(new, b.len() - suffix);
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.trim_end_matches('\r').to_string())
            .collect()
    };
    let (mut before, mut after) = (lines(&old[start..old_end]), lines(&new[start..new_end]));
    // Byte-level matching can start or end inside a line the edit left alone (a new
    // `export` line before `exec` shares its first letters): drop such whole lines.
    let mut line = line_of(old, start);
    while !before.is_empty() && !after.is_empty() && before[0] == after[0] {
        before.remove(0);
        after.remove(0);
        line += 1;
    }
    while !before.is_empty() && !after.is_empty() && before.last() == after.last() {
        before.pop();
        after.pop();
    }
    (line, before, after)
}
