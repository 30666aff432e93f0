//! Types shared by the API server, the CLI and the node: typed ids, request and response
//! bodies, and the error envelope.

pub mod durable;
pub mod egress;
pub mod error;
pub mod idmap;
pub mod ids;
pub mod lifetime;
pub mod node;
pub mod nodes;
pub mod policy;
pub mod ports;
pub mod runtime;
pub mod tenancy;
pub mod types;

pub use error::{ApiError, ErrorBody, ErrorCode};
pub use idmap::IdMap;
pub use ids::{
    CredentialId, IdError, KeyId, NodeId, OperationId, SandboxId, SessionId, SnapshotId, TenantId, TenantKeyId,
};
pub use lifetime::{MaxAgeAction, SessionLifetime};
pub use node::{BUILD_CONTEXT_PRIVATE_DIR, TemplateBuild, TemplateInfo, TemplateSource};
pub use nodes::{DrainFailure, DrainReport, Node, NodeCapacity, NodeList, NodeState};
pub use policy::{Retention, RetentionTier, SnapshotPolicy};
pub use ports::{OpenPortRequest, PortAccess, PortList};
pub use runtime::{RuntimeKind, RuntimeSupport};
pub use tenancy::*;
pub use types::*;
