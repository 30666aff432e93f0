//! The streamable HTTP transport of `space mcp --listen`. It carries the API key's authority,
//! so it binds loopback unless told otherwise, refuses browser requests (an `Origin` header:
//! a web page must not drive it) and Host names that are not local (DNS rebinding), and can
//! require a bearer token.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::api::SpaceApi;
use super::tools::SpaceTools;

pub struct HttpOptions {
    pub addr: SocketAddr,
    pub token: Option<String>,
    pub allow_remote: bool,
}

/// `HOST:PORT`, `[V6]:PORT`, or a bare port on 127.0.0.1.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| format!("{text:?}: the port must be 0-65535"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse().map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:8765 or a port"))
}

/// Refuses what would hand the API key to the network without a token.
fn check(options: &HttpOptions) -> anyhow::Result<()> {
    if options.allow_remote && options.token.as_deref().is_none_or(str::is_empty) {
        bail!("--allow-remote needs --auth-token (or SPACE_MCP_TOKEN): every client of it acts with your API key");
    }
    if !options.addr.ip().is_loopback() && !options.allow_remote {
        bail!(
            "--listen {} is not a loopback address: whoever reaches it acts with your API key. Listen on \
             127.0.0.1 (and forward the port, e.g. over SSH), or pass --allow-remote with --auth-token",
            options.addr
        );
    }
    Ok(())
}

pub async fn serve(api: SpaceApi, options: HttpOptions) -> anyhow::Result<()> {
    check(&options)?;
    let stop = CancellationToken::new();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token()).enforce_origin_validation();
    if options.allow_remote {
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(SpaceTools::new(api.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let mut router = axum::Router::new().nest_service("/mcp", service);
    if let Some(token) = options.token.filter(|t| !t.is_empty()) {
        router = router.layer(middleware::from_fn_with_state(Arc::<str>::from(token), require_token));
    }
    let listener =
        tokio::net::TcpListener::bind(options.addr).await.with_context(|| format!("listening on {}", options.addr))?;
    // Stderr: the address in use (a port of 0 picks one).
    eprintln!("space mcp: serving MCP (streamable HTTP) at http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            stop.cancel();
        })
        .await
        .context("serving MCP over HTTP")
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else { return std::future::pending().await };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn require_token(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        return next.run(request).await;
    }
    let body = "this MCP endpoint needs `Authorization: Bearer TOKEN` (the token given to `space mcp --auth-token`)";
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
}

/// Compares without returning early, so response times do not tell how much of a guess
/// was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_an_address_or_a_port_on_loopback() {
        assert_eq!(parse_listen("8765").unwrap(), "127.0.0.1:8765".parse().unwrap());
        assert_eq!(parse_listen("localhost:8765").unwrap(), "127.0.0.1:8765".parse().unwrap());
        assert_eq!(parse_listen("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(parse_listen("0.0.0.0:80").unwrap(), "0.0.0.0:80".parse().unwrap());
        assert!(parse_listen("example.com:80").is_err());
        assert!(parse_listen("70000").is_err());
    }

    fn options(addr: &str, token: Option<&str>, allow_remote: bool) -> HttpOptions {
        HttpOptions { addr: addr.parse().unwrap(), token: token.map(str::to_owned), allow_remote }
    }

    #[test]
    fn a_non_loopback_address_needs_allow_remote_and_a_token() {
        assert!(check(&options("127.0.0.1:1", None, false)).is_ok());
        assert!(check(&options("[::1]:1", None, false)).is_ok());
        let e = check(&options("0.0.0.0:1", None, false)).unwrap_err().to_string();
        assert!(e.contains("not a loopback address"), "{e}");
        let e = check(&options("0.0.0.0:1", None, true)).unwrap_err().to_string();
        assert!(e.contains("needs --auth-token"), "{e}");
        assert!(check(&options("0.0.0.0:1", Some(""), true)).is_err());
        assert!(check(&options("0.0.0.0:1", Some("s3cret"), true)).is_ok());
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
