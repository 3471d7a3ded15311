//! Whether an engine's output can depend on what else is in its batch, as the engines
//! say it (issue 32, docs/oracle.md "Deterministic modes"): read back from each role,
//! never assumed from a launch flag. SGLang reports `enable_deterministic_inference` in
//! its server info (`--enable-deterministic-inference`); vLLM reports nothing over HTTP,
//! so its `VLLM_BATCH_INVARIANT` is read from the environment of the process listening
//! on the role's port (vllm/envs.py parses it as `bool(int(value))`); llama.cpp has no
//! such mode (its server README: logits are not bit-identical across batch sizes); the
//! embedded engine is batch-invariant by construction. The solo oracle compares exactly
//! (every parting diverges) only when every role is batch-invariant. Pure: the reading
//! of documents and environments is the harness's, what they say is decided here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// SGLang's server-argument name for its deterministic mode.
pub(crate) const SGLANG_KEY: &str = "enable_deterministic_inference";
/// vLLM's environment variable for its batch-invariant mode.
pub(crate) const VLLM_VAR: &str = "VLLM_BATCH_INVARIANT";

/// Where an engine kind keeps its deterministic mode, for the harness to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSource {
    /// Batch-invariant whatever the launch (the embedded engine).
    ByConstruction,
    /// [`SGLANG_KEY`] in the role's self-report (SGLang, and a profile without a preset,
    /// whose self-report bisect reads SGLang's way).
    ServerInfo,
    /// [`VLLM_VAR`] in the environment of the process serving the role (vLLM).
    ProcessEnvironment,
    /// The engine has no batch-invariant mode (llama.cpp).
    NoMode,
}

/// What one role said, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Reading {
    ByConstruction,
    /// The self-report's [`SGLANG_KEY`].
    ServerInfo {
        on: bool,
    },
    /// [`VLLM_VAR`] in the environment of process `pid` (absent: off, vLLM's default).
    Environment {
        on: bool,
        pid: u32,
    },
    /// The engine has no such mode.
    NoMode,
    /// Nothing said it: no self-report or no such key in it, or no process of this host
    /// serves the role (a remote engine's environment is not readable from here).
    NotReported,
}

impl Reading {
    /// The value read, where one was.
    pub fn on(&self) -> Option<bool> {
        match self {
            Reading::ByConstruction => Some(true),
            Reading::ServerInfo { on } | Reading::Environment { on, .. } => Some(*on),
            Reading::NoMode => Some(false),
            Reading::NotReported => None,
        }
    }

    /// The reading in a report's words.
    pub fn describe(&self) -> String {
        match self {
            Reading::ByConstruction => "batch-invariant by construction".into(),
            Reading::ServerInfo { on } => format!("its server info says {SGLANG_KEY} = {on}"),
            Reading::Environment { on: true, pid } => {
                format!("{VLLM_VAR} is on in the environment of pid {pid}")
            }
            Reading::Environment { on: false, pid } => {
                format!("{VLLM_VAR} is not on in the environment of pid {pid}")
            }
            Reading::NoMode => "the engine has no batch-invariant mode".into(),
            Reading::NotReported => "nothing read back says".into(),
        }
    }
}

/// The self-report's word on SGLang's deterministic mode: the key at the top level
/// (`/server_info` spreads the server arguments there) or under `server_args`.
pub fn of_server_info(doc: &serde_json::Value) -> Reading {
    let value = doc
        .get(SGLANG_KEY)
        .or_else(|| doc.get("server_args").and_then(|a| a.get(SGLANG_KEY)));
    match value.and_then(serde_json::Value::as_bool) {
        Some(on) => Reading::ServerInfo { on },
        None => Reading::NotReported,
    }
}

/// vLLM's batch-invariant switch in a process's environment (`/proc/<pid>/environ`:
/// `NAME=value` entries separated by NUL bytes), as vLLM reads it: an integer, on when
/// not 0; absent (or not an integer, which vLLM refuses to start with) is off.
pub fn of_environment(environ: &[u8], pid: u32) -> Reading {
    let prefix = format!("{VLLM_VAR}=");
    let on = environ
        .split(|b| *b == 0)
        .filter_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .next_back()
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|value| value.trim().parse::<i64>().ok())
        .is_some_and(|value| value != 0);
    Reading::Environment { on, pid }
}

/// The roles' readings together: batch-invariant only when every role is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Determinism {
    /// Role -> what it said.
    pub roles: BTreeMap<String, Reading>,
}

/// What the readings add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every role batch-invariant: any parting from a session alone is a bug.
    BatchInvariant,
    /// Some role said it is not: a parting at a near-tie is numerics, not a bug.
    NotInvariant,
    /// No role said it is not, but some said nothing: treated as not invariant.
    Unknown,
}

