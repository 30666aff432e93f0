//! The control plane: HTTP API over a durable store, and a reconciler that drives the node
//! toward what the store says should exist.
//!
//! Stateless by construction: every decision is read from and written to [`Store`], so the
//! process can be killed at any instant and [`recovery`] converges on restart.

pub mod activity;
pub mod api;
pub mod auth;
mod build_logs;
pub mod datadir;
pub mod drain;
pub mod durable;
pub mod e2b;
pub mod egress;
pub mod error;
mod held;
pub mod idempotency;
pub mod interrupt;
pub mod keyring;
pub mod keys;
pub mod metrics;
pub mod nodes;
pub mod oauth;
pub mod observe;
pub mod placement;
mod proxy;
pub mod reconciler;
pub mod recovery;
pub mod replicas;
pub mod retention;
pub mod scheduler;
pub mod scope;
pub mod server;
pub mod template_scope;
pub mod template_work;
pub mod watches;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::collections::HashMap;

use space_api::{NodeId, SessionId, SnapshotPolicy};
use space_node_api::{NodeApi, NodeError};
use space_store::Store;

pub use error::{AppError, AppResult};
pub use metrics::serve_metrics;
pub use reconciler::Reconciler;
pub use server::HttpLimits;
pub use space_store::DEFAULT_REPLICA;

/// Settings of `space serve`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    /// The database: `postgres://…`, or `None` for SQLite at `DATA_DIR/space.db`.
    pub database: Option<String>,
    pub listen: SocketAddr,
    pub default_template: String,
    /// Runtime of sessions created without one.
    pub default_runtime: space_api::RuntimeKind,
    /// Policy of sessions created without one.
    pub snapshot_policy: SnapshotPolicy,
    /// Disk limit of sessions created without one, in MiB (0: none).
    pub default_disk_mib: u64,
    /// How often the snapshot scheduler looks for due snapshots.
    pub scheduler_tick: std::time::Duration,
    /// Built-in templates to build at start if missing.
    pub prepare_templates: Vec<String>,
    /// The local key file that wraps the keys of sealed data (credential values, session CA
    /// keys, the idempotency fingerprint key). Created if missing only while the database
    /// holds nothing sealed; see [`keys::open_sealer`].
    pub key_file: PathBuf,
    /// How long a data key unwrapped by a tenant's own key (BYOK) is kept in memory: a key
    /// revoked in the tenant's KMS stops opening data at most this long after.
    pub key_cache_ttl: std::time::Duration,
    /// How long audit events are kept (`None`: for ever).
    pub audit_retention: Option<std::time::Duration>,
    /// Whether credentials may name their hosts by wildcard (`*.example.com`).
    pub allow_wildcard_credential_hosts: bool,
    /// Connection cap and timeouts of the HTTP server.
    pub http: HttpLimits,
    /// The domain under which `{port}-{session}.{domain}` reaches a session's port (`None`:
    /// ports only through `/v1/sessions/{id}/ports/{port}/`).
    pub preview_domain: Option<String>,
    /// The domain the E2B endpoint reports to E2B's SDKs and whose hosts
    /// `{port}-{session}.{domain}` it serves (`None`: none; `space serve` defaults it to the
    /// preview domain).
    pub e2b_domain: Option<String>,
    /// Whether an E2B sandbox whose create says nothing of the internet may reach any public
    /// host, as in E2B (`false`: only what it lists, space's default deny).
    pub e2b_internet_by_default: bool,
    /// This replica's name, unique among those sharing the database (`space serve`:
    /// [`space_store::DEFAULT_REPLICA`]).
    pub replica: String,
    /// Where the OAuth broker may reach token endpoints (see [`oauth`]).
    pub oauth: space_oauth::NetConfig,
}

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// The nodes this control plane drives.
    pub nodes: nodes::Nodes,
    pub default_template: String,
    pub default_runtime: space_api::RuntimeKind,
    pub snapshot_policy: SnapshotPolicy,
    /// Disk limit of sessions created without one, in MiB (0: none).
    pub default_disk_mib: u64,
    pub reconciler: Reconciler,
    /// Serialises lifecycle calls (pause, resume, snapshot, restore) per session, so e.g. a
    /// snapshot's thaw never undoes a pause that came in meanwhile.
    session_locks: Arc<std::sync::Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>>,
    /// When each session was last used (idle timeouts).
    pub activity: Arc<activity::Activity>,
    /// Seals credential values and session CA keys (with their tenant's key) and the
    /// idempotency fingerprint key (with the local key) at rest.
    pub keys: Arc<keyring::Keyring>,
    /// Gets `oauth2` credentials' access tokens.
    pub oauth: Arc<oauth::Broker>,
    /// State of the `Idempotency-Key` middleware.
    pub idempotency: idempotency::Idempotency,
    /// Whether credentials may name hosts by wildcard (see [`egress::validate_hosts`]).
    pub allow_wildcard_credential_hosts: bool,
    /// How many file watches may be open per session, tenant and node.
    pub watches: Arc<watches::WatchLimits>,
    /// Connection cap and timeouts of the HTTP server ([`serve`]); handlers of WebSockets
    /// read their idle timeout here.
    pub http: HttpLimits,
    /// See [`ServerConfig::preview_domain`].
    pub preview_domain: Option<String>,
    /// See [`ServerConfig::e2b_domain`].
    pub e2b_domain: Option<String>,
    /// See [`ServerConfig::e2b_internet_by_default`].
    pub e2b_internet_by_default: bool,
    /// `DATA_DIR/admin.key`: a rotation of the admin key it holds writes the new key there.
    pub admin_key_file: PathBuf,
    /// The control plane's data dir (template uploads wait in `uploads/` there).
    pub data_dir: PathBuf,
    /// New sessions' ids with their gateway CAs, made ahead of time.
    pub session_cas: Arc<egress::ca_stock::CaStock>,
}

