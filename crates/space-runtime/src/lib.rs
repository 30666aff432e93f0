//! The contract between the node and a sandbox runtime.
//!
//! A runtime turns a prepared root filesystem into a running sandbox whose pid 1 is `spaced`,
//! reachable through a unix socket on the host that only the node can open. Every operation is
//! idempotent and named after the [`SandboxId`], so the node can replay it after a crash.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use space_api::{IdMap, SandboxId};

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

/// Everything a runtime needs to start one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub id: SandboxId,
    /// The sandbox's writable root: a btrfs subvolume prepared by the storage pool.
    pub rootfs: PathBuf,
    pub hostname: String,
    pub limits: Limits,
}

/// A started sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxHandle {
    pub id: SandboxId,
    /// Host pid of the sandbox's pid 1 (`spaced`).
    pub pid: u32,
    /// Host path of the unix socket `spaced` accepts node connections on.
    pub socket: PathBuf,
}

/// Point-in-time resource usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStats {
    pub memory_bytes: u64,
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
}

pub trait Runtime: Send + Sync + 'static {
    /// Starts a sandbox and returns once `spaced` accepts connections.
    fn start(&self, spec: &SandboxSpec) -> impl Future<Output = Result<SandboxHandle, RuntimeError>> + Send;

    /// Kills every process of the sandbox and removes its runtime resources (cgroups, socket).
    /// Succeeds when there is nothing left to remove.
    fn destroy(&self, id: &SandboxId) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Changes the resource limits of a running sandbox (applied when a warm pod is bound to
    /// a session that asked for other limits than the pod was prepared with).
    fn set_limits(&self, id: &SandboxId, limits: &Limits) -> Result<(), RuntimeError>;

    /// Freezes every process of the sandbox in place; returns once they are all frozen.
    fn pause(&self, id: &SandboxId) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Thaws a paused sandbox.
    fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError>;

    /// Whether the sandbox's pid 1 is still the process recorded in `handle`.
    fn is_alive(&self, handle: &SandboxHandle) -> bool;

    /// Takes over a sandbox an earlier instance started (found alive after a restart), so
    /// that everything this instance does to its own sandboxes works on it too. Returns
    /// whether the sandbox is alive (and now adopted).
    fn adopt(&self, handle: &SandboxHandle) -> bool;

    /// The sandbox's network namespace, where the node's gateway opens its listeners. Opened
    /// through what pins the sandbox (never a bare pid that may since have been reused);
    /// `NotFound` when the sandbox no longer runs.
    fn network_namespace(&self, handle: &SandboxHandle) -> Result<OwnedFd, RuntimeError>;

    /// Resolves when the sandbox's pid 1 has exited.
    fn wait_exit(&self, handle: &SandboxHandle) -> impl Future<Output = ()> + Send;

    fn stats(&self, id: &SandboxId) -> Result<SandboxStats, RuntimeError>;

    /// The `oom_kills` of [`Runtime::stats`] alone, cheaply.
    fn oom_kills(&self, id: &SandboxId) -> Result<u64, RuntimeError>;

    /// Ids of every sandbox that has runtime resources on this node, alive or not; the node
    /// destroys those no session owns.
    fn list(&self) -> Result<Vec<SandboxId>, RuntimeError>;

    /// The checkpoint tool in use (e.g. `CRIU 4.2.1`), or why sandboxes cannot be checkpointed.
    fn checkpoint_support(&self) -> Result<String, String>;

    /// Waits (at most `timeout`) until the sandbox's agent holds no connection: a checkpoint
    /// cannot take a connection to the host along. The caller closes its own first; the
    /// sandbox must be running (the agent closes its ends).
    fn wait_agent_released(
        &self,
        id: &SandboxId,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Checkpoints the process tree of a paused sandbox into `images_dir` (created; must not
    /// hold another checkpoint). The sandbox keeps running, still paused.
    fn checkpoint(
        &self,
        id: &SandboxId,
        images_dir: &Path,
    ) -> impl Future<Output = Result<CheckpointStats, RuntimeError>> + Send;

    /// Starts sandbox `spec.id` by restoring the checkpoint in `images_dir` onto `spec.rootfs`
    /// (a writable copy of the root snapshot taken with it), with `spec.limits`; `spaced` is
    /// the very binary the checkpointed sandbox ran. Returns once `spaced` accepts
    /// connections. Restoring one checkpoint several times forks it.
    fn restore(
        &self,
        spec: &SandboxSpec,
        images_dir: &Path,
        spaced: &Path,
    ) -> impl Future<Output = Result<SandboxHandle, RuntimeError>> + Send;
}
