//! `bisect-harness`: everything `bisect` does to an engine, which it knows only through
//! a target profile (launch configs, restart commands, HTTP). It never depends on the
//! embedded engine (`bisect-engine`); the `bisect` binary depends on both.
//!
//! Layers, from the inside out (docs/design.md, "Architecture"):
//! - [`core`]: pure vocabulary and decisions, no I/O: sessions and classes, the
//!   classifier, tasks and simulated tools, statistics, verdicts, number formatting.
//! - [`config`]: validated target profiles, flag catalogs and workloads, loaded from
//!   files with file:line errors.
//! - the I/O edges: [`launch`] (editing launch configs under a journal), [`control`]
//!   (engine processes and health), [`driver`] (the HTTP workload driver and metrics
//!   poller), [`results`] (results directories, records and their renderings).
//! - [`arm`]: the one arm lifecycle every command runs its arms through.
//! - [`commands`]: one module per subcommand, built from the layers above.

pub mod arm;
pub mod commands;
pub mod config;
pub mod control;
/// The pure core, a crate of its own (`bisect-core`) so the compiler keeps it pure.
pub use bisect_core as core;
pub mod driver;
pub mod exit;
pub mod fault;
pub mod launch;
#[cfg(test)]
mod layering;
#[cfg(test)]
mod proptest_config;
pub mod redact;
pub mod results;
#[cfg(test)]
mod test_http;
