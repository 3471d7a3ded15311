//! Target profiles (DESIGN.md 3.2): where the engine's API, launch configs, restart
//! commands and health/metrics endpoints are. Without `--target` the CLI builds the
//! embedded profile.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq)]
pub struct TargetProfile {
    pub name: String,
    /// OpenAI-compatible base URL, e.g. `http://127.0.0.1:8000/v1`.
    pub api: String,
    pub model: String,
    /// Name of the environment variable holding the API key; the key itself is never written.
    pub api_key_env: Option<String>,
    pub roles: Vec<RoleSpec>,
    /// The profile file (None for the built-in embedded profile).
    pub source: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoleSpec {
    pub name: String,
    /// Launch config, resolved relative to the profile file.
    pub launch: PathBuf,
    /// Restart command; without it bisect spawns `sh LAUNCH` itself.
    pub restart: Option<String>,
    pub health: String,
    pub metrics: Option<String>,
    pub health_timeout_s: u64,
}
