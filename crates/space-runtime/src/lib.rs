//! The contract between the node and a sandbox runtime.
//!
//! A runtime turns a prepared root disk into a running sandbox whose pid 1 is `spaced`,
//! reachable through an [`AgentTransport`] only the node can open: a process tree on the
//! node's kernel (`linux`) or a virtual machine with a kernel of its own (`vm`). Every
//! operation is idempotent and named after the [`SandboxId`], so the node can replay it after
//! a crash. Handles, root disks and checkpoint artifacts are typed per runtime; a runtime
//! given another's answers [`RuntimeError::WrongKind`].

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
pub use space_api::durable::SnapshotKey;
pub use space_api::{IdMap, RuntimeKind, SandboxId};
use space_proto::client::AgentClient;

/// Resource limits applied to the whole sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_mib: u64,
    /// CPU quota in thousandths of a core (1000 = one core).
    pub millicpus: u32,
    pub pids: u32,
}

impl From<&space_api::Resources> for Limits {
    fn from(r: &space_api::Resources) -> Limits {
        Limits { memory_mib: r.memory_mib, millicpus: (r.cpus * 1000.0).round() as u32, pids: r.pids }
    }
}

/// A sandbox's root disk, of the type its runtime boots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootDisk {
    /// A writable btrfs subvolume: the root filesystem itself (`linux`).
    Directory(PathBuf),
    /// A raw filesystem image, the sandbox's own reflinked copy (`vm`).
    Image(PathBuf),
}

impl RootDisk {
    pub fn path(&self) -> &Path {
        match self {
            RootDisk::Directory(p) | RootDisk::Image(p) => p,
        }
    }
}

/// Which root disk a runtime boots from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootDiskKind {
    Directory,
    Image,
}

/// Everything a runtime needs to start one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub id: SandboxId,
    /// The sandbox's writable root, prepared by the storage pool.
    pub root: RootDisk,
    pub hostname: String,
    pub limits: Limits,
}

/// A started sandbox. Opaque above the node: the node gives it back to the runtime that
/// made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxHandle {
    pub id: SandboxId,
    pub runtime: RuntimeKind,
    /// The host process that holds the sandbox (pid 1 for `linux`, the VMM's for `vm`): what
    /// tells this sandbox from a later one of the same id after a restart.
    pub pid: u32,
}

/// Where servers inside a sandbox are reached from its network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortAddress {
    /// The namespace's own loopback: the sandbox's processes share the namespace, and with it
    /// the gateway's listeners, whose ports are then not the sandbox's.
    SharedLoopback,
    /// A guest kernel's address behind the namespace's TAP device: every port there is the
    /// guest's own.
    Guest(std::net::Ipv4Addr),
}

/// How the node reaches a sandbox's `spaced`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentTransport {
    /// A unix socket on the host: the agent's own (`linux`), or the VMM's end of a
    /// virtio-serial port (`vm`).
    Unix(PathBuf),
    /// An `AF_VSOCK` address (a `vm` where `/dev/vhost-vsock` exists).
    Vsock { cid: u32, port: u32 },
}

/// What a checkpoint is made of, per runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointArtifacts {
    /// A CRIU image directory, and the `spaced` binary the checkpointed tree ran (a restore
    /// must run that very binary again). With `sealed` (a checkpoint's only: a restore is
    /// given its images opened into `images`), a checkpoint's images go there, and `images`
    /// gets only CRIU's log.
    Criu { images: PathBuf, spaced: PathBuf, sealed: Option<SealedImages> },
    /// The VMM's saved device and memory state. With `sealed` (a restore's only), the files
    /// in `state` are encrypted with that key (`space-keys`' stream format) and opened as the
    /// VMM reads them: never written anywhere in clear.
    VmState { state: PathBuf, sealed: Option<SnapshotKey> },
}

/// Where a checkpoint's images are kept encrypted with their snapshot's key (in `space-keys`'
/// stream format, file by file), sealed as the checkpoint writes them: never in clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedImages {
    pub dir: PathBuf,
    pub key: SnapshotKey,
}

