//! The nodes of a control plane, as `GET /v1/nodes` shows them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::TemplatePool;

/// What a node has to run sandboxes with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeCapacity {
    /// CPUs of the node's host.
    pub cpus: u32,
    /// Memory of the node's host, in MiB.
    pub memory_mib: u64,
}

/// Whether a node is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Its lease holds: it sent a heartbeat within the lease period.
    Ready,
    /// Its lease ran out: no heartbeat for longer than the lease period.
    Lost,
}

/// A node and what it said of itself in its last heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub id: String,
    pub state: NodeState,
    /// Where the control plane reaches it; absent for the node in the control plane's own
    /// process (`space serve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The `space` version it runs.
    pub version: String,
    pub capacity: NodeCapacity,
    /// Sessions (not destroyed) whose sandbox is on it.
    pub sessions: u64,
    /// Its warm pool, per template and runtime.
    pub pool: Vec<TemplatePool>,
    /// Takes no new sessions (`space node cordon`); resumes and forks from durable snapshots
    /// kept on it start on another node.
    #[serde(default)]
    pub cordoned: bool,
    /// Unix times in milliseconds: when it first joined, its last heartbeat, and when its
    /// lease runs out unless it beats again.
    pub joined_at: i64,
    pub heartbeat_at: i64,
    pub lease_expires_at: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<Node>,
}

/// A session a drain could not move off its node, and why (it is where it was, or suspended
/// with its processes in a durable snapshot).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DrainFailure {
    pub session: crate::SessionId,
    pub code: crate::ErrorCode,
    pub message: String,
}

/// What `POST /v1/nodes/{id}/drain` did: the node is cordoned, every session in `moved` runs
/// (or is paused) on another node now, every one in `durable` is suspended with its newest
/// full snapshot in the blob store (it resumes on another node), and the ones in `failed`
/// are still on the node. A drain can be repeated: it moves what is left.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DrainReport {
    pub node: Node,
    pub moved: Vec<crate::SessionId>,
    pub durable: Vec<crate::SessionId>,
    pub failed: Vec<DrainFailure>,
}
