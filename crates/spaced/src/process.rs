//! The process table and per-process supervision.
//!
//! Each process has one supervisor task that owns its output descriptors: it reads
//! stdout/stderr (or the terminal), appends to the ring buffers of detached processes and
//! fans chunks out to the streams following the process (the exec stream, attach streams).
//! Subscribers are bounded channels: a slow reader slows the process down (its pipe fills)
//! instead of growing memory.
//!
//! The exec ends when the main process exits, not when its output reaches EOF (a
//! background child may hold the pipes forever): once the exit status arrives, whatever is
//! already in the pipes is drained without waiting and `Exit` is published. Later output of
//! background children is read and discarded until EOF, so they never get SIGPIPE.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use space_proto::{ErrorKind, ExecSpec, ExitStatus, ProcessInfo, PtySize, Reply};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, watch};

use crate::fdio::{self, Reader};
use crate::lock;
use crate::spawn::{ProcessIo, Spawned};

/// Output kept per channel of a detached process, for `Attach`.
pub const RING_CAPACITY: usize = 1024 * 1024;
/// Exited processes remembered for `ListProcesses` and `Attach`.
const MAX_EXITED: usize = 256;
/// Exited processes whose buffered output is kept (bounds memory to ~64 MiB).
const MAX_EXITED_WITH_OUTPUT: usize = 32;
/// Chunks in flight per subscriber.
const SUBSCRIBER_QUEUE: usize = 16;
/// Chunks read after exit without waiting (1 MiB, the largest pipe buffer by default).
const DRAIN_LIMIT: usize = 16;

/// What a process produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExitStatus),
}

/// The last `RING_CAPACITY` bytes of one channel.
#[derive(Default)]
struct Ring {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl Ring {
    fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        self.chunks.push_back(chunk);
        while self.len > RING_CAPACITY {
            let excess = self.len - RING_CAPACITY;
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if front.len() <= excess {
                self.len -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(excess);
                self.len -= excess;
            }
        }
    }
}

/// Our ends of the child's stdin and terminal. Released when the process exits, so that
/// remembered processes hold no descriptors. Writers clone an `Arc` out rather than hold
/// the lock while a write waits for the process to read.
#[derive(Default)]
struct Handles {
    /// Where stdin goes: the pipe, or the terminal master.
    stdin: Option<Arc<AsyncFd<OwnedFd>>>,
    /// The terminal master, for resizes and ^D.
    pty: Option<Arc<AsyncFd<OwnedFd>>>,
}

#[derive(Default)]
struct State {
    /// Ring buffers (stdout, stderr); only for detached processes.
    rings: Option<(Ring, Ring)>,
    exit: Option<ExitStatus>,
    timed_out: bool,
    subscribers: Vec<mpsc::Sender<Output>>,
}

/// One process started by spaced.
pub struct Process {
    pub pid: u32,
    argv: Vec<String>,
    tty: bool,
    detached: bool,
    state: Mutex<State>,
    handles: Mutex<Handles>,
    done: watch::Sender<bool>,
}