impl Determinism {
    pub fn verdict(&self) -> Verdict {
        let said: Vec<Option<bool>> = self.roles.values().map(Reading::on).collect();
        if said.is_empty() {
            Verdict::Unknown
        } else if said.iter().all(|on| *on == Some(true)) {
            Verdict::BatchInvariant
        } else if said.contains(&Some(false)) {
            Verdict::NotInvariant
        } else {
            Verdict::Unknown
        }
    }

    pub fn batch_invariant(&self) -> bool {
        self.verdict() == Verdict::BatchInvariant
    }

    /// One line for reports and `bisect check`: the verdict, then each role's reading.
    pub fn describe(&self) -> String {
        if !self.roles.is_empty() && self.roles.values().all(|r| *r == Reading::ByConstruction) {
            return "batch-invariant by construction: any parting from a session alone is a bug"
                .into();
        }
        let head = match self.verdict() {
            Verdict::BatchInvariant => "batch-invariant: any parting from a session alone is a bug",
            Verdict::NotInvariant => {
                "not batch-invariant: a parting at a near-tie counts as drift"
            }
            Verdict::Unknown => {
                "not known to be batch-invariant (no deterministic mode read back): a parting at a near-tie counts as drift"
            }
        };
        let roles: Vec<String> = self
            .roles
            .iter()
            .map(|(role, reading)| format!("{role}: {}", reading.describe()))
            .collect();
        match roles.is_empty() {
            true => head.to_string(),
            false => format!("{head} ({})", roles.join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_reports_its_mode_at_the_top_or_under_server_args() {
        assert_eq!(
            of_server_info(&json!({"enable_deterministic_inference": true, "version": "0.5.5"})),
            Reading::ServerInfo { on: true }
        );
        assert_eq!(
            of_server_info(&json!({"server_args": {"enable_deterministic_inference": false}})),
            Reading::ServerInfo { on: false }
        );
        // An SGLang from before the mode, or a document of another engine.
        assert_eq!(of_server_info(&json!({"tp_size": 1})), Reading::NotReported);
        assert_eq!(
            of_server_info(&json!({"enable_deterministic_inference": "yes"})),
            Reading::NotReported
        );
    }

    #[test]
    fn vllm_reads_its_switch_as_an_integer() {
        let env = |entries: &[&str]| entries.join("\0").into_bytes();
        let on = |entries: &[&str]| of_environment(&env(entries), 7).on();
        assert_eq!(
            on(&["PATH=/bin", "VLLM_BATCH_INVARIANT=1", "HOME=/"]),
            Some(true)
        );
        assert_eq!(on(&["VLLM_BATCH_INVARIANT=2"]), Some(true));
        assert_eq!(on(&["VLLM_BATCH_INVARIANT=0"]), Some(false));
        assert_eq!(
            on(&["PATH=/bin"]),
            Some(false),
            "absent is vLLM's default, off"
        );
        assert_eq!(
            on(&["VLLM_BATCH_INVARIANT=true"]),
            Some(false),
            "not an integer"
        );
        // A longer name that starts the same is another variable.
        assert_eq!(on(&["VLLM_BATCH_INVARIANT_X=1"]), Some(false));
        // The last assignment wins, as in a shell's environment.
        assert_eq!(
            on(&["VLLM_BATCH_INVARIANT=0", "VLLM_BATCH_INVARIANT=1"]),
            Some(true)
        );
        assert_eq!(
            of_environment(&env(&["VLLM_BATCH_INVARIANT=1"]), 41).describe(),
            "VLLM_BATCH_INVARIANT is on in the environment of pid 41"
        );
    }

    #[test]
    fn batch_invariant_only_when_every_role_says_so() {
        let of = |readings: &[(&str, Reading)]| Determinism {
            roles: readings
                .iter()
                .map(|(role, r)| (role.to_string(), r.clone()))
                .collect(),
        };
        let on = Reading::ServerInfo { on: true };
        let off = Reading::ServerInfo { on: false };
        assert_eq!(
            of(&[("prefill", on.clone()), ("decode", on.clone())]).verdict(),
            Verdict::BatchInvariant
        );
        // One role launched without the mode: the pair is not invariant.
        assert_eq!(
            of(&[("prefill", on.clone()), ("decode", off)]).verdict(),
            Verdict::NotInvariant
        );
        // One role silent: not claimed.
        assert_eq!(
            of(&[("prefill", on.clone()), ("decode", Reading::NotReported)]).verdict(),
            Verdict::Unknown
        );
        assert_eq!(of(&[]).verdict(), Verdict::Unknown);
        assert_eq!(
            of(&[("server", Reading::NoMode)]).verdict(),
            Verdict::NotInvariant
        );
        let line = of(&[("prefill", on), ("decode", Reading::NotReported)]).describe();
        assert!(
            line.starts_with("not known to be batch-invariant")
                && line.contains(
                    "prefill: its server info says enable_deterministic_inference = true"
                )
                && line.contains("decode: nothing read back says"),
            "{line}"
        );
    }
}
