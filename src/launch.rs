//! (being written)
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);
