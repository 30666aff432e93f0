//! Running commands: a JSON form for short commands, WebSockets for streaming and terminals,
//! and the process table for background commands.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::Extension;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use bytes::Bytes;
use space_api::{
    ErrorBody, ErrorCode, ExecRequest, ExecResult, ExecStart, ProcessInfo, ProcessList, SignalRequest, WsClientMessage,
    WsServerMessage,
};
use space_proto::client::{AgentClient, ExecEvent, ExecInputHandle, ExecSession};
use space_proto::{ExecSpec, ExitStatus, PtySize};

use super::running_sandbox;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, AppError, AppResult};

/// Output kept per stream by the JSON form; the rest is dropped and `truncated` set.
const OUTPUT_CAP: usize = 16 << 20;
const MAX_ARGS: usize = 4096;

pub(crate) const CHANNEL_STDOUT: u8 = 1;
pub(crate) const CHANNEL_STDERR: u8 = 2;

fn check_command(cmd: &[String]) -> AppResult<()> {
    if cmd.is_empty() || cmd[0].is_empty() {
        return Err(AppError::bad_request("cmd must name a program, e.g. [\"ls\", \"-l\"]"));
    }
    if cmd.len() > MAX_ARGS || cmd.iter().any(|a| a.contains('\0')) {
        return Err(AppError::bad_request(format!("cmd must have at most {MAX_ARGS} arguments without NUL bytes")));
    }
    Ok(())
}

/// The gateway's settings (proxy, trust bundle), then the session's env, then the request's:
/// a later one wins, so a command may still opt out of the proxy.
fn merged_env(session: &BTreeMap<String, String>, request: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = space_gateway::sandbox_env();
    env.extend(session.iter().chain(request).map(|(k, v)| (k.clone(), v.clone())));
    env
}

fn oom_kills(state: &AppState, sandbox: &space_api::SandboxId) -> u64 {
    state.node.oom_kills(sandbox).unwrap_or(0)
}

/// Runs a command to completion and returns its exit status and output.
#[utoipa::path(post, path = "/v1/sessions/{id}/exec", params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 200, body = ExecResult), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn exec(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<ExecRequest>,
) -> AppResult<ApiJson<ExecResult>> {
    check_command(&request.cmd)?;
    let (session, sandbox) = running_sandbox(&state, &caller, &id).await?;
    let _busy = state.activity.busy(&session.id);
    let agent = state.node.agent(&sandbox).await?;
    let oom_before = oom_kills(&state, &sandbox);
    let spec = ExecSpec {
        argv: request.cmd,
        env: merged_env(&session.env, &request.env),
        cwd: request.cwd,
        uid: request.uid,
        gid: request.gid,
        tty: None,
        timeout_ms: request.timeout_ms,
        detached: request.background,
        stdin: request.stdin.is_some(),
    };
    let started = Instant::now();
    let mut process = agent.exec(spec).await?;
    let mut result = ExecResult { pid: process.pid(), ..ExecResult::default() };
    if request.background {
        return Ok(ApiJson(result));
    }
    if let Some(stdin) = request.stdin {
        let input = process.input();
        input.send_stdin(Bytes::from(stdin)).await?;
        input.close_stdin().await?;
    }
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = loop {
        match process.next_event().await? {
            Some(ExecEvent::Stdout(b)) => result.truncated |= append_capped(&mut stdout, &b),
            Some(ExecEvent::Stderr(b)) => result.truncated |= append_capped(&mut stderr, &b),
            Some(ExecEvent::Exit(status)) => break status,
            None => {
                return Err(AppError::new(
                    ErrorCode::SandboxUnavailable,
                    "the sandbox agent closed the command's stream before it exited",
                ));
            }
        }
    };
    result.exit_code = status.code;
    result.signal = status.signal;
    result.timed_out = status.timed_out;
    result.oom_killed = oom_kills(&state, &sandbox) > oom_before;
    result.stdout = String::from_utf8_lossy(&stdout).into_owned();
    result.stderr = String::from_utf8_lossy(&stderr).into_owned();
    result.duration_ms = started.elapsed().as_millis() as u64;
    Ok(ApiJson(result))
}

fn append_capped(buf: &mut Vec<u8>, bytes: &[u8]) -> bool {
    let room = OUTPUT_CAP.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() > room
}

