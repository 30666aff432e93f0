//! Test upstreams on the host's loopback for the egress tests: an HTTP server (port 80), an
//! HTTPS server (port 443; both also echo on a WebSocket) whose certificate a throw-away test CA signed for the test names, a
//! TCP echo and a UDP echo, all on one random address in 127.0.0.0/8 so parallel tests never
//! share one. Each records what it received, so a test can assert what the gateway forwarded
//! (an injected header) or that nothing arrived at all.
//!
//! The servers run on their own tokio runtime and stop when the [`Upstream`] is dropped.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Arrived over TLS (port 443).
    pub tls: bool,
    /// The TLS server name the client asked for.
    pub sni: Option<String>,
    pub method: String,
    /// The request target (path and query).
    pub path: String,
    /// Header names lower-case, in order.
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The `Host` header without a port.
    pub fn host(&self) -> Option<&str> {
        self.header("host").map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name))
    }
}

#[derive(Default)]
struct Log {
    /// Answers the HTTPS server's `/oauth/` paths.
    oauth: super::oauth::Provider,
    requests: Mutex<Vec<Recorded>>,
    tcp: Mutex<Vec<u8>>,
    tcp_connections: Mutex<usize>,
    udp: Mutex<Vec<(SocketAddr, Vec<u8>)>>,
}

pub struct Upstream {
    /// Where every server listens (also what the test names resolve to).
    pub ip: Ipv4Addr,
    pub http_port: u16,
    pub https_port: u16,
    pub tcp_echo_port: u16,
    pub udp_echo_port: u16,
    /// The test CA (PEM) that signed the HTTPS server's certificate.
    pub ca_pem: String,
    /// `ca_pem` in a file, for `--gateway-extra-root` and host-side clients.
    pub ca_file: PathBuf,
    /// A random string every response carries (header `x-upstream-marker` and the body).
    pub marker: String,
    /// The names the HTTPS certificate is valid for.
    pub names: Vec<String>,
    log: Arc<Log>,
    runtime: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

/// Body size asked for with `/bytes/N` (any N; served in 64 KiB chunks of one buffer).
const CHUNK: usize = 64 << 10;

impl Upstream {
    /// Starts the four servers for `names` on ports 80 and 443 (and two random ports for the
    /// echoes) of a fresh random loopback address. Needs root (ports below 1024).
    pub fn start(names: &[&str]) -> Upstream {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let (ca_pem, cert_pem, key_pem) = test_pki(&names);
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_file, &ca_pem).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let marker = format!("upstream-marker-{}", random_hex(12));
        let log = Arc::new(Log::default());
        let tls = tls_acceptor(&cert_pem, &key_pem);
        let (ip, http, https, tcp, udp) = runtime.block_on(async {
            for _ in 0..50 {
                let ip = random_loopback();
                let bound = async {
                    let http = TcpListener::bind((ip, 80)).await?;
                    let https = TcpListener::bind((ip, 443)).await?;
                    let tcp = TcpListener::bind((ip, 0)).await?;
                    let udp = UdpSocket::bind((ip, 0)).await?;
                    std::io::Result::Ok((http, https, tcp, udp))
                };
                if let Ok((http, https, tcp, udp)) = bound.await {
                    return (ip, http, https, tcp, udp);
                }
            }
            panic!("no free loopback address for the upstream servers (ports 80 and 443 need root)");
        });
        let (http_port, https_port) = (http.local_addr().unwrap().port(), https.local_addr().unwrap().port());
        let (tcp_echo_port, udp_echo_port) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
        runtime.spawn(serve_http(http, None, log.clone(), marker.clone()));
        runtime.spawn(serve_http(https, Some(tls), log.clone(), marker.clone()));
        runtime.spawn(tcp_echo(tcp, log.clone()));
        runtime.spawn(udp_echo(udp, log.clone()));
        Upstream {
            ip,
            http_port,
            https_port,
            tcp_echo_port,
            udp_echo_port,
            ca_pem,
            ca_file,
            marker,
            names,
            log,
            runtime: Some(runtime),
            _dir: dir,
        }
    }

