//! The node API: the one interface through which the control plane drives a node (model:
//! omicron's sled-agent API). Implemented in-process by `space_node::Node` for `space serve`,
//! and in memory by `space-node-sim` for the control plane's contract tests; nothing above
//! the node knows which one it holds.
//!
//! Operations are named after what the control plane wants done and take typed ids, so the
//! node's own names (subvolumes, cgroups, sockets) stay the node's. Every operation is
//! idempotent where the control plane replays it after a crash (destroy, delete, sweep).
//!
//! Everything that asks the node about its current state is `async`, because a remote node
//! answers over the network. What describes the node itself and cannot change while it runs
//! (its runtimes, built-in templates, checkpoint tools) stays synchronous: a remote client
//! learns it once, when it connects.
//!
//! Exec, files and watch reach a sandbox through the [`AgentClient`] that [`NodeApi::agent`]
//! hands out. Over the network (`space-node-wire`) that connection is relayed by the node,
//! which passes on only the operations the public API offers; what steers a sandbox's life
//! (checkpoint windows, freezing its root) stays the node's own.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use space_api::egress::AuditEvent;
use space_api::{PoolStatus, Progress, RuntimeKind, RuntimeSupport, SandboxId, SessionId, SnapshotId};
use space_gateway::{Gateway, SessionEgress, SessionTraffic};
use space_proto::client::AgentClient;
use tokio::sync::mpsc::UnboundedReceiver;

pub use space_api::durable::{BlobSweep, ParentDisk, SnapshotExport, SnapshotKey, TemplateExport};
pub use space_api::{TemplateBuild, TemplateInfo, TemplateSource};
pub use space_runtime::{Limits, SandboxHandle, SandboxStats};

/// Largest warm pool one template may have.
pub const MAX_POOL_SIZE: u32 = 1024;

/// What a node could not do, in the classes the control plane answers differently.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("unknown template {name:?}; available: {available}")]
    UnknownTemplate { name: String, available: String },
    /// Full snapshots (checkpoint and restore of processes) are not possible on this node.
    #[error("checkpoints are unavailable on this node: {0}")]
    CheckpointUnavailable(String),
    /// This node cannot run sandboxes of `runtime`.
    #[error("the {runtime} runtime is unavailable on this node: {reason}")]
    RuntimeUnavailable { runtime: RuntimeKind, reason: String },
    /// Disk space ran out: the pool's, or the session's limit.
    #[error("out of disk space ({which:?})")]
    OutOfSpace { which: OutOfSpace, source: Box<dyn std::error::Error + Send + Sync + 'static> },
    /// A port of the sandbox could not be connected to.
    #[error("{source}")]
    Port { failure: PortFailure, source: Box<dyn std::error::Error + Send + Sync + 'static> },
    /// The node was started without a blob store (`--blob-store`): its snapshots stay local.
    #[error("this node has no blob store (start it with --blob-store), so its snapshots stay on its disk")]
    NoBlobStore,
    /// A part of an exported snapshot did not match its hash: nothing of it was imported.
    #[error("the snapshot's export is corrupt: {0}")]
    Corrupt(String),
    /// A Dockerfile build failed at one of its steps (the message names the line).
    #[error("{0}")]
    BuildFailed(String),
    /// Anything else: the node's own error, kept whole as the source.
    #[error(transparent)]
    Failed(Box<dyn std::error::Error + Send + Sync + 'static>),
}

pub type Result<T, E = NodeError> = std::result::Result<T, E>;

/// Why a port of a sandbox could not be connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PortFailure {
    /// Nothing listens there, or it did not answer.
    Unreachable,
    /// The port is not the sandbox's to serve on (the gateway's, or 0).
    Reserved,
}

/// A byte stream to a server inside a sandbox.
pub trait PortIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> PortIo for T {}

/// What [`NodeApi::connect_port`] returns: a TCP connection for the in-process node, a
/// tunnel for a remote one.
pub type PortStream = Box<dyn PortIo>;

/// Which disk space ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutOfSpace {
    /// The node's storage pool is full.
    Pool,
    /// The session's disk limit is reached.
    Quota,
}

/// Whose disk a new sandbox root is charged to, and that session's cap (`None`: no cap).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskQuota {
    pub session: SessionId,
    pub limit_bytes: Option<u64>,
}

