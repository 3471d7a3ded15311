//! What the engines say about themselves, read by the arm lifecycle: after a restart,
//! each written or pinned flag's effective values and the flags an engine runs with
//! another value ([`Restarted`]); which process each role is (checked again at the end
//! of every block); and the refusal of an engine bisect did not start.

use std::collections::BTreeMap;

use super::{Readback, Testbed};
use crate::config::{Engine, FlagSpec, TargetProfile};
use crate::control::fetch_server_info;
use crate::core::effective;
use crate::exit::Failure;

/// What a restart measured.
#[derive(Debug, Clone, Default)]
pub struct Restarted {
    /// Health wait summed over roles, seconds.
    pub health_wait_s: f64,
    /// The health poller's padding summed over roles, seconds: an upper bound on the
    /// time between an engine being ready and bisect noticing (0 where not measured).
    pub(crate) health_padding_s: f64,
    /// The rest of the restart, seconds: stopping, the foreign-engine check, spawning or
    /// the restart command, and asking each engine what it runs with.
    pub restart_s: f64,
    /// Role -> what the engine reports about itself (`/server_info`), where it does.
    pub engine_info: BTreeMap<String, serde_json::Value>,
    /// Flag -> role -> the value the engine reports running with, for every flag this
    /// testbed has written or pinned (empty where no engine of its roles reports it).
    pub effective: BTreeMap<String, Readback>,
    /// The written and pinned flags some engine reports running with another value than
    /// the launch config holds, in the order they were first written, roles in name
    /// order: what the restart disproved.
    pub(crate) disagreements: Vec<Disagreeing>,
}

impl Restarted {
    /// What the restarted engines report about themselves against the values set and
    /// pinned, as `bisect run` checks its arms and pins: a value an engine does not run
    /// with is an error naming `what` (e.g. "block 3"); the values set are named first,
    /// as they were written first.
    pub(crate) fn refuse_disagreements(&self, what: &str) -> anyhow::Result<()> {
        if let Some(set) = self.disagreements.iter().find(|d| !d.pinned) {
            let d = &set.disagreement;
            let (role, got, value) = (&d.role, &d.reported, &d.expected);
            return Err(Failure::CouldNotRun(format!(
                "{what}: the {role} engine reports {}={got} after the restart, but its launch config sets {value}: the engine does not run with what the search set\n  fix: check the launch script applies the flag (a dead conditional, an ignored variable)",
                set.flag
            ))
            .into());
        }
        if let Some(pin) = self.disagreements.iter().find(|d| d.pinned) {
            // Every block would measure another deployment than the one pinned.
            let d = &pin.disagreement;
            let (role, value, ran) = (&d.role, &d.expected, &d.reported);
            return Err(Failure::CouldNotRun(format!(
                "{what}: pinned {}={value}, but the {role} engine reports it runs with {ran:?}: \
                 the launch config does not take effect\n  fix: check how role {role}'s launch \
                 config sets {} (a conditional, an overriding later line)",
                pin.flag, pin.setting_key
            ))
            .into());
        }
        Ok(())
    }
}

/// A flag an engine does not run with as written (a dead conditional, an overriding
/// later line, an ignored variable).
#[derive(Debug, Clone)]
pub struct Disagreeing {
    pub flag: String,
    /// Where the flag lives in the launch config (the env variable, the argument).
    pub(crate) setting_key: String,
    /// Written with [`Testbed::pin`] rather than [`Testbed::set`].
    pub pinned: bool,
    pub(crate) disagreement: effective::Disagreement,
}

/// A flag value the testbed wrote, and whether it was a pin.
pub(super) struct Written {
    pub(super) flag: FlagSpec,
    pub(super) value: String,
    pub(super) pinned: bool,
}

/// The fields by which an engine's self-report says which process it is. Where a role
/// reports them, a change between the restart and the end of a block means another
/// process answered part of the block: a crash and an automatic restart (systemd's
/// `Restart=`, a Kubernetes pod), with a cold cache and a lower load after it.
pub const IDENTITY_FIELDS: [&str; 3] = ["pid", "started_at", "start_time"];

pub(super) fn identity_of(doc: &serde_json::Value) -> Option<BTreeMap<String, serde_json::Value>> {
    let found: BTreeMap<String, serde_json::Value> = IDENTITY_FIELDS
        .iter()
        .filter_map(|f| Some((f.to_string(), doc.get(*f)?.clone())))
        .collect();
    (!found.is_empty()).then_some(found)
}

