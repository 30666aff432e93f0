//! [`VmRuntime`] as the node sees every runtime: a [`Runtime`].

use std::os::fd::OwnedFd;
use std::time::Duration;

use async_trait::async_trait;
use space_proto::client::AgentClient;
use space_runtime::{
    AgentTransport, CheckpointArtifacts, CheckpointStats, Limits, PodTemplate, PortAddress, RootDisk, RootDiskKind,
    Runtime, RuntimeError, RuntimeKind, SandboxHandle, SandboxId, SandboxSpec, SandboxStats,
};

use crate::template::PodTemplateState;
use crate::{VmError, VmHandle, VmRuntime, VmSpec};

impl VmRuntime {
    fn vm_handle(&self, handle: &SandboxHandle) -> VmHandle {
        VmHandle { id: handle.id.clone(), pid: handle.pid, agent_socket: self.agent_socket(&handle.id) }
    }
}

fn vm_spec(spec: &SandboxSpec) -> Result<VmSpec, RuntimeError> {
    let RootDisk::Image(disk) = &spec.root else { return Err(wrong_root()) };
    Ok(VmSpec { id: spec.id.clone(), disk: disk.clone(), hostname: spec.hostname.clone(), limits: spec.limits })
}

fn wrong_root() -> RuntimeError {
    RuntimeError::WrongKind { runtime: RuntimeKind::Vm, what: "a root directory" }
}

fn wrong_artifacts() -> RuntimeError {
    RuntimeError::WrongKind { runtime: RuntimeKind::Vm, what: "CRIU images" }
}

#[async_trait]
impl Runtime for VmRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Vm
    }

    fn describe(&self) -> String {
        self.support().unwrap_or_else(|why| format!("broken: {why}"))
    }

    fn root_disk(&self) -> RootDiskKind {
        RootDiskKind::Image
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        let started = VmRuntime::start(self, &vm_spec(spec)?).await?;
        Ok(SandboxHandle { id: started.id, runtime: RuntimeKind::Vm, pid: started.pid })
    }

    /// Pods are restored from a template's memory, which they share copy-on-write.
    fn keeps_pod_templates(&self) -> bool {
        true
    }

    async fn make_pod_template(&self, spec: &SandboxSpec) -> Result<PodTemplate, RuntimeError> {
        let dir = self.pod_template_dir(&spec.id);
        // What an interrupted attempt left: a state directory must be new.
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::Io { path: dir, source: e });
            }
            _ => {}
        }
        let state = self.make_template_state(&vm_spec(spec)?, &dir).await?;
        Ok(PodTemplate::new(PodTemplateState(state)))
    }

    async fn start_pod(&self, spec: &SandboxSpec, template: &PodTemplate) -> Result<SandboxHandle, RuntimeError> {
        let Some(state) = template.get::<PodTemplateState>() else {
            return Err(RuntimeError::WrongKind { runtime: RuntimeKind::Vm, what: "another runtime's pod template" });
        };
        let started = self.start_from_template_state(&vm_spec(spec)?, &state.0).await?;
        Ok(SandboxHandle { id: started.id, runtime: RuntimeKind::Vm, pid: started.pid })
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        Ok(VmRuntime::destroy(self, id).await?)
    }

    fn set_limits(&self, id: &SandboxId, limits: &Limits) -> Result<(), RuntimeError> {
        Ok(VmRuntime::set_limits(self, id, limits)?)
    }

    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        Ok(VmRuntime::pause(self, id).await?)
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        Ok(VmRuntime::resume(self, id).await?)
    }

    fn is_alive(&self, handle: &SandboxHandle) -> bool {
        VmRuntime::is_alive(self, &self.vm_handle(handle))
    }

    fn adopt(&self, handle: &SandboxHandle) -> bool {
        VmRuntime::adopt(self, &self.vm_handle(handle))
    }

    fn agent_transport(&self, id: &SandboxId) -> AgentTransport {
        AgentTransport::Unix(self.agent_socket(id))
    }

    async fn agent(&self, id: &SandboxId) -> Result<AgentClient, RuntimeError> {
        Ok(VmRuntime::agent(self, id).await?)
    }

    fn network_namespace(&self, handle: &SandboxHandle) -> Result<OwnedFd, RuntimeError> {
        Ok(VmRuntime::network_namespace(self, &self.vm_handle(handle))?)
    }

    fn tracked_handle(&self, id: &SandboxId) -> Option<SandboxHandle> {
        let pid = VmRuntime::tracked_pid(self, id)?;
        Some(SandboxHandle { id: id.clone(), runtime: RuntimeKind::Vm, pid })
    }

    fn port_address(&self) -> PortAddress {
        PortAddress::Guest(crate::GUEST_ADDR)
    }

    async fn wait_exit(&self, handle: &SandboxHandle) {
        VmRuntime::wait_exit(self, &self.vm_handle(handle)).await
    }

    fn exit_reason(&self, id: &SandboxId) -> Option<String> {
        self.last_error(id)
    }

    fn stats(&self, id: &SandboxId) -> Result<SandboxStats, RuntimeError> {
        Ok(VmRuntime::stats(self, id)?)
    }

    fn oom_kills(&self, id: &SandboxId) -> Result<u64, RuntimeError> {
        Ok(VmRuntime::stats(self, id)?.oom_kills)
    }

    fn list(&self) -> Result<Vec<SandboxId>, RuntimeError> {
        Ok(VmRuntime::list(self)?)
    }

    fn checkpoint_support(&self) -> Result<String, String> {
        self.support()?;
        Ok(format!("QEMU {} migration to a file", self.qemu_version))
    }

    async fn wait_agent_released(&self, id: &SandboxId, timeout: Duration) -> Result<(), RuntimeError> {
        Ok(self.release_agent(id, timeout).await?)
    }

    async fn checkpoint(
        &self,
        id: &SandboxId,
        artifacts: &CheckpointArtifacts,
    ) -> Result<CheckpointStats, RuntimeError> {
        let CheckpointArtifacts::VmState { state, sealed } = artifacts else { return Err(wrong_artifacts()) };
        if sealed.is_some() {
            // Sealing as it is written is CRIU's path; a VM's state is sealed by the node after.
            return Err(RuntimeError::Checkpoint("a VM's state is written in clear, into memory: not sealed".into()));
        }
        VmRuntime::checkpoint(self, id, state).await.map_err(|e| match e {
            VmError::NotFound(id) => RuntimeError::NotFound(id),
            other => RuntimeError::Checkpoint(other.to_string()),
        })
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        artifacts: &CheckpointArtifacts,
    ) -> Result<SandboxHandle, RuntimeError> {
        let vm = vm_spec(spec)?;
        let CheckpointArtifacts::VmState { state, sealed } = artifacts else { return Err(wrong_artifacts()) };
        let restored = VmRuntime::restore(self, &vm, state, sealed.as_ref()).await.map_err(|e| match e {
            VmError::StateSealed { path, source: space_keys::KeyError::Corrupt { .. } } => {
                RuntimeError::Corrupt(format!(
                    "{} is damaged, or not sealed with this snapshot's key; restore from another snapshot",
                    path.display()
                ))
            }
            other => RuntimeError::Restore(other.to_string()),
        })?;
        Ok(SandboxHandle { id: restored.id, runtime: RuntimeKind::Vm, pid: restored.pid })
    }
}
