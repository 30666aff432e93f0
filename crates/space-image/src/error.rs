//! The one error type of the image crate. Every message names the image part that failed.

use std::io;
use std::path::{Path, PathBuf};

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{what} is not a valid image: {reason}")]
    Malformed { what: String, reason: String },

    #[error("{what} does not match its digest: expected {expected}, got {actual}; the image is corrupt or was altered")]
    DigestMismatch { what: String, expected: String, actual: String },

    #[error("layer {layer}: {path:?} {reason}; the image is refused")]
    Refused { layer: usize, path: String, reason: String },

    #[error("the image exceeds the import limit of {limit} {what}: raise the limit if the image is trusted")]
    TooLarge { what: &'static str, limit: u64 },

    #[error("{what} has no image tagged {tag:?}; tags: {available}")]
    NoSuchTag { what: String, tag: String, available: String },

    #[error("{what}: unsupported {kind} {value}")]
    Unsupported { what: String, kind: &'static str, value: String },

    #[error("registry {registry}: {reason}")]
    Registry { registry: String, reason: String },
}

impl ImageError {
    pub(crate) fn io(action: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        ImageError::Io { action, path: path.as_ref().to_path_buf(), source }
    }

    pub(crate) fn malformed(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ImageError::Malformed { what: what.into(), reason: reason.into() }
    }
}

/// Attaches what was being done, and to which file, to an I/O error.
pub(crate) trait IoContext<T> {
    fn ctx(self, action: &'static str, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, action: &'static str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| ImageError::io(action, path, e))
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn ctx(self, action: &'static str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| ImageError::io(action, path, io::Error::from(e)))
    }
}
