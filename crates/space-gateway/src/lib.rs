//! The node's egress gateway: the only way out of a sandbox.
//!
//! A sandbox's network namespace has no interface that leaves it: only `lo`, with every IPv4
//! address routed to it (`local 0.0.0.0/0 dev lo`). The gateway creates its listening sockets
//! *inside* that namespace (see `netns.rs`), so whatever a sandbox connects to, it reaches
//! either its own processes or the gateway, which decides per connection and per request
//! with the session's current policy and grants. There is nothing to spoof: a connection is
//! attributed to the sandbox by the listener that accepted it.
//!
//! Inside every sandbox:
//! - `GATEWAY_ADDR:PROXY_PORT` is the explicit HTTP/HTTPS proxy (`HTTP(S)_PROXY`);
//! - any address, port 80 or 443, reaches the transparent interception;
//! - any address, UDP port 53, reaches the DNS responder: allowed names resolve to
//!   `GATEWAY_ADDR`, others are NXDOMAIN;
//! - everything else (other ports, other UDP, IPv6) goes nowhere.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock};

use space_api::egress::{AuditEvent, NetworkPolicy};
use space_api::{CredentialId, SandboxId, SessionId};

/// The address sandboxes use for the gateway (and that allowed names resolve to).
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 254, 1);
/// The explicit proxy's port.
pub const PROXY_PORT: u16 = 3128;
/// Where plain HTTP to any address lands in a sandbox's namespace.
pub const HTTP_PORT: u16 = 80;
/// Where TLS to any address lands in a sandbox's namespace.
pub const HTTPS_PORT: u16 = 443;
/// Where the session CA's certificate is written in the sandbox.
pub const CA_CERT_PATH: &str = "/etc/space/ca.crt";
/// The template's trusted roots plus the session CA.
pub const CA_BUNDLE_PATH: &str = "/etc/space/ca-bundle.crt";

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot set up the gateway in the sandbox's network namespace: {0}")]
    Netns(String),
    #[error("bad gateway configuration: {0}")]
    Config(String),
    #[error("certificate authority: {0}")]
    Ca(String),
}

/// Operator settings.
#[derive(Debug, Clone, Default)]
pub struct GatewayConfig {
    /// Name → address overrides, consulted before DNS (tests map names to loopback servers).
    /// A port, when given, replaces the port asked for.
    pub resolve: HashMap<String, std::net::SocketAddr>,
    /// Name → address without a port override.
    pub resolve_ip: HashMap<String, IpAddr>,
    /// Upstream trust roots in addition to the built-in (Mozilla) ones, DER-encoded.
    pub extra_roots: Vec<Vec<u8>>,
    /// Lets upstream addresses be private, loopback, link-local or the node's own. Off by
    /// default (DNS rebinding, and a pivot to the node's own services); tests turn it on.
    pub allow_private_upstreams: bool,
    /// Name servers for upstream names (`--gateway-dns`), asked instead of the host's
    /// resolver configuration when not empty.
    pub dns_servers: Vec<std::net::SocketAddr>,
    /// What each sandbox may hold of the gateway at once.
    pub limits: SandboxLimits,
}

/// A session's certificate authority: signs the certificates the gateway shows for the
/// hosts it intercepts. Only `cert_pem` ever enters the sandbox.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct SessionCa {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for SessionCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCa").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

/// A credential granted to a session, with its value: lives only in the node's memory.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    /// The credential's id, unique across tenants: what its rate limit is counted by, so
    /// every session holding it (a fork, another session granted it) shares one bucket.
    pub credential_id: CredentialId,
    pub credential: String,
    pub hosts: Vec<String>,
    /// Header name and value (with the secret already substituted).
    pub header_name: String,
    pub header_value: String,
    /// The raw secret. Request headers get it only as `header_value`; response headers that
    /// echo it get `placeholder` (or a marker) instead.
    pub secret: String,
    /// What the sandbox holds instead of the value (`placeholder_env`), if anything.
    pub placeholder: Option<String>,
    /// Unix seconds.
    pub expires_at: Option<i64>,
    pub rate_limit_per_min: Option<u32>,
    /// Why there is no value to inject (an OAuth credential whose token endpoint fails):
    /// requests to its hosts get 502 with this, instead of going out without it.
    #[serde(default)]
    pub unavailable: Option<String>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("credential", &self.credential)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Everything the gateway needs to decide for one session.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SessionEgress {
    pub policy: NetworkPolicy,
    pub ca: SessionCa,
    pub grants: Vec<Grant>,
}