/// What a session is charged for on a node's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskUsage {
    /// What its sandboxes wrote that still exists anywhere on the node (roots, snapshots,
    /// forks made from them).
    pub used_bytes: u64,
    /// Whether the node enforces disk limits (it counts usage only where it does).
    pub enforced: bool,
}

/// Called with the progress of long node work (template builds and imports).
pub type ProgressFn = Box<dyn Fn(Progress) + Send + Sync + 'static>;

/// Called with each line of a build's log (step headers and the steps' output).
pub type LogFn = Box<dyn Fn(String) + Send + Sync + 'static>;

/// What the control plane tells the node's egress gateway about sessions. Apart from
/// [`NodeApi`] so the control plane's egress logic can be tested against a bare [`Gateway`].
#[async_trait]
pub trait EgressControl: Send + Sync {
    /// From now on the gateway decides `session`'s traffic by `egress` (replacing what it had).
    /// Fails only when the node cannot be told (a remote one that does not answer): the
    /// gateway then keeps what it had, so a revocation must not be reported done.
    async fn set_session_egress(&self, session: &SessionId, egress: SessionEgress) -> Result<()>;
    /// The gateway stops knowing `session` (destroyed, or its record could not be stored).
    async fn forget_session_egress(&self, session: &SessionId) -> Result<()>;
    /// What `session` sent and received through the gateway since its egress was set on
    /// this node; `None` while the gateway does not know it.
    async fn session_traffic(&self, session: &SessionId) -> Option<SessionTraffic>;
}

#[async_trait]
impl EgressControl for Gateway {
    async fn set_session_egress(&self, session: &SessionId, egress: SessionEgress) -> Result<()> {
        self.set_session(session, egress);
        Ok(())
    }

    async fn forget_session_egress(&self, session: &SessionId) -> Result<()> {
        self.forget_session(session);
        Ok(())
    }

    async fn session_traffic(&self, session: &SessionId) -> Option<SessionTraffic> {
        Gateway::session_traffic(self, session)
    }
}

