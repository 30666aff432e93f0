//! The node API ([`NodeApi`]) of the in-process node, as `space serve` uses it: each
//! operation is the node's own method, with the node's errors sorted into the classes the
//! control plane tells apart.

use space_api::{TemplateBuild, TemplateSource};
use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use space_api::egress::AuditEvent;
use space_api::{PoolStatus, RuntimeKind, RuntimeSupport, SandboxId, SessionId, SnapshotId};
use space_gateway::SessionEgress;
use space_node_api::{self as api, DiskQuota, EgressControl, LogFn, NodeApi, ProgressFn};
use space_proto::client::AgentClient;
use space_runtime::{Limits, RuntimeError, SandboxHandle};
use space_storage::TemplateInfo;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::ports::PortError;
use crate::{Node, NodeError, hostname_for};

impl From<NodeError> for api::NodeError {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::UnknownTemplate { name, available } => api::NodeError::UnknownTemplate { name, available },
            NodeError::Runtime(RuntimeError::CheckpointUnavailable(why)) => api::NodeError::CheckpointUnavailable(why),
            // A VM's sealed state that does not open with its key, found as QEMU reads it.
            NodeError::Runtime(RuntimeError::Corrupt(why)) => api::NodeError::Corrupt(why),
            NodeError::RuntimeUnavailable { runtime, reason } => api::NodeError::RuntimeUnavailable { runtime, reason },
            NodeError::Port(e) => {
                let failure = match e {
                    PortError::Reserved { .. } | PortError::Zero => api::PortFailure::Reserved,
                    PortError::NotListening { .. } | PortError::Timeout { .. } => api::PortFailure::Unreachable,
                };
                api::NodeError::Port { failure, source: Box::new(e) }
            }
            NodeError::NoBlobStore => api::NodeError::NoBlobStore,
            NodeError::Build(e) => api::NodeError::BuildFailed(e.to_string()),
            // An object that is not what its export recorded, is gone, or is named by no hash:
            // that export cannot be restored from, whatever is retried.
            NodeError::Volume(space_volume::VolumeError::Blob(
                bad @ (space_blob::BlobError::Corrupt { .. }
                | space_blob::BlobError::Missing { .. }
                | space_blob::BlobError::BadRef { .. }),
            )) => api::NodeError::Corrupt(bad.to_string()),
            // An object that does not decrypt whole with the export's key: altered, or not
            // that snapshot's.
            NodeError::Volume(space_volume::VolumeError::Key(bad @ space_volume::KeyError::Corrupt { .. })) => {
                api::NodeError::Corrupt(format!("an encrypted object does not open with the snapshot's key: {bad}"))
            }
            // A chain that names a parent nobody gave: the control plane lost a link.
            NodeError::Volume(bad @ space_volume::VolumeError::MissingParent { .. }) => {
                api::NodeError::Corrupt(bad.to_string())
            }
            // An ancestor's failure is classed as the ancestor's own, and names it.
            NodeError::Volume(space_volume::VolumeError::Ancestor { snapshot, source }) => {
                match api::NodeError::from(NodeError::Volume(*source)) {
                    api::NodeError::Corrupt(why) => api::NodeError::Corrupt(format!(
                        "snapshot {snapshot}, whose root this one was sent against: {why}"
                    )),
                    other => other,
                }
            }
            other => match other.out_of_space() {
                Some(which) => api::NodeError::OutOfSpace { which, source: Box::new(other) },
                None => api::NodeError::Failed(Box::new(other)),
            },
        }
    }
}

type Result<T> = api::Result<T>;

/// Thaws (each followed by a bounded connection attempt) before a resume gives up.
const RESUME_ATTEMPTS: u32 = 3;

#[async_trait]
impl EgressControl for Node {
    async fn set_session_egress(&self, session: &SessionId, egress: SessionEgress) -> Result<()> {
        self.gateway.set_session(session, egress);
        Ok(())
    }

    async fn forget_session_egress(&self, session: &SessionId) -> Result<()> {
        self.gateway.forget_session(session);
        Ok(())
    }

