//! A simulated node: [`NodeApi`] in memory, so the control plane's contract (errors, tenancy,
//! idempotency, the session state machine) can be tested without root, btrfs or CRIU (model:
//! omicron's simulated sled agent).
//!
//! It keeps templates, sandboxes, snapshots, the warm pool and the gateway's session egress
//! in memory and follows the node's rules: a sandbox must exist (and run) to be paused,
//! snapshotted or joined to a session; a session's egress must be set before a sandbox joins
//! it; a snapshot restores what it held (files; processes too for a full one); full snapshots
//! need checkpoint support; destroy and delete are idempotent; sweeps remove what is not
//! kept. Where the control plane tells it something that is not so (a snapshot of a "paused"
//! sandbox that runs), it refuses, so such bugs fail tests instead of passing silently.
//!
//! Tests steer it: [`SimNode::fail_next`] makes an operation fail, [`SimNode::kill`] ends a
//! sandbox's pid 1, [`SimNode::set_checkpoint_support`] turns full snapshots off. A tiny
//! simulated agent ([`agent`]) answers exec and file calls over the real protocol.
//!
//! It is a dev-dependency only: no production binary can hold it.

mod agent;
mod blobs;
mod node;
mod pool;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use space_api::egress::AuditEvent;
use space_api::{RuntimeKind, SandboxId, SessionId, SnapshotId, TemplateInfo};
use space_gateway::{SessionEgress, SessionTraffic};
use space_node_api::{DiskQuota, NodeApi, NodeError, OutOfSpace, SandboxHandle};
use space_proto::client::{AgentClient, AgentError};
use tokio::sync::{mpsc, watch};

use agent::{Contents, Inside};
pub use blobs::SimBlobs;

/// The operations a test can make fail ([`SimNode::fail_next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    StartSandbox,
    StartFromSnapshot,
    DestroySandbox,
    PauseSandbox,
    ResumeSandbox,
    SnapshotDisk,
    SnapshotFull,
    DeleteSnapshot,
    JoinSessionNetwork,
    EnsureTemplate,
    ImportTemplate,
    Agent,
    /// What a heartbeat asks: failing it is a node that does not answer.
    Capacity,
    ExportSnapshot,
    ImportSnapshot,
    SweepBlobs,
    PoolStatus,
    ExportTemplate,
    ImportTemplateExport,
}

/// A call a test holds ([`SimNode::hold_next`]): it says when it has begun, and goes on
/// when the test releases it.
#[derive(Debug, Default)]
pub struct Held {
    began: tokio::sync::Notify,
    go: tokio::sync::Notify,
}

impl Held {
    /// Returns once the held call has begun.
    pub async fn began(&self) {
        self.began.notified().await;
    }

    /// Lets the held call go on.
    pub fn release(&self) {
        self.go.notify_one();
    }
}

