//! The flag catalog (DESIGN.md 3.3): `flags/NAME.toml` plus any `--flags-dir`.

use std::path::PathBuf;

/// Where a flag lives in a launch config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `export VAR=VALUE` / `VAR=VALUE` lines.
    Env(String),
    /// `--arg VALUE` in the launch command.
    Arg(String),
    /// `--switch` present (on) / absent (off).
    Switch(String),
}

impl Setting {
    pub fn kind(&self) -> &'static str {
        match self {
            Setting::Env(_) => "env",
            Setting::Arg(_) => "arg",
            Setting::Switch(_) => "switch",
        }
    }
    pub fn key(&self) -> &str {
        match self {
            Setting::Env(k) | Setting::Arg(k) | Setting::Switch(k) => k,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FlagSpec {
    pub name: String,
    pub doc: String,
    pub setting: Setting,
    pub roles: Vec<String>,
    pub on: String,
    pub off: String,
    pub source: PathBuf,
}

/// All known flags, by catalog name (later directories override earlier ones).
#[derive(Debug, Clone, Default)]
pub struct FlagCatalog {
    pub flags: Vec<FlagSpec>,
}
