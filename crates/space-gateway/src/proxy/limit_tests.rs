//! What one sandbox may hold of the gateway, on loopback: a sandbox that floods its
//! listeners is capped and audited while another sandbox of the same gateway is served, and
//! what one connection buffers is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use space_api::SessionId;
use space_api::egress::{AuditDecision, AuditEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::tests::{Setup, egress, exchange, get, grant, http_client};
use crate::SandboxContext;

const LIMIT: usize = 12;
/// A bound that proves "served, not starved", not "fast".
const PROMPTLY: Duration = Duration::from_secs(10);

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Waits (within [`PROMPTLY`]) until `context` holds `n` connection slots.
async fn until_open(context: &SandboxContext, n: usize) {
    let waited = tokio::time::timeout(PROMPTLY, async {
        while context.open_connections() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{} connections open, not {n}", context.open_connections());
}

/// Everything the gateway sends on `stream` before it closes (a reset counts as a close).
async fn until_closed(mut stream: TcpStream) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(PROMPTLY, async {
        let mut chunk = [0u8; 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection stayed open: {}", String::from_utf8_lossy(&got));
    String::from_utf8_lossy(&got).into_owned()
}

/// `GET http://plain.test/` through the proxy at `proxy`: the status.
async fn plain_get(proxy: SocketAddr) -> StatusCode {
    let served = tokio::time::timeout(PROMPTLY, async {
        let mut sender = http_client(TcpStream::connect(proxy).await.unwrap()).await;
        get(&mut sender, "plain.test", "http://plain.test/", &[]).await.0
    })
    .await;
    served.expect("not served in time")
}

/// The next audit event that is not about the limit (those come when refusals are due).
async fn next_decision(setup: &mut Setup) -> AuditEvent {
    loop {
        let event = setup.event().await;
        if event.protocol != "limit" {
            return event;
        }
    }
}

#[tokio::test]
async fn a_flooding_sandbox_is_capped_and_audited_while_another_is_served() {
    let mut setup = Setup::with(|config| config.limits.max_connections = LIMIT).await;
    let context = setup.context.clone();
    let (http, http_addr) = listener().await;
    let (https, https_addr) = listener().await;
    tokio::spawn(super::serve_transparent_http(http, context.clone()));
    tokio::spawn(super::serve_transparent_https(https, context.clone()));

    // The flood: connections held open without a byte, on the proxy and on port 80.
    let mut held = Vec::new();
    for i in 0..LIMIT {
        let to = if i % 2 == 0 { setup.proxy } else { http_addr };
        held.push(TcpStream::connect(to).await.unwrap());
    }
    until_open(&context, LIMIT).await;

    // Beyond the limit, each listener turns new connections away at once.
    for _ in 0..3 {
        for to in [setup.proxy, http_addr] {
            let answer = until_closed(TcpStream::connect(to).await.unwrap()).await;
            assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
            assert!(answer.contains(&format!("already has {LIMIT} connections open")), "{answer}");
        }
        assert_eq!(until_closed(TcpStream::connect(https_addr).await.unwrap()).await, "");
    }
    assert_eq!(context.open_connections(), LIMIT);
    let event = setup.event().await;
    assert_eq!((event.protocol.as_str(), event.decision), ("limit", AuditDecision::Denied));
    assert_eq!((event.session_id.clone(), event.host.as_str()), (setup.session.clone(), ""));
    // The first refusal is recorded at once; the rest of the burst is counted into a later
    // event (at most one a second), not recorded one by one.
    let reason = event.reason.unwrap();
    assert!(reason.starts_with("1 new connection(s) refused"), "{reason}");
    assert!(reason.contains(&format!("already holds {LIMIT} connections")), "{reason}");

    // Another sandbox of the same gateway has its own allowance and is served.
    let other = SessionId::generate();
    let sibling = context.sibling_for_test(&other, egress(&setup.ca, vec![grant("other")]));
    let (proxy, sibling_proxy) = listener().await;
    tokio::spawn(super::serve_explicit(proxy, sibling.clone()));
    assert_eq!(plain_get(sibling_proxy).await, StatusCode::OK);
    let event = next_decision(&mut setup).await;
    assert_eq!((event.session_id, event.decision), (other, AuditDecision::Allowed));

    // Once the flood lets go, the first sandbox is served again.
    assert!(until_closed(TcpStream::connect(setup.proxy).await.unwrap()).await.starts_with("HTTP/1.1 503 "));
    drop(held);
    until_open(&context, 0).await;
    assert_eq!(plain_get(setup.proxy).await, StatusCode::OK);
}

#[tokio::test]
async fn a_tunnel_keeps_its_connection_slot_until_it_closes() {
    let setup = Setup::with(|config| config.limits.max_connections = 2).await;
    let context = setup.context.clone();
    // After CONNECT the proxy connection's own task is over: the tunnel holds the socket.
    let (status, stream) = setup.connect("other.test:443").await;
    assert_eq!(status, 200);
    let tls = Setup::tls(stream, "other.test", setup.upstream.ca_der.clone()).await.unwrap();
    let mut tunnel = http_client(tls).await;
    assert_eq!(get(&mut tunnel, "other.test", "/", &[]).await.0, StatusCode::OK);
    let idle = TcpStream::connect(setup.proxy).await.unwrap();
    until_open(&context, 2).await;
    assert!(until_closed(TcpStream::connect(setup.proxy).await.unwrap()).await.starts_with("HTTP/1.1 503 "));

    drop(tunnel);
    until_open(&context, 1).await;
    assert_eq!(plain_get(setup.proxy).await, StatusCode::OK);
    drop(idle);
}

#[tokio::test]
async fn what_one_connection_buffers_is_bounded() {
    let setup = Setup::with(|_| {}).await;
    let mut stream = TcpStream::connect(setup.proxy).await.unwrap();
    // A head that fits is forwarded; one larger than the buffer is refused, not buffered.
    let fits = "x".repeat(super::MAX_HTTP_BUFFER / 2);
    let request = format!("GET http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\nx-big: {fits}\r\n\r\n");
    let (status, body) = exchange(&mut stream, &request).await;
    assert_eq!(status, 200, "{body}");
    // The read that crosses the limit may bring up to as much again: beyond that, refused.
    let too_big = "x".repeat(super::MAX_HTTP_BUFFER * 4);
    let request = format!("GET http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\nx-big: {too_big}\r\n\r\n");
    let (mut read, mut write) = TcpStream::connect(setup.proxy).await.unwrap().into_split();
    // The gateway answers before it has read it all, and may reset the connection then.
    tokio::spawn(async move {
        let _ = write.write_all(request.as_bytes()).await;
        std::future::pending::<()>().await;
    });
    let mut status_line = [0u8; 12];
    read.read_exact(&mut status_line).await.unwrap();
    assert_eq!(&status_line, b"HTTP/1.1 431");
}