    /// `--gateway-resolve NAME=IP` for every name, `--gateway-extra-root` and
    /// `--gateway-allow-private`: the `space serve` flags that make the gateway use us.
    pub fn serve_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for name in &self.names {
            flags.push("--gateway-resolve".to_owned());
            flags.push(format!("{name}={}", self.ip));
        }
        flags.push("--gateway-extra-root".into());
        flags.push(self.ca_file.to_str().unwrap().to_owned());
        flags.push("--gateway-allow-private".into());
        flags
    }

    /// The OAuth provider at `https://NAME/oauth/…`.
    pub fn oauth(&self) -> &super::oauth::Provider {
        &self.log.oauth
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.requests.lock().unwrap().clone()
    }

    /// Forgets every request recorded so far (e.g. a start-up check's).
    pub fn clear(&self) {
        self.log.requests.lock().unwrap().clear();
    }

    /// Requests whose path is exactly `path`.
    pub fn requests_to(&self, path: &str) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.path == path).collect()
    }

    /// The one request to `path` (panics, listing what arrived, unless exactly one did).
    pub fn request_to(&self, path: &str) -> Recorded {
        let found = self.requests_to(path);
        assert_eq!(found.len(), 1, "expected one request to {path}; the upstream received: {:#?}", self.requests());
        found.into_iter().next().unwrap()
    }

    /// Waits (a few seconds at most) for a request to `path`: the response can reach the
    /// client a moment before the record is taken.
    pub fn wait_request_to(&self, path: &str) -> Option<Recorded> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(r) = self.requests_to(path).pop() {
                return Some(r);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Bytes the TCP echo received, all connections together.
    pub fn tcp_received(&self) -> Vec<u8> {
        self.log.tcp.lock().unwrap().clone()
    }

    pub fn tcp_connections(&self) -> usize {
        *self.log.tcp_connections.lock().unwrap()
    }

    /// Datagrams the UDP echo received.
    pub fn udp_received(&self) -> Vec<(SocketAddr, Vec<u8>)> {
        self.log.udp.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

pub fn random_hex(bytes: usize) -> String {
    let mut rng = rand::rng();
    (0..bytes).map(|_| format!("{:02x}", rng.random::<u8>())).collect()
}

fn random_loopback() -> Ipv4Addr {
    let mut rng = rand::rng();
    Ipv4Addr::new(127, rng.random_range(1..=254), rng.random_range(1..=254), rng.random_range(2..=254))
}

/// A CA and a server certificate it signed for `names`: (CA PEM, server cert PEM, server key PEM).
fn test_pki(names: &[String]) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, format!("space egress test CA {}", random_hex(4)));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(names.to_vec()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

fn tls_acceptor(cert_pem: &str, key_pem: &str) -> tokio_rustls::TlsAcceptor {
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_bytes()).collect::<Result<_, _>>().unwrap();
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes()).unwrap().unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn serve_http(listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>, log: Arc<Log>, marker: String) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (tls, log, marker) = (tls.clone(), log.clone(), marker.clone());
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            match tls {
                None => serve_connection(stream, false, None, log, marker).await,
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let sni = stream.get_ref().1.server_name().map(str::to_owned);
                    serve_connection(stream, true, sni, log, marker).await
                }
            }
        });
    }
}

async fn serve_connection<S>(stream: S, tls: bool, sni: Option<String>, log: Arc<Log>, marker: String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (log, marker, sni) = (log.clone(), marker.clone(), sni.clone());
        async move { Ok::<_, Infallible>(respond(request, tls, sni, &log, &marker).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

async fn respond(
    mut request: Request<Incoming>,
    tls: bool,
    sni: Option<String>,
    log: &Log,
    marker: &str,
) -> Response<BoxBody<Bytes, Infallible>> {
    let path = request.uri().path_and_query().map_or_else(|| request.uri().to_string(), |p| p.to_string());
    let headers = request
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let method = request.method().to_string();
    log.requests.lock().unwrap().push(Recorded { tls, sni, method: method.clone(), path: path.clone(), headers });
    if tls && path.starts_with("/oauth/") {
        let headers = log.requests.lock().unwrap().last().map(|r| r.headers.clone()).unwrap_or_default();
        let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let (status, headers, body) = log.oauth.handle(&method, &path, &headers, &body);
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        return builder.body(Full::new(Bytes::from(body)).boxed()).unwrap();
    }
    let websocket = request.headers().get("upgrade").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if websocket {
        // Switches, then echoes whatever comes (the tests send raw bytes, not frames).
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let Ok(upgraded) = upgrade.await else { return };
            let mut io = TokioIo::new(upgraded);
            let mut buf = vec![0u8; 16 << 10];
            while let Ok(n) = io.read(&mut buf).await {
                if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        return Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(Full::new(Bytes::new()).boxed())
            .unwrap();
    }
    // Drain the request body.
    let _ = request.into_body().collect().await;
    let builder = Response::builder().header("x-upstream-marker", marker);
    if let Some(n) = path.strip_prefix("/bytes/").and_then(|n| n.parse::<u64>().ok()) {
        let chunk = Bytes::from(vec![b'x'; CHUNK]);
        let frames = (0..n.div_ceil(CHUNK as u64)).map(move |i| {
            let len = (n - i * CHUNK as u64).min(CHUNK as u64) as usize;
            Ok::<_, Infallible>(Frame::data(chunk.slice(..len)))
        });
        let body = StreamBody::new(futures::stream::iter(frames));
        return builder.header("content-length", n).body(BodyExt::boxed(body)).unwrap();
    }
    let body = format!("upstream {} {marker}\n", if tls { "https" } else { "http" });
    builder.header("content-type", "text/plain").body(Full::new(Bytes::from(body)).boxed()).unwrap()
}

async fn tcp_echo(listener: TcpListener, log: Arc<Log>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        *log.tcp_connections.lock().unwrap() += 1;
        let log = log.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 << 10];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                log.tcp.lock().unwrap().extend_from_slice(&buf[..n]);
                if stream.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
    }
}

async fn udp_echo(socket: UdpSocket, log: Arc<Log>) {
    let mut buf = vec![0u8; 65536];
    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
        log.udp.lock().unwrap().push((from, buf[..n].to_vec()));
        let _ = socket.send_to(&buf[..n], from).await;
    }
}

/// A host-side check that the servers answer (used by the tests before relying on them).
pub fn host_get(upstream: &Upstream, url_path: &str, https_name: Option<&str>) -> std::process::Output {
    let mut args = vec!["-sS".to_owned(), "--noproxy".into(), "*".into(), "--max-time".into(), "10".into()];
    let url = match https_name {
        Some(name) => {
            args.extend(["--cacert".into(), upstream.ca_file.to_str().unwrap().to_owned()]);
            args.extend(["--resolve".into(), format!("{name}:443:{}", upstream.ip)]);
            format!("https://{name}{url_path}")
        }
        None => format!("http://{}{url_path}", IpAddr::V4(upstream.ip)),
    };
    args.push(url);
    std::process::Command::new("curl").args(&args).output().unwrap()
}
