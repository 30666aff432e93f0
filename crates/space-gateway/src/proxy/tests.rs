//! In-process tests of the data path on loopback: the explicit proxy in front of a real
//! HTTPS upstream with its own test CA.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use space_api::SessionId;
use space_api::egress::{AuditDecision, AuditEvent, NetworkPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::{GatewayConfig, Grant, SandboxContext, SessionCa, SessionEgress, certificates_from_pem};

const SECRET: &str = "s3cret-value";
const PLACEHOLDER: &str = "space-placeholder-gh";

/// A test CA and an HTTPS server for `api.test` and `other.test` that answers with what it
/// received, and a plain HTTP server doing the same.
pub(super) struct Upstream {
    pub(super) ca_der: CertificateDer<'static>,
    https: SocketAddr,
    http: SocketAddr,
}

async fn echo(mut request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut text = format!("{} {}\n", request.method(), request.uri());
    for (name, value) in request.headers() {
        text.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())));
    }
    if super::upgrade::is_websocket(request.headers()) {
        // Switches, says what it received (ending with "end"), then echoes.
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let Ok(upgraded) = upgrade.await else { return };
            let mut io = TokioIo::new(upgraded);
            let _ = io.write_all(format!("{text}end\n").as_bytes()).await;
            let mut buf = [0u8; 1024];
            while let Ok(n) = io.read(&mut buf).await {
                if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        super::upgrade::set_websocket_headers(response.headers_mut());
        if request.uri().path() == "/switch-to-other" {
            response.headers_mut().insert("upgrade", "other".parse().unwrap());
        }
        return Ok(response);
    }
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    text.push_str(&format!("body: {}\n", String::from_utf8_lossy(&body)));
    Ok(Response::new(Full::new(Bytes::from(text))))
}

async fn start_upstream() -> Upstream {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "test upstream CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["api.test".to_string(), "other.test".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(super::upstream::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let https = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let https_addr = https.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = https.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    let service = hyper::service::service_fn(echo);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .with_upgrades()
                        .await;
                }
            });
        }
    });
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = http.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(echo);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Upstream { ca_der: ca_cert.der().clone(), https: https_addr, http: http_addr }
}

pub(super) fn grant(secret: &str) -> Grant {
    Grant {
        credential_id: space_api::CredentialId::generate(),
        credential: "gh".into(),
        hosts: vec!["api.test".into()],
        header_name: "Authorization".into(),
        header_value: format!("Bearer {secret}"),
        secret: secret.into(),
        placeholder: Some(PLACEHOLDER.into()),
        expires_at: None,
        rate_limit_per_min: None,
        unavailable: None,
    }
}

pub(super) struct Setup {
    pub(super) proxy: SocketAddr,
    pub(super) context: Arc<SandboxContext>,
    pub(super) session: SessionId,
    pub(super) ca: SessionCa,
    pub(super) upstream: Upstream,
    pub(super) audit: UnboundedReceiver<AuditEvent>,
}

impl Setup {
    async fn new() -> Setup {
        Setup::with(|_| {}).await
    }

    /// A sandbox serving a session with a grant for `api.test`, whose explicit proxy listens on
    /// `proxy`, in a gateway configured for the test upstream and then by `change`.
    pub(super) async fn with(change: impl FnOnce(&mut GatewayConfig)) -> Setup {
        let upstream = start_upstream().await;
        let mut config = GatewayConfig { allow_private_upstreams: true, ..Default::default() };
        config.resolve.insert("api.test".into(), upstream.https);
        config.resolve.insert("other.test".into(), upstream.https);
        config.resolve.insert("plain.test".into(), upstream.http);
        config.extra_roots.push(upstream.ca_der.to_vec());
        change(&mut config);
        let session = SessionId::generate();
        let ca = SessionCa::generate(&session).unwrap();
        let (tx, audit) = tokio::sync::mpsc::unbounded_channel();
        let context = SandboxContext::for_test(config, tx, None).unwrap();
        let setup_egress = egress(&ca, vec![grant(SECRET)]);
        context.set_test_session(&session, setup_egress);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        tokio::spawn(super::serve_explicit(listener, context.clone()));
        Setup { proxy, context, session, ca, upstream, audit }
    }

