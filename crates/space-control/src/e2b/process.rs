//! envd's `process.Process` service over spaced's exec.
//!
//! E2B's processes outlive the call that started them: a client may drop the stream and
//! `Connect` again, or send input and signals by pid from other calls. So a process is
//! started detached (spaced keeps it, and its recent output, after the stream ends) and
//! followed by attaching to it; input goes through an attach stream too.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures::Stream;
use space_api::SessionId;
use space_proto::client::{AgentClient, ExecEvent, ExecInputHandle, ExecSession};
use space_proto::{ExecSpec, ExitStatus, PtySize};

use super::connect::{Code, Envelopes, Reply, RpcError, StreamError, Unary, UnaryResult, stream_response};
use super::envd::{Envd, EnvdState, username};
use super::messages::{
    B64, DataEvent, Empty, EndEvent, EventMessage, ListResponse, ProcessConfig, ProcessEvent, ProcessInfo,
    ProcessInput, ProcessSelector, SelectorRequest, SendInputRequest, SendSignalRequest, StartRequest,
    StreamInputRequest, UpdateRequest,
};
use crate::AppState;

const SERVICE: &str = "/process.Process/";
/// Keepalive interval when the client asks for none (`Keepalive-Ping-Interval`, seconds).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

pub fn routes() -> axum::Router<AppState> {
    let route = |name: &str| format!("{SERVICE}{name}");
    axum::Router::new()
        .route(&route("Start"), post(start))
        .route(&route("Connect"), post(connect))
        .route(&route("List"), post(list))
        .route(&route("SendInput"), post(send_input))
        .route(&route("StreamInput"), post(stream_input))
        .route(&route("SendSignal"), post(send_signal))
        .route(&route("CloseStdin"), post(close_stdin))
        .route(&route("Update"), post(update))
}

/// What E2B knows of a process that spaced does not: its tag and how it was started.
#[derive(Default)]
pub struct Tags(Mutex<HashMap<SessionId, BTreeMap<u32, Started>>>);

#[derive(Clone)]
struct Started {
    tag: Option<String>,
    /// `None` when too large to keep.
    config: Option<ProcessConfig>,
    /// Its output is a terminal's (`pty` events, not `stdout`).
    tty: bool,
}

/// Processes remembered per session; the oldest are forgotten beyond this.
const MAX_REMEMBERED: usize = 1024;
/// Sessions whose processes are remembered; all are forgotten beyond this (tags then no
/// longer name processes; pids still do).
const MAX_SESSIONS: usize = 4096;
/// Longest tag.
const MAX_TAG: usize = 256;
/// A start's command line and environment are remembered for `List` up to this size; a
/// larger one is listed as spaced reports it (its argv).
const MAX_REMEMBERED_CONFIG: usize = 16 << 10;

impl Tags {
    fn remember(&self, id: &SessionId, pid: u32, started: Started) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= MAX_SESSIONS && !all.contains_key(id) {
            all.clear();
        }
        let processes = all.entry(id.clone()).or_default();
        while processes.len() >= MAX_REMEMBERED {
            processes.pop_first();
        }
        processes.insert(pid, started);
    }

    fn get(&self, id: &SessionId, pid: u32) -> Option<Started> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(id)?.get(&pid).cloned()
    }

    fn pid_of_tag(&self, id: &SessionId, tag: &str) -> Option<u32> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let processes = all.get(id)?;
        processes.iter().rev().find(|(_, s)| s.tag.as_deref() == Some(tag)).map(|(pid, _)| *pid)
    }
}

/// Input channels to processes: the attach stream of a `Start` or `Connect` call while it
/// lasts, or one opened for input alone. Input sent on a stream that is then closed may be
/// lost, so a channel stays open for as long as its process runs.
#[derive(Default)]
pub struct Inputs(Mutex<HashMap<(SessionId, u32), (u64, ExecInputHandle)>>);

