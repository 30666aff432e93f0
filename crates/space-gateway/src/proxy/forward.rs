//! Forwarding HTTP requests: one upstream connection per client connection (reconnected
//! when the destination changes or the upstream closed it), bodies streamed both ways, a
//! WebSocket handshake handed to [`upgrade`].

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use space_api::SandboxId;

use crate::SandboxContext;

use super::audit::{Counted, Direction, Record};
use super::policy::Dest;
use super::upgrade;
use super::upstream::{self, UpstreamError};
use super::{MAX_HTTP_BUFFER, RespBody, text};

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

/// One client connection's upstream connection. When the client goes away, a reusable
/// upstream connection goes back to its sandbox's idle pool, so the next client connection
/// to the same destination skips the TCP and TLS handshakes.
pub(crate) struct Forwarder {
    context: Arc<SandboxContext>,
    current: tokio::sync::Mutex<Option<(Target, SendRequest<ReqBody>)>>,
}

impl Forwarder {
    pub(crate) fn new(context: Arc<SandboxContext>) -> Forwarder {
        Forwarder { context, current: tokio::sync::Mutex::new(None) }
    }

    /// Sends `request` to `target`, connecting (again) when needed.
    pub(crate) async fn send(
        &self,
        target: &Target,
        request: Request<ReqBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let context = &*self.context;
        let mut current = self.current.lock().await;
        let mut sender = match current.take() {
            Some((t, sender)) if t == *target && !sender.is_closed() => sender,
            other => {
                if let Some((t, sender)) = other {
                    context.state().idle.put(&context.sandbox, t, sender);
                }
                match context.state().idle.take(&context.sandbox, target) {
                    Some(sender) => sender,
                    None => open(context, target).await?,
                }
            }
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

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some((target, sender)) = self.current.get_mut().take() {
            self.context.state().idle.put(&self.context.sandbox, target, sender);
        }
    }
}

/// How long an idle upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept per sandbox and destination.
const MAX_IDLE_PER_DESTINATION: usize = 8;
/// Idle connections kept per sandbox over all destinations. An idle connection is held by no
/// client connection, so the sandbox's connection limit does not count it: without this a
/// sandbox could leave one behind for every name a wildcard allows.
const MAX_IDLE_PER_SANDBOX: usize = 32;

/// Idle upstream connections, per sandbox (never shared between sandboxes) and destination.
#[derive(Default)]
pub(crate) struct IdlePool {
    idle: Mutex<HashMap<(SandboxId, PoolKey), Vec<IdleSender>>>,
}

/// An idle connection and since when.
type IdleSender = (Instant, SendRequest<ReqBody>);

/// A [`Target`] without its resolved addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    dest: String,
    port: u16,
    tls_name: Option<String>,
}

impl PoolKey {
    fn of(target: &Target) -> PoolKey {
        let dest = match &target.dest {
            Dest::Name(name) => name.clone(),
            Dest::Ip(ip) => ip.to_string(),
        };
        PoolKey { dest, port: target.port, tls_name: target.tls_name.clone() }
    }
}

impl IdlePool {
    fn take(&self, sandbox: &SandboxId, target: &Target) -> Option<SendRequest<ReqBody>> {
        let mut idle = self.idle.lock().ok()?;
        let key = (sandbox.clone(), PoolKey::of(target));
        let senders = idle.get_mut(&key)?;
        let found = std::iter::from_fn(|| senders.pop())
            .find(|(since, sender)| since.elapsed() < IDLE_TIMEOUT && !sender.is_closed())
            .map(|(_, sender)| sender);
        if senders.is_empty() {
            idle.remove(&key);
        }
        found
    }

    fn put(&self, sandbox: &SandboxId, target: Target, sender: SendRequest<ReqBody>) {
        // Only a connection with no request in flight can serve another client.
        if sender.is_closed() || !sender.is_ready() {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else { return };
        let now = Instant::now();
        idle.retain(|_, senders| {
            senders.retain(|(since, sender)| now.duration_since(*since) < IDLE_TIMEOUT && !sender.is_closed());
            !senders.is_empty()
        });
        let held: usize =
            idle.iter().filter(|((owner, _), _)| owner == sandbox).map(|(_, senders)| senders.len()).sum();
        if held >= MAX_IDLE_PER_SANDBOX {
            return;
        }
        let senders = idle.entry((sandbox.clone(), PoolKey::of(&target))).or_default();
        if senders.len() < MAX_IDLE_PER_DESTINATION {
            senders.push((now, sender));
        }
    }

    /// Drops a sandbox's idle connections (it went away).
    pub(crate) fn forget(&self, sandbox: &SandboxId) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain(|(owner, _), _| owner != sandbox);
        }
    }
}