    async fn session_traffic(&self, session: &SessionId) -> Option<space_gateway::SessionTraffic> {
        self.gateway.session_traffic(session)
    }
}

#[async_trait]
impl NodeApi for Node {
    fn start_background(self: Arc<Self>) {
        Node::start_background(&self);
    }

    async fn templates(&self) -> Vec<TemplateInfo> {
        Node::templates(self)
    }

    async fn resolve_template(&self, name: &str) -> Option<TemplateInfo> {
        Node::resolve_template(self, name)
    }

    fn builtin_templates(&self) -> Vec<String> {
        self.builtin_names().iter().map(|s| s.to_string()).collect()
    }

    async fn ensure_template(&self, name: &str, report: ProgressFn) -> Result<TemplateInfo> {
        Ok(Node::ensure_template(self, name, report).await?)
    }

    async fn import_template(&self, name: &str, source: &TemplateSource, report: ProgressFn) -> Result<TemplateInfo> {
        Ok(Node::import_template(self, name, source, report).await?)
    }

    async fn build_template(
        &self,
        name: &str,
        build: &TemplateBuild,
        report: ProgressFn,
        log: LogFn,
    ) -> Result<TemplateInfo> {
        Ok(Node::build_template(self, name, build, report, log).await?)
    }

    async fn delete_template(&self, name: &str, version: u64) -> Result<bool> {
        Ok(Node::delete_template(self, name, version).await?)
    }

    fn node_id(&self) -> String {
        self.config.id.clone()
    }

    fn runtimes(&self) -> Vec<RuntimeSupport> {
        Node::runtimes(self)
    }

    async fn bind_pod(
        self: Arc<Self>,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
    ) -> Option<SandboxHandle> {
        Node::bind_pod(&self, template, runtime, limits)
    }

    async fn set_pool_size(self: Arc<Self>, template: &str, runtime: RuntimeKind, size: u32) {
        Node::set_pool_size(&self, template, runtime, size)
    }

    async fn pool_status(&self) -> PoolStatus {
        Node::pool_status(self)
    }

    async fn capacity(&self) -> Result<space_api::NodeCapacity> {
        Ok(host_capacity())
    }

    async fn start_sandbox(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
    ) -> Result<SandboxHandle> {
        Ok(Node::start_sandbox(self, id, template, runtime, limits, &hostname_for(id), Some(disk)).await?)
    }

