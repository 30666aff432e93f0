//! Servers inside a session's sandbox, reached from outside without giving the sandbox any
//! network path in: the node connects from within the sandbox's network namespace.
//!
//! - `ANY /v1/sessions/{id}/ports/{port}/{path}`: an HTTP/1.1 proxy (streaming, WebSocket).
//! - `{port}-{id}.{preview domain}` hosts: the same, at the host's root (E2B's `get_host`).
//! - `GET /v1/sessions/{id}/tunnel/{port}`: raw TCP over a WebSocket (`space port forward`).
//! - `POST|GET|DELETE /v1/sessions/{id}/ports/{port}`: a port's token, or public access.
//!
//! Private by default: the session tenant's API key always works; a port's token or nothing
//! at all only once the port is opened for it. Without a key, every refusal is the same 401,
//! so a caller without access cannot tell which sessions or ports exist.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket};
use axum::extract::{Request, State};
use axum::http::header::HOST;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use space_api::{ErrorBody, ErrorCode, OpenPortRequest, PortAccess, PortList, Session, SessionId};
use space_store::PortRecord;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{FoundSession, find_session, running_sandbox, woken_sandbox};
use crate::AppState;
use crate::auth::{Caller, bearer_key, hash_key, tenant_caller_of_key};
use crate::error::{ApiJson, ApiPath, ApiWebSocket, AppError, AppResult};
use crate::proxy::{self, PORT_TOKEN_HEADER, Upstream};

/// The query parameter that may carry a port's token (a browser link cannot set headers).
const TOKEN_QUERY: &str = "space_token";
/// Bytes of a tunnel's TCP stream sent per WebSocket message.
const TUNNEL_CHUNK: usize = 64 << 10;

/// Opens a port to holders of a new token, or to anyone (`public`); any token it had stops
/// working.
#[utoipa::path(post, path = "/v1/sessions/{id}/ports/{port}",
    params(("id" = String, Path), ("port" = u16, Path)), request_body = OpenPortRequest,
    responses((status = 200, body = PortAccess), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn open_port(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    headers: HeaderMap,
    body: Bytes,
) -> AppResult<ApiJson<PortAccess>> {
    let session = find_session(&state, &caller, &id).await?;
    let request: OpenPortRequest = if body.iter().all(u8::is_ascii_whitespace) {
        OpenPortRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| AppError::bad_request(format!("invalid request body: {e}")))?
    };
    valid_port(port)?;
    let token = new_token();
    let record = state.store.open_port(&session.id, port, request.public, &hash_key(&token)).await?;
    tracing::info!(session = %session.id, port, public = request.public, "port opened");
    Ok(ApiJson(PortAccess { token: Some(token), ..access(&state, &headers, &session.id, port, Some(&record)) }))
}

/// A port's access: opened or not (a port not opened is reachable with the API key alone).
#[utoipa::path(get, path = "/v1/sessions/{id}/ports/{port}", params(("id" = String, Path), ("port" = u16, Path)),
    responses((status = 200, body = PortAccess), (status = 404, body = ErrorBody)))]
pub async fn get_port(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    headers: HeaderMap,
) -> AppResult<ApiJson<PortAccess>> {
    let session = find_session(&state, &caller, &id).await?;
    valid_port(port)?;
    let record = state.store.port(&session.id, port).await?;
    Ok(ApiJson(access(&state, &headers, &session.id, port, record.as_ref())))
}

/// The session's opened ports.
#[utoipa::path(get, path = "/v1/sessions/{id}/ports", params(("id" = String, Path)),
    responses((status = 200, body = PortList), (status = 404, body = ErrorBody)))]
pub async fn list_ports(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
) -> AppResult<ApiJson<PortList>> {
    let session = find_session(&state, &caller, &id).await?;
    let records = state.store.ports(&session.id).await?;
    let ports = records.iter().map(|r| access(&state, &headers, &session.id, r.port, Some(r))).collect();
    Ok(ApiJson(PortList { ports }))
}

