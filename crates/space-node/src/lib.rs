//! The node agent: owns the btrfs storage pool, the sandbox runtime and the connections to
//! every sandbox's `spaced`. The control plane drives it only through
//! [`space_node_api::NodeApi`], which [`Node`] implements in `api.rs`.
//!
//! Storage calls block on disk I/O, so they run on the blocking pool.

mod api;
mod builds;
mod checkpoint;
mod disk;
pub mod doctor;
mod durable;
pub(crate) use disk::charge;
mod egress;
mod images;
mod in_memory;
mod lifecycle;
mod pod_templates;
mod ports;
mod runtimes;
mod templates;
mod warm;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use space_api::{Progress, RuntimeKind, RuntimeSupport, SandboxId};
use space_node_api::DiskQuota;
use space_proto::client::AgentClient;
pub use space_runtime::Limits;
use space_runtime::{PodTemplate, RootDisk, RootDiskKind, Runtime, SandboxHandle, SandboxSpec, SandboxStats};
use space_runtime_linux::{LinuxOptions, LinuxRuntime};

use crate::runtimes::Runtimes;
use space_storage::{IdMap, Pool, PoolOptions};

pub use builds::BuildError;
pub use images::ROOT_IMAGE_BYTES;
pub use in_memory::root_for as in_memory_root;
pub use space_gateway::{Gateway, GatewayConfig, SandboxLimits, certificates_from_pem, parse_dns_server};
pub use space_node_api::NodeApi;
pub use space_storage::{BUILTINS, TemplateInfo};
pub use warm::{MAX_POOL_SIZE, PoolKey, WarmSettings};

/// How a node is set up.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    /// The static `spaced` binary started as every sandbox's pid 1.
    pub spaced_bin: PathBuf,
    /// CRIU for full snapshots; `None` looks in the usual places.
    pub criu: Option<PathBuf>,
    /// Cgroup directory (under each controller) that holds this node's sandboxes.
    pub cgroup_parent: String,
    /// Finished built-in templates are cached here across data dirs.
    pub template_cache_dir: PathBuf,
    /// Size of a new pool image; `None`: half the free disk (see [`PoolOptions`]).
    pub image_size_bytes: Option<u64>,
    pub id_map: IdMap,
    pub warm: WarmSettings,
    /// How many sandboxes may be starting from their template at once (cold creates and the
    /// pool's pods, from the root's creation to the agent's and gateway's connection); more
    /// wait their turn. Unbounded, a burst of cold creates starts so many processes and
    /// threads at once that every other session's calls on the node wait behind them.
    /// Restores, forks and resumes are not bounded by it.
    pub max_starting: usize,
    pub gateway: GatewayConfig,
    pub vm: VmConfig,
    /// Where snapshots are exported to (a directory or `s3://…`, see `space_blob::BlobStore`);
    /// `None`: they stay on this node's disk.
    pub blob_store: Option<String>,
    /// What one Dockerfile `RUN` step may write (`None`: as much as the pool holds). A step
    /// past it fails with `EDQUOT`, as a session past its disk limit does.
    pub build_step_disk_bytes: Option<u64>,
    /// Layers of the build cache no build used for longer are deleted (`None`: kept until
    /// the pool is removed).
    pub build_cache_max_age: Option<std::time::Duration>,
    /// The node's id (set by [`NodeConfig::owned_by`]).
    pub id: String,
}

/// How the node runs `vm` sandboxes.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// The `space-vm-jailer` binary.
    pub jailer: PathBuf,
    /// The guest kernel and initramfs (`scripts/install-vm.sh` makes them).
    pub guest_dir: PathBuf,
}

