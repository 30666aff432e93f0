//! The HTTP server under the API: the accept loop with its cap on open connections, the
//! read timeouts of HTTP/1 connections, and the limits on a request's line and headers.
//!
//! `axum::serve` has none of these: a client could hold any number of connections open by
//! sending nothing, or a header or body byte now and then.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use space_api::ErrorCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

use crate::error::AppError;

/// Longest request line target (path and query) answered with anything but 414. File paths
/// go in the query and may be 4096 bytes, three times that percent-encoded.
pub const MAX_URI: usize = 16 << 10;
/// Most headers a request may have, and most bytes of them (names, values, separators).
pub const MAX_HEADERS: usize = 100;
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// The HTTP parser's own ceiling on headers, above [`MAX_HEADERS`] so that requests between
/// the two get the API's JSON 431 from [`limit_request_size`]. The parser answers past its
/// ceilings (this many headers, about 400 KiB of them, a 64 KiB request target) before a
/// request exists, with a bare status line.
const PARSER_MAX_HEADERS: usize = 256;

/// Limits of the HTTP server (`ServerConfig::http`).
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Open connections at most, WebSockets included. Past it the server stops accepting:
    /// new connections wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// How long a client has to send a request's headers, counted from when the server
    /// starts waiting for them; this also closes keep-alive connections idle for as long.
    pub header_read_timeout: Duration,
    /// Longest pause within a request body while the server reads it; the request then
    /// fails with 408 `request_timeout`.
    pub body_idle_timeout: Duration,
    /// Exec, attach and watch WebSockets with no traffic either way (output, input, pings)
    /// for this long are closed; an exec's command is then killed.
    pub ws_idle_timeout: Duration,
    /// Largest template upload (`POST /v1/templates/uploads`) accepted, in bytes.
    pub template_upload_max_bytes: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(30),
            body_idle_timeout: Duration::from_secs(60),
            ws_idle_timeout: Duration::from_secs(300),
            template_upload_max_bytes: 16 << 30,
        }
    }
}

pub(crate) fn uri_too_long() -> AppError {
    AppError::new(
        ErrorCode::UriTooLong,
        format!("the request's path and query are longer than {} KiB; send large values in a JSON body", MAX_URI >> 10),
    )
}

pub(crate) fn headers_too_large() -> AppError {
    AppError::new(
        ErrorCode::HeadersTooLarge,
        format!(
            "the request has more than {MAX_HEADERS} headers or {} KiB of them; send fewer or smaller headers",
            MAX_HEADER_BYTES >> 10
        ),
    )
}

/// Middleware: answers requests over [`MAX_URI`] or the header limits with the API's JSON
/// 414 or 431 (the parser's own answers, past its higher ceilings, carry no body).
pub async fn limit_request_size(request: Request, next: Next) -> Response {
    if request.uri().path_and_query().map_or(0, |p| p.as_str().len()) > MAX_URI {
        return uri_too_long().into_response();
    }
    let headers = request.headers();
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return headers_too_large().into_response();
    }
    next.run(request).await
}

/// A connection that holds one of the server's connection permits until it is dropped,
/// after an upgrade too: hyper hands this same object to the WebSocket.
struct Counted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Errors of `accept` that concern one connection only (the next accept may well work).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Request extension: the tasks of changes that run on after their client went away
/// ([`crate::idempotency`] puts every change on one). A graceful stop waits for them, as it
/// waits for open requests.
#[derive(Clone, Default)]
pub struct Detached(tokio_util::task::TaskTracker);

impl Detached {
    pub(crate) fn spawn<F>(&self, run: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0.spawn(run)
    }