/// Why a simulated operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulated failure of {0:?}")]
    Injected(Op),
    #[error("simulated {1:?} out of disk space in {0:?}")]
    OutOfSpace(Op, OutOfSpace),
    #[error("sandbox {0} does not exist on this node")]
    NoSandbox(SandboxId),
    #[error("sandbox {0} exists already")]
    SandboxExists(SandboxId),
    #[error("the init process of sandbox {0} has exited")]
    Exited(SandboxId),
    #[error("snapshot {0} does not exist on this node")]
    NoSnapshot(SnapshotId),
    #[error("snapshot {0} exists already")]
    SnapshotExists(SnapshotId),
    #[error("this simulated node has no blob store")]
    NoBlobStore,
    #[error("object {0} of the simulated blob store is corrupt")]
    CorruptBlob(String),
    #[error("sandbox {sandbox} is {actual}, but the caller said it was {said}")]
    WrongState { sandbox: SandboxId, said: &'static str, actual: &'static str },
    #[error("the egress of session {0} is not loaded")]
    NoEgress(SessionId),
    #[error("import {path}: {source}")]
    Import {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {runtime} runtime is unavailable: {reason}")]
    NoRuntime { runtime: RuntimeKind, reason: String },
    #[error("nothing listens on port {port} of sandbox {sandbox} ({source})")]
    PortUnreachable {
        sandbox: SandboxId,
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to the simulated agent of {sandbox}: {source}")]
    Agent {
        sandbox: SandboxId,
        #[source]
        source: AgentError,
    },
}

impl From<SimError> for NodeError {
    fn from(e: SimError) -> Self {
        match e {
            SimError::OutOfSpace(_, which) => NodeError::OutOfSpace { which, source: Box::new(e) },
            SimError::NoRuntime { runtime, reason } => NodeError::RuntimeUnavailable { runtime, reason },
            SimError::NoBlobStore => NodeError::NoBlobStore,
            SimError::CorruptBlob(_) => NodeError::Corrupt(e.to_string()),
            SimError::PortUnreachable { .. } => {
                NodeError::Port { failure: space_node_api::PortFailure::Unreachable, source: Box::new(e) }
            }
            e => NodeError::Failed(Box::new(e)),
        }
    }
}

/// How a simulated node starts.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Templates it builds by name on first use.
    pub builtins: Vec<String>,
    /// Ready pods to keep per template and runtime once background work starts.
    pub pool: BTreeMap<(String, RuntimeKind), u32>,
    /// What `checkpoint_support` answers.
    pub checkpoints: Result<String, String>,
    /// Whether the node runs `vm` sandboxes, or why not (`linux` always runs).
    pub vm: Result<String, String>,
    /// What `capacity` answers.
    pub capacity: space_api::NodeCapacity,
    /// What `node_id` answers.
    pub node_id: String,
    /// Where snapshots are exported to; `None`: a node without a blob store.
    pub blobs: Option<SimBlobs>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            builtins: vec!["busybox".into()],
            pool: BTreeMap::new(),
            checkpoints: Ok("simulated checkpoints".into()),
            vm: Ok("simulated virtual machines".into()),
            capacity: space_api::NodeCapacity { cpus: 4, memory_mib: 8192 },
            node_id: "node-sim".into(),
            blobs: None,
        }
    }
}

struct Sandbox {
    pid: u32,
    runtime: RuntimeKind,
    inside: Arc<Inside>,
    /// `true` once pid 1 has exited; dropped (also ending waits) when destroyed.
    exited: watch::Sender<bool>,
    agent: Option<AgentClient>,
    /// The session whose egress it follows, once joined.
    session: Option<SessionId>,
}

impl Sandbox {
    fn alive(&self) -> bool {
        !*self.exited.borrow()
    }
}

struct Snapshot {
    session: SessionId,
    full: bool,
    contents: Contents,
    /// The key a full snapshot's images are sealed with on the node: a start from it needs
    /// that very key, as a real node's decryption does.
    sealed: Option<space_api::durable::SnapshotKey>,
}

struct State {
    config: SimConfig,
    templates: Vec<TemplateInfo>,
    sandboxes: HashMap<SandboxId, Sandbox>,
    snapshots: HashMap<SnapshotId, Snapshot>,
    pool: pool::Pool,
    egress: HashMap<SessionId, SessionEgress>,
    /// Bytes of the audit events emitted for each session whose egress is set, as the
    /// gateway counts them.
    traffic: HashMap<SessionId, SessionTraffic>,
    failures: HashMap<Op, u32>,
    /// Ops whose next call panics (a bug in a node, as the control plane meets it).
    panics: HashSet<Op>,
    /// The next call of each of these ops never returns (until the server is stopped).
    hang: HashSet<Op>,
    /// The next call of each of these ops waits for the test to let it go on.
    held: HashMap<Op, Arc<Held>>,
    /// The next call of each op fails for want of this disk space.
    out_of_space: HashMap<Op, OutOfSpace>,
    /// Whose disk each sandbox's root is charged to.
    disk: HashMap<SandboxId, DiskQuota>,
    /// Where each sandbox's ports are served: real listeners a test runs on loopback.
    ports: HashMap<(SandboxId, u16), std::net::SocketAddr>,
    background: bool,
    next_pid: u32,
    /// Snapshots exported while a sandbox of their session ran (not frozen).
    exported_while_running: Vec<SnapshotId>,
    /// Snapshots whose roots an import received as another snapshot's ancestors.
    parents_imported: Vec<SnapshotId>,
    /// The files template work read (an import's archive, a build's context): each path and
    /// the bytes it held then.
    template_reads: Vec<(std::path::PathBuf, Vec<u8>)>,
    /// Templates made here from another node's export.
    template_imports: usize,
}

