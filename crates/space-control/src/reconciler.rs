//! Performs queued operations. The API only records intent (a session row and an operation);
//! this loop makes it so (a create's operation is run at once by the replica that recorded
//! it, see [`Reconciler::perform_here`]). Every step is idempotent and named after ids, so a crash at any point
//! is repaired by running the operation again.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use space_api::{ErrorCode, OperationId, OperationState, SandboxId, SessionId, SessionState, SnapshotId};
use space_metrics::{RestoreReason, Start};
use space_node_api::{DiskQuota, Limits, NodeApi, SandboxHandle};
use space_store::{NewSandbox, OperationKind, OperationRecord, SandboxRecord, SessionRecord};
use tokio::sync::{Notify, broadcast};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::AppState;
use crate::error::{AppError, AppResult};

/// How often a waiter looks at an operation that this replica is not running.
const WAIT_POLL: Duration = Duration::from_millis(250);

/// Operations finished by this replica that waiters may not have seen yet: past it, a waiter
/// looks at its operation again anyway.
const FINISHED_BACKLOG: usize = 1024;

/// Wakes the loop and tells waiters when operations finish. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    wake: Arc<Notify>,
    /// The id of each operation as it finishes: a waiter reads its operation again only when
    /// it is its own (a burst of creates does not make every waiter read at every end).
    finished: broadcast::Sender<OperationId>,
    /// The operations this process is running: only their leases are renewed, so one that
    /// was claimed but is not running (its task never started) is taken over.
    running: RunningSet,
    /// The tasks of those operations and of their clean-up: a graceful stop waits for them.
    tasks: TaskTracker,
    /// Cancelled by [`Reconciler::stop`]: the loop claims nothing more.
    stopping: CancellationToken,
}

/// The operations with a task in this process, each with its number of tasks: a replica
/// whose beat stalled past a lease may claim again an operation it still runs.
type RunningSet = Arc<Mutex<HashMap<OperationId, usize>>>;

/// A task of an operation, counted in a [`RunningSet`] until this is dropped (also when the
/// task panics).
struct Running {
    set: RunningSet,
    id: OperationId,
}

impl Running {
    fn new(set: &RunningSet, id: OperationId) -> Self {
        *set.lock().unwrap_or_else(|e| e.into_inner()).entry(id.clone()).or_default() += 1;
        Running { set: set.clone(), id }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tasks) = set.get_mut(&self.id) {
            *tasks -= 1;
            if *tasks == 0 {
                set.remove(&self.id);
            }
        }
    }
}

impl Default for Reconciler {
    fn default() -> Self {
        Self::new()
    }
}

impl Reconciler {
    pub fn new() -> Self {
        Reconciler {
            wake: Arc::new(Notify::new()),
            finished: broadcast::channel(FINISHED_BACKLOG).0,
            running: Default::default(),
            tasks: TaskTracker::new(),
            stopping: CancellationToken::new(),
        }
    }

    /// Stops claiming operations and waits for those this process runs (a graceful stop, once
    /// the API that starts them has stopped). What is left queued is claimed at the next start
    /// or by another replica.
    pub async fn stop(&self) {
        self.stopping.cancel();
        self.tasks.close();
        if !self.tasks.is_empty() {
            tracing::info!(operations = self.tasks.len(), "waiting for the operations under way to finish");
        }
        self.tasks.wait().await;
    }

    /// The operations this process is running now.
    pub fn running(&self) -> Vec<OperationId> {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    /// Tells the loop there is new work.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn spawn(&self, state: AppState) {
        let this = self.clone();
        tokio::spawn(async move { this.run(state).await });
    }

