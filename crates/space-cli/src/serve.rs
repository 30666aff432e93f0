//! `space serve`: control plane, node and API in one process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use space_control::ServerConfig;
use space_node::NodeConfig;
use space_storage::{DEFAULT_IMAGE_SIZE, DEFAULT_TEMPLATE_CACHE_DIR, IdMap};
use tracing_subscriber::EnvFilter;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Template used when a session names none.
    #[arg(long, default_value = "debian")]
    default_template: String,
    /// Built-in templates to build at start if missing (comma-separated; default: the default template).
    #[arg(long, value_delimiter = ',')]
    prepare_templates: Option<Vec<String>>,
    /// The static `spaced` binary (default: next to this executable).
    #[arg(long, env = "SPACED_BIN")]
    spaced: Option<PathBuf>,
    /// Cgroup directory for this server's sandboxes, under each controller.
    #[arg(long, default_value = "space")]
    cgroup_parent: String,
    /// Where finished built-in templates are cached across data dirs.
    #[arg(long, default_value = DEFAULT_TEMPLATE_CACHE_DIR)]
    template_cache: PathBuf,
    /// Size of the sparse pool image when the data dir is not on btrfs, in GiB.
    #[arg(long)]
    pool_size_gib: Option<u64>,
    /// First host uid/gid of the range sandbox ids 0..65536 map to.
    #[arg(long, default_value_t = 100_000)]
    uid_base: u32,
}

/// Finds `spaced`: the flag, then beside this executable, then cargo's static-build output.
fn find_spaced(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locating the space executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join("spaced"), dir.join("../x86_64-unknown-linux-gnu/release/spaced")];
    for candidate in &candidates {
        if candidate.is_file() {
            return Ok(candidate.clone());
        }
    }
    bail!(
        "cannot find the spaced binary next to {}; build it with `cargo build-spaced` or pass --spaced",
        exe.display()
    )
}

pub async fn run(args: ServeArgs, data_dir: PathBuf) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    if !nix::unistd::Uid::effective().is_root() {
        bail!("space serve must run as root (it creates namespaces, cgroups and btrfs subvolumes)");
    }
    let config = ServerConfig {
        data_dir: data_dir.clone(),
        listen: args.listen,
        prepare_templates: args.prepare_templates.unwrap_or_else(|| vec![args.default_template.clone()]),
        default_template: args.default_template,
        node: NodeConfig {
            data_dir: data_dir.clone(),
            spaced_bin: find_spaced(args.spaced)?,
            cgroup_parent: args.cgroup_parent,
            template_cache_dir: args.template_cache,
            image_size_bytes: args.pool_size_gib.map(|g| g << 30).unwrap_or(DEFAULT_IMAGE_SIZE),
            id_map: IdMap { host_base: args.uid_base, count: 65_536 },
        },
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let state = space_control::start(&config).await?;
    tracing::info!(listen = %config.listen, data_dir = %data_dir.display(), "space is serving; admin key in {}/admin.key", data_dir.display());
    space_control::serve(state, listener, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
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
