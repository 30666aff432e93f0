//! A node's end of the wire: answers control planes for any [`NodeApi`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use serde::de::DeserializeOwned;
use space_api::RuntimeKind;
use space_node_api::NodeApi;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

use crate::ops::paths;
use crate::{CheckpointSupport, NODE_API_VERSION, NodeInfo, Refusal, VERSION_HEADER, codes};
pub(crate) use calls::FAILED;

pub(crate) mod calls;
mod relay;
mod stage;
mod streams;

/// Largest request body a node reads.
const MAX_BODY: usize = 16 << 20;
/// How long a connection may take to complete its TLS handshake: one that stalls (or never
/// speaks) does not hold a task for ever.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What every connection of one server shares.
struct Served {
    node: Arc<dyn NodeApi>,
    audit: streams::AuditSlot,
    background: std::sync::Once,
    /// This process's incarnation (see [`NodeInfo::incarnation`]).
    incarnation: String,
    /// The calls that change something, which a graceful stop waits for.
    changes: TaskTracker,
    /// Set once the node stops: connections still open are refused new changes (see
    /// [`calls`]), so the wait for those running ends.
    stopping: std::sync::atomic::AtomicBool,
    /// Files sent for template work (see [`stage`]).
    staging: Arc<stage::Staging>,
}

/// Serves `node` on `listener` until the listener fails or `shutdown` resolves. Each
/// connection must complete the mutual TLS handshake `tls` requires before anything is read
/// from it. On `shutdown` it stops accepting, refuses further changes (503 `node_stopping`)
/// and waits for the calls that change something (they run on tasks of their own, see
/// [`calls`]); calls that only read end with the process. Files a control plane sends for
/// template work are kept in `staging`, which is emptied first.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    node: Arc<dyn NodeApi>,
    staging: std::path::PathBuf,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let staging = Arc::new(stage::Staging::open(staging)?);
    staging.clone().sweep_old();
    let acceptor = TlsAcceptor::from(tls);
    let audit = streams::AuditSlot::new(node.take_audit_events());
    let incarnation = hex_token();
    let changes = TaskTracker::new();
    let stopping = std::sync::atomic::AtomicBool::new(false);
    let background = std::sync::Once::new();
    let served = Arc::new(Served { node, audit, background, incarnation, changes: changes.clone(), stopping, staging });
    let mut shutdown = std::pin::pin!(shutdown);
    let accepted = loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => break Err(e),
            },
            () = &mut shutdown => break Ok(()),
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(acceptor.clone(), served.clone(), tcp, peer));
    };
    drop(listener);
    served.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    changes.close();
    if !changes.is_empty() {
        tracing::info!(calls = changes.len(), "waiting for the node's calls that change something to finish");
    }
    changes.wait().await;
    accepted
}

/// Serves one connection: its TLS handshake, then its requests.
async fn connection(acceptor: TlsAcceptor, served: Arc<Served>, tcp: tokio::net::TcpStream, peer: SocketAddr) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "refused a connection to the node API");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "a connection to the node API did not complete its TLS handshake");
            return;
        }
    };
    let service = hyper::service::service_fn(move |request| answer(served.clone(), request));
    if let Err(e) =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).with_upgrades().await
    {
        tracing::debug!(%peer, error = %e, "a node API connection ended");
    }
}

async fn answer(served: Arc<Served>, mut request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if let Some(refusal) = version_refusal(&request) {
        return Ok(refusal);
    }
    let upgrade = hyper::upgrade::on(&mut request);
    let (parts, body) = request.into_parts();
    // Read (and bound) the body before answering, so a connection is never left half-read.
    let Ok(body) = http_body_util::Limited::new(body, MAX_BODY).collect().await else {
        return Ok(refuse(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "request bodies are at most 16 MiB".into()));
    };
    let body = body.to_bytes();
    let node = served.node.clone();
    Ok(match (parts.method, parts.uri.path()) {
        (Method::GET, paths::INFO) => json(StatusCode::OK, &info(node.as_ref(), &served.incarnation).await),
        (Method::POST, paths::CALL) => match parse(&body) {
            Ok(call) => calls::answer(served.clone(), call).await,
            Err(e) => bad_request(e),
        },
        (Method::POST, paths::TEMPLATE) => match parse(&body) {
            Ok(call) => streams::template(node, call),
            Err(e) => bad_request(e),
        },
        (Method::GET, paths::AUDIT) => served.audit.stream(),
        (Method::POST, paths::AGENT) => match parse(&body) {
            Ok(call) => relay::agent(node, call, upgrade).await,
            Err(e) => bad_request(e),
        },
        (Method::POST, paths::PORT) => match parse(&body) {
            Ok(call) => relay::port(node, call, upgrade).await,
            Err(e) => bad_request(e),
        },
        (Method::POST, paths::STAGE) => match parse(&body) {
            Ok(call) => served.staging.clone().receive(call, upgrade),
            Err(e) => bad_request(e),
        },
        (method, path) => refuse(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_OPERATION,
            format!("this node has no operation {method} {path} in node API version {NODE_API_VERSION}"),
        ),
    })
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(body)
}

/// The refusal of a body that is not what the path takes.
fn bad_request(e: serde_json::Error) -> Response<Body> {
    refuse(
        StatusCode::BAD_REQUEST,
        codes::BAD_REQUEST,
        format!("the request is not an operation of node API version {NODE_API_VERSION}: {e}"),
    )
}

/// The refusal of a request that does not name this node's API version.
fn version_refusal(request: &Request<Incoming>) -> Option<Response<Body>> {
    let theirs = request.headers().get(VERSION_HEADER).and_then(|v| v.to_str().ok());
    if theirs == Some(NODE_API_VERSION.to_string().as_str()) {
        return None;
    }
    let theirs = theirs.map_or_else(|| "none".to_string(), |v| format!("{v:?}"));
    Some(refuse(
        StatusCode::BAD_REQUEST,
        codes::VERSION_MISMATCH,
        format!(
            "this node speaks node API version {NODE_API_VERSION}, the caller version {theirs}: \
             run the same space release on the control plane and its nodes"
        ),
    ))
}

/// 16 random hex digits.
fn hex_token() -> String {
    rand::random::<[u8; 8]>().iter().map(|b| format!("{b:02x}")).collect()
}

async fn info(node: &dyn NodeApi, incarnation: &str) -> NodeInfo {
    NodeInfo {
        id: node.node_id(),
        version: env!("CARGO_PKG_VERSION").into(),
        api_version: NODE_API_VERSION,
        runtimes: node.runtimes(),
        builtin_templates: node.builtin_templates(),
        checkpoints: RuntimeKind::ALL
            .into_iter()
            .map(|runtime| CheckpointSupport { runtime, support: node.checkpoint_support(runtime) })
            .collect(),
        capacity: node.capacity().await.unwrap_or_default(),
        now_ms: Some(crate::clock::now_ms()),
        incarnation: Some(incarnation.to_owned()),
    }
}

/// A response of `status` carrying `body`, with the version header every answer has.
fn respond(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    headers.insert(VERSION_HEADER, NODE_API_VERSION.into());
    response
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    respond(status, "application/json", Full::new(Bytes::from(body)).boxed_unsync())
}

pub(crate) fn refuse(status: StatusCode, code: &str, message: String) -> Response<Body> {
    json(status, &Refusal { code: code.into(), message })
}
