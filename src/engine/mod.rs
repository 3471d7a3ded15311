//! The embedded miniature prefill/decode engine (DESIGN.md section 4). Nothing in the
//! harness imports this module; the CLI only starts it (`bisect engine ...`).

pub mod backend;
