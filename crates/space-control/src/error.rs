//! Every failure the API reports goes through [`AppError`]: one code, one status, one message.

use axum::Json;
use axum::body::to_bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use space_api::error::{clip, echo};
use space_api::{ApiError, ErrorCode};
use space_proto::ErrorKind;
use space_proto::client::AgentError;

#[derive(Debug)]
pub struct AppError(pub ApiError);

pub type AppResult<T> = Result<T, AppError>;

impl AppError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AppError(ApiError::new(code, message))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn session_not_found(id: &str) -> Self {
        Self::new(
            ErrorCode::NotFound,
            format!("session {} not found; `space session list` shows the sessions you can use", clip(id)),
        )
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(code = ?self.0.code, message = %self.0.message, "request failed");
        }
        let mut response = (status, Json(self.0.body())).into_response();
        if self.0.code == ErrorCode::DatabaseUnavailable {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static(DATABASE_RETRY_AFTER));
        }
        response
    }
}

/// Seconds a client is told to wait before retrying a request the database could not serve.
const DATABASE_RETRY_AFTER: &str = "2";

impl From<ApiError> for AppError {
    fn from(e: ApiError) -> Self {
        AppError(e)
    }
}

impl From<space_store::StoreError> for AppError {
    fn from(e: space_store::StoreError) -> Self {
        match e {
            space_store::StoreError::QuotaExceeded(over) => quota_exceeded(&over),
            e if e.is_unavailable() => AppError::new(
                ErrorCode::DatabaseUnavailable,
                format!(
                    "the control plane's database cannot be reached right now ({e}); retry in a few seconds \
                     (a request that changes something with the same Idempotency-Key, which makes the retry safe)"
                ),
            ),
            e => AppError::internal(format!("database error: {e}")),
        }
    }
}

/// 429 `quota_exceeded`: the limit, what is in use and what was asked for (from the store),
/// then what to do.
fn quota_exceeded(over: &space_store::QuotaExceeded) -> AppError {
    use space_store::QuotaLimit;
    let what_to_do = match over.limit {
        QuotaLimit::Cpus | QuotaLimit::MemoryMib => {
            "suspend or destroy sessions to free CPUs and memory, ask for less, or ask the operator to raise the quota"
        }
        QuotaLimit::Sessions | QuotaLimit::DiskMib | QuotaLimit::UnlimitedDisk => {
            "destroy sessions you no longer need, or ask the operator to raise the quota"
        }
        QuotaLimit::KeptSnapshots => {
            return AppError::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "{over}; delete some (DELETE /v1/sessions/{{id}}/snapshots/{{snapshot}}) before keeping another"
                ),
            );
        }
    };
    AppError::new(
        ErrorCode::QuotaExceeded,
        format!("{over}; {what_to_do} (`space tenant quota {}` shows it)", over.tenant),
    )
}

impl From<space_node_api::NodeError> for AppError {
    fn from(e: space_node_api::NodeError) -> Self {
        use space_node_api::{NodeError, OutOfSpace, PortFailure};
        match e {
            // Tenants' own templates (`scope..name`) are nobody else's to learn of.
            NodeError::UnknownTemplate { name, available } => {
                let global: Vec<&str> = available.split(", ").filter(|n| !n.contains("..")).collect();
                let name = name.rsplit("..").next().unwrap_or_default();
                AppError::new(
                    ErrorCode::UnknownTemplate,
                    format!("unknown template {name:?}; available: {}", global.join(", ")),
                )
            }
            NodeError::RuntimeUnavailable { .. } => AppError::new(ErrorCode::RuntimeUnavailable, e.to_string()),
            NodeError::CheckpointUnavailable(why) => AppError::new(
                ErrorCode::FeatureUnavailable,
                format!(
                    "full snapshots (suspend, resume, fork with processes) need CRIU 4.2 or newer on the node \
                     ({why}); run scripts/install-criu.sh and restart the server, or use disk snapshots"
                ),
            ),
            NodeError::OutOfSpace { which: OutOfSpace::Pool, source } => {
                AppError::new(ErrorCode::StorageFull, format!("{STORAGE_FULL} ({source})"))
            }
            NodeError::OutOfSpace { which: OutOfSpace::Quota, source } => {
                AppError::new(ErrorCode::DiskQuotaExceeded, format!("{QUOTA_EXCEEDED} ({source})"))
            }
            NodeError::Port { failure: PortFailure::Unreachable, source } => {
                AppError::new(ErrorCode::PortNotListening, source.to_string())
            }
            NodeError::Port { failure: PortFailure::Reserved, source } => {
                AppError::new(ErrorCode::PortReserved, source.to_string())
            }
            NodeError::Corrupt(why) => AppError::new(
                ErrorCode::SnapshotCorrupt,
                format!("the snapshot's copy in the blob store is corrupt ({why}); restore an older snapshot"),
            ),
            NodeError::BuildFailed(message) => AppError::new(ErrorCode::BuildFailed, message),
            e => AppError::new(ErrorCode::SandboxUnavailable, format!("node: {e}")),
        }
    }
}

