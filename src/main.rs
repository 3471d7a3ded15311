//! Thin entry point: parse, run, map the outcome to an exit code in one place.
use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(bisect_harness::exit::code_for_error(&err))
        }
    }
}
