//! The Connect RPC protocol (connectrpc.com/docs/protocol) as envd's clients speak it: HTTP/1.1,
//! the JSON codec, unary calls and streams. Both E2B SDKs send JSON (`useBinaryFormat: false`
//! in JS, a JSON codec in Python); a binary (`application/proto`) call is answered 415, as
//! the protocol says for a codec the server does not support.
//!
//! A message is at most [`MAX_MESSAGE`] bytes: a larger one, or a malformed envelope, is a
//! Connect error, never a panic or an unbounded read.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use space_api::ErrorCode;
use space_api::error::clip;

use crate::error::AppError;

/// Largest message accepted in either direction (file contents go through `/files`).
pub const MAX_MESSAGE: usize = 4 << 20;
/// Envelope flag: the message is compressed (never negotiated, so refused).
const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message, which carries the error if any.
const FLAG_END: u8 = 0x02;
const STREAM_JSON: &str = "application/connect+json";
const UNARY_JSON: &str = "application/json";

/// Connect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    /// The HTTP status of a unary error with this code (the protocol's table).
    fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::FailedPrecondition => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A failed call: its code and a message for the user.
#[derive(Debug, Clone, Serialize)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidArgument, message)
    }
}

impl From<AppError> for RpcError {
    fn from(error: AppError) -> RpcError {
        let code = match error.0.code {
            ErrorCode::NotFound
            | ErrorCode::SnapshotNotFound
            | ErrorCode::FileNotFound
            | ErrorCode::NoSuchProcess
            | ErrorCode::CredentialNotFound => Code::NotFound,
            ErrorCode::Forbidden | ErrorCode::PermissionDenied => Code::PermissionDenied,
            ErrorCode::Unauthorized | ErrorCode::KeyRevoked | ErrorCode::KeyExpired => Code::Unauthenticated,
            ErrorCode::Conflict | ErrorCode::FileExists => Code::AlreadyExists,
            ErrorCode::InvalidState
            | ErrorCode::SessionSuspended
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory
            | ErrorCode::DirectoryNotEmpty => Code::FailedPrecondition,
            ErrorCode::QuotaExceeded
            | ErrorCode::PayloadTooLarge
            | ErrorCode::LimitExceeded
            | ErrorCode::StorageFull
            | ErrorCode::DiskQuotaExceeded => Code::ResourceExhausted,
            ErrorCode::SandboxUnavailable | ErrorCode::DatabaseUnavailable | ErrorCode::BlobStoreUnavailable => {
                Code::Unavailable
            }
            ErrorCode::RequestTimeout | ErrorCode::Timeout => Code::DeadlineExceeded,
            ErrorCode::FeatureUnavailable | ErrorCode::RuntimeUnavailable => Code::Unimplemented,
            code if code.http_status() < 500 => Code::InvalidArgument,
            _ => Code::Internal,
        };
        RpcError::new(code, error.0.message)
    }
}

/// Failures of the node, the agent and the store, as the native API would report them.
macro_rules! through_app_error {
    ($($source:ty),*) => {$(
        impl From<$source> for RpcError {
            fn from(error: $source) -> RpcError {
                AppError::from(error).into()
            }
        }
    )*};
}
through_app_error!(space_node_api::NodeError, space_proto::client::AgentError, space_store::StoreError);

impl IntoResponse for RpcError {
    /// A unary call's error: the code's status and `{"code", "message"}`.
    fn into_response(self) -> Response {
        if self.code == Code::Internal {
            tracing::warn!(message = %self.message, "envd call failed");
        }
        (self.code.http_status(), [(header::CONTENT_TYPE, UNARY_JSON)], serde_json::to_vec(&self).unwrap_or_default())
            .into_response()
    }
}

/// The request message of a unary call (`application/json`).
pub struct Unary<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Unary<T> {
    type Rejection = Response;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Response> {
        match content_type(request.headers()) {
            Some(UNARY_JSON) => {}
            Some("application/proto") => return Err(unsupported_codec()),
            other => {
                let message = format!(
                    "a unary Connect call must be sent as {UNARY_JSON}, not {}",
                    clip(other.unwrap_or("(none)"))
                );
                return Err(RpcError::invalid(message).into_response());
            }
        }
        check_uncompressed(request.headers(), "connect-content-encoding").map_err(IntoResponse::into_response)?;
        let body = axum::body::to_bytes(request.into_body(), MAX_MESSAGE).await.map_err(|_| too_large())?;
        // An empty body is the empty message.
        let body = if body.is_empty() { Bytes::from_static(b"{}") } else { body };
        decode(&body).map(Unary).map_err(IntoResponse::into_response)
    }
}

/// The answer to a unary call.
pub struct Reply<T>(pub T);

impl<T: Serialize> IntoResponse for Reply<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(body) => ([(header::CONTENT_TYPE, UNARY_JSON)], body).into_response(),
            Err(e) => RpcError::new(Code::Internal, format!("encoding the answer: {e}")).into_response(),
        }
    }
}

