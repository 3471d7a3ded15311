//! The pure core: the harness's vocabulary and every decision it makes, with no I/O
//! (no files, no processes, no network), so it is tested with plain values.

pub mod adaptive;
pub mod arm_stats;
pub mod classify;
pub mod commits;
pub mod confounds;
pub mod culprit;
pub mod deaths;
pub mod effective;
pub mod ending;
pub mod engine_counts;
pub mod flag;
pub mod format;
pub mod judgement;
pub mod load;
pub mod machine;
pub mod oracle;
pub mod phases;
pub mod root_cause;
pub mod sequential;
pub mod session;
pub mod stats;
pub mod task;
pub mod toolprobe;
pub mod tools;
pub mod transport;
pub mod verdict;
pub mod workload;