impl AppState {
    pub async fn session_lock(&self, id: &SessionId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.session_locks.lock().unwrap_or_else(|e| e.into_inner());
            // Forget locks nobody holds or waits for, so the table stays small.
            locks.retain(|_, l| Arc::strong_count(l) > 1);
            locks.entry(id.clone()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// Why the server could not start: a message for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(String);

fn context<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> StartError {
    move |e| StartError(format!("{what}: {e}"))
}

/// Opens the store, then the nodes with `open_nodes` (given the node id the store keeps, which
/// an in-process node takes; a remote one has its own), recovers from any earlier crash, and
/// starts the reconciler.
pub async fn start(
    config: &ServerConfig,
    open_nodes: impl AsyncFnOnce(&str) -> Result<Vec<Arc<dyn NodeApi>>, NodeError>,
) -> Result<AppState, StartError> {
    datadir::secure(&config.data_dir).map_err(context("securing the data directory"))?;
    let store = match &config.database {
        Some(url) => Store::open(url).await,
        None => Store::open_sqlite(&config.data_dir.join("space.db")).await,
    }
    .map_err(context("opening the database"))?
    .as_replica(&config.replica);
    let stored_node_id = store
        .meta_get_or_insert("node_id", NodeId::generate().as_str())
        .await
        .map_err(context("reading the node id"))?;
    // Before the node: a server whose key cannot open its sealed data must not touch anything.
    let sealer = keys::open_sealer(&config.key_file, &store).await.map_err(context("opening the key file"))?;
    let idempotency = idempotency::Idempotency::load(store.clone(), &sealer)
        .await
        .map_err(context("loading the key of idempotency fingerprints"))?;
    let nodes = open_nodes(&stored_node_id).await.map_err(context("starting the node"))?;
    let nodes = nodes::Nodes::new(nodes).map_err(context("driving the nodes"))?;
    let admin_key_file = config.data_dir.join("admin.key");
    auth::bootstrap_admin_key(&store, &admin_key_file).await.map_err(context("creating the admin key"))?;
    let reconciler = Reconciler::new();
    let state = AppState {
        store: store.clone(),
        nodes,
        default_template: config.default_template.clone(),
        default_runtime: config.default_runtime,
        snapshot_policy: config.snapshot_policy.clone(),
        default_disk_mib: config.default_disk_mib,
        reconciler: reconciler.clone(),
        session_locks: Default::default(),
        activity: Default::default(),
        keys: Arc::new(keyring::Keyring::new(sealer, store.clone(), config.key_cache_ttl)),
        oauth: Arc::new(oauth::Broker::new(&config.oauth).map_err(context("making the OAuth client"))?),
        idempotency,
        allow_wildcard_credential_hosts: config.allow_wildcard_credential_hosts,
        watches: Default::default(),
        http: config.http.clone(),
        preview_domain: config.preview_domain.clone(),
        e2b_domain: config.e2b_domain.clone(),
        e2b_internet_by_default: config.e2b_internet_by_default,
        admin_key_file,
        data_dir: config.data_dir.clone(),
        session_cas: Default::default(),
    };
    api::template_uploads::remove_partial_uploads(&api::template_uploads::upload_dir(&config.data_dir));
    // Files uploaded for E2B template builds wait for builds within a run, not across runs.
    if let Err(e) = std::fs::remove_dir_all(e2b::files_dir(&config.data_dir))
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(error = %e, "could not remove the files uploaded for E2B template builds");
    }
    egress::spawn_audit_writers(&state);
    state.session_cas.spawn_maker();
    keyring::spawn_forgetting(&state.keys);
    oauth::spawn_refresher(state.clone());
    if let Some(retention) = config.audit_retention {
        egress::spawn_audit_retention(&state, retention);
    }
    replicas::announce(&state).await.map_err(context("recording the replica"))?;
    let kept = recovery::recover(&state).await.map_err(context("recovering from the previous run"))?;
    // Before the reconciler: every sandbox it starts or restores joins its session's egress.
    egress::push_all(&state).await;
    // The node is there from the start: its first heartbeat is written before the API serves.
    nodes::heartbeat(&state).await.map_err(context("recording the node's heartbeat"))?;
    nodes::spawn_heartbeats(state.clone());
    interrupt::spawn(state.clone());
    retention::spawn(state.clone());
    // Only after recovery: its sweep destroys every sandbox no session owns (a node's own
    // pods are spared, but the sweep must not race their making). A replica that does not
    // keep a node leaves it to its keeper, and starts it when it takes the node over.
    for (id, _) in &kept {
        if let Ok(node) = state.nodes.get(id) {
            node.start_background();
        }
    }
    replicas::spawn_beats(state.clone(), kept);
    reconciler.spawn(state.clone());
    scheduler::spawn(state.clone(), config.scheduler_tick);
    template_work::prepare_templates(&state, &config.prepare_templates)
        .await
        .map_err(context("queueing template builds"))?;
    tokio::spawn(template_work::share_templates(state.clone()));
    Ok(state)
}

/// Serves the API until `shutdown` resolves, within the state's [`HttpLimits`]; then waits
/// for open requests and for the changes whose clients have gone (see [`server::Detached`]).
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.http.clone();
    server::serve_router(api::router(state), listener, limits, shutdown).await
}

/// Serves the E2B-compatible endpoint ([`e2b`]) until `shutdown` resolves, and stops as
/// [`serve`] does.
pub async fn serve_e2b(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.http.clone();
    server::serve_router(e2b::router(state), listener, limits, shutdown).await
}
