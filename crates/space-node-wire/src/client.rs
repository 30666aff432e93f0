//! A control plane's end of the wire: one node, over kept-alive connections made again
//! when they end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;

use crate::ops::{NodeFailure, UPGRADE_PROTOCOL, paths};
use crate::{NODE_API_VERSION, NodeInfo, Refusal, VERSION_HEADER, WireError, codes};

/// Idle connections kept for calls to come; more are made while more calls run at once.
const IDLE_CONNECTIONS: usize = 16;
/// Largest answer read whole. A node is not trusted not to send more (a sandbox that escaped
/// onto it could answer for it): past this the call fails instead of filling our memory.
const MAX_ANSWER: usize = 64 << 20;
/// How long making a connection (TCP and the TLS handshake) may take: a node that does not
/// answer fails the call instead of holding it for ever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How a call waiting on a node finds the node gone quiet (stopped, cut off, its host dead:
/// none of which closes our connection): every [`Watch::every`] it checks that the node
/// answered something meanwhile (any call, or an ask for its info on another connection,
/// which one call makes for all of them), and gives up once [`Watch::misses`] checks in a row
/// found nothing within [`Watch::within`]. A node that answers keeps a long call (a
/// checkpoint, an export) going for as long as it takes. Three misses five seconds apart is
/// about a node's lease.
const WATCH: Watch = Watch { every: Duration::from_secs(5), within: Duration::from_secs(5), misses: 3 };

/// What the calls to one node last heard of it; shared, so that however many calls wait on
/// the node, it is asked about once per [`Watch::every`].
struct Liveness {
    /// When the node last answered a call.
    answered: tokio::time::Instant,
    /// When the last ask ended, and whether the node answered it.
    asked: Option<(tokio::time::Instant, bool)>,
}

/// How calls watch that their node still answers (see [`WATCH`]).
#[derive(Clone, Copy, Debug)]
struct Watch {
    every: Duration,
    within: Duration,
    misses: u32,
}

/// An upgraded connection to a node: an agent's protocol or a port's bytes.
pub type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// A connection to one node's API.
pub struct NodeClient {
    /// `host:port` to connect to.
    address: String,
    /// The name the node's certificate must carry.
    server_name: ServerName<'static>,
    connector: TlsConnector,
    api_version: u32,
    connect_timeout: Duration,
    watch: Watch,
    liveness: std::sync::Mutex<Liveness>,
    /// Held by the one call asking the node its info for all of them.
    asking: Mutex<()>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
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
            connect_timeout: CONNECT_TIMEOUT,
            watch: WATCH,
            liveness: std::sync::Mutex::new(Liveness { answered: tokio::time::Instant::now(), asked: None }),
            asking: Mutex::new(()),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The node's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// What the node says of itself.
    pub async fn info(&self) -> Result<NodeInfo, WireError> {
        let body = self.call(Method::GET, paths::INFO, Bytes::new()).await?;
        Ok(serde_json::from_slice(&body)?)
    }

    /// `POST`s `request` to `path` and reads the answer as a `T`; a node's failure is
    /// [`WireError::Failed`].
    pub async fn post<T: DeserializeOwned>(&self, path: &str, request: &impl Serialize) -> Result<T, WireError> {
        let body = self.call(Method::POST, path, Bytes::from(serde_json::to_vec(request)?)).await?;
        Ok(serde_json::from_slice(&body)?)
    }

    /// `method`s `request` to `path`, and returns the body of a successful answer as it
    /// comes, for answers that stream. The connection is not kept.
    pub async fn open(&self, method: Method, path: &str, request: &impl Serialize) -> Result<Incoming, WireError> {
        let request = self.request(method, path, Bytes::from(serde_json::to_vec(request)?))?;
        let mut sender = self.connect().await?;
        let response = self.while_answering(async { Ok(sender.send_request(request).await?) }).await?;
        Ok(self.check(response, StatusCode::OK).await?.into_body())
    }