/// Removes its channel from [`Inputs`] when dropped (with the stream it belongs to).
struct Registered {
    envd_state: Arc<EnvdState>,
    key: (SessionId, u32),
    generation: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut inputs = self.envd_state.inputs.0.lock().unwrap_or_else(|e| e.into_inner());
        if inputs.get(&self.key).is_some_and(|(g, _)| *g == self.generation) {
            inputs.remove(&self.key);
        }
    }
}

fn register(envd_state: &Arc<EnvdState>, id: &SessionId, process: &ExecSession) -> Registered {
    static GENERATION: AtomicU64 = AtomicU64::new(0);
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
    let key = (id.clone(), process.pid());
    let mut inputs = envd_state.inputs.0.lock().unwrap_or_else(|e| e.into_inner());
    inputs.insert(key.clone(), (generation, process.input()));
    Registered { envd_state: envd_state.clone(), key, generation }
}

/// The input channel of process `pid`: a stream's that is open, or a new attach kept open
/// (its output drained) until the process ends.
async fn input_of(
    envd_state: &Arc<EnvdState>,
    envd: &Envd,
    agent: &AgentClient,
    pid: u32,
) -> Result<ExecInputHandle, RpcError> {
    let key = (envd.id.clone(), pid);
    if let Some((_, handle)) = envd_state.inputs.0.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(handle.clone());
    }
    let mut process = agent.attach(pid).await?;
    let registered = register(envd_state, &envd.id, &process);
    let handle = process.input();
    tokio::spawn(async move {
        let _registered = registered;
        while let Ok(Some(event)) = process.next_event().await {
            if matches!(event, ExecEvent::Exit(_)) {
                break;
            }
        }
    });
    Ok(handle)
}

fn pid_of(envd_state: &EnvdState, envd: &Envd, selector: &ProcessSelector) -> Result<u32, RpcError> {
    if let Some(pid) = selector.pid {
        return Ok(pid);
    }
    let tag = selector.tag.as_deref().ok_or_else(|| RpcError::invalid("name the process by pid or tag"))?;
    envd_state
        .tags
        .pid_of_tag(&envd.id, tag)
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("no process tagged {}", space_api::error::echo(tag))))
}

/// How long between keepalive events the client asked for.
fn keepalive(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs)
}

fn event_stream(
    events: impl Stream<Item = Result<ProcessEvent, RpcError>> + Send + 'static,
    headers: &HeaderMap,
) -> Response {
    use futures::StreamExt;
    let messages = events.map(|event| event.map(|event| EventMessage { event }));
    stream_response(messages, Some((keepalive(headers), EventMessage { event: ProcessEvent::Keepalive {} })))
}

async fn start(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    mut request: Envelopes,
) -> Response {
    match started(&state, &envd_state, &envd, &headers, &mut request).await {
        Ok((process, tty)) => {
            let registered = register(&envd_state, &envd.id, &process);
            event_stream(follow(process, tty, registered), &headers)
        }
        Err(error) => StreamError(error).into_response(),
    }
}