/// Streams a command over a WebSocket: the first client message is an `ExecStart` (JSON text);
/// see `ExecStart` for the framing.
#[utoipa::path(get, path = "/v1/sessions/{id}/exec/ws", params(("id" = String, Path)),
    responses((status = 101, description = "WebSocket upgrade"), (status = 404, body = ErrorBody)))]
pub async fn exec_ws(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    upgrade: WebSocketUpgrade,
) -> AppResult<Response> {
    let (session, sandbox) = running_sandbox(&state, &caller, &id).await?;
    let agent = state.node.agent(&sandbox).await?;
    Ok(upgrade.on_upgrade(move |mut socket| async move {
        let _busy = state.activity.busy(&session.id);
        let started = match start_from_socket(&mut socket, &agent, &session.env).await {
            Ok(process) => process,
            Err(e) => return send_error(&mut socket, e).await,
        };
        let oom_before = oom_kills(&state, &sandbox);
        let status = bridge(&mut socket, started).await;
        if let Some(status) = status {
            let oom_killed = oom_kills(&state, &sandbox) > oom_before;
            let _ = send_json(&mut socket, &exit_message(status, oom_killed)).await;
        }
        close_gracefully(&mut socket).await;
    }))
}

async fn start_from_socket(
    socket: &mut WebSocket,
    agent: &AgentClient,
    session_env: &BTreeMap<String, String>,
) -> AppResult<ExecSession> {
    let start: ExecStart = match socket.recv().await {
        Some(Ok(Message::Text(text))) => serde_json::from_str(&text)
            .map_err(|e| AppError::bad_request(format!("the first message must be an ExecStart JSON object: {e}")))?,
        _ => return Err(AppError::bad_request("the first message must be an ExecStart JSON text frame")),
    };
    check_command(&start.cmd)?;
    let spec = ExecSpec {
        argv: start.cmd,
        env: merged_env(session_env, &start.env),
        cwd: start.cwd,
        uid: start.uid,
        gid: start.gid,
        tty: start.tty.map(|t| PtySize { rows: t.rows, cols: t.cols }),
        timeout_ms: start.timeout_ms,
        detached: false,
        stdin: start.stdin,
    };
    let process = agent.exec(spec).await?;
    send_json(socket, &WsServerMessage::Started { pid: process.pid() })
        .await
        .map_err(|_| AppError::bad_request("client went away"))?;
    Ok(process)
}

/// What the client sent, queued for the task that feeds the process.
enum ClientInput {
    Stdin(Bytes),
    Control(WsClientMessage),
}

/// Client input waiting for the process; when full, the socket is not read (backpressure).
const INPUT_QUEUE: usize = 64;

