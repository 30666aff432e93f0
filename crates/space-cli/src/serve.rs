//! `space serve`: control plane, node and API in one process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use space_api::{RuntimeKind, SnapshotPolicy};
use space_control::{HttpLimits, ServerConfig};
use space_node::{GatewayConfig, Limits, Node, NodeApi, NodeConfig, PoolKey, SandboxLimits, WarmSettings};
use space_storage::DEFAULT_TEMPLATE_CACHE_DIR;

use crate::host::HostArgs;
use tracing_subscriber::EnvFilter;

/// `space serve`: both roles in one process.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// What the control plane is told: its API, database, and the defaults of sessions.
#[derive(Args)]
pub struct ControlArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Database to keep the control plane's state in: `postgres://USER:PASSWORD@HOST:PORT/DB`
    /// (docs/operations.md), or SQLite at DATA_DIR/space.db when not given. One `space serve`
    /// per database.
    #[arg(long, env = "SPACE_DATABASE_URL", hide_env_values = true)]
    pub database: Option<String>,
    /// Template used when a session names none.
    #[arg(long, default_value = "debian")]
    pub default_template: String,
    /// Runtime of sessions that name none: `linux` (namespaces on the host kernel) or `vm`
    /// (a QEMU microvm with its own kernel).
    #[arg(long, default_value_t = RuntimeKind::Linux)]
    pub default_runtime: RuntimeKind,
    /// Built-in templates to build at start if missing (comma-separated; default: the default template).
    #[arg(long, value_delimiter = ',')]
    pub prepare_templates: Option<Vec<String>>,
    /// Disk limit of sessions created without one, e.g. `10g` or a number of GiB (0: no limit).
    /// A session's disk is what its sandboxes wrote that still exists, in its root or its snapshots.
    #[arg(long, value_name = "SIZE", default_value = "10", value_parser = crate::units::parse_gib)]
    pub default_disk_gib: u64,
    /// Snapshot policy of sessions created without one, e.g.
    /// `disk=1m,full=15m,keep=1h,hourly=1d,daily=7d` (the default) or `off`.
    #[arg(long, default_value_t = SnapshotPolicy::default())]
    pub snapshot_policy: SnapshotPolicy,
    /// How often the snapshot scheduler runs, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub snapshot_tick_ms: u64,
    /// Key file that encrypts credential values and other secrets at rest (default:
    /// DATA_DIR/keys/master.key; created, mode 0600, only while nothing is sealed yet). Keep a
    /// copy: without it stored credentials are unreadable, and the server refuses to start.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// How long a data key unwrapped by a tenant's own key (BYOK, `space tenant key set`)
    /// is kept in memory, in seconds: a key revoked in the tenant's KMS stops opening data at
    /// most this long after. 0 asks the KMS every time.
    #[arg(long, default_value_t = 60)]
    pub key_cache_ttl: u64,
    /// How long the gateway's audit events are kept, e.g. `30d` or `12h` (`off`: for ever).
    /// Older ones are deleted hourly.
    #[arg(long, default_value = "30d", value_parser = parse_retention)]
    pub audit_retention: Retention,
    /// Most connections open at once, WebSockets included; further clients wait until one
    /// closes.
    #[arg(long, default_value_t = HttpLimits::default().max_connections)]
    pub max_connections: usize,
    /// Close exec, attach and watch WebSockets that carry nothing either way for this long,
    /// e.g. `5m` (pings count; `space exec` and `space files watch` send them).
    #[arg(long, default_value = "5m", value_parser = parse_idle)]
    pub ws_idle_timeout: std::time::Duration,
    /// Largest template upload (`space template import --upload`) accepted, in GiB.
    #[arg(long, default_value_t = 16)]
    pub template_upload_max_gib: u64,
    /// Let credentials name hosts by wildcard (`*.example.com`). Off by default: the value then
    /// goes to every name under the domain, including ones a sandbox user may create or take
    /// over; credentials name each host exactly.
    #[arg(long)]
    pub allow_wildcard_credential_hosts: bool,
    /// Serve each session's ports at `{port}-{session}.DOMAIN` too (E2B's host scheme; point a
    /// wildcard DNS name and TLS certificate at this server, or at a proxy in front of it).
    /// Ports are always reachable at `/v1/sessions/{id}/ports/{port}/`.
    #[arg(long, value_name = "DOMAIN", value_parser = parse_preview_domain)]
    pub preview_domain: Option<String>,
    /// Serve Prometheus metrics at `GET /metrics` on this address (e.g. 127.0.0.1:9464),
    /// without authentication: give it an address only the operator's scraper reaches.
    /// Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve an E2B-compatible API on this address too (e.g. 127.0.0.1:3000): point E2B's
    /// SDKs at it with `E2B_API_URL` and `E2B_SANDBOX_URL` (docs/e2b.md). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub e2b_listen: Option<SocketAddr>,
    /// The domain the E2B endpoint gives E2B's SDKs: `get_host(port)` is `{port}-{id}.DOMAIN`,
    /// served by the E2B listener (default: --preview-domain).
    #[arg(long, value_name = "DOMAIN", value_parser = parse_preview_domain)]
    pub e2b_domain: Option<String>,
    /// E2B sandboxes whose create says nothing of the internet may reach any public host, as
    /// in E2B (network policy `allow: ["*"]`; private and the node's own addresses stay
    /// refused). Off by default: they reach only what they list (docs/e2b.md).
    #[arg(long)]
    pub e2b_internet_by_default: bool,
}