    async fn run(self, state: AppState) {
        while !self.stopping.is_cancelled() {
            loop {
                let lease = crate::replicas::lease_ms(crate::nodes::LEASE);
                match state.store.claim_operation(space_store::now_ms(), lease).await {
                    Ok(Some(op)) => drop(self.perform_here(state.clone(), op)),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("claiming operations: {e}");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = self.stopping.cancelled() => {}
            }
        }
    }

    /// Runs operation `op`, which this replica has claimed, in a task of its own. The task
    /// ends with the operation's end as this replica recorded it: `None` if it recorded none
    /// (another replica took the operation over, or the store failed).
    pub fn perform_here(&self, state: AppState, op: OperationRecord) -> JoinHandle<Option<AppResult<()>>> {
        let finished = self.finished.clone();
        let running = Running::new(&self.running, op.operation.id.clone());
        self.tasks.spawn(async move {
            let id = op.operation.id.clone();
            let (kind, session) = (op.kind, op.operation.session_id.clone());
            let result = match AssertUnwindSafe(perform(&state, op)).catch_unwind().await {
                Ok(result) => result,
                Err(panic) => Err(panicked(&state, &id, kind, session.as_ref(), panic_message(panic)).await),
            };
            let recorded = match result {
                Ok(Ended::Recorded) => Some(Ok(())),
                Ok(Ended::ToRecord) => record_end(&state, &id, None).await.then_some(Ok(())),
                Err(e) => record_end(&state, &id, Some(&e)).await.then_some(Err(e)),
            };
            drop(running);
            // No receiver: nobody waits.
            let _ = finished.send(id);
            recorded
        })
    }

    /// Waits until operation `id` has finished, or `timeout` passed.
    pub async fn wait(
        &self,
        state: &AppState,
        tenant: &space_api::TenantId,
        id: &OperationId,
        timeout: Duration,
    ) -> AppResult<space_api::Operation> {
        let mut finished = self.finished.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let op = state
                .store
                .operation(tenant, id)
                .await?
                .ok_or_else(|| AppError::internal(format!("operation {id} vanished")))?;
            if matches!(op.state, OperationState::Succeeded | OperationState::Failed) {
                return Ok(op);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(op);
            }
            // Another replica may finish it: look again now and then, not only when this
            // one finishes something.
            let look_again = deadline.min(tokio::time::Instant::now() + WAIT_POLL);
            let _ = tokio::time::timeout_at(look_again, ended_here(&mut finished, id)).await;
        }
    }
}

/// The error an operation that panicked ends with. It is not run again: a panic is a bug,
/// which would recur at every claim. A create's session fails with it, as when its sandbox
/// cannot start; other sessions keep the state the operation left (destroy works from each).
async fn panicked(
    state: &AppState,
    id: &OperationId,
    kind: OperationKind,
    session: Option<&SessionId>,
    why: String,
) -> AppError {
    tracing::error!(%id, ?kind, panic = %why, "an operation panicked; it is failed, not retried");
    let message = format!("operation {id} failed unexpectedly ({why}); it is not retried: please report it");
    if let (OperationKind::CreateSession, Some(session)) = (kind, session) {
        let failed = state.store.transition(session, &[SessionState::Creating], SessionState::Failed, Some(&message));
        if let Err(e) = failed.await {
            tracing::error!(%session, error = %e, "recording the failed create of a panicked operation");
        }
    }
    AppError::internal(message)
}

/// What a panic said (`panic!` gives a `&str` or a `String`).
fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => panic.downcast_ref::<&str>().map_or_else(|| "no message".into(), |s| s.to_string()),
    }
}