/// Copies between the WebSocket and the process until it exits (returns its status) or the
/// client goes away (returns `None`; dropping the stream makes spaced kill the process).
///
/// Input is fed by its own task: a process that is not reading stdin must not stop its output
/// from being forwarded (it would block on a full pipe, and never read stdin).
async fn bridge(socket: &mut WebSocket, mut process: ExecSession) -> Option<ExitStatus> {
    let (queue, pending) = tokio::sync::mpsc::channel(INPUT_QUEUE);
    tokio::spawn(feed_input(process.input(), pending));
    loop {
        tokio::select! {
            message = socket.recv(), if queue.capacity() > 0 => match message {
                Some(Ok(Message::Binary(bytes))) => { let _ = queue.try_send(ClientInput::Stdin(bytes)); }
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<WsClientMessage>(&text) {
                    Ok(control) => { let _ = queue.try_send(ClientInput::Control(control)); }
                    Err(e) => {
                        let error = AppError::bad_request(format!("unknown client message: {e}"));
                        let _ = send_json(socket, &error_message(&error)).await;
                    }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
            },
            event = process.next_event() => match event {
                Ok(Some(ExecEvent::Stdout(bytes))) => { if send_output(socket, CHANNEL_STDOUT, &bytes).await.is_err() { return None; } }
                Ok(Some(ExecEvent::Stderr(bytes))) => { if send_output(socket, CHANNEL_STDERR, &bytes).await.is_err() { return None; } }
                Ok(Some(ExecEvent::Exit(status))) => return Some(status),
                Ok(None) | Err(_) => {
                    let error = AppError::new(ErrorCode::SandboxUnavailable, "the sandbox agent closed the stream");
                    let _ = send_json(socket, &error_message(&error)).await;
                    return None;
                }
            },
        }
    }
}

async fn feed_input(input: ExecInputHandle, mut pending: tokio::sync::mpsc::Receiver<ClientInput>) {
    while let Some(item) = pending.recv().await {
        // A failed write (stdin already closed, process gone) must not drop later signals.
        let _ = match item {
            ClientInput::Stdin(bytes) => input.send_stdin(bytes).await,
            ClientInput::Control(WsClientMessage::Eof) => input.close_stdin().await,
            ClientInput::Control(WsClientMessage::Signal { signal }) => input.signal(signal).await,
            ClientInput::Control(WsClientMessage::Resize { rows, cols }) => input.resize(PtySize { rows, cols }).await,
        };
    }
}

async fn send_output(socket: &mut WebSocket, channel: u8, bytes: &[u8]) -> Result<(), axum::Error> {
    let mut frame = Vec::with_capacity(bytes.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(bytes);
    socket.send(Message::Binary(frame.into())).await
}

async fn send_json(socket: &mut WebSocket, message: &WsServerMessage) -> Result<(), axum::Error> {
    let text = serde_json::to_string(message).unwrap_or_default();
    socket.send(Message::Text(text.into())).await
}

fn error_message(error: &AppError) -> WsServerMessage {
    WsServerMessage::Error { code: error.0.code, message: error.0.message.clone() }
}

async fn send_error(socket: &mut WebSocket, error: AppError) {
    let _ = send_json(socket, &error_message(&error)).await;
    close_gracefully(socket).await;
}

/// Sends a close frame and reads until the client closes too. Dropping the connection while
/// client frames (stdin, EOF) are still unread would make the kernel reset it, and the client
/// could lose the final `exit` message.
pub(crate) async fn close_gracefully(socket: &mut WebSocket) {
    let _ = socket.send(Message::Close(None)).await;
    let drain = async {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), drain).await;
}

fn exit_message(status: ExitStatus, oom_killed: bool) -> WsServerMessage {
    WsServerMessage::Exit { exit_code: status.code, signal: status.signal, timed_out: status.timed_out, oom_killed }
}

/// Processes started in the session (running ones and recently exited ones).
#[utoipa::path(get, path = "/v1/sessions/{id}/processes", params(("id" = String, Path)),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody)))]
pub async fn list_processes(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> AppResult<ApiJson<ProcessList>> {
    let (_, sandbox) = running_sandbox(&state, &caller, &id).await?;
    let agent = state.node.agent(&sandbox).await?;
    let processes = agent
        .processes()
        .await?
        .into_iter()
        .map(|p| ProcessInfo {
            pid: p.pid,
            cmd: p.argv,
            tty: p.tty,
            background: p.detached,
            running: p.exit.is_none(),
            exit_code: p.exit.and_then(|e| e.code),
            signal: p.exit.and_then(|e| e.signal),
        })
        .collect();
    Ok(ApiJson(ProcessList { processes }))
}

/// Sends a signal to a process started in the session.
#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/signal", request_body = SignalRequest,
    params(("id" = String, Path), ("pid" = u32, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn signal_process(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u32)>,
    ApiJson(request): ApiJson<SignalRequest>,
) -> AppResult<axum::http::StatusCode> {
    if !(1..=64).contains(&request.signal) {
        return Err(AppError::bad_request("signal must be a number between 1 and 64"));
    }
    let (_, sandbox) = running_sandbox(&state, &caller, &id).await?;
    state.node.agent(&sandbox).await?.signal(pid, request.signal).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Re-attaches to a process (typically a background one): its buffered output, then live
/// output and its exit, framed as on the exec WebSocket.
#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/attach", params(("id" = String, Path), ("pid" = u32, Path)),
    responses((status = 101, description = "WebSocket upgrade"), (status = 404, body = ErrorBody)))]
pub async fn attach_ws(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u32)>,
    upgrade: WebSocketUpgrade,
) -> AppResult<Response> {
    let (session, sandbox) = running_sandbox(&state, &caller, &id).await?;
    let agent = state.node.agent(&sandbox).await?;
    let process = agent.attach(pid).await?;
    let busy = state.activity.busy(&session.id);
    Ok(upgrade.on_upgrade(move |mut socket| async move {
        let _busy = busy;
        let _ = send_json(&mut socket, &WsServerMessage::Started { pid }).await;
        if let Some(status) = bridge(&mut socket, process).await {
            let _ = send_json(&mut socket, &exit_message(status, false)).await;
        }
        close_gracefully(&mut socket).await;
    }))
}
