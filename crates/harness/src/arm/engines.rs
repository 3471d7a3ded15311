//! What the engines say about themselves, read by the arm lifecycle: after a restart,
//! each written or pinned flag's effective values and the flags an engine runs with
//! another value ([`Restarted`]); which process each role is (checked again at the end
//! of every block); the refusal of an engine bisect did not start; and, before the
//! first block, whether the engine returns tool calls parsed at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Readback, Testbed};
use crate::config::{Engine, FlagSpec, TargetProfile, Workload};
use crate::control::fetch_server_info;
use crate::control::identity::identify;
use crate::core::classify::Classifier;
use crate::core::deaths::EngineDeath;
use crate::core::effective::Identity;
use crate::core::{effective, toolprobe};
use crate::driver::{DrivePlan, InFlight};
use crate::exit::Failure;

/// What a restart measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Restarted {
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
    /// Role -> which process it is and where that was read (every role; `none` where
    /// no source names it).
    pub identities: BTreeMap<String, Identity>,
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
            return Err(Failure::could_not_run(
                format!(
                    "{what}: the {role} engine reports {}={got} after the restart, but its launch config sets {value}: the engine does not run with what the search set",
                    set.flag
                ),
                "check the launch script applies the flag (a dead conditional, an ignored variable)",
            )
            .into());
        }
        self.refuse_pins(Some(what))
    }

    /// A pinned flag some engine does not run with, as the error that stops the command:
    /// every block would measure another deployment than the one pinned. `what` names
    /// the block, where there is one to name.
    pub(crate) fn refuse_pins(&self, what: Option<&str>) -> anyhow::Result<()> {
        if let Some(pin) = self.disagreements.iter().find(|d| d.pinned) {
            let d = &pin.disagreement;
            let (role, value, ran) = (&d.role, &d.expected, &d.reported);
            let what = what.map(|w| format!("{w}: ")).unwrap_or_default();
            return Err(Failure::could_not_run(
                format!(
                    "{what}pinned {}={value}, but the {role} engine reports it runs with {ran:?}: \
                     the launch config does not take effect",
                    pin.flag
                ),
                format!(
                    "check how role {role}'s launch config sets {} (a conditional, an \
                     overriding later line)",
                    pin.setting_key
                ),
            )
            .into());
        }
        Ok(())
    }
}

