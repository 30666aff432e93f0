//! [`RemoteNode`]: the node API's network implementation, what a control plane holds for a
//! node it reaches over the wire.
//!
//! The operations the trait declares infallible (they ask the node about its state) cannot
//! report that the network failed. Each answers then as a node that knows nothing would, and
//! logs why: no templates, no ready pod (the create starts cold and meets the failure
//! itself), no traffic. Two are retried instead, because the cautious answer would do harm:
//! [`NodeApi::wait_exit`] (it would declare a running sandbox dead) and [`NodeApi::adopt`]
//! (for as long as `space control` waits for its node at start; then the sandbox is treated
//! as gone, as the in-process node's would be after a reboot).

use space_api::{TemplateBuild, TemplateSource};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use space_api::durable::BlobSweep;
use space_api::egress::AuditEvent;
use space_api::{PoolStatus, RuntimeKind, RuntimeSupport, SandboxId, SessionId, SnapshotId};
use space_gateway::{SessionEgress, SessionTraffic};
use space_node_api::{
    DiskQuota, DiskUsage, EgressControl, Limits, LogFn, NodeApi, NodeError, ParentDisk, PortStream, ProgressFn, Result,
    SandboxHandle, SandboxStats, SnapshotExport, SnapshotKey, TemplateInfo,
};
use space_proto::client::AgentClient;
use tokio::sync::Mutex;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::client::Lines;
use crate::ops::{AgentCall, Call, PortCall, RemoteError, TemplateCall, TemplateLine, paths};
use crate::{NodeClient, NodeInfo, WireError};

/// How long to wait before asking again after the network failed.
const RETRY: Duration = Duration::from_secs(1);
/// How long [`NodeApi::adopt`] keeps asking a node that does not answer before the sandbox
/// counts as gone (as long as `space control` waits for its node at start).
const ADOPT_PATIENCE: Duration = Duration::from_secs(120);
/// How long making an agent connection (upgrade and handshake) may take.
const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A node reached over the network.
pub struct RemoteNode {
    client: Arc<NodeClient>,
    /// What the node said of itself when we connected: what cannot change while it runs.
    info: NodeInfo,
    /// One agent connection per sandbox, made again once it ends.
    agents: Mutex<HashMap<SandboxId, AgentClient>>,
    audit_taken: AtomicBool,
}

impl RemoteNode {
    /// Connects to the node `client` reaches and learns what it is.
    pub async fn connect(client: NodeClient) -> Result<Arc<RemoteNode>, WireError> {
        let before = crate::clock::now_ms();
        let info = client.info().await?;
        crate::clock::check(info.now_ms, before, crate::clock::now_ms())?;
        Ok(Arc::new(RemoteNode {
            client: Arc::new(client),
            info,
            agents: Mutex::new(HashMap::new()),
            audit_taken: AtomicBool::new(false),
        }))
    }

    /// What the node said of itself when it was connected to.
    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    async fn call<T: DeserializeOwned>(&self, call: &Call) -> Result<T> {
        self.client.post(paths::CALL, call).await.map_err(node_error)
    }

    /// `call`'s answer, or `fallback` (logged) when there is none.
    async fn ask<T: DeserializeOwned>(&self, call: &Call, fallback: T) -> T {
        self.call(call).await.unwrap_or_else(|e| {
            tracing::warn!(node = %self.client.address(), error = %e, "a node did not answer; assuming nothing");
            fallback
        })
    }

    /// Lets go of the agent connection of `id`: the node closes its own (a checkpoint, a
    /// pause) and ours would be found dead only once the relay's end reached us.
    async fn drop_agent(&self, id: &SandboxId) {
        if let Some(agent) = self.agents.lock().await.remove(id) {
            agent.close();
        }
    }

    async fn template(&self, call: TemplateCall, report: ProgressFn, log: Option<LogFn>) -> Result<TemplateInfo> {
        let body = self.client.open(hyper::Method::POST, paths::TEMPLATE, &call).await.map_err(node_error)?;
        let mut lines = Lines::new(body);
        while let Some(line) = lines.next::<TemplateLine>().await.map_err(node_error)? {
            match line {
                TemplateLine::Progress(progress) => report(progress),
                TemplateLine::Log(line) => {
                    if let Some(log) = &log {
                        log(line);
                    }
                }
                TemplateLine::Done(outcome) => return outcome.map_err(NodeError::from),
            }
        }
        Err(NodeError::Failed(Box::new(RemoteError("the node ended the template work without its outcome".into()))))
    }
}