async fn started(
    state: &AppState,
    envd_state: &EnvdState,
    envd: &Envd,
    headers: &HeaderMap,
    request: &mut Envelopes,
) -> Result<(ExecSession, bool), RpcError> {
    let request: StartRequest = request.first().await?;
    let config = request.process;
    if config.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd must name a program"));
    }
    if request.tag.as_ref().is_some_and(|t| t.len() > MAX_TAG) {
        return Err(RpcError::invalid(format!("a tag is at most {MAX_TAG} bytes")));
    }
    let (session, agent) = envd.agent(state).await?;
    let user = envd_state.users.resolve(&envd.id, &agent, username(headers).as_deref()).await?;
    let mut env = space_gateway::sandbox_env();
    env.extend(session.env.clone());
    env.insert("HOME".into(), user.home.clone());
    env.extend(config.envs.clone());
    let argv = std::iter::once(config.cmd.clone()).chain(config.args.iter().cloned()).collect();
    let cwd = match config.cwd.clone().filter(|c| !c.is_empty()) {
        Some(cwd) => cwd,
        None => envd_state.workdirs.of(&envd.id, &agent).await.unwrap_or_else(|| user.home.clone()),
    };
    let tty = request.pty.and_then(|p| p.size).map(|s| PtySize { rows: clamp(s.rows), cols: clamp(s.cols) });
    let spec = ExecSpec {
        argv,
        env,
        cwd: Some(cwd),
        uid: Some(user.uid),
        gid: Some(user.gid),
        tty,
        timeout_ms: None,
        detached: true,
        stdin: request.stdin.unwrap_or(true) || request.pty.is_some(),
    };
    state.activity.touch(&session.id);
    let tty = spec.tty.is_some();
    let pid = agent.exec(spec).await?.pid();
    let size = config.cmd.len()
        + config.args.iter().map(String::len).sum::<usize>()
        + config.envs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let config = (size <= MAX_REMEMBERED_CONFIG).then_some(config);
    envd_state.tags.remember(&envd.id, pid, Started { tag: request.tag, config, tty });
    Ok((agent.attach(pid).await?, tty))
}

fn clamp(n: u32) -> u16 {
    n.clamp(1, u16::MAX as u32) as u16
}

/// The events of a process from its `Start` (or `Connect`) to its end.
fn follow(
    process: ExecSession,
    tty: bool,
    registered: Registered,
) -> impl Stream<Item = Result<ProcessEvent, RpcError>> + Send {
    let pid = process.pid();
    let stdout = if tty { DataEvent::Pty } else { DataEvent::Stdout };
    let first = futures::stream::once(async move { Ok(ProcessEvent::Start { pid }) });
    let rest = futures::stream::unfold(Some((process, registered)), move |process| async move {
        let (mut process, registered) = process?;
        match process.next_event().await {
            Ok(Some(ExecEvent::Stdout(bytes))) => Some((Ok(data(stdout, bytes)), Some((process, registered)))),
            Ok(Some(ExecEvent::Stderr(bytes))) => {
                Some((Ok(data(DataEvent::Stderr, bytes)), Some((process, registered))))
            }
            Ok(Some(ExecEvent::Exit(status))) => Some((Ok(ProcessEvent::End(end_event(status))), None)),
            Ok(None) => None,
            Err(e) => Some((Err(RpcError::new(Code::Unavailable, format!("the sandbox agent: {e}"))), None)),
        }
    });
    futures::StreamExt::chain(first, rest)
}

fn data(kind: fn(B64) -> DataEvent, bytes: Bytes) -> ProcessEvent {
    ProcessEvent::Data(kind(B64(bytes.to_vec())))
}

/// envd's end event: `exit status N`, or `signal: NAME` for a process a signal ended.
fn end_event(status: ExitStatus) -> EndEvent {
    match (status.code, status.signal) {
        (Some(code), _) => {
            EndEvent { exit_code: code, exited: true, status: format!("exit status {code}"), error: None }
        }
        (None, Some(signal)) => {
            let name = space_api::signal_name(signal).unwrap_or("unknown").to_ascii_lowercase();
            let name = if name == "kill" { "killed".to_owned() } else { name };
            EndEvent { exit_code: -1, exited: false, status: format!("signal: {name}"), error: None }
        }
        (None, None) => EndEvent { exit_code: -1, exited: false, status: "unknown".into(), error: None },
    }
}

async fn connect(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    mut request: Envelopes,
) -> Response {
    let attached = async {
        let request: SelectorRequest = request.first().await?;
        let pid = pid_of(&envd_state, &envd, &request.process)?;
        let (_, agent) = envd.agent(&state).await?;
        let tty = envd_state.tags.get(&envd.id, pid).is_some_and(|s| s.tty);
        Ok::<_, RpcError>((agent.attach(pid).await?, tty))
    };
    match attached.await {
        Ok((process, tty)) => {
            let registered = register(&envd_state, &envd.id, &process);
            event_stream(follow(process, tty, registered), &headers)
        }
        Err(error) => StreamError(error).into_response(),
    }
}