/// What a test sees of one simulated sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSandbox {
    pub id: SandboxId,
    pub runtime: RuntimeKind,
    pub alive: bool,
    pub paused: bool,
    /// A warm-pool pod no session has taken.
    pub pod: bool,
    pub session: Option<SessionId>,
}

/// The simulated node. Hand it to the control plane as `Arc<dyn NodeApi>`; keep a clone of
/// the `Arc<SimNode>` to steer and inspect it.
pub struct SimNode {
    state: Mutex<State>,
    audit: mpsc::UnboundedSender<AuditEvent>,
    audit_events: Mutex<Option<mpsc::UnboundedReceiver<AuditEvent>>>,
}

impl SimNode {
    pub fn new(config: SimConfig) -> Arc<SimNode> {
        let (audit, audit_events) = mpsc::unbounded_channel();
        let state = State {
            pool: pool::Pool::new(&config.pool),
            config,
            templates: Vec::new(),
            sandboxes: HashMap::new(),
            snapshots: HashMap::new(),
            egress: HashMap::new(),
            traffic: HashMap::new(),
            failures: HashMap::new(),
            panics: HashSet::new(),
            hang: HashSet::new(),
            held: HashMap::new(),
            out_of_space: HashMap::new(),
            disk: HashMap::new(),
            ports: HashMap::new(),
            background: false,
            next_pid: 1000,
            exported_while_running: Vec::new(),
            parents_imported: Vec::new(),
            template_reads: Vec::new(),
            template_imports: 0,
        };
        Arc::new(SimNode { state: Mutex::new(state), audit, audit_events: Mutex::new(Some(audit_events)) })
    }

