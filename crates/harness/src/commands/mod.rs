//! One module per subcommand. Each takes a validated plan (built by the binary's
//! command line from clap arguments) and runs it through the layers below.

pub mod adaptive;
pub mod answer;
mod blocks;
pub mod check;
pub mod commits;
pub mod culprit;
pub mod diff;
pub mod history;
mod judge;
pub mod load;
pub mod matrix;
pub mod probe;
pub mod reclassify;
pub mod replicas;
pub mod run;

use std::path::Path;

use crate::config::{ConfigError, TargetProfile};
use crate::exit::{self, Failure};
use crate::launch::LaunchError;

/// Whose engines a plan drives, where its results go (the engines' logs under them), and
/// the key their self-reports are read with.
#[derive(Debug, Clone, Copy)]
pub struct Engines<'a> {
    pub target: &'a TargetProfile,
    pub results: &'a Path,
    pub api_key: Option<&'a str>,
}

impl<'a> Engines<'a> {
    pub(crate) fn new(
        target: &'a TargetProfile,
        results: &'a Path,
        api_key: Option<&'a str>,
    ) -> Engines<'a> {
        Engines {
            target,
            results,
            api_key,
        }
    }
}

/// What every plan that drives engines tells the command that runs it ([`Engines`]).
/// One trait, so the binary starts every such command the same way.
pub trait EnginePlan {
    fn engines(&self) -> Engines<'_>;

    /// Whether the command runs its blocks on every replica set of its target at once
    /// (`run`; a whole `matrix`); the others run on the first set alone.
    fn uses_replicas(&self) -> bool {
        false
    }

    /// Why the command runs on the first set of a target with several (said with the
    /// note), where it has a reason of its own.
    fn first_set_reason(&self) -> Option<&'static str> {
        None
    }

    /// What a command that runs on one set says of a target with several.
    fn single_lane_note(&self) -> Option<String> {
        if self.uses_replicas() {
            return None;
        }
        let note = first_set_note(self.engines().target)?;
        Some(match self.first_set_reason() {
            Some(why) => format!("{note}: {why}"),
            None => note,
        })
    }
}

/// The units a command's planned cost is priced in (core::cost): each as given on the
/// command line, else as this target's earlier commands measured it (kept in the
/// testbed's state directory), else unknown.
pub(crate) fn cost_units(
    testbed: &crate::arm::TestbedOptions,
    target: &str,
    given: crate::core::cost::CostUnits,
) -> (crate::core::cost::Unit, crate::core::cost::Unit) {
    use crate::core::cost::Unit;
    let rates = crate::results::rates::read(&testbed.state_dir(), target);
    (
        Unit::pick(
            given.restart_s,
            rates.per_restart().map(|s| (s, rates.restarts as f64)),
        ),
        Unit::pick(given.session_s, rates.per_wave().map(|s| (s, rates.waves))),
    )
}

/// What a command that runs on the first replica set alone says of `target`, where it
/// has several; `None` on a single replica.
pub fn first_set_note(target: &crate::config::TargetProfile) -> Option<String> {
    if target.replicas.is_empty() {
        return None;
    }
    let names: Vec<&str> = target.replicas.iter().map(|r| r.name.as_str()).collect();
    Some(format!(
        "note: this command runs on replica set {} alone; the target's other sets ({}) sit \
         idle (`bisect run`, a whole `bisect matrix`, `bisect commits`, a fixed `bisect \
         load --flag` and `bisect culprit` at a quarter of a block or less in flight use every set)",
        target.replica_name(),
        names.join(", ")
    ))
}

/// The exit code for an error that ended a command (docs/design.md 3.1): a
/// [`Failure`] by its kind, a bad config file or launch config as bad input, anything
/// else as could-not-run. Only this layer knows every error type.
pub fn code_for_error(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return match f {
                Failure::BadInput(_) => exit::BAD_INPUT,
                Failure::CouldNotRun(_) | Failure::Busy(_) => exit::COULD_NOT_RUN,
                Failure::Interrupted => exit::INTERRUPTED,
            };
        }
        if cause.downcast_ref::<ConfigError>().is_some()
            || cause.downcast_ref::<LaunchError>().is_some()
        {
            return exit::BAD_INPUT;
        }
    }
    exit::COULD_NOT_RUN
}