    /// The next audit event (waiting a little for it).
    pub(super) async fn event(&mut self) -> AuditEvent {
        tokio::time::timeout(Duration::from_secs(10), self.audit.recv()).await.unwrap().unwrap()
    }

    /// `CONNECT authority`: the status and the stream after the response head.
    pub(super) async fn connect(&self, authority: &str) -> (u16, TcpStream) {
        let mut stream = TcpStream::connect(self.proxy).await.unwrap();
        let head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        while !response.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if stream.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            response.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&response);
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, stream)
    }

    /// TLS over `stream` to `sni`, trusting `root`.
    pub(super) async fn tls(
        stream: TcpStream,
        sni: &str,
        root: CertificateDer<'static>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        Setup::tls_trusting(stream, sni, vec![root]).await
    }

    /// TLS over `stream` to `sni`, trusting every one of `trusted`.
    async fn tls_trusting(
        stream: TcpStream,
        sni: &str,
        trusted: Vec<CertificateDer<'static>>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut roots = rustls::RootCertStore::empty();
        for root in trusted {
            roots.add(root).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(super::upstream::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        connector.connect(ServerName::try_from(sni.to_string()).unwrap(), stream).await
    }

    fn session_root(&self) -> CertificateDer<'static> {
        certificates_from_pem(self.ca.cert_pem.as_bytes()).unwrap().remove(0).into()
    }
}

pub(super) fn egress(ca: &SessionCa, grants: Vec<Grant>) -> SessionEgress {
    SessionEgress {
        policy: NetworkPolicy { allow: vec!["other.test".into(), "plain.test".into()], ..Default::default() },
        ca: ca.clone(),
        grants,
    }
}

pub(super) type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

pub(super) async fn http_client<S>(io: S) -> Sender
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    sender
}

pub(super) async fn get(sender: &mut Sender, host: &str, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    send(sender, "GET", host, path, headers).await
}

async fn send(
    sender: &mut Sender,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(path).header("host", host);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    sender.ready().await.unwrap();
    let response = sender.send_request(request.body(Empty::new()).unwrap()).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Writes `request` as it is (to send what no client library would) and reads one response
/// with a Content-Length: its status (0 when the connection closed first) and body.
pub(super) async fn exchange<S>(io: &mut S, request: &str) -> (u16, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    io.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        match io.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return (0, String::from_utf8_lossy(&head).into_owned()),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let length = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    io.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn granted_hosts_are_intercepted_and_the_credential_injected() {
    let mut setup = Setup::new().await;
    let (status, stream) = setup.connect("api.test:443").await;
    assert_eq!(status, 200);
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    let mut sender = http_client(tls).await;
    let (agent, cookie) = (format!("tool/1 {PLACEHOLDER}"), format!("t={PLACEHOLDER}"));
    let headers = [
        ("authorization", "token mine"),
        ("x-token", PLACEHOLDER),
        ("user-agent", agent.as_str()),
        ("cookie", cookie.as_str()),
    ];
    let (status, body) = get(&mut sender, "api.test", "/repos?q=1", &headers).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.starts_with("GET /repos?q=1\n"), "{body}");
    assert!(body.contains(&format!("authorization: Bearer {SECRET}\n")), "{body}");
    assert!(!body.contains("token mine"), "{body}");
    // The secret goes in the credential's own header, nowhere else.
    assert_eq!(body.matches(SECRET).count(), 1, "{body}");
    assert!(body.contains(&format!("x-token: {PLACEHOLDER}\n")), "{body}");
    assert!(body.contains(&format!("user-agent: {agent}\n")), "{body}");
    assert!(body.contains(&format!("cookie: {cookie}\n")), "{body}");
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Injected);
    assert_eq!(event.credential.as_deref(), Some("gh"));
    assert_eq!((event.host.as_str(), event.port, event.method.as_deref()), ("api.test", 443, Some("GET")));
    assert_eq!(event.path.as_deref(), Some("/repos"));
    assert!(event.bytes_received > 0);
    assert!(!format!("{event:?}").contains(SECRET));

    // Rotation applies to the next request on the same connection.
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![grant("rotated")]));
    let (status, body) = get(&mut sender, "api.test", "/", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("authorization: Bearer rotated\n"), "{body}");
    setup.event().await;

    // Revocation too: api.test was allowed only by the grant.
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![]));
    let (status, body) = get(&mut sender, "api.test", "/", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(setup.event().await.decision, AuditDecision::Denied);
}

