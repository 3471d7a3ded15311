//! Thin entry point: parse, run, map the outcome to an exit code in one place.
use std::process::ExitCode;

fn main() -> ExitCode {
    match bisect::cli::run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(bisect::exit::code_for_error(&err))
        }
    }
}