const STORAGE_FULL: &str = "the node's storage pool is full: delete snapshots and sessions you no longer need, \
     or ask the operator to give the pool more space";
const QUOTA_EXCEEDED: &str = "the session's disk limit is reached: delete files or snapshots of the session, or use \
     a session with a larger disk_mib";

/// Whether `error` or one of its sources is an `E`.
pub(crate) fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<E>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// Whether `error` comes from the request body's idle timeout firing.
pub(crate) fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    caused_by::<tower_http::timeout::TimeoutError>(error)
}

/// Why a request body could not be buffered whole: too large, too
/// slow, or malformed (e.g. broken chunked encoding).
pub(crate) fn unreadable_body(error: &axum::Error) -> AppError {
    if is_body_timeout(error) {
        body_timeout()
    } else if caused_by::<http_body_util::LengthLimitError>(error) {
        body_too_large()
    } else {
        AppError::bad_request(format!(
            "the request body could not be read ({}); send the request again",
            clip(&error.to_string())
        ))
    }
}

/// The client stopped sending the body it announced (see `HttpLimits::body_idle_timeout`).
pub(crate) fn body_timeout() -> AppError {
    AppError::new(
        ErrorCode::RequestTimeout,
        "the request body stopped arriving for longer than the server waits; send the whole body without pausing",
    )
}

fn body_too_large() -> AppError {
    AppError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the request body is larger than {} KiB; send large data as a file upload \
             (PUT /v1/sessions/{{id}}/files/content), which has no size limit",
            crate::api::JSON_BODY_LIMIT >> 10
        ),
    )
}

impl From<JsonRejection> for AppError {
    fn from(e: JsonRejection) -> Self {
        if is_body_timeout(&e) {
            return body_timeout();
        }
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return body_too_large();
        }
        AppError::bad_request(format!("invalid JSON body: {}", clip(&e.body_text())))
    }
}

impl From<QueryRejection> for AppError {
    fn from(e: QueryRejection) -> Self {
        AppError::bad_request(format!("invalid query string: {}", clip(&e.body_text())))
    }
}

impl From<PathRejection> for AppError {
    fn from(e: PathRejection) -> Self {
        if e.status().is_server_error() {
            return AppError::internal(format!("reading the URL's path parameters: {}", clip(&e.body_text())));
        }
        AppError::bad_request(format!(
            "invalid URL path: {}; /v1/openapi.json lists each endpoint's parameters",
            clip(&e.body_text())
        ))
    }
}

impl From<AgentError> for AppError {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::Remote { kind: kind @ ErrorKind::StorageFull, message } => {
                AppError::new(code_for(kind), format!("{message}: {STORAGE_FULL}"))
            }
            AgentError::Remote { kind: kind @ ErrorKind::QuotaExceeded, message } => {
                AppError::new(code_for(kind), format!("{message}: {QUOTA_EXCEEDED}"))
            }
            AgentError::Remote { kind, message } => AppError::new(code_for(kind), message),
            other => AppError::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "the sandbox agent did not answer properly ({other}); retry, or destroy and recreate the session"
                ),
            ),
        }
    }
}