/// What a node is told: its host tools, storage, warm pool and gateway.
#[derive(Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Cgroup directory for this server's sandboxes, under each controller. They go in a
    /// subdirectory named by the node id (`space/<node id>/<sandbox id>`), so servers that
    /// share this parent never touch each other's sandboxes.
    #[arg(long, default_value = "space")]
    pub cgroup_parent: String,
    /// Where finished built-in templates are cached across data dirs.
    #[arg(long, default_value = DEFAULT_TEMPLATE_CACHE_DIR)]
    pub template_cache: PathBuf,
    /// Size of the sparse pool image when the data dir is not on btrfs, e.g. `100g`, `1t` or a
    /// number of GiB (default: half the space free on the data dir's disk when the image is made).
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_gib)]
    pub pool_size_gib: Option<u64>,
    /// Where snapshots are made durable: a directory (`/path`, `file:///path`) or S3-compatible
    /// storage (`s3://BUCKET[/PREFIX]?endpoint=URL`, keys from `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`). Nodes that share one can resume each other's sessions. Without
    /// it, snapshots stay on this node's disk.
    #[arg(long, value_name = "URL")]
    pub blob_store: Option<String>,
    /// Warm pool: ready sandboxes kept per template and runtime, e.g. `debian=16,debian:vm=4`
    /// (`NAME` alone is the default runtime's pool; "" for none; default: 4 of the default
    /// template in the default runtime). Changeable at run time with `space pool set`.
    #[arg(long)]
    pub pool: Option<String>,
    /// How many pods may be prepared at the same time (default: half the CPUs, at least 1),
    /// so refilling never takes every core from running sandboxes.
    #[arg(long)]
    pub pool_fill_concurrency: Option<u32>,
    /// How many sandboxes may be starting at the same time (default: 4 per CPU); more creates
    /// wait their turn, so a burst of them leaves CPU to the sessions already running.
    #[arg(long)]
    pub start_concurrency: Option<usize>,
    /// Gateway: resolve NAME to ADDR (an address, or address:port to also replace the port)
    /// instead of asking DNS. Repeatable. Meant for tests and private upstreams.
    #[arg(long = "gateway-resolve", value_name = "NAME=ADDR")]
    pub gateway_resolve: Vec<String>,
    /// Gateway: also trust this PEM file's certificates for upstream TLS.
    #[arg(long = "gateway-extra-root", value_name = "PEM")]
    pub gateway_extra_root: Vec<PathBuf>,
    /// Gateway: let upstream addresses be private, loopback, link-local or the node's own
    /// (off: such addresses are refused, which stops DNS rebinding and sandboxes reaching the
    /// node's own services). For tests and trusted networks.
    #[arg(long)]
    pub gateway_allow_private: bool,
    /// Gateway: resolve upstream names with this name server (an address, port 53 unless
    /// given; IPv6 in brackets before a port) instead of the host's resolver configuration;
    /// /etc/hosts and search domains are then not used. Repeatable.
    #[arg(long = "gateway-dns", value_name = "ADDR[:PORT]", value_parser = parse_gateway_dns)]
    pub gateway_dns: Vec<SocketAddr>,
    /// Gateway: connections one sandbox may have open at once through the proxy and the
    /// transparent ports 80 and 443 together; beyond it new ones are refused (503, or reset on
    /// 443) and audited.
    #[arg(long, value_name = "N", default_value_t = SandboxLimits::DEFAULT_MAX_CONNECTIONS, value_parser = parse_max_connections)]
    pub gateway_max_connections: usize,
    /// What one Dockerfile `RUN` step may write, e.g. `20g` or `512m` (`0`: as much as the
    /// pool holds). A step past it fails the build with "Disk quota exceeded".
    #[arg(long, value_name = "SIZE", default_value = "20g", value_parser = crate::units::parse_mib)]
    pub build_step_disk: u64,
    /// Layers of the Dockerfile build cache that no build used for this long are deleted,
    /// e.g. `7d` or `12h` (`0`: kept until the pool is removed).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = crate::units::parse_secs)]
    pub build_cache_max_age: u64,
}