async fn open(context: &SandboxContext, target: &Target) -> Result<SendRequest<ReqBody>, UpstreamError> {
    let addrs = match &target.addrs {
        Some(addrs) => addrs.clone(),
        None => context.state().resolver.resolve(&target.dest, target.port).await?,
    };
    let tcp = upstream::connect(&addrs).await?;
    let failed = |e: hyper::Error| UpstreamError::Failed(format!("upstream HTTP: {e}"));
    let mut client = hyper::client::conn::http1::Builder::new();
    client.max_buf_size(MAX_HTTP_BUFFER);
    match &target.tls_name {
        Some(name) => {
            let tls = upstream::connect_tls(context.state().client_tls.clone(), name, tcp).await?;
            let (sender, conn) = client.handshake(TokioIo::new(tls)).await.map_err(failed)?;
            tokio::spawn(drive(conn.with_upgrades()));
            Ok(sender)
        }
        None => {
            let (sender, conn) = client.handshake(TokioIo::new(tcp)).await.map_err(failed)?;
            tokio::spawn(drive(conn.with_upgrades()));
            Ok(sender)
        }
    }
}

/// Runs an upstream connection until it closes or is handed over to a WebSocket.
async fn drive(conn: impl Future<Output = hyper::Result<()>>) {
    if let Err(e) = conn.await {
        tracing::debug!("upstream connection: {e}");
    }
}

/// Headers that concern one hop, never forwarded.
const HOP_BY_HOP: [&str; 7] =
    ["connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te", "upgrade"];

/// The comma-separated tokens of every `Connection` header, trimmed.
pub(crate) fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim)
}

/// Removes hop-by-hop headers, including those the Connection header names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> =
        connection_tokens(headers).filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok()).collect();
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

/// The request as sent upstream: origin-form URI, Host set, hop-by-hop headers removed (but
/// a WebSocket handshake's), body counted into `record`.
pub(crate) fn outgoing(request: Request<Incoming>, host_header: &str, record: &Arc<Record>) -> Request<ReqBody> {
    let (mut parts, body) = request.into_parts();
    let websocket = upgrade::is_websocket(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if websocket {
        upgrade::set_websocket_headers(&mut parts.headers);
    }
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
/// A WebSocket handshake the upstream accepts goes on as a splice of the two connections.
pub(crate) async fn relay(
    forwarder: &Forwarder,
    target: &Target,
    mut request: Request<ReqBody>,
    record: Arc<Record>,
) -> Response<RespBody> {
    let client_side = upgrade::is_websocket(request.headers()).then(|| hyper::upgrade::on(&mut request));
    match forwarder.send(target, request).await {
        Ok(mut response) => {
            let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
            if switched {
                // Spliced only when both sides agreed on WebSocket: after any other switch the
                // sandbox could talk HTTP to the upstream past every check.
                let Some(client_side) = client_side.filter(|_| upgrade::is_websocket(response.headers())) else {
                    let reason = "the upstream switched protocols without a WebSocket handshake";
                    record.update(|e| e.reason = Some(reason.into()));
                    return text(StatusCode::BAD_GATEWAY, format!("space gateway: {reason}\n"));
                };
                let upstream_side = hyper::upgrade::on(&mut response);
                tokio::spawn(upgrade::splice(client_side, upstream_side, record.clone()));
            }
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            if switched {
                upgrade::set_websocket_headers(&mut parts.headers);
            }
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
            record.update(|e| {
                space_metrics::gateway_upstream_error(&e.protocol);
                e.reason = Some(reason.clone());
            });
            text(http::StatusCode::BAD_GATEWAY, format!("space gateway: {reason}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ready upstream connection to nobody in particular (an in-memory pipe, whose other
    /// end goes into `ends` to keep it open).
    async fn sender(ends: &mut Vec<tokio::io::DuplexStream>) -> SendRequest<ReqBody> {
        let (ours, theirs) = tokio::io::duplex(1024);
        ends.push(theirs);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(ours)).await.unwrap();
        tokio::spawn(conn);
        sender.ready().await.unwrap();
        sender
    }

    fn idle_count(pool: &IdlePool, sandbox: &SandboxId) -> usize {
        let idle = pool.idle.lock().unwrap();
        idle.iter().filter(|((owner, _), _)| owner == sandbox).map(|(_, senders)| senders.len()).sum()
    }

    #[tokio::test]
    async fn a_sandbox_keeps_a_bounded_number_of_idle_connections() {
        let pool = IdlePool::default();
        let (sandbox, other) = (SandboxId::generate(), SandboxId::generate());
        let mut ends = Vec::new();
        // One destination: 8 at most.
        for _ in 0..12 {
            let target = Target { dest: Dest::Name("a.test".into()), port: 80, tls_name: None, addrs: None };
            pool.put(&sandbox, target, sender(&mut ends).await);
        }
        assert_eq!(idle_count(&pool, &sandbox), MAX_IDLE_PER_DESTINATION);
        // Many destinations (every name under an allowed wildcard): 32 at most in all.
        for i in 0..2 * MAX_IDLE_PER_SANDBOX {
            let target = Target { dest: Dest::Name(format!("n{i}.test")), port: 80, tls_name: None, addrs: None };
            pool.put(&sandbox, target, sender(&mut ends).await);
        }
        assert_eq!(idle_count(&pool, &sandbox), MAX_IDLE_PER_SANDBOX);
        // Another sandbox has its own allowance.
        let target = Target { dest: Dest::Name("a.test".into()), port: 80, tls_name: None, addrs: None };
        pool.put(&other, target, sender(&mut ends).await);
        assert_eq!(idle_count(&pool, &other), 1);
    }

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
