//! [`NodeApi`] of the simulated node.

use space_api::durable::TemplateExport;
use space_api::{TemplateBuild, TemplateSource};
use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use space_api::egress::AuditEvent;
use space_api::{PoolStatus, Progress, RuntimeKind, RuntimeSupport, SandboxId, SessionId, SnapshotId, TemplateInfo};
use space_gateway::{SessionEgress, SessionTraffic};
use space_node_api::{
    BlobSweep, DiskQuota, DiskUsage, EgressControl, Limits, LogFn, NodeApi, NodeError, ParentDisk, PortStream,
    ProgressFn, Result, SandboxHandle, SandboxStats, SnapshotExport, SnapshotKey,
};
use space_proto::client::AgentClient;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::agent::{self, Contents};
use crate::{Op, SimError, SimNode, Snapshot};

#[async_trait]
impl EgressControl for SimNode {
    async fn set_session_egress(&self, session: &SessionId, egress: SessionEgress) -> Result<()> {
        let mut state = self.state();
        state.egress.insert(session.clone(), egress);
        state.traffic.entry(session.clone()).or_default();
        Ok(())
    }

    async fn forget_session_egress(&self, session: &SessionId) -> Result<()> {
        let mut state = self.state();
        state.egress.remove(session);
        state.traffic.remove(session);
        Ok(())
    }

    async fn session_traffic(&self, session: &SessionId) -> Option<SessionTraffic> {
        self.state().traffic.get(session).copied()
    }
}

#[async_trait]
impl NodeApi for SimNode {
    fn start_background(self: Arc<Self>) {
        let mut state = self.state();
        state.background = true;
        state.refill();
    }

    async fn templates(&self) -> Vec<TemplateInfo> {
        self.state().templates.clone()
    }

    async fn resolve_template(&self, name: &str) -> Option<TemplateInfo> {
        self.state().newest_template(name)
    }

    fn builtin_templates(&self) -> Vec<String> {
        self.state().config.builtins.clone()
    }

    async fn ensure_template(&self, name: &str, report: ProgressFn) -> Result<TemplateInfo> {
        {
            let mut state = self.state();
            state.injected(Op::EnsureTemplate)?;
            if let Some(info) = state.newest_template(name) {
                return Ok(info);
            }
            if state.config.builtins.iter().any(|b| b == name) {
                report(Progress { phase: "building (simulated)".into(), done: 1, total: Some(1) });
                return Ok(state.add_template(name, format!("built-in {name} (simulated)")));
            }
        }
        Err(NodeError::UnknownTemplate {
            name: name.to_owned(),
            available: self.available_templates().await.join(", "),
        })
    }

    async fn import_template(&self, name: &str, source: &TemplateSource, _report: ProgressFn) -> Result<TemplateInfo> {
        self.state().injected(Op::ImportTemplate)?;
        // The node's host is this host: what the import would read must exist.
        if let Some(path) = source.host_path() {
            let meta = std::fs::symlink_metadata(path)
                .map_err(|error| SimError::Import { path: path.display().to_string(), source: error })?;
            if meta.is_file() {
                self.read_for_template(path)?;
            }
        }
        Ok(self.state().add_template(name, format!("imported from {source} (simulated)")))
    }

    async fn build_template(
        &self,
        name: &str,
        build: &TemplateBuild,
        _report: ProgressFn,
        log: LogFn,
    ) -> Result<TemplateInfo> {
        self.state().injected(Op::ImportTemplate)?;
        // What the real node checks before any step: the Dockerfile parses.
        let file = space_dockerfile::parse(&build.dockerfile)
            .map_err(|e| NodeError::BuildFailed(format!("Dockerfile {e}")))?;
        if let Some(context) = &build.context {
            self.read_for_template(context)?;
        }
        for (i, instruction) in file.instructions.iter().enumerate() {
            log(format!("Step {}/{} : {} (simulated)", i + 1, file.instructions.len(), instruction.text));
        }
        Ok(self.state().add_template(name, "dockerfile (simulated)".into()))
    }

    async fn delete_template(&self, name: &str, version: u64) -> Result<bool> {
        let mut state = self.state();
        let before = state.templates.len();
        state.templates.retain(|t| !(t.name == name && t.version == version));
        Ok(state.templates.len() != before)
    }

    fn node_id(&self) -> String {
        self.state().config.node_id.clone()
    }

