//! The exec, attach, signal and process-list conversations.
//!
//! Decisions (also documented in `space_proto::messages`):
//! - A program that cannot be executed does not fail the request: the reply is
//!   `Started{pid: 0}`, one stderr line `spaced: exec: <argv0>: <reason>` and
//!   `Exited{code: 127}` (not found) or `126` (any other exec failure), like a shell.
//!   This holds for detached execs too (there is nothing to attach to).
//! - A non-detached exec whose stream the client closes or resets before `Exited` is
//!   abandoned: its process group is SIGKILLed. Closing an attach stream only detaches.
//! - Stdin is written from the stream's reader; while the process does not read its
//!   stdin, later input frames (signals, resizes) wait behind the stdin data.

use std::io;
use std::sync::Arc;

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use space_proto::{DataChannel, ErrorKind, ExecInput, ExecSpec, ExitStatus, Frame, FramedStream, Reply};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::{describe, invalid, io_reply};
use crate::process::{self, Output, Process};
use crate::server::Agent;
use crate::spawn::{self, SpawnError};
use crate::wire;

type Sink = SplitSink<FramedStream, Frame>;

/// `Request::Exec`.
pub async fn exec(mut stream: FramedStream, agent: Arc<Agent>, spec: ExecSpec) {
    let reaper = agent.reaper.clone();
    let to_spawn = spec.clone();
    let spawned = match tokio::task::spawn_blocking(move || spawn::spawn(&reaper, &to_spawn)).await {
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
    if wire::send(&mut stream, &Reply::Started { pid }).await.is_err() {
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
    if wire::send(&mut stream, &Reply::Started { pid }).await.is_ok() {
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

/// Streams output to the client while its input goes to the process.
async fn relay(
    stream: FramedStream,
    process: Arc<Process>,
    history: Vec<Output>,
    rx: Option<mpsc::Receiver<Output>>,
    kill_on_abandon: bool,
) {
    let (mut sink, source) = stream.split();
    let mut input = tokio::spawn(read_input(source, process.clone()));
    let outcome = forward(&mut sink, history, rx, &mut input).await;
    input.abort();
    eprintln!("DBG {} relay outcome {}", process.pid, match &outcome { Outcome::Exited => "exited".to_string(), Outcome::Abandoned => "abandoned".into(), Outcome::Invalid(m) => m.clone() });
    match outcome {
        Outcome::Exited => {
            let _ = sink.close().await;
        }
        Outcome::Abandoned if kill_on_abandon => process.kill_group(),
        Outcome::Abandoned => {}
        Outcome::Invalid(message) => {
            if kill_on_abandon {
                process.kill_group();
            }
            if wire::send(&mut sink, &invalid(message)).await.is_ok() {
                let _ = sink.close().await;
            }
        }
    }
}

async fn forward(
    sink: &mut Sink,
    history: Vec<Output>,
    rx: Option<mpsc::Receiver<Output>>,
    input: &mut JoinHandle<Outcome>,
) -> Outcome {
    for out in history {
        if let Some(outcome) = send_output(sink, out).await {
            return outcome;
        }
    }
    let Some(mut rx) = rx else { return Outcome::Exited };
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(out) => if let Some(outcome) = send_output(sink, out).await {
                    return outcome;
                },
                // The supervisor always publishes `Exit` before letting go.
                None => return Outcome::Abandoned,
            },
            end = &mut *input => return end.unwrap_or(Outcome::Abandoned),
        }
    }
}

/// Sends one output item; `Some` when following ends (exit sent, or the client is gone).
async fn send_output(sink: &mut Sink, out: Output) -> Option<Outcome> {
    let sent = match out {
        Output::Stdout(data) => wire::send_data(sink, DataChannel::Stdout, data).await,
        Output::Stderr(data) => wire::send_data(sink, DataChannel::Stderr, data).await,
        Output::Exit(status) => {
            return Some(match wire::send(sink, &Reply::Exited { status }).await {
                Ok(()) => Outcome::Exited,
                Err(_) => Outcome::Abandoned,
            });
        }
    };
    sent.err().map(|_| Outcome::Abandoned)
}

/// Reads the client's frames until the stream ends: stdin data and [`ExecInput`]s.
async fn read_input(mut source: SplitStream<FramedStream>, process: Arc<Process>) -> Outcome {
    loop {
        let frame = match source.next().await {
            None => return Outcome::Abandoned,
            Some(Err(e)) => return Outcome::Invalid(e.to_string()),
            Some(Ok(frame)) => frame,
        };
        match frame {
            Frame::Data(DataChannel::Stdin, data) => {
                eprintln!("DBG {} stdin {}", process.pid, data.len());
                // EPIPE: the process closed its stdin; the data has nowhere to go.
                if let Err(e) = process.write_stdin(&data).await {
                    tracing::debug!(pid = process.pid, error = %e, "stdin write failed");
                }
            }
            Frame::Data(channel, _) => {
                return Outcome::Invalid(format!("unexpected {channel:?} data on an exec stream"));
            }
            Frame::Message(_) => match frame.parse::<ExecInput>() {
                Ok(input) => { eprintln!("DBG {} input {:?}", process.pid, input); apply_input(&process, input).await },
                Err(e) => return Outcome::Invalid(e.to_string()),
            },
        }
    }
}

/// Signals and resizes that fail (process gone, no terminal) are ignored: the stream
/// carries no replies for them, and `Exited` tells the client what happened.
async fn apply_input(process: &Process, input: ExecInput) {
    let result = match input {
        ExecInput::Eof => process.close_stdin().await.map_err(|e| io_reply("stdin", &e)),
        ExecInput::Signal { signal } => process.signal(signal),
        ExecInput::Resize(size) => process.resize(size),
    };
    if let Err(reply) = result {
        tracing::debug!(pid = process.pid, ?reply, "exec input not applied");
    }
}
