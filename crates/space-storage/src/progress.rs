//! Progress reports for long operations (template builds and imports), so a CLI can draw a bar.

use serde::{Deserialize, Serialize};

/// One progress report: the current phase and how far along it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// What is happening, e.g. "downloading", "extracting", "shifting ownership".
    pub phase: String,
    /// Units done in this phase (bytes, packages or files, depending on the phase).
    pub done: u64,
    /// Units in this phase, when known (draw a spinner when `None`).
    pub total: Option<u64>,
}

impl Progress {
    pub fn new(phase: impl Into<String>, done: u64, total: Option<u64>) -> Self {
        Progress { phase: phase.into(), done, total }
    }
}

/// The callback type every long operation takes. It is only called on the caller's thread.
pub type ProgressFn<'a> = &'a dyn Fn(Progress);

/// A callback that ignores every report.
pub fn no_progress(_: Progress) {}
