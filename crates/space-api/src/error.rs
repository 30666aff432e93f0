//! The one error envelope of the API: a stable machine code, the HTTP status it maps to, and
//! a message that tells the user what to do.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Stable machine-readable error codes. Never renamed once released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    InvalidState,
    IdempotencyConflict,
    PayloadTooLarge,
    UnknownTemplate,
    SnapshotNotFound,
    CredentialNotFound,
    /// The server lacks what the feature needs (e.g. CRIU for full snapshots).
    FeatureUnavailable,
    SandboxUnavailable,
    FileNotFound,
    FileExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    PermissionDenied,
    NoSuchProcess,
    Timeout,
    Internal,
    /// The client stopped sending the request body for longer than the server waits.
    RequestTimeout,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest
            | ErrorCode::UnknownTemplate
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory
            | ErrorCode::DirectoryNotEmpty => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden | ErrorCode::PermissionDenied => 403,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::NotFound
            | ErrorCode::FileNotFound
            | ErrorCode::NoSuchProcess
            | ErrorCode::SnapshotNotFound
            | ErrorCode::CredentialNotFound => 404,
            ErrorCode::Conflict | ErrorCode::InvalidState | ErrorCode::IdempotencyConflict | ErrorCode::FileExists => {
                409
            }
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::FeatureUnavailable => 501,
            ErrorCode::SandboxUnavailable => 503,
            ErrorCode::Timeout => 504,
            ErrorCode::Internal => 500,
        }
    }
}

/// JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

/// An API error as a value: code plus message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn status(&self) -> u16 {
        self.code.http_status()
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code: self.code, message: self.message.clone() } }
    }
}

impl From<ErrorBody> for ApiError {
    fn from(body: ErrorBody) -> Self {
        ApiError { code: body.error.code, message: body.error.message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_status_of_its_own_class() {
        assert_eq!(ErrorCode::RequestTimeout.http_status(), 408);
        assert_eq!(serde_json::to_string(&ErrorCode::RequestTimeout).unwrap(), "\"request_timeout\"");
    }
}
