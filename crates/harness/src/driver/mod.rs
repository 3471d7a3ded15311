//! The workload of `bisect run` (docs/design.md 3.4-3.6): per-session tasks and ctx filler,
//! simulated tools, the OpenAI chat client, the session state machine, the concurrent
//! driver with its optional round barrier, the Prometheus poller behind metrics.csv,
//! and a sample workload for tests and benchmarks (the zero-work mock engine they run
//! against is `bisect_engine::mock`).

pub mod barrier;
pub mod body;
pub mod client;
pub mod connect;
pub mod conversation;
pub(crate) mod count;
pub mod drive;
pub mod metrics;
#[cfg(test)]
mod metrics_proptests;
pub mod sample;
pub mod toolprobe;

pub use crate::core::task::{Step, Task};
pub use client::{Connection, InFlight};
pub use conversation::Oracle;
pub use drive::{drive, drive_life, DrivePlan, DriveStats, Life};
pub use metrics::poll;
pub(crate) use metrics::write_csv;