/// A flag an engine does not run with as written (a dead conditional, an overriding
/// later line, an ignored variable).
#[derive(Debug, Clone)]
pub(crate) struct Disagreeing {
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

/// The warning of a role that is another process at the end of a block than after its
/// restart, or that no longer says which it is; `None` when it is the same.
fn replaced(name: &str, before: &Identity, after: &Identity) -> Option<String> {
    if !after.is_known() {
        return Some(format!(
            "role {name} no longer said which process it is at the end of the block (it did \
             after its restart, {}, from {}): whether one engine served the whole block is \
             unknown",
            before.text(),
            before.source.describe()
        ));
    }
    // A pid alone, from one source and then another, proves nothing either way.
    let comparable =
        before.source == after.source || (before.has_start_time() && after.has_start_time());
    (comparable && before.text() != after.text()).then(|| {
        format!(
            "role {name} is another process at the end of the block than after its restart \
             ({} then, {} now, from {}): it restarted during the block (a crash and an \
             automatic restart?), so part of the sessions ran on a fresh engine",
            before.text(),
            after.text(),
            after.source.describe()
        )
    })
}

impl Testbed<'_> {
    /// Before the command's first block: does the engine return the workload's tool
    /// calls parsed (docs/design.md 3.13)? The first rounds of
    /// [`toolprobe::TRIES`] sessions are asked, one at a time; one parsed call (or the
    /// parser's rejection) among them proves a parser, and the others, corrupted alone,
    /// are a note ([`toolprobe::Tally::tolerated`]). An engine that returns every call
    /// as text, or whose model never calls, could only show `leak`/`no_tool` in every
    /// arm: the command refuses (exit 3) with the engine's fix rather than spend an A/B.
    /// A probe that got no answer (errors, timeouts) is a warning: the blocks' own error
    /// accounting judges such an engine. Once per command; later blocks skip it.
    pub(super) async fn prove_tool_calls(
        &mut self,
        workload: &Workload,
        classifier: &Arc<Classifier>,
        label: &str,
    ) -> anyhow::Result<Vec<EngineDeath>> {
        if self
            .tool_calls_probed
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(Vec::new());
        }
        let plan = DrivePlan {
            api: self.target.api.clone(),
            model: self.target.model.clone(),
            api_key: self.api_key.clone(),
            workload: workload.clone(),
            label: "tool-call-probe".into(),
            repeat: 0,
            sessions: toolprobe::TRIES,
            concurrency: 1,
            oracle: None,
        };
        // The probe's one request in flight, for a death it causes.
        let inflight = Arc::new(InFlight::new());
        let _asking = inflight.enter();
        let watch =
            super::deaths::DeathWatch::new(self.control.spawned(), Vec::new(), inflight.clone());
        let replies = tokio::select! {
            replies = crate::driver::toolprobe::ask(&plan, classifier.clone()) => replies?,
            () = self.cancel.cancelled() => return Err(Failure::Interrupted.into()),
        };
        // An engine that died answering the probe died at one request in flight: that
        // is the block's evidence, and the block runs on a fresh start of it.
        if watch.poll().await {
            let deaths = watch.deaths();
            for death in &deaths {
                self.progress.note(&format!(
                    "warning: {} while answering the tool-call probe; restarting it for block {label}",
                    death.describe()
                ));
            }
            self.restart(&format!("{label}-after-probe")).await?;
            return Ok(deaths);
        }
        let tally = toolprobe::Tally::of(&replies);
        let finding = tally.finding();
        let quoted = toolprobe::evidence(&replies, finding);
        if finding.refuses_a_run() {
            let message = format!(
                "the tool-call probe (the first rounds of workload `{}`'s sessions, one at a \
                 time, before any block; {}): {}; the engine's reply: {quoted}. Every session \
                 of every arm could only end leak or no_tool, so no flag could be implicated",
                workload.name,
                tally.in_words(),
                finding.describe(),
            );
            let fix = finding.fix(self.target.engine.tool_call_fix(), workload.ctx);
            return Err(Failure::could_not_run(message, fix).into());
        }
        if let Some(note) = toolprobe::tolerated(&replies) {
            self.progress.note(&format!("warning: {note}"));
        }
        if !finding.proves_parsing() {
            self.progress.note(&format!(
                "warning: the tool-call probe could not tell whether the engine parses tool calls: {} (last: {quoted})",
                finding.describe()
            ));
        }
        Ok(Vec::new())
    }

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

    /// Whether every engine that was identified after the restart is still that
    /// process: one line per role that is not, or no longer says (roles in `died`, whose
    /// death the block recorded, are not asked).
    pub(super) async fn engines_replaced(&self, died: &[&str]) -> Vec<String> {
        let mut found = Vec::new();
        for (name, before) in &self.identities {
            if died.contains(&name.as_str()) {
                continue;
            }
            let Some(role) = self.target.role(name) else {
                continue;
            };
            if !before.is_known() {
                continue;
            }
            let report = self.self_report(role).await;
            let after = identify(
                &self.probe_http,
                role,
                self.api_key.as_deref(),
                report.as_ref(),
            )
            .await;
            found.extend(replaced(name, before, &after));
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
                return Err(Failure::could_not_run(
                    format!(
                        "something already answers on {} (HTTP {}){who} before bisect started \
                         role {}: an engine bisect did not start would be measured",
                        role.health,
                        resp.status().as_u16(),
                        role.name
                    ),
                    "stop that process (a run killed with -9 leaves its engines running), or run \
                     `bisect restore`, or give the role another port in its launch config",
                )
                .into());
            }
            self.wait_for_port(role).await?;
        }
        Ok(())
    }

    /// Waits, up to [`PORT_FREE_WAIT`], until the role's port on this host is let go of:
    /// no socket listens on it (an engine still exiting holds it without answering) and
    /// no connection the last engine closed is still unacknowledged (a server binding
    /// with SO_REUSEPORT alone cannot bind past those: "couldn't bind HTTP server
    /// socket", seen between a 0.3.8 and a 0.3.36 llama-server in a release search).
    async fn wait_for_port(&self, role: &crate::config::RoleSpec) -> anyhow::Result<()> {
        use crate::control::identity::{port_held, port_unsettled};
        let busy = || -> Option<String> {
            if let Some(holder) = port_held(&role.health) {
                return Some(format!("listened on by {holder}"));
            }
            match port_unsettled(&role.health) {
                Some(n) if n > 0 => Some(format!(
                    "{n} connection(s) the last engine closed still unacknowledged"
                )),
                _ => None,
            }
        };
        let started = Instant::now();
        let Some(mut why) = busy() else {
            return Ok(());
        };
        while started.elapsed() < PORT_FREE_WAIT {
            tokio::select! {
                _ = self.cancel.cancelled() => return Err(Failure::Interrupted.into()),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            match busy() {
                None => {
                    self.progress.note(&format!(
                        "role {}: its port was busy ({why}) for {:.1} s after the engines stopped; free now",
                        role.name,
                        started.elapsed().as_secs_f64()
                    ));
                    return Ok(());
                }
                Some(now) => why = now,
            }
        }
        if port_held(&role.health).is_some() {
            return Err(Failure::could_not_run(
                format!(
                    "the port of {} is still {why}, {} s after bisect's engines stopped, without answering: role {} could not bind it",
                    role.health,
                    PORT_FREE_WAIT.as_secs(),
                    role.name
                ),
                "stop that process, or give the role another port in its launch config",
            )
            .into());
        }
        // Unacknowledged closes only: some servers bind past them; start and see.
        self.progress.note(&format!(
            "warning: role {}: its port still has {why} after {} s; starting it anyway",
            role.name,
            PORT_FREE_WAIT.as_secs()
        ));
        Ok(())
    }
}

