//! A node's end of the wire: answers control planes for any [`NodeApi`].

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use space_api::RuntimeKind;
use space_node_api::NodeApi;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::{CheckpointSupport, NODE_API_VERSION, NodeInfo, Refusal, VERSION_HEADER, codes};

/// Largest request body a node reads.
const MAX_BODY: usize = 16 << 20;
/// How long a connection may take to complete its TLS handshake: one that stalls (or never
/// speaks) does not hold a task for ever.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `node` on `listener` until the listener fails. Each connection must complete the
/// mutual TLS handshake `tls` requires before anything is read from it.
pub async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, node: Arc<dyn NodeApi>) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = listener.accept().await?;
        let acceptor = acceptor.clone();
        let node = node.clone();
        tokio::spawn(async move {
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
            let service = hyper::service::service_fn(move |request| answer(node.clone(), request));
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(%peer, error = %e, "a node API connection ended");
            }
        });
    }
}

async fn answer(
    node: Arc<dyn NodeApi>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if let Some(refusal) = version_refusal(&request) {
        return Ok(refusal);
    }
    let (parts, body) = request.into_parts();
    // Read (and bound) the body before answering, so a connection is never left half-read.
    let Ok(body) = http_body_util::Limited::new(body, MAX_BODY).collect().await else {
        return Ok(refuse(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "request bodies are at most 16 MiB".into()));
    };
    drop(body);
    Ok(match (parts.method, parts.uri.path()) {
        (Method::GET, "/v1/info") => json(StatusCode::OK, &info(node.as_ref()).await),
        (method, path) => refuse(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_OPERATION,
            format!("this node has no operation {method} {path} in node API version {NODE_API_VERSION}"),
        ),
    })
}

/// The refusal of a request that does not name this node's API version.
fn version_refusal(request: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
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

async fn info(node: &dyn NodeApi) -> NodeInfo {
    NodeInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        api_version: NODE_API_VERSION,
        runtimes: node.runtimes(),
        builtin_templates: node.builtin_templates(),
        checkpoints: RuntimeKind::ALL
            .into_iter()
            .map(|runtime| CheckpointSupport { runtime, support: node.checkpoint_support(runtime) })
            .collect(),
        capacity: node.capacity().await,
    }
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    headers.insert(VERSION_HEADER, NODE_API_VERSION.into());
    response
}

fn refuse(status: StatusCode, code: &str, message: String) -> Response<Full<Bytes>> {
    json(status, &Refusal { code: code.into(), message })
}