impl Process {
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            argv: self.argv.clone(),
            tty: self.tty,
            detached: self.detached,
            exit: lock(&self.state).exit,
        }
    }

    pub fn is_running(&self) -> bool {
        lock(&self.state).exit.is_none()
    }

    /// Follows the output: returns what is buffered (ending with `Exit` if the process is
    /// gone) and, if it still runs, a receiver for what comes next.
    pub fn subscribe(&self) -> (Vec<Output>, Option<mpsc::Receiver<Output>>) {
        let mut state = lock(&self.state);
        let mut history = Vec::new();
        if let Some((out, err)) = &state.rings {
            history.extend(out.chunks.iter().cloned().map(Output::Stdout));
            history.extend(err.chunks.iter().cloned().map(Output::Stderr));
        }
        if let Some(status) = state.exit {
            history.push(Output::Exit(status));
            return (history, None);
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        state.subscribers.push(tx);
        (history, Some(rx))
    }

    /// Records `out` and hands it to every subscriber, waiting for room in their queues.
    async fn publish(&self, out: Output) {
        let subscribers = {
            let mut state = lock(&self.state);
            match (&out, &mut state.rings) {
                (Output::Stdout(chunk), Some((ring, _))) => ring.push(chunk.clone()),
                (Output::Stderr(chunk), Some((_, ring))) => ring.push(chunk.clone()),
                _ => {}
            }
            if let Output::Exit(status) = out {
                state.exit = Some(status);
            }
            state.subscribers.retain(|s| !s.is_closed());
            state.subscribers.clone()
        };
        for subscriber in subscribers {
            // A closed subscriber is pruned on the next publish.
            let _ = subscriber.send(out.clone()).await;
        }
        if matches!(out, Output::Exit(_)) {
            lock(&self.state).subscribers.clear();
        }
    }

    /// Writes to stdin. Without stdin (or after EOF, or exit) the data is dropped.
    pub async fn write_stdin(&self, data: &[u8]) -> io::Result<()> {
        let stdin = lock(&self.handles).stdin.clone();
        match stdin {
            Some(fd) => fdio::write_all(&fd, data).await,
            None => Ok(()),
        }
    }

    /// Ends stdin: closes the pipe (once in-flight writes finish), or types ^D on a
    /// terminal (EOF for a reader in canonical mode at the start of a line).
    pub async fn close_stdin(&self) -> io::Result<()> {
        let pty = {
            let mut handles = lock(&self.handles);
            if handles.pty.is_none() {
                handles.stdin = None;
            }
            handles.pty.clone()
        };
        match pty {
            Some(master) => fdio::write_all(&master, b"\x04").await,
            None => Ok(()),
        }
    }

    pub fn resize(&self, size: PtySize) -> Result<(), Reply> {
        let pty = lock(&self.handles).pty.clone();
        match pty {
            Some(master) => {
                crate::pty::resize(master.get_ref(), size).map_err(|e| crate::error::io_reply("resize", &e))
            }
            None => Err(Reply::error(ErrorKind::InvalidInput, "the process has no terminal")),
        }
    }

    /// Sends `signal` to the process itself (not its group), like E2B's envd.
    pub fn signal(&self, signal: i32) -> Result<(), Reply> {
        let sig = Signal::try_from(signal)
            .map_err(|_| Reply::error(ErrorKind::InvalidInput, format!("invalid signal {signal}")))?;
        // The exit is recorded right after the reaper collects the pid; a reuse of the pid
        // inside that window would need the whole pid space to wrap around.
        let state = lock(&self.state);
        if state.exit.is_some() {
            return Err(no_such_process(self.pid));
        }
        kill(Pid::from_raw(self.pid as i32), sig).map_err(|e| crate::error::io_reply("kill", &e.into()))
    }

    /// SIGKILLs the process group while the leader runs (abandoned exec).
    pub fn kill_group(&self) {
        let state = lock(&self.state);
        if state.exit.is_none() {
            let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        }
    }

    /// SIGKILLs the process group even after the leader exited: background children the
    /// command left behind are still in it (at shutdown). While a group has members its
    /// id cannot be reused by a new process.
    pub fn kill_group_and_stragglers(&self) {
        let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
    }

    fn expire(&self) {
        let mut state = lock(&self.state);
        if state.exit.is_none() {
            state.timed_out = true;
            let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        }
    }

    async fn wait_done(&self) {
        let mut rx = self.done.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }
}

pub fn no_such_process(pid: u32) -> Reply {
    Reply::error(ErrorKind::NoSuchProcess, format!("no process {pid} started by spaced"))
}

#[derive(Default)]
struct TableInner {
    procs: HashMap<u32, Arc<Process>>,
    /// Exited pids, oldest first.
    exited: VecDeque<u32>,
}

/// All processes spaced started, running and recently exited.
#[derive(Default)]
pub struct ProcessTable {
    inner: Mutex<TableInner>,
}

impl ProcessTable {
    pub fn get(&self, pid: u32) -> Option<Arc<Process>> {
        lock(&self.inner).procs.get(&pid).cloned()
    }

    /// Running and remembered processes, by pid.
    pub fn list(&self) -> Vec<ProcessInfo> {
        let mut list: Vec<_> = lock(&self.inner).procs.values().map(|p| p.info()).collect();
        list.sort_by_key(|p| p.pid);
        list
    }

    /// Running and remembered processes.
    pub fn all(&self) -> Vec<Arc<Process>> {
        lock(&self.inner).procs.values().cloned().collect()
    }

    pub fn running(&self) -> Vec<Arc<Process>> {
        lock(&self.inner).procs.values().filter(|p| p.is_running()).cloned().collect()
    }

    fn insert(&self, process: Arc<Process>) {
        let mut inner = lock(&self.inner);
        // A reused pid replaces the remembered entry of the old process.
        inner.exited.retain(|p| *p != process.pid);
        inner.procs.insert(process.pid, process);
    }

    /// Forgets every exited process.
    pub fn forget_exited(&self) {
        let mut inner = lock(&self.inner);
        let TableInner { procs, exited } = &mut *inner;
        for pid in exited.drain(..) {
            procs.remove(&pid);
        }
    }

    /// Remembers an exit and forgets the oldest exited entries beyond the bounds.
    fn exited(&self, pid: u32) {
        let mut inner = lock(&self.inner);
        inner.exited.push_back(pid);
        while inner.exited.len() > MAX_EXITED {
            if let Some(old) = inner.exited.pop_front() {
                inner.procs.remove(&old);
            }
        }
        let keep_from = inner.exited.len().saturating_sub(MAX_EXITED_WITH_OUTPUT);
        if let Some(old) = keep_from.checked_sub(1).and_then(|i| inner.exited.get(i).copied())
            && let Some(p) = inner.procs.get(&old)
        {
            lock(&p.state).rings = None;
        }
    }
}