    async fn finish(&self) {
        self.0.close();
        if !self.0.is_empty() {
            tracing::info!(changes = self.0.len(), "waiting for changes whose clients have gone to finish");
        }
        self.0.wait().await;
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting, lets open
/// HTTP connections finish their requests, waits for the changes they left running
/// ([`Detached`]) and returns. Upgraded connections (WebSockets) are not waited for.
pub async fn serve_router(
    app: Router,
    listener: TcpListener,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_headers(PARSER_MAX_HEADERS);
    let body_idle = limits.body_idle_timeout;
    let detached = Detached::default();
    let tag = detached.clone();
    // Every body is read through the idle timeout: a handler cannot forget it.
    let service = app.map_request(move |request: Request<Incoming>| {
        let mut request = request.map(|b| TimeoutBody::new(body_idle, b));
        request.extensions_mut().insert(tag.clone());
        request
    });
    let (stop, stopped) = watch::channel(false);
    // Each connection task holds a sender; `recv` returns `None` once all are gone.
    let (running, mut all_done) = mpsc::channel::<()>(1);
    let mut shutdown = pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.map_err(io::Error::other)?,
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Streamed answers (proxied ports, downloads) go out as headers, then
                    // chunks: with Nagle's algorithm a chunk waits for the client's delayed
                    // ACK of the headers.
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // E.g. out of descriptors: retrying at once would spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let io = TokioIo::new(Counted { stream, _permit: permit });
        let connection = http.serve_connection(io, TowerToHyperService::new(service.clone())).with_upgrades();
        let mut stopped = stopped.clone();
        let running = running.clone();
        tokio::spawn(async move {
            let mut connection = pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                }
                // The guard `wait_for` returns must not live across the awaits below.
                () = async { drop(stopped.wait_for(|stop| *stop).await) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(running);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    drop(running);
    let _ = all_done.recv().await;
    detached.finish().await;
    Ok(())
}

/// Helpers for tests that serve a router on 127.0.0.1.
#[cfg(test)]
pub(crate) mod testing {
    use std::net::SocketAddr;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// The client side of a WebSocket in tests.
    pub(crate) type WsClient = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

    /// Serves `app` with `limits` on a free loopback port until the test ends.
    pub(crate) async fn spawn(app: Router, limits: HttpLimits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_router(app, listener, limits, std::future::pending()));
        addr
    }

    /// Limits whose timeouts no test runs into unless it sets them shorter.
    pub(crate) fn patient() -> HttpLimits {
        HttpLimits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(60),
            body_idle_timeout: Duration::from_secs(60),
            ws_idle_timeout: Duration::from_secs(60),
            ..HttpLimits::default()
        }
    }

    /// Reads until the peer closes or `within` passes: what arrived, and whether it closed.
    pub(crate) async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let closed = tokio::time::timeout(within, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .is_ok();
        (String::from_utf8_lossy(&got).into_owned(), closed)
    }

    /// Sends `request` raw on a new connection; the response, read until the server closes.
    pub(crate) async fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert!(closed, "the server kept the connection open: {response}");
        response
    }

    /// The JSON error envelope of a raw HTTP response: (status, code, message).
    pub(crate) fn envelope_of(response: &str) -> (u16, String, String) {
        let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        assert!(response.to_ascii_lowercase().contains("content-type: application/json"), "not JSON: {response}");
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let body: space_api::ErrorBody = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"));
        (status, serde_json::to_value(body.error.code).unwrap().as_str().unwrap().to_owned(), body.error.message)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use axum::routing::{get, post};
    use tokio::io::AsyncWriteExt;

    use super::testing::{envelope_of, patient, raw, read_until_closed, spawn};
    use super::*;
    use crate::error::{ApiJson, ApiWebSocket};

    fn app() -> Router {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(900)).await;
                    "slow"
                }),
            )
            .route("/json", post(|ApiJson(v): ApiJson<serde_json::Value>| async move { ApiJson(v) }))
            .route(
                "/ws",
                get(|ApiWebSocket(upgrade): ApiWebSocket| async move {
                    upgrade.on_upgrade(|mut socket| async move { while let Some(Ok(_)) = socket.recv().await {} })
                }),
            )
    }

    #[tokio::test]
    async fn connections_that_send_no_headers_in_time_are_closed() {
        let limits = HttpLimits { header_read_timeout: Duration::from_millis(300), ..patient() };
        let addr = spawn(app(), limits).await;

        // Half a request, never finished (slowloris).
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let started = Instant::now();
        let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
        assert!(closed && started.elapsed() < Duration::from_secs(3), "a slow header kept the connection");

        // A keep-alive connection idle after its response.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (response, closed) = read_until_closed(&mut idle, Duration::from_secs(5)).await;
        assert!(response.starts_with("HTTP/1.1 200") && closed, "an idle connection stayed open: {response}");

        // The timeout is for reading headers only: a handler may take longer.
        let response = raw(addr, b"GET /slow HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200") && response.ends_with("slow"), "{response}");
    }

    #[tokio::test]
    async fn a_stalled_body_fails_with_408_and_frees_the_connection() {
        let limits = HttpLimits { body_idle_timeout: Duration::from_millis(300), ..patient() };
        let addr = spawn(app(), limits).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = "POST /json HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(b"{\"a\":").await.unwrap();
        let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert!(closed, "the connection stayed open: {response}");
        let (status, code, message) = envelope_of(&response);
        assert_eq!((status, code.as_str()), (408, "request_timeout"), "{message}");
        assert!(message.contains("without pausing"), "{message}");
    }

    /// A request on a connection over the cap waits (in the listen backlog) until another
    /// connection closes; an upgraded WebSocket counts as open.
    #[tokio::test]
    async fn connections_over_the_cap_wait_for_one_to_close() {
        let addr = spawn(app(), HttpLimits { max_connections: 2, ..patient() }).await;
        let first = TcpStream::connect(addr).await.unwrap();
        let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await.unwrap();

        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let (response, _) = read_until_closed(&mut third, Duration::from_millis(500)).await;
        assert_eq!(response, "", "served past the cap");

        drop(first);
        let (response, _) = read_until_closed(&mut third, Duration::from_secs(5)).await;
        assert!(response.starts_with("HTTP/1.1 200"), "not served once a connection closed: {response:?}");

        // The WebSocket and a kept-alive connection fill the cap; the next waits until the
        // WebSocket closes.
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        fourth.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (kept, closed) = read_until_closed(&mut fourth, Duration::from_millis(500)).await;
        assert!(kept.starts_with("HTTP/1.1 200") && !closed, "{kept:?}");
        let mut fifth = TcpStream::connect(addr).await.unwrap();
        fifth.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let (waiting, _) = read_until_closed(&mut fifth, Duration::from_millis(500)).await;
        assert_eq!(waiting, "", "the WebSocket's slot was taken");
        drop(socket);
        let (served, _) = read_until_closed(&mut fifth, Duration::from_secs(5)).await;
        assert!(served.starts_with("HTTP/1.1 200"), "not served once the WebSocket closed: {served:?}");
    }

    #[tokio::test]
    async fn oversized_request_lines_and_headers_get_the_json_envelope() {
        let addr = spawn(crate::api::harden(app()), patient()).await;
        let long = format!("GET /?q={} HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n", "a".repeat(MAX_URI));
        let (status, code, message) = envelope_of(&raw(addr, long.as_bytes()).await);
        assert_eq!((status, code.as_str()), (414, "uri_too_long"), "{message}");

        let many: String = (0..MAX_HEADERS + 20).map(|i| format!("x-h{i}: v\r\n")).collect();
        let request = format!("GET / HTTP/1.1\r\nHost: x\r\nconnection: close\r\n{many}\r\n");
        let (status, code, message) = envelope_of(&raw(addr, request.as_bytes()).await);
        assert_eq!((status, code.as_str()), (431, "headers_too_large"), "{message}");

        let big = format!("GET / HTTP/1.1\r\nconnection: close\r\nx-big: {}\r\n\r\n", "b".repeat(MAX_HEADER_BYTES));
        let (status, code, _) = envelope_of(&raw(addr, big.as_bytes()).await);
        assert_eq!((status, code.as_str()), (431, "headers_too_large"));

        let ok = raw(addr, b"GET / HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_returns() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_router(app(), listener, patient(), async move { drop(stopped.await) }));
        assert!(raw(addr, b"GET / HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n").await.starts_with("HTTP/1.1 200"));
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }
}