/// Returns once operation `id` ended on this replica, or may have (some ends were missed).
async fn ended_here(finished: &mut broadcast::Receiver<OperationId>, id: &OperationId) {
    loop {
        match finished.recv().await {
            Ok(ended) if ended == *id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            // The sender lives as long as the reconciler the caller borrows.
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// How an operation ended: its end is for the loop to record, or was recorded with its last
/// step.
enum Ended {
    ToRecord,
    Recorded,
}

/// Records operation `id`'s end: `error`, or success; whether it was recorded.
async fn record_end(state: &AppState, id: &OperationId, error: Option<&AppError>) -> bool {
    let error = error.map(|e| (e.0.code, e.0.message.as_str()));
    match state.store.finish_operation(id, error).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(%id, "another replica took this operation over; its result counts");
            false
        }
        Err(e) => {
            tracing::error!(%id, "recording operation result: {e}");
            false
        }
    }
}

async fn perform(state: &AppState, op: OperationRecord) -> AppResult<Ended> {
    let done = match op.kind {
        OperationKind::CreateSession => return create_session(state, &op).await,
        OperationKind::DestroySession => destroy_session(state, &op).await,
        OperationKind::RestoreSession => restore_session(state, &op).await,
        OperationKind::BuildTemplate | OperationKind::ImportTemplate | OperationKind::BuildDockerfile => {
            crate::template_work::build_template(state, &op).await
        }
    };
    done.map(|()| Ended::ToRecord)
}

fn session_of(op: &OperationRecord) -> AppResult<SessionId> {
    op.operation.session_id.clone().ok_or_else(|| AppError::internal("session operation without a session"))
}

async fn create_session(state: &AppState, op: &OperationRecord) -> AppResult<Ended> {
    let id = session_of(op)?;
    let Some(record) = state.store.session_any(&id).await? else {
        return Ok(Ended::ToRecord);
    };
    if record.session.state != SessionState::Creating {
        return Ok(Ended::ToRecord);
    }
    // A previous attempt may have died half-way: remove what it left.
    if let (Some(old), Some(_)) = (&record.session.sandbox_id, &record.session.node) {
        remove_sandbox(state.nodes.of(&record.session)?.as_ref(), state, old).await?;
    }
    let began = Instant::now();
    let (started, start) = match &record.source_snapshot {
        Some(snapshot) => {
            let sandbox = SandboxId::generate();
            let started = start_from_snapshot(state, &record, snapshot, sandbox, RestoreReason::Fork).await;
            (started, Start::Snapshot)
        }
        None => {
            let mut start = Start::Cold;
            (start_sandbox(state, op, &record.session, &mut start).await, start)
        }
    };
    space_metrics::session_created(start, record.session.runtime, started.is_ok(), began.elapsed());
    match started {
        Ok((node, handle)) => {
            let (from, to) = (&[SessionState::Creating], SessionState::Running);
            if state.store.transition_finishing(&id, from, to, &op.operation.id).await? {
                watch_exit(state.clone(), node, id, handle);
                return Ok(Ended::Recorded);
            }
            // Destroyed while we were creating: don't leave the sandbox behind.
            remove_sandbox(node.as_ref(), state, &handle.id).await?;
            Ok(Ended::ToRecord)
        }
        Err(e) => {
            let message = e.0.message.clone();
            if let Some(session) = state.store.session_any(&id).await?.map(|r| r.session)
                && let Some(sbx) = &session.sandbox_id
            {
                remove_sandbox(state.nodes.of(&session)?.as_ref(), state, sbx).await?;
            }
            state.store.transition(&id, &[SessionState::Creating], SessionState::Failed, Some(&message)).await?;
            Err(e)
        }
    }
}

/// A sandbox started, and the node it runs on.
type Started = (Arc<dyn NodeApi>, SandboxHandle);

/// Places the session and starts its first sandbox from its template: a warm pod if one is
/// ready (then `start` is set to [`Start::Warm`]), else a new one.
async fn start_sandbox(
    state: &AppState,
    op: &OperationRecord,
    session: &space_api::Session,
    start: &mut Start,
) -> AppResult<Started> {
    // A create retried after a crash goes where the first attempt went (it may have left
    // a sandbox there, removed above); else placement picks the node.
    let node = match &session.node {
        Some(_) => state.nodes.of(session)?,
        None => crate::placement::place_from_template(state, session, &op.tenant_id).await?,
    };
    // The session's tenant's own template of that name, else the global one.
    let name = crate::template_scope::resolve(node.as_ref(), &op.tenant_id, &session.template).await;
    let template = crate::template_work::ensure_template(state, node.as_ref(), &op.operation.id, &name).await?;
    let limits = Limits::from(&session.resources);
    let node_id = node.node_id();
    let mut sandbox = NewSandbox {
        id: &SandboxId::generate(),
        session: &session.id,
        node: &node_id,
        template_version: template.version,
        running_pid: None,
    };
    if let Some(pod) = node.clone().bind_pod(&template, session.runtime, limits).await {
        *start = Start::Warm;
        sandbox.id = &pod.id;
        sandbox.running_pid = Some(pod.pid);
        // A crash before this commit leaves an unowned pod, which the start-up sweep removes.
        if let Err(e) = state.store.insert_sandbox(&sandbox).await {
            node.destroy_sandbox(&pod.id).await?;
            return Err(e.into());
        }
        // The pod was started for no one: its root joins the session's disk now, while its
        // network joins the session's (neither waits for the other).
        let disk = disk_quota(session);
        let network = async {
            crate::egress::push_placed(state, &session.id).await?;
            Ok::<_, AppError>(node.join_session_network(&pod.id, &session.id).await?)
        };
        let (limited, joined) = tokio::join!(node.limit_disk(&pod.id, &disk), network);
        limited?;
        joined?;
        return Ok((node, pod));
    }
    state.store.insert_sandbox(&sandbox).await?;
    crate::egress::push_placed(state, &session.id).await?;
    let handle = node.start_sandbox(sandbox.id, &template, session.runtime, limits, &disk_quota(session)).await?;
    state.store.set_sandbox_running(sandbox.id, handle.pid).await?;
    node.join_session_network(&handle.id, &session.id).await?;
    Ok((node, handle))
}

/// What the session's sandboxes write is charged to it, up to its disk limit.
pub(crate) fn disk_quota(session: &space_api::Session) -> DiskQuota {
    DiskQuota { session: session.id.clone(), limit_bytes: session.resources.disk_limit_bytes() }
}

/// Starts sandbox `sandbox` for the session of `record` from a snapshot (of any of the
/// tenant's sessions): a full snapshot's processes continue, a disk snapshot's root boots
/// afresh.
async fn start_from_snapshot(
    state: &AppState,
    record: &SessionRecord,
    snapshot: &SnapshotId,
    sandbox: SandboxId,
    reason: RestoreReason,
) -> AppResult<Started> {
    let found = state.store.snapshot(&record.tenant_id, snapshot).await?.ok_or_else(|| {
        AppError::new(
            ErrorCode::SnapshotNotFound,
            format!("snapshot {snapshot} was deleted before the sandbox started"),
        )
    })?;
    let session = &record.session;
    let began = Instant::now();
    // A restore leaves the session's running sandbox where it is until the new one runs, and
    // retires it on that node: it stays on a cordoned node. Resumes and forks leave nothing.
    let leave_cordoned = reason != RestoreReason::Restore;
    let started = start_snapshot_sandbox(state, session, &found.session_id, snapshot, sandbox, leave_cordoned).await;
    let elapsed = began.elapsed();
    space_metrics::restored(found.kind, session.runtime, reason, started.is_ok(), elapsed, found.size_bytes);
    started
}

/// Starts `sandbox` from a snapshot of `origin` (this session for a restore, the parent for a
/// fork) on the node [`crate::durable::node_for_snapshot`] picks, which holds it by then.
async fn start_snapshot_sandbox(
    state: &AppState,
    session: &space_api::Session,
    origin: &SessionId,
    snapshot: &SnapshotId,
    sandbox: SandboxId,
    leave_cordoned: bool,
) -> AppResult<Started> {
    let origin_session =
        state.store.session_any(origin).await?.ok_or_else(|| AppError::session_not_found(origin.as_str()))?.session;
    let (node, key) =
        crate::durable::node_for_snapshot(state, session, &origin_session, snapshot, leave_cordoned).await?;
    let node_id = node.node_id();
    let new = NewSandbox {
        id: &sandbox,
        session: &session.id,
        node: &node_id,
        template_version: session.template_version.unwrap_or(0).into(),
        running_pid: None,
    };
    state.store.insert_sandbox(&new).await?;
    // Placed now, or moved to another node (its own was lost): its egress goes there too, and
    // leaves the node that had it (a fork's is handed to its parent's node before it is placed).
    if session.node.as_deref() != Some(node_id.as_str()) {
        crate::egress::push_placed(state, &session.id).await?;
    }
    let held_by = session.node.as_ref().or(origin_session.node.as_ref().filter(|_| session.id != *origin));
    if let Some(held_by) = held_by.filter(|held_by| **held_by != node_id) {
        crate::egress::forget_on(state, held_by, &session.id).await;
    }
    let limits = Limits::from(&session.resources);
    let disk = disk_quota(session);
    let handle = node
        .start_sandbox_from_snapshot(&sandbox, origin, snapshot, session.runtime, limits, &disk, key.as_ref())
        .await?;
    state.store.set_sandbox_running(&sandbox, handle.pid).await?;
    node.join_session_network(&handle.id, &session.id).await?;
    Ok((node, handle))
}

/// What a restore operation does: start `sandbox` from `snapshot`, then retire the others.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct RestoreInput {
    pub snapshot: SnapshotId,
    /// Named up front so a re-run after a crash finds (and replaces) a half-made attempt.
    pub sandbox: SandboxId,
    /// Resuming a suspended session: a failure leaves it suspended.
    #[serde(default)]
    pub from_suspended: bool,
    /// Resuming (or restoring) an interrupted session: a failure leaves it interrupted.
    #[serde(default)]
    pub from_interrupted: bool,
}

