//! Errors, and the excerpt of a CRIU log that tells a user why CRIU failed.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("CRIU not found (tried {tried}): run scripts/install-criu.sh")]
    NotFound { tried: String },

    #[error("{path} is CRIU {found}, but sandboxes need CRIU >= {needed}: run scripts/install-criu.sh")]
    TooOld { path: PathBuf, found: String, needed: String },

    #[error("{path} --version: {detail}")]
    Version { path: PathBuf, detail: String },

    #[error("cannot run {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// CRIU ran and failed; `excerpt` holds the log's error lines (or its last lines).
    #[error("criu {action} failed ({status}); from {}:\n{excerpt}", log.display())]
    Failed { action: &'static str, status: String, log: PathBuf, excerpt: String },

    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The dump's copies of deleted-but-open files add up to more than a snapshot may hold.
    #[error(
        "the sandbox's deleted but still open files take at least {bytes} bytes in the snapshot, more than the {limit} a \
         snapshot may hold: close them (or end the processes holding them) and take it again"
    )]
    GhostsTooLarge { bytes: u64, limit: u64 },

    /// A streamed dump's images could not all be kept.
    #[error("CRIU's images through the image streamer: {0}")]
    Streamer(#[from] crate::streamer::CaptureError),

    /// CRIU reported success but the restored tree is not what a sandbox must be.
    #[error("restored tree: {0}")]
    Restored(String),
}

pub type Result<T, E = CriuError> = std::result::Result<T, E>;

pub(crate) fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CriuError + 'a {
    move |source| CriuError::Io { what, path: path.to_path_buf(), source }
}

/// Lines CRIU logs as errors on every run on these hosts although nothing is wrong: CRIU
/// cannot raise its own fd limit without CAP_SYS_RESOURCE, probes iptables tools that are not
/// installed (nftables does the locking), and `ip` complains that lo already has its address.
const BENIGN: &[&str] = &[
    "RLIMIT_NOFILE",
    "tables-save",
    "tables-restore",
    "tables-legacy",
    "Address already assigned",
    "address already assigned",
];

/// How many lines the excerpt keeps.
const EXCERPT_LINES: usize = 12;

/// The part of a CRIU log worth showing: its last error and warning lines (without the
/// benign ones), or its last lines when it has none. `stderr` is CRIU's own stderr, used when
/// the log is empty or unreadable.
pub(crate) fn log_excerpt(log: &str, stderr: &str) -> String {
    let interesting = |l: &&str| (l.contains("Error") || l.contains("Warn")) && !BENIGN.iter().any(|b| l.contains(b));
    let errors: Vec<&str> = log.lines().filter(interesting).collect();
    let lines: Vec<&str> = if !errors.is_empty() {
        errors
    } else if !log.trim().is_empty() {
        log.lines().collect()
    } else {
        stderr.lines().filter(|l| !l.trim().is_empty()).collect()
    };
    let start = lines.len().saturating_sub(EXCERPT_LINES);
    let excerpt = lines[start..].iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n");
    if excerpt.is_empty() { "  (the log is empty)".to_string() } else { excerpt }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_prefers_errors_and_skips_benign_ones() {
        let log = "(0.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n\
                   (0.2) Dumping pid 5\n\
                   (0.3) Error (criu/sk-unix.c:351): unix: Unix socket 7 not found\n\
                   (0.4) Unfreezing tasks\n";
        let excerpt = log_excerpt(log, "");
        assert_eq!(excerpt, "  (0.3) Error (criu/sk-unix.c:351): unix: Unix socket 7 not found");
    }

    #[test]
    fn excerpt_falls_back_to_the_tail_then_to_stderr() {
        let log: String = (0..30).map(|i| format!("line {i}\n")).collect();
        let excerpt = log_excerpt(&log, "");
        assert!(excerpt.starts_with("  line 18") && excerpt.ends_with("line 29"), "{excerpt}");
        assert_eq!(log_excerpt("", "criu: bad option\n"), "  criu: bad option");
        assert_eq!(log_excerpt("", ""), "  (the log is empty)");
    }
}
