//! The nightly regression matrix (`bisect matrix PLAN.toml`, `bisect merge DIR...`):
//! a plan crosses flag values and loads into cells, cells sharing flag values form one
//! restart group, a `--shard I/N` runs a deterministic subset of groups, shards merge
//! back into one matrix, and each cell is compared with the same cell of a baseline night.
//!
//! - [`plan`]: PLAN.toml loading and validation (file:line errors).
//! - [`cells`]: expansion into cells, ids, hashes, restart groups, shards.
//! - [`run`]: driving the cells against engines (edit, verify, restart, restore).
//! - [`record`]: what `matrix.json` holds.
//! - [`baseline`]: finding the baseline night and the per-cell regression rule.
//! - [`load_cell`]: a `kind = "load"` cell: the `bisect load` sweep, its threshold
//!   compared with the baseline's.
//! - [`merge`]: joining shard directories.
//! - [`lanes`]: a matrix on replica sets: the groups dealt to the sets as shards, run
//!   at once, merged.
//! - [`export`]: matrix.json, matrix.csv, summary.md, junit.xml.

pub mod baseline;
pub mod cells;
pub mod export;
pub mod job;
pub mod lanes;
pub mod load_cell;
pub mod merge;
pub mod plan;
pub mod record;
pub mod run;

pub use cells::{Cell, Shard};
pub use plan::Plan;
pub use record::{CellRecord, MatrixRecord};