impl NodeConfig {
    /// These settings with the sandboxes' cgroups in a directory of their own named by the
    /// node id: nodes sharing a cgroup parent (the default `space`) then never see, and
    /// never sweep away, each other's sandboxes.
    pub fn owned_by(mut self, node_id: &str) -> NodeConfig {
        self.id = node_id.to_owned();
        self.cgroup_parent = format!("{}/{node_id}", self.cgroup_parent.trim_end_matches('/'));
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("unknown template {name:?}; available: {available}")]
    UnknownTemplate { name: String, available: String },
    #[error(transparent)]
    Storage(#[from] space_storage::StorageError),
    #[error(transparent)]
    Runtime(#[from] space_runtime::RuntimeError),
    #[error("the {runtime} runtime is unavailable on this node: {reason}")]
    RuntimeUnavailable { runtime: RuntimeKind, reason: String },
    #[error(transparent)]
    Vm(#[from] space_runtime_vm::VmError),
    #[error("cannot reach the sandbox agent of {sandbox}: {reason}")]
    Agent { sandbox: SandboxId, reason: String },
    #[error("the egress gateway: {0}")]
    Gateway(String),
    #[error(transparent)]
    Port(#[from] ports::PortError),
    #[error("sandbox {0} is not running on this node")]
    NotRunning(SandboxId),
    #[error(transparent)]
    Volume(#[from] space_volume::VolumeError),
    /// Export or import asked of a node started without `--blob-store`.
    #[error("this node has no blob store")]
    NoBlobStore,
    #[error(transparent)]
    Build(#[from] builds::BuildError),
    #[error("internal: {0}")]
    Internal(String),
}

impl NodeError {
    /// Whether this failed for want of disk space, and whose.
    pub fn out_of_space(&self) -> Option<space_node_api::OutOfSpace> {
        use space_node_api::OutOfSpace;
        let NodeError::Storage(e) = self else { return None };
        match e.errno()? {
            nix::errno::Errno::ENOSPC => Some(OutOfSpace::Pool),
            nix::errno::Errno::EDQUOT => Some(OutOfSpace::Quota),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, NodeError>;

pub struct Node {
    pool: Arc<Pool>,
    runtimes: Runtimes,
    agents: Mutex<HashMap<SandboxId, AgentClient>>,
    /// Sandboxes being checkpointed: no connection to their agent may be made meanwhile.
    connect_gates: Mutex<HashMap<SandboxId, tokio::sync::watch::Receiver<()>>>,
    /// The pool's copy of the node's `spaced`, which sandboxes run (see checkpoint.rs).
    kept_spaced: PathBuf,
    /// Where process images are in clear while sealed or unsealed (see in_memory.rs).
    in_memory_root: PathBuf,
    /// Snapshots to and from the blob store, if the node has one.
    volumes: Option<space_volume::Volumes>,
    template_builds: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    warm: warm::WarmPool,
    pod_templates: pod_templates::PodTemplates,
    /// Wakes the deletion of destroyed roots.
    reclaim: tokio::sync::Notify,
    /// Sandboxes running a build's step: no session knows them, and no sweep may take them.
    build_sandboxes: Mutex<HashSet<SandboxId>>,
    /// Held (shared) by every Dockerfile build, and alone by the pruning of its layer cache,
    /// which never deletes a layer a build is about to start from.
    builds: tokio::sync::RwLock<()>,
    gateway: Arc<Gateway>,
    /// What each started sandbox's root holds for the session bundle, read while it starts.
    root_certs: Mutex<HashMap<SandboxId, egress::RootCerts>>,
    /// The gateway's audit events, until the control plane takes them.
    audit_events: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<space_api::egress::AuditEvent>>>,
    config: NodeConfig,
    /// Bounds the sandbox starts in progress (see [`NodeConfig::max_starting`]).
    starts: tokio::sync::Semaphore,
}

/// Subvolume deletions the kernel's cleaner may have queued before we wait for it: each
/// pending one slows every new snapshot (that is, every create) down.
const MAX_PENDING_DELETIONS: u64 = 2;
/// How long the agent has to answer a new connection.
const AGENT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Retries deletions that failed, and catches roots retired by an earlier run.
const RECLAIM_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);
/// How often (at most) the build cache is looked through for layers to prune; as often as
/// layers expire, when they are kept for less.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// `sbx_abcdefgh…` → `abcdefghijkl`: short, unique enough, valid as a hostname. Derived from
/// the sandbox (not the session) so a pod has its identity before any session binds it.
pub fn hostname_for(id: &SandboxId) -> String {
    id.as_str().trim_start_matches(SandboxId::PREFIX).chars().take(12).collect()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| NodeError::Internal(format!("blocking task: {e}")))?
}

impl Node {
    /// Opens (mounting if needed) the pool and checks the runtime's host requirements.
    pub async fn open(config: NodeConfig) -> Result<Node> {
        let options =
            PoolOptions { image_size_bytes: config.image_size_bytes, id_map: config.id_map, ..PoolOptions::default() };
        let data_dir = config.data_dir.clone();
        let binary = config.spaced_bin.clone();
        let (pool, kept_spaced) = blocking(move || {
            let pool = Pool::open(&data_dir, options)?;
            let kept = pool.keep_binary(&binary)?;
            Ok((pool, kept))
        })
        .await?;
        // Sandboxes run the pool's copy: a full snapshot links that very file, and a restore
        // binds it from the same mount again (CRIU must re-apply the dumped mount's flags).
        let mut options = LinuxOptions::new(&kept_spaced, config.data_dir.join("run"), &config.cgroup_parent);
        options.id_map = config.id_map;
        options.criu = config.criu.clone();
        options.lxcfs = space_host::lxcfs::Lxcfs::at(Path::new(space_host::lxcfs::DEFAULT_DIR));
        let files = options.lxcfs.as_ref().map_or(0, |l| l.files.len());
        tracing::info!(files, "lxcfs files for linux sandboxes");
        let linux: Arc<dyn Runtime> = Arc::new(LinuxRuntime::new(options)?);
        let run_dir = config.data_dir.join("run");
        let host = HostParts {
            spaced: &kept_spaced,
            run_dir: &run_dir,
            cgroup_parent: &config.cgroup_parent,
            id_map: config.id_map,
        };
        let runtimes = match open_vm(&host, &config.vm).await {
            Ok(vm) => Runtimes::new(vec![linux, vm], Vec::new())?,
            Err(why) => {
                tracing::warn!(reason = %why, "the vm runtime is unavailable");
                Runtimes::new(vec![linux], vec![(RuntimeKind::Vm, why)])?
            }
        };
        for runtime in runtimes.support() {
            tracing::info!(runtime = %runtime.runtime, available = runtime.available, detail = %runtime.detail, "runtime");
        }
        let pool = Arc::new(pool);
        let in_memory_root = in_memory::root_for(&config.data_dir);
        in_memory::mount(&in_memory_root)?;
        let volumes = match &config.blob_store {
            Some(url) => {
                let blobs = space_blob::BlobStore::open(url).map_err(space_volume::VolumeError::from)?;
                Some(space_volume::Volumes::new(pool.clone(), blobs, config.data_dir.join("transfers")))
            }
            None => None,
        };
        let (audit, audit_events) = tokio::sync::mpsc::unbounded_channel();
        let gateway = Gateway::new(config.gateway.clone(), audit).map_err(|e| NodeError::Internal(e.to_string()))?;
        Ok(Node {
            pool,
            runtimes,
            agents: Mutex::new(HashMap::new()),
            connect_gates: Mutex::new(HashMap::new()),
            kept_spaced,
            in_memory_root,
            volumes,
            template_builds: tokio::sync::Mutex::new(HashMap::new()),
            warm: warm::WarmPool::new(&config.warm),
            pod_templates: Default::default(),
            reclaim: tokio::sync::Notify::new(),
            build_sandboxes: Mutex::new(HashSet::new()),
            builds: tokio::sync::RwLock::new(()),
            gateway,
            starts: tokio::sync::Semaphore::new(config.max_starting.max(1)),
            root_certs: Mutex::new(HashMap::new()),
            audit_events: Mutex::new(Some(audit_events)),
            config,
        })
    }

    /// Creates the sandbox's root from `template` (charged to `disk`, if given) and starts it
    /// in `runtime`.
    pub async fn start_sandbox(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
        hostname: &str,
        disk: Option<&DiskQuota>,
    ) -> Result<SandboxHandle> {
        let image = match self.runtimes.get(runtime)?.root_disk() {
            RootDiskKind::Directory => None,
            RootDiskKind::Image => Some(self.template_image(template).await?),
        };
        let _start = self.starts.acquire().await.map_err(|e| NodeError::Internal(e.to_string()))?;
        let pool = self.pool.clone();
        let (sid, tpl, identity) = (id.clone(), template.clone(), crate::egress::sandbox_identity(hostname));
        let disk = disk.cloned();
        let root = blocking(move || {
            let root = match image {
                None => RootDisk::Directory(pool.create_sandbox_root(&sid, &tpl, identity)?),
                Some(image) => RootDisk::Image(pool.create_sandbox_image_root(&sid, &image)?),
            };
            charge(&pool, &sid, disk.as_ref())?;
            Ok(root)
        })
        .await?;
        self.boot(id, runtime, root, limits, hostname, None).await
    }

    /// Starts a sandbox on a prepared root (from `pod`, a pod template of its runtime's, if
    /// given) and connects to its `spaced`.
    pub(crate) async fn boot(
        &self,
        id: &SandboxId,
        runtime: RuntimeKind,
        root: RootDisk,
        limits: Limits,
        hostname: &str,
        pod: Option<&PodTemplate>,
    ) -> Result<SandboxHandle> {
        let spec = SandboxSpec { id: id.clone(), root, hostname: hostname.to_owned(), limits };
        let rt = self.runtimes.get(runtime)?;
        self.runtimes.record(id, runtime);
        let handle = match pod {
            Some(template) => rt.start_pod(&spec, template).await?,
            None => rt.start(&spec).await?,
        };
        let agent = self.connect(&handle.id).await?;
        self.agents.lock().map_err(poisoned)?.insert(id.clone(), agent);
        self.connect_to_gateway_or_destroy(&handle, false).await?;
        Ok(handle)
    }

    /// Kills the sandbox and removes everything it had on this node. Idempotent. The root
    /// only moves to the trash here; [`Node::start_background`] deletes it off the hot path.
    pub async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.stop_sandbox(id).await?;
        let pool = self.pool.clone();
        let sid = id.clone();
        blocking(move || Ok(pool.retire_sandbox_root(&sid)?)).await?;
        self.reclaim.notify_one();
        Ok(())
    }

    /// Kills the sandbox and forgets it, leaving its root where it is. Idempotent.
    pub(crate) async fn stop_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.agents.lock().map_err(poisoned)?.remove(id);
        self.disconnect_from_gateway(id);
        match self.runtimes.of(id) {
            Ok(runtime) => runtime.destroy(id).await?,
            // Not known to be any runtime's: make sure none has anything of it.
            Err(_) => {
                for runtime in self.runtimes.all() {
                    runtime.destroy(id).await?;
                }
            }
        }
        self.runtimes.forget(id);
        Ok(())
    }

    /// Starts the node's background work: keeping the warm pool filled, deleting destroyed
    /// roots and the quota groups they leave unused. Call once, after the start-up sweep.
    pub fn start_background(self: &Arc<Self>) {
        self.start_warm_pool();
        let node = self.clone();
        tokio::spawn(async move {
            let mut pruned_at: Option<std::time::Instant> = None;
            loop {
                let pool = node.pool.clone();
                let reclaimed = blocking(move || {
                    reclaim_disk(&pool);
                    Ok(())
                });
                if let Err(e) = reclaimed.await {
                    tracing::warn!(error = %e, "reclaiming disk");
                }
                let every = node.config.build_cache_max_age.map_or(PRUNE_EVERY, |age| age.min(PRUNE_EVERY));
                if pruned_at.is_none_or(|at| at.elapsed() >= every) && node.prune_build_cache().await {
                    pruned_at = Some(std::time::Instant::now());
                }
                let _ = tokio::time::timeout(RECLAIM_RECHECK, node.reclaim.notified()).await;
            }
        });
    }

    /// Deletes the build cache's layers unused for longer than the node keeps them, unless a
    /// build runs; whether it looked (it did not while a build ran).
    async fn prune_build_cache(&self) -> bool {
        let Some(max_age) = self.config.build_cache_max_age else { return true };
        let Ok(_alone) = self.builds.try_write() else { return false };
        let layers = self.pool.layers();
        match blocking(move || Ok(layers.prune(max_age)?)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(layers = n, "pruned build cache layers no build used lately"),
            Err(e) => tracing::warn!(error = %e, "pruning the build cache"),
        }
        true
    }

    /// The egress gateway of this node's sandboxes.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// The gateway's audit events; the first caller gets them, later ones `None`.
    pub fn take_audit_events(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<space_api::egress::AuditEvent>> {
        self.audit_events.lock().ok()?.take()
    }

    /// Destroyed roots waiting to be deleted.
    pub fn pending_deletions(&self) -> u64 {
        self.pool.trash_len().unwrap_or(0) as u64
    }

    /// The connection to a sandbox's `spaced`, reconnecting if it dropped (e.g. after a
    /// server restart: `spaced` keeps running and accepts a new connection).
    pub async fn agent(&self, id: &SandboxId) -> Result<AgentClient> {
        self.pass_connect_gate(id).await?;
        if let Some(agent) = self.agents.lock().map_err(poisoned)?.get(id).filter(|a| !a.is_closed()) {
            return Ok(agent.clone());
        }
        let agent = self.connect(id).await?;
        self.agents.lock().map_err(poisoned)?.insert(id.clone(), agent.clone());
        Ok(agent)
    }

    async fn connect(&self, id: &SandboxId) -> Result<AgentClient> {
        let runtime = self.runtimes.of(id)?;
        // A frozen agent accepts but never answers: bounded, so no caller (recovery at start
        // least of all) waits for ever.
        match tokio::time::timeout(AGENT_CONNECT_TIMEOUT, runtime.agent(id)).await {
            Ok(connected) => connected.map_err(|e| NodeError::Agent { sandbox: id.clone(), reason: e.to_string() }),
            Err(_) => Err(NodeError::Agent {
                sandbox: id.clone(),
                reason: format!("no answer within {AGENT_CONNECT_TIMEOUT:?} (is the sandbox frozen?)"),
            }),
        }
    }

    /// A handle for a sandbox recorded before a restart, if a runtime of this node has it.
    pub fn handle(&self, id: &SandboxId, pid: u32) -> Option<SandboxHandle> {
        let runtime = self.runtimes.kind_of(id)?;
        Some(SandboxHandle { id: id.clone(), runtime, pid })
    }

    pub fn is_alive(&self, handle: &SandboxHandle) -> bool {
        self.runtimes.of_handle(handle).is_ok_and(|r| r.is_alive(handle))
    }

    /// The handle of a sandbox an earlier server process started, if it is still alive;
    /// from then on it is this node's like any other (snapshots, suspend, teardown).
    pub fn adopt(&self, id: &SandboxId, pid: u32) -> Option<SandboxHandle> {
        let handle = self.handle(id, pid)?;
        self.runtimes.of_handle(&handle).ok()?.adopt(&handle).then_some(handle)
    }

    pub async fn wait_exit(&self, handle: &SandboxHandle) {
        if let Ok(runtime) = self.runtimes.of_handle(handle) {
            runtime.wait_exit(handle).await
        }
    }

    /// Why a sandbox's process exited, if its runtime knows (a VMM's last error).
    pub fn exit_reason(&self, id: &SandboxId) -> Option<String> {
        self.runtimes.of(id).ok()?.exit_reason(id)
    }

    pub fn stats(&self, id: &SandboxId) -> Result<SandboxStats> {
        Ok(self.runtimes.of(id)?.stats(id)?)
    }

    pub fn oom_kills(&self, id: &SandboxId) -> Result<u64> {
        Ok(self.runtimes.of(id)?.oom_kills(id)?)
    }

    /// Every runtime and whether this node can run it.
    pub fn runtimes(&self) -> Vec<RuntimeSupport> {
        self.runtimes.support()
    }

    /// Destroys every sandbox on this node that is neither in `keep` nor a ready pod of its warm
    /// pool; returns the ids of those removed. One that cannot be removed is logged and left
    /// for the next sweep.
    pub async fn sweep(&self, keep: &HashSet<SandboxId>) -> Result<Vec<SandboxId>> {
        let mut found = HashSet::new();
        for runtime in self.runtimes.all() {
            found.extend(runtime.list()?);
        }
        let pool = self.pool.clone();
        found.extend(blocking(move || Ok(pool.list_sandbox_roots()?)).await?);
        let pods = self.warm.ready_ids();
        let building = self.build_sandboxes.lock().map_err(poisoned)?.clone();
        let mut removed = Vec::new();
        for id in found.into_iter().filter(|id| !keep.contains(id) && !pods.contains(id) && !building.contains(id)) {
            tracing::info!(sandbox = %id, "removing orphaned sandbox");
            match self.destroy_sandbox(&id).await {
                Ok(()) => removed.push(id),
                Err(e) => tracing::warn!(sandbox = %id, error = %e, "cannot remove an orphaned sandbox"),
            }
        }
        Ok(removed)
    }
}

/// What every runtime of a node shares.
pub(crate) struct HostParts<'a> {
    pub spaced: &'a std::path::Path,
    pub run_dir: &'a std::path::Path,
    pub cgroup_parent: &'a str,
    pub id_map: IdMap,
}

/// The vm runtime, or why this host cannot run it. Its sandboxes' cgroups sit in a directory
/// of the node's own, which the linux runtime (whose sandboxes are the other children) skips.
async fn open_vm(host: &HostParts<'_>, vm: &VmConfig) -> std::result::Result<Arc<dyn Runtime>, String> {
    let mut options = space_runtime_vm::VmOptions::new(
        &vm.jailer,
        host.spaced,
        host.run_dir.to_owned(),
        format!("{}/vm", host.cgroup_parent.trim_end_matches('/')),
    );
    options.qemu = vm.qemu.clone();
    options.guest_dir = vm.guest_dir.clone();
    options.id_map = host.id_map;
    // Probes KVM (bounded) and builds the initrd: blocking.
    let opened = tokio::task::spawn_blocking(move || space_runtime_vm::VmRuntime::new(options)).await;
    match opened {
        Ok(Ok(vm)) => Ok(Arc::new(vm)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("opening the vm runtime: {e}")),
    }
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> NodeError {
    NodeError::Internal("agent table lock poisoned".into())
}

/// Progress reports from blocking storage work, forwarded to an async-side callback.
fn progress_channel(report: impl Fn(Progress) + Send + 'static) -> tokio::sync::mpsc::UnboundedSender<Progress> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Progress>();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            report(p);
        }
    });
    tx
}

/// Deletes destroyed roots, then the quota groups nothing uses any more; logs what fails.
fn reclaim_disk(pool: &space_storage::Pool) {
    match pool.reclaim_trash(MAX_PENDING_DELETIONS) {
        Ok(0) => {}
        Ok(n) => tracing::debug!(roots = n, "deleted destroyed sandbox roots"),
        Err(e) => tracing::warn!(error = %e, "deleting destroyed sandbox roots"),
    }
    match pool.sweep_quota_groups() {
        Ok(0) => {}
        Ok(n) => tracing::debug!(qgroups = n, "removed unused quota groups"),
        Err(e) => tracing::warn!(error = %e, "removing unused quota groups"),
    }
}
