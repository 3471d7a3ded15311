//! One module per subcommand. Each takes a validated plan (built by the binary's
//! command line from clap arguments) and runs it through the layers below.

pub mod adaptive;
pub mod check;
pub mod commits;
pub mod culprit;
pub mod diff;
pub mod matrix;
pub mod probe;
pub mod reclassify;
pub mod run;
