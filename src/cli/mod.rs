//! Command line (clap types live here only).
use std::process::ExitCode;
pub fn run() -> anyhow::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}

pub mod engine;
