//! The data path: the explicit proxy, transparent interception of ports 80 and 443, TLS
//! interception with credential injection, and upstream connections.
//!
//! Everything a sandbox sends is hostile: each connection is its own task, inputs are
//! bounded (hyper's header limits, a 16 KiB ClientHello with a timeout), and a failing
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
mod tests;

pub(crate) use audit::event as audit_event;
pub(crate) use explicit::serve_explicit;
pub use resolve::parse_dns_server;
pub(crate) use transparent::{serve_transparent_http, serve_transparent_https};

/// Bodies of the responses the gateway gives the sandbox.
pub(crate) type RespBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// How long an idle client connection may take to send request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);

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
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    builder
}

/// Accepts connections for ever, each handled in its own task.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, context: Arc<SandboxContext>, handle: F)
where
    F: Fn(TcpStream, Arc<SandboxContext>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(handle(stream, context.clone()));
            }
            Err(e) => {
                // EMFILE and friends: wait a little rather than spin.
                tracing::debug!(sandbox = %context.sandbox, "accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
