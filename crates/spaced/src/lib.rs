//! `spaced`: the agent that runs as pid 1 of every sandbox and serves the spaced protocol
//! ([`space_proto`]) to the node.
//!
//! Layout:
//! - [`server`]: accept loop, handshake, per-stream dispatch, shutdown;
//! - [`port`]: the virtio-serial port that is the node's channel in a `vm` sandbox;
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
pub mod freeze;
pub mod guest;
mod metadata;
pub mod port;
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
    if mode == Mode::Init {
        spawn::load_defaults();
    }
    runtime()?.block_on(server::run(listener, mode))
}

/// `spaced guest --port NAME`: pid 1 of a `vm` sandbox, which the initramfs has set up (root
/// disk, mounts, network). Serves the node over the virtio-serial port named `port_name`,
/// waiting up to [`port::FIND_TIMEOUT`] for it to appear.
pub fn run_guest(port_name: &str) -> Result<(), SpacedError> {
    if !kernel_rng_ready() {
        // Not fatal: the kernel may still get there. But the multiplexer takes its connection
        // id from getrandom(2), so the first connection waits for it.
        eprintln!(
            "spaced: warning: the kernel's random number generator is not initialized; connections wait \
             until it is. Give the VM an entropy source: -device virtio-rng-device, or a CPU with RDRAND"
        );
    }
    spawn::load_defaults();
    let port = port::Port::open(Path::new(port::SYSFS_PORTS), Path::new(port::DEV), port_name, port::FIND_TIMEOUT)?;
    runtime()?.block_on(server::run_port(port, Mode::Init))
}

/// Whether getrandom(2) would return without blocking.
fn kernel_rng_ready() -> bool {
    let mut byte = [0u8; 1];
    // SAFETY: the buffer is valid for writes of its length for the duration of the call.
    let n = unsafe { libc::getrandom(byte.as_mut_ptr().cast(), byte.len(), libc::GRND_NONBLOCK) };
    n == 1
}

fn runtime() -> Result<tokio::runtime::Runtime, SpacedError> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(32)
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .thread_name("spaced")
        .enable_all()
        .build()
        .map_err(SpacedError::Runtime)
}

/// Locks a std mutex, ignoring poisoning: every critical section in spaced leaves the data
/// consistent, and a panicked task must not take the daemon down with it.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