/// Sends a WebSocket handshake for `uri` over `io`: the response and, when it switched, the
/// upgraded connection.
async fn websocket_handshake<S>(
    io: S,
    host: &str,
    uri: &str,
) -> (Response<Incoming>, Option<TokioIo<hyper::upgrade::Upgraded>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn.with_upgrades());
    let request = Request::get(uri)
        .header("host", host)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "13")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let mut response = sender.send_request(request).await.unwrap();
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return (response, None);
    }
    let upgraded = hyper::upgrade::on(&mut response).await.unwrap();
    (response, Some(TokioIo::new(upgraded)))
}

/// What the test upstream says first on a WebSocket: the handshake it received.
async fn handshake_seen<S: tokio::io::AsyncRead + Unpin>(io: &mut S) -> String {
    let mut seen = Vec::new();
    while !seen.ends_with(b"end\n") {
        let mut byte = [0u8; 1];
        assert_eq!(io.read(&mut byte).await.unwrap(), 1, "closed after {}", String::from_utf8_lossy(&seen));
        seen.push(byte[0]);
    }
    String::from_utf8(seen).unwrap()
}

#[tokio::test]
async fn websockets_to_granted_hosts_get_the_credential_and_carry_data_both_ways() {
    let mut setup = Setup::new().await;
    let (_, stream) = setup.connect("api.test:443").await;
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    let (response, io) = websocket_handshake(tls, "api.test", "/socket?v=1").await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert!(super::upgrade::is_websocket(response.headers()));
    let mut io = io.unwrap();
    let seen = handshake_seen(&mut io).await;
    assert!(seen.starts_with("GET /socket?v=1\n"), "{seen}");
    assert!(seen.contains(&format!("authorization: Bearer {SECRET}\n")), "{seen}");
    assert!(seen.contains("upgrade: websocket\n") && seen.contains("sec-websocket-key: "), "{seen}");
    io.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    io.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"ping");
    drop(io);
    // One event for the whole WebSocket, sent when it closes.
    let event = setup.event().await;
    assert_eq!((event.decision, event.credential.as_deref()), (AuditDecision::Injected, Some("gh")));
    assert_eq!(event.path.as_deref(), Some("/socket"));
    assert_eq!(event.bytes_sent, 4);
    assert_eq!(event.bytes_received, seen.len() as u64 + 4);
}

#[tokio::test]
async fn plain_websockets_are_relayed_but_no_other_upgrade() {
    let mut setup = Setup::new().await;
    let stream = TcpStream::connect(setup.proxy).await.unwrap();
    let (response, io) = websocket_handshake(stream, "plain.test", "http://plain.test/ws").await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut io = io.unwrap();
    let seen = handshake_seen(&mut io).await;
    assert!(seen.starts_with("GET /ws\n") && seen.contains("upgrade: websocket\n"), "{seen}");
    assert!(!seen.contains("authorization"), "{seen}");
    drop(io);
    assert_eq!(setup.event().await.decision, AuditDecision::Allowed);

    // An upstream that answers a WebSocket handshake by switching to something else.
    let stream = TcpStream::connect(setup.proxy).await.unwrap();
    let (response, io) = websocket_handshake(stream, "plain.test", "http://plain.test/switch-to-other").await;
    assert_eq!((response.status(), io.is_none()), (StatusCode::BAD_GATEWAY, true));
    assert!(setup.event().await.reason.unwrap().contains("without a WebSocket handshake"));

    // h2c would carry requests the gateway could not check: the upstream never sees it asked.
    let stream = TcpStream::connect(setup.proxy).await.unwrap();
    let mut sender = http_client(stream).await;
    let headers =
        [("connection", "Upgrade, HTTP2-Settings"), ("upgrade", "h2c"), ("http2-settings", "AAMAAABkAAQAAP__")];
    let (status, body) = get(&mut sender, "plain.test", "http://plain.test/", &headers).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains("upgrade") && !body.contains("http2-settings"), "{body}");
}

