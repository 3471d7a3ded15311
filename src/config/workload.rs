//! Workload files (DESIGN.md 3.4): sessions, rounds, ctx filler, limits, tool schemas
//! and the task generator that gives each session its own numbered steps.

use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckArgs {
    /// A well-formed call must also be the task's current step (`wrong_args` otherwise).
    Strict,
    /// Only the tool's JSON schema is checked.
    Schema,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object (sent as the OpenAI `parameters`).
    pub parameters: serde_json::Value,
    /// Value pools the task generator draws each argument from.
    pub arg_values: BTreeMap<String, Vec<serde_json::Value>>,
    /// Simulated result template; `{args}` etc. are filled deterministically.
    pub result: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// Steps per session task (one tool call each).
    pub steps: u32,
    /// Text before the numbered list.
    pub intro: String,
    /// Text after the numbered list (what to answer when done).
    pub outro: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub sessions: u32,
    pub rounds: u32,
    /// Filler tokens of earlier conversation before the task message.
    pub ctx: u32,
    pub max_tokens: u32,
    pub timeout_s: f64,
    pub temperature: f64,
    pub tools: Vec<ToolSpec>,
    pub task: TaskSpec,
    pub check_args: CheckArgs,
    /// All sessions finish round r before any starts round r+1.
    pub barrier: bool,
    pub seed: u64,
    pub source: Option<PathBuf>,
}