    /// `POST`s `request` to `path` asking for an upgrade; the upgraded connection.
    pub async fn upgrade(&self, path: &str, request: &impl Serialize) -> Result<Upgraded, WireError> {
        let mut request = self.request(Method::POST, path, Bytes::from(serde_json::to_vec(request)?))?;
        let headers = request.headers_mut();
        headers.insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("upgrade"));
        headers.insert(hyper::header::UPGRADE, hyper::header::HeaderValue::from_static(UPGRADE_PROTOCOL));
        let mut sender = self.connect().await?;
        let response = self.while_answering(async { Ok(sender.send_request(request).await?) }).await?;
        let response = self.check(response, StatusCode::SWITCHING_PROTOCOLS).await?;
        Ok(TokioIo::new(hyper::upgrade::on(response).await?))
    }

    fn request(&self, method: Method, path: &str, body: Bytes) -> Result<Request<Full<Bytes>>, WireError> {
        Ok(Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.address)
            .header(VERSION_HEADER, self.api_version)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?)
    }

    /// Sends one request and returns the body of a successful answer; fails once the node
    /// stops answering.
    async fn call(&self, method: Method, path: &str, body: Bytes) -> Result<Bytes, WireError> {
        self.while_answering(self.call_unwatched(method, path, body)).await
    }

    /// `work`'s outcome, or [`WireError::Unresponsive`] once the node has not answered
    /// [`Watch::misses`] asks in a row while `work` waited on it.
    async fn while_answering<T>(&self, work: impl Future<Output = Result<T, WireError>>) -> Result<T, WireError> {
        let watch = async {
            let mut missed = 0;
            loop {
                tokio::time::sleep(self.watch.every).await;
                missed = if self.still_answers().await { 0 } else { missed + 1 };
                if missed >= self.watch.misses {
                    let quiet = self.liveness().answered.elapsed();
                    return WireError::Unresponsive { address: self.address.clone(), quiet };
                }
            }
        };
        tokio::select! {
            done = work => done,
            gone = watch => Err(gone),
        }
    }

    /// Whether the node answered anything within the last [`Watch::every`]; if not, asks it
    /// its info. One call asks at a time, and an ask that ended within [`Watch::every`]
    /// answers for every call that comes after it.
    async fn still_answers(&self) -> bool {
        let _asking = self.asking.lock().await;
        {
            let liveness = self.liveness();
            if liveness.answered.elapsed() < self.watch.every {
                return true;
            }
            if let Some((at, answered)) = liveness.asked
                && at.elapsed() < self.watch.every
            {
                return answered;
            }
        }
        let ask = self.call_unwatched(Method::GET, paths::INFO, Bytes::new());
        let answered = matches!(tokio::time::timeout(self.watch.within, ask).await, Ok(Ok(_)));
        self.liveness().asked = Some((tokio::time::Instant::now(), answered));
        answered
    }

    fn liveness(&self) -> std::sync::MutexGuard<'_, Liveness> {
        // Two instants, each written in one statement: never left half-changed by a panic.
        self.liveness.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn call_unwatched(&self, method: Method, path: &str, body: Bytes) -> Result<Bytes, WireError> {
        let request = self.request(method, path, body)?;
        let mut sender = self.sender().await?;
        let response = sender.send_request(request).await?;
        self.liveness().answered = tokio::time::Instant::now();
        let response = self.check(response, StatusCode::OK).await;
        let body = read_whole(response?.into_body()).await?;
        // Keep the connection only once it has answered in full: one another call is waiting
        // on is never used concurrently.
        let mut idle = self.idle.lock().await;
        if idle.len() < IDLE_CONNECTIONS {
            idle.push(sender);
        }
        Ok(body)
    }

    /// `response` if it has the status `expected` and our version; the error it stands for
    /// otherwise.
    async fn check(&self, response: Response<Incoming>, expected: StatusCode) -> Result<Response<Incoming>, WireError> {
        let status = response.status();
        let theirs = response.headers().get(VERSION_HEADER).and_then(|v| v.to_str().ok()?.parse::<u32>().ok());
        if status == expected && theirs == Some(self.api_version) {
            return Ok(response);
        }
        let body = read_whole(response.into_body()).await?;
        if status == crate::server::FAILED && theirs == Some(self.api_version) {
            let failure: NodeFailure = serde_json::from_slice(&body)?;
            return Err(WireError::Failed(failure));
        }
        refusal(status, theirs, self.api_version, &body)
    }

    /// A ready connection: one kept, or a new one.
    async fn sender(&self) -> Result<SendRequest<Full<Bytes>>, WireError> {
        loop {
            let Some(mut sender) = self.idle.lock().await.pop() else { break };
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        self.connect().await
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, WireError> {
        let connect = |source| WireError::Connect { address: self.address.clone(), source };
        let handshake = async {
            let tcp = TcpStream::connect(&self.address).await?;
            tcp.set_nodelay(true)?;
            self.connector.connect(self.server_name.clone(), tcp).await
        };
        let tls = match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(tls) => tls.map_err(connect)?,
            Err(_) => return Err(connect(std::io::ErrorKind::TimedOut.into())),
        };
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

mod stage;
#[cfg(test)]
mod tests;

/// `body` whole, if it is at most [`MAX_ANSWER`] bytes.
async fn read_whole(body: Incoming) -> Result<Bytes, WireError> {
    match http_body_util::Limited::new(body, MAX_ANSWER).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(e) => Err(WireError::Http(*e)),
            Err(_) => Err(WireError::AnswerTooLarge),
        },
    }
}

/// The lines of a streamed answer, each one JSON value.
pub(crate) struct Lines {
    body: Incoming,
    buffer: bytes::BytesMut,
}

/// Longest line a node may send.
const MAX_LINE: usize = 16 << 20;

impl Lines {
    pub(crate) fn new(body: Incoming) -> Lines {
        Lines { body, buffer: bytes::BytesMut::new() }
    }

    /// The next value; `None` at the end of the answer.
    pub(crate) async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(end + 1);
                return Ok(Some(serde_json::from_slice(&line[..end])?));
            }
            if self.buffer.len() > MAX_LINE {
                return Err(WireError::LineTooLong);
            }
            match self.body.frame().await.transpose()? {
                Some(frame) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                None => return Ok(None),
            }
        }
    }
}
