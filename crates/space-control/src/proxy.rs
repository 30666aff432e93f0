//! Forwarding one HTTP/1.1 request to a server inside a sandbox, over a connection the node
//! opened there: bodies stream both ways, and an upgrade (WebSocket) becomes a byte pipe.
//!
//! Anything the sandbox answers is hostile input, but it only ever reaches the caller who
//! asked for that port: the answer is passed on, minus hop-by-hop headers, as hyper parsed it.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use space_node_api::PortStream;

use crate::activity::Busy;

/// Headers that belong to one connection (RFC 9110 §7.6.1), never forwarded as they are.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Marks a response as the sandbox server's own: passed on as it is, errors included (the
/// API's error envelope is for the API's answers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Proxied;

/// What carries the caller's credentials to this server: never passed to the sandbox.
pub(crate) const PORT_TOKEN_HEADER: &str = "x-space-port-token";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error("the HTTP connection to the sandbox's server failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("the sandbox's server did not answer the request: {0}")]
    Request(#[source] hyper::Error),
}

/// Where and as what the request goes upstream.
pub(crate) struct Upstream {
    /// Path and query as the sandbox's server sees them.
    pub uri: Uri,
    /// The sandbox's port, for its `Host` header.
    pub port: u16,
    /// The path prefix the proxy removed (`X-Forwarded-Prefix`), if any.
    pub prefix: Option<String>,
}

/// Sends `request` to the server at the other end of `stream` and returns its answer. `busy`
/// keeps the session from idling out while the answer streams or the upgraded connection
/// lasts.
pub(crate) async fn forward(
    stream: PortStream,
    mut request: Request,
    upstream: Upstream,
    busy: Busy,
) -> Result<Response, ProxyError> {
    let upgrade = wants_upgrade(request.headers()).then(|| hyper::upgrade::on(&mut request));
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ProxyError::Handshake)?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "port proxy connection ended");
        }
    });
    let (mut parts, body) = request.into_parts();
    let carried = upgrade.is_some().then(|| upgrade_headers(&parts.headers));
    rewrite_request_headers(&mut parts.headers, &upstream);
    if let Some(headers) = carried {
        parts.headers.extend(headers);
    }
    parts.uri = upstream.uri;
    let mut response = sender.send_request(Request::from_parts(parts, body)).await.map_err(ProxyError::Request)?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client) = upgrade
    {
        let kept = upgrade_headers(response.headers());
        let server = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            pipe_upgraded(client, server).await;
            drop(busy);
        });
        let (mut parts, _) = response.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        parts.headers.extend(kept);
        parts.extensions.insert(Proxied);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = response.into_parts();
    remove_hop_by_hop(&mut parts.headers);
    parts.extensions.insert(Proxied);
    Ok(Response::from_parts(parts, Body::new(Held { body, _busy: busy })))
}

/// A response body that keeps its session busy until it has been sent (or dropped).
struct Held {
    body: hyper::body::Incoming,
    _busy: Busy,
}

impl hyper::body::Body for Held {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Copies bytes both ways between the caller's and the server's upgraded connections until
/// either side ends.
async fn pipe_upgraded(client: hyper::upgrade::OnUpgrade, server: hyper::upgrade::OnUpgrade) {
    let (client, server) = match tokio::try_join!(client, server) {
        Ok(both) => both,
        Err(e) => return tracing::debug!(error = %e, "port proxy upgrade failed"),
    };
    let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
        tracing::debug!(error = %e, "port proxy upgraded connection ended");
    }
}

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim)
}

/// `Connection: upgrade` and the `Upgrade` header, which an upgrade must carry across.
fn upgrade_headers(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    if let Some(protocol) = headers.get(header::UPGRADE) {
        kept.insert(header::UPGRADE, protocol.clone());
        kept.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    kept
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> =
        connection_tokens(headers).filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok()).collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
}

/// The request's headers as the sandbox's server gets them: no hop-by-hop headers, none of
/// the caller's credentials, `Host` naming the server's own port and the original host and
/// scheme in `X-Forwarded-*`.
fn rewrite_request_headers(headers: &mut HeaderMap, upstream: &Upstream) {
    remove_hop_by_hop(headers);
    headers.remove(header::AUTHORIZATION);
    headers.remove(PORT_TOKEN_HEADER);
    if let Some(host) = headers.remove(header::HOST) {
        headers.insert(HeaderName::from_static("x-forwarded-host"), host);
    }
    if let Ok(host) = HeaderValue::from_str(&format!("localhost:{}", upstream.port)) {
        headers.insert(header::HOST, host);
    }
    headers.entry(HeaderName::from_static("x-forwarded-proto")).or_insert(HeaderValue::from_static("http"));
    if let Some(prefix) = upstream.prefix.as_deref().and_then(|p| HeaderValue::from_str(p).ok()) {
        headers.insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        let mut map = headers(&[
            ("authorization", "Bearer sk_secret"),
            ("x-space-port-token", "pt_secret"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("host", "api.example:8080"),
            ("accept", "text/html"),
        ]);
        let upstream = Upstream { uri: Uri::from_static("/"), port: 8000, prefix: Some("/v1/x".into()) };
        rewrite_request_headers(&mut map, &upstream);
        for gone in ["authorization", "x-space-port-token", "connection", "x-private", "keep-alive", "te"] {
            assert!(!map.contains_key(gone), "{gone} was forwarded");
        }
        assert_eq!(map["host"], "localhost:8000");
        assert_eq!(map["x-forwarded-host"], "api.example:8080");
        assert_eq!(map["x-forwarded-prefix"], "/v1/x");
        assert_eq!(map["accept"], "text/html");
    }

    #[test]
    fn only_a_connection_upgrade_is_an_upgrade() {
        assert!(wants_upgrade(&headers(&[("connection", "keep-alive, Upgrade"), ("upgrade", "websocket")])));
        assert!(!wants_upgrade(&headers(&[("upgrade", "websocket")])));
        assert!(!wants_upgrade(&headers(&[("connection", "upgrade")])));
        let kept = upgrade_headers(&headers(&[("upgrade", "websocket"), ("connection", "Upgrade")]));
        assert_eq!((kept["upgrade"].to_str().unwrap(), kept["connection"].to_str().unwrap()), ("websocket", "upgrade"));
    }
}