fn code_for(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::NotFound => ErrorCode::FileNotFound,
        ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        ErrorKind::AlreadyExists => ErrorCode::FileExists,
        ErrorKind::NotADirectory => ErrorCode::NotADirectory,
        ErrorKind::IsADirectory => ErrorCode::IsADirectory,
        ErrorKind::DirectoryNotEmpty => ErrorCode::DirectoryNotEmpty,
        ErrorKind::InvalidInput | ErrorKind::Unsupported => ErrorCode::BadRequest,
        ErrorKind::NoSuchProcess => ErrorCode::NoSuchProcess,
        ErrorKind::StorageFull => ErrorCode::StorageFull,
        ErrorKind::QuotaExceeded => ErrorCode::DiskQuotaExceeded,
        ErrorKind::Other => ErrorCode::Internal,
    }
}

/// `Json<T>` whose rejections use the API's error envelope.
#[derive(Debug, Clone, Copy, Default, axum::extract::FromRequest)]
#[from_request(via(axum::Json), rejection(AppError))]
pub struct ApiJson<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

/// `Query<T>` whose rejections use the API's error envelope.
#[derive(Debug, Clone, Copy, Default, axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(AppError))]
pub struct ApiQuery<T>(pub T);

/// `Path<T>` whose rejections (e.g. a pid that is not a number) use the API's error envelope.
#[derive(Debug, Clone, Copy, Default, axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(AppError))]
pub struct ApiPath<T>(pub T);

/// `WebSocketUpgrade` whose rejections (a plain HTTP request to a WebSocket endpoint) use
/// the API's error envelope.
pub struct ApiWebSocket(pub WebSocketUpgrade);

impl<S: Send + Sync> FromRequestParts<S> for ApiWebSocket {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        match WebSocketUpgrade::from_request_parts(parts, state).await {
            Ok(upgrade) => Ok(ApiWebSocket(upgrade)),
            Err(e) => Err(AppError::new(
                if e.status() == StatusCode::METHOD_NOT_ALLOWED {
                    ErrorCode::MethodNotAllowed
                } else {
                    ErrorCode::BadRequest
                },
                format!(
                    "this endpoint is a WebSocket ({}); connect to it with a WebSocket client (ws:// or wss://)",
                    clip(&e.body_text())
                ),
            )),
        }
    }
}

/// Most bytes of a plain-text error body [`envelope`] reads to quote it.
const PLAIN_ERROR_BODY: usize = 4096;