/// Point-in-time resource usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStats {
    pub memory_bytes: u64,
    /// The most memory used at once since the sandbox started, where the kernel reports it.
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: u64,
    /// Processes the kernel killed because the sandbox hit its memory limit.
    pub oom_kills: u64,
    pub pids: u64,
    pub cpu_usage_ns: u64,
}

/// What a checkpoint cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Wall time of the dump itself (the sandbox is frozen throughout).
    pub wall: Duration,
    /// Total size of the image files.
    pub image_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("sandbox {0} does not exist on this node")]
    NotFound(SandboxId),
    #[error("starting sandbox failed: {0}")]
    Start(String),
    #[error("cgroup: {0}")]
    Cgroup(String),
    #[error("host does not support this runtime: {0}")]
    Unsupported(String),
    #[error("i/o on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Checkpoint or restore is not possible on this node (e.g. no usable CRIU).
    #[error("checkpoints are unavailable on this node: {0}")]
    CheckpointUnavailable(String),
    #[error("checkpoint failed: {0}")]
    Checkpoint(String),
    #[error("restoring a checkpoint failed: {0}")]
    Restore(String),
    /// A sealed checkpoint that does not open whole with its key: altered, or not its.
    #[error("the checkpoint does not open with its snapshot's key: {0}")]
    Corrupt(String),
    #[error("connecting to the agent: {0}")]
    Agent(String),
    /// The spec or the artifacts are of another runtime's type.
    #[error("the {runtime} runtime cannot use {what}")]
    WrongKind { runtime: RuntimeKind, what: &'static str },
}

/// A booted template warm-pool pods of one template version start from, made by
/// [`Runtime::make_pod_template`] (a VM's saved memory and device state). Opaque: only the
/// runtime that made it reads it, and a runtime handed another's answers `WrongKind`.
#[derive(Clone)]
pub struct PodTemplate(std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl PodTemplate {
    pub fn new<T: std::any::Any + Send + Sync>(state: T) -> PodTemplate {
        PodTemplate(std::sync::Arc::new(state))
    }

    /// The runtime's own state, if it is of type `T`.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Debug for PodTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodTemplate")
    }
}

