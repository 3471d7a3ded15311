//! Validated configuration the core runs on: target profiles (DESIGN.md 3.2), the flag
//! catalog (3.3) and workload files (3.4). Loading turns TOML into these structs and
//! reports every problem as a [`ConfigError`] naming the file, line and fix.
//!
//! The types below are the contract other modules code against; the loaders live in
//! the submodules.

pub mod flags;
pub mod target;
pub mod workload;

use std::path::PathBuf;
use thiserror::Error;

pub use flags::{FlagCatalog, FlagSpec, Setting};
pub use target::{RoleSpec, TargetProfile};
pub use workload::{CheckArgs, TaskSpec, ToolSpec, Workload};

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