    async fn start_sandbox_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
        key: Option<&api::SnapshotKey>,
    ) -> Result<SandboxHandle> {
        let started = match self.snapshot_is_full(session, snapshot) {
            true => self.restore_sandbox(id, session, snapshot, runtime, limits, disk, key).await,
            false => Node::start_sandbox_from_snapshot(self, id, session, snapshot, runtime, limits, disk).await,
        };
        Ok(started?)
    }

    async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()> {
        Ok(Node::destroy_sandbox(self, id).await?)
    }

    async fn pause_sandbox(&self, id: &SandboxId) -> Result<()> {
        Ok(Node::pause_sandbox(self, id).await?)
    }

    async fn resume_sandbox(&self, id: &SandboxId) -> Result<()> {
        // A dump that a killed server left running puts the freezer back as it found it,
        // frozen, when it ends; one killed in the instant after it started is not recorded
        // for the next start to wait for. So: thaw, and thaw again while the agent does not
        // answer.
        let mut attempt = 1;
        loop {
            Node::resume_sandbox(self, id).await?;
            match self.agent(id).await {
                Ok(_) => return Ok(()),
                Err(e) if attempt == RESUME_ATTEMPTS => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "the agent did not answer after a thaw; thawing again")
                }
            }
            attempt += 1;
        }
    }

    async fn adopt(&self, id: &SandboxId, pid: u32) -> Option<SandboxHandle> {
        Node::adopt(self, id, pid)
    }

    async fn wait_exit(&self, handle: &SandboxHandle) {
        Node::wait_exit(self, handle).await
    }

    async fn exit_reason(&self, id: &SandboxId) -> Option<String> {
        Node::exit_reason(self, id)
    }

    async fn oom_kills(&self, id: &SandboxId) -> Result<u64> {
        Ok(Node::oom_kills(self, id)?)
    }

    async fn sandbox_stats(&self, id: &SandboxId) -> Result<api::SandboxStats> {
        Ok(Node::stats(self, id)?)
    }

    async fn limit_disk(&self, sandbox: &SandboxId, disk: &DiskQuota) -> Result<()> {
        Ok(Node::limit_disk(self, sandbox, disk).await?)
    }

    async fn disk_usage(&self, session: &SessionId) -> Result<api::DiskUsage> {
        Ok(Node::disk_usage(self, session)?)
    }

    async fn snapshot_exclusive_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        Ok(Node::snapshot_exclusive_size(self, session, snapshot).await?)
    }

    async fn sweep(&self, keep: &HashSet<SandboxId>) -> Result<Vec<SandboxId>> {
        Ok(Node::sweep(self, keep).await?)
    }

    async fn agent(&self, id: &SandboxId) -> Result<AgentClient> {
        Ok(Node::agent(self, id).await?)
    }

    fn checkpoint_support(&self, runtime: RuntimeKind) -> std::result::Result<String, String> {
        Node::checkpoint_support(self, runtime)
    }

    async fn snapshot_disk(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
    ) -> Result<()> {
        Ok(Node::snapshot_disk(self, sandbox, session, snapshot, already_paused).await?)
    }

    async fn snapshot_full(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
        key: Option<&api::SnapshotKey>,
    ) -> Result<u64> {
        Ok(Node::snapshot_full(self, sandbox, session, snapshot, already_paused, key).await?)
    }

    async fn snapshot_disk_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        Ok(Node::snapshot_disk_size(self, session, snapshot).await?)
    }

    async fn delete_snapshot(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<()> {
        Ok(Node::delete_snapshot(self, session, snapshot).await?)
    }

    async fn sweep_snapshots(&self, keep: &HashSet<SnapshotId>) -> Result<usize> {
        Ok(Node::sweep_snapshots(self, keep).await?)
    }

    async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&api::SnapshotKey>,
    ) -> Result<api::SnapshotExport> {
        Ok(Node::export_snapshot(self, session, snapshot, parent, key).await?)
    }

    async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &api::SnapshotExport,
        key: Option<&api::SnapshotKey>,
        parents: &[api::ParentDisk],
    ) -> Result<()> {
        Ok(Node::import_snapshot(self, session, snapshot, export, key, parents).await?)
    }

    async fn export_template(&self, name: &str, version: u64) -> Result<api::TemplateExport> {
        Ok(Node::export_template(self, name, version).await?)
    }

    async fn import_template_export(&self, export: &api::TemplateExport) -> Result<api::TemplateInfo> {
        Ok(Node::import_template_export(self, export).await?)
    }

    async fn sweep_blobs(
        &self,
        keep: &HashSet<String>,
        min_age: std::time::Duration,
        budget: std::time::Duration,
    ) -> Result<api::BlobSweep> {
        Ok(Node::sweep_blobs(self, keep, min_age, budget).await?)
    }

    async fn join_session_network(&self, sandbox: &SandboxId, session: &SessionId) -> Result<()> {
        Ok(Node::join_session_network(self, sandbox, session).await?)
    }

    async fn reattach_gateway(&self, handle: &SandboxHandle, session: &SessionId) -> Result<()> {
        Ok(Node::reattach_gateway(self, handle, session).await?)
    }

    fn take_audit_events(&self) -> Option<UnboundedReceiver<AuditEvent>> {
        Node::take_audit_events(self)
    }

    async fn connect_port(&self, sandbox: &SandboxId, port: u16) -> Result<api::PortStream> {
        Ok(Box::new(Node::connect_port(self, sandbox, port).await?))
    }
}

/// The host's CPUs and memory (`MemTotal`).
fn host_capacity() -> space_api::NodeCapacity {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    space_api::NodeCapacity { cpus, memory_mib: kib / 1024 }
}
