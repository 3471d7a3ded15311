//! The one integration test binary: the harness end to end against a fake engine
//! (in-process, deterministic bugs) and against the embedded engine (real processes),
//! plus the command line's exit codes and error messages.

mod adaptive;
mod check;
mod cli_errors;
mod commits;
mod commits_slurm;
mod common;
mod crash;
mod culprit;
mod deaths;
mod embedded;
mod engine_checks;
mod fake;
mod fake_runs;
mod faults;
mod fixture_v1;
mod history;
mod llama_cpp;
mod load;
mod matrix;
mod matrix_load;
mod ownership;
mod poisoned;
mod probe_tolerance;
mod reclassify;
mod rejected;
mod replicas;
mod report_diff;
mod report_html;
mod servers;