async fn list(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    Unary(_): Unary<Empty>,
) -> UnaryResult<ListResponse> {
    let (_, agent) = envd.agent(&state).await?;
    let processes = agent
        .processes()
        .await?
        .into_iter()
        .filter(|p| p.exit.is_none() && p.pid != 0)
        .map(|p| {
            let known = envd_state.tags.get(&envd.id, p.pid);
            let config = known.as_ref().and_then(|k| k.config.clone()).unwrap_or_else(|| ProcessConfig {
                cmd: p.argv.first().cloned().unwrap_or_default(),
                args: p.argv.iter().skip(1).cloned().collect(),
                ..ProcessConfig::default()
            });
            ProcessInfo { config, pid: p.pid, tag: known.and_then(|k| k.tag) }
        })
        .collect();
    Ok(Reply(ListResponse { processes }))
}

async fn write_input(input: &ExecInputHandle, data: ProcessInput) -> Result<(), RpcError> {
    let bytes = data.stdin.or(data.pty).map(|b| b.0).unwrap_or_default();
    if !bytes.is_empty() {
        input.send_stdin(Bytes::from(bytes)).await?;
    }
    Ok(())
}

async fn send_input(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    Unary(request): Unary<SendInputRequest>,
) -> UnaryResult<Empty> {
    let pid = pid_of(&envd_state, &envd, &request.process)?;
    let (_, agent) = envd.agent(&state).await?;
    let input = input_of(&envd_state, &envd, &agent, pid).await?;
    write_input(&input, request.input).await?;
    Ok(Reply(Empty {}))
}

/// Input as a client stream: a `start` naming the process, then `data` messages.
async fn stream_input(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    mut request: Envelopes,
) -> Response {
    let result = async {
        let mut process = None;
        while let Some(message) = request.next::<StreamInputRequest>().await? {
            if let Some(start) = message.start {
                let pid = pid_of(&envd_state, &envd, &start.process)?;
                let (_, agent) = envd.agent(&state).await?;
                process = Some(input_of(&envd_state, &envd, &agent, pid).await?);
            } else if let Some(data) = message.data {
                let process = process.as_ref().ok_or_else(|| RpcError::invalid("the first message must be start"))?;
                write_input(process, data.input).await?;
            }
        }
        Ok::<_, RpcError>(())
    };
    // A client stream's answer: its one message, or the error that ended it.
    let answer = result.await.map(|()| Empty {});
    stream_response(futures::stream::iter([answer]), None)
}

async fn send_signal(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    Unary(request): Unary<SendSignalRequest>,
) -> UnaryResult<Empty> {
    if !matches!(request.signal, 9 | 15) {
        return Err(RpcError::invalid("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM"));
    }
    let pid = pid_of(&envd_state, &envd, &request.process)?;
    let (_, agent) = envd.agent(&state).await?;
    agent.signal(pid, request.signal).await?;
    Ok(Reply(Empty {}))
}

async fn close_stdin(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    Unary(request): Unary<SelectorRequest>,
) -> UnaryResult<Empty> {
    let pid = pid_of(&envd_state, &envd, &request.process)?;
    let (_, agent) = envd.agent(&state).await?;
    input_of(&envd_state, &envd, &agent, pid).await?.close_stdin().await?;
    Ok(Reply(Empty {}))
}

/// Resizes a process's terminal (the only update there is).
async fn update(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    Unary(request): Unary<UpdateRequest>,
) -> UnaryResult<Empty> {
    let pid = pid_of(&envd_state, &envd, &request.process)?;
    let Some(size) = request.pty.and_then(|p| p.size) else { return Ok(Reply(Empty {})) };
    let (_, agent) = envd.agent(&state).await?;
    input_of(&envd_state, &envd, &agent, pid)
        .await?
        .resize(PtySize { rows: clamp(size.rows), cols: clamp(size.cols) })
        .await?;
    Ok(Reply(Empty {}))
}