pub type UnaryResult<T> = Result<Reply<T>, RpcError>;

/// The messages of a streaming request (`application/connect+json`), read one envelope at a
/// time: a client stream's messages arrive while the call runs.
pub struct Envelopes {
    body: axum::body::BodyDataStream,
    buffer: Vec<u8>,
    /// Where the next envelope starts in `buffer` (what is before it was read).
    start: usize,
    ended: bool,
}

impl<S: Send + Sync> FromRequest<S> for Envelopes {
    type Rejection = Response;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Response> {
        match content_type(request.headers()) {
            Some(STREAM_JSON) => {}
            Some("application/connect+proto") => return Err(unsupported_codec()),
            other => {
                let message = format!(
                    "a streaming Connect call must be sent as {STREAM_JSON}, not {}",
                    clip(other.unwrap_or("(none)"))
                );
                return Err(StreamError(RpcError::invalid(message)).into_response());
            }
        }
        if let Err(e) = check_uncompressed(request.headers(), "connect-content-encoding") {
            return Err(StreamError(e).into_response());
        }
        Ok(Envelopes { body: request.into_body().into_data_stream(), buffer: Vec::new(), start: 0, ended: false })
    }
}

impl Envelopes {
    /// The next message, `None` at the end of the request.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, RpcError> {
        loop {
            if let Some(frame) = self.take_frame()? {
                // Many small messages in one chunk must not hold the thread for all of them.
                tokio::task::coop::consume_budget().await;
                return decode(&frame).map(Some);
            }
            if self.ended {
                if self.start < self.buffer.len() {
                    return Err(RpcError::invalid("the request ended inside an envelope"));
                }
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    // What was read goes before more is added: the buffer holds at most one
                    // envelope and a chunk.
                    self.buffer.drain(..self.start);
                    self.start = 0;
                    self.buffer.extend_from_slice(&chunk);
                }
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("reading the request: {}", clip(&e.to_string())),
                    ));
                }
                None => self.ended = true,
            }
        }
    }

    /// The first (for a server stream: the only) message, which must be there.
    pub async fn first<T: DeserializeOwned>(&mut self) -> Result<T, RpcError> {
        self.next().await?.ok_or_else(|| RpcError::invalid("the request holds no message"))
    }

    fn take_frame(&mut self) -> Result<Option<Vec<u8>>, RpcError> {
        let Some(header) = self.buffer.get(self.start..self.start + 5) else { return Ok(None) };
        let flags = header[0];
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcError::new(Code::Unimplemented, "compressed messages are not supported; send them plain"));
        }
        if length > MAX_MESSAGE {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("a message is at most {MAX_MESSAGE} bytes; this one says {length}"),
            ));
        }
        let body = self.start + 5;
        if self.buffer.len() < body + length {
            return Ok(None);
        }
        let frame = self.buffer[body..body + length].to_vec();
        self.start = body + length;
        if flags & FLAG_END != 0 {
            return Err(RpcError::invalid("a client may not send an end-of-stream message"));
        }
        Ok(Some(frame))
    }
}

/// A streaming call that failed before its first message: a 200 holding only the
/// end-of-stream message, as the protocol wants.
pub struct StreamError(pub RpcError);

impl IntoResponse for StreamError {
    fn into_response(self) -> Response {
        stream_response(futures::stream::iter([Err::<(), _>(self.0)]), None)
    }
}

