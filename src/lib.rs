//! `bisect`: reproduce and bisect load-dependent corruption bugs in LLM serving engines.
//!
//! Two parts share this package and never reach into each other:
//! the harness (`config` .. `report`) talks to every engine only through its target
//! profile (launch configs, restart commands, HTTP); `engine` is the embedded miniature
//! prefill/decode server that the harness drives by default.

pub mod classify;
pub mod cli;
pub mod config;
pub mod control;
pub mod culprit;
pub mod diff;
pub mod embedded;
pub mod engine;
pub mod exit;
pub mod experiment;
pub mod launch;
pub mod matrix;
pub mod probe;
pub mod reclassify;
pub mod report;
pub mod session;
pub mod stats;
pub mod verdict;
pub mod workload;
