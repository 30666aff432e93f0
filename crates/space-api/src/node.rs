//! What a node reports to the control plane that is not itself part of the HTTP API.

use serde::{Deserialize, Serialize};

/// A template: a named, versioned, read-only root filesystem. Built and kept by a node's
/// storage pool; the API shows it as a [`crate::Template`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub name: String,
    /// Increases by one with every build of the same name, starting at 1.
    pub version: u64,
    /// Unix time in milliseconds when the build finished.
    pub created_at_ms: u64,
    /// Where the content came from, for humans.
    pub source: String,
    /// Apparent size of the template's regular files (hard links counted once).
    pub size_bytes: u64,
}