#[derive(Args)]
pub struct LogArgs {
    /// Log lines as `text` (human; colour only on a terminal) or `json` (one object a line,
    /// with the request id of the request it belongs to). Verbosity from `RUST_LOG`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How `space serve` writes its log (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr in `format`, at `RUST_LOG`'s levels (default `info`). Colour codes only
/// when stderr is a terminal: a file or journald gets plain text.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).init(),
    }
}

fn parse_max_connections(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("a sandbox needs at least 1 connection to reach anything".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_gateway_dns(value: &str) -> Result<SocketAddr, String> {
    space_node::parse_dns_server(value).map_err(|e| e.to_string())
}

/// A retention period, or none (`off`).
#[derive(Debug, Clone, Copy)]
pub struct Retention(Option<std::time::Duration>);

fn parse_retention(value: &str) -> Result<Retention, String> {
    if value == "off" {
        return Ok(Retention(None));
    }
    match crate::units::parse_secs(value)? {
        0 => Err("a retention of 0 would delete every event; use `off` to keep them for ever".into()),
        secs => Ok(Retention(Some(std::time::Duration::from_secs(secs)))),
    }
}

fn parse_idle(value: &str) -> Result<std::time::Duration, String> {
    match crate::units::parse_secs(value)? {
        0 => Err("an idle timeout of 0 would close every WebSocket at once".into()),
        secs => Ok(std::time::Duration::from_secs(secs)),
    }
}

/// The gateway's operator settings from the flags.
fn gateway_config(args: &NodeArgs) -> anyhow::Result<GatewayConfig> {
    let mut config = GatewayConfig {
        allow_private_upstreams: args.gateway_allow_private,
        dns_servers: args.gateway_dns.clone(),
        limits: SandboxLimits { max_connections: args.gateway_max_connections },
        ..Default::default()
    };
    for entry in &args.gateway_resolve {
        let (name, addr) = entry.split_once('=').with_context(|| {
            format!("--gateway-resolve {entry:?} must look like NAME=ADDR, e.g. api.test=127.0.0.1")
        })?;
        let name = space_api::egress::normalize_host(name);
        space_api::egress::validate_host_pattern(&name).map_err(anyhow::Error::msg)?;
        if let Ok(socket) = addr.parse::<SocketAddr>() {
            config.resolve.insert(name, socket);
        } else {
            let ip =
                addr.parse().with_context(|| format!("--gateway-resolve address {addr:?} is not an IP address"))?;
            config.resolve_ip.insert(name, ip);
        }
    }
    for path in &args.gateway_extra_root {
        let pem = std::fs::read(path).with_context(|| format!("reading --gateway-extra-root {}", path.display()))?;
        config.extra_roots.extend(
            space_node::certificates_from_pem(&pem)
                .with_context(|| format!("--gateway-extra-root {}: no PEM certificate in it", path.display()))?,
        );
    }
    Ok(config)
}

/// Where `space serve`'s OAuth broker may reach token endpoints: where its gateway may reach
/// upstreams (the same overrides, extra roots and private-address switch; an override to a
/// refused address is dropped, as the gateway refuses it).
fn oauth_net(gateway: &GatewayConfig) -> space_oauth::NetConfig {
    let refused = space_control::keyring::refused_addresses(!gateway.allow_private_upstreams);
    let ports = gateway.resolve.iter().map(|(n, a)| (n.clone(), *a));
    let resolve = ports
        .chain(gateway.resolve_ip.iter().map(|(n, ip)| (n.clone(), SocketAddr::new(*ip, 0))))
        .filter(|(_, addr)| !refused.is_some_and(|refused| refused(addr.ip())))
        .collect();
    space_oauth::NetConfig { refused_addresses: refused, resolve, extra_roots: gateway.extra_roots.clone() }
}

/// Parses `name[:runtime]=size,…` (`name` alone: the default runtime's pool).
fn parse_pool(spec: &str, default_runtime: RuntimeKind) -> anyhow::Result<BTreeMap<PoolKey, u32>> {
    let mut sizes = BTreeMap::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (pool, size) = entry.split_once('=').with_context(|| {
            format!("--pool entry {entry:?} must look like TEMPLATE[:RUNTIME]=SIZE, e.g. debian=16 or debian:vm=4")
        })?;
        let size: u32 = size.trim().parse().with_context(|| format!("--pool size {size:?} is not a number"))?;
        if size > space_node::MAX_POOL_SIZE {
            bail!("--pool {pool}={size}: at most {} pods per template", space_node::MAX_POOL_SIZE);
        }
        let (name, runtime) = match pool.trim().split_once(':') {
            Some((name, runtime)) => (name, runtime.parse::<RuntimeKind>().map_err(anyhow::Error::msg)?),
            None => (pool.trim(), default_runtime),
        };
        sizes.insert((name.to_owned(), runtime), size);
    }
    Ok(sizes)
}

/// The CPUs this process may use: the node's defaults for concurrent work scale with them.
pub(crate) fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn warm_settings(
    args: &NodeArgs,
    default_template: &str,
    default_runtime: RuntimeKind,
) -> anyhow::Result<WarmSettings> {
    let sizes = match &args.pool {
        Some(spec) => parse_pool(spec, default_runtime)?,
        None => BTreeMap::from([((default_template.to_owned(), default_runtime), 4)]),
    };
    Ok(WarmSettings {
        sizes,
        max_filling: args.pool_fill_concurrency.unwrap_or(host_cpus() as u32 / 2).max(1),
        pod_limits: Limits::from(&space_api::Resources::default()),
    })
}

/// Each sandbox costs the server a few descriptors (agent connection, pidfd): lift the soft
/// limit to the hard one so hundreds of sandboxes fit.
pub fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(error = %e, "cannot raise the open file limit; hundreds of sandboxes may not fit");
    }
}

