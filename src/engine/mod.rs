//! The embedded miniature prefill/decode engine (DESIGN.md section 4). Nothing in the
//! harness imports this module; the CLI only starts it (`bisect engine ...`).

pub mod backend;
pub mod dsml;
pub mod keys;
pub mod model;
pub mod template;
pub mod tokenizer;
pub mod hicache;
pub mod kvpool;
pub mod prefill;
pub mod sim;
