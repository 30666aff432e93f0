//! Forwarding HTTP requests: one upstream connection per client connection (reconnected
//! when the destination changes or the upstream closed it), bodies streamed both ways.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::SandboxContext;

use super::audit::{Counted, Direction, Record};
use super::policy::Dest;
use super::upstream::{self, UpstreamError};
use super::{RespBody, text};

/// The body sent upstream: the client's, counted.
pub(crate) type ReqBody = Counted<Incoming>;

/// Where requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// What is connected to (a name is resolved).
    pub(crate) dest: Dest,
    pub(crate) port: u16,
    /// TLS with this server name, or plain TCP.
    pub(crate) tls_name: Option<String>,
    /// Addresses already resolved (and checked) for `dest`, if any.
    pub(crate) addrs: Option<Vec<SocketAddr>>,
}

/// One client connection's upstream connection.
pub(crate) struct Forwarder {
    current: tokio::sync::Mutex<Option<(Target, SendRequest<ReqBody>)>>,
}

impl Forwarder {
    pub(crate) fn new() -> Forwarder {
        Forwarder { current: tokio::sync::Mutex::new(None) }
    }

    /// Sends `request` to `target`, connecting (again) when needed.
    pub(crate) async fn send(
        &self,
        context: &SandboxContext,
        target: &Target,
        request: Request<ReqBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut current = self.current.lock().await;
        let mut sender = match current.take() {
            Some((t, sender)) if t == *target && !sender.is_closed() => sender,
            _ => open(context, target).await?,
        };
        if sender.ready().await.is_err() {
            sender = open(context, target).await?;
            sender.ready().await.map_err(|e| UpstreamError::Failed(format!("upstream connection: {e}")))?;
        }
        let response = sender.send_request(request).await;
        *current = Some((target.clone(), sender));
        response.map_err(|e| UpstreamError::Failed(format!("upstream request: {e}")))
    }
}

async fn open(context: &SandboxContext, target: &Target) -> Result<SendRequest<ReqBody>, UpstreamError> {
    let addrs = match &target.addrs {
        Some(addrs) => addrs.clone(),
        None => upstream::resolve(context.config(), &target.dest, target.port).await?,
    };
    let tcp = upstream::connect(&addrs).await?;
    let failed = |e: hyper::Error| UpstreamError::Failed(format!("upstream HTTP: {e}"));
    match &target.tls_name {
        Some(name) => {
            let tls = upstream::connect_tls(context.state().client_tls.clone(), name, tcp).await?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(failed)?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("upstream connection: {e}");
                }
            });
            Ok(sender)
        }
        None => {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(failed)?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("upstream connection: {e}");
                }
            });
            Ok(sender)
        }
    }
}

/// Headers that concern one hop, never forwarded.
const HOP_BY_HOP: [&str; 7] =
    ["connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te", "upgrade"];

/// Removes hop-by-hop headers, including those the Connection header names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        // Never let a client hide framing headers this way.
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING && name != header::HOST {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The request as sent upstream: origin-form URI, Host set, hop-by-hop headers removed, body
/// counted into `record`.
pub(crate) fn outgoing(request: Request<Incoming>, host_header: &str, record: &Arc<Record>) -> Request<ReqBody> {
    let (mut parts, body) = request.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = path.parse::<Uri>().unwrap_or_else(|_| Uri::from_static("/"));
    if !parts.headers.contains_key(header::HOST)
        && let Ok(value) = HeaderValue::from_str(host_header)
    {
        parts.headers.insert(header::HOST, value);
    }
    Request::from_parts(parts, Counted::new(body, record.clone(), Direction::Sent))
}

/// Sends `request` and turns the outcome into the client's response (errors as 403 or 502).
pub(crate) async fn relay(
    context: &SandboxContext,
    forwarder: &Forwarder,
    target: &Target,
    request: Request<ReqBody>,
    record: Arc<Record>,
) -> Response<RespBody> {
    match forwarder.send(context, target, request).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Counted::new(body, record, Direction::Received).boxed_unsync())
        }
        Err(UpstreamError::Refused(reason)) => {
            record.update(|e| {
                e.decision = space_api::egress::AuditDecision::Denied;
                e.reason = Some(reason.clone());
                e.credential = None;
            });
            text(http::StatusCode::FORBIDDEN, format!("space gateway: {reason}\n"))
        }
        Err(UpstreamError::Failed(reason)) => {
            record.update(|e| e.reason = Some(reason.clone()));
            text(http::StatusCode::BAD_GATEWAY, format!("space gateway: {reason}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-secret, content-length"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        headers.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        headers.insert("content-length", HeaderValue::from_static("3"));
        headers.insert("accept", HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut headers);
        let names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["content-length", "accept"]);
    }
}
