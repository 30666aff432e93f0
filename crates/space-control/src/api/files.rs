//! Files inside a session's sandbox. Paths are resolved by `spaced` inside the sandbox's own
//! mount namespace, so `..`, absolute paths and symlinks can never reach the host.

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket};
use axum::http::{StatusCode, header};
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use space_api::error::{clip, echo};
use space_api::{ErrorBody, FileInfo, FileList, FileType, MoveRequest, PathRequest, WatchEvent, WriteResult};
use space_proto::client::AgentError;
use space_proto::{FileKind, FileStat, WatchKind};
use utoipa::IntoParams;

use super::ws::{Idle, close_gracefully};
use super::{FoundSession, running_sandbox};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiQuery, ApiWebSocket, AppError, AppResult, body_timeout, is_body_timeout};

const MAX_PATH: usize = 4096;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PathParam {
    /// Path inside the sandbox; relative paths start at `/`.
    pub path: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    pub path: String,
    /// Octal permission bits of a new file, e.g. `755` (default `644`).
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RemoveParams {
    pub path: String,
    /// Remove directories and their contents.
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchParams {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

fn check_path(path: &str) -> AppResult<&str> {
    if path.is_empty() || path.len() > MAX_PATH || path.contains('\0') {
        return Err(AppError::bad_request(format!("path must be 1 to {MAX_PATH} bytes without NUL")));
    }
    Ok(path)
}

fn parse_mode(mode: Option<&str>) -> AppResult<Option<u32>> {
    mode.map(|m| {
        u32::from_str_radix(m, 8)
            .ok()
            .filter(|v| *v <= 0o7777)
            .ok_or_else(|| AppError::bad_request(format!("mode {} is not an octal permission like 644", echo(m))))
    })
    .transpose()
}

pub(crate) fn file_info(stat: FileStat) -> FileInfo {
    FileInfo {
        name: stat.name,
        path: stat.path,
        file_type: match stat.kind {
            FileKind::File => FileType::File,
            FileKind::Dir => FileType::Dir,
            FileKind::Symlink => FileType::Symlink,
            FileKind::Other => FileType::Other,
        },
        size: stat.size,
        mode: stat.mode,
        uid: stat.uid,
        gid: stat.gid,
        modified_ms: stat.modified_ms,
        symlink_target: stat.symlink_target,
    }
}

/// Downloads a file (streamed).
#[utoipa::path(get, path = "/v1/sessions/{id}/files/content", params(("id" = String, Path), PathParam),
    responses((status = 200, description = "File bytes", content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn download(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiQuery(params): ApiQuery<PathParam>,
) -> AppResult<Response> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    let (size, stream) = agent.read_file(check_path(&params.path)?).await?;
    let body = Body::from_stream(stream.map_err(std::io::Error::other));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .body(body)
        .map_err(|e| AppError::internal(e.to_string()))
}

/// Uploads a file (streamed; parent directories are created). Replaces an existing file.
#[utoipa::path(put, path = "/v1/sessions/{id}/files/content", params(("id" = String, Path), UploadParams),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = WriteResult), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 408, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn upload(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiQuery(params): ApiQuery<UploadParams>,
    body: Body,
) -> AppResult<ApiJson<WriteResult>> {
    let path = check_path(&params.path)?.to_owned();
    let mode = parse_mode(params.mode.as_deref())?;
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    let data = body.into_data_stream().map_err(|e| std::io::Error::other(UploadBodyError(e)));
    let bytes = agent.write_file(&path, mode, data).await.map_err(upload_error)?;
    Ok(ApiJson(WriteResult { path, bytes }))
}

/// The client's upload body could not be read (malformed chunks, cut off, stalled): a fault
/// of the request, told apart from faults of the sandbox agent, which is fine.
#[derive(Debug, thiserror::Error)]
#[error("reading the upload body: {0}")]
struct UploadBodyError(#[source] axum::Error);

fn upload_error(e: AgentError) -> AppError {
    if let AgentError::Io(io) = &e
        && let Some(body) = io.get_ref().and_then(|inner| inner.downcast_ref::<UploadBodyError>())
    {
        if is_body_timeout(body) {
            return body_timeout();
        }
        return AppError::bad_request(format!(
            "the upload's body could not be read ({}); nothing was written, send the file again",
            clip(&body.0.to_string())
        ));
    }
    e.into()
}

/// Lists a directory.
#[utoipa::path(get, path = "/v1/sessions/{id}/files/list", params(("id" = String, Path), PathParam),
    responses((status = 200, body = FileList), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiQuery(params): ApiQuery<PathParam>,
) -> AppResult<ApiJson<FileList>> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let entries = state.nodes.of(&session)?.agent(&sandbox).await?.list_dir(check_path(&params.path)?).await?;
    Ok(ApiJson(FileList { entries: entries.into_iter().map(file_info).collect() }))
}

/// Describes one path (symlinks are not followed).
#[utoipa::path(get, path = "/v1/sessions/{id}/files/stat", params(("id" = String, Path), PathParam),
    responses((status = 200, body = FileInfo), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn stat(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiQuery(params): ApiQuery<PathParam>,
) -> AppResult<ApiJson<FileInfo>> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let stat = state.nodes.of(&session)?.agent(&sandbox).await?.stat(check_path(&params.path)?).await?;
    Ok(ApiJson(file_info(stat)))
}

/// Creates a directory and its missing parents.
#[utoipa::path(post, path = "/v1/sessions/{id}/files/mkdir", params(("id" = String, Path)), request_body = PathRequest,
    responses((status = 204), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn mkdir(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiJson(request): ApiJson<PathRequest>,
) -> AppResult<StatusCode> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    state.nodes.of(&session)?.agent(&sandbox).await?.make_dir(check_path(&request.path)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Moves or renames a path.
#[utoipa::path(post, path = "/v1/sessions/{id}/files/move", params(("id" = String, Path)), request_body = MoveRequest,
    responses((status = 204), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn move_path(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiJson(request): ApiJson<MoveRequest>,
) -> AppResult<StatusCode> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    agent.move_path(check_path(&request.from)?, check_path(&request.to)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes a file, or a directory with `recursive=true`.
#[utoipa::path(delete, path = "/v1/sessions/{id}/files", params(("id" = String, Path), RemoveParams),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiQuery(params): ApiQuery<RemoveParams>,
) -> AppResult<StatusCode> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    state.nodes.of(&session)?.agent(&sandbox).await?.remove(check_path(&params.path)?, params.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Streams filesystem changes under a directory as JSON `WatchEvent` text frames.
#[utoipa::path(get, path = "/v1/sessions/{id}/watch", params(("id" = String, Path), WatchParams),
    responses((status = 101, description = "Switches to a WebSocket (see `x-websocket`): the server sends one text \
        frame of `WatchEvent` JSON per change, and a `WsServerMessage` `error` before it closes on an idle timeout."),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn watch_ws(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiQuery(params): ApiQuery<WatchParams>,
    ApiWebSocket(upgrade): ApiWebSocket,
) -> AppResult<Response> {
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let slot = state.watches.acquire(&caller.tenant_id, &session.id)?;
    let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
    let events = agent.watch(check_path(&params.path)?, params.recursive).await?;
    let busy = state.activity.busy(&session.id);
    let idle = state.http.ws_idle_timeout;
    Ok(super::ws::on_upgrade(upgrade, move |mut socket| async move {
        let (_busy, _slot) = (busy, slot);
        // The watch ends at the agent's first error, as the stream of the agent does.
        let events = events
            .take_while(|event| std::future::ready(event.is_ok()))
            .filter_map(|event| std::future::ready(event.ok()))
            .map(|event| WatchEvent { kind: watch_kind(event.kind).into(), path: event.path, is_dir: event.is_dir });
        forward_events(&mut socket, events, idle).await;
    }))
}

/// Sends `events` as JSON text frames until they end, the client goes away or the socket
/// carries nothing either way for `idle_timeout`.
async fn forward_events(
    socket: &mut WebSocket,
    events: impl futures::Stream<Item = WatchEvent>,
    idle_timeout: std::time::Duration,
) {
    let mut events = std::pin::pin!(events);
    let mut idle = Idle::new(idle_timeout);
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { break };
                idle.reset();
                let text = serde_json::to_string(&event).unwrap_or_default();
                if socket.send(Message::Text(text.into())).await.is_err() {
                    break;
                }
            }
            message = socket.recv() => {
                idle.reset();
                if matches!(message, Some(Ok(Message::Close(_))) | Some(Err(_)) | None) {
                    break;
                }
            }
            () = idle.expired() => {
                let error = super::ws::error_message(&idle.error(""));
                let _ = super::ws::send_json(socket, &error).await;
                break;
            }
        }
    }
    close_gracefully(socket).await;
}

fn watch_kind(kind: WatchKind) -> &'static str {
    match kind {
        WatchKind::Create => "create",
        WatchKind::Modify => "modify",
        WatchKind::Remove => "remove",
        WatchKind::MovedFrom => "moved_from",
        WatchKind::MovedTo => "moved_to",
        WatchKind::Overflow => "overflow",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::{get, put};
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message as ClientMessage;

    use super::*;
    use crate::server::HttpLimits;
    use crate::server::testing::{envelope_of, patient, raw, spawn};

    /// Stands in for `upload`: reads the body the same way and maps a failure the same way,
    /// with no sandbox to write to.
    async fn consume(body: Body) -> AppResult<String> {
        let mut data = std::pin::pin!(body.into_data_stream().map_err(|e| std::io::Error::other(UploadBodyError(e))));
        let mut bytes = 0;
        while let Some(chunk) = data.next().await {
            bytes += chunk.map_err(|e| upload_error(AgentError::Io(e)))?.len();
        }
        Ok(bytes.to_string())
    }

    /// A broken upload is the client's fault: 400 (or 408 for a stalled one), and the
    /// message does not send the client off to destroy a session that is fine.
    #[tokio::test]
    async fn a_malformed_or_stalled_upload_body_is_a_client_error() {
        let limits = HttpLimits { body_idle_timeout: Duration::from_millis(300), ..patient() };
        let addr = spawn(Router::new().route("/up", put(consume)), limits).await;
        let head = "PUT /up HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n";
        let response = raw(addr, format!("{head}5\r\nhello\r\nZZ\r\n").as_bytes()).await;
        let (status, code, message) = envelope_of(&response);
        assert_eq!((status, code.as_str()), (400, "bad_request"), "{message}");
        assert!(message.contains("send the file again") && !message.contains("destroy"), "{message}");

        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stream, format!("{head}5\r\nhello\r\n").as_bytes()).await.unwrap();
        let (response, _) = crate::server::testing::read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(envelope_of(&response).1, "request_timeout", "{response}");

        // A failure of the agent itself still says the sandbox is in trouble.
        let other = upload_error(AgentError::Closed);
        assert_eq!(other.0.code, space_api::ErrorCode::SandboxUnavailable);
    }

    #[tokio::test]
    async fn an_idle_watch_socket_is_closed_unless_pinged() {
        let app = Router::new().route(
            "/watch",
            get(|ApiWebSocket(upgrade): ApiWebSocket| async move {
                upgrade.on_upgrade(|mut socket| async move {
                    forward_events(&mut socket, futures::stream::pending(), Duration::from_millis(400)).await;
                })
            }),
        );
        let addr = spawn(app, patient()).await;
        let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/watch")).await.unwrap();
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(1000) {
            socket.send(ClientMessage::Ping(Vec::new().into())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Pongs (and nothing else) so far; then, unpinged, the timeout and the close.
        let mut texts = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(message)) = socket.next().await {
                match message {
                    ClientMessage::Text(text) => texts.push(text.to_string()),
                    ClientMessage::Close(_) => return,
                    _ => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the idle socket stayed open");
        assert!(started.elapsed() > Duration::from_millis(1300), "closed while pinged");
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert!(texts[0].contains("\"timeout\"") && texts[0].contains("pings"), "{texts:?}");
    }

    #[test]
    fn modes_are_octal_and_bounded() {
        assert_eq!(parse_mode(Some("755")).unwrap(), Some(0o755));
        assert!(parse_mode(Some("9")).is_err());
        assert!(parse_mode(Some("77777")).is_err());
        assert_eq!(parse_mode(None).unwrap(), None);
    }

    #[test]
    fn paths_are_bounded() {
        assert!(check_path("").is_err());
        assert!(check_path("a\0b").is_err());
        assert!(check_path("../../etc/shadow").is_ok());
    }
}
