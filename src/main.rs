//! The `bisect` binary: parse the command line (`cli`), run it (`handlers`), and map
//! the outcome to an exit code in one place.

use std::process::ExitCode;

mod cli;
mod handlers;
mod progress;
mod signals;

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match handlers::run(cli) {
        Ok(code) => code,
        Err(err) => {
            // The API key never reaches the terminal, even echoed in an engine's error.
            eprintln!(
                "error: {}",
                bisect_harness::redact::scrub(&format!("{err:#}"))
            );
            ExitCode::from(bisect_harness::exit::code_for_error(&err))
        }
    }
}
