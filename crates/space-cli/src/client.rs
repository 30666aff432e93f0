//! HTTP client of the `/v1` API: JSON calls, streamed bodies and WebSockets.

use std::path::Path;

use anyhow::{Context, anyhow};
use reqwest::{Method, RequestBuilder, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use space_api::{ApiError, ErrorBody};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

pub type WsStream = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How often WebSocket clients ping the server: it closes sockets that carry nothing for a
/// while (`space serve --ws-idle-timeout`, 5 minutes by default), and a quiet interactive
/// shell or watch must stay open.
pub const WS_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Clone)]
pub struct Client {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Client {
    /// The server's URL, as given.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The API key this client sends.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A client of the server at `url` (another control replica over the same database)
    /// with this one's key.
    pub fn at(&self, url: &str) -> Client {
        Client { base: url.trim_end_matches('/').to_owned(), ..self.clone() }
    }

    pub fn new(url: &str, key: Option<String>, data_dir: &Path) -> anyhow::Result<Client> {
        let key = match key {
            Some(k) => k,
            None => {
                let path = data_dir.join("admin.key");
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!("no API key: set SPACE_API_KEY or --api-key (could not read {})", path.display())
                    })?
                    .trim()
                    .to_owned()
            }
        };
        Ok(Client { base: url.trim_end_matches('/').to_owned(), key, http: reqwest::Client::new() })
    }

    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.key)
    }

    /// Sends and turns API errors into readable messages.
    pub async fn send(&self, builder: RequestBuilder) -> anyhow::Result<Response> {
        let response =
            builder.send().await.with_context(|| format!("cannot reach the space server at {}", self.base))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(ApiFailure::from_body(status.as_u16(), text.as_bytes()).into())
    }

    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self.send(self.request(Method::GET, path)).await?.json().await?)
    }

    pub async fn post_json<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        Ok(self.send(self.request(Method::POST, path).json(body)).await?.json().await?)
    }

    pub async fn put_json<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        Ok(self.send(self.request(Method::PUT, path).json(body)).await?.json().await?)
    }

    pub async fn patch_json<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        Ok(self.send(self.request(Method::PATCH, path).json(body)).await?.json().await?)
    }

    pub async fn delete_json<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self.send(self.request(Method::DELETE, path)).await?.json().await?)
    }

    /// Opens a WebSocket to `path` with the API key.
    pub async fn websocket(&self, path: &str) -> anyhow::Result<WsStream> {
        let url = format!("{}{path}", self.base.replacen("http", "ws", 1));
        let mut request = url.into_client_request()?;
        let auth = HeaderValue::from_str(&format!("Bearer {}", self.key)).map_err(|e| anyhow!("bad API key: {e}"))?;
        request.headers_mut().insert("authorization", auth);
        match tokio_tungstenite::connect_async(request).await {
            Ok((stream, _)) => Ok(stream),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let body = response.body().as_deref().unwrap_or_default();
                Err(ApiFailure::from_body(response.status().as_u16(), body).into())
            }
            Err(e) => Err(e).with_context(|| format!("cannot open a WebSocket to {}", self.base)),
        }
    }
}

/// An error response of the API: its stable code, message and HTTP status.
#[derive(Debug, thiserror::Error)]
#[error("{message} ({code}, HTTP {status})")]
pub struct ApiFailure {
    pub code: String,
    pub message: String,
    pub status: u16,
}

impl ApiFailure {
    /// Reads an `{"error":{"code","message"}}` body; anything else (a proxy's HTML page)
    /// keeps its text as the message.
    fn from_body(status: u16, body: &[u8]) -> ApiFailure {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(body) => {
                let e = ApiError::from(body);
                let code = serde_json::to_value(e.code).ok().and_then(|v| v.as_str().map(str::to_owned));
                ApiFailure { code: code.unwrap_or_else(|| "error".into()), message: e.message, status }
            }
            Err(_) => {
                let text = String::from_utf8_lossy(body).trim().to_owned();
                ApiFailure { code: "http_error".into(), message: format!("HTTP {status}: {text}"), status }
            }
        }
    }
}

/// Percent-encodes a query value.
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