/// A sandbox runtime (model: cloud-hypervisor's `Hypervisor`/`Vm`). The node holds one per
/// kind available on its host, as `dyn Runtime`; nothing above the node sees which.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    fn kind(&self) -> RuntimeKind;

    /// What runs sandboxes (e.g. `QEMU 7.2.19, TCG`); the runtime exists only when it can.
    fn describe(&self) -> String;

    /// The root disk this runtime boots from; the node prepares one of that type.
    fn root_disk(&self) -> RootDiskKind;

    /// Starts a sandbox and returns once `spaced` accepts connections.
    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError>;

    /// Whether this runtime starts warm-pool pods from a booted template
    /// ([`Runtime::make_pod_template`], [`Runtime::start_pod`]) rather than like any sandbox.
    fn keeps_pod_templates(&self) -> bool {
        false
    }

    /// Boots `spec`, a sandbox on a fresh copy of a template version's root, into a template
    /// and stops it: nothing of it runs afterwards, and `spec.root` is as every pod started
    /// from the template needs a copy of it. Bounded in time; on failure nothing is left.
    async fn make_pod_template(&self, spec: &SandboxSpec) -> Result<PodTemplate, RuntimeError> {
        let _ = spec;
        Err(RuntimeError::Unsupported(format!("the {} runtime keeps no pod templates", self.kind())))
    }

    /// Starts pod `spec` from `template` on `spec.root`, a copy of the template's root as
    /// [`Runtime::make_pod_template`] left it. Returns once `spaced` accepts connections.
    async fn start_pod(&self, spec: &SandboxSpec, template: &PodTemplate) -> Result<SandboxHandle, RuntimeError> {
        let _ = (spec, template);
        Err(RuntimeError::Unsupported(format!("the {} runtime keeps no pod templates", self.kind())))
    }

    /// Kills the sandbox and removes its runtime resources (cgroups, sockets, VMM). Succeeds
    /// when there is nothing left to remove.
    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Changes the resource limits of a running sandbox (applied when a warm pod is bound to
    /// a session that asked for other limits than the pod was prepared with).
    fn set_limits(&self, id: &SandboxId, limits: &Limits) -> Result<(), RuntimeError>;

    /// Stops every process (or vCPU) of the sandbox in place; returns once it is stopped.
    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Lets a paused sandbox run again.
    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Whether the sandbox's process is still the one recorded in `handle`.
    fn is_alive(&self, handle: &SandboxHandle) -> bool;

    /// Takes over a sandbox an earlier instance started (found alive after a restart), so
    /// that everything this instance does to its own sandboxes works on it too. Returns
    /// whether the sandbox is alive (and now adopted).
    fn adopt(&self, handle: &SandboxHandle) -> bool;

    /// How the node dials the sandbox's agent.
    fn agent_transport(&self, id: &SandboxId) -> AgentTransport;

    /// A connection to the sandbox's agent over [`Runtime::agent_transport`]. A runtime
    /// whose transport carries one connection at a time (virtio-serial) hands out the one
    /// it holds, and dials again as that channel needs.
    async fn agent(&self, id: &SandboxId) -> Result<AgentClient, RuntimeError> {
        match self.agent_transport(id) {
            AgentTransport::Unix(path) => AgentClient::connect_unix(&path)
                .await
                .map_err(|e| RuntimeError::Agent(format!("{}: {e}", path.display()))),
            AgentTransport::Vsock { cid, port } => {
                Err(RuntimeError::Agent(format!("vsock {cid}:{port}: this node dials unix sockets only")))
            }
        }
    }

    /// The sandbox's network namespace, where the node's gateway opens its listeners (the
    /// sandbox's own for `linux`; the one its VMM and TAP live in for `vm`). Opened through
    /// what pins the sandbox (never a bare pid that may since have been reused); `NotFound`
    /// when the sandbox no longer runs.
    fn network_namespace(&self, handle: &SandboxHandle) -> Result<OwnedFd, RuntimeError>;

    /// Where a server listening inside the sandbox is reached from its
    /// [`Runtime::network_namespace`] (the node's port proxy connects there).
    fn port_address(&self) -> PortAddress;

    /// Resolves when the sandbox's process has exited.
    async fn wait_exit(&self, handle: &SandboxHandle);

    /// Why the sandbox's process exited, if the runtime knows (a VMM's last error line).
    fn exit_reason(&self, _id: &SandboxId) -> Option<String> {
        None
    }

    fn stats(&self, id: &SandboxId) -> Result<SandboxStats, RuntimeError>;

    /// The `oom_kills` of [`Runtime::stats`] alone, cheaply.
    fn oom_kills(&self, id: &SandboxId) -> Result<u64, RuntimeError>;

    /// Ids of every sandbox that has runtime resources on this node, alive or not; the node
    /// destroys those no session owns.
    fn list(&self) -> Result<Vec<SandboxId>, RuntimeError>;

    /// The handle of a sandbox this instance started or adopted, while it tracks it.
    fn tracked_handle(&self, id: &SandboxId) -> Option<SandboxHandle>;

    /// The checkpoint tool in use (e.g. `CRIU 4.2.1`), or why sandboxes cannot be checkpointed.
    fn checkpoint_support(&self) -> Result<String, String>;

    /// Waits (at most `timeout`) until the sandbox can be checkpointed with the node's agent
    /// connection closed (a process checkpoint cannot take a connection to the host along).
    /// The caller closes its own first; the sandbox must be running.
    async fn wait_agent_released(&self, id: &SandboxId, timeout: Duration) -> Result<(), RuntimeError>;

    /// Checkpoints a paused sandbox into `artifacts` (created; must not hold another
    /// checkpoint). The sandbox keeps running, still paused.
    async fn checkpoint(
        &self,
        id: &SandboxId,
        artifacts: &CheckpointArtifacts,
    ) -> Result<CheckpointStats, RuntimeError>;

    /// Starts sandbox `spec.id` by restoring the checkpoint in `artifacts` onto `spec.root` (a
    /// writable copy of the root snapshot taken with it), with `spec.limits`. Returns once
    /// `spaced` accepts connections. Restoring one checkpoint several times forks it.
    async fn restore(&self, spec: &SandboxSpec, artifacts: &CheckpointArtifacts)
    -> Result<SandboxHandle, RuntimeError>;
}
