//! The calls the MCP tools make to the space HTTP API, with its errors kept as values (code,
//! status, message) so that a tool can hand them to the model instead of a flattened string.

use bytes::Bytes;
use futures::StreamExt;
use reqwest::{Method, RequestBuilder, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::client::Client;

/// Why a tool call did not get what it asked for.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The API answered with its error envelope (or, rarely, a bare status).
    #[error("{message}")]
    Api { status: u16, code: String, message: String },
    /// The arguments were refused before any request was sent.
    #[error("{0}")]
    Invalid(String),
    /// No answer from the server (down, wrong `--url`, connection cut).
    #[error("cannot reach the space server (check SPACE_URL / --url): {0}")]
    Unreachable(#[source] reqwest::Error),
    /// An answer that is not what this endpoint returns.
    #[error("unexpected answer from the space server: {0}")]
    BadAnswer(#[source] reqwest::Error),
}

impl CallError {
    /// The API's stable error code; local refusals and transport failures get codes of the
    /// same vocabulary, so a model needs to handle one set.
    pub fn code(&self) -> &str {
        match self {
            CallError::Api { code, .. } => code,
            CallError::Invalid(_) => "bad_request",
            CallError::Unreachable(_) => "unavailable",
            CallError::BadAnswer(_) => "internal",
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            CallError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The error as the tool result's JSON: `{"error": {"code", "message", "status"}}`, the
    /// API's envelope plus the HTTP status it came with.
    pub fn to_json(&self) -> Value {
        let mut detail = serde_json::json!({ "code": self.code(), "message": self.to_string() });
        if let Some(status) = self.status() {
            detail["status"] = status.into();
        }
        serde_json::json!({ "error": detail })
    }
}

pub type CallResult<T> = Result<T, CallError>;

/// The space API as the MCP tools use it.
#[derive(Clone)]
pub struct SpaceApi {
    client: Client,
}

impl SpaceApi {
    pub fn new(client: Client) -> SpaceApi {
        SpaceApi { client }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> CallResult<T> {
        json(self.send(self.client.request(Method::GET, path)).await?).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> CallResult<T> {
        json(self.send(self.client.request(Method::POST, path).json(body)).await?).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> CallResult<T> {
        json(self.send(self.client.request(Method::DELETE, path)).await?).await
    }

    /// Uploads `body` as the request body (`PUT …/files/content`).
    pub async fn put_bytes<T: DeserializeOwned>(&self, path: &str, body: Vec<u8>) -> CallResult<T> {
        let request =
            self.client.request(Method::PUT, path).header("content-type", "application/octet-stream").body(body);
        json(self.send(request).await?).await
    }

    /// At most `limit` bytes of a download, and whether there was more. The rest is not read:
    /// the connection is dropped, so a huge file costs no more than `limit`.
    pub async fn get_bytes(&self, path: &str, limit: usize) -> CallResult<(Bytes, bool)> {
        let response = self.send(self.client.request(Method::GET, path)).await?;
        let mut stream = response.bytes_stream();
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(CallError::BadAnswer)?;
            if data.len() + chunk.len() > limit {
                data.extend_from_slice(&chunk[..limit - data.len()]);
                return Ok((data.into(), true));
            }
            data.extend_from_slice(&chunk);
        }
        Ok((data.into(), false))
    }

    async fn send(&self, request: RequestBuilder) -> CallResult<Response> {
        let response = request.send().await.map_err(CallError::Unreachable)?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        Err(api_error(status, &text))
    }
}

async fn json<T: DeserializeOwned>(response: Response) -> CallResult<T> {
    response.json().await.map_err(CallError::BadAnswer)
}

/// The error of a failed response. The code is read as a string, not as
/// [`space_api::ErrorCode`]: a newer server's codes must reach the model too.
pub fn api_error(status: u16, body: &str) -> CallError {
    let envelope: Option<Value> = serde_json::from_str(body).ok();
    let field =
        |name: &str| envelope.as_ref().and_then(|v| v.get("error")).and_then(|e| e.get(name)).and_then(Value::as_str);
    match (field("code"), field("message")) {
        (Some(code), Some(message)) => CallError::Api { status, code: code.to_owned(), message: message.to_owned() },
        _ => CallError::Api {
            status,
            code: fallback_code(status).to_owned(),
            message: format!("HTTP {status}: {}", body.chars().take(500).collect::<String>()),
        },
    }
}

/// A code for an answer without the API's envelope (a proxy in between, say).
fn fallback_code(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        409 => "conflict",
        429 => "limit_exceeded",
        500..=599 => "internal",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_envelope_keeps_its_code_message_and_status() {
        let body = r#"{"error":{"code":"session_suspended","message":"resume it first"}}"#;
        let e = api_error(409, body);
        assert_eq!((e.code(), e.to_string(), e.status()), ("session_suspended", "resume it first".into(), Some(409)));
        assert_eq!(
            e.to_json(),
            serde_json::json!({"error": {"code": "session_suspended", "message": "resume it first", "status": 409}})
        );
    }

    #[test]
    fn an_answer_without_the_envelope_gets_a_code_from_its_status() {
        let e = api_error(404, "<html>nope</html>");
        assert_eq!(e.code(), "not_found");
        assert!(e.to_string().contains("HTTP 404: <html>nope</html>"), "{e}");
        assert_eq!(api_error(502, "").code(), "internal");
    }

    #[test]
    fn local_refusals_are_bad_requests_without_a_status() {
        let e = CallError::Invalid("port must be 1-65535".into());
        assert_eq!(
            e.to_json(),
            serde_json::json!({"error": {"code": "bad_request", "message": "port must be 1-65535"}})
        );
    }
}
