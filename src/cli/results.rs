//! Arguments of the commands that read results directories instead of running engines:
//! `bisect diff A B` and `bisect reclassify DIR`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use bisect_harness::commands::diff::Format;

#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The earlier (baseline) results directory: a run or a matrix.
    pub(crate) a: PathBuf,
    /// The later results directory, of the same kind as A.
    pub(crate) b: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
    format: DiffFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DiffFormat {
    /// Terminal table.
    Table,
    /// Markdown, for a PR or a ticket.
    #[value(alias = "markdown")]
    Md,
    Json,
}

impl DiffArgs {
    pub(crate) fn format(&self) -> Format {
        match self.format {
            DiffFormat::Table => Format::Table,
            DiffFormat::Md => Format::Markdown,
            DiffFormat::Json => Format::Json,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct ReclassifyArgs {
    /// A results directory written by `bisect run`.
    pub(crate) dir: PathBuf,
    /// The workload (builtin name or TOML file) the run used, when its recorded name does
    /// not load; its parameters are still taken from run.json.
    #[arg(long)]
    pub(crate) workload: Option<String>,
    /// Print the rewritten run.json instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}