    /// The same node as the control plane holds it.
    pub fn api(self: &Arc<Self>) -> Arc<dyn NodeApi> {
        self.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Plain data, never left half-changed by a panic: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `times` calls of `op` fail (after which it works again).
    pub fn fail_next(&self, op: Op, times: u32) {
        *self.state().failures.entry(op).or_default() += times;
    }

    /// The next call of `op` panics.
    pub fn panic_next(&self, op: Op) {
        self.state().panics.insert(op);
    }

    /// Calls of `op` work again, however many failures were asked for.
    pub fn stop_failing(&self, op: Op) {
        self.state().failures.remove(&op);
    }

    /// What full snapshots answer from now on: the tool, or why they are unavailable.
    pub fn set_checkpoint_support(&self, support: Result<String, String>) {
        self.state().config.checkpoints = support;
    }

    /// The sandbox's pid 1 exits on its own (a crash inside); its resources stay until destroyed.
    pub fn kill(&self, id: &SandboxId) -> bool {
        let state = self.state();
        let Some(sandbox) = state.sandboxes.get(id) else { return false };
        sandbox.exited.send_replace(true);
        true
    }

    /// The node as a new server process finds it after the old one died (`space serve` runs
    /// node and control plane in one process): what lives on the host is still there
    /// (templates, snapshots, sandboxes, whose pid 1 outlives the server, frozen or not);
    /// what lived in the process is gone (agent connections, the gateway's session egress,
    /// the warm pool's list of pods, background work). This node is left empty.
    pub fn restarted(&self) -> Arc<SimNode> {
        let mut old = self.state();
        let mut sandboxes = std::mem::take(&mut old.sandboxes);
        for sandbox in sandboxes.values_mut() {
            if let Some(agent) = sandbox.agent.take() {
                agent.close();
            }
            sandbox.session = None;
        }
        let node = SimNode::new(old.config.clone());
        {
            let mut new = node.state();
            new.templates = old.templates.clone();
            new.snapshots = std::mem::take(&mut old.snapshots);
            new.sandboxes = sandboxes;
            new.next_pid = old.next_pid;
        }
        node
    }

    /// Puts an egress audit event where the gateway's would go, counting its bytes for the
    /// session as the gateway does.
    pub fn emit_audit(&self, event: AuditEvent) {
        if let Some(traffic) = self.state().traffic.get_mut(&event.session_id) {
            traffic.bytes_out += event.bytes_sent;
            traffic.bytes_in += event.bytes_received;
        }
        let _ = self.audit.send(event);
    }

    /// Every sandbox on the node, sorted by id.
    pub fn sandboxes(&self) -> Vec<SimSandbox> {
        let state = self.state();
        let mut all: Vec<SimSandbox> = state
            .sandboxes
            .iter()
            .map(|(id, s)| SimSandbox {
                id: id.clone(),
                runtime: s.runtime,
                alive: s.alive(),
                paused: s.inside.is_frozen(),
                pod: state.pool.holds(id),
                session: s.session.clone(),
            })
            .collect();
        all.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        all
    }

    /// Every snapshot on the node.
    pub fn snapshots(&self) -> Vec<SnapshotId> {
        let mut all: Vec<SnapshotId> = self.state().snapshots.keys().cloned().collect();
        all.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        all
    }

    /// Makes the next call of `op` hang for ever, so that a test can stop the server in the
    /// middle of it.
    pub fn hang_next(&self, op: Op) {
        self.state().hang.insert(op);
    }

    /// Makes the next call of `op` wait until the test releases it ([`Held::release`]).
    pub fn hold_next(&self, op: Op) -> Arc<Held> {
        let held = Arc::new(Held::default());
        self.state().held.insert(op, held.clone());
        held
    }

    /// Waits for ever if a test asked `op` to hang, or until it lets a held `op` go on.
    async fn maybe_hang(&self, op: Op) {
        let (hang, held) = {
            let mut state = self.state();
            (state.hang.remove(&op), state.held.remove(&op))
        };
        if let Some(held) = held {
            held.began.notify_one();
            held.go.notified().await;
        }
        if hang {
            std::future::pending::<()>().await;
        }
    }

    /// Makes the next call of `op` fail for want of `which` disk space.
    pub fn fail_next_out_of_space(&self, op: Op, which: OutOfSpace) {
        self.state().out_of_space.insert(op, which);
    }

    /// Whose disk `sandbox`'s root is charged to, and with which cap.
    pub fn disk_quota(&self, sandbox: &SandboxId) -> Option<DiskQuota> {
        self.state().disk.get(sandbox).cloned()
    }

    /// Whether the gateway knows `session`'s egress.
    /// From now on, connections to `port` of `sandbox` reach the server at `addr` (one the
    /// test runs on loopback).
    pub fn serve_port(&self, sandbox: &SandboxId, port: u16, addr: std::net::SocketAddr) {
        self.state().ports.insert((sandbox.clone(), port), addr);
    }

    pub fn has_egress(&self, session: &SessionId) -> bool {
        self.state().egress.contains_key(session)
    }

    /// The snapshots exported while a sandbox of their session ran, so it could change after
    /// the snapshot and before the export was done.
    pub fn exported_while_running(&self) -> Vec<SnapshotId> {
        self.state().exported_while_running.clone()
    }

    /// The snapshots whose roots imports received as ancestors of the snapshot imported, in
    /// the order they were received.
    pub fn parents_imported(&self) -> Vec<SnapshotId> {
        self.state().parents_imported.clone()
    }

    /// Reads `path` as template work would, and records it (see [`SimNode::template_reads`]).
    fn read_for_template(&self, path: &std::path::Path) -> Result<(), SimError> {
        let bytes =
            std::fs::read(path).map_err(|source| SimError::Import { path: path.display().to_string(), source })?;
        self.state().template_reads.push((path.to_owned(), bytes));
        Ok(())
    }

    /// How many templates were made here from another node's export.
    pub fn template_imports(&self) -> usize {
        self.state().template_imports
    }

    /// The files template work read, in order: where each was and the bytes it held.
    pub fn template_reads(&self) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        self.state().template_reads.clone()
    }
}

