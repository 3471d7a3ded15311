//! Reading each role's batch-invariant mode back after a restart (what it means is
//! [`crate::core::determinism`]'s): SGLang's self-report, already read by the restart;
//! for vLLM, the environment of the process listening on the role's port on this host
//! (`/proc/<pid>/environ`; a remote engine's is not readable from here, and says so).

use std::collections::BTreeMap;

use crate::config::TargetProfile;
use crate::core::determinism::{self, Determinism, ModeSource, Reading};

/// Every role's reading: `reports` holds the self-reports the restart read (role ->
/// document), where there were any.
pub fn read(target: &TargetProfile, reports: &BTreeMap<String, serde_json::Value>) -> Determinism {
    let roles = target
        .roles
        .iter()
        .map(|role| {
            let reading = match target.engine.mode_source() {
                ModeSource::ByConstruction => Reading::ByConstruction,
                ModeSource::NoMode => Reading::NoMode,
                ModeSource::ServerInfo => reports
                    .get(&role.name)
                    .map_or(Reading::NotReported, determinism::of_server_info),
                ModeSource::ProcessEnvironment => environment(&role.health),
            };
            (role.name.clone(), reading)
        })
        .collect();
    Determinism { roles }
}

/// The mode in the environment of the process serving `health_url` on this host.
fn environment(health_url: &str) -> Reading {
    let Some(pid) = super::identity::listener_pid(health_url) else {
        return Reading::NotReported;
    };
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(environ) => determinism::of_environment(&environ, pid),
        Err(_) => Reading::NotReported,
    }
}