impl SessionEgress {
    /// Whether the name may be reached: the policy allows it, counting granted hosts.
    pub(crate) fn allows_host(&self, name: &str) -> bool {
        let granted = self.grants.iter().flat_map(|g| g.hosts.iter().map(String::as_str));
        self.policy.allows_host(name, granted)
    }
}

/// Where audit events go (the control plane stores them).
pub type AuditSink = tokio::sync::mpsc::UnboundedSender<AuditEvent>;

pub use space_api::egress::placeholder_for;

/// Environment every command in a sandbox gets, so clients use the proxy and trust the
/// session CA.
pub fn sandbox_env() -> BTreeMap<String, String> {
    let proxy = format!("http://{GATEWAY_ADDR}:{PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut env = BTreeMap::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.insert(name.to_string(), proxy.clone());
    }
    env.insert("NO_PROXY".into(), no_proxy.clone());
    env.insert("no_proxy".into(), no_proxy);
    for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"] {
        env.insert(name.to_string(), CA_BUNDLE_PATH.to_string());
    }
    env.insert("NODE_EXTRA_CA_CERTS".into(), CA_CERT_PATH.into());
    env
}

mod audit_budget;
mod dns;
mod limits;
mod netns;
mod traffic;
// Data path (explicit proxy, transparent interception, TLS, upstream connections).
mod proxy;

pub use limits::SandboxLimits;
pub use proxy::{is_host_address, is_private, parse_dns_server};
pub use traffic::SessionTraffic;

/// State shared by every sandbox's listeners.
struct Shared {
    limits: SandboxLimits,
    audit: AuditSink,
    sessions: RwLock<HashMap<SessionId, Arc<SessionEgress>>>,
    /// Bytes per session whose egress is set, and the node's gateway metrics.
    traffic: traffic::Traffic,
    /// The data path's caches and upstream TLS settings.
    state: proxy::State,
}

impl Shared {
    fn new(limits: SandboxLimits, audit: AuditSink, state: proxy::State) -> Arc<Shared> {
        Arc::new(Shared { limits, audit, sessions: RwLock::new(HashMap::new()), traffic: Default::default(), state })
    }
}

/// One attached sandbox, as its listeners see it: which session it serves right now (a
/// warm-pool pod serves none until bound, and is denied everything until then).
pub(crate) struct SandboxContext {
    pub(crate) sandbox: SandboxId,
    session: RwLock<Option<SessionId>>,
    shared: Arc<Shared>,
    audit_budget: Mutex<audit_budget::AuditBudget>,
    /// Kept across a re-attachment, like the session: connections accepted by the earlier
    /// listeners still hold their slots.
    connections: Arc<limits::ConnectionLimit>,
}

impl SandboxContext {
    fn new(sandbox: SandboxId, session: Option<SessionId>, shared: Arc<Shared>) -> SandboxContext {
        let connections = Arc::new(limits::ConnectionLimit::new(shared.limits.max_connections));
        SandboxContext { sandbox, session: RwLock::new(session), shared, audit_budget: Default::default(), connections }
    }

    /// The session and its egress as of now: each new connection (and each intercepted
    /// request) asks again, so policy changes and rotations apply at once.
    pub(crate) fn current(&self) -> Option<(SessionId, Arc<SessionEgress>)> {
        let session = self.session.read().ok()?.clone()?;
        let egress = self.shared.sessions.read().ok()?.get(&session)?.clone();
        Some((session, egress))
    }

    /// Records a decision, unless the sandbox makes them faster than the audit budget allows
    /// (a flood of DNS queries must not fill the node's memory or disk); what is left out is
    /// counted in an event of its own once the budget allows again.
    pub(crate) fn audit(&self, event: AuditEvent) {
        self.shared.traffic.count(&event);
        let summary = match self.audit_budget.lock() {
            Ok(mut budget) => match budget.spend(std::time::Instant::now()) {
                audit_budget::Spent::No => return,
                audit_budget::Spent::Yes { dropped } => (dropped > 0).then(|| audit_budget::summary(&event, dropped)),
            },
            Err(_) => None,
        };
        // The receiver only goes away when the server shuts down.
        if let Some(summary) = summary {
            let _ = self.shared.audit.send(summary);
        }
        let _ = self.shared.audit.send(event);
    }

