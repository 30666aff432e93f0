//! Upgraded connections: a sandbox's agent, restricted to what the control plane may ask of
//! it, and tunnels to a sandbox's ports.
//!
//! The agent connection speaks the agent protocol (`space-proto`) end to end, so exec, PTY,
//! files and watch keep their framing and flow control across the hop. The node reads the
//! first message of every stream and relays only the operations the public API offers;
//! those that steer a sandbox's life (checkpoint windows, freezing its root, reseeding its
//! randomness, forgetting processes) stay the node's own.

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use space_node_api::{NodeApi, PortStream};
use space_proto::client::AgentClient;
use space_proto::{ErrorKind, FramedStream, Reply, Request, next_frame, send_message};

use super::calls::result;
use super::{Body, respond};
use crate::ops::{AgentCall, PortCall, UPGRADE_PROTOCOL};

/// Connects to the sandbox's agent, then answers `101` and relays the upgraded connection.
pub(super) async fn agent(node: Arc<dyn NodeApi>, call: AgentCall, upgrade: OnUpgrade) -> Response<Body> {
    let agent = match node.agent(&call.sandbox).await {
        Ok(agent) => agent,
        Err(e) => return result::<()>(Err(e)),
    };
    tokio::spawn(async move {
        let Some(mut io) = upgraded(upgrade).await else { return };
        let name = format!("space-node/{}", env!("CARGO_PKG_VERSION"));
        if let Err(e) = space_proto::handshake(&mut io, &name).await {
            tracing::info!(error = %e, "a control plane's agent connection failed its handshake");
            return;
        }
        // The relay ends with the node's own connection (a checkpoint closes it), so the
        // control plane sees its connection end too and asks for a new one.
        let relay = space_proto::serve(io, {
            let agent = agent.clone();
            move |stream| relay_stream(agent.clone(), stream)
        });
        tokio::select! {
            _ = relay => {}
            () = agent.closed() => {}
        }
    });
    switching()
}

/// Connects to the sandbox's port, then answers `101` and copies bytes both ways.
pub(super) async fn port(node: Arc<dyn NodeApi>, call: PortCall, upgrade: OnUpgrade) -> Response<Body> {
    let mut stream: PortStream = match node.connect_port(&call.sandbox, call.port).await {
        Ok(stream) => stream,
        Err(e) => return result::<()>(Err(e)),
    };
    tokio::spawn(async move {
        let Some(mut io) = upgraded(upgrade).await else { return };
        let _ = tokio::io::copy_bidirectional(&mut io, &mut stream).await;
    });
    switching()
}

async fn upgraded(upgrade: OnUpgrade) -> Option<TokioIo<hyper::upgrade::Upgraded>> {
    match upgrade.await {
        Ok(io) => Some(TokioIo::new(io)),
        Err(e) => {
            tracing::info!(error = %e, "a control plane's connection was not upgraded");
            None
        }
    }
}

fn switching() -> Response<Body> {
    let mut response = respond(StatusCode::SWITCHING_PROTOCOLS, "application/octet-stream", Body::default());
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("upgrade"));
    headers.insert(hyper::header::UPGRADE, hyper::header::HeaderValue::from_static(UPGRADE_PROTOCOL));
    response
}

/// Whether the control plane may send `request` to a sandbox's agent.
fn relayed(request: &Request) -> bool {
    match request {
        Request::Health
        | Request::Exec(_)
        | Request::Attach { .. }
        | Request::Signal { .. }
        | Request::ListProcesses
        | Request::Stat { .. }
        | Request::ReadFile { .. }
        | Request::WriteFile { .. }
        | Request::ListDir { .. }
        | Request::MakeDir { .. }
        | Request::Move { .. }
        | Request::Remove { .. }
        | Request::Watch { .. } => true,
        Request::ForgetExited | Request::AllowCheckpoint | Request::Reseed { .. } | Request::FreezeRoot { .. } => false,
    }
}

/// One operation: its first message decides whether it is relayed; the rest of the stream
/// (stdin, output, file chunks, events) then goes through as it is, both ways.
async fn relay_stream(agent: AgentClient, mut ours: FramedStream) {
    let Ok(Some(first)) = next_frame(&mut ours).await else { return };
    let refusal = match first.parse::<Request>() {
        Ok(request) if relayed(&request) => None,
        Ok(_) => Some(Reply::error(ErrorKind::PermissionDenied, "the node does not relay this operation")),
        Err(e) => Some(Reply::error(ErrorKind::InvalidInput, format!("not an agent request: {e}"))),
    };
    if let Some(refusal) = refusal {
        let _ = send_message(&mut ours, &refusal).await;
        return;
    }
    let mut theirs = match agent.open_stream().await {
        Ok(stream) => stream,
        Err(e) => {
            let _ = send_message(&mut ours, &Reply::error(ErrorKind::Other, e.to_string())).await;
            return;
        }
    };
    if theirs.send(first).await.is_err() {
        return;
    }
    forward(ours, theirs).await;
}

/// Passes frames both ways until both sides have finished. One task polls both streams (a
/// yamux stream must only ever be polled by one task, see `space_proto::duplex`), and a
/// frame is sent on before the next is read from the same side, which keeps each side's
/// flow control.
async fn forward(mut ours: FramedStream, mut theirs: FramedStream) {
    let (mut ours_open, mut theirs_open) = (true, true);
    while ours_open || theirs_open {
        tokio::select! {
            frame = ours.next(), if ours_open => match frame {
                Some(Ok(frame)) => if theirs.send(frame).await.is_err() { return },
                // The control plane finished (or broke) its side: finish the agent's.
                _ => { ours_open = false; let _ = theirs.close().await; }
            },
            frame = theirs.next(), if theirs_open => match frame {
                Some(Ok(frame)) => if ours.send(frame).await.is_err() { return },
                _ => { theirs_open = false; let _ = ours.close().await; }
            },
        }
    }
}
