//! `spaced`: the agent that runs as pid 1 of every sandbox and serves the spaced protocol
//! ([`space_proto`]) to the node.
//!
//! Layout:
//! - [`server`]: accept loop, handshake, per-stream dispatch, shutdown;
//! - [`reaper`]: init duties (reaps every child, hands exit statuses to their owners);
//! - [`spawn`] and [`pty`]: starting a process (credentials, process group, terminal);
//! - [`process`]: the process table, output fan-out and ring buffers, supervision;
//! - [`exec`]: the exec / attach / signal / list conversations;
//! - [`files`] and [`watch`]: file operations and inotify;
//! - [`guest`]: what pid 1 of a `vm` sandbox does after a restore (fresh entropy, clock);
//! - [`fdio`]: non-blocking reads and writes on raw pipe and terminal descriptors.
//!
//! Everything the peer sends is untrusted: a malformed stream is answered with
//! `Reply::Error` and closed; the daemon itself never stops because of it.

pub mod error;
pub mod exec;
pub mod fdio;
pub mod files;
pub mod guest;
pub mod process;
pub mod pty;
pub mod reaper;
pub mod server;
pub mod spawn;
pub mod watch;
mod wire;

use std::os::unix::net::UnixListener;
use std::path::Path;

pub use error::SpacedError;

/// The name this agent announces in the handshake.
pub fn agent_name() -> String {
    format!("spaced/{}", env!("CARGO_PKG_VERSION"))
}

/// Binds a fresh unix socket for `spaced serve` (host testing, no sandboxing).
///
/// A stale socket file left by an earlier run is replaced; any other file is an error.
pub fn bind(path: &Path) -> Result<UnixListener, SpacedError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
    {
        std::fs::remove_file(path).map_err(|e| SpacedError::Bind(path.display().to_string(), e))?;
    }
    UnixListener::bind(path).map_err(|e| SpacedError::Bind(path.display().to_string(), e))
}

/// How the daemon runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// pid 1 of a sandbox. No SIGTERM/SIGINT handlers: the kernel then drops those
    /// signals for a namespace's init, so nothing inside the sandbox can stop it; the
    /// node ends a sandbox with SIGKILL.
    Init,
    /// On the host (tests): SIGTERM or SIGINT kill every process group spaced started,
    /// then [`run`] returns.
    Serve,
}

/// Runs the server on `listener`. Builds its own tokio runtime, so call it from a plain
/// thread (in `spaced init`: after the sandbox is set up, because namespaces can only be
/// entered while the process is single-threaded).
///
/// One thread serves everything (its work is relaying bytes); blocking file work goes to
/// threads that end after a second idle. Every thread of pid 1 is one more that CRIU seizes,
/// dumps and re-creates: with two workers and a lingering blocking thread, restoring an idle
/// sandbox took ~19 ms longer (126 vs 107 ms p50), and exec round trips were no faster.
pub fn run(listener: UnixListener, mode: Mode) -> Result<(), SpacedError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(32)
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .thread_name("spaced")
        .enable_all()
        .build()
        .map_err(SpacedError::Runtime)?;
    runtime.block_on(server::run(listener, mode))
}

/// Locks a std mutex, ignoring poisoning: every critical section in spaced leaves the data
/// consistent, and a panicked task must not take the daemon down with it.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
