//! A control plane's end of the wire: one node, over one kept-alive connection that is
//! made again when it ends.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;

use crate::{NODE_API_VERSION, NodeInfo, Refusal, VERSION_HEADER, WireError, codes};

/// A connection to one node's API.
pub struct NodeClient {
    /// `host:port` to connect to.
    address: String,
    /// The name the node's certificate must carry.
    server_name: ServerName<'static>,
    connector: TlsConnector,
    api_version: u32,
    connection: Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl NodeClient {
    /// A client of the node at `address` (`host:port`), whose certificate must name `host`.
    pub fn new(address: &str, tls: Arc<ClientConfig>) -> Result<NodeClient, WireError> {
        let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(host.to_string()).map_err(|_| WireError::Connect {
            address: address.into(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a host name or address"),
        })?;
        Ok(NodeClient {
            address: address.into(),
            server_name,
            connector: TlsConnector::from(tls),
            api_version: NODE_API_VERSION,
            connection: Mutex::new(None),
        })
    }

    /// What the node says of itself.
    pub async fn info(&self) -> Result<NodeInfo, WireError> {
        let body = self.call(Method::GET, "/v1/info", Bytes::new()).await?;
        Ok(serde_json::from_slice(&body)?)
    }

    /// Sends one request and returns the body of a successful answer.
    async fn call(&self, method: Method, path: &str, body: Bytes) -> Result<Bytes, WireError> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.address)
            .header(VERSION_HEADER, self.api_version)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let mut sender = self.sender().await?;
        let response = sender.send_request(request).await?;
        // Put the connection back only once it has answered: a connection another call is
        // waiting on is not reused concurrently.
        *self.connection.lock().await = Some(sender);
        let status = response.status();
        let theirs = response.headers().get(VERSION_HEADER).and_then(|v| v.to_str().ok()?.parse::<u32>().ok());
        let body = response.into_body().collect().await?.to_bytes();
        if status.is_success() && theirs == Some(self.api_version) {
            return Ok(body);
        }
        refusal(status, theirs, self.api_version, &body)
    }

    /// A ready connection: the one kept, or a new one.
    async fn sender(&self) -> Result<SendRequest<Full<Bytes>>, WireError> {
        if let Some(mut sender) = self.connection.lock().await.take()
            && sender.ready().await.is_ok()
        {
            return Ok(sender);
        }
        let connect = |source| WireError::Connect { address: self.address.clone(), source };
        let tcp = TcpStream::connect(&self.address).await.map_err(connect)?;
        tcp.set_nodelay(true).map_err(connect)?;
        let tls = self.connector.connect(self.server_name.clone(), tcp).await.map_err(connect)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        let address = self.address.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(node = %address, error = %e, "a node API connection ended");
            }
        });
        Ok(sender)
    }
}

/// The error an answer that is not a success of our version stands for.
fn refusal<T>(status: StatusCode, theirs: Option<u32>, ours: u32, body: &[u8]) -> Result<T, WireError> {
    let refusal: Option<Refusal> = serde_json::from_slice(body).ok();
    if theirs != Some(ours) || refusal.as_ref().is_some_and(|r| r.code == codes::VERSION_MISMATCH) {
        return Err(WireError::VersionMismatch { ours, theirs });
    }
    let (code, message) = refusal
        .map_or_else(|| ("unknown".to_string(), String::from_utf8_lossy(body).into_owned()), |r| (r.code, r.message));
    Err(WireError::Refused { status: status.as_u16(), code, message })
}

#[cfg(test)]
mod tests;