/// Registers a freshly spawned process and starts its supervisor. With `follow`, the
/// caller is subscribed before any output is read, so nothing is missed.
pub fn start(
    table: &Arc<ProcessTable>,
    spawned: Spawned,
    spec: &ExecSpec,
    follow: bool,
) -> io::Result<(Arc<Process>, Option<mpsc::Receiver<Output>>)> {
    let (handles, stdout, stderr) = match spawned.io {
        ProcessIo::Pipes { stdin, stdout, stderr } => {
            let stdin = stdin.map(fdio::async_fd).transpose()?.map(Arc::new);
            let (out, err) = (fdio::async_fd(stdout)?, fdio::async_fd(stderr)?);
            let handles = Handles { stdin, pty: None };
            (handles, Reader::new(out), Some(Reader::new(err)))
        }
        ProcessIo::Pty { master } => {
            let master = Arc::new(fdio::async_fd(master)?);
            let handles = Handles { stdin: Some(master.clone()), pty: Some(master.clone()) };
            (handles, Reader::shared(master), None)
        }
    };
    let process = Arc::new(Process {
        pid: spawned.pid,
        argv: spec.argv.clone(),
        tty: spec.tty.is_some(),
        detached: spec.detached,
        state: Mutex::new(State { rings: spec.detached.then(Default::default), ..Default::default() }),
        handles: Mutex::new(handles),
        done: watch::channel(false).0,
    });
    let rx = if follow { process.subscribe().1 } else { None };
    table.insert(process.clone());
    if let Some(ms) = spec.timeout_ms {
        tokio::spawn(enforce_timeout(process.clone(), Duration::from_millis(ms)));
    }
    tokio::spawn(supervise(table.clone(), process.clone(), stdout, stderr, spawned.exit));
    Ok((process, rx))
}

async fn enforce_timeout(process: Arc<Process>, after: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(after) => process.expire(),
        _ = process.wait_done() => {}
    }
}

async fn read_opt(reader: &mut Option<Reader>) -> Option<Bytes> {
    match reader {
        Some(r) => r.read().await.ok().flatten(),
        None => std::future::pending().await,
    }
}

async fn supervise(
    table: Arc<ProcessTable>,
    process: Arc<Process>,
    stdout: Reader,
    stderr: Option<Reader>,
    mut exit: oneshot::Receiver<ExitStatus>,
) {
    let (mut out, mut err) = (Some(stdout), stderr);
    let status = loop {
        tokio::select! {
            chunk = read_opt(&mut out) => match chunk {
                Some(chunk) => process.publish(Output::Stdout(chunk)).await,
                None => out = None,
            },
            chunk = read_opt(&mut err) => match chunk {
                Some(chunk) => process.publish(Output::Stderr(chunk)).await,
                None => err = None,
            },
            status = &mut exit => break status.unwrap_or_default(),
        }
    };
    drain(&process, out.as_mut(), Output::Stdout).await;
    drain(&process, err.as_mut(), Output::Stderr).await;
    let timed_out = lock(&process.state).timed_out;
    process.publish(Output::Exit(ExitStatus { timed_out, ..status })).await;
    process.done.send_replace(true);
    *lock(&process.handles) = Handles::default();
    table.exited(process.pid);
    discard_until_eof(out, err).await;
}

/// Publishes what is already in a pipe at exit, without waiting for more.
async fn drain(process: &Process, reader: Option<&mut Reader>, output: fn(Bytes) -> Output) {
    let Some(reader) = reader else { return };
    for chunk in reader.drain_now(DRAIN_LIMIT) {
        process.publish(output(chunk)).await;
    }
}

/// Keeps reading what background children write after the exec ended, so that they do
/// not die of SIGPIPE; stops at EOF (every writer closed).
async fn discard_until_eof(mut out: Option<Reader>, mut err: Option<Reader>) {
    while out.is_some() || err.is_some() {
        tokio::select! {
            chunk = read_opt(&mut out) => if chunk.is_none() { out = None },
            chunk = read_opt(&mut err) => if chunk.is_none() { err = None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_tail() {
        let mut ring = Ring::default();
        ring.push(Bytes::from(vec![1u8; RING_CAPACITY - 10]));
        ring.push(Bytes::from(vec![2u8; 30]));
        assert_eq!(ring.len, RING_CAPACITY);
        let total: usize = ring.chunks.iter().map(|c| c.len()).sum();
        assert_eq!(total, RING_CAPACITY);
        ring.push(Bytes::from(vec![3u8; RING_CAPACITY + 5]));
        assert_eq!(ring.chunks.len(), 1);
        assert_eq!(ring.len, RING_CAPACITY);
    }
}
