//! Validated configuration the core runs on: target profiles (docs/design.md 3.2), the flag
//! catalog (3.3) and workload files (3.4). Loading turns TOML into these structs and
//! reports every problem as a [`ConfigError`] naming the file, line and fix.
//!
//! The types below are the contract other modules code against; the loaders live in
//! the submodules. Line numbers come from the spans the `toml` parser keeps
//! (`toml::de::Error::span`, `toml::Spanned`), so a message points at the exact key.

pub mod embedded;
pub mod engine;
pub mod flags;
mod mechanism;
#[cfg(test)]
mod proptests;
pub mod target;
pub mod workload;

use std::ops::Range;
use std::path::{Path, PathBuf};
use thiserror::Error;
use toml::Spanned;

pub use engine::Engine;
pub use flags::{validate_value, Coverage, FlagCatalog, FlagSpec, Pin, Setting};
pub use target::{ReplicaSet, RoleSpec, TargetProfile, FIRST_REPLICA};
#[cfg(test)]
pub(crate) use workload::builtin_workload;
pub use workload::{load_workload, CheckArgs, TaskSpec, ToolSpec, Workload};

/// A bad input file or value. `Display` is the full user-facing message: it names the
/// file (and line where known) and says how to fix it.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}\n  fix: {fix}")]
    Invalid {
        path: PathBuf,
        line: usize,
        message: String,
        fix: String,
    },
    #[error("unknown flag `{name}`; known flags: {known}\n  fix: use one of the known names, or add flags/{name}.toml (or --flags-dir DIR)")]
    UnknownFlag { name: String, known: String },
    #[error("unknown workload `{name}`; known workloads: {known}\n  fix: use one of them or pass a path to a workload TOML file")]
    UnknownWorkload { name: String, known: String },
    #[error("{message}\n  fix: {fix}")]
    Usage { message: String, fix: String },
}

#[cfg(test)]
impl ConfigError {
    /// The line and `message | fix` of an [`ConfigError::Invalid`], for tests that check
    /// where and what a file error says; panics on any other error.
    pub(crate) fn line_and_text(self) -> (usize, String) {
        match self {
            ConfigError::Invalid {
                line, message, fix, ..
            } => (line, format!("{message} | {fix}")),
            other => panic!("expected Invalid, got {other}"),
        }
    }
}

/// 1-based line number of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A source file being validated: its path (for messages) and text (for line numbers).
pub(crate) struct Source<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

impl Source<'_> {
    /// An [`ConfigError::Invalid`] at the line where `span` starts.
    pub fn invalid(
        &self,
        span: Range<usize>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: line_of(self.text, span.start),
            message: message.into(),
            fix: fix.into(),
        }
    }

    /// A whole-number key of at least `min` that fits a `u32`.
    pub(crate) fn whole_number(
        &self,
        key: &str,
        v: &Spanned<i64>,
        min: i64,
    ) -> Result<u32, ConfigError> {
        let n = *v.get_ref();
        if n < min || n > u32::MAX as i64 {
            return Err(self.invalid(
                v.span(),
                format!("{key} = {n} is out of range (must be at least {min})"),
                format!("set {key} to a whole number >= {min}"),
            ));
        }
        Ok(n as u32)
    }

    /// Parses the whole file, turning a TOML syntax or shape error into
    /// [`ConfigError::Invalid`] at the line the parser points to.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, fix: &str) -> Result<T, ConfigError> {
        toml::from_str(self.text).map_err(|err| {
            let span = err.span().unwrap_or(0..0);
            // `message()` is the parser's message without its source excerpt: the
            // excerpt would repeat what file:line already points to.
            let message = err.message().trim().to_string();
            self.invalid(span, message, fix)
        })
    }
}

/// Reads a config file, mapping I/O failure to [`ConfigError::Read`].
pub(crate) fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_of_counts_newlines_before_offset() {
        let text = "a = 1\nb = 2\r\nc = 3";
        assert_eq!(line_of(text, 0), 1);
        assert_eq!(line_of(text, 6), 2);
        assert_eq!(line_of(text, 13), 3);
        assert_eq!(line_of(text, 999), 3);
    }
}
