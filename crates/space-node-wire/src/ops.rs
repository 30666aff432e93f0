//! The node API's operations as they travel: one request type for every call that answers
//! once, and the form a node's failure takes on the wire.
//!
//! Each variant is one [`NodeApi`](space_node_api::NodeApi) operation with its arguments;
//! the server's `match` over it is exhaustive, so an operation added to the enum cannot be
//! left unanswered. Operations that stream (template builds with their progress, audit
//! events, agent connections and port tunnels) have paths of their own (see [`paths`]).

use std::path::PathBuf;

use space_api::{TemplateBuild, TemplateSource};

use serde::{Deserialize, Serialize};
use space_api::{Progress, RuntimeKind, SandboxId, SessionId, SnapshotId, TemplateInfo};
use space_gateway::SessionEgress;
use space_node_api::{
    DiskQuota, Limits, NodeError, OutOfSpace, ParentDisk, PortFailure, SandboxHandle, SnapshotExport, SnapshotKey,
    TemplateExport,
};

/// Paths of the node API.
pub mod paths {
    /// `GET`: [`crate::NodeInfo`].
    pub const INFO: &str = "/v1/info";
    /// `POST` a [`super::Call`]: its answer as JSON, or a [`super::NodeFailure`].
    pub const CALL: &str = "/v1/call";
    /// `POST` a [`super::TemplateCall`]: [`super::TemplateLine`]s, one JSON per line.
    pub const TEMPLATE: &str = "/v1/template";
    /// `GET`: the gateway's audit events, one JSON per line, for as long as the caller reads.
    pub const AUDIT: &str = "/v1/audit";
    /// `POST` a [`super::AgentCall`], upgraded: the sandbox's agent protocol, restricted.
    pub const AGENT: &str = "/v1/agent";
    /// `POST` a [`super::PortCall`], upgraded: the bytes of one TCP connection.
    pub const PORT: &str = "/v1/port";
    /// `POST` a [`super::StageCall`], upgraded: the file's bytes go to the node, then one
    /// [`super::StageAnswer`] comes back as a line of JSON.
    pub const STAGE: &str = "/v1/stage";
}

/// The `Upgrade` protocol of [`paths::AGENT`] and [`paths::PORT`].
pub const UPGRADE_PROTOCOL: &str = "space-node-stream";

/// Every operation that answers once.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Call {
    StartBackground,
    Templates,
    ResolveTemplate {
        name: String,
    },
    Capacity,
    BindPod {
        template: TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
    },
    SetPoolSize {
        template: String,
        runtime: RuntimeKind,
        size: u32,
    },
    PoolStatus,
    StartSandbox {
        id: SandboxId,
        template: TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
        disk: DiskQuota,
    },
    StartSandboxFromSnapshot {
        id: SandboxId,
        session: SessionId,
        snapshot: SnapshotId,
        runtime: RuntimeKind,
        limits: Limits,
        disk: DiskQuota,
        key: Option<SnapshotKey>,
    },
    DestroySandbox {
        id: SandboxId,
    },
    PauseSandbox {
        id: SandboxId,
    },
    ResumeSandbox {
        id: SandboxId,
    },
    Adopt {
        id: SandboxId,
        pid: u32,
    },
    /// Answers once the sandbox's pid 1 has exited.
    WaitExit {
        handle: SandboxHandle,
    },
    ExitReason {
        id: SandboxId,
    },
    OomKills {
        id: SandboxId,
    },
    SandboxStats {
        id: SandboxId,
    },
    Sweep {
        keep: Vec<SandboxId>,
    },
    SnapshotDisk {
        sandbox: SandboxId,
        session: SessionId,
        snapshot: SnapshotId,
        already_paused: bool,
    },
    SnapshotFull {
        sandbox: SandboxId,
        session: SessionId,
        snapshot: SnapshotId,
        already_paused: bool,
        key: Option<SnapshotKey>,
    },
    SnapshotDiskSize {
        session: SessionId,
        snapshot: SnapshotId,
    },
    DeleteSnapshot {
        session: SessionId,
        snapshot: SnapshotId,
    },
    DeleteTemplate {
        name: String,
        version: u64,
    },
    SweepSnapshots {
        keep: Vec<SnapshotId>,
    },
    ExportSnapshot {
        session: SessionId,
        snapshot: SnapshotId,
        #[serde(default)]
        parent: Option<SnapshotId>,
        #[serde(default)]
        key: Option<SnapshotKey>,
    },
    ImportSnapshot {
        session: SessionId,
        snapshot: SnapshotId,
        export: SnapshotExport,
        #[serde(default)]
        key: Option<SnapshotKey>,
        #[serde(default)]
        parents: Vec<ParentDisk>,
    },
    SweepBlobs {
        keep: Vec<String>,
        min_age_ms: u64,
        budget_ms: u64,
    },
    LimitDisk {
        sandbox: SandboxId,
        disk: DiskQuota,
    },
    DiskUsage {
        session: SessionId,
    },
    SnapshotExclusiveSize {
        session: SessionId,
        snapshot: SnapshotId,
    },
    JoinSessionNetwork {
        sandbox: SandboxId,
        session: SessionId,
    },
    ReattachGateway {
        handle: SandboxHandle,
        session: SessionId,
    },
    SetSessionEgress {
        session: SessionId,
        egress: SessionEgress,
    },
    ForgetSessionEgress {
        session: SessionId,
    },
    SessionTraffic {
        session: SessionId,
    },
    ExportTemplate {
        name: String,
        version: u64,
    },
    ImportTemplateExport {
        export: TemplateExport,
    },
    /// Removes a file [`paths::STAGE`] received (see [`StageAnswer::Staged`]).
    Unstage {
        path: PathBuf,
    },
}

