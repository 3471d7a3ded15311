//! `bisect-core`, the pure core: the harness's vocabulary and every decision it makes,
//! with no I/O (no files, no processes, no network), so it is tested with plain values.
//! A crate of its own so the compiler keeps it so (ripgrep's way): its manifest has no
//! async runtime, HTTP client or anyhow, it cannot name the harness (the harness depends
//! on it), and its clippy.toml forbids std's file, process and network calls. The
//! harness re-exports it as `bisect_harness::core`.

pub mod adaptive;
pub mod arm_stats;
pub mod classify;
pub mod commits;
pub mod confounds;
pub mod cost;
pub mod culprit;
pub mod deaths;
pub mod determinism;
pub mod effective;
pub mod ending;
pub mod engine_counts;
pub mod evidence;
pub mod flag;
pub mod format;
pub mod history;
pub mod judgement;
pub mod load;
pub mod machine;
pub mod mechanism;
pub mod oracle;
pub mod phases;
pub mod poison;
pub mod pressure;
#[cfg(any(test, feature = "test-support"))]
pub mod proptest_config;
pub mod reason;
pub mod root_cause;
pub mod sequential;
pub mod session;
pub mod solo;
pub mod stats;
pub mod task;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod toolprobe;
pub mod tools;
pub mod transport;
pub mod trend;
pub mod verdict;
pub mod workload;