    fn runtimes(&self) -> Vec<RuntimeSupport> {
        let vm = self.state().config.vm.clone();
        let linux = RuntimeSupport { runtime: RuntimeKind::Linux, available: true, detail: "simulated".into() };
        let (available, detail) = match vm {
            Ok(detail) => (true, detail),
            Err(why) => (false, why),
        };
        vec![linux, RuntimeSupport { runtime: RuntimeKind::Vm, available, detail }]
    }

    async fn bind_pod(
        self: Arc<Self>,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        _limits: Limits,
    ) -> Option<SandboxHandle> {
        self.state().take_pod(template, runtime)
    }

    async fn set_pool_size(self: Arc<Self>, template: &str, runtime: RuntimeKind, size: u32) {
        self.state().resize_pool(template, runtime, size);
    }

    async fn pool_status(&self) -> PoolStatus {
        self.maybe_hang(Op::PoolStatus).await;
        self.state().pool.status()
    }

    async fn capacity(&self) -> Result<space_api::NodeCapacity> {
        let mut state = self.state();
        state.injected(Op::Capacity)?;
        Ok(state.config.capacity)
    }

    async fn start_sandbox(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        _limits: Limits,
        disk: &DiskQuota,
    ) -> Result<SandboxHandle> {
        self.maybe_hang(Op::StartSandbox).await;
        let mut state = self.state();
        state.injected(Op::StartSandbox)?;
        let handle = state.boot(id, runtime, Contents::new_root(&format!("{}@{}", template.name, template.version)))?;
        state.disk.insert(id.clone(), disk.clone());
        Ok(handle)
    }

