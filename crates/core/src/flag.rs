//! A flag as plain values (docs/design.md 3.3): where it lives in a launch config (env,
//! arg or switch), which roles carry it, and its on/off values. `config::flags` reads
//! and checks the catalog files; the core and the launch editor read these.

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
    /// What shows the path the flag controls ran (its file's `[mechanism]`), if it says.
    pub mechanism: Option<crate::mechanism::Mechanism>,
}

/// A flag held at one value: a `--set NAME=VALUE` pin, a matrix cell's setting, a load
/// level's arm value. Written into its roles' launch configs with the rest of a block's
/// values, read back, and checked against what the engines report.
#[derive(Debug, Clone, PartialEq)]
pub struct Pin {
    pub flag: FlagSpec,
    pub value: String,
}

impl Pin {
    pub fn new(flag: FlagSpec, value: impl Into<String>) -> Pin {
        Pin {
            flag,
            value: value.into(),
        }
    }

    /// `NAME=VALUE`, as records and step logs name a pin.
    pub fn words(&self) -> String {
        format!("{}={}", self.flag.name, self.value)
    }
}

impl FlagSpec {
    /// The value an arm labelled `on` or `off` writes.
    pub fn value_for(&self, on: bool) -> &str {
        if on {
            &self.on
        } else {
            &self.off
        }
    }

    /// What a block at `value` on an engine of preset `engine` records of this flag's
    /// mechanism before its witnesses count (core::mechanism).
    pub fn mechanism_record(&self, value: &str, engine: &str) -> crate::mechanism::MechanismRecord {
        crate::mechanism::MechanismRecord::of(
            (&self.name, &self.source.display().to_string()),
            self.mechanism.as_ref(),
            (&self.on, &self.off),
            value,
            engine,
        )
    }

    /// The `flag` object of run.json (docs/design.md 3.6): name, env|arg|switch, roles, on, off.
    pub fn to_json(&self) -> serde_json::Value {
        let mut obj = serde_json::Map::new();
        obj.insert("name".into(), self.name.clone().into());
        obj.insert(self.setting.kind().into(), self.setting.key().into());
        obj.insert("roles".into(), self.roles.clone().into());
        obj.insert("on".into(), self.on.clone().into());
        obj.insert("off".into(), self.off.clone().into());
        serde_json::Value::Object(obj)
    }
}