    pub(crate) fn state(&self) -> &proxy::State {
        &self.shared.state
    }

    /// A slot for a new connection from the sandbox, or `None` when it holds as many as its
    /// limit allows. Refusals are audited, at most once a second with how many there were.
    pub(crate) fn admit(&self) -> Option<limits::Slot> {
        let now = std::time::Instant::now();
        let (slot, report) = match self.connections.admit() {
            Some(slot) => (Some(slot), self.connections.unreported(now)),
            None => (None, self.connections.refused(now)),
        };
        if let Some(refused) = report {
            self.audit_refusals(refused);
        }
        slot
    }

    fn audit_refusals(&self, refused: u64) {
        let max = self.connections.max();
        let Some((session, _)) = self.current() else {
            return tracing::info!(sandbox = %self.sandbox, "{refused} gateway connections refused at the limit of {max}");
        };
        let mut event = proxy::audit_event(&session, "limit", "", 0);
        event.decision = space_api::egress::AuditDecision::Denied;
        event.reason = Some(format!(
            "{refused} new connection(s) refused: the sandbox already holds {max} connections through the gateway (its \
             limit)"
        ));
        self.audit(event);
    }
}

#[cfg(test)]
impl SandboxContext {
    /// A context serving `session` (if any), without a network namespace: tests run the
    /// listeners on loopback.
    pub(crate) fn for_test(
        config: GatewayConfig,
        audit: AuditSink,
        session: Option<(SessionId, SessionEgress)>,
    ) -> Result<Arc<SandboxContext>, GatewayError> {
        let state = proxy::State::new(&config)?;
        Ok(SandboxContext::for_test_with_state(config.limits, state, audit, session))
    }

    /// The same with the data path's `state` given (e.g. with a fixed set of node addresses).
    pub(crate) fn for_test_with_state(
        limits: SandboxLimits,
        state: proxy::State,
        audit: AuditSink,
        session: Option<(SessionId, SessionEgress)>,
    ) -> Arc<SandboxContext> {
        let shared = Shared::new(limits, audit, state);
        let context = SandboxContext::new(SandboxId::generate(), None, shared);
        if let Some((id, egress)) = session {
            context.set_test_session(&id, egress);
        }
        Arc::new(context)
    }

    /// Another sandbox attached to the same gateway (sharing its sessions, caches and
    /// configuration), serving `session`.
    pub(crate) fn sibling_for_test(&self, session: &SessionId, egress: SessionEgress) -> Arc<SandboxContext> {
        let context = SandboxContext::new(SandboxId::generate(), None, self.shared.clone());
        context.set_test_session(session, egress);
        Arc::new(context)
    }

    /// Connections holding a slot now.
    pub(crate) fn open_connections(&self) -> usize {
        self.connections.open()
    }

    /// Serves `session` from now on, with `egress`.
    pub(crate) fn set_test_session(&self, session: &SessionId, egress: SessionEgress) {
        if let Ok(mut sessions) = self.shared.sessions.write() {
            sessions.insert(session.clone(), Arc::new(egress));
        }
        self.shared.traffic.track(session);
        if let Ok(mut current) = self.session.write() {
            *current = Some(session.clone());
        }
    }
}

/// An attached sandbox: its context and the tasks serving its listeners.
struct Attachment {
    context: Arc<SandboxContext>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The node's gateway.
pub struct Gateway {
    shared: Arc<Shared>,
    sandboxes: Mutex<HashMap<SandboxId, Attachment>>,
}

impl Gateway {
    /// Fails on a configuration the data path cannot use (e.g. extra roots that do not parse).
    pub fn new(config: GatewayConfig, audit: AuditSink) -> Result<Arc<Gateway>, GatewayError> {
        let state = proxy::State::new(&config)?;
        let shared = Shared::new(config.limits, audit, state);
        Ok(Arc::new(Gateway { shared, sandboxes: Mutex::new(HashMap::new()) }))
    }

