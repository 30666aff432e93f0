//! E2B's error shape for the control calls: the HTTP status, and `{"code": status,
//! "message": …}` in the body, which the SDKs turn into their exceptions.

use axum::Json;
use axum::body::to_bytes;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use space_api::ErrorCode;

use crate::error::AppError;

#[derive(Debug, Serialize)]
pub struct E2bError {
    pub code: u16,
    pub message: String,
}

impl E2bError {
    pub fn new(code: u16, message: impl Into<String>) -> E2bError {
        E2bError { code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(400, message)
    }

    pub fn not_found(message: impl Into<String>) -> E2bError {
        E2bError::new(404, message)
    }

    /// A sandbox that does not exist, or is not the caller's (the same answer).
    pub fn no_sandbox(id: &str) -> E2bError {
        let id = space_api::error::clip(id);
        E2bError::not_found(format!("sandbox {id} not found; `Sandbox.list()` shows the sandboxes you can use"))
    }

    /// A feature of E2B's API that space does not offer.
    pub fn unsupported(what: &str, instead: &str) -> E2bError {
        E2bError::new(501, format!("{what} is not supported by space's E2B endpoint; {instead}"))
    }
}

impl From<space_store::StoreError> for E2bError {
    fn from(error: space_store::StoreError) -> E2bError {
        AppError::from(error).into()
    }
}

impl From<AppError> for E2bError {
    fn from(error: AppError) -> E2bError {
        let status = match error.0.code {
            // E2B answers a paused sandbox's calls with 409 too; keep the native message,
            // which says how to resume.
            ErrorCode::UnknownTemplate => 400,
            code => code.http_status(),
        };
        if error.0.code == ErrorCode::NotFound && error.0.message.starts_with("session ") {
            // The native message names the CLI; an E2B user knows sandboxes.
            let id = error.0.message.split_whitespace().nth(1).unwrap_or_default().to_owned();
            return E2bError::no_sandbox(&id);
        }
        E2bError::new(status, error.0.message)
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED {
            tracing::warn!(message = %self.message, "E2B call failed");
        }
        (status, Json(self)).into_response()
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

/// Largest error body read to be rewritten.
const MAX_ERROR_BODY: usize = 4096;

/// Middleware around the whole endpoint: an error answered by the framework or by the
/// native layers it shares (a size limit, a 405) gets E2B's shape, which the SDKs parse
/// (they fail on any other). Connect's own errors (`code` a string) pass as they are.
pub async fn envelope(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    // A sandbox's own answer through a port is the sandbox's to shape.
    let proxied = response.extensions().get::<crate::proxy::Proxied>().is_some();
    if proxied || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, MAX_ERROR_BODY).await.unwrap_or_default();
    let json: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
    let message = match &json {
        Some(value) if value.get("code").is_some() => return Response::from_parts(parts, bytes.into()),
        Some(value) => value.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_owned),
        None => None,
    };
    let message = message.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&bytes).trim().to_owned();
        if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            space_api::error::clip(&text).to_owned()
        }
    });
    let mut response = E2bError::new(status.as_u16(), message).into_response();
    *response.status_mut() = status;
    for name in [header::ALLOW, header::RETRY_AFTER] {
        if let Some(value) = parts.headers.get(&name) {
            response.headers_mut().insert(name, value.clone());
        }
    }
    response
}

/// How much of a refused upload's body is read (and dropped) before the answer (past it, the
/// connection is closed).
const REFUSED_BODY_READ: u64 = 8 << 20;

/// `refused`, once up to [`REFUSED_BODY_READ`] bytes of `body` were read and dropped: a
/// client still sending would otherwise meet a closed connection (a broken pipe) instead of
/// the answer.
pub(super) async fn drained(body: axum::body::Body, refused: E2bError) -> E2bError {
    use futures::TryStreamExt;
    let mut stream = body.into_data_stream();
    let mut read = 0u64;
    while read < REFUSED_BODY_READ {
        match stream.try_next().await {
            Ok(Some(chunk)) => read += chunk.len() as u64,
            _ => break,
        }
    }
    refused
}