async fn restore_session(state: &AppState, op: &OperationRecord) -> AppResult<()> {
    let id = session_of(op)?;
    let input: RestoreInput = serde_json::from_str(op.input.as_deref().unwrap_or(""))
        .map_err(|e| AppError::internal(format!("bad restore operation input: {e}")))?;
    let Some(record) = state.store.session_any(&id).await? else {
        return Ok(());
    };
    if record.session.state != SessionState::Restoring {
        return Ok(());
    }
    let previous = record.session.sandbox_id.clone().filter(|s| *s != input.sandbox);
    if let Some(node) = reachable_node(state, &id).await? {
        remove_sandbox(node.as_ref(), state, &input.sandbox).await?;
    }
    // An interrupted session's sandbox is on a lost node: nothing of it stays on a cordoned one.
    let resumed = input.from_suspended || input.from_interrupted;
    let reason = if resumed { RestoreReason::Resume } else { RestoreReason::Restore };
    match start_from_snapshot(state, &record, &input.snapshot, input.sandbox.clone(), reason).await {
        Ok((node, handle)) => {
            let retired: Vec<SandboxId> = state
                .store
                .live_sandboxes(&node.node_id())
                .await?
                .into_iter()
                .filter(|s| s.session_id == id && s.id != handle.id)
                .map(|s| s.id)
                .collect();
            // Frozen now, so the session's old processes stop as it moves on; torn down after
            // (the session already points at the new sandbox, so recovery removes them too).
            for sandbox in &retired {
                let _ = node.pause_sandbox(sandbox).await;
            }
            state.store.transition(&id, &[SessionState::Restoring], SessionState::Running, None).await?;
            let (kind, verb) = if resumed { ("resume", "resumed") } else { ("restore", "restored") };
            let message = format!("{verb} from snapshot {}", input.snapshot);
            crate::api::note(state, &id, kind, message).await;
            watch_exit(state.clone(), node.clone(), id, handle);
            remove_in_background(state.clone(), node, retired);
            Ok(())
        }
        Err(e) => {
            // Where the attempt recorded its sandbox, if it got that far.
            let node = reachable_node(state, &id).await?;
            if let Some(node) = &node {
                remove_sandbox(node.as_ref(), state, &input.sandbox).await?;
            }
            let back = match (input.from_suspended, input.from_interrupted) {
                (true, _) => Some(SessionState::Suspended),
                (_, true) => Some(SessionState::Interrupted),
                _ => None,
            };
            if let Some(back) = back {
                let message = format!("resume failed: {}", e.0.message);
                state.store.transition(&id, &[SessionState::Restoring], back, Some(&message)).await?;
            } else {
                roll_back_restore(state, node, &id, previous, &e.0.message).await?;
            }
            Err(e)
        }
    }
}