pub async fn run(args: ServeArgs, data_dir: PathBuf) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    require_root("space serve")?;
    raise_fd_limit();
    let mut config = server_config(&args.control, &data_dir);
    let node = node_config(&args.node, &data_dir, &config.default_template, config.default_runtime)?;
    config.oauth = oauth_net(&node.gateway);
    // The in-process node: `space serve` is control plane and node in one process.
    let open_nodes = async |node_id: &str| -> Result<Vec<Arc<dyn NodeApi>>, space_node_api::NodeError> {
        let node: Arc<dyn NodeApi> = Arc::new(Node::open(node.owned_by(node_id)).await?);
        Ok(vec![node])
    };
    serve_control(config, Listeners::of(&args.control), open_nodes).await
}

/// Refuses to go on unless root: sandboxes need namespaces, cgroups and btrfs subvolumes.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("{what} must run as root (it creates namespaces, cgroups and btrfs subvolumes)");
    }
    Ok(())
}

/// The control plane's settings from its flags.
pub fn server_config(args: &ControlArgs, data_dir: &Path) -> ServerConfig {
    ServerConfig {
        data_dir: data_dir.to_owned(),
        database: args.database.clone(),
        listen: args.listen,
        key_file: args.key_file.clone().unwrap_or_else(|| data_dir.join("keys/master.key")),
        key_cache_ttl: std::time::Duration::from_secs(args.key_cache_ttl),
        audit_retention: args.audit_retention.0,
        allow_wildcard_credential_hosts: args.allow_wildcard_credential_hosts,
        preview_domain: args.preview_domain.clone(),
        e2b_domain: args.e2b_domain.clone().or_else(|| args.preview_domain.clone()),
        e2b_internet_by_default: args.e2b_internet_by_default,
        replica: space_control::DEFAULT_REPLICA.into(),
        oauth: space_oauth::NetConfig {
            refused_addresses: space_control::keyring::refused_addresses(true),
            ..Default::default()
        },
        prepare_templates: args.prepare_templates.clone().unwrap_or_else(|| vec![args.default_template.clone()]),
        default_template: args.default_template.clone(),
        default_runtime: args.default_runtime,
        snapshot_policy: args.snapshot_policy.clone(),
        default_disk_mib: args.default_disk_gib.saturating_mul(1024),
        scheduler_tick: std::time::Duration::from_millis(args.snapshot_tick_ms.max(10)),
        http: HttpLimits {
            max_connections: args.max_connections.max(1),
            ws_idle_timeout: args.ws_idle_timeout,
            template_upload_max_bytes: args.template_upload_max_gib.saturating_mul(1 << 30),
            ..HttpLimits::default()
        },
    }
}

