//! Exit codes of docs/design.md 3.1, mapped in one place.
//!
//! 0 finished (whatever the verdict), 2 bad usage or bad input file, 3 the experiment
//! could not run, 130 interrupted. `bisect probe` adds 1 (corrupted), 125 (could not tell)
//! and 255 (another bisect holds the target: `git bisect run` aborts);
//! `bisect matrix`/`merge` add 1 (a cell regressed); `bisect check` adds 1 (a check failed).
//!
//! A leaf: it knows no other module. Which error types are bad input is decided where
//! every layer is known, in [`crate::commands::code_for_error`].

use thiserror::Error;

pub const OK: u8 = 0;
pub const BAD_INPUT: u8 = 2;
pub const COULD_NOT_RUN: u8 = 3;
pub const INTERRUPTED: u8 = 130;
pub(crate) const PROBE_CORRUPTED: u8 = 1;
pub const PROBE_UNKNOWN: u8 = 125;
/// `bisect probe` while another bisect holds the target's launch configs: outside 0-127,
/// so `git bisect run` stops. A skip (125) would only move it on to the next commit,
/// which meets the same refusal, until every commit is skipped.
pub const PROBE_ABORT: u8 = 255;
/// `bisect matrix` / `bisect merge`: at least one cell regressed against the baseline.
pub const REGRESSION: u8 = 1;
/// `bisect check`: the profile loaded, but at least one check found a problem (each
/// printed with its fix). A profile that does not load is bad input (2) as everywhere.
pub const CHECK_FAILED: u8 = 1;

/// `bisect commits`: no culprit (the ends do not differ, or the bad end does not
/// reproduce at this load). A culprit found and verified is 0; an inconclusive search (or a
/// culprit whose verification failed) is 3, as the issue that asked for it says.
pub(crate) const COMMITS_NO_CULPRIT: u8 = 1;

/// Errors whose kind decides the exit code. Anything else that reaches `main` is a
/// could-not-run failure (3).
#[derive(Debug, Error)]
pub enum Failure {
    /// Bad usage or a bad input file; the message names the file, line and fix.
    #[error("{0}")]
    BadInput(Problem),
    /// The experiment could not run (engine never healthy, restart failed, ...).
    #[error("{0}")]
    CouldNotRun(Problem),
    /// Ctrl-C / SIGTERM.
    #[error("interrupted")]
    Interrupted,
    /// Another bisect holds the target's launch configs: nothing about this build, so
    /// `bisect probe` aborts `git bisect run` instead of skipping the commit.
    #[error("{0}")]
    Busy(Problem),
}

/// What went wrong and, where the user can do something, what to do: the fix kept as a
/// field (as `ConfigError::Usage` keeps it), printed under the message as
/// `\n  fix: ...`, the one place that layout is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub message: String,
    pub fix: Option<String>,
}

/// How a fix is set under its message when printed.
const FIX_LINE: &str = "\n  fix: ";

impl Problem {
    pub fn new(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Problem {
            message: message.into(),
            fix: Some(fix.into()),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        match &self.fix {
            Some(fix) => write!(f, "{FIX_LINE}{fix}"),
            None => Ok(()),
        }
    }
}

/// A message as written, with its fix (after the last `\n  fix: `) taken out into the
/// field: the text prints the same, and the fix is readable on its own.
impl From<String> for Problem {
    fn from(text: String) -> Self {
        match text.rsplit_once(FIX_LINE) {
            Some((message, fix)) => Problem::new(message, fix),
            None => Problem {
                message: text,
                fix: None,
            },
        }
    }
}

impl From<&str> for Problem {
    fn from(text: &str) -> Self {
        Problem::from(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_fix_becomes_the_field_and_prints_the_same() {
        let text = "block 3: FLAG reads back as 1, not 0\n  fix: check the catalog entry";
        let p = Problem::from(text);
        assert_eq!(p.message, "block 3: FLAG reads back as 1, not 0");
        assert_eq!(p.fix.as_deref(), Some("check the catalog entry"));
        assert_eq!(p.to_string(), text);
        assert_eq!(Failure::BadInput(p).to_string(), text);
    }

    #[test]
    fn a_message_without_a_fix_has_none() {
        let p = Problem::from("engine never healthy".to_string());
        assert_eq!((p.message.as_str(), p.fix), ("engine never healthy", None));
        let q = Problem::new("no workload name", "pass --workload NAME");
        assert_eq!(
            q.to_string(),
            "no workload name\n  fix: pass --workload NAME"
        );
    }
}