/// The session's node (that of its newest sandbox), unless it is lost: nothing there can be
/// reached, and what the session had there is gone with it.
async fn reachable_node(state: &AppState, id: &SessionId) -> AppResult<Option<Arc<dyn NodeApi>>> {
    let Some(node_id) = state.store.session_any(id).await?.and_then(|r| r.session.node) else { return Ok(None) };
    if crate::placement::lost_nodes(state).await?.contains(&node_id) {
        return Ok(None);
    }
    Ok(state.nodes.find(&node_id).cloned())
}

/// A failed restore returns to the sandbox the session had, running (thawed), if it is
/// still alive; otherwise the session fails.
async fn roll_back_restore(
    state: &AppState,
    node: Option<Arc<dyn NodeApi>>,
    id: &SessionId,
    previous: Option<SandboxId>,
    message: &str,
) -> AppResult<()> {
    let alive = match &node {
        Some(node) => {
            let live = state.store.live_sandboxes(&node.node_id()).await?;
            alive_handle(node.as_ref(), &live, previous.as_ref()).await.map(|h| (node.clone(), h))
        }
        None => None,
    };
    let message = format!("restore failed: {message}");
    match alive {
        Some((node, handle)) => {
            let _ = node.resume_sandbox(&handle.id).await;
            state.store.set_session_sandbox(id, &handle.id).await?;
            state.store.transition(id, &[SessionState::Restoring], SessionState::Running, Some(&message)).await?;
            watch_exit(state.clone(), node, id.clone(), handle);
        }
        None => {
            state.store.transition(id, &[SessionState::Restoring], SessionState::Failed, Some(&message)).await?;
        }
    }
    Ok(())
}