/// The node's settings from its flags. Its warm pool, unless `--pool` says otherwise, is 4
/// pods of `default_template` in `default_runtime`.
pub fn node_config(
    args: &NodeArgs,
    data_dir: &Path,
    default_template: &str,
    default_runtime: RuntimeKind,
) -> anyhow::Result<NodeConfig> {
    Ok(NodeConfig {
        data_dir: data_dir.to_owned(),
        spaced_bin: args.host.spaced()?,
        criu: args.host.criu.clone(),
        cgroup_parent: args.cgroup_parent.clone(),
        template_cache_dir: args.template_cache.clone(),
        image_size_bytes: args.pool_size_gib.map(|g| g << 30),
        id_map: args.host.id_map(),
        warm: warm_settings(args, default_template, default_runtime)?,
        max_starting: args.start_concurrency.unwrap_or(4 * host_cpus()).max(1),
        gateway: gateway_config(args)?,
        vm: args.host.vm(),
        blob_store: args.blob_store.clone(),
        build_step_disk_bytes: (args.build_step_disk > 0).then_some(args.build_step_disk << 20),
        build_cache_max_age: (args.build_cache_max_age > 0)
            .then_some(std::time::Duration::from_secs(args.build_cache_max_age)),
        id: String::new(),
    })
}

/// The listeners besides the API's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Listeners {
    pub metrics: Option<SocketAddr>,
    pub e2b: Option<SocketAddr>,
}

impl Listeners {
    pub fn of(args: &ControlArgs) -> Listeners {
        Listeners { metrics: args.metrics_listen, e2b: args.e2b_listen }
    }
}

async fn bind(addr: Option<SocketAddr>, flag: &str) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    match addr {
        Some(addr) => Ok(Some(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("{flag} {addr}"))?)),
        None => Ok(None),
    }
}