/// Closes a port to its token and to the public; the API key still reaches it.
#[utoipa::path(delete, path = "/v1/sessions/{id}/ports/{port}", params(("id" = String, Path), ("port" = u16, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn close_port(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
) -> AppResult<StatusCode> {
    let session = find_session(&state, &caller, &id).await?;
    if !state.store.close_port(&session.id, port).await? {
        return Err(AppError::new(ErrorCode::NotFound, format!("port {port} of session {id} is not open")));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Proxies a request to `port` of the session's sandbox; the path after the port's prefix
/// (and the query, less `space_token`) is what the server inside sees.
#[utoipa::path(get, path = "/v1/sessions/{id}/ports/{port}/{path}",
    params(("id" = String, Path), ("port" = u16, Path), ("path" = String, Path, description = "Forwarded as is")),
    description = "Any method. Auth: the API key, the port's token (`X-Space-Port-Token` or `?space_token=`), \
        or none for a public port. WebSocket upgrades pass through.",
    responses((status = 200, description = "The sandbox server's answer"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn proxy_path(State(state): State<AppState>, request: Request) -> Response {
    respond(proxy_path_inner(state, request).await)
}

async fn proxy_path_inner(state: AppState, request: Request) -> AppResult<Response> {
    let (id, port, rest) = split_proxy_path(request.uri().path())
        .ok_or_else(|| AppError::new(ErrorCode::NotFound, "no such endpoint; see /v1/openapi.json"))?;
    let prefix = format!("/v1/sessions/{id}/ports/{port}");
    let (session, caller) = authorize(&state, request.headers(), request.uri(), &id, port).await?;
    let uri = upstream_uri(rest, request.uri().query())?;
    let upstream = Upstream { uri, port, prefix: Some(prefix) };
    forward(&state, session, caller.as_ref(), request, upstream).await
}

/// Middleware of the whole API: a request whose `Host` is `{port}-{session}.{preview
/// domain}` goes to that port, path and all, whatever the path.
pub async fn preview_host(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some((id, port)) = preview_target(&state, request.headers()) else {
        return next.run(request).await;
    };
    respond(preview(state, id, port, request).await)
}

/// A request to `port` of session `id` named by a host, let in by the ports' own rules.
pub(crate) async fn preview_named(state: AppState, id: SessionId, port: u16, request: Request) -> Response {
    respond(preview(state, id, port, request).await)
}

async fn preview(state: AppState, id: SessionId, port: u16, request: Request) -> AppResult<Response> {
    let (session, caller) = authorize(&state, request.headers(), request.uri(), id.as_str(), port).await?;
    let uri = upstream_uri(request.uri().path(), request.uri().query())?;
    forward(&state, session, caller.as_ref(), request, Upstream { uri, port, prefix: None }).await
}

/// Raw TCP to `port` over a WebSocket: binary messages carry the byte stream each way.
#[utoipa::path(get, path = "/v1/sessions/{id}/tunnel/{port}", params(("id" = String, Path), ("port" = u16, Path)),
    description = "WebSocket. Binary messages carry the TCP stream both ways; a close ends it.",
    responses((status = 101, description = "WebSocket upgrade"), (status = 404, body = ErrorBody),
        (status = 502, body = ErrorBody)))]
pub async fn tunnel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(found): Extension<FoundSession>,
    ApiPath((_id, port)): ApiPath<(String, u16)>,
    ApiWebSocket(upgrade): ApiWebSocket,
) -> AppResult<Response> {
    valid_port(port)?;
    let (session, sandbox) = running_sandbox(&state, &caller, found).await?;
    let stream = state.nodes.of(&session)?.connect_port(&sandbox, port).await?;
    tracing::info!(session = %session.id, port, "port tunnel opened");
    Ok(upgrade.on_upgrade(move |socket| async move {
        let _busy = state.activity.busy(&session.id);
        pipe_tunnel(socket, stream).await;
    }))
}

async fn pipe_tunnel(mut socket: WebSocket, stream: space_node_api::PortStream) {
    let (mut from_port, mut to_port) = tokio::io::split(stream);
    let mut buffer = vec![0u8; TUNNEL_CHUNK];
    loop {
        tokio::select! {
            read = from_port.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => if socket.send(Message::Binary(Bytes::copy_from_slice(&buffer[..n]))).await.is_err() {
                    return;
                },
            },
            message = socket.recv() => match message {
                Some(Ok(Message::Binary(data))) => if to_port.write_all(&data).await.is_err() {
                    break;
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Text(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            },
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// The session a proxied request may reach, and whose key it came with (none for a token
/// or a public port), or why not.
async fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    uri: &Uri,
    id: &str,
    port: u16,
) -> AppResult<(Session, Option<Caller>)> {
    valid_port(port)?;
    if let Some(key) = bearer_key(headers) {
        let caller = tenant_caller_of_key(state, key).await?;
        return Ok((find_session(state, &caller, id).await?, Some(caller)));
    }
    let denied = || {
        AppError::new(
            ErrorCode::Unauthorized,
            format!(
                "port {port} of session {id} is private: send the tenant's API key (Authorization: Bearer), or the \
                 port's token (header {PORT_TOKEN_HEADER} or ?{TOKEN_QUERY}=) from POST /v1/sessions/{id}/ports/{port}"
            ),
        )
    };
    let parsed: SessionId = id.parse().map_err(|_| denied())?;
    let record = state.store.port(&parsed, port).await?.ok_or_else(denied)?;
    if !record.public && !token_matches(headers, uri, &record) {
        return Err(denied());
    }
    let session = state.store.session(&record.tenant_id, &parsed).await?.ok_or_else(denied)?;
    Ok((session, None))
}

fn token_matches(headers: &HeaderMap, uri: &Uri, record: &PortRecord) -> bool {
    let header = headers.get(PORT_TOKEN_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let token = header.or_else(|| query_token(uri.query()));
    token.is_some_and(|t| hash_key(&t) == record.token_hash)
}

fn query_token(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes()).find(|(k, _)| k == TOKEN_QUERY).map(|(_, v)| v.into_owned())
}

/// Connects to the port and forwards the request: the session must be running (or wake).
async fn forward(
    state: &AppState,
    session: Session,
    caller: Option<&Caller>,
    request: Request,
    upstream: Upstream,
) -> AppResult<Response> {
    let port = upstream.port;
    let (session, sandbox) = woken_sandbox(state, caller, session).await?;
    let stream = state.nodes.of(&session)?.connect_port(&sandbox, port).await?;
    let busy = state.activity.busy(&session.id);
    let response = proxy::forward(stream, request, upstream, busy).await.map_err(|e| {
        AppError::new(ErrorCode::PortNotListening, format!("port {port} of session {}: {e}", session.id))
    })?;
    Ok(response)
}

/// The proxy's own refusals in the API's envelope; a sandbox server's answers as they are.
/// A preview-host request to `port` of `session` let in by a rule other than the port's own:
/// the E2B endpoint's (an E2B sandbox's ports are public unless it was made with
/// `allowPublicTraffic: false`, and then take its traffic token).
pub(crate) async fn preview_admitted(state: AppState, session: Session, port: u16, request: Request) -> Response {
    let forwarded = async {
        valid_port(port)?;
        let uri = upstream_uri(request.uri().path(), request.uri().query())?;
        forward(&state, session, None, request, Upstream { uri, port, prefix: None }).await
    };
    respond(forwarded.await)
}

fn respond(result: AppResult<Response>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `/v1/sessions/{id}/ports/{port}` and what follows it (`/` at least).
fn split_proxy_path(path: &str) -> Option<(String, u16, &str)> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, rest) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => return None,
    };
    Some((id.to_owned(), port.parse().ok()?, rest))
}

/// The request line's target upstream: `path` and the query without the port token.
fn upstream_uri(path: &str, query: Option<&str>) -> AppResult<Uri> {
    let is_token = |pair: &str| form_urlencoded::parse(pair.as_bytes()).next().is_some_and(|(k, _)| k == TOKEN_QUERY);
    let kept: Vec<&str> =
        query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty() && !is_token(pair)).collect();
    let target = if kept.is_empty() { path.to_owned() } else { format!("{path}?{}", kept.join("&")) };
    target.parse().map_err(|e| AppError::bad_request(format!("invalid request path: {e}")))
}

fn valid_port(port: u16) -> AppResult<()> {
    if port == 0 {
        return Err(AppError::bad_request("ports are 1-65535"));
    }
    Ok(())
}

/// The session and port a preview host names, when the server has a preview domain.
fn preview_target(state: &AppState, headers: &HeaderMap) -> Option<(SessionId, u16)> {
    host_target(state.preview_domain.as_deref()?, headers)
}

/// The session and port a host `{port}-{session}.{domain}` names.
pub(crate) fn host_target(domain: &str, headers: &HeaderMap) -> Option<(SessionId, u16)> {
    let host = headers.get(HOST)?.to_str().ok()?;
    let host = host.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
    let domain = domain.rsplit_once(':').map_or(domain, |(d, _)| d);
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    space_api::ports::parse_preview_label(label)
}

/// The scheme and host a request was sent to, as its client named them: the base of links
/// handed back to it.
pub(crate) fn origin(headers: &HeaderMap) -> (&str, &str) {
    let scheme = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).unwrap_or("http");
    let host = headers.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    (scheme, host)
}