    async fn start_sandbox_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        _limits: Limits,
        disk: &DiskQuota,
        key: Option<&SnapshotKey>,
    ) -> Result<SandboxHandle> {
        let mut state = self.state();
        state.injected(Op::StartFromSnapshot)?;
        let found = state.snapshots.get(snapshot).filter(|s| &s.session == session);
        let snap = found.ok_or_else(|| SimError::NoSnapshot(snapshot.clone()))?;
        if snap.full {
            state.config.checkpoints.clone().map_err(NodeError::CheckpointUnavailable)?;
        }
        if snap.sealed.is_some() && snap.sealed.as_ref() != key {
            return Err(
                SimError::CorruptBlob(format!("snapshot {snapshot}'s images do not open with the key given")).into()
            );
        }
        let contents = snap.contents.clone();
        let handle = state.boot(id, runtime, contents)?;
        state.disk.insert(id.clone(), disk.clone());
        Ok(handle)
    }

    async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()> {
        let mut state = self.state();
        state.injected(Op::DestroySandbox)?;
        state.destroy(id);
        Ok(())
    }

    async fn pause_sandbox(&self, id: &SandboxId) -> Result<()> {
        let mut state = self.state();
        state.injected(Op::PauseSandbox)?;
        state.running(id)?.inside.set_frozen(true);
        Ok(())
    }

    async fn resume_sandbox(&self, id: &SandboxId) -> Result<()> {
        let mut state = self.state();
        state.injected(Op::ResumeSandbox)?;
        state.running(id)?.inside.set_frozen(false);
        Ok(())
    }

    async fn adopt(&self, id: &SandboxId, pid: u32) -> Option<SandboxHandle> {
        let state = self.state();
        let sandbox = state.sandboxes.get(id).filter(|s| s.pid == pid && s.alive())?;
        Some(SandboxHandle { id: id.clone(), runtime: sandbox.runtime, pid: sandbox.pid })
    }

    async fn wait_exit(&self, handle: &SandboxHandle) {
        let exited =
            self.state().sandboxes.get(&handle.id).filter(|s| s.pid == handle.pid).map(|s| s.exited.subscribe());
        if let Some(mut exited) = exited {
            // Ends when pid 1 exits, or when the sandbox is destroyed (the sender dropped).
            let _ = exited.wait_for(|exited| *exited).await;
        }
    }

    async fn oom_kills(&self, id: &SandboxId) -> Result<u64> {
        self.state().running(id)?;
        Ok(0)
    }

    async fn sandbox_stats(&self, id: &SandboxId) -> Result<SandboxStats> {
        self.state().running(id)?;
        Ok(SandboxStats {
            memory_bytes: 0,
            memory_peak_bytes: None,
            memory_limit_bytes: 0,
            oom_kills: 0,
            pids: 1,
            cpu_usage_ns: 0,
        })
    }

    async fn limit_disk(&self, sandbox: &SandboxId, disk: &DiskQuota) -> Result<()> {
        let mut state = self.state();
        state.running(sandbox)?;
        state.disk.insert(sandbox.clone(), disk.clone());
        Ok(())
    }

    /// The simulated node counts no disk: it enforces no limit.
    async fn disk_usage(&self, _session: &SessionId) -> Result<DiskUsage> {
        Ok(DiskUsage { used_bytes: 0, enforced: false })
    }

    async fn snapshot_exclusive_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        self.snapshot_disk_size(session, snapshot).await
    }

    async fn sweep(&self, keep: &HashSet<SandboxId>) -> Result<Vec<SandboxId>> {
        let mut state = self.state();
        let gone: Vec<SandboxId> = state.sandboxes.keys().filter(|id| !keep.contains(*id)).cloned().collect();
        for id in &gone {
            state.destroy(id);
        }
        Ok(gone)
    }

    async fn agent(&self, id: &SandboxId) -> Result<AgentClient> {
        let inside = {
            let mut state = self.state();
            state.injected(Op::Agent)?;
            let sandbox = state.running(id)?;
            if let Some(agent) = sandbox.agent.as_ref().filter(|a| !a.is_closed()) {
                return Ok(agent.clone());
            }
            sandbox.inside.clone()
        };
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(agent::serve(theirs, inside));
        let client =
            AgentClient::connect(ours).await.map_err(|source| SimError::Agent { sandbox: id.clone(), source })?;
        if let Some(sandbox) = self.state().sandboxes.get_mut(id) {
            sandbox.agent = Some(client.clone());
        }
        Ok(client)
    }

    fn checkpoint_support(&self, _runtime: RuntimeKind) -> std::result::Result<String, String> {
        self.state().config.checkpoints.clone()
    }

    async fn snapshot_disk(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
    ) -> Result<()> {
        let mut state = self.state();
        state.injected(Op::SnapshotDisk)?;
        state.take_snapshot(sandbox, session, snapshot, already_paused, false, None)?;
        Ok(())
    }

    async fn snapshot_full(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
        key: Option<&SnapshotKey>,
    ) -> Result<u64> {
        let mut state = self.state();
        state.config.checkpoints.clone().map_err(NodeError::CheckpointUnavailable)?;
        state.injected(Op::SnapshotFull)?;
        Ok(state.take_snapshot(sandbox, session, snapshot, already_paused, true, key)?)
    }

    async fn snapshot_disk_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        let state = self.state();
        let found = state.snapshots.get(snapshot).filter(|s| &s.session == session);
        Ok(found.ok_or_else(|| SimError::NoSnapshot(snapshot.clone()))?.contents.size())
    }

    async fn delete_snapshot(&self, _session: &SessionId, snapshot: &SnapshotId) -> Result<()> {
        let mut state = self.state();
        state.injected(Op::DeleteSnapshot)?;
        state.snapshots.remove(snapshot);
        Ok(())
    }

    async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<SnapshotExport> {
        let mut state = self.state();
        let blobs = state.config.blobs.clone().ok_or(SimError::NoBlobStore)?;
        state.injected(Op::ExportSnapshot)?;
        let found = state.snapshots.get(snapshot).filter(|s| &s.session == session);
        let snap = found.ok_or_else(|| SimError::NoSnapshot(snapshot.clone()))?;
        // As a real node: against the parent only when it holds that parent's root.
        let held = |p: &&SnapshotId| state.snapshots.get(*p).is_some_and(|s| &s.session == session);
        let export = blobs.put(snap.full, snap.contents.clone(), parent.filter(held).cloned(), key);
        let ran = |s: &crate::Sandbox| s.session.as_ref() == Some(session) && s.alive() && !s.inside.is_frozen();
        if state.sandboxes.values().any(ran) {
            state.exported_while_running.push(snapshot.clone());
        }
        Ok(export)
    }

    async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
        parents: &[ParentDisk],
    ) -> Result<()> {
        let mut state = self.state();
        let blobs = state.config.blobs.clone().ok_or(SimError::NoBlobStore)?;
        state.injected(Op::ImportSnapshot)?;
        // As a real node: a full snapshot is held with its processes only.
        if state.snapshots.get(snapshot).is_some_and(|s| s.full || !export.is_full()) {
            return Ok(());
        }
        // The ancestors it lacks, oldest first, each from its own object and key; a real node
        // receives their roots, then deletes them once the snapshot is received.
        let held = |id: &SnapshotId| state.snapshots.contains_key(id);
        let needed = space_api::durable::parents_to_receive(export.disk.parent.as_ref(), parents, held)
            .map_err(|id| SimError::CorruptBlob(format!("snapshot {id}'s root is needed first, and was not given")))?;
        for link in needed {
            blobs.get_disk(&link.disk, link.key.as_ref()).map_err(|e| {
                SimError::CorruptBlob(format!("snapshot {}, whose root this one was sent against: {e}", link.snapshot))
            })?;
            state.parents_imported.push(link.snapshot.clone());
        }
        let (full, contents) = blobs.get(export, key)?;
        // Images arrive as they were exported: sealed with the export's key.
        let sealed = key.filter(|_| full && export.encrypted).cloned();
        state.snapshots.insert(snapshot.clone(), Snapshot { session: session.clone(), full, contents, sealed });
        Ok(())
    }

    async fn export_template(&self, name: &str, version: u64) -> Result<TemplateExport> {
        let mut state = self.state();
        let blobs = state.config.blobs.clone().ok_or(SimError::NoBlobStore)?;
        state.injected(Op::ExportTemplate)?;
        let found = state.templates.iter().find(|t| t.name == name && t.version == version).cloned();
        let info = found.ok_or_else(|| NodeError::UnknownTemplate {
            name: format!("{name}@{version}"),
            available: String::new(),
        })?;
        Ok(blobs.put_template(&info))
    }

    async fn import_template_export(&self, export: &TemplateExport) -> Result<TemplateInfo> {
        let mut state = self.state();
        let blobs = state.config.blobs.clone().ok_or(SimError::NoBlobStore)?;
        state.injected(Op::ImportTemplateExport)?;
        let info = blobs.get_template(export)?;
        if !state.templates.iter().any(|t| t.name == info.name && t.version == info.version) {
            state.templates.push(info.clone());
            state.templates.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
            state.template_imports += 1;
        }
        Ok(info)
    }

    async fn sweep_blobs(
        &self,
        keep: &HashSet<String>,
        _min_age: std::time::Duration,
        _budget: std::time::Duration,
    ) -> Result<BlobSweep> {
        let mut state = self.state();
        let blobs = state.config.blobs.clone().ok_or(SimError::NoBlobStore)?;
        state.injected(Op::SweepBlobs)?;
        Ok(blobs.sweep(keep))
    }

    async fn sweep_snapshots(&self, keep: &HashSet<SnapshotId>) -> Result<usize> {
        let mut state = self.state();
        let before = state.snapshots.len();
        state.snapshots.retain(|id, _| keep.contains(id));
        Ok(before - state.snapshots.len())
    }

    async fn join_session_network(&self, sandbox: &SandboxId, session: &SessionId) -> Result<()> {
        let mut state = self.state();
        state.injected(Op::JoinSessionNetwork)?;
        if !state.egress.contains_key(session) {
            return Err(SimError::NoEgress(session.clone()).into());
        }
        state.running(sandbox)?;
        if let Some(s) = state.sandboxes.get_mut(sandbox) {
            s.session = Some(session.clone());
        }
        Ok(())
    }

    async fn reattach_gateway(&self, handle: &SandboxHandle, session: &SessionId) -> Result<()> {
        let mut state = self.state();
        state.running(&handle.id)?;
        if let Some(s) = state.sandboxes.get_mut(&handle.id) {
            s.session = Some(session.clone());
        }
        Ok(())
    }

    fn take_audit_events(&self) -> Option<UnboundedReceiver<AuditEvent>> {
        self.audit_events.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    async fn connect_port(&self, sandbox: &SandboxId, port: u16) -> Result<PortStream> {
        let addr = {
            let state = self.state();
            state.running(sandbox)?;
            state.ports.get(&(sandbox.clone(), port)).copied()
        };
        let unreachable = |source| SimError::PortUnreachable { sandbox: sandbox.clone(), port, source };
        let addr = addr.ok_or_else(|| unreachable(std::io::ErrorKind::ConnectionRefused.into()))?;
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(unreachable)?;
        Ok(Box::new(stream))
    }
}
