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
    /// The API key was revoked (`DELETE /v1/keys/{id}`, or replaced by a rotation).
    KeyRevoked,
    /// The API key's expiry has passed.
    KeyExpired,
    Forbidden,
    NotFound,
    Conflict,
    InvalidState,
    /// The session is suspended and was not created with `auto_resume`: resume it first.
    SessionSuspended,
    IdempotencyConflict,
    PayloadTooLarge,
    UnknownTemplate,
    /// The session asked for a runtime this server cannot run (the message says why).
    RuntimeUnavailable,
    SnapshotNotFound,
    /// The snapshot's copy in the blob store is not what was stored (a part failed its
    /// checksum, or is gone): it is not restored; restore an older durable snapshot.
    SnapshotCorrupt,
    /// The blob store could not take a snapshot (HTTP 503): the snapshot stays on its node's
    /// disk. Retry, or suspend with `force=true` to keep it there only.
    BlobStoreUnavailable,
    CredentialNotFound,
    /// The server lacks what the feature needs (e.g. CRIU for full snapshots).
    FeatureUnavailable,
    SandboxUnavailable,
    /// The control plane's database could not be reached, or was too busy to answer in time
    /// (HTTP 503, with `Retry-After`): retry the request later.
    DatabaseUnavailable,
    FileNotFound,
    FileExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    PermissionDenied,
    NoSuchProcess,
    Timeout,
    Internal,
    /// The endpoint exists but not with this HTTP method (the `Allow` header lists those it has).
    MethodNotAllowed,
    /// The client stopped sending the request body for longer than the server waits.
    RequestTimeout,
    /// The request line (path and query) is longer than the server accepts.
    UriTooLong,
    /// The request has more headers, or more bytes of them, than the server accepts.
    HeadersTooLarge,
    /// A limit on how many of something may be open at once was reached (the message names it).
    LimitExceeded,
    /// The node's storage pool is full (HTTP 507).
    StorageFull,
    /// The session's disk limit is reached (HTTP 507): its files and the data its snapshots
    /// still hold count against it.
    DiskQuotaExceeded,
    /// Nothing listens on the sandbox's port the request was for, or it did not answer
    /// (HTTP 502).
    PortNotListening,
    /// The port is not the sandbox's to serve on (a linux sandbox's 80, 443 and 3128 are the
    /// egress gateway's).
    PortReserved,
    /// The tenant's quota (sessions, CPUs, memory or disk) would be exceeded (HTTP 429); the
    /// message names the limit, what is in use and what the request asked for.
    QuotaExceeded,
    /// A Dockerfile build failed (HTTP 422): the message names the Dockerfile's line, and
    /// for a `RUN` step its exit status and last output.
    BuildFailed,
    /// A tenant's key (BYOK) cannot be used (HTTP 503): its KMS refused (the key was
    /// disabled, revoked, deleted, or space's access to it removed) or did not answer. The
    /// message names the key; what was sealed with it opens again once the key is usable.
    KeyUnavailable,
    /// An OAuth provider's token endpoint refused or failed (HTTP 502), e.g. during a
    /// sign-in's code exchange: the message says what it answered and what to do.
    OauthFailed,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest
            | ErrorCode::UnknownTemplate
            | ErrorCode::RuntimeUnavailable
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory
            | ErrorCode::DirectoryNotEmpty
            | ErrorCode::PortReserved => 400,
            ErrorCode::Unauthorized | ErrorCode::KeyRevoked | ErrorCode::KeyExpired => 401,
            ErrorCode::Forbidden | ErrorCode::PermissionDenied => 403,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::NotFound
            | ErrorCode::FileNotFound
            | ErrorCode::NoSuchProcess
            | ErrorCode::SnapshotNotFound
            | ErrorCode::CredentialNotFound => 404,
            ErrorCode::Conflict
            | ErrorCode::InvalidState
            | ErrorCode::SessionSuspended
            | ErrorCode::IdempotencyConflict
            | ErrorCode::SnapshotCorrupt
            | ErrorCode::FileExists => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::BuildFailed => 422,
            ErrorCode::UriTooLong => 414,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::LimitExceeded | ErrorCode::QuotaExceeded => 429,
            ErrorCode::FeatureUnavailable => 501,
            ErrorCode::PortNotListening | ErrorCode::OauthFailed => 502,
            ErrorCode::SandboxUnavailable
            | ErrorCode::DatabaseUnavailable
            | ErrorCode::BlobStoreUnavailable
            | ErrorCode::KeyUnavailable => 503,
            ErrorCode::StorageFull | ErrorCode::DiskQuotaExceeded => 507,
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