fn access(
    state: &AppState,
    headers: &HeaderMap,
    session: &SessionId,
    port: u16,
    record: Option<&PortRecord>,
) -> PortAccess {
    let (scheme, host) = origin(headers);
    let preview_url = state
        .preview_domain
        .as_deref()
        .map(|domain| format!("{scheme}://{}.{domain}/", space_api::ports::preview_label(session, port)));
    PortAccess {
        port,
        public: record.is_some_and(|r| r.public),
        url: format!("{scheme}://{host}/v1/sessions/{session}/ports/{port}/"),
        preview_url,
        token: None,
        opened_at: record.map(|r| r.created_at),
    }
}

/// A new port token: `pt_` and 32 random bytes in hex.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("pt_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_split_into_session_port_and_rest() {
        let id = "ses_aaaaaaaaaaaaaaaaaaaa";
        assert_eq!(split_proxy_path(&format!("/v1/sessions/{id}/ports/8000/")), Some((id.into(), 8000, "/")));
        assert_eq!(split_proxy_path(&format!("/v1/sessions/{id}/ports/8000/a/b")), Some((id.into(), 8000, "/a/b")));
        assert_eq!(split_proxy_path(&format!("/v1/sessions/{id}/ports/8000")), None);
        assert_eq!(split_proxy_path(&format!("/v1/sessions/{id}/ports/x/")), None);
        assert_eq!(split_proxy_path(&format!("/v1/sessions/{id}/ports/70000/")), None);
    }

    #[test]
    fn the_port_token_never_goes_upstream() {
        assert_eq!(upstream_uri("/a", Some("space_token=pt_x&b=1")).unwrap(), "/a?b=1");
        assert_eq!(upstream_uri("/a", Some("space_token=pt_x")).unwrap(), "/a");
        assert_eq!(upstream_uri("/a", Some("space%5Ftoken=pt_x&c")).unwrap(), "/a?c");
        assert_eq!(upstream_uri("/", None).unwrap(), "/");
        assert_eq!(query_token(Some("a=1&space_token=pt_%41")), Some("pt_A".into()));
        assert_eq!(query_token(Some("a=1")), None);
    }
}
