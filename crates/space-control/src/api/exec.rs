//! Running commands: a JSON form for short commands, WebSockets for streaming and terminals,
//! and the process table for background commands.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket};
use axum::response::Response;
use bytes::Bytes;
use space_api::error::clip;
use space_api::{
    ErrorBody, ErrorCode, ExecRequest, ExecResult, ExecStart, ProcessInfo, ProcessList, Session, SignalRequest,
    WsClientMessage, WsServerMessage,
};
use space_proto::client::{AgentClient, ExecEvent, ExecInputHandle, ExecSession};
use space_proto::{ExecSpec, ExitStatus, PtySize};

use super::ws::{Idle, close_gracefully, error_message, send_error, send_json};
use super::{FoundSession, running_sandbox};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiWebSocket, AppError, AppResult};

/// Output kept per stream by the JSON form, measured as it is in the response: the bytes of
/// the JSON string, escapes included (a NUL byte is the 6 bytes `\u0000`). The rest is
/// dropped and `truncated` set.
const OUTPUT_CAP: usize = 16 << 20;
/// Bound on a whole JSON exec response: both streams and the few fields around them.
pub(crate) const MAX_EXEC_RESPONSE: usize = 2 * OUTPUT_CAP + 4096;
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

async fn oom_kills(state: &AppState, session: &Session, sandbox: &space_api::SandboxId) -> u64 {
    let Ok(node) = state.nodes.of(session) else { return 0 };
    node.oom_kills(sandbox).await.unwrap_or(0)
}

/// Runs a command to completion and returns its exit status and output.
#[utoipa::path(post, path = "/v1/sessions/{id}/exec", params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 200, body = ExecResult), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn exec(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiJson(request): ApiJson<ExecRequest>,
) -> AppResult<ApiJson<ExecResult>> {
    check_command(&request.cmd)?;
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let _busy = state.activity.busy(&session.id);
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    let oom_before = oom_kills(&state, &session, &sandbox).await;
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
    result.oom_killed = oom_kills(&state, &session, &sandbox).await > oom_before;
    let (out, out_cut) = json_text(&stdout, OUTPUT_CAP);
    let (err, err_cut) = json_text(&stderr, OUTPUT_CAP);
    (result.stdout, result.stderr, result.truncated) = (out, err, result.truncated | out_cut | err_cut);
    result.duration_ms = started.elapsed().as_millis() as u64;
    Ok(ApiJson(result))
}

/// Keeps raw output up to the cap: no character takes fewer bytes in JSON than raw, so more
/// could never fit.
fn append_capped(buf: &mut Vec<u8>, bytes: &[u8]) -> bool {
    let room = OUTPUT_CAP.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() > room
}

/// Bytes `c` takes inside a JSON string as serde_json writes it.
fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        c if c < ' ' => 6,
        c => c.len_utf8(),
    }
}

/// `raw` as text (invalid UTF-8 becomes U+FFFD, as `String::from_utf8_lossy` does) cut to the
/// longest prefix whose JSON string takes at most `cap` bytes; `true` if something was cut.
fn json_text(raw: &[u8], cap: usize) -> (String, bool) {
    let mut text = String::with_capacity(raw.len().min(cap));
    let mut size = 0;
    for chunk in raw.utf8_chunks() {
        let replacement = (!chunk.invalid().is_empty()).then_some(char::REPLACEMENT_CHARACTER);
        for c in chunk.valid().chars().chain(replacement) {
            size += json_len(c);
            if size > cap {
                return (text, true);
            }
            text.push(c);
        }
    }
    (text, false)
}

/// Streams a command over a WebSocket: the first client message is an `ExecStart` (JSON text);
/// see `ExecStart` for the framing.
#[utoipa::path(get, path = "/v1/sessions/{id}/exec/ws", params(("id" = String, Path)),
    responses((status = 101, description = "Switches to a WebSocket (see `x-websocket`). Client: first a text frame \
        holding an `ExecStart`, then text frames of `WsClientMessage` (eof, signal, resize) and binary frames of \
        stdin. Server: a `WsServerMessage` `started`, binary frames of output (first byte 1 = stdout, 2 = stderr), \
        and at the end `exit` or `error` (also `WsServerMessage`)."),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn exec_ws(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiWebSocket(upgrade): ApiWebSocket,
) -> AppResult<Response> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    let idle = state.http.ws_idle_timeout;
    Ok(super::ws::on_upgrade(upgrade, move |mut socket| async move {
        let _busy = state.activity.busy(&session.id);
        let started = match start_from_socket(&mut socket, &agent, &session.env, idle).await {
            Ok(process) => process,
            Err(e) => return send_error(&mut socket, e).await,
        };
        let oom_before = oom_kills(&state, &session, &sandbox).await;
        let status = bridge(&mut socket, started, idle).await;
        if let Some(status) = status {
            let oom_killed = oom_kills(&state, &session, &sandbox).await > oom_before;
            let _ = send_json(&mut socket, &exit_message(status, oom_killed)).await;
        }
        close_gracefully(&mut socket).await;
    }))
}

