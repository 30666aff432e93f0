//! The node API's wire form: how a control plane reaches a node over the network.
//!
//! HTTP/1.1 over TLS, authenticated both ways by one cluster certificate authority
//! ([`cluster`]): a node presents a certificate for server authentication only, a control
//! replica one for client authentication only, so neither can stand in for the other. Every
//! request and answer carries the node API version ([`NODE_API_VERSION`]) in the
//! [`VERSION_HEADER`]; a peer speaking another version is refused with both versions named
//! (docs/operator-guide.md, "A cluster").
//!
//! [`serve`] answers for any [`space_node_api::NodeApi`]; [`NodeClient`] is the control
//! plane's end.

mod client;
pub mod clock;
pub mod cluster;
mod error;
pub mod ops;
mod remote;
mod server;
pub mod tls;

use serde::{Deserialize, Serialize};
use space_api::{NodeCapacity, RuntimeKind, RuntimeSupport};

pub use client::NodeClient;
pub use error::WireError;
pub use remote::RemoteNode;
pub use server::serve;

/// The version of the node API this build speaks. Raised whenever an operation or a type on
/// the wire changes in a way the previous version would misread.
pub const NODE_API_VERSION: u32 = 8;

/// The header carrying the sender's node API version, on requests and answers alike.
pub const VERSION_HEADER: &str = "space-node-api";

/// What a node says of itself when a control plane connects: the things that cannot change
/// while it runs, and its capacity now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's id (its certificate's name).
    pub id: String,
    /// The node's `space` release.
    pub version: String,
    pub api_version: u32,
    pub runtimes: Vec<RuntimeSupport>,
    pub builtin_templates: Vec<String>,
    pub checkpoints: Vec<CheckpointSupport>,
    pub capacity: NodeCapacity,
    /// The node's clock when it answered, in milliseconds since the Unix epoch (absent from
    /// releases before it was checked).
    #[serde(default)]
    pub now_ms: Option<i64>,
    /// Names the node's process: another after every start (absent from releases before it
    /// was asked for).
    #[serde(default)]
    pub incarnation: Option<String>,
}

/// Whether a runtime's sandboxes can take full snapshots on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSupport {
    pub runtime: RuntimeKind,
    /// The checkpoint tool, or why there is none.
    pub support: Result<String, String>,
}

/// The body of every refusal: a stable code and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: String,
    pub message: String,
}

/// Refusal codes.
pub mod codes {
    pub const VERSION_MISMATCH: &str = "node_api_version_mismatch";
    pub const UNKNOWN_OPERATION: &str = "unknown_operation";
    /// The body is not the operation the path takes.
    pub const BAD_REQUEST: &str = "bad_request";
    /// Another reader holds the node's audit events.
    pub const AUDIT_TAKEN: &str = "audit_events_taken";
    /// The operation needs an upgraded connection the request did not ask for.
    pub const UPGRADE_REQUIRED: &str = "upgrade_required";
}
