//! The workload of `bisect run` (DESIGN.md 3.4-3.6): per-session tasks and ctx filler,
//! simulated tools, the OpenAI chat client, the session state machine, the concurrent
//! driver with its optional round barrier, the Prometheus poller behind metrics.csv,
//! and a zero-work mock chat server for tests and benchmarks.

pub mod barrier;
pub mod client;
pub mod conversation;
pub mod drive;
pub mod metrics;
#[cfg(test)]
mod metrics_proptests;
pub mod mock;

pub use crate::core::task::{Step, Task};
pub use client::{ChatClient, ChatOutcome, InFlight};
pub use drive::{drive, DrivePlan, DriveStats};
pub use metrics::{poll, write_csv, MetricsLog, MetricsRow};
