//! Accepts node connections and dispatches each stream's request.
//!
//! On a unix socket several connections may be open at once (the node reconnects after it
//! restarts); on a VM's virtio-serial port ([`crate::port`]) there is one at a time, one per
//! host connection. Processes belong to the agent, not to a connection, so they outlive
//! connections.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_proto::{FramedStream, Reply, Request};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};

use crate::error::{SpacedError, invalid};
use crate::port::Port;
use crate::process::ProcessTable;
use crate::reaper::Reaper;
use crate::{Mode, exec, files, watch, wire};

/// How long a fresh connection may take to send its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// State shared by every connection and stream.
pub struct Agent {
    pub reaper: Reaper,
    pub table: Arc<ProcessTable>,
    pub started: Instant,
}

impl Agent {
    pub fn new() -> Self {
        Agent { reaper: Reaper::new(), table: Arc::default(), started: Instant::now() }
    }

    fn health(&self) -> Reply {
        Reply::Health {
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            processes: u32::try_from(self.table.running().len()).unwrap_or(u32::MAX),
            features: vec![space_proto::file_metadata::FEATURE.to_owned()],
        }
    }

    /// SIGKILLs the process groups of every process spaced remembers, including what
    /// exited commands left running in the background.
    fn kill_all(&self) {
        for process in self.table.all() {
            process.kill_group_and_stragglers();
        }
    }
}