/// Middleware: puts every error response that is not already in the API's JSON envelope into
/// it. Handlers answer with [`AppError`]; what reaches here without the envelope comes from
/// the framework itself (a 405 for a method a route lacks, an extractor's plain-text
/// rejection), and clients must be able to rely on `{"error":{"code","message"}}` for all.
pub async fn envelope(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    if response.extensions().get::<crate::proxy::Proxied>().is_some() {
        return response;
    }
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = to_bytes(body, PLAIN_ERROR_BODY).await.unwrap_or_default();
    let text = clip(String::from_utf8_lossy(&text).trim());
    let allow = parts.headers.get(header::ALLOW).cloned();
    let error = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = allow.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("other methods");
            AppError::new(
                ErrorCode::MethodNotAllowed,
                format!("{method} is not allowed on {}; it takes {allowed}", echo(&path)),
            )
        }
        StatusCode::PAYLOAD_TOO_LARGE => body_too_large(),
        StatusCode::NOT_FOUND => AppError::new(ErrorCode::NotFound, "no such endpoint; see /v1/openapi.json"),
        StatusCode::UNAUTHORIZED => AppError::new(ErrorCode::Unauthorized, format!("unauthorized: {text}")),
        StatusCode::FORBIDDEN => AppError::new(ErrorCode::Forbidden, format!("forbidden: {text}")),
        StatusCode::REQUEST_TIMEOUT => body_timeout(),
        StatusCode::URI_TOO_LONG => crate::server::uri_too_long(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => crate::server::headers_too_large(),
        s if s.is_client_error() => AppError::bad_request(format!(
            "the request was refused ({s}{}{text}); /v1/openapi.json describes each endpoint",
            if text.is_empty() { "" } else { ": " }
        )),
        s => AppError::internal(format!("{s}{}{text}", if text.is_empty() { "" } else { ": " })),
    };
    let mut fixed = error.into_response();
    if let Some(allow) = allow {
        fixed.headers_mut().insert(header::ALLOW, allow);
    }
    fixed
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::{DefaultBodyLimit, Path};
    use axum::routing::{get, post};
    use tower::ServiceExt;

    use super::*;

    /// Routes whose errors come from the framework, with the API's extractors or without.
    fn app() -> Router {
        Router::new()
            .route("/typed/{pid}", get(|ApiPath(pid): ApiPath<u32>| async move { pid.to_string() }))
            .route("/plain/{pid}", get(|Path(pid): Path<u32>| async move { pid.to_string() }))
            .route("/ws", get(|ApiWebSocket(upgrade): ApiWebSocket| async move { upgrade.on_upgrade(|_| async {}) }))
            .route("/plain-ws", get(|upgrade: WebSocketUpgrade| async move { upgrade.on_upgrade(|_| async {}) }))
            .route("/json", post(|ApiJson(v): ApiJson<serde_json::Value>| async move { ApiJson(v) }))
            .route("/bytes", post(|body: axum::body::Bytes| async move { body.len().to_string() }))
            .layer(DefaultBodyLimit::max(64))
    }

    async fn call(app: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, Option<String>, String) {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let allow = response.headers().get(header::ALLOW).map(|v| v.to_str().unwrap().to_owned());
        let status = response.status();
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, allow, String::from_utf8(bytes.to_vec()).unwrap())
    }

    fn code_of(body: &str) -> (String, String) {
        let body: space_api::ErrorBody = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        (serde_json::to_value(body.error.code).unwrap().as_str().unwrap().to_owned(), body.error.message)
    }

    #[tokio::test]
    async fn framework_errors_get_the_json_envelope_with_a_stable_code() {
        let bare = app();
        let app = crate::api::harden(app());
        for (method, uri, body, status, code) in [
            ("GET", "/typed/abc", "", 400, "bad_request"),
            ("GET", "/plain/abc", "", 400, "bad_request"),
            ("GET", "/ws", "", 400, "bad_request"),
            ("GET", "/plain-ws", "", 400, "bad_request"),
            ("DELETE", "/json", "", 405, "method_not_allowed"),
            ("POST", "/json", &"1".repeat(100), 413, "payload_too_large"),
            ("POST", "/bytes", &"1".repeat(100), 413, "payload_too_large"),
            ("GET", "/nowhere", "", 404, "not_found"),
        ] {
            let (got, _, text) = call(&app, method, uri, body).await;
            assert_eq!(got.as_u16(), status, "{method} {uri}: {text}");
            let (got_code, message) = code_of(&text);
            assert_eq!(got_code, code, "{method} {uri}: {message}");
            assert!(!message.is_empty());
        }
        // Without the layer, these were plain text or empty bodies.
        for (method, uri, body) in [("GET", "/plain/abc", ""), ("DELETE", "/json", ""), ("POST", "/bytes", "1111")] {
            let body = if uri == "/bytes" { "1".repeat(100) } else { body.to_owned() };
            let (_, _, text) = call(&bare, method, uri, &body).await;
            assert!(serde_json::from_str::<space_api::ErrorBody>(&text).is_err(), "{method} {uri}: {text}");
        }
    }

    #[tokio::test]
    async fn a_405_names_the_methods_the_endpoint_takes() {
        let (status, allow, text) = call(&crate::api::harden(app()), "PUT", "/typed/1", "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert!(allow.as_deref().is_some_and(|a| a.contains("GET")), "the Allow header stays: {allow:?}");
        let (_, message) = code_of(&text);
        assert!(message.contains("PUT is not allowed") && message.contains("GET"), "{message}");
    }

    #[tokio::test]
    async fn rejections_quote_little_of_the_input() {
        let app = Router::new()
            .route("/json", post(|ApiJson(v): ApiJson<space_api::ExecRequest>| async move { ApiJson(v.cmd) }));
        let field = "f".repeat(512 << 10);
        let (status, _, text) = call(&app, "POST", "/json", &format!("{{\"{field}\":1}}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (_, message) = code_of(&text);
        assert!(message.len() < 600, "{} bytes", message.len());

        let path = format!("/typed/{}", "9".repeat(8 << 10));
        let (_, _, text) = call(&crate::api::harden(self::app()), "GET", &path, "").await;
        assert!(code_of(&text).1.len() < 600, "{text}");
    }
}
