//! Upgraded connections: a sandbox's agent, restricted to what the control plane may ask of
//! it, and tunnels to a sandbox's ports.
//!
//! The agent connection speaks the agent protocol (`space-proto`) end to end, so exec, PTY,
//! files and watch keep their framing and flow control across the hop. The node reads the
//! first message of every stream and relays only the operations the public API offers;
//! those that steer a sandbox's life (checkpoint windows, freezing its root, reseeding its
//! randomness, forgetting processes) stay the node's own.

use std::sync::Arc;

use futures::SinkExt;
use hyper::upgrade::OnUpgrade;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use space_node_api::{NodeApi, PortStream};
use space_proto::client::AgentClient;
use space_proto::{
    ErrorKind, Frame, FrameReceiver, FrameSender, FramedStream, OnSendersDropped, Reply, Request, duplex, next_frame,
    send_message,
};

use super::calls::result;
use super::{Body, respond};
use crate::ops::{AgentCall, PortCall, UPGRADE_PROTOCOL, chain};

/// How long a control plane may take to say hello on an agent connection, and to send a
/// stream's first message: one that says nothing does not hold the node's tasks.
const FIRST_MESSAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connects to the sandbox's agent, then answers `101` and relays the upgraded connection.
pub(super) async fn agent(node: Arc<dyn NodeApi>, call: AgentCall, upgrade: OnUpgrade) -> Response<Body> {
    let agent = match node.agent(&call.sandbox).await {
        Ok(agent) => agent,
        Err(e) => return result::<()>(Err(e)),
    };
    tokio::spawn(async move {
        let Some(mut io) = upgraded(upgrade).await else { return };
        let name = format!("space-node/{}", env!("CARGO_PKG_VERSION"));
        match tokio::time::timeout(FIRST_MESSAGE_TIMEOUT, space_proto::handshake(&mut io, &name)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return tracing::info!(error = %e, "a control plane's agent connection failed its handshake"),
            Err(_) => return tracing::info!("a control plane's agent connection said nothing"),
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

pub(super) async fn upgraded(upgrade: OnUpgrade) -> Option<TokioIo<hyper::upgrade::Upgraded>> {
    match upgrade.await {
        Ok(io) => Some(TokioIo::new(io)),
        Err(e) => {
            tracing::info!(error = %e, "a control plane's connection was not upgraded");
            None
        }
    }
}

pub(super) fn switching() -> Response<Body> {
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
/// (stdin, output, file chunks, events) then goes through as it is, both ways. The request
/// is sent on as the node read it, so nothing it did not understand reaches the agent.
async fn relay_stream(agent: AgentClient, mut ours: FramedStream) {
    let Ok(Ok(Some(first))) = tokio::time::timeout(FIRST_MESSAGE_TIMEOUT, next_frame(&mut ours)).await else {
        return;
    };
    let request = match first.parse::<Request>() {
        Ok(request) if relayed(&request) => request,
        Ok(_) => {
            return refuse(ours, ErrorKind::PermissionDenied, "the node does not relay this operation".into()).await;
        }
        Err(e) => return refuse(ours, ErrorKind::InvalidInput, format!("not an agent request: {e}")).await,
    };
    let mut theirs = match agent.open_stream().await {
        Ok(stream) => stream,
        Err(e) => return refuse(ours, ErrorKind::Other, chain(&e)).await,
    };
    let Ok(first) = Frame::message(&request) else { return };
    if theirs.send(first).await.is_err() {
        return;
    }
    // Each stream in a pump task of its own, each direction copied on its own: output keeps
    // flowing while stdin waits for the agent to read it (and the other way round).
    let (to_control, from_control) = duplex(ours, OnSendersDropped::Close);
    let (to_agent, from_agent) = duplex(theirs, OnSendersDropped::Close);
    tokio::join!(forward(from_control, to_agent), forward(from_agent, to_control));
}

async fn refuse(mut ours: FramedStream, kind: ErrorKind, message: String) {
    let _ = send_message(&mut ours, &Reply::error(kind, message)).await;
}

/// Sends on what `from` receives until it ends; dropping `to` then closes that side.
async fn forward(mut from: FrameReceiver, to: FrameSender) {
    while let Some(Ok(frame)) = from.recv().await {
        if to.send(frame).await.is_err() {
            break;
        }
    }
}