/// The client's first message, which must be an `ExecStart` (pings before it are fine).
async fn first_message(socket: &mut WebSocket, idle_timeout: Duration) -> AppResult<ExecStart> {
    let mut idle = Idle::new(idle_timeout);
    loop {
        let message = tokio::select! {
            message = socket.recv() => message,
            () = idle.expired() => return Err(idle.error("")),
        };
        idle.reset();
        return match message {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Text(text))) => serde_json::from_str(&text).map_err(|e| {
                AppError::bad_request(format!(
                    "the first message must be an ExecStart JSON object: {}",
                    clip(&e.to_string())
                ))
            }),
            _ => Err(AppError::bad_request("the first message must be an ExecStart JSON text frame")),
        };
    }
}

async fn start_from_socket(
    socket: &mut WebSocket,
    agent: &AgentClient,
    session_env: &BTreeMap<String, String>,
    idle_timeout: Duration,
) -> AppResult<ExecSession> {
    let start = first_message(socket, idle_timeout).await?;
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

/// A control message of the client, refused if it could not be what the client meant.
fn parse_control(text: &str) -> AppResult<WsClientMessage> {
    let control = serde_json::from_str::<WsClientMessage>(text)
        .map_err(|e| AppError::bad_request(format!("unknown client message: {}", clip(&e.to_string()))))?;
    if let WsClientMessage::Signal { signal } = control {
        check_signal(signal)?;
    }
    Ok(control)
}

/// A signal number a process can be sent (the standard Linux signals).
fn check_signal(signal: i32) -> AppResult<()> {
    if space_api::signal_name(signal).is_none() {
        return Err(AppError::bad_request(format!(
            "signal {signal} is not a Linux signal a process can be sent: use 1-31, e.g. 2 (INT), 9 (KILL), 15 (TERM)"
        )));
    }
    Ok(())
}

/// Copies between the WebSocket and the process until it exits (returns its status) or the
/// client goes away or the socket is idle for `idle_timeout` (returns `None`; dropping the
/// stream makes spaced kill the process).
///
/// Input is fed by its own task: a process that is not reading stdin must not stop its output
/// from being forwarded (it would block on a full pipe, and never read stdin).
async fn bridge(socket: &mut WebSocket, mut process: ExecSession, idle_timeout: Duration) -> Option<ExitStatus> {
    let (queue, pending) = tokio::sync::mpsc::channel(INPUT_QUEUE);
    tokio::spawn(feed_input(process.input(), pending));
    let mut idle = Idle::new(idle_timeout);
    loop {
        tokio::select! {
            message = socket.recv(), if queue.capacity() > 0 => { idle.reset(); match message {
                Some(Ok(Message::Binary(bytes))) => { let _ = queue.try_send(ClientInput::Stdin(bytes)); }
                Some(Ok(Message::Text(text))) => match parse_control(&text) {
                    Ok(control) => { let _ = queue.try_send(ClientInput::Control(control)); }
                    Err(error) => { let _ = send_json(socket, &error_message(&error)).await; }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
            }},
            // While the queue is full the socket is not read; wake when it drains, or a
            // command that reads much and prints nothing would wait for ever.
            Ok(_) = queue.reserve(), if queue.capacity() == 0 => {}
            () = idle.expired() => {
                let _ = send_json(socket, &error_message(&idle.error(" (and a command it started is killed)"))).await;
                return None;
            }
            event = process.next_event() => { idle.reset(); match event {
                Ok(Some(ExecEvent::Stdout(bytes))) => { if send_output(socket, CHANNEL_STDOUT, &bytes).await.is_err() { return None; } }
                Ok(Some(ExecEvent::Stderr(bytes))) => { if send_output(socket, CHANNEL_STDERR, &bytes).await.is_err() { return None; } }
                Ok(Some(ExecEvent::Exit(status))) => return Some(status),
                Ok(None) | Err(_) => {
                    let error = AppError::new(ErrorCode::SandboxUnavailable, "the sandbox agent closed the stream");
                    let _ = send_json(socket, &error_message(&error)).await;
                    return None;
                }
            }},
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

fn exit_message(status: ExitStatus, oom_killed: bool) -> WsServerMessage {
    WsServerMessage::Exit { exit_code: status.code, signal: status.signal, timed_out: status.timed_out, oom_killed }
}

/// Processes started in the session (running ones and recently exited ones).
#[utoipa::path(get, path = "/v1/sessions/{id}/processes", params(("id" = String, Path)),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn list_processes(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
) -> AppResult<ApiJson<ProcessList>> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
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
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn signal_process(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiPath((_id, pid)): ApiPath<(String, u32)>,
    ApiJson(request): ApiJson<SignalRequest>,
) -> AppResult<axum::http::StatusCode> {
    check_signal(request.signal)?;
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    state.nodes.of(&session)?.agent(&sandbox).await?.signal(pid, request.signal).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Re-attaches to a process (typically a background one): its buffered output, then live
/// output and its exit, framed as on the exec WebSocket.
#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/attach", params(("id" = String, Path), ("pid" = u32, Path)),
    responses((status = 101, description = "Switches to a WebSocket (see `x-websocket`): the server sends a \
        `WsServerMessage` `started`, the process's buffered and new output as binary frames (first byte 1 = \
        stdout, 2 = stderr), and `exit` or `error`; the client sends stdin as binary frames and `WsClientMessage` \
        text frames."),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn attach_ws(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiPath((_id, pid)): ApiPath<(String, u32)>,
    ApiWebSocket(upgrade): ApiWebSocket,
) -> AppResult<Response> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    let process = agent.attach(pid).await?;
    let busy = state.activity.busy(&session.id);
    let idle = state.http.ws_idle_timeout;
    Ok(super::ws::on_upgrade(upgrade, move |mut socket| async move {
        let _busy = busy;
        let _ = send_json(&mut socket, &WsServerMessage::Started { pid }).await;
        if let Some(status) = bridge(&mut socket, process, idle).await {
            let _ = send_json(&mut socket, &exit_message(status, false)).await;
        }
        close_gracefully(&mut socket).await;
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::get;
    use futures::{SinkExt, StreamExt};
    use space_proto::{Frame, Reply};
    use tokio::sync::mpsc;
    use tokio_tungstenite::tungstenite::Message as ClientMessage;

    use super::*;
    use crate::server::testing::{patient, spawn};

    /// A stand-in for spaced: every exec starts (pid 7) and runs until the client drops it;
    /// each frame the client sends on it arrives on the receiver, then `None` when it is dropped.
    async fn fake_agent() -> (AgentClient, mpsc::UnboundedReceiver<Option<Frame>>) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (seen_tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut io = theirs;
            space_proto::handshake(&mut io, "fake-spaced").await.unwrap();
            let _ = space_proto::serve(io, move |mut stream| {
                let seen = seen_tx.clone();
                async move {
                    let _exec = space_proto::next_frame(&mut stream).await;
                    space_proto::send_message(&mut stream, &Reply::Started { pid: 7 }).await.unwrap();
                    while let Ok(Some(frame)) = space_proto::next_frame(&mut stream).await {
                        let _ = seen.send(Some(frame));
                    }
                    let _ = seen.send(None);
                }
            })
            .await;
        });
        (AgentClient::connect(ours).await.unwrap(), seen)
    }

    /// Serves one exec WebSocket bridged to the fake agent, idle after `idle`.
    async fn exec_socket(idle: Duration) -> (crate::server::testing::WsClient, mpsc::UnboundedReceiver<Option<Frame>>) {
        let (agent, seen) = fake_agent().await;
        let app = Router::new().route(
            "/ws",
            get(move |crate::error::ApiWebSocket(upgrade): crate::error::ApiWebSocket| async move {
                upgrade.on_upgrade(move |mut socket| async move {
                    let spec = ExecSpec { argv: vec!["cat".into()], stdin: true, ..Default::default() };
                    let process = agent.exec(spec).await.unwrap();
                    bridge(&mut socket, process, idle).await;
                    close_gracefully(&mut socket).await;
                })
            }),
        );
        let addr = spawn(app, patient()).await;
        let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await.unwrap();
        (socket, seen)
    }

    async fn next_text(socket: &mut crate::server::testing::WsClient) -> serde_json::Value {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), socket.next()).await {
                Ok(Some(Ok(ClientMessage::Text(text)))) => return serde_json::from_str(&text).unwrap(),
                Ok(Some(Ok(ClientMessage::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => panic!("closed"),
                Ok(Some(Ok(_))) => continue,
                Err(_) => panic!("no text frame in time"),
            }
        }
    }

    #[tokio::test]
    async fn signals_outside_the_known_set_are_refused_and_not_sent() {
        let (mut socket, mut seen) = exec_socket(Duration::from_secs(60)).await;
        for bad in [0, 32, 64, 99, -9, i32::MAX] {
            let text = format!(r#"{{"type":"signal","signal":{bad}}}"#);
            socket.send(ClientMessage::Text(text.into())).await.unwrap();
            let error = next_text(&mut socket).await;
            assert_eq!((error["type"].as_str(), error["code"].as_str()), (Some("error"), Some("bad_request")), "{bad}");
            assert!(error["message"].as_str().unwrap().contains("1-31"), "{error}");
        }
        socket.send(ClientMessage::Text(r#"{"type":"signal","signal":15}"#.into())).await.unwrap();
        let frame = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await.unwrap().unwrap().unwrap();
        let input: space_proto::ExecInput = frame.parse().unwrap();
        assert!(matches!(input, space_proto::ExecInput::Signal { signal: 15 }), "{input:?}");
        assert!(seen.try_recv().is_err(), "a refused signal reached the agent");
    }

    #[tokio::test]
    async fn an_idle_exec_socket_is_closed_and_its_command_killed_unless_pinged() {
        let (mut socket, mut seen) = exec_socket(Duration::from_millis(400)).await;
        // Pings keep it open well past the idle timeout.
        for _ in 0..10 {
            socket.send(ClientMessage::Ping(Vec::new().into())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(seen.try_recv().is_err(), "the command ended while pinged");
        let error = next_text(&mut socket).await;
        assert_eq!(error["code"], "timeout", "{error}");
        assert!(error["message"].as_str().unwrap().contains("pings"), "{error}");
        let dropped = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await.unwrap();
        assert!(dropped.is_some_and(|f| f.is_none()), "the command's stream was not dropped");
    }

    #[test]
    fn signal_numbers_are_the_standard_linux_ones() {
        assert!(check_signal(15).is_ok() && check_signal(9).is_ok() && check_signal(31).is_ok());
        for bad in [0, 32, 34, 64, -1] {
            assert!(check_signal(bad).is_err(), "{bad}");
        }
    }

    /// What the JSON form returns for `raw` output, serialized.
    fn serialized(raw: &[u8], cap: usize) -> (String, bool) {
        let (text, cut) = json_text(raw, cap);
        (serde_json::to_string(&text).unwrap(), cut)
    }

    #[test]
    fn output_is_capped_by_its_size_in_json() {
        let cap = 1 << 20;
        // NULs and other control bytes take 6 bytes each in JSON, invalid UTF-8 3 (U+FFFD).
        for raw in [vec![0u8; cap], vec![0x01; cap], vec![0xff; cap], b"\"\\".repeat(cap / 2)] {
            let (json, cut) = serialized(&raw, cap);
            assert!(json.len() <= cap + 2 && cut, "{} bytes for {:?}…", json.len(), &raw[..2]);
        }
        // Text under the cap comes back as it was.
        let text = "héllo wörld\n\ttab \"quoted\" ünïcode ✓\n".repeat(1000);
        assert_eq!(json_text(text.as_bytes(), cap), (text.clone(), false));
        // The cut never splits a character.
        let (cut_text, cut) = json_text("✓✓✓".as_bytes(), 7);
        assert_eq!((cut_text.as_str(), cut), ("✓✓", true));
        assert_eq!(json_text(b"a\xffb", 16).0, "a\u{fffd}b");
    }

    #[test]
    fn a_whole_exec_response_fits_its_bound() {
        let (stdout, _) = json_text(&vec![0u8; OUTPUT_CAP], OUTPUT_CAP);
        let (stderr, _) = json_text(&vec![0xffu8; OUTPUT_CAP], OUTPUT_CAP);
        let result = ExecResult { stdout, stderr, truncated: true, exit_code: Some(0), ..Default::default() };
        let size = serde_json::to_vec(&result).unwrap().len();
        assert!(size <= MAX_EXEC_RESPONSE, "{size} bytes");
    }
}