/// Opens the nodes (`open_nodes`), starts the control plane over them and serves its API
/// (and metrics and the E2B endpoint, if `listeners` say) until a shutdown signal.
pub async fn serve_control(
    config: ServerConfig,
    listeners: Listeners,
    open_nodes: impl AsyncFnOnce(&str) -> Result<Vec<Arc<dyn NodeApi>>, space_node_api::NodeError>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let metrics_listener = bind(listeners.metrics, "--metrics-listen").await?;
    let e2b_listener = bind(listeners.e2b, "--e2b-listen").await?;
    let state = space_control::start(&config, open_nodes).await?;
    if let Err(why) = state.nodes.first().runtime_available(config.default_runtime) {
        bail!("--default-runtime {}: that runtime is unavailable here: {why}", config.default_runtime);
    }
    match state.nodes.first().checkpoint_support(config.default_runtime) {
        Ok(tool) => tracing::info!("full snapshots, suspend and resume use {tool}"),
        Err(why) => tracing::warn!(
            "full snapshots, suspend and process-preserving fork are OFF: {why}; run scripts/install-criu.sh \
             and restart (disk snapshots, pause, restore and fork of files work)"
        ),
    }
    if let Some(listener) = metrics_listener {
        tracing::info!(listen = %listener.local_addr()?, "serving Prometheus metrics at /metrics");
        // Ends with the process: nothing there needs a graceful stop.
        let metrics = space_control::serve_metrics(state.clone(), listener, std::future::pending());
        tokio::spawn(async move {
            if let Err(e) = metrics.await {
                tracing::error!(error = %e, "the metrics listener stopped");
            }
        });
    }
    // Both APIs stop on the signal, and each waits for the changes it runs (see
    // `space_control::serve`), then the reconciler for its operations, before the process
    // ends.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut e2b = None;
    if let Some(listener) = e2b_listener {
        tracing::info!(listen = %listener.local_addr()?, "serving the E2B-compatible API");
        let served = space_control::serve_e2b(state.clone(), listener, stop.clone().cancelled_owned());
        e2b = Some(tokio::spawn(async move {
            if let Err(e) = served.await {
                tracing::error!(error = %e, "the E2B listener stopped");
            }
        }));
    }
    let data_dir = config.data_dir.display();
    tracing::info!(listen = %config.listen, %data_dir, "space is serving; admin key in {data_dir}/admin.key");
    stop_on_signals(&stop);
    let reconciler = state.reconciler.clone();
    let served = space_control::serve(state, listener, stop.clone().cancelled_owned()).await;
    // Also when the API's listener failed: the E2B endpoint does not outlive it.
    stop.cancel();
    if let Some(e2b) = e2b {
        let _ = e2b.await;
    }
    // Once nothing can start more: the operations the APIs queued (a create answered 202, a
    // destroy without waiting) finish too.
    reconciler.stop().await;
    Ok(served?)
}

/// Cancels `stop` at the first SIGTERM or SIGINT; a second one ends the process at once,
/// without waiting for what is still running (recovery finishes it, as after a crash).
pub fn stop_on_signals(stop: &tokio_util::sync::CancellationToken) {
    let stop = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        stop.cancel();
        shutdown_signal().await;
        tracing::warn!("a second signal: stopping now; what was still running is recovered at the next start");
        std::process::exit(130);
    });
}

pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down; sandboxes keep running and are picked up at the next start");
}

/// A DNS name (optionally `:port`), lowercased: `{port}-{session}.` is put in front of it.
fn parse_preview_domain(value: &str) -> Result<String, String> {
    let domain = value.trim().trim_end_matches('.').to_ascii_lowercase();
    let (name, port) = domain.rsplit_once(':').map_or((domain.as_str(), None), |(n, p)| (n, Some(p)));
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
    };
    if name.is_empty() || !name.split('.').all(label_ok) || port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err(format!(
            "{value:?} is not a domain name such as preview.example.com (or preview.example.com:8080)"
        ));
    }
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_specs() {
        let sizes = parse_pool("debian=16, busybox=4, debian:vm=2", RuntimeKind::Linux).unwrap();
        let linux = |name: &str| (name.to_owned(), RuntimeKind::Linux);
        let expected =
            BTreeMap::from([(linux("busybox"), 4), (linux("debian"), 16), (("debian".into(), RuntimeKind::Vm), 2)]);
        assert_eq!(sizes, expected);
        assert!(parse_pool("", RuntimeKind::Linux).unwrap().is_empty());
        let vm = parse_pool("debian=1", RuntimeKind::Vm).unwrap();
        assert_eq!(vm, BTreeMap::from([(("debian".into(), RuntimeKind::Vm), 1)]), "the default runtime's pool");
        for bad in ["debian", "debian=x", "debian=-1", "debian=100000", "debian:docker=1"] {
            assert!(parse_pool(bad, RuntimeKind::Linux).is_err(), "{bad:?} accepted");
        }
    }
}
