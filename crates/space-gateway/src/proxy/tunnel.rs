//! After a TLS ClientHello was read and the destination allowed: intercept (the host has a
//! grant and is reached by name) or splice bytes to the upstream untouched.

use std::net::SocketAddr;
use std::sync::Arc;

use space_api::SessionId;
use space_api::egress::AuditEvent;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::{SandboxContext, SessionEgress};

use super::audit;
use super::io::{Counting, Prefixed};
use super::policy::{self, Dest};
use super::upstream::{self, UpstreamError};

/// Buffer size of each direction of a tunnel.
const TUNNEL_BUFFER: usize = 64 * 1024;

/// An allowed TLS connection to `dest:port` whose ClientHello (`hello`, with server name
/// `sni`) was read from `client`.
pub(crate) struct Allowed<'a> {
    pub(crate) context: &'a Arc<SandboxContext>,
    pub(crate) session: &'a SessionId,
    pub(crate) egress: &'a SessionEgress,
    pub(crate) protocol: &'static str,
    pub(crate) dest: Dest,
    pub(crate) port: u16,
    pub(crate) sni: Option<String>,
    /// The upstream addresses, when already resolved (and checked).
    pub(crate) addrs: Option<Vec<SocketAddr>>,
}

impl Allowed<'_> {
    fn event(&self) -> AuditEvent {
        let host = self.sni.clone().unwrap_or_else(|| self.dest.text());
        let mut event = audit::event(self.session, self.protocol, &host, self.port);
        event.method = self.sni.clone();
        event
    }

    /// Intercepts or tunnels; returns when the connection is over.
    pub(crate) async fn proceed<S>(self, hello: Vec<u8>, client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut event = self.event();
        if let Some(sni) = &self.sni
            && policy::intercepted(self.egress, sni)
        {
            match &self.dest {
                Dest::Name(_) => {
                    // Unresolved names are resolved (and checked) when an upstream connection
                    // is opened: a request that reuses an idle one needs no lookup. A refused
                    // address then answers that request with a 403.
                    let client = Prefixed::new(hello, client);
                    let (context, session, addrs) = (self.context.clone(), self.session.clone(), self.addrs.clone());
                    return super::mitm::serve(context, session, sni.clone(), self.port, addrs, client).await;
                }
                // The sandbox picked the address (a CIDR allows it): only the upstream's
                // certificate would stand between the credential and that address, so the
                // connection is not intercepted. Tunnelled, it still works, without the
                // credential; the client checks the certificate itself.
                Dest::Ip(ip) => {
                    event.reason = Some(format!(
                        "the sandbox chose the address {ip}: tunnelled without the credential (credentials only go \
                         to addresses the gateway resolved for the name)"
                    ));
                }
            }
        }
        let resolved = match self.addrs.clone() {
            Some(addrs) => Ok(addrs),
            None => self.context.state().resolver.resolve(&self.dest, self.port).await,
        };
        let addrs = match resolved {
            Ok(addrs) => addrs,
            Err(UpstreamError::Refused(reason)) => return self.context.audit(audit::denied(event, &reason)),
            Err(UpstreamError::Failed(reason)) => {
                space_metrics::gateway_upstream_error(&event.protocol);
                event.reason = Some(reason);
                return self.context.audit(event);
            }
        };
        splice(self.context, event, hello, client, &addrs).await;
    }
}

/// Connects to `addrs`, replays `prefix`, then copies both ways until both sides are done;
/// audits `event` with the byte counts at the end.
pub(crate) async fn splice<S>(
    context: &SandboxContext,
    mut event: AuditEvent,
    prefix: Vec<u8>,
    client: S,
    addrs: &[SocketAddr],
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut upstream = match upstream::connect(addrs).await {
        Ok(stream) => stream,
        Err(e) => {
            space_metrics::gateway_upstream_error(&event.protocol);
            event.reason = Some(e.to_string());
            return context.audit(event);
        }
    };
    let mut client = Counting::new(client);
    let result = async {
        upstream.write_all(&prefix).await?;
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, TUNNEL_BUFFER, TUNNEL_BUFFER).await
    }
    .await;
    if let Err(e) = result {
        tracing::debug!("tunnel to {}: {e}", event.host);
    }
    event.bytes_sent = prefix.len() as u64 + client.read;
    event.bytes_received = client.written;
    context.audit(event);
}