/// The [`NodeError`] a call's failure stands for: the node's own, or the network's.
fn node_error(error: WireError) -> NodeError {
    match error {
        WireError::Failed(failure) => failure.into(),
        other => NodeError::Failed(Box::new(other)),
    }
}

/// Reads the node's audit events into `events` for as long as someone holds the receiver,
/// reconnecting when the stream ends (the node keeps what it could not send meanwhile).
async fn relay_audit(client: Arc<NodeClient>, events: UnboundedSender<AuditEvent>) {
    while !events.is_closed() {
        match client.open(hyper::Method::GET, paths::AUDIT, &()).await {
            Ok(body) => {
                let mut lines = Lines::new(body);
                while let Ok(Some(event)) = lines.next::<AuditEvent>().await {
                    if events.send(event).is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::warn!(node = %client.address(), error = %e, "cannot read a node's audit events"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[async_trait]
impl EgressControl for RemoteNode {
    async fn set_session_egress(&self, session: &SessionId, egress: SessionEgress) -> Result<()> {
        self.call(&Call::SetSessionEgress { session: session.clone(), egress }).await
    }

    async fn forget_session_egress(&self, session: &SessionId) -> Result<()> {
        self.call(&Call::ForgetSessionEgress { session: session.clone() }).await
    }

    async fn session_traffic(&self, session: &SessionId) -> Option<SessionTraffic> {
        self.ask(&Call::SessionTraffic { session: session.clone() }, None).await
    }
}

#[async_trait]
impl NodeApi for RemoteNode {
    fn start_background(self: Arc<Self>) {
        tokio::spawn(async move {
            if let Err(e) = self.call::<()>(&Call::StartBackground).await {
                tracing::warn!(node = %self.client.address(), error = %e, "cannot start a node's background work");
            }
        });
    }

    fn node_id(&self) -> String {
        self.info.id.clone()
    }

    async fn incarnation(&self) -> Result<String> {
        let info = self.client.info().await.map_err(node_error)?;
        Ok(info.incarnation.unwrap_or_default())
    }

    async fn templates(&self) -> Vec<TemplateInfo> {
        self.ask(&Call::Templates, Vec::new()).await
    }

    async fn resolve_template(&self, name: &str) -> Option<TemplateInfo> {
        self.ask(&Call::ResolveTemplate { name: name.into() }, None).await
    }

    fn builtin_templates(&self) -> Vec<String> {
        self.info.builtin_templates.clone()
    }

    async fn ensure_template(&self, name: &str, report: ProgressFn) -> Result<TemplateInfo> {
        // What the node answers at once when the template is built (as on every create):
        // asked over a kept connection, where the streamed form needs a new one.
        if let Ok(Some(built)) = self.call(&Call::ResolveTemplate { name: name.into() }).await {
            return Ok(built);
        }
        self.template(TemplateCall::Ensure { name: name.into() }, report, None).await
    }

    async fn import_template(&self, name: &str, source: &TemplateSource, report: ProgressFn) -> Result<TemplateInfo> {
        self.template(TemplateCall::Import { name: name.into(), source: source.clone() }, report, None).await
    }

    async fn build_template(
        &self,
        name: &str,
        build: &TemplateBuild,
        report: ProgressFn,
        log: LogFn,
    ) -> Result<TemplateInfo> {
        self.template(TemplateCall::Build { name: name.into(), build: build.clone() }, report, Some(log)).await
    }

    async fn delete_template(&self, name: &str, version: u64) -> Result<bool> {
        self.call(&Call::DeleteTemplate { name: name.into(), version }).await
    }

    async fn export_template(&self, name: &str, version: u64) -> Result<space_node_api::TemplateExport> {
        self.call(&Call::ExportTemplate { name: name.into(), version }).await
    }

    async fn import_template_export(&self, export: &space_node_api::TemplateExport) -> Result<TemplateInfo> {
        self.call(&Call::ImportTemplateExport { export: export.clone() }).await
    }

    async fn stage_file(&self, file: &std::path::Path) -> Result<std::path::PathBuf> {
        self.client.stage(file).await.map_err(node_error)
    }

    async fn unstage_file(&self, staged: &std::path::Path) -> Result<()> {
        self.call(&Call::Unstage { path: staged.to_owned() }).await
    }

    async fn capacity(&self) -> Result<space_api::NodeCapacity> {
        self.call(&Call::Capacity).await
    }

    fn runtimes(&self) -> Vec<RuntimeSupport> {
        self.info.runtimes.clone()
    }

    async fn bind_pod(
        self: Arc<Self>,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
    ) -> Option<SandboxHandle> {
        self.ask(&Call::BindPod { template: template.clone(), runtime, limits }, None).await
    }

    async fn set_pool_size(self: Arc<Self>, template: &str, runtime: RuntimeKind, size: u32) {
        self.ask(&Call::SetPoolSize { template: template.into(), runtime, size }, ()).await
    }

    async fn pool_status(&self) -> PoolStatus {
        self.ask(&Call::PoolStatus, PoolStatus::default()).await
    }

    async fn start_sandbox(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
    ) -> Result<SandboxHandle> {
        let call =
            Call::StartSandbox { id: id.clone(), template: template.clone(), runtime, limits, disk: disk.clone() };
        self.call(&call).await
    }

    async fn start_sandbox_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
        key: Option<&SnapshotKey>,
    ) -> Result<SandboxHandle> {
        let call = Call::StartSandboxFromSnapshot {
            id: id.clone(),
            session: session.clone(),
            snapshot: snapshot.clone(),
            runtime,
            limits,
            disk: disk.clone(),
            key: key.cloned(),
        };
        self.call(&call).await
    }

    async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.drop_agent(id).await;
        self.call(&Call::DestroySandbox { id: id.clone() }).await
    }

    async fn pause_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.call(&Call::PauseSandbox { id: id.clone() }).await
    }

    async fn resume_sandbox(&self, id: &SandboxId) -> Result<()> {
        let resumed = self.call(&Call::ResumeSandbox { id: id.clone() }).await;
        // The node made its connection to the agent again: ours is made again too.
        self.drop_agent(id).await;
        resumed
    }

    async fn adopt(&self, id: &SandboxId, pid: u32) -> Option<SandboxHandle> {
        let call = Call::Adopt { id: id.clone(), pid };
        let deadline = tokio::time::Instant::now() + ADOPT_PATIENCE;
        loop {
            match self.call(&call).await {
                Ok(handle) => return handle,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(%id, error = %e, "cannot ask a node whether a sandbox still runs; asking again");
                }
                Err(e) => {
                    tracing::error!(%id, error = %e, "a node did not say whether a sandbox still runs; taking it for gone");
                    return None;
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn wait_exit(&self, handle: &SandboxHandle) {
        let call = Call::WaitExit { handle: handle.clone() };
        while let Err(e) = self.call::<()>(&call).await {
            tracing::debug!(sandbox = %handle.id, error = %e, "lost the wait for a sandbox's exit; waiting again");
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn exit_reason(&self, id: &SandboxId) -> Option<String> {
        self.ask(&Call::ExitReason { id: id.clone() }, None).await
    }

    async fn oom_kills(&self, id: &SandboxId) -> Result<u64> {
        self.call(&Call::OomKills { id: id.clone() }).await
    }

    async fn sandbox_stats(&self, id: &SandboxId) -> Result<SandboxStats> {
        self.call(&Call::SandboxStats { id: id.clone() }).await
    }

    async fn sweep(&self, keep: &HashSet<SandboxId>) -> Result<Vec<SandboxId>> {
        self.call(&Call::Sweep { keep: keep.iter().cloned().collect() }).await
    }

    async fn agent(&self, id: &SandboxId) -> Result<AgentClient> {
        if let Some(agent) = self.agents.lock().await.get(id).filter(|a| !a.is_closed()) {
            return Ok(agent.clone());
        }
        let connect = async {
            let io = self.client.upgrade(paths::AGENT, &AgentCall { sandbox: id.clone() }).await.map_err(node_error)?;
            AgentClient::connect(io).await.map_err(|e| NodeError::Failed(Box::new(e)))
        };
        let agent = tokio::time::timeout(AGENT_CONNECT_TIMEOUT, connect).await.map_err(|_| {
            NodeError::Failed(Box::new(RemoteError(format!("the node's agent connection to {id} did not open"))))
        })??;
        self.agents.lock().await.insert(id.clone(), agent.clone());
        Ok(agent)
    }

    fn checkpoint_support(&self, runtime: RuntimeKind) -> std::result::Result<String, String> {
        let support = self.info.checkpoints.iter().find(|c| c.runtime == runtime);
        support.map_or_else(|| Err("the node did not say".into()), |c| c.support.clone())
    }

    async fn snapshot_disk(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
    ) -> Result<()> {
        self.drop_agent(sandbox).await;
        let call = Call::SnapshotDisk {
            sandbox: sandbox.clone(),
            session: session.clone(),
            snapshot: snapshot.clone(),
            already_paused,
        };
        self.call(&call).await
    }

    async fn snapshot_full(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
        key: Option<&SnapshotKey>,
    ) -> Result<u64> {
        self.drop_agent(sandbox).await;
        let call = Call::SnapshotFull {
            sandbox: sandbox.clone(),
            session: session.clone(),
            snapshot: snapshot.clone(),
            already_paused,
            key: key.cloned(),
        };
        self.call(&call).await
    }

    async fn snapshot_disk_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        self.call(&Call::SnapshotDiskSize { session: session.clone(), snapshot: snapshot.clone() }).await
    }

    async fn delete_snapshot(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<()> {
        self.call(&Call::DeleteSnapshot { session: session.clone(), snapshot: snapshot.clone() }).await
    }

    async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<SnapshotExport> {
        let (session, snapshot, parent, key) = (session.clone(), snapshot.clone(), parent.cloned(), key.cloned());
        self.call(&Call::ExportSnapshot { session, snapshot, parent, key }).await
    }

    async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
        parents: &[ParentDisk],
    ) -> Result<()> {
        let call = Call::ImportSnapshot {
            session: session.clone(),
            snapshot: snapshot.clone(),
            export: export.clone(),
            key: key.cloned(),
            parents: parents.to_vec(),
        };
        self.call(&call).await
    }

    async fn sweep_blobs(&self, keep: &HashSet<String>, min_age: Duration, budget: Duration) -> Result<BlobSweep> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (min_age_ms, budget_ms) = (ms(min_age), ms(budget));
        self.call(&Call::SweepBlobs { keep: keep.iter().cloned().collect(), min_age_ms, budget_ms }).await
    }

    async fn sweep_snapshots(&self, keep: &HashSet<SnapshotId>) -> Result<usize> {
        self.call(&Call::SweepSnapshots { keep: keep.iter().cloned().collect() }).await
    }

    async fn limit_disk(&self, sandbox: &SandboxId, disk: &DiskQuota) -> Result<()> {
        self.call(&Call::LimitDisk { sandbox: sandbox.clone(), disk: disk.clone() }).await
    }

    async fn disk_usage(&self, session: &SessionId) -> Result<DiskUsage> {
        self.call(&Call::DiskUsage { session: session.clone() }).await
    }

    async fn snapshot_exclusive_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        self.call(&Call::SnapshotExclusiveSize { session: session.clone(), snapshot: snapshot.clone() }).await
    }

    async fn join_session_network(&self, sandbox: &SandboxId, session: &SessionId) -> Result<()> {
        self.call(&Call::JoinSessionNetwork { sandbox: sandbox.clone(), session: session.clone() }).await
    }

    async fn reattach_gateway(&self, handle: &SandboxHandle, session: &SessionId) -> Result<()> {
        self.call(&Call::ReattachGateway { handle: handle.clone(), session: session.clone() }).await
    }

    fn take_audit_events(&self) -> Option<UnboundedReceiver<AuditEvent>> {
        if self.audit_taken.swap(true, Ordering::SeqCst) {
            return None;
        }
        let (tx, rx) = unbounded_channel();
        tokio::spawn(relay_audit(self.client.clone(), tx));
        Some(rx)
    }

    async fn connect_port(&self, sandbox: &SandboxId, port: u16) -> Result<PortStream> {
        let call = PortCall { sandbox: sandbox.clone(), port };
        let io = self.client.upgrade(paths::PORT, &call).await.map_err(node_error)?;
        Ok(Box::new(io))
    }
}