#[tokio::test]
async fn expired_and_rate_limited_credentials_are_refused() {
    let mut setup = Setup::new().await;
    let mut limited = grant(SECRET);
    limited.rate_limit_per_min = Some(1);
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![limited]));
    let (_, stream) = setup.connect("api.test:443").await;
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    let mut sender = http_client(tls).await;
    assert_eq!(get(&mut sender, "api.test", "/", &[]).await.0, StatusCode::OK);
    setup.event().await;
    assert_eq!(get(&mut sender, "api.test", "/", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert!(setup.event().await.reason.unwrap().contains("rate limit"));

    let mut expired = grant(SECRET);
    expired.expires_at = Some(1);
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![expired]));
    let (status, body) = get(&mut sender, "api.test", "/", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("credential gh expired"), "{body}");

    setup.event().await;
    // An OAuth credential without a token: 502 and why, never a request without it.
    let mut failing = grant(SECRET);
    failing.unavailable = Some("the token endpoint refused: invalid_grant".into());
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![failing]));
    let (status, body) = get(&mut sender, "api.test", "/", &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(body.contains("credential gh has no token to inject: the token endpoint refused: invalid_grant"), "{body}");
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Denied);
    assert!(event.reason.unwrap().contains("no token to inject"));
}

/// A rate limit is the credential's: another session holding the same credential (a fork,
/// with its own CA and sandbox) draws from the same bucket instead of a fresh one.
#[tokio::test]
async fn sessions_holding_the_same_credential_share_its_rate_limit() {
    let mut setup = Setup::new().await;
    let mut limited = grant(SECRET);
    limited.rate_limit_per_min = Some(1);
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![limited.clone()]));
    let (_, stream) = setup.connect("api.test:443").await;
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    assert_eq!(get(&mut http_client(tls).await, "api.test", "/", &[]).await.0, StatusCode::OK);
    setup.event().await;

    let fork = SessionId::generate();
    let fork_ca = SessionCa::generate(&fork).unwrap();
    let sibling = setup.context.sibling_for_test(&fork, egress(&fork_ca, vec![limited.clone()]));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fork_proxy = listener.local_addr().unwrap();
    tokio::spawn(super::serve_explicit(listener, sibling));
    let fork_root = certificates_from_pem(fork_ca.cert_pem.as_bytes()).unwrap().remove(0).into();
    let mut stream = TcpStream::connect(fork_proxy).await.unwrap();
    let (status, _) = exchange(&mut stream, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n").await;
    assert_eq!(status, 200);
    let tls = Setup::tls(stream, "api.test", fork_root).await.unwrap();
    let mut sender = http_client(tls).await;
    assert_eq!(get(&mut sender, "api.test", "/", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    let event = setup.event().await;
    assert_eq!(event.session_id, fork);
    assert!(event.reason.unwrap().contains("rate limit"));

    // Another credential (even named the same) is counted apart.
    let mut other = grant(SECRET);
    other.rate_limit_per_min = Some(1);
    setup.context.set_test_session(&setup.session, egress(&setup.ca, vec![other]));
    let (_, stream) = setup.connect("api.test:443").await;
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    assert_eq!(get(&mut http_client(tls).await, "api.test", "/", &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn denied_names_get_403_and_are_audited() {
    let mut setup = Setup::new().await;
    let (status, _) = setup.connect("denied.test:443").await;
    assert_eq!(status, 403);
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.host, "denied.test");
    assert_eq!(event.reason.as_deref(), Some("name denied.test not allowed"));
    // A port outside the policy, and an address literal without a CIDR.
    assert_eq!(setup.connect("other.test:22").await.0, 403);
    assert_eq!(setup.event().await.reason.as_deref(), Some("port 22 not allowed"));
    assert_eq!(setup.connect("127.0.0.1:443").await.0, 403);
    assert!(setup.event().await.reason.unwrap().contains("not in an allowed range"));
}

#[tokio::test]
async fn sni_must_match_the_connect_authority() {
    let mut setup = Setup::new().await;
    let (status, stream) = setup.connect("api.test:443").await;
    assert_eq!(status, 200);
    // other.test is allowed too, but fronting through api.test's tunnel is not.
    assert!(Setup::tls(stream, "other.test", setup.upstream.ca_der.clone()).await.is_err());
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.reason.as_deref(), Some("SNI other.test does not match CONNECT authority api.test"));
}

#[tokio::test]
async fn host_header_must_match_the_server_name_when_intercepted() {
    let mut setup = Setup::new().await;
    let (_, stream) = setup.connect("api.test:443").await;
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    let mut sender = http_client(tls).await;
    let (status, body) = get(&mut sender, "other.test", "/", &[]).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert!(!body.contains(SECRET));
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.reason.as_deref(), Some("Host header other.test does not match TLS server name api.test"));
}

#[tokio::test]
async fn hosts_without_a_grant_are_tunnelled_untouched() {
    let mut setup = Setup::new().await;
    let (status, stream) = setup.connect("other.test:443").await;
    assert_eq!(status, 200);
    // The client sees the upstream's own certificate.
    let tls = Setup::tls(stream, "other.test", setup.upstream.ca_der.clone()).await.unwrap();
    let mut sender = http_client(tls).await;
    let (status, body) = get(&mut sender, "other.test", "/x", &[("x-token", PLACEHOLDER)]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains(&format!("x-token: {PLACEHOLDER}\n")), "{body}");
    assert!(!body.contains("authorization"), "{body}");
    drop(sender);
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Allowed);
    assert_eq!((event.protocol.as_str(), event.method.as_deref()), ("connect", Some("other.test")));
    assert!(event.bytes_sent > 0 && event.bytes_received > 0);
}

#[tokio::test]
async fn absolute_form_requests_are_forwarded_and_checked() {
    let mut setup = Setup::new().await;
    let stream = TcpStream::connect(setup.proxy).await.unwrap();
    let mut sender = http_client(stream).await;
    let (status, body) =
        get(&mut sender, "plain.test", "http://plain.test/a?b=c", &[("proxy-authorization", "x")]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.starts_with("GET /a?b=c\n"), "{body}");
    assert!(!body.contains("proxy-authorization"), "{body}");
    let event = setup.event().await;
    assert_eq!((event.decision, event.protocol.as_str()), (AuditDecision::Allowed, "http"));

    let (status, _) = get(&mut sender, "other.test", "http://plain.test/", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(setup.event().await.reason.unwrap().contains("does not match"));
    let (status, body) = get(&mut sender, "denied.test", "http://denied.test/", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains(&format!("space session policy {} --allow denied.test", setup.session)), "{body}");
    setup.event().await;
    // Origin-form to the proxy itself.
    assert_eq!(get(&mut sender, "plain.test", "/", &[]).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn private_upstreams_are_refused_unless_allowed() {
    let upstream = start_upstream().await;
    let mut config = GatewayConfig::default();
    config.resolve.insert("api.test".into(), upstream.https);
    let session = SessionId::generate();
    let ca = SessionCa::generate(&session).unwrap();
    let (tx, mut audit) = tokio::sync::mpsc::unbounded_channel();
    let context = SandboxContext::for_test(config, tx, Some((session, egress(&ca, vec![grant(SECRET)])))).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    tokio::spawn(super::serve_explicit(listener, context));
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n").await.unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 403");
    let event = audit.recv().await.unwrap();
    assert_eq!(event.reason.as_deref(), Some("private upstream address 127.0.0.1"));
}

#[tokio::test]
async fn a_name_pointing_at_the_node_itself_is_refused() {
    // 203.0.113.7 stands for the node's public address.
    let own: std::net::IpAddr = "203.0.113.7".parse().unwrap();
    let mut config = GatewayConfig::default();
    config.resolve_ip.insert("node.example.com".into(), own);
    let state = super::State::with_node_addrs(&config, [own]).unwrap();
    let session = SessionId::generate();
    let ca = SessionCa::generate(&session).unwrap();
    let mut egress = egress(&ca, vec![]);
    egress.policy.allow.push("*.example.com".into());
    let (tx, mut audit) = tokio::sync::mpsc::unbounded_channel();
    let context = SandboxContext::for_test_with_state(config.limits, state, tx, Some((session, egress)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    tokio::spawn(super::serve_explicit(listener, context));
    // Only the CONNECT is sent: had it been allowed, the gateway would wait for the
    // tunnel's first bytes before connecting anywhere, and get none.
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let (status, body) =
        exchange(&mut stream, "CONNECT node.example.com:443 HTTP/1.1\r\nHost: node.example.com:443\r\n\r\n").await;
    assert_eq!(status, 403, "{body}");
    let event = audit.recv().await.unwrap();
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.host, "node.example.com");
    assert_eq!(event.reason.as_deref(), Some("upstream address 203.0.113.7 is one of this node's own addresses"));
}

#[tokio::test]
async fn transparent_tls_to_an_address_is_tunnelled_not_intercepted() {
    // The sandbox dials 127.0.0.1 itself, which a CIDR allows, with the SNI of a granted
    // host. The gateway did not choose that address, so it does not intercept (and inject):
    // it tunnels, and the tunnel is refused because the address is private.
    let session = SessionId::generate();
    let ca = SessionCa::generate(&session).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut granted = egress(&ca, vec![grant(SECRET)]);
    granted.policy.cidrs = vec!["127.0.0.0/8".into()];
    granted.policy.ports = vec![addr.port()];
    let (tx, mut audit) = tokio::sync::mpsc::unbounded_channel();
    let context = SandboxContext::for_test(GatewayConfig::default(), tx, Some((session, granted))).unwrap();
    tokio::spawn(super::transparent::serve_transparent_https(listener, context));
    let root = certificates_from_pem(ca.cert_pem.as_bytes()).unwrap().remove(0).into();
    let tls = Setup::tls(TcpStream::connect(addr).await.unwrap(), "api.test", root).await;
    assert!(tls.is_err(), "the gateway terminated TLS for an address the sandbox chose");
    let event = tokio::time::timeout(Duration::from_secs(10), audit.recv()).await.unwrap().unwrap();
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.reason.as_deref(), Some("private upstream address 127.0.0.1"));
    assert_eq!(event.credential, None, "nothing was injected");
}

#[tokio::test]
async fn a_granted_name_reached_by_address_is_tunnelled_without_the_credential() {
    let mut setup = Setup::new().await;
    let port = setup.upstream.https.port();
    let mut by_address = egress(&setup.ca, vec![grant(SECRET)]);
    by_address.policy.cidrs = vec!["127.0.0.0/8".into()];
    by_address.policy.ports = vec![port];
    setup.context.set_test_session(&setup.session, by_address);
    let (status, stream) = setup.connect(&format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    // Trusting the session CA too, the client would also accept an interception.
    let trusted = vec![setup.session_root(), setup.upstream.ca_der.clone()];
    let tls = Setup::tls_trusting(stream, "api.test", trusted).await.unwrap();
    let mut sender = http_client(tls).await;
    let sent = format!("Bearer {PLACEHOLDER}");
    let (status, body) = get(&mut sender, "api.test", "/", &[("authorization", sent.as_str())]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains(SECRET), "{body}");
    assert!(body.contains(&format!("authorization: {sent}\n")), "{body}");
    drop(sender);
    let event = setup.event().await;
    assert_eq!((event.decision, event.credential.as_deref()), (AuditDecision::Allowed, None));
    assert_eq!((event.protocol.as_str(), event.host.as_str()), ("connect", "api.test"));
    assert!(event.reason.unwrap().contains("the sandbox chose"));
}

#[tokio::test]
async fn trace_and_track_are_refused_on_intercepted_hosts() {
    let mut setup = Setup::new().await;
    let (_, stream) = setup.connect("api.test:443").await;
    let tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    let mut sender = http_client(tls).await;
    // Methods are case-sensitive, but an upstream may not treat them so.
    for method in ["TRACE", "TRACK", "trace"] {
        let (status, body) = send(&mut sender, method, "api.test", "/", &[]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method}: {body}");
        assert!(body.contains(method) && !body.contains(SECRET), "{body}");
        let event = setup.event().await;
        assert_eq!((event.decision, event.credential.as_deref()), (AuditDecision::Denied, None));
        assert_eq!(event.method.as_deref(), Some(method));
        assert!(event.reason.unwrap().contains("echo"));
    }
    // The connection goes on serving other requests.
    assert_eq!(get(&mut sender, "api.test", "/", &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn ambiguous_requests_to_intercepted_hosts_get_400_before_injection() {
    let mut setup = Setup::new().await;
    let chunked_twice = "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\
                         Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    for (request, reason) in [
        ("GET / HTTP/1.1\r\nHost: api.test\r\nHost: other.test\r\n\r\n", "more than one Host header"),
        ("GET / HTTP/1.1\r\nHost: api.test\r\nHost: api.test\r\n\r\n", "more than one Host header"),
        ("GET https://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", "does not match the Host header"),
        ("GET https://api.test:8443/ HTTP/1.1\r\nHost: api.test\r\n\r\n", "does not match the Host header"),
        (chunked_twice, "chunked more than once"),
        ("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", "chunked"),
        ("GET / HTTP/1.1\r\n\r\n", "without a Host header"),
    ] {
        let (_, stream) = setup.connect("api.test:443").await;
        let mut tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
        let (status, body) = exchange(&mut tls, request).await;
        assert_eq!(status, 400, "{request:?}: {body}");
        assert!(!body.contains(SECRET), "{body}");
        let event = setup.event().await;
        assert_eq!((event.decision, event.credential.as_deref()), (AuditDecision::Denied, None), "{request:?}");
        assert!(event.reason.as_deref().unwrap().contains(reason), "{request:?}: {:?}", event.reason);
    }
    // The same target in absolute form, with the port spelled out, is not ambiguous.
    let (_, stream) = setup.connect("api.test:443").await;
    let mut tls = Setup::tls(stream, "api.test", setup.session_root()).await.unwrap();
    let (status, body) = exchange(&mut tls, "GET https://API.test/x HTTP/1.1\r\nHost: api.test:443\r\n\r\n").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /x\n"), "{body}");
}

#[tokio::test]
async fn ambiguous_plain_http_requests_get_400() {
    let mut setup = Setup::new().await;
    let chunked_twice = "POST http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\n\
                         Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n";
    for (request, reason) in [
        ("GET http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\nHost: other.test\r\n\r\n", "more than one Host"),
        ("GET http://plain.test:8080/ HTTP/1.1\r\nHost: plain.test\r\n\r\n", "does not match the Host header"),
        ("GET http://plain.test/ HTTP/1.1\r\nHost: a b\r\n\r\n", "invalid Host header"),
        (chunked_twice, "chunked more than once"),
    ] {
        let mut stream = TcpStream::connect(setup.proxy).await.unwrap();
        let (status, body) = exchange(&mut stream, request).await;
        assert_eq!(status, 400, "{request:?}: {body}");
        let event = setup.event().await;
        assert_eq!(event.decision, AuditDecision::Denied);
        assert!(event.reason.as_deref().unwrap().contains(reason), "{request:?}: {:?}", event.reason);
    }
    let mut stream = TcpStream::connect(setup.proxy).await.unwrap();
    let (status, body) = exchange(&mut stream, "GET http://plain.test/ HTTP/1.1\r\nHost: PLAIN.test:80\r\n\r\n").await;
    assert_eq!(status, 200, "{body}");
}

/// What hyper already does with ambiguous framing before the gateway sees a request (so the
/// gateway does not check it again): these pass on their own, and stand guard over an
/// upgrade of hyper that would change them.
#[tokio::test]
async fn hyper_rejects_or_resolves_ambiguous_content_length() {
    let setup = Setup::new().await;
    let post = "POST http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\n";
    for lengths in
        ["Content-Length: 3\r\nContent-Length: 4\r\n", "Content-Length: 3, 4\r\n", "Content-Length: 3, 3\r\n"]
    {
        let mut stream = TcpStream::connect(setup.proxy).await.unwrap();
        let (status, body) = exchange(&mut stream, &format!("{post}{lengths}\r\nabcd")).await;
        assert_eq!(status, 400, "{lengths:?}: {body}");
    }
    // Identical lines are folded into one (RFC 9110 §8.6 allows it).
    let mut stream = TcpStream::connect(setup.proxy).await.unwrap();
    let twice = format!("{post}Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc");
    let (status, body) = exchange(&mut stream, &twice).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.matches("content-length: 3\n").count(), 1, "{body}");
    assert!(body.ends_with("body: abc\n"), "{body}");
    // With Transfer-Encoding, Content-Length is dropped and the body read as chunked (RFC
    // 9112 §6.3: what an intermediary that forwards such a request must do).
    let mut stream = TcpStream::connect(setup.proxy).await.unwrap();
    let both = format!("{post}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n");
    let (status, body) = exchange(&mut stream, &both).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("content-length") && body.contains("transfer-encoding: chunked\n"), "{body}");
    assert!(body.ends_with("body: abcde\n"), "{body}");
}
