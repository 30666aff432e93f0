//! The data path: the explicit proxy, transparent interception of ports 80 and 443, TLS
//! interception with credential injection, and upstream connections.
//!
//! Everything a sandbox sends is hostile: each connection is its own task, inputs are
//! bounded (HTTP heads of at most [`MAX_HTTP_BUFFER`], a 16 KiB ClientHello with a timeout),
//! a sandbox holds at most its limit of connections (see `limits.rs`), and a failing
//! connection never stops a listener.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use tokio::net::{TcpListener, TcpStream};

use crate::{GatewayConfig, GatewayError, SandboxContext};

use io::Admitted;

mod ambiguity;
mod audit;
mod ca;
mod client_hello;
mod explicit;
mod forward;
mod io;
mod mitm;
mod node_addrs;
mod policy;
mod resolve;
mod transparent;
mod tunnel;
mod upgrade;
mod upstream;

#[cfg(test)]
mod any_host_tests;
#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod tests;

pub(crate) use audit::event as audit_event;
pub(crate) use explicit::serve_explicit;
pub use node_addrs::is_host_address;
pub use resolve::parse_dns_server;
pub(crate) use transparent::{serve_transparent_http, serve_transparent_https};
pub use upstream::is_private;

/// Bodies of the responses the gateway gives the sandbox.
pub(crate) type RespBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// How long an idle client connection may take to send request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// What hyper buffers of one HTTP connection, from the sandbox and from an upstream: once
/// its read buffer holds this much of an incomplete head it gives up (431 to the sandbox, 502
/// for an upstream's), and the read that crossed the line brought at most as much again.
/// Bodies stream through it. Heads larger than common servers accept (8-32 KiB) still fit;
/// hyper's own default is several times more.
pub(crate) const MAX_HTTP_BUFFER: usize = 64 << 10;

/// What every sandbox's data path shares: how upstreams are found and checked, the upstream
/// TLS configuration, the intercepted hosts' certificates and the credentials' rate limits.
pub(crate) struct State {
    pub(crate) resolver: resolve::Resolver,
    pub(crate) client_tls: Arc<rustls::ClientConfig>,
    pub(crate) leaves: ca::LeafCache,
    pub(crate) limits: mitm::RateLimits,
    pub(crate) idle: forward::IdlePool,
}

impl State {
    pub(crate) fn new(config: &GatewayConfig) -> Result<State, GatewayError> {
        let provider = upstream::provider();
        Ok(State {
            resolver: resolve::Resolver::new(config),
            client_tls: upstream::client_config(config, provider.clone())?,
            leaves: ca::LeafCache::new(provider),
            limits: mitm::RateLimits::default(),
            idle: forward::IdlePool::default(),
        })
    }

    /// The same, with `node` standing for the node's own addresses.
    #[cfg(test)]
    pub(crate) fn with_node_addrs(
        config: &GatewayConfig,
        node: impl IntoIterator<Item = std::net::IpAddr>,
    ) -> Result<State, GatewayError> {
        let fixed = node_addrs::NodeAddrs::fixed(node);
        Ok(State { resolver: resolve::Resolver::with_node_addrs(config, fixed), ..State::new(config)? })
    }
}

/// A plain-text response.
pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut response = Response::new(Full::new(body.into()).map_err(|never: Infallible| match never {}).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// An empty response.
pub(crate) fn empty(status: StatusCode) -> Response<RespBody> {
    let mut response =
        Response::new(Full::new(Bytes::new()).map_err(|never: Infallible| match never {}).boxed_unsync());
    *response.status_mut() = status;
    response
}

/// The HTTP/1 server settings for connections from a sandbox.
pub(crate) fn http_server() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(MAX_HTTP_BUFFER);
    builder
}

/// How a listener turns away a connection beyond the sandbox's limit. Either way at once, in
/// the accept loop: a refusal costs no task and never waits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// The proxy and port 80: a `503` (the socket's send buffer is empty, so it is written
    /// without waiting), then the connection is closed.
    Http,
    /// Port 443: there is no TLS session to answer in, so the connection is reset.
    Reset,
}

fn refuse(stream: TcpStream, how: Refusal, max: usize) {
    match how {
        Refusal::Http => {
            let body = format!(
                "space gateway: this sandbox already has {max} connections open through the gateway (its limit); \
                 close some and retry\n"
            );
            let response = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.try_write(response.as_bytes());
        }
        Refusal::Reset => {
            let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Accepts connections for ever, each handled in its own task holding one of the sandbox's
/// connection slots; beyond its limit, connections are refused `how`.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, context: Arc<SandboxContext>, how: Refusal, handle: F)
where
    F: Fn(Admitted, Arc<SandboxContext>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                let Some(slot) = context.admit() else {
                    refuse(stream, how, context.connections.max());
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(handle(Admitted::new(stream, slot), context.clone()));
            }
            Err(e) => {
                // EMFILE and friends: wait a little rather than spin.
                tracing::debug!(sandbox = %context.sandbox, "accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