impl State {
    /// Fails with [`SimError::Injected`] if a test asked `op` to fail (panics if it asked
    /// that).
    fn injected(&mut self, op: Op) -> Result<(), SimError> {
        if self.panics.remove(&op) {
            panic!("simulated panic in {op:?}");
        }
        match self.failures.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(SimError::Injected(op))
            }
            _ => match self.out_of_space.remove(&op) {
                Some(which) => Err(SimError::OutOfSpace(op, which)),
                None => Ok(()),
            },
        }
    }

    fn running(&self, id: &SandboxId) -> Result<&Sandbox, SimError> {
        let sandbox = self.sandboxes.get(id).ok_or_else(|| SimError::NoSandbox(id.clone()))?;
        if !sandbox.alive() {
            return Err(SimError::Exited(id.clone()));
        }
        Ok(sandbox)
    }

    /// Starts sandbox `id` with `contents`; a sandbox of that id must not exist.
    fn boot(&mut self, id: &SandboxId, runtime: RuntimeKind, contents: Contents) -> Result<SandboxHandle, SimError> {
        if self.sandboxes.contains_key(id) {
            return Err(SimError::SandboxExists(id.clone()));
        }
        if runtime == RuntimeKind::Vm
            && let Err(reason) = &self.config.vm
        {
            return Err(SimError::NoRuntime { runtime, reason: reason.clone() });
        }
        self.next_pid += 1;
        let pid = self.next_pid;
        let (inside, exited) = (Inside::new(contents), watch::channel(false).0);
        let sandbox = Sandbox { pid, runtime, inside, exited, agent: None, session: None };
        self.sandboxes.insert(id.clone(), sandbox);
        Ok(SandboxHandle { id: id.clone(), runtime, pid })
    }

    /// Removes a sandbox, ending every wait on its exit. Missing is fine.
    fn destroy(&mut self, id: &SandboxId) {
        self.pool.forget(id);
        if let Some(sandbox) = self.sandboxes.remove(id) {
            sandbox.exited.send_replace(true);
            if let Some(agent) = sandbox.agent {
                agent.close();
            }
        }
    }

    fn newest_template(&self, name: &str) -> Option<TemplateInfo> {
        self.templates.iter().filter(|t| t.name == name).max_by_key(|t| t.version).cloned()
    }

    fn add_template(&mut self, name: &str, source: String) -> TemplateInfo {
        let version = self.newest_template(name).map_or(1, |t| t.version + 1);
        let info = TemplateInfo {
            name: name.to_owned(),
            version,
            created_at_ms: 0,
            source,
            size_bytes: 0,
            digest: None,
            defaults: None,
        };
        self.templates.push(info.clone());
        self.refill();
        info
    }

    /// A snapshot of the running `sandbox`, which is paused exactly when `already_paused`.
    fn take_snapshot(
        &mut self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
        full: bool,
        key: Option<&space_api::durable::SnapshotKey>,
    ) -> Result<u64, SimError> {
        let inside = self.running(sandbox)?.inside.clone();
        let said = if already_paused { "paused" } else { "running" };
        let actual = if inside.is_frozen() { "paused" } else { "running" };
        if said != actual {
            return Err(SimError::WrongState { sandbox: sandbox.clone(), said, actual });
        }
        if self.snapshots.contains_key(snapshot) {
            return Err(SimError::SnapshotExists(snapshot.clone()));
        }
        let contents = inside.contents();
        let contents = if full { contents.clone() } else { contents.files_only() };
        let size = contents.size();
        let sealed = key.filter(|_| full).cloned();
        self.snapshots.insert(snapshot.clone(), Snapshot { session: session.clone(), full, contents, sealed });
        Ok(size)
    }
}