/// The answer of a streaming call: each item of `messages` in an envelope, then the
/// end-of-stream message (with the error that ended it, if any). With `keepalive`, an idle
/// stream gets that message every interval, so proxies and clients see it alive.
pub fn stream_response<T, S>(messages: S, keepalive: Option<(Duration, T)>) -> Response
where
    T: Serialize + Clone + Send + 'static,
    S: Stream<Item = Result<T, RpcError>> + Send + 'static,
{
    let frames = async_stream(messages, keepalive);
    Response::builder()
        .header(header::CONTENT_TYPE, STREAM_JSON)
        .body(Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn async_stream<T, S>(messages: S, keepalive: Option<(Duration, T)>) -> impl Stream<Item = Bytes> + Send
where
    T: Serialize + Clone + Send + 'static,
    S: Stream<Item = Result<T, RpcError>> + Send + 'static,
{
    let (interval, ping) = match keepalive {
        Some((interval, ping)) => (interval, Some(ping)),
        None => (Duration::from_secs(3600 * 24 * 365), None),
    };
    let state = (Box::pin(messages), false);
    futures::stream::unfold(state, move |(mut messages, done)| {
        let ping = ping.clone();
        async move {
            if done {
                return None;
            }
            let next = tokio::time::timeout(interval, messages.next()).await;
            let (frame, done) = match next {
                Err(_) => match &ping {
                    Some(ping) => (envelope(0, &serde_json::to_vec(ping).unwrap_or_default()), false),
                    None => return Some((Bytes::new(), (messages, false))),
                },
                Ok(Some(Ok(message))) => match serde_json::to_vec(&message) {
                    Ok(json) => (envelope(0, &json), false),
                    Err(e) => (end_frame(Some(RpcError::new(Code::Internal, e.to_string()))), true),
                },
                Ok(Some(Err(error))) => (end_frame(Some(error)), true),
                Ok(None) => (end_frame(None), true),
            };
            Some((frame, (messages, done)))
        }
    })
}

fn end_frame(error: Option<RpcError>) -> Bytes {
    #[derive(Serialize)]
    struct End {
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<RpcError>,
    }
    if let Some(error) = &error
        && error.code == Code::Internal
    {
        tracing::warn!(message = %error.message, "envd stream failed");
    }
    envelope(FLAG_END, &serde_json::to_vec(&End { error }).unwrap_or_default())
}

fn envelope(flags: u8, message: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(flags);
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    frame.into()
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, RpcError> {
    serde_json::from_slice(json)
        .map_err(|e| RpcError::invalid(format!("the message is not valid JSON of this call: {}", clip(&e.to_string()))))
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next().unwrap_or_default().trim())
}

fn check_uncompressed(headers: &HeaderMap, name: &str) -> Result<(), RpcError> {
    match headers.get(name).and_then(|v| v.to_str().ok()) {
        None | Some("identity") => Ok(()),
        Some(other) => Err(RpcError::new(
            Code::Unimplemented,
            format!("{name} {} is not supported; send messages uncompressed", clip(other)),
        )),
    }
}

/// 415, as the protocol answers a codec the server does not speak (with Connect's error
/// body, so that clients show the message).
fn unsupported_codec() -> Response {
    let error = RpcError::new(
        Code::InvalidArgument,
        "this server speaks Connect's JSON codec only: send application/json (useBinaryFormat: false)",
    );
    let mut response = error.into_response();
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    response
        .headers_mut()
        .insert("accept-post", axum::http::HeaderValue::from_static("application/json, application/connect+json"));
    response
}

fn too_large() -> Response {
    RpcError::new(Code::ResourceExhausted, format!("a message is at most {MAX_MESSAGE} bytes")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelopes(bytes: Vec<u8>) -> Envelopes {
        let body = Body::from(bytes).into_data_stream();
        Envelopes { body, buffer: Vec::new(), start: 0, ended: false }
    }

    #[tokio::test]
    async fn envelopes_are_read_one_message_at_a_time() {
        let mut bytes = envelope(0, br#"{"a":1}"#).to_vec();
        bytes.extend_from_slice(&envelope(0, br#"{"a":2}"#));
        let mut reader = envelopes(bytes);
        assert_eq!(reader.next::<serde_json::Value>().await.unwrap().unwrap()["a"], 1);
        assert_eq!(reader.next::<serde_json::Value>().await.unwrap().unwrap()["a"], 2);
        assert!(reader.next::<serde_json::Value>().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn many_small_messages_in_one_chunk_are_read_in_order() {
        let bytes: Vec<u8> =
            (0..2000).flat_map(|i| envelope(0, format!("{{\"a\":{i}}}").as_bytes()).to_vec()).collect();
        let mut reader = envelopes(bytes);
        for i in 0..2000 {
            assert_eq!(reader.next::<serde_json::Value>().await.unwrap().unwrap()["a"], i);
        }
        assert!(reader.next::<serde_json::Value>().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn malformed_envelopes_are_connect_errors() {
        let cut = envelope(0, br#"{"a":1}"#)[..7].to_vec();
        let error = envelopes(cut).next::<serde_json::Value>().await.unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
        let huge = [&[0u8][..], &u32::MAX.to_be_bytes()].concat();
        let error = envelopes(huge).next::<serde_json::Value>().await.unwrap_err();
        assert_eq!(error.code, Code::ResourceExhausted);
        let compressed = envelope(FLAG_COMPRESSED, b"{}").to_vec();
        assert_eq!(envelopes(compressed).next::<serde_json::Value>().await.unwrap_err().code, Code::Unimplemented);
        let not_json = envelope(0, b"{no").to_vec();
        assert_eq!(envelopes(not_json).next::<serde_json::Value>().await.unwrap_err().code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn a_stream_ends_with_its_error_in_the_end_message() {
        let items = futures::stream::iter([Ok(serde_json::json!({"x": 1})), Err(RpcError::invalid("bad"))]);
        let response = stream_response(items, None);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let mut reader =
            Envelopes { body: Body::empty().into_data_stream(), buffer: body.to_vec(), start: 0, ended: true };
        assert_eq!(reader.take_frame().unwrap().unwrap(), br#"{"x":1}"#);
        assert_eq!(reader.buffer[reader.start], FLAG_END);
        let end: serde_json::Value = serde_json::from_slice(&reader.buffer[reader.start + 5..]).unwrap();
        assert_eq!(end["error"]["code"], "invalid_argument");
    }
}
