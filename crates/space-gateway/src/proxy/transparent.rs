//! Transparent interception of ports 80 and 443, for clients that ignore the proxy
//! variables. A connection's local address is where the sandbox meant to go: the gateway's
//! address when it resolved an allowed name through our DNS, anything else for an address
//! literal (allowed only by a CIDR).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use space_api::egress::normalize_host;
use tokio::net::TcpListener;

use crate::{GATEWAY_ADDR, SandboxContext, SessionEgress};

use super::ambiguity;
use super::audit::{self, Record};
use super::client_hello::{Hello, read_client_hello};
use super::forward::{Forwarder, Target, outgoing, relay};
use super::io::Admitted;
use super::policy::{Dest, check_dest, check_ip, check_name, check_port, refusal, split_authority};
use super::tunnel::Allowed;
use super::{Refusal, RespBody, accept_loop, http_server, text};

/// Where the sandbox connected, when that is the gateway's own address.
fn is_gateway(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4 == GATEWAY_ADDR,
        IpAddr::V6(v6) => v6.to_ipv4_mapped() == Some(GATEWAY_ADDR),
    }
}

/// The destination address as the sandbox wrote it (IPv4-mapped addresses unwrapped).
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    }
}

pub(crate) async fn serve_transparent_http(listener: TcpListener, context: Arc<SandboxContext>) {
    accept_loop(listener, context, Refusal::Http, |stream, context| async move {
        let Ok(local) = stream.local_addr() else { return };
        let forwarder = Arc::new(Forwarder::new(context.clone()));
        let service = hyper::service::service_fn(move |request| {
            let (context, forwarder) = (context.clone(), forwarder.clone());
            async move { Ok::<_, Infallible>(plain(context, &forwarder, local, request).await) }
        });
        if let Err(e) = http_server().serve_connection(TokioIo::new(stream), service).with_upgrades().await {
            tracing::debug!("transparent HTTP connection: {e}");
        }
    })
    .await
}

/// One plain HTTP request. No credential is ever injected over plain HTTP: secrets only go
/// to upstreams over verified TLS.
async fn plain(
    context: Arc<SandboxContext>,
    forwarder: &Forwarder,
    local: SocketAddr,
    request: Request<Incoming>,
) -> Response<RespBody> {
    let Some((session, egress)) = context.current() else {
        return text(StatusCode::FORBIDDEN, "space gateway: no session is bound to this sandbox\n");
    };
    let port = local.port();
    let authority = ambiguity::authority(&request);
    let host_header = authority.clone().ok().flatten();
    let named = host_header.as_deref().and_then(split_authority).map(|(host, _)| Dest::parse(&host));
    let shown = named.as_ref().map(Dest::text).unwrap_or_else(|| canonical(local.ip()).to_string());
    let mut event = audit::event(&session, "http", &shown, port);
    event.method = Some(request.method().to_string());
    event.path = Some(request.uri().path().to_string());
    let (Some(host_header), Some(named)) = (host_header, named) else {
        let reason = match authority {
            Err(ambiguous) => ambiguous.to_string(),
            Ok(_) => "request without a valid Host header".to_string(),
        };
        context.audit(audit::denied(event, &reason));
        return text(StatusCode::BAD_REQUEST, format!("space gateway: {reason}\n"));
    };
    let dest = if is_gateway(local.ip()) { named } else { Dest::Ip(canonical(local.ip())) };
    if let Err(reason) = check_dest(&egress, &dest, port) {
        context.audit(audit::denied(event, &reason));
        return text(StatusCode::FORBIDDEN, refusal(&session, &reason, &shown));
    }
    let record = Record::new(context.clone(), event);
    let request = outgoing(request, &host_header, &record);
    let target = Target { dest, port, tls_name: None, addrs: None };
    relay(forwarder, &target, request, record).await
}

/// Where a TLS connection to `ip:port` with server name `sni` may go, by the policy.
fn decide_tls(egress: &SessionEgress, ip: IpAddr, port: u16, sni: Option<&str>) -> Result<Dest, String> {
    if is_gateway(ip) {
        // Reached through our DNS: the name is the SNI.
        let name = normalize_host(sni.ok_or("no server name (SNI) in the TLS ClientHello")?);
        check_dest(egress, &Dest::Name(name.clone()), port)?;
        Ok(Dest::Name(name))
    } else {
        // An address literal: a CIDR must allow it, and a server name, if sent, must be allowed.
        check_ip(egress, ip)?;
        check_port(egress, port)?;
        if let Some(name) = sni {
            check_name(egress, name)?;
        }
        Ok(Dest::Ip(ip))
    }
}

pub(crate) async fn serve_transparent_https(listener: TcpListener, context: Arc<SandboxContext>) {
    accept_loop(listener, context, Refusal::Reset, tls).await
}

