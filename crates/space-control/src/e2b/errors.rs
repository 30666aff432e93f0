//! E2B's error shape for the control calls: the HTTP status, and `{"code": status,
//! "message": …}` in the body, which the SDKs turn into their exceptions.

use axum::Json;
use axum::http::StatusCode;
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
