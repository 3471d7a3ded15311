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

/// A problem in a record (`bisect check`'s refused edits) is the text it prints.
impl serde::Serialize for Problem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How a fix is set under its message when printed.
const FIX_LINE: &str = "\n  fix: ";

impl Problem {
    /// A message with what to do about it.
    pub fn new(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Problem {
            message: message.into(),
            fix: Some(fix.into()),
        }
    }

    /// A message with no fix to offer (the text is kept as given, never searched for one).
    pub fn message_only(message: impl Into<String>) -> Self {
        Problem {
            message: message.into(),
            fix: None,
        }
    }
}

impl Failure {
    /// [`Failure::BadInput`] with its fix.
    pub fn bad_input(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Failure::BadInput(Problem::new(message, fix))
    }

    /// [`Failure::CouldNotRun`] with its fix.
    pub(crate) fn could_not_run(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Failure::CouldNotRun(Problem::new(message, fix))
    }

    /// [`Failure::Busy`] with its fix.
    pub fn busy(message: impl Into<String>, fix: impl Into<String>) -> Self {
        Failure::Busy(Problem::new(message, fix))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_is_a_field_and_prints_under_the_message() {
        let text = "block 3: FLAG reads back as 1, not 0\n  fix: check the catalog entry";
        let p = Problem::new(
            "block 3: FLAG reads back as 1, not 0",
            "check the catalog entry",
        );
        assert_eq!(p.message, "block 3: FLAG reads back as 1, not 0");
        assert_eq!(p.fix.as_deref(), Some("check the catalog entry"));
        assert_eq!(p.to_string(), text);
        assert_eq!(Failure::BadInput(p.clone()).to_string(), text);
        let bad = Failure::bad_input(
            "block 3: FLAG reads back as 1, not 0",
            "check the catalog entry",
        );
        assert!(matches!(&bad, Failure::BadInput(q) if *q == p));
        assert_eq!(bad.to_string(), text);
        let cannot = Failure::could_not_run("engine never healthy", "read its log");
        assert!(
            matches!(&cannot, Failure::CouldNotRun(q) if q.fix.as_deref() == Some("read its log"))
        );
        assert_eq!(
            cannot.to_string(),
            "engine never healthy\n  fix: read its log"
        );
        let busy = Failure::busy("configs held by pid 7", "wait for it");
        assert!(matches!(&busy, Failure::Busy(q) if q.message == "configs held by pid 7"));
        assert_eq!(
            busy.to_string(),
            "configs held by pid 7\n  fix: wait for it"
        );
    }

    #[test]
    fn a_message_without_a_fix_has_none_and_is_never_searched_for_one() {
        let p = Problem::message_only("engine never healthy");
        assert_eq!((p.message.as_str(), p.fix), ("engine never healthy", None));
        // A message that happens to hold the fix layout (an error's text passed on) stays
        // one message: nothing reads a fix back out of a string.
        let written = "reading x\n  fix: pass y";
        let q = Problem::message_only(written);
        assert_eq!((q.message.as_str(), &q.fix), (written, &None));
        assert_eq!(q.to_string(), written);
        let r = Problem::new("no workload name", "pass --workload NAME");
        assert_eq!(
            r.to_string(),
            "no workload name\n  fix: pass --workload NAME"
        );
    }
}
