//! Errors of the vm runtime. Each keeps its source; [`RuntimeError`] (the node's current
//! error type) gets a flattened message through `From`.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use space_host::cgroup::CgroupError;
use space_runtime::{RuntimeError, SandboxId};

use crate::qmp::QmpError;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("vm runtime cannot run on this host: {0}")]
    Unsupported(String),
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error("sandbox {0} does not exist on this node")]
    NotFound(SandboxId),
    #[error("bad vm spec: {0}")]
    Spec(String),
    #[error("cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("host id range: {0}")]
    Range(#[source] RuntimeError),
    #[error("jailer: {0}")]
    Jailer(String),
    #[error("QEMU exited before the agent answered (last line of its log: {last_line:?})")]
    VmmExited { last_line: Option<String> },
    #[error("the agent did not answer within {bound:?} (last line of QEMU's log: {last_line:?})")]
    AgentTimeout { bound: Duration, last_line: Option<String> },
    #[error("agent: {0}")]
    Agent(String),
    #[error("QMP: {0}")]
    Qmp(#[from] QmpError),
    #[error("guest memory is fixed at boot ({boot_mib} MiB); cannot change it to {asked_mib} MiB")]
    MemoryFixedAtBoot { boot_mib: u64, asked_mib: u64 },
    #[error("{processes} VMM processes of {id} still alive after {waited:?}")]
    StillAlive { id: SandboxId, processes: usize, waited: Duration },
    #[error("root image: {0}")]
    Image(String),
    #[error("the guest did not take in the hang-up of the agent port within {waited:?}")]
    AgentHeld { waited: Duration },
    #[error("{0} was started by a runtime that did not record its machine: it cannot be checkpointed")]
    MachineUnrecorded(SandboxId),
    #[error("a checkpoint needs a VM paused by the node (once per pause: resume it before another); it is {status}")]
    NotCheckpointable { status: String },
    #[error("QEMU's migration {0}")]
    Migration(String),
    #[error("QEMU's migration did not complete within {bound:?}")]
    MigrationTimeout { bound: Duration },
    #[error("checkpoint record {}: {source}", path.display())]
    StateRecord { path: PathBuf, source: serde_json::Error },
    #[error("the checkpoint needs another {what}: it was saved with {saved}, this node has {here}")]
    StateMismatch { what: &'static str, saved: String, here: String },
    #[error("{} holds {found} bytes, the checkpoint recorded {recorded}", path.display())]
    StateTruncated { path: PathBuf, recorded: u64, found: u64 },
    #[error("sealed checkpoint {}: {source}", path.display())]
    StateSealed { path: PathBuf, source: space_keys::KeyError },
    #[error("QEMU stopped reading the checkpoint's state: {0}")]
    StateUnread(#[source] io::Error),
    #[error("opening the sealed checkpoint's state: {0}")]
    StateOpener(&'static str),
    #[error("QEMU could not load the checkpoint (last line of its log: {last_line:?})")]
    IncomingFailed { last_line: Option<String> },
    #[error("giving the restored guest fresh entropy and time: {0}")]
    Reseed(#[source] space_proto::AgentError),
}

impl VmError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> VmError {
        let path = path.into();
        move |source| VmError::Io { what, path, source }
    }
}

impl From<VmError> for RuntimeError {
    fn from(e: VmError) -> RuntimeError {
        match e {
            VmError::NotFound(id) => RuntimeError::NotFound(id),
            VmError::Unsupported(m) => RuntimeError::Unsupported(m),
            VmError::Io { path, source, .. } => RuntimeError::Io { path, source },
            VmError::Cgroup(e) => RuntimeError::Cgroup(e.to_string()),
            VmError::Range(e) => e,
            VmError::Agent(m) => RuntimeError::Agent(m),
            other => RuntimeError::Start(other.to_string()),
        }
    }
}