fn identity_text(identity: &BTreeMap<String, serde_json::Value>) -> String {
    identity
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Testbed<'_> {
    /// What the engines' self-reports say of every written flag: its effective values
    /// and the roles that run it with another value.
    pub(super) fn check_written(&self, restarted: &mut Restarted) {
        for w in &self.written {
            let reported = effective_values(self.target, &w.flag, &restarted.engine_info);
            for d in effective::disagreements(&w.value, &reported) {
                restarted.disagreements.push(Disagreeing {
                    flag: w.flag.name.clone(),
                    setting_key: w.flag.setting.key().to_string(),
                    pinned: w.pinned,
                    disagreement: d,
                });
            }
            restarted.effective.insert(w.flag.name.clone(), reported);
        }
    }

    /// What the role's engine reports about itself: its `effective_url` document, or,
    /// where no preset or profile names one, the guesses bisect always made.
    pub(super) async fn self_report(
        &self,
        role: &crate::config::RoleSpec,
    ) -> Option<serde_json::Value> {
        if role.effective_url.is_none() && self.target.engine != Engine::Custom {
            return None;
        }
        fetch_server_info(&self.probe_http, role, self.api_key.as_deref()).await
    }

    /// Whether every engine that identified itself after the restart is still that
    /// process: one line per role that is not, or no longer answers.
    pub(super) async fn engines_replaced(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (name, before) in &self.identities {
            let Some(role) = self.target.role(name) else {
                continue;
            };
            match self.self_report(role).await.as_ref().and_then(identity_of) {
                Some(after) if after == *before => {}
                Some(after) => found.push(format!(
                    "role {name} is another process at the end of the block than after its \
                     restart ({} then, {} now): it restarted during the block (a crash and an \
                     automatic restart?), so part of the sessions ran on a fresh engine",
                    identity_text(before),
                    identity_text(&after)
                )),
                None => found.push(format!(
                    "role {name} no longer reported which process it is at the end of the \
                     block (it did after its restart, {}): whether one engine served the \
                     whole block is unknown",
                    identity_text(before)
                )),
            }
        }
        found
    }

    pub(super) async fn refuse_foreign_engines(&self) -> anyhow::Result<()> {
        for role in self.target.roles.iter().filter(|r| r.restart.is_none()) {
            if let Ok(resp) = self.probe_http.get(&role.health).send().await {
                let who = match fetch_server_info(&self.probe_http, role, self.api_key.as_deref())
                    .await
                {
                    Some(info) => format!(
                        " (it reports role {}, pid {})",
                        info.get("role").map_or("?".into(), |v| v.to_string()),
                        info.get("pid").map_or("?".into(), |v| v.to_string())
                    ),
                    None => String::new(),
                };
                return Err(Failure::CouldNotRun(format!(
                    "something already answers on {} (HTTP {}){who} before bisect started role {}: \
                     an engine bisect did not start would be measured\n  \
                     fix: stop that process (a run killed with -9 leaves its engines running), \
                     or run `bisect restore`, or give the role another port in its launch config",
                    role.health,
                    resp.status().as_u16(),
                    role.name
                ))
                .into());
            }
        }
        Ok(())
    }
}

/// Role -> the flag's value as each engine of its roles reports it, where it does: at
/// the role's `effective_pointers` entry for the flag, else the default pointers.
fn effective_values(
    target: &TargetProfile,
    flag: &FlagSpec,
    engine_info: &BTreeMap<String, serde_json::Value>,
) -> Readback {
    flag.roles
        .iter()
        .filter_map(|role| {
            let doc = engine_info.get(role)?;
            let pointers = match target
                .role(role)
                .and_then(|r| r.effective_pointers.get(&flag.name))
            {
                Some(pointer) => vec![pointer.clone()],
                None => effective::pointers(flag),
            };
            Some((role.clone(), effective::reported_at(doc, &pointers)?))
        })
        .collect()
}

/// The warning a run carries when no engine of the flag's roles reports the flag's
/// effective value: then only the launch-file read-back says the arms differ.
pub const NO_EFFECTIVE_WARNING: &str =
    "no engine reports its effective configuration: only the launch-file read-back stands";