/// A node: its templates, warm pool, sandboxes, snapshots and egress gateway.
#[async_trait]
pub trait NodeApi: EgressControl + 'static {
    /// Starts the node's background work (warm pool, reclaiming destroyed roots). Called
    /// once, after the start-up sweep, which would otherwise destroy the pool's pods.
    fn start_background(self: Arc<Self>);

    /// The node's id: what its sandboxes are recorded under, and what its cgroups are named by.
    fn node_id(&self) -> String;

    /// Names the node's process now: a node in another process that was started again since
    /// answers another one, and has forgotten what it held in memory (its background work,
    /// its gateway's sessions and listeners). A node in this process lives as long as its
    /// caller and always answers the same.
    async fn incarnation(&self) -> Result<String> {
        Ok(String::new())
    }

    // Templates.

    /// Every built template, every version.
    async fn templates(&self) -> Vec<TemplateInfo>;
    /// The newest built version of `name`.
    async fn resolve_template(&self, name: &str) -> Option<TemplateInfo>;
    /// Templates the node can build by name on first use.
    fn builtin_templates(&self) -> Vec<String>;
    /// The newest version of `name`, building it first if it is a built-in not built yet;
    /// `UnknownTemplate` otherwise.
    async fn ensure_template(&self, name: &str, report: ProgressFn) -> Result<TemplateInfo>;
    /// Imports a root filesystem or an OCI image as a new version of `name`.
    async fn import_template(&self, name: &str, source: &TemplateSource, report: ProgressFn) -> Result<TemplateInfo>;
    /// Builds a Dockerfile as a new version of `name`, reusing the node's cached layers.
    async fn build_template(
        &self,
        name: &str,
        build: &TemplateBuild,
        report: ProgressFn,
        log: LogFn,
    ) -> Result<TemplateInfo>;
    /// Deletes version `version` of `name`; whether it existed. Sandboxes made from it keep
    /// working (their roots are independent snapshots).
    async fn delete_template(&self, name: &str, version: u64) -> Result<bool>;
    /// Puts `file`, a file on the control plane's host (a template upload, a build's context),
    /// where this node's template work can read it, and returns its path there. A node that
    /// shares the control plane's host reads it where it is; a node reached over the network
    /// receives a copy, checked against the bytes sent.
    async fn stage_file(&self, file: &Path) -> Result<PathBuf> {
        Ok(file.to_owned())
    }
    /// Removes a copy [`NodeApi::stage_file`] made. A file the node read where it was is the
    /// caller's: nothing is removed.
    async fn unstage_file(&self, _staged: &Path) -> Result<()> {
        Ok(())
    }

    fn is_builtin(&self, name: &str) -> bool {
        self.builtin_templates().iter().any(|b| b == name)
    }

    /// Names a session can ask for: built templates and built-ins, sorted, without repeats.
    async fn available_templates(&self) -> Vec<String> {
        let mut available: Vec<String> = self.templates().await.into_iter().map(|t| t.name).collect();
        available.extend(self.builtin_templates());
        available.sort();
        available.dedup();
        available
    }

    /// What the node's host has to run sandboxes with. Fails only when the node cannot be
    /// asked (a remote one that does not answer): its heartbeat is then not written, so a
    /// node that stops answering is lost once its lease runs out.
    async fn capacity(&self) -> Result<space_api::NodeCapacity>;

    // Runtimes.

    /// Every runtime and whether this node can run it (and why not).
    fn runtimes(&self) -> Vec<RuntimeSupport>;

    /// Whether this node runs `runtime`; the reason it does not otherwise.
    fn runtime_available(&self, runtime: RuntimeKind) -> Result<(), String> {
        match self.runtimes().into_iter().find(|r| r.runtime == runtime) {
            Some(r) if r.available => Ok(()),
            Some(r) => Err(r.detail),
            None => Err("this node does not know it".into()),
        }
    }

    // Warm pool.

    /// A ready pod of exactly this template version and runtime, given `limits`, if the pool
    /// has one; `None`: start cold. (The pool refills in the background, hence the `Arc`.)
    async fn bind_pod(
        self: Arc<Self>,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
    ) -> Option<SandboxHandle>;
    /// How many ready pods of `runtime` the node keeps for `template` (at most [`MAX_POOL_SIZE`]).
    async fn set_pool_size(self: Arc<Self>, template: &str, runtime: RuntimeKind, size: u32);
    async fn pool_status(&self) -> PoolStatus;

    // Sandboxes.

    /// Creates sandbox `id`'s root from `template`, charged to `disk`, and starts it in `runtime`.
    async fn start_sandbox(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
    ) -> Result<SandboxHandle>;
    /// Starts sandbox `id` from a snapshot of `session`: a full snapshot's processes continue
    /// where they were; a disk snapshot's root boots afresh with a new identity. The new root
    /// is charged to `disk` before anything in it runs. `runtime` is the session's: the one its
    /// snapshots were taken in. `key` is the snapshot's data key, if it has one: a full
    /// snapshot's process images are sealed with it on the node (docs/byok.md).
    #[allow(clippy::too_many_arguments)] // one call's whole request
    async fn start_sandbox_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
        key: Option<&SnapshotKey>,
    ) -> Result<SandboxHandle>;
    /// Kills the sandbox and removes everything it had on the node. Idempotent.
    async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()>;
    /// Freezes every process of the sandbox; memory stays where it is.
    async fn pause_sandbox(&self, id: &SandboxId) -> Result<()>;
    /// Thaws the sandbox and makes sure the node's connection to its agent is up (which
    /// also ends the window a full snapshot of a paused sandbox opened for the checkpoint).
    async fn resume_sandbox(&self, id: &SandboxId) -> Result<()>;
    /// The handle of a sandbox an earlier process started, if its pid 1 still runs; from
    /// then on it is this node's like any other.
    async fn adopt(&self, id: &SandboxId, pid: u32) -> Option<SandboxHandle>;
    /// Resolves when the sandbox's pid 1 has exited.
    async fn wait_exit(&self, handle: &SandboxHandle);
    /// What the sandbox's runtime knows of why it exited (a VMM's last error), if anything.
    async fn exit_reason(&self, _id: &SandboxId) -> Option<String> {
        None
    }
    /// Processes the kernel killed because the sandbox hit its memory limit.
    async fn oom_kills(&self, id: &SandboxId) -> Result<u64>;
    /// Memory, CPU and processes of a running sandbox.
    async fn sandbox_stats(&self, id: &SandboxId) -> Result<SandboxStats>;
    /// Destroys every sandbox on the node not in `keep`; returns those removed.
    async fn sweep(&self, keep: &HashSet<SandboxId>) -> Result<Vec<SandboxId>>;
    /// The connection to the sandbox's agent (exec, files, watch), reconnecting if needed.
    async fn agent(&self, id: &SandboxId) -> Result<AgentClient>;

    // Snapshots.

    /// The checkpoint tool `runtime`'s sandboxes use, or why they cannot take full snapshots.
    fn checkpoint_support(&self, runtime: RuntimeKind) -> Result<String, String>;
    /// A consistent copy of the sandbox's root (frozen while taken, thawed after unless
    /// `already_paused`). Its size comes apart: [`NodeApi::snapshot_disk_size`].
    async fn snapshot_disk(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
    ) -> Result<()>;
    /// Root and every process; the sandbox is left as found. Returns the snapshot's size.
    /// With `key` (the snapshot's data key), the process images are in clear only in memory
    /// and sealed with it on disk. On failure a partial snapshot may remain: the caller
    /// deletes it.
    async fn snapshot_full(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
        key: Option<&SnapshotKey>,
    ) -> Result<u64>;
    /// The apparent size of a disk snapshot's files.
    async fn snapshot_disk_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64>;
    /// Deletes a snapshot. Missing is fine.
    async fn delete_snapshot(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<()>;
    /// Deletes every snapshot on the node not in `keep`; returns how many.
    async fn sweep_snapshots(&self, keep: &HashSet<SnapshotId>) -> Result<usize>;
    /// Stores the snapshot in the node's blob store (its root, and a full snapshot's
    /// processes) and says what it became; [`NodeError::NoBlobStore`] on a node without one.
    /// The root goes as a stream against `parent` (an exported snapshot of the same session)
    /// when the node holds that parent's root, else whole: the export's `disk.parent` says
    /// which. With `key` (the snapshot's data key, when it has one), the root and the process
    /// images are encrypted with it (docs/byok.md).
    async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<SnapshotExport>;
    /// Makes the snapshot on this node from its export, every part checked
    /// ([`NodeError::Corrupt`] if one does not match). Idempotent: a snapshot the node holds
    /// already is left as it is. An encrypted export needs its `key`; an object that does not
    /// decrypt whole is [`NodeError::Corrupt`]. An export against a parent needs the roots of
    /// its ancestors the node lacks: `parents` names them, newest first
    /// (a failure when one it needs is missing).
    async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
        parents: &[ParentDisk],
    ) -> Result<()>;
    /// Stores version `version` of global template `name` in the node's blob store, so a
    /// node that never built it can import it ([`NodeError::NoBlobStore`] without one).
    async fn export_template(&self, name: &str, version: u64) -> Result<TemplateExport>;
    /// Makes the template `export` describes on this node, its very version, unless the node
    /// has that version already.
    async fn import_template_export(&self, export: &TemplateExport) -> Result<TemplateInfo>;
    /// Deletes every object of the node's blob store that `keep` (SHA-256s) does not name and
    /// that is at least `min_age` old, for at most `budget`; [`NodeError::NoBlobStore`] on a
    /// node without one. The caller makes sure no export is under way meanwhile
    /// (docs/control-plane.md, "Retention of exported objects").
    async fn sweep_blobs(&self, keep: &HashSet<String>, min_age: Duration, budget: Duration) -> Result<BlobSweep>;

    // Disk.

    /// Charges what a running `sandbox` (a warm pod being bound, or one adopted after a
    /// restart) writes to `disk`'s session, with its cap. Idempotent.
    async fn limit_disk(&self, sandbox: &SandboxId, disk: &DiskQuota) -> Result<()>;
    /// What `session` is charged for on this node's disk.
    async fn disk_usage(&self, session: &SessionId) -> Result<DiskUsage>;
    /// Bytes only this snapshot holds on disk (what deleting it frees), measured now.
    async fn snapshot_exclusive_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64>;

    // Egress.

    /// From now on `sandbox`'s traffic is decided by `session`'s egress, which must have been
    /// set ([`EgressControl::set_session_egress`]); the sandbox gets the session's CA.
    async fn join_session_network(&self, sandbox: &SandboxId, session: &SessionId) -> Result<()>;
    /// After a restart: gives a sandbox that kept running its egress again, serving `session`.
    async fn reattach_gateway(&self, handle: &SandboxHandle, session: &SessionId) -> Result<()>;
    /// The gateway's audit events; the first caller gets them, later ones `None`.
    fn take_audit_events(&self) -> Option<UnboundedReceiver<AuditEvent>>;

    /// A connection to `port` of the server inside the running `sandbox`, opened from within
    /// the sandbox's network namespace (nothing gives the sandbox a path out).
    async fn connect_port(&self, sandbox: &SandboxId, port: u16) -> Result<PortStream>;
}