    /// Opens the gateway's listeners inside `netns`, the sandbox's network namespace (refused
    /// when it is the node's own), and serves them. Attaching again (e.g. after a server
    /// restart) replaces the earlier attachment; the session it serves is kept.
    pub async fn attach(&self, sandbox: &SandboxId, netns: OwnedFd) -> Result<(), GatewayError> {
        let sockets = tokio::task::spawn_blocking(move || netns::open_sandbox_sockets(netns))
            .await
            .map_err(|e| GatewayError::Netns(format!("setup task: {e}")))??;
        let earlier = self.sandboxes.lock().ok().and_then(|s| s.get(sandbox).map(|a| a.context.clone()));
        let mut context =
            SandboxContext::new(sandbox.clone(), earlier.as_ref().and_then(|c| session_of(c)), self.shared.clone());
        if let Some(earlier) = earlier {
            context.connections = earlier.connections.clone();
        }
        let context = Arc::new(context);
        let tasks = serve(sockets, &context)?;
        if let Ok(mut sandboxes) = self.sandboxes.lock() {
            sandboxes.insert(sandbox.clone(), Attachment { context, tasks });
        }
        Ok(())
    }

    /// From now on, `sandbox`'s traffic is decided by `session`'s egress.
    pub fn assign(&self, sandbox: &SandboxId, session: &SessionId) {
        if let Some(attachment) = self.sandboxes.lock().ok().as_ref().and_then(|s| s.get(sandbox))
            && let Ok(mut current) = attachment.context.session.write()
        {
            *current = Some(session.clone());
        }
    }

    /// Stops serving `sandbox` (its listeners close). Idempotent.
    pub fn detach(&self, sandbox: &SandboxId) {
        if let Ok(mut sandboxes) = self.sandboxes.lock() {
            sandboxes.remove(sandbox);
        }
        self.shared.state.idle.forget(sandbox);
    }

    /// Sets (or replaces) what `session` may reach and which credentials it holds.
    pub fn set_session(&self, session: &SessionId, egress: SessionEgress) {
        if let Ok(mut sessions) = self.shared.sessions.write() {
            sessions.insert(session.clone(), Arc::new(egress));
        }
        self.shared.traffic.track(session);
    }

    /// What `session` sent and received through the gateway since its egress was set here
    /// (counted as each connection or request ends); `None` if the gateway does not know it.
    pub fn session_traffic(&self, session: &SessionId) -> Option<SessionTraffic> {
        self.shared.traffic.of(session)
    }

    /// The certificate (PEM) of `session`'s CA, if its egress is set.
    pub fn session_ca_cert(&self, session: &SessionId) -> Option<String> {
        Some(self.shared.sessions.read().ok()?.get(session)?.ca.cert_pem.clone())
    }

    /// The names of the credentials `session` holds in the gateway now, if its egress is set:
    /// what the control plane last pushed.
    pub fn session_grants(&self, session: &SessionId) -> Option<Vec<String>> {
        let sessions = self.shared.sessions.read().ok()?;
        Some(sessions.get(session)?.grants.iter().map(|g| g.credential.clone()).collect())
    }

    pub fn forget_session(&self, session: &SessionId) {
        if let Ok(mut sessions) = self.shared.sessions.write() {
            sessions.remove(session);
        }
        self.shared.traffic.forget(session);
    }
}

fn session_of(context: &SandboxContext) -> Option<SessionId> {
    context.session.read().ok()?.clone()
}

/// Starts one task per listener.
fn serve(
    sockets: netns::SandboxSockets,
    context: &Arc<SandboxContext>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, GatewayError> {
    let tcp = |l: std::net::TcpListener| {
        tokio::net::TcpListener::from_std(l).map_err(|e| GatewayError::Netns(format!("register listener: {e}")))
    };
    let dns = tokio::net::UdpSocket::from_std(sockets.dns)
        .map_err(|e| GatewayError::Netns(format!("register dns socket: {e}")))?;
    let (proxy_listener, http, https) = (tcp(sockets.proxy)?, tcp(sockets.http)?, tcp(sockets.https)?);
    Ok(vec![
        tokio::spawn(dns::serve(dns, context.clone())),
        tokio::spawn(proxy::serve_explicit(proxy_listener, context.clone())),
        tokio::spawn(proxy::serve_transparent_http(http, context.clone())),
        tokio::spawn(proxy::serve_transparent_https(https, context.clone())),
    ])
}

/// The DER certificates in a PEM file (at least one).
pub fn certificates_from_pem(pem: &[u8]) -> Result<Vec<Vec<u8>>, GatewayError> {
    let mut reader = std::io::BufReader::new(pem);
    let certs = rustls_pemfile::certs(&mut reader)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| GatewayError::Config(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(GatewayError::Config("no certificate in the PEM data".into()));
    }
    Ok(certs)
}