/// Longest message an error carries. Longer ones lose their middle: what went wrong comes
/// first and what to do last, while the middle is where echoed input (a serde error quoting
/// a megabyte-long field, say) sits.
pub const MAX_MESSAGE: usize = 1024;

/// Most bytes of client input an error message quotes.
pub const MAX_ECHO: usize = 200;

/// `input` quoted for an error message (as `{:?}` does), cut to [`MAX_ECHO`] bytes: a message
/// must stay readable, and must not hand a client back the megabytes it sent.
pub fn echo(input: &str) -> String {
    if input.len() <= MAX_ECHO {
        return format!("{input:?}");
    }
    format!("{:?}… ({} bytes)", &input[..floor_char_boundary(input, MAX_ECHO)], input.len())
}

/// Text from a library that may quote client input (a serde error, an HTTP rejection), cut
/// to a few hundred bytes for an error message.
pub fn clip(text: &str) -> String {
    const MAX_CLIP: usize = 300;
    if text.len() <= MAX_CLIP {
        return text.to_owned();
    }
    format!("{}…", &text[..floor_char_boundary(text, MAX_CLIP)])
}

/// The largest index at most `at` that starts a character of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    (0..=at.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// The first `keep` bytes and the last `keep / 2` of a message longer than [`MAX_MESSAGE`].
fn bounded(message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let head = floor_char_boundary(&message, MAX_MESSAGE * 2 / 3);
    let tail_start = message.len() - MAX_MESSAGE / 4;
    let tail = (tail_start..message.len()).find(|&i| message.is_char_boundary(i)).unwrap_or(message.len());
    format!("{} … {}", &message[..head], &message[tail..])
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: bounded(message.into()) }
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
        for (code, status) in [
            (ErrorCode::MethodNotAllowed, 405),
            (ErrorCode::RequestTimeout, 408),
            (ErrorCode::UriTooLong, 414),
            (ErrorCode::HeadersTooLarge, 431),
            (ErrorCode::KeyRevoked, 401),
            (ErrorCode::KeyExpired, 401),
            (ErrorCode::SessionSuspended, 409),
            (ErrorCode::QuotaExceeded, 429),
        ] {
            assert_eq!(code.http_status(), status, "{code:?}");
        }
        let json = serde_json::to_string(&ErrorCode::HeadersTooLarge).unwrap();
        assert_eq!(json, "\"headers_too_large\"");
    }

    #[test]
    fn echoed_input_and_messages_are_bounded() {
        assert_eq!(echo("gh"), "\"gh\"");
        let huge = "é".repeat(1 << 20);
        let quoted = echo(&huge);
        assert!(quoted.len() < MAX_ECHO + 40 && quoted.ends_with("(2097152 bytes)"), "{quoted}");

        let message = format!("unknown field `{}`, expected `cmd`; send a JSON ExecRequest", "x".repeat(4 << 20));
        let error = ApiError::new(ErrorCode::BadRequest, message);
        assert!(error.message.len() <= MAX_MESSAGE + 8, "{} bytes", error.message.len());
        assert!(error.message.starts_with("unknown field `xxx"), "what went wrong stays: {}", error.message);
        assert!(error.message.ends_with("send a JSON ExecRequest"), "what to do stays: {}", error.message);
        assert!(clip(&huge).len() <= 303 && clip("ok") == "ok");
        let short = ApiError::new(ErrorCode::BadRequest, "short");
        assert_eq!(short.message, "short");
    }
}
