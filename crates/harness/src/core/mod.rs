//! The pure core: the harness's vocabulary and every decision it makes, with no I/O
//! (no files, no processes, no network), so it is tested with plain values.

pub mod classify;
pub mod ending;
pub mod session;
pub mod stats;
pub mod task;
pub mod tools;
pub mod verdict;
