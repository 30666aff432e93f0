//! `space node run` and `space control`: the two roles of `space serve`, each in a process of
//! its own, speaking the node API over mutual TLS (docs/operator-guide.md, "A cluster").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use space_api::RuntimeKind;
use space_control::ServerConfig;
use space_node::{Node, NodeApi};
use space_node_wire::cluster::{Identity, trust_path};
use space_node_wire::{NodeClient, RemoteNode, WireError};

use crate::serve::{
    ControlArgs, LogArgs, NodeArgs, init_logging, node_config, raise_fd_limit, require_root, serve_control,
    server_config, stop_on_signals,
};

/// How long `space control` keeps trying to reach its node at start (it may be starting too).
const NODE_WAIT: Duration = Duration::from_secs(120);

/// Who this member of the cluster is.
#[derive(Args)]
pub struct IdentityArgs {
    /// Directory holding the cluster's `ca.pem` and this member's NAME.pem and NAME.key
    /// (`space cluster issue`; default: DATA_DIR/cluster).
    #[arg(long)]
    cluster_dir: Option<PathBuf>,
    /// This member's name, as its certificate was issued. A node's name is its id.
    #[arg(long)]
    name: String,
}

impl IdentityArgs {
    /// This member's certificate and key, and the authority's certificate.
    fn load(&self, data_dir: &Path) -> anyhow::Result<(Identity, String)> {
        let dir = self.cluster_dir.clone().unwrap_or_else(|| data_dir.join("cluster"));
        let identity = Identity::load(&dir, &self.name).with_context(|| {
            format!(
                "reading the identity {:?} (issue it with `space cluster issue --dir {}`)",
                self.name,
                dir.display()
            )
        })?;
        let ca = trust_path(&dir);
        let ca = std::fs::read_to_string(&ca)
            .with_context(|| format!("reading the cluster's authority {}", ca.display()))?;
        Ok((identity, ca))
    }
}

/// `space node run`.
#[derive(Args)]
pub struct NodeRoleArgs {
    /// Address control planes reach this node's API at; the node's certificate must name it.
    #[arg(long, default_value = "127.0.0.1:7071")]
    listen: SocketAddr,
    #[command(flatten)]
    identity: IdentityArgs,
    /// Template of the default warm pool (see --pool).
    #[arg(long, default_value = "debian")]
    default_template: String,
    /// Runtime of the default warm pool, and of `--pool` entries that name none.
    #[arg(long, default_value_t = RuntimeKind::Linux)]
    default_runtime: RuntimeKind,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    log: LogArgs,
}

/// `space control`.
#[derive(Args)]
pub struct ControlRoleArgs {
    /// A node this control plane drives: HOST:PORT, HOST as the node's certificate names it.
    /// Repeat for each node; new sessions are placed among them (docs/control-plane.md,
    /// "Placement").
    #[arg(long, required = true)]
    node: Vec<String>,
    #[command(flatten)]
    identity: IdentityArgs,
    #[command(flatten)]
    control: ControlArgs,
    #[command(flatten)]
    log: LogArgs,
}

/// Runs a node: its sandboxes, warm pool and gateway, driven over the node API.
pub async fn run_node(args: NodeRoleArgs, data_dir: PathBuf) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    require_root("space node run")?;
    raise_fd_limit();
    let (identity, ca) = args.identity.load(&data_dir)?;
    let tls = space_node_wire::tls::server_config(&identity, &ca)?;
    let config = node_config(&args.node, &data_dir, &args.default_template, args.default_runtime)?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let node: Arc<dyn NodeApi> = Arc::new(Node::open(config.owned_by(&args.identity.name)).await?);
    tracing::info!(listen = %args.listen, node = %args.identity.name, "serving the node API");
    let stop = tokio_util::sync::CancellationToken::new();
    stop_on_signals(&stop);
    space_node_wire::serve(listener, tls, node, data_dir.join("staged"), stop.cancelled_owned())
        .await
        .context("serving the node API")
}

/// Runs a control plane over the nodes at `--node`.
pub async fn run_control(args: ControlRoleArgs, data_dir: PathBuf) -> anyhow::Result<()> {
    init_logging(args.log.log_format);
    let (identity, ca) = args.identity.load(&data_dir)?;
    let tls = space_node_wire::tls::client_config(&identity, &ca)?;
    // The replica is named as its certificate: unique among those sharing the database.
    let config = ServerConfig { replica: args.identity.name.clone(), ..server_config(&args.control, &data_dir) };
    let mut nodes: Vec<Arc<dyn NodeApi>> = Vec::new();
    for address in &args.node {
        let remote = connect(address, tls.clone()).await?;
        let info = remote.info();
        tracing::info!(node = %address, id = %info.id, version = %info.version, "connected to the node");
        nodes.push(remote);
    }
    let open_nodes = async move |_: &str| -> Result<Vec<Arc<dyn NodeApi>>, space_node_api::NodeError> { Ok(nodes) };
    serve_control(config, crate::serve::Listeners::of(&args.control), open_nodes).await
}

/// The node at `address`, once it answers. A node that refuses us (another authority,
/// another version) is not waited for.
async fn connect(address: &str, tls: Arc<rustls::ClientConfig>) -> anyhow::Result<Arc<RemoteNode>> {
    let deadline = Instant::now() + NODE_WAIT;
    loop {
        let client = NodeClient::new(address, tls.clone())?;
        match RemoteNode::connect(client).await {
            Ok(node) => return Ok(node),
            Err(e @ WireError::Connect { .. }) if Instant::now() < deadline && !is_tls_refusal(&e) => {
                tracing::info!(node = %address, error = %e, "the node does not answer yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to the node at {address}")),
        }
    }
}

/// Whether `error` is the node's TLS refusing us, or us refusing it: waiting will not help.
fn is_tls_refusal(error: &WireError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        source = e.source();
    }
    false
}
