//! In-sandbox half of the linux runtime (placeholder: being written).

use std::os::unix::net::UnixListener;

/// What pid 1 of a fresh sandbox gets back from [`run_init`].
pub struct InitOutcome {
    /// The node's connections arrive here.
    pub listener: UnixListener,
}

#[derive(Debug, thiserror::Error)]
#[error("sandbox init: {0}")]
pub struct InitError(pub String);

/// Runs the bootstrap protocol; returns only in the sandbox's pid 1.
pub fn run_init() -> Result<InitOutcome, InitError> {
    Err(InitError("not yet implemented".into()))
}