/// How long a restart waits for a role's port to be let go of.
const PORT_FREE_WAIT: Duration = Duration::from_secs(30);

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
            let pointer = target
                .role(role)
                .and_then(|r| r.effective_pointers.get(&flag.name));
            Some((role.clone(), effective::reported_for(doc, flag, pointer)?))
        })
        .collect()
}

/// The warning a run carries, after the flag's name ("FLAG: ..."), when no engine of the
/// flag's roles reports the flag's effective value where bisect looks: then only the
/// launch-file read-back says the arms differ. An engine may report everything else (its
/// document is in run.json's `engine_info`): the fix is a pointer to the flag's value.
pub const NO_EFFECTIVE_WARNING: &str =
    "no engine of its roles reports its value where bisect looks (the role's effective_pointers entry for the flag says where; `on`/`off` there map an engine's own words, e.g. False for a disabling switch): only the launch-file read-back stands";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::effective::IdentitySource;

    fn id(source: IdentitySource, pid: Option<&str>, started: Option<&str>) -> Identity {
        Identity {
            source,
            pid: pid.map(String::from),
            started: started.map(String::from),
            listener: None,
        }
    }

    #[test]
    fn a_replacement_is_told_by_any_source_with_a_start_time() {
        let socket = |pid, t| id(IdentitySource::ListeningSocket, Some(pid), Some(t));
        assert_eq!(
            replaced("decode", &socket("41", "100"), &socket("41", "100")),
            None
        );
        let line = replaced("decode", &socket("41", "100"), &socket("57", "900")).unwrap();
        assert!(
            line.contains("pid 41 started 100 then, pid 57 started 900 now")
                && line.contains("the process listening on its port"),
            "{line}"
        );
        let gone = replaced("decode", &socket("41", "100"), &Identity::unknown()).unwrap();
        assert!(gone.contains("no longer said which process"), "{gone}");
        // A pid alone from one source, then a start time from another: not comparable.
        let pid_only = id(IdentitySource::EngineReport, Some("41"), None);
        assert_eq!(replaced("decode", &pid_only, &socket("41", "100")), None);
    }
}
