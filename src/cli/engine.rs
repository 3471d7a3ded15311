//! clap arguments of `bisect engine` (being written)