/// A template operation, answered with its progress as it goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TemplateCall {
    Ensure {
        name: String,
    },
    /// `source` is on the node's host.
    Import {
        name: String,
        source: TemplateSource,
    },
    /// A Dockerfile build; its context is on the node's host.
    Build {
        name: String,
        build: TemplateBuild,
    },
}

/// One line of a template operation's answer: progress, then exactly one `done`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateLine {
    Progress(Progress),
    /// A line of a build's log.
    Log(String),
    Done(Result<TemplateInfo, NodeFailure>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentCall {
    pub sandbox: SandboxId,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortCall {
    pub sandbox: SandboxId,
    pub port: u16,
}

/// A file sent to the node for its template work (an upload, a build's context): exactly
/// `len` bytes follow on the upgraded connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageCall {
    pub len: u64,
}

/// What the node says once a [`StageCall`]'s bytes have arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum StageAnswer {
    /// Kept at `path` on the node's host; `sha256` is what the node received.
    Staged {
        path: PathBuf,
        sha256: String,
    },
    Failed {
        message: String,
    },
}

/// A [`NodeError`] on the wire: its class, and its whole chain of causes as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeFailure {
    UnknownTemplate { name: String, available: String },
    CheckpointUnavailable { reason: String },
    RuntimeUnavailable { runtime: RuntimeKind, reason: String },
    OutOfSpace { which: OutOfSpace, message: String },
    Port { failure: PortFailure, message: String },
    NoBlobStore,
    Corrupt { message: String },
    BuildFailed { message: String },
    Failed { message: String },
}

/// The node's error, as the control plane receives it: the text of what went wrong there.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RemoteError(pub String);

impl From<&NodeError> for NodeFailure {
    fn from(error: &NodeError) -> NodeFailure {
        match error {
            NodeError::UnknownTemplate { name, available } => {
                NodeFailure::UnknownTemplate { name: name.clone(), available: available.clone() }
            }
            NodeError::CheckpointUnavailable(reason) => NodeFailure::CheckpointUnavailable { reason: reason.clone() },
            NodeError::RuntimeUnavailable { runtime, reason } => {
                NodeFailure::RuntimeUnavailable { runtime: *runtime, reason: reason.clone() }
            }
            NodeError::OutOfSpace { which, source } => {
                NodeFailure::OutOfSpace { which: *which, message: chain(&**source) }
            }
            NodeError::Port { failure, source } => NodeFailure::Port { failure: *failure, message: chain(&**source) },
            NodeError::NoBlobStore => NodeFailure::NoBlobStore,
            NodeError::Corrupt(message) => NodeFailure::Corrupt { message: message.clone() },
            NodeError::BuildFailed(message) => NodeFailure::BuildFailed { message: message.clone() },
            NodeError::Failed(source) => NodeFailure::Failed { message: chain(&**source) },
        }
    }
}

impl From<NodeFailure> for NodeError {
    fn from(failure: NodeFailure) -> NodeError {
        let remote = |message| Box::new(RemoteError(message));
        match failure {
            NodeFailure::UnknownTemplate { name, available } => NodeError::UnknownTemplate { name, available },
            NodeFailure::CheckpointUnavailable { reason } => NodeError::CheckpointUnavailable(reason),
            NodeFailure::RuntimeUnavailable { runtime, reason } => NodeError::RuntimeUnavailable { runtime, reason },
            NodeFailure::OutOfSpace { which, message } => NodeError::OutOfSpace { which, source: remote(message) },
            NodeFailure::Port { failure, message } => NodeError::Port { failure, source: remote(message) },
            NodeFailure::NoBlobStore => NodeError::NoBlobStore,
            NodeFailure::Corrupt { message } => NodeError::Corrupt(message),
            NodeFailure::BuildFailed { message } => NodeError::BuildFailed(message),
            NodeFailure::Failed { message } => NodeError::Failed(remote(message)),
        }
    }
}

/// `error` and its sources, joined as `a: b: c`.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each class of failure comes back as the class it left as, with its causes' text.
    #[test]
    fn failures_keep_their_class_and_causes() {
        let io = std::io::Error::other("disk on fire");
        let nested = NodeError::Failed(Box::new(Wrapped { context: "rebuilding the root".into(), source: io }));
        let failure = NodeFailure::from(&nested);
        assert_eq!(failure, NodeFailure::Failed { message: "rebuilding the root: disk on fire".into() });
        let back = NodeError::from(failure);
        assert_eq!(back.to_string(), "rebuilding the root: disk on fire");

        let full =
            NodeError::OutOfSpace { which: OutOfSpace::Quota, source: Box::new(std::io::Error::other("EDQUOT")) };
        let back = NodeError::from(NodeFailure::from(&full));
        assert!(matches!(back, NodeError::OutOfSpace { which: OutOfSpace::Quota, .. }), "{back:?}");

        let port =
            NodeError::Port { failure: PortFailure::Reserved, source: Box::new(std::io::Error::other("gateway's")) };
        let back = NodeError::from(NodeFailure::from(&port));
        assert!(matches!(back, NodeError::Port { failure: PortFailure::Reserved, .. }), "{back:?}");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{context}")]
    struct Wrapped {
        context: String,
        source: std::io::Error,
    }
}
