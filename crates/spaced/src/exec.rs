//! The exec, attach, signal and process-list conversations.
//!
//! Decisions (also documented in `space_proto::messages`):
//! - A program that cannot be executed does not fail the request: the reply is
//!   `Started{pid: 0}`, one stderr line `spaced: exec: <argv0>: <reason>` and
//!   `Exited{code: 127}` (not found) or `126` (any other exec failure), like a shell.
//!   This holds for detached execs too (there is nothing to attach to).
//! - A non-detached exec whose stream the client closes or resets before `Exited` is
//!   abandoned: its process group is SIGKILLed. Closing an attach stream only detaches.
//! - Stdin is written by a task of its own. While the process does not read its stdin,
//!   later input frames (signals, resizes) wait behind the queued stdin data; use
//!   `Request::Signal` on another stream to interrupt such a process.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use space_proto::{
    DataChannel, ErrorKind, ExecInput, ExecSpec, ExitStatus, Frame, FrameReceiver, FrameSender, FramedStream,
    OnSendersDropped, Reply,
};
use tokio::sync::mpsc;

use crate::error::{describe, invalid, io_reply};
use crate::process::{self, Output, Process};
use crate::server::Agent;
use crate::spawn::{self, SpawnError};
use crate::wire;

/// `Request::Exec`.
pub async fn exec(mut stream: FramedStream, agent: Arc<Agent>, spec: ExecSpec) {
    let reaper = agent.reaper.clone();
    let to_spawn = spec.clone();
    let spawning = tokio::task::spawn_blocking(move || spawn::spawn(&reaper, &to_spawn));
    let spawned = match spawning.await {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(SpawnError::Exec { program, source })) => {
            return exec_failed(stream, &program, &source).await;
        }
        Ok(Err(e)) => return wire::finish(stream, spawn_error_reply(&e)).await,
        Err(e) => return wire::finish(stream, Reply::error(ErrorKind::Other, e.to_string())).await,
    };
    let pid = spawned.pid;
    let (process, rx) = match process::start(&agent.table, spawned, &spec, !spec.detached) {
        Ok(started) => started,
        Err(e) => {
            // Nobody could supervise it: do not leave it running.
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            return wire::finish(stream, io_reply("exec", &e)).await;
        }
    };
    let started = wire::send(&mut stream, &Reply::Started { pid }).await;
    if started.is_err() {
        if !spec.detached {
            process.kill_group();
        }
        return;
    }
    if spec.detached {
        return wire::close(stream).await;
    }
    relay(stream, process, Vec::new(), rx, true).await;
}

fn spawn_error_reply(err: &SpawnError) -> Reply {
    match err {
        SpawnError::Invalid(message) => invalid(message.clone()),
        SpawnError::Cwd { path, source } => io_reply(&format!("cwd {path}"), source),
        SpawnError::Setup(source) => io_reply("exec setup", source),
        SpawnError::Exec { program, source } => io_reply(&format!("exec {program}"), source),
    }
}

/// The reply to a program that could not be executed (see the module docs).
async fn exec_failed(mut stream: FramedStream, program: &str, err: &io::Error) {
    let line = format!("spaced: exec: {program}: {}\n", describe(err));
    let code = spawn::exec_failure_code(err);
    let status = ExitStatus { code: Some(code), signal: None, timed_out: false };
    let sent = async {
        wire::send(&mut stream, &Reply::Started { pid: 0 }).await?;
        wire::send_data(&mut stream, DataChannel::Stderr, line.into()).await?;
        wire::send(&mut stream, &Reply::Exited { status }).await
    };
    if sent.await.is_ok() {
        wire::close(stream).await;
    }
}

/// `Request::Attach`: `Started{pid}`, buffered output, live output, `Exited`.
pub async fn attach(mut stream: FramedStream, agent: Arc<Agent>, pid: u32) {
    let Some(process) = agent.table.get(pid) else {
        return wire::finish(stream, process::no_such_process(pid)).await;
    };
    let (history, rx) = process.subscribe();
    let started = wire::send(&mut stream, &Reply::Started { pid }).await;
    if started.is_ok() {
        relay(stream, process, history, rx, false).await;
    }
}

/// `Request::Signal`.
pub fn signal(agent: &Agent, pid: u32, signal: i32) -> Reply {
    match agent.table.get(pid) {
        Some(process) => process.signal(signal).map(|()| Reply::Ok).unwrap_or_else(|e| e),
        None => process::no_such_process(pid),
    }
}

/// `Request::ListProcesses`.
pub fn list(agent: &Agent) -> Reply {
    Reply::Processes { processes: agent.table.list() }
}

/// How following a process ended.
enum Outcome {
    /// `Exited` was sent.
    Exited,
    /// The client closed or reset the stream, or stopped accepting frames.
    Abandoned,
    /// The client sent something invalid.
    Invalid(String),
}

/// Stdin operations, in order, for the stdin writer.
enum StdinOp {
    Data(Bytes),
    Eof,
}