async fn destroy_session(state: &AppState, op: &OperationRecord) -> AppResult<()> {
    let id = session_of(op)?;
    let Some(record) = state.store.session_any(&id).await? else {
        return Ok(());
    };
    if record.session.state != SessionState::Destroying {
        return Ok(());
    }
    let mut last_error = None;
    // A session never placed has nothing on any node.
    if record.session.node.is_some() {
        let node = state.nodes.of(&record.session)?;
        for sandbox in state.store.live_sandboxes(&node.node_id()).await? {
            if sandbox.session_id != id {
                continue;
            }
            if let Err(e) = remove_sandbox(node.as_ref(), state, &sandbox.id).await {
                last_error = Some(e.0.message);
            }
        }
        // Those that outlive the session stay, on its node, until they are deleted.
        for snapshot in state.store.list_snapshots(&id).await?.into_iter().filter(|s| !s.outlives_session) {
            if let Some(left) = crate::durable::delete_snapshot(state, &record.session, &snapshot.id).await? {
                last_error = Some(left);
            }
        }
    }
    state.activity.forget(&id);
    crate::egress::forget_session(state, &record.session).await;
    // The session ends either way; leftovers are retried by the periodic sweep.
    state.store.transition(&id, &[SessionState::Destroying], SessionState::Destroyed, last_error.as_deref()).await?;
    Ok(())
}

/// The handle of `sandbox` among the recorded `live` sandboxes, if its pid 1 still runs
/// (adopted by this process: it may have been started by an earlier one).
pub async fn alive_handle(
    node: &dyn NodeApi,
    live: &[SandboxRecord],
    sandbox: Option<&SandboxId>,
) -> Option<SandboxHandle> {
    let record = live.iter().find(|s| Some(&s.id) == sandbox)?;
    node.adopt(&record.id, record.pid?).await
}

/// Destroys a sandbox's resources on `node` and marks it gone. Idempotent.
pub async fn remove_sandbox(node: &dyn NodeApi, state: &AppState, sandbox: &SandboxId) -> AppResult<()> {
    node.destroy_sandbox(sandbox).await?;
    state.store.set_sandbox_gone(sandbox).await?;
    Ok(())
}

/// Removes sandboxes of `node` a session no longer uses, off the caller's path.
fn remove_in_background(state: AppState, node: Arc<dyn NodeApi>, sandboxes: Vec<SandboxId>) {
    if sandboxes.is_empty() {
        return;
    }
    state.reconciler.tasks.clone().spawn(async move {
        for sandbox in sandboxes {
            if let Err(e) = remove_sandbox(node.as_ref(), &state, &sandbox).await {
                tracing::warn!(%sandbox, error = %e.0.message, "cannot remove a retired sandbox; recovery will");
            }
        }
    });
}

/// When a sandbox's pid 1 (or VMM) dies on its own, the session fails with a recorded reason;
/// it can be restored from a snapshot, or destroyed.
pub fn watch_exit(state: AppState, node: Arc<dyn NodeApi>, session: SessionId, handle: SandboxHandle) {
    tokio::spawn(async move {
        node.wait_exit(&handle).await;
        let still_ours = matches!(
            state.store.session_any(&session).await,
            Ok(Some(r)) if matches!(r.session.state, SessionState::Running | SessionState::Paused)
                && r.session.sandbox_id.as_ref() == Some(&handle.id)
        );
        if !still_ours {
            return;
        }
        let why = node
            .exit_reason(&handle.id)
            .await
            .map(|r| format!(" ({})", space_api::error::clip(&r)))
            .unwrap_or_default();
        let message = format!(
            "sandbox_exited: the sandbox exited unexpectedly{why}; restore one of the session's snapshots \
             (POST /v1/sessions/{session}/restore) or destroy it"
        );
        let from = [SessionState::Running, SessionState::Paused];
        let _ = state.store.transition(&session, &from, SessionState::Failed, Some(&message)).await;
        let _ = remove_sandbox(node.as_ref(), &state, &handle.id).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_is_running_while_any_of_its_tasks_is() {
        let reconciler = Reconciler::new();
        let id = OperationId::generate();
        let first = Running::new(&reconciler.running, id.clone());
        let second = Running::new(&reconciler.running, id.clone());
        drop(first);
        assert_eq!(reconciler.running(), vec![id]);
        drop(second);
        assert!(reconciler.running().is_empty());
    }
}