impl Default for Agent {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves connections accepted on `listener` forever ([`Mode::Init`]) or until SIGTERM/SIGINT
/// ([`Mode::Serve`]), then kills every process group spaced started and returns.
pub async fn run(listener: std::os::unix::net::UnixListener, mode: Mode) -> Result<(), SpacedError> {
    listener.set_nonblocking(true).map_err(SpacedError::Listener)?;
    let listener = UnixListener::from_std(listener).map_err(SpacedError::Listener)?;
    supervise(mode, |agent| async move {
        accept_loop(listener, agent).await;
        Ok(())
    })
    .await
}

/// Serves the host connections of a virtio-serial port, one after the other, like [`run`].
/// Returns an error only if the port itself fails.
pub async fn run_port(port: Port, mode: Mode) -> Result<(), SpacedError> {
    supervise(mode, |agent| port_loop(port, agent)).await
}

/// Runs `serve` beside the reaper until either ends or a shutdown signal comes.
async fn supervise<F, Fut>(mode: Mode, serve: F) -> Result<(), SpacedError>
where
    F: FnOnce(Arc<Agent>) -> Fut,
    Fut: Future<Output = Result<(), SpacedError>>,
{
    let agent = Arc::new(Agent::new());
    let reaper = tokio::spawn(agent.reaper.clone().run());
    let outcome = tokio::select! {
        result = serve(agent.clone()) => result,
        result = shutdown_signal(mode) => result,
        result = reaper => match result {
            Ok(Err(e)) => Err(SpacedError::Signals(e)),
            _ => {
                tracing::error!("reaper stopped");
                Ok(())
            }
        },
    };
    agent.kill_all();
    outcome
}

/// Resolves on SIGTERM or SIGINT in [`Mode::Serve`]; never in [`Mode::Init`].
async fn shutdown_signal(mode: Mode) -> Result<(), SpacedError> {
    if mode == Mode::Init {
        return std::future::pending().await;
    }
    let mut sigterm = signal(SignalKind::terminate()).map_err(SpacedError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(SpacedError::Signals)?;
    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = sigint.recv() => tracing::info!("SIGINT: shutting down"),
    }
    Ok(())
}

async fn accept_loop(listener: UnixListener, agent: Arc<Agent>) {
    loop {
        match listener.accept().await {
            Ok((conn, _addr)) => {
                tokio::spawn(connection(conn, agent.clone()));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// How a connection ended, as far as the byte stream is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The multiplexer closed in order: the node said goodbye, or its end of the stream ended.
    Clean,
    /// The handshake failed or timed out, or the node broke the protocol: the stream is in an
    /// unknown state.
    Broken,
}

/// One host connection after another.
///
/// A connection starts with the host's first bytes (the node always sends its hello first):
/// spaced's hello then goes to the host that is there, even if the hang-up of the previous
/// one went unseen (see [`crate::port`]).
///
/// A connection that breaks while the host stays connected is drained until the host hangs
/// up: the port has no way to close the host's end, and a new handshake in the middle of the
/// old byte stream would only fail again. One that ends cleanly is not drained: the node,
/// having said goodbye, sends nothing more, and what comes next belongs to its next
/// connection, which may come before the hang-up of this one is seen.
async fn port_loop(port: Port, agent: Arc<Agent>) -> Result<(), SpacedError> {
    loop {
        port.wait_connected().await.map_err(SpacedError::Port)?;
        let link = match port.link() {
            Ok(link) => link,
            // Out of descriptors, typically (a dup and a registration): what the sandbox does
            // to pid 1's limits must not end the agent, which would end the VM.
            Err(e) => {
                tracing::warn!(error = %e, "cannot set up a connection on the port");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !link.wait_for_data().await.map_err(SpacedError::Port)? {
            continue;
        }
        let ended = connection(link.clone(), agent.clone()).await;
        if ended == Ended::Broken && !link.hung_up() {
            tracing::info!("connection ended while the host stays connected: discarding its input until it hangs up");
            if let Err(e) = link.discard_until_hangup().await {
                tracing::warn!(error = %e, "reading the port failed");
                // Not a busy loop should the error persist.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection<T>(mut conn: T, agent: Arc<Agent>) -> Ended
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let name = crate::agent_name();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, space_proto::handshake(&mut conn, &name)).await {
        Ok(Ok(hello)) => {
            tracing::info!(peer = %hello.agent, "node connected");
            // A checkpoint, if one was allowed, is over once the node connects again.
            if let Err(e) = set_dumpable(false) {
                tracing::warn!(error = %e, "cannot make pid 1 non-dumpable");
            }
            end_tracing();
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "handshake failed");
            return Ended::Broken;
        }
        Err(_) => {
            tracing::warn!("handshake timed out");
            return Ended::Broken;
        }
    }
    match space_proto::serve(conn, move |stream| handle(stream, agent.clone())).await {
        Ok(()) => Ended::Clean,
        Err(e) => {
            tracing::info!(error = %e, "connection ended");
            Ended::Broken
        }
    }
}

/// Whether sandbox processes may ptrace pid 1, read its memory and take its descriptors (with
/// `pidfd_getfd`): only while CRIU checkpoints it. Sandbox root has pid 1's uid, so only the
/// dumpable flag stands between them; it is cleared at every node connection, and `exec`
/// gives every process pid 1 starts a flag of its own again.
fn set_dumpable(dumpable: bool) -> nix::Result<()> {
    nix::sys::prctl::set_dumpable(dumpable)
}

/// Kills whatever traces pid 1: clearing the dumpable flag stops new attaches, not one made
/// while it was set (during a checkpoint, by a sandbox process; CRIU has detached by the time
/// the node connects again). Killing the tracer detaches it.
fn end_tracing() {
    let Ok(threads) = std::fs::read_dir("/proc/self/task") else { return };
    for thread in threads.filter_map(|t| t.ok()) {
        let status = std::fs::read_to_string(thread.path().join("status")).unwrap_or_default();
        let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).and_then(|p| p.trim().parse().ok());
        if let Some(tracer) = tracer.filter(|p: &i32| *p > 0) {
            tracing::warn!(tracer, "a process traced pid 1 during a checkpoint; killing it");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(tracer), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// One stream: the first frame is the request.
async fn handle(mut stream: FramedStream, agent: Arc<Agent>) {
    let request = match space_proto::next_frame(&mut stream).await {
        Ok(Some(frame)) => frame.parse::<Request>(),
        Ok(None) => return,
        Err(e) => return wire::finish(stream, invalid(e.to_string())).await,
    };
    match request {
        Ok(request) => dispatch(stream, agent, request).await,
        Err(e) => wire::finish(stream, invalid(format!("bad request: {e}"))).await,
    }
}

async fn dispatch(stream: FramedStream, agent: Arc<Agent>, request: Request) {
    let reply = match request {
        Request::Exec(spec) => return exec::exec(stream, agent, spec).await,
        Request::Attach { pid } => return exec::attach(stream, agent, pid).await,
        Request::ReadFile { path } => return files::read_file(stream, path).await,
        Request::WriteFile { path, mode, metadata } => return files::write_file(stream, path, mode, metadata).await,
        Request::Watch { path, recursive } => return watch::watch(stream, path, recursive).await,
        Request::Health => agent.health(),
        Request::Signal { pid, signal } => exec::signal(&agent, pid, signal),
        Request::ListProcesses => exec::list(&agent),
        Request::ForgetExited => {
            agent.table.forget_exited();
            Reply::Ok
        }
        Request::AllowCheckpoint => match set_dumpable(true) {
            Ok(()) => Reply::Ok,
            Err(e) => Reply::error(space_proto::ErrorKind::Other, format!("PR_SET_DUMPABLE: {e}")),
        },
        Request::Stat { path } => files::stat(path).await,
        Request::ListDir { path } => files::list_dir(path).await,
        Request::MakeDir { path } => files::make_dir(path).await,
        Request::Move { from, to } => files::move_path(from, to).await,
        Request::Remove { path, recursive } => files::remove(path, recursive).await,
        Request::FreezeRoot { frozen } => crate::freeze::freeze_root(frozen).await,
        Request::Reseed { entropy, unix_time_ns, hostname, machine_id } => {
            crate::guest::reseed_reply(&entropy, unix_time_ns, hostname.as_deref(), machine_id.as_deref())
        }
    };
    finish(stream, reply).await;
}

/// Sends a single reply; one too large to encode (a huge directory listing) becomes an
/// error reply instead of a silently dropped stream.
async fn finish(mut stream: FramedStream, reply: Reply) {
    match wire::send(&mut stream, &reply).await {
        Ok(()) => wire::close(stream).await,
        Err(space_proto::FrameError::TooLong { len, max }) => {
            let message = format!("reply of {len} bytes exceeds the frame limit of {max}");
            wire::finish(stream, Reply::error(space_proto::ErrorKind::Unsupported, message)).await
        }
        Err(_) => {}
    }
}
