//! The explicit proxy (`HTTP(S)_PROXY`): CONNECT tunnels (intercepted when the host has a
//! grant) and absolute-form plain HTTP requests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use space_api::SessionId;
use space_api::egress::normalize_host;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

use crate::SandboxContext;

use super::ambiguity;
use super::audit::{self, Record};
use super::client_hello::{Hello, read_client_hello};
use super::forward::{Forwarder, Target, outgoing, relay};
use super::policy::{Dest, check_dest, check_name, refusal};
use super::tunnel::{Allowed, splice};
use super::upstream::UpstreamError;
use super::{Refusal, RespBody, accept_loop, empty, http_server, text};

const NO_SESSION: &str = "space gateway: no session is bound to this sandbox\n";

pub(crate) async fn serve_explicit(listener: TcpListener, context: Arc<SandboxContext>) {
    accept_loop(listener, context, Refusal::Http, |stream, context| async move {
        let forwarder = Arc::new(Forwarder::new(context.clone()));
        let service = hyper::service::service_fn(move |request| {
            let (context, forwarder) = (context.clone(), forwarder.clone());
            async move { Ok::<_, Infallible>(handle(context, &forwarder, request).await) }
        });
        if let Err(e) = http_server().serve_connection(TokioIo::new(stream), service).with_upgrades().await {
            tracing::debug!("proxy connection: {e}");
        }
    })
    .await
}

async fn handle(context: Arc<SandboxContext>, forwarder: &Forwarder, request: Request<Incoming>) -> Response<RespBody> {
    if request.method() == Method::CONNECT {
        connect(context, request).await
    } else if request.uri().scheme().is_some() {
        absolute(context, forwarder, request).await
    } else {
        text(
            StatusCode::BAD_REQUEST,
            "space gateway: this is a proxy: send absolute-form requests (http://host/path) or CONNECT\n",
        )
    }
}

/// `CONNECT host:port`: checked now, then the tunnel's first bytes decide the rest.
async fn connect(context: Arc<SandboxContext>, mut request: Request<Incoming>) -> Response<RespBody> {
    let Some((session, egress)) = context.current() else {
        return text(StatusCode::FORBIDDEN, NO_SESSION);
    };
    let Some(authority) = request.uri().authority().cloned() else {
        return text(StatusCode::BAD_REQUEST, "space gateway: CONNECT needs host:port\n");
    };
    let port = authority.port_u16().unwrap_or(443);
    let dest = Dest::parse(authority.host());
    let mut event = audit::event(&session, "connect", &dest.text(), port);
    event.method = Some("CONNECT".into());
    if let Err(reason) = check_dest(&egress, &dest, port) {
        context.audit(audit::denied(event, &reason));
        return text(StatusCode::FORBIDDEN, refusal(&session, &reason, &dest.text()));
    }
    // Resolved now, so that a refused address is a 403 rather than a closed tunnel.
    let addrs = match context.state().resolver.resolve(&dest, port).await {
        Ok(addrs) => addrs,
        Err(UpstreamError::Refused(reason)) => {
            context.audit(audit::denied(event, &reason));
            return text(StatusCode::FORBIDDEN, format!("space gateway: {reason}\n"));
        }
        Err(UpstreamError::Failed(reason)) => {
            space_metrics::gateway_upstream_error(&event.protocol);
            event.reason = Some(reason.clone());
            context.audit(event);
            return text(StatusCode::BAD_GATEWAY, format!("space gateway: {reason}\n"));
        }
    };
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => tunnel(context, session, dest, port, addrs, TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!("CONNECT upgrade: {e}"),
        }
    });
    empty(StatusCode::OK)
}

/// The CONNECT tunnel: TLS must name the CONNECT host (no domain fronting); anything else
/// is tunnelled raw, except to port 443.
async fn tunnel<S>(
    context: Arc<SandboxContext>,
    session: SessionId,
    dest: Dest,
    port: u16,
    addrs: Vec<SocketAddr>,
    mut client: S,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut hello = Vec::new();
    let result = read_client_hello(&mut client, &mut hello).await;
    let Some((current, egress)) = context.current().filter(|(s, _)| *s == session) else {
        return tracing::debug!("CONNECT tunnel: the sandbox no longer serves {session}");
    };
    let mut event = audit::event(&current, "connect", &dest.text(), port);
    let deny = |event, reason: &str| context.audit(audit::denied(event, reason));
    let sni = match result {
        Ok(Hello::Tls { sni }) => sni,
        Ok(Hello::NotTls) if port == 443 => return deny(event, "not TLS to port 443"),
        Ok(Hello::NotTls) => {
            event.protocol = "tcp".into();
            return splice(&context, event, hello, client, &addrs).await;
        }
        Err(reason) if hello.is_empty() => return tracing::debug!("CONNECT tunnel: {reason}"),
        Err(reason) => return deny(event, &reason),
    };
    event.method = sni.clone();
    match (&dest, &sni) {
        (Dest::Name(name), Some(sni)) if normalize_host(sni) == *name => {}
        (Dest::Name(name), Some(sni)) => {
            return deny(event, &format!("SNI {sni} does not match CONNECT authority {name}"));
        }
        (Dest::Name(name), None) => {
            return deny(event, &format!("no server name (SNI) in the TLS ClientHello for CONNECT authority {name}"));
        }
        (Dest::Ip(_), Some(sni)) => {
            if let Err(reason) = check_name(&egress, sni) {
                return deny(event, &reason);
            }
        }
        (Dest::Ip(_), None) => {}
    }
    let allowed = Allowed {
        context: &context,
        session: &current,
        egress: &egress,
        protocol: "connect",
        dest,
        port,
        sni,
        addrs: Some(addrs),
    };
    allowed.proceed(hello, client).await;
}

/// `GET http://host/path`: plain HTTP through the proxy.
async fn absolute(
    context: Arc<SandboxContext>,
    forwarder: &Forwarder,
    request: Request<Incoming>,
) -> Response<RespBody> {
    let Some((session, egress)) = context.current() else {
        return text(StatusCode::FORBIDDEN, NO_SESSION);
    };
    let uri = request.uri().clone();
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "space gateway: only http:// URLs can be sent to the proxy; use CONNECT for https\n",
        );
    };
    let port = authority.port_u16().unwrap_or(80);
    let dest = Dest::parse(authority.host());
    let mut event = audit::event(&session, "http", &dest.text(), port);
    event.method = Some(request.method().to_string());
    event.path = Some(uri.path().to_string());
    // The target decides where the request goes; a Host header, if any, must agree with it.
    if let Err(ambiguous) = ambiguity::authority(&request) {
        let reason = ambiguous.to_string();
        context.audit(audit::denied(event, &reason));
        return text(StatusCode::BAD_REQUEST, format!("space gateway: {reason}\n"));
    }
    if let Err(reason) = check_dest(&egress, &dest, port) {
        context.audit(audit::denied(event, &reason));
        return text(StatusCode::FORBIDDEN, refusal(&session, &reason, &dest.text()));
    }
    let host_header = match authority.port() {
        Some(port) => format!("{}:{port}", authority.host()),
        None => authority.host().to_string(),
    };
    let record = Record::new(context.clone(), event);
    let request = outgoing(request, &host_header, &record);
    // Plain HTTP: never a credential (secrets only go over verified TLS).
    let target = Target { dest, port, tls_name: None, addrs: None };
    relay(forwarder, &target, request, record).await
}