/// Streams output to the client while its input goes to the process.
///
/// The stream is handed to a pump task ([`space_proto::duplex`]): it must never be read
/// and written from two tasks. Stdin is written by a task of its own, so that a process
/// which does not read its stdin cannot stop its output from being forwarded.
async fn relay(
    stream: FramedStream,
    process: Arc<Process>,
    history: Vec<Output>,
    rx: Option<mpsc::Receiver<Output>>,
    kill_on_abandon: bool,
) {
    let (tx, input) = space_proto::duplex(stream, OnSendersDropped::Close);
    let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_QUEUE);
    let stdin_writer = tokio::spawn(write_stdin(process.clone(), stdin_rx));
    let outcome = forward(&tx, history, rx, input, &process, stdin_tx).await;
    stdin_writer.abort();
    match outcome {
        Outcome::Exited => {}
        Outcome::Abandoned if kill_on_abandon => process.kill_group(),
        Outcome::Abandoned => {}
        Outcome::Invalid(message) => {
            if kill_on_abandon {
                process.kill_group();
            }
            if let Ok(frame) = Frame::message(&invalid(message)) {
                let _ = tx.send(frame).await;
            }
        }
    }
    // Dropping `tx` makes the pump close our side once everything queued is sent.
}

/// Stdin chunks queued for the writer (each at most 1 MiB).
const STDIN_QUEUE: usize = 4;

async fn forward(
    tx: &FrameSender,
    history: Vec<Output>,
    rx: Option<mpsc::Receiver<Output>>,
    mut input: FrameReceiver,
    process: &Process,
    stdin: mpsc::Sender<StdinOp>,
) -> Outcome {
    for out in history {
        if let Some(outcome) = send_output(tx, out).await {
            return outcome;
        }
    }
    let Some(mut rx) = rx else {
        return Outcome::Exited;
    };
    // A stdin operation waiting for room in the writer's queue; input is not read meanwhile.
    let mut pending: Option<StdinOp> = None;
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(out) => if let Some(outcome) = send_output(tx, out).await {
                    return outcome;
                },
                // The supervisor always publishes `Exit` before letting go.
                None => return Outcome::Abandoned,
            },
            permit = stdin.reserve(), if pending.is_some() => {
                if let (Ok(permit), Some(op)) = (permit, pending.take()) {
                    permit.send(op);
                }
            },
            frame = input.recv(), if pending.is_none() => match frame {
                None => return Outcome::Abandoned,
                Some(Err(e)) => return Outcome::Invalid(e.to_string()),
                Some(Ok(frame)) => match read_input(frame, process).await {
                    Ok(op) => pending = op,
                    Err(message) => return Outcome::Invalid(message),
                },
            },
        }
    }
}

/// Sends one output item; `Some` when following ends (exit sent, or the client is gone).
async fn send_output(tx: &FrameSender, out: Output) -> Option<Outcome> {
    let (frame, exit) = match out {
        Output::Stdout(data) => (Frame::Data(DataChannel::Stdout, data), false),
        Output::Stderr(data) => (Frame::Data(DataChannel::Stderr, data), false),
        Output::Exit(status) => match Frame::message(&Reply::Exited { status }) {
            Ok(frame) => (frame, true),
            Err(_) => return Some(Outcome::Abandoned),
        },
    };
    match tx.send(frame).await {
        Err(_) => Some(Outcome::Abandoned),
        Ok(()) if exit => Some(Outcome::Exited),
        Ok(()) => None,
    }
}

/// One client frame: stdin data and EOF are returned for the stdin writer; signals and
/// resizes are applied at once. Failed signals and resizes (process gone, no terminal)
/// are ignored: the stream carries no replies for them, and `Exited` tells the rest.
async fn read_input(frame: Frame, process: &Process) -> Result<Option<StdinOp>, String> {
    let input = match frame {
        Frame::Data(DataChannel::Stdin, data) => return Ok(Some(StdinOp::Data(data))),
        Frame::Data(channel, _) => {
            return Err(format!("unexpected {channel:?} data on an exec stream"));
        }
        Frame::Message(_) => frame.parse::<ExecInput>().map_err(|e| e.to_string())?,
    };
    let result = match input {
        ExecInput::Eof => return Ok(Some(StdinOp::Eof)),
        ExecInput::Signal { signal } => process.signal(signal),
        ExecInput::Resize(size) => process.resize(size),
    };
    if let Err(reply) = result {
        tracing::debug!(pid = process.pid, ?reply, "exec input not applied");
    }
    Ok(None)
}

/// Feeds stdin in order. Write errors (EPIPE: the process closed its stdin) drop the data.
async fn write_stdin(process: Arc<Process>, mut ops: mpsc::Receiver<StdinOp>) {
    while let Some(op) = ops.recv().await {
        let result = match op {
            StdinOp::Data(data) => process.write_stdin(&data).await,
            StdinOp::Eof => process.close_stdin().await,
        };
        if let Err(e) = result {
            tracing::debug!(pid = process.pid, error = %e, "stdin write failed");
        }
    }
}
