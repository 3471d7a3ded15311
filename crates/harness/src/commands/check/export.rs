//! `bisect check`'s terminal rendering (`--json` prints the [`CheckReport`] itself):
//! the roles, each flag's edits as -/+ lines, the flags that do not apply, the URLs,
//! notes, then every problem with its fix.

use std::fmt::Write;

use super::CheckReport;
use crate::results::Exporter;

/// The report as the terminal shows it.
pub struct CheckTable;

impl Exporter<CheckReport> for CheckTable {
    fn file_name(&self) -> &'static str {
        "table"
    }
    fn render(&self, r: &CheckReport) -> anyhow::Result<String> {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "target {} ({}), engine {}, {} role(s)",
            r.name,
            r.profile,
            r.engine,
            r.roles.len()
        );
        roles(&mut out, r);
        flags(&mut out, r);
        not_applying(&mut out, r);
        urls(&mut out, r);
        notes_and_problems(&mut out, r);
        Ok(out)
    }
}

/// One line per role: launch, restart, health, metrics, effective config.
fn roles(out: &mut String, r: &CheckReport) {
    for info in &r.roles {
        let role = &info.recorded;
        let restart = match &role.restart {
            Some(cmd) => format!("restart `{cmd}`"),
            None => "spawned by bisect (sh LAUNCH)".into(),
        };
        let metrics = match (&role.metrics, &role.running_metric, &info.queued_metric) {
            (Some(url), Some(running), Some(queued)) => format!("{url} ({running} / {queued})"),
            (Some(url), ..) => url.clone(),
            (None, ..) => "none".into(),
        };
        let _ = writeln!(
            out,
            "  {}: launch {}, {restart}, health {}, metrics {metrics}, effective config {}",
            role.name,
            role.launch,
            role.health,
            role.effective_url.as_deref().unwrap_or("none")
        );
    }
}

/// Each applying flag, its launch-config edits per role and arm as -/+ lines.
fn flags(out: &mut String, r: &CheckReport) {
    let _ = writeln!(out, "\nflags applying ({}):", r.flags.len());
    for f in &r.flags {
        let _ = writeln!(
            out,
            "  {} ({} {}, roles {}, on={} off={}){}",
            f.name,
            f.kind,
            f.key,
            f.roles.join(","),
            f.on,
            f.off,
            if f.missing_roles.is_empty() {
                String::new()
            } else {
                format!(" PARTIAL: the target has no {}", f.missing_roles.join(","))
            }
        );
        for line in &f.mechanism {
            let _ = writeln!(out, "    {line}");
        }
        for e in &f.edits {
            let now = match (&e.current, e.line) {
                (Some(v), Some(l)) => format!("now {v} (line {l})"),
                (Some(v), None) => format!("now {v} (not set)"),
                (None, _) => "not set".into(),
            };
            let _ = writeln!(out, "    {} {}: {now}", e.role, e.launch);
            for a in &e.arms {
                let head = format!("      {:<3} = {}:", a.arm, a.value);
                match a.change.as_str() {
                    "refused" => {
                        let _ = writeln!(
                            out,
                            "{head} REFUSED: {}",
                            a.error
                                .as_ref()
                                .map_or(String::new(), |e| e.to_string())
                                .replace('\n', " ")
                        );
                    }
                    "unchanged" => {
                        let shown = a
                            .before
                            .first()
                            .map(|l| format!(" line {}: {}", a.line, l.trim()));
                        let _ = writeln!(out, "{head} unchanged{}", shown.unwrap_or_default());
                    }
                    change => {
                        let _ = writeln!(out, "{head} {change} at line {}", a.line);
                        for l in &a.before {
                            let _ = writeln!(out, "          - {l}");
                        }
                        for l in &a.after {
                            let _ = writeln!(out, "          + {l}");
                        }
                    }
                }
            }
        }
    }
}

/// The flags whose roles the target lacks.
fn not_applying(out: &mut String, r: &CheckReport) {
    if !r.not_applying.is_empty() {
        let _ = writeln!(
            out,
            "\nnot applying (the target has none of their roles): {}",
            r.not_applying
                .iter()
                .map(|f| format!("{} (roles {})", f.name, f.roles.join(",")))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// Every URL checked, or that none was (`--offline`).
fn urls(out: &mut String, r: &CheckReport) {
    if r.offline {
        let _ = writeln!(out, "\nurls: not checked (--offline)");
    } else {
        let _ = writeln!(out, "\nurls:");
        for u in &r.urls {
            let _ = writeln!(
                out,
                "  {:<4} {} {:<9} {}  {}",
                if u.ok { "ok" } else { "FAIL" },
                u.role,
                u.kind,
                u.url,
                u.detail
            );
        }
    }
}

/// Notes, then every problem with its fix (or that all passed).
fn notes_and_problems(out: &mut String, r: &CheckReport) {
    if !r.notes.is_empty() {
        let _ = writeln!(out, "\nnotes:");
        for n in &r.notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    if r.problems.is_empty() {
        let _ = writeln!(out, "\ncheck: ok, every check passed");
    } else {
        let _ = writeln!(out, "\nproblems ({}):", r.problems.len());
        for (i, p) in r.problems.iter().enumerate() {
            let _ = writeln!(out, "  {}. {}: {}", i + 1, p.subject, p.message);
            let _ = writeln!(out, "     fix: {}", p.fix);
        }
        let _ = writeln!(out, "check: {} problem(s)", r.problems.len());
    }
}