/// One TLS connection to port 443 (or whichever port the listener has).
async fn tls(mut stream: Admitted, context: Arc<SandboxContext>) {
    let Ok(local) = stream.local_addr() else { return };
    let (ip, port) = (canonical(local.ip()), local.port());
    let mut hello = Vec::new();
    let result = read_client_hello(&mut stream, &mut hello).await;
    let Some((session, egress)) = context.current() else {
        return tracing::debug!(sandbox = %context.sandbox, "TLS connection to {ip}:{port} without a session");
    };
    let mut event = audit::event(&session, "https", &ip.to_string(), port);
    let sni = match result {
        Ok(Hello::Tls { sni }) => sni,
        Ok(Hello::NotTls) => return context.audit(audit::denied(event, "not TLS")),
        Err(reason) if hello.is_empty() => return tracing::debug!("transparent TLS: {reason}"),
        Err(reason) => return context.audit(audit::denied(event, &reason)),
    };
    if let Some(name) = &sni {
        event.host = normalize_host(name);
        event.method = Some(name.clone());
    }
    let decision = decide_tls(&egress, ip, port, sni.as_deref());
    let dest = match decision {
        Ok(dest) => dest,
        Err(reason) => return context.audit(audit::denied(event, &reason)),
    };
    let allowed = Allowed {
        context: &context,
        session: &session,
        egress: &egress,
        protocol: "https",
        dest,
        port,
        sni,
        addrs: None,
    };
    allowed.proceed(hello, stream).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_api::egress::NetworkPolicy;
    use tokio::net::TcpStream;

    fn egress() -> SessionEgress {
        SessionEgress {
            policy: NetworkPolicy {
                allow: vec!["api.test".into()],
                cidrs: vec!["203.0.113.0/24".into()],
                ..Default::default()
            },
            ca: crate::SessionCa { cert_pem: String::new(), key_pem: String::new() },
            grants: vec![],
        }
    }

    #[test]
    fn tls_destinations_are_decided_by_name_or_by_range() {
        let egress = egress();
        let gateway = IpAddr::V4(GATEWAY_ADDR);
        assert_eq!(decide_tls(&egress, gateway, 443, Some("API.test")), Ok(Dest::Name("api.test".into())));
        assert_eq!(decide_tls(&egress, gateway, 443, Some("evil.test")), Err("name evil.test not allowed".into()));
        assert!(decide_tls(&egress, gateway, 443, None).unwrap_err().contains("no server name"));
        assert_eq!(decide_tls(&egress, gateway, 8443, Some("api.test")), Err("port 8443 not allowed".into()));
        let mapped: IpAddr = "::ffff:10.254.254.1".parse().unwrap();
        assert!(is_gateway(mapped));

        let inside: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(decide_tls(&egress, inside, 443, None), Ok(Dest::Ip(inside)));
        assert_eq!(decide_tls(&egress, inside, 443, Some("api.test")), Ok(Dest::Ip(inside)));
        assert!(decide_tls(&egress, inside, 443, Some("evil.test")).is_err());
        let outside: IpAddr = "198.51.100.1".parse().unwrap();
        assert!(decide_tls(&egress, outside, 443, Some("api.test")).unwrap_err().contains("not in an allowed range"));
    }

    #[tokio::test]
    async fn plain_http_to_an_address_outside_the_ranges_is_refused() {
        let (tx, mut audit) = tokio::sync::mpsc::unbounded_channel();
        let session = space_api::SessionId::generate();
        let context = SandboxContext::for_test(Default::default(), tx, Some((session, egress()))).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_transparent_http(listener, context));
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let request = Request::get("/").header("host", "api.test").body(http_body_util::Empty::<bytes::Bytes>::new());
        let response = sender.send_request(request.unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let event = audit.recv().await.unwrap();
        assert_eq!(event.reason.as_deref(), Some("address 127.0.0.1 not in an allowed range"));
        assert_eq!((event.host.as_str(), event.protocol.as_str()), ("api.test", "http"));
    }

    #[tokio::test]
    async fn ambiguous_plain_http_is_refused_before_the_policy() {
        let (tx, mut audit) = tokio::sync::mpsc::unbounded_channel();
        let session = space_api::SessionId::generate();
        let context = SandboxContext::for_test(Default::default(), tx, Some((session, egress()))).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_transparent_http(listener, context));
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let twice = "GET / HTTP/1.1\r\nHost: api.test\r\nHost: api.test\r\n\r\n";
        let (status, body) = super::super::tests::exchange(&mut stream, twice).await;
        assert_eq!(status, 400, "{body}");
        let event = audit.recv().await.unwrap();
        assert_eq!(event.decision, space_api::egress::AuditDecision::Denied);
        assert_eq!(event.reason.as_deref(), Some("more than one Host header"));
    }
}
