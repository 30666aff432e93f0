//! Spawning `spaced init` and driving the node's side of the sync protocol
//! ([`space_sandbox_init::sync`]).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream as StdUnixStream};
use std::path::Path;

use nix::sys::wait::WaitStatus;
use space_runtime::RuntimeError;
use space_sandbox_init::sync::{self, FromInit, MAX_LINE, ToInit};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::process;
use crate::spawn::{self, Child};

const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn start_err(what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Start(what.to_string())
}

/// The sandbox's pid 1 as the host sees it, pinned by a pidfd.
#[derive(Debug)]
pub(crate) struct Pid1 {
    pub pid: u32,
    pub pidfd: OwnedFd,
}

/// A `spaced init` being started.
pub(crate) struct Boot {
    child: Child,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// Set as soon as the bootstrap reports it, so a failed start can still kill and reap it.
    pub pid1: Option<Pid1>,
    pub warnings: Vec<String>,
}

impl Boot {
    /// Binds the sandbox's socket at `socket` and starts `spaced init` with the sync channel
    /// at fd 3, the listener at fd 4 and `root` (a detached mount of the sandbox's root) at fd 5.
    pub fn spawn(spaced: &Path, socket: &Path, root: BorrowedFd<'_>) -> Result<Boot, RuntimeError> {
        let listener = bind_listener(socket)?;
        let (ours, theirs) = StdUnixStream::pair().map_err(|e| start_err(format!("socketpair: {e}")))?;
        let child = spawn::spawn_init(spaced, theirs.as_fd(), listener.as_fd(), root, &init_env())
            .map_err(|e| start_err(format!("spawn {} init: {e}", spaced.display())))?;
        // Our copies must go: EOF on the channel then means every init process is gone, and a
        // connection to the socket only ever reaches spaced.
        drop((theirs, listener));
        ours.set_nonblocking(true).map_err(|e| start_err(format!("sync channel: {e}")))?;
        let stream = UnixStream::from_std(ours).map_err(|e| start_err(format!("sync channel: {e}")))?;
        let (read, writer) = stream.into_split();
        Ok(Boot { child, reader: BufReader::new(read), writer, pid1: None, warnings: Vec::new() })
    }

    pub fn bootstrap_pid(&self) -> u32 {
        self.child.pid()
    }

    pub async fn send(&mut self, msg: &ToInit) -> Result<(), RuntimeError> {
        let mut line = Vec::new();
        sync::send(&mut line, msg).map_err(|e| start_err(format!("encode {msg:?}: {e}")))?;
        self.writer.write_all(&line).await.map_err(|e| start_err(format!("sync channel write: {e}")))
    }

    async fn recv(&mut self) -> Result<FromInit, RuntimeError> {
        let mut line = Vec::new();
        let limit = MAX_LINE as u64 + 1;
        let n = (&mut self.reader).take(limit).read_until(b'\n', &mut line).await;
        match n.map_err(|e| start_err(format!("sync channel read: {e}")))? {
            0 => Err(self.closed_early().await),
            _ => match sync::parse_line(&line).map_err(|e| start_err(format!("bad sync message: {e}")))? {
                FromInit::Error { message } => Err(start_err(format!("spaced init: {message}"))),
                msg => Ok(msg),
            },
        }
    }

    async fn closed_early(&mut self) -> RuntimeError {
        let status = match tokio::time::timeout(std::time::Duration::from_millis(200), self.child.wait()).await {
            Ok(Ok(status)) => format!("{status:?}"),
            _ => "still running".to_string(),
        };
        start_err(format!("spaced init closed the sync channel before the sandbox was ready (bootstrap: {status})"))
    }

    pub async fn expect_user_ns(&mut self) -> Result<(), RuntimeError> {
        match self.recv().await? {
            FromInit::UserNs => Ok(()),
            other => Err(start_err(format!("expected user_ns from spaced init, got {other:?}"))),
        }
    }

    /// Waits for both the child's host pid (from the bootstrap) and `Ready` (from pid 1), in
    /// either order, then for the bootstrap to exit.
    pub async fn wait_ready(&mut self) -> Result<(), RuntimeError> {
        let mut ready = false;
        while !ready || self.pid1.is_none() {
            match self.recv().await? {
                FromInit::Child { host_pid } if self.pid1.is_none() => {
                    // The bootstrap has not been reaped, so the pid cannot have been reused.
                    let pidfd =
                        process::pidfd_open(host_pid).map_err(|e| start_err(format!("pidfd_open({host_pid}): {e}")))?;
                    self.pid1 = Some(Pid1 { pid: host_pid, pidfd });
                }
                FromInit::Ready { warnings } if !ready => {
                    ready = true;
                    self.warnings = warnings;
                }
                other => {
                    return Err(start_err(format!("unexpected message from spaced init: {other:?}")));
                }
            }
        }
        match self.child.wait().await.map_err(|e| start_err(format!("wait for bootstrap: {e}")))? {
            WaitStatus::Exited(_, 0) => Ok(()),
            status => Err(start_err(format!("spaced init bootstrap ended with {status:?}"))),
        }
    }

    /// Kills and reaps the bootstrap process if it is still there.
    pub async fn abort(&mut self) {
        self.child.kill();
        let _ = self.child.wait().await;
    }
}

impl Drop for Boot {
    /// Only a cancelled start gets here with pid 1 still set: kill it (and with it the whole
    /// sandbox pid namespace) and reap it, so no untracked zombie stays behind. The cgroups
    /// and socket remain for `destroy`, which `list` reports them to.
    fn drop(&mut self) {
        if let Some(pid1) = self.pid1.take() {
            let _ = process::pidfd_signal(&pid1.pidfd, libc::SIGKILL);
            for _ in 0..100 {
                if process::has_exited(&pid1.pidfd) {
                    process::reap(&pid1.pidfd);
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

/// Binds a fresh listening socket at `path` (a stale one is removed first), mode 0600.
fn bind_listener(path: &Path) -> Result<UnixListener, RuntimeError> {
    let io_err = |source: io::Error| RuntimeError::Io { path: path.to_path_buf(), source };
    if path.as_os_str().len() >= 108 {
        return Err(start_err(format!("socket path {} is too long for a unix socket", path.display())));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(e)),
        _ => {}
    }
    let listener = UnixListener::bind(path).map_err(io_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err)?;
    Ok(listener)
}

/// The environment of `spaced init`: a fixed PATH, and the node's log filter if it has one.
fn init_env() -> Vec<(String, String)> {
    let mut env = vec![("PATH".to_string(), SANDBOX_PATH.to_string())];
    if let Ok(filter) = std::env::var("RUST_LOG") {
        env.push(("RUST_LOG".to_string(), filter));
    }
    env
}
