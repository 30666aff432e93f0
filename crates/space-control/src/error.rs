//! Every failure the API reports goes through [`AppError`]: one code, one status, one message.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
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
            format!("session {id} not found; `space session list` shows the sessions you can use"),
        )
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(code = ?self.0.code, message = %self.0.message, "request failed");
        }
        (status, Json(self.0.body())).into_response()
    }
}

impl From<ApiError> for AppError {
    fn from(e: ApiError) -> Self {
        AppError(e)
    }
}

impl From<space_store::StoreError> for AppError {
    fn from(e: space_store::StoreError) -> Self {
        AppError::internal(format!("database error: {e}"))
    }
}

impl From<space_node::NodeError> for AppError {
    fn from(e: space_node::NodeError) -> Self {
        use space_runtime::RuntimeError;
        match e {
            space_node::NodeError::Runtime(RuntimeError::CheckpointUnavailable(why)) => AppError::new(
                ErrorCode::FeatureUnavailable,
                format!(
                    "full snapshots (suspend, resume, fork with processes) need CRIU 4.2 or newer on the node \
                     ({why}); run scripts/install-criu.sh and restart the server, or use disk snapshots"
                ),
            ),
            e => AppError::new(ErrorCode::SandboxUnavailable, format!("node: {e}")),
        }
    }
}

/// Whether `error` or one of its sources is the request body's idle timeout firing.
pub(crate) fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The client stopped sending the body it announced (see `HttpLimits::body_idle_timeout`).
pub(crate) fn body_timeout() -> AppError {
    AppError::new(
        ErrorCode::RequestTimeout,
        "the request body stopped arriving for longer than the server waits; send the whole body without pausing",
    )
}

impl From<JsonRejection> for AppError {
    fn from(e: JsonRejection) -> Self {
        if is_body_timeout(&e) {
            return body_timeout();
        }
        let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ErrorCode::PayloadTooLarge
        } else {
            ErrorCode::BadRequest
        };
        AppError::new(code, format!("invalid JSON body: {}", e.body_text()))
    }
}

impl From<QueryRejection> for AppError {
    fn from(e: QueryRejection) -> Self {
        AppError::bad_request(format!("invalid query string: {}", e.body_text()))
    }
}

impl From<AgentError> for AppError {
    fn from(e: AgentError) -> Self {
        match e {
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

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}
