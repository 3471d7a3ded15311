//! The `bisect` binary: parse the command line (`cli`), run it (`handlers`), and map
//! the outcome to an exit code in one place.

use std::process::ExitCode;

/// `eprintln!` that drops the line when stderr is gone (a pipe whose reader exited)
/// instead of panicking: a run must still restore its configs, write its results and
/// exit with its own code.
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

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
            stderr_line!(
                "error: {}",
                bisect_harness::redact::scrub(&format!("{err:#}"))
            );
            ExitCode::from(bisect_harness::commands::code_for_error(&err))
        }
    }
}
