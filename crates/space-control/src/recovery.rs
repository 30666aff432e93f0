//! Recovery: whatever instant a replica died at, converge.
//!
//! At a replica's start (`recover`):
//! 1. Operations its earlier process was running are queued again (each step is idempotent);
//!    other replicas' are theirs until their leases run out ([`crate::replicas`]).
//! 2. For each of its nodes that no live replica keeps, this one takes the node and recovers
//!    the sessions placed on it ([`Mode::Start`]):
//!    running sessions whose sandbox survived are kept (spaced outlives the server); those
//!    whose sandbox is gone fail with a recorded reason; every node resource (cgroup, socket,
//!    subvolume) not owned by a kept sandbox is destroyed.
//!
//! A replica that takes the node over from one that died while it was serving
//! ([`Mode::TakeOver`]) does step 2 without removing anything: the dead replica's half-done
//! creates, restores and destroys are its operations, which this one runs again; what else it
//! left is removed at the next start.
//!
//! Snapshots come first: one a crash interrupted is deleted, so a `suspending` session whose
//! full snapshot is listed is known to be resumable.
//!
//! Recovery never stops the server from starting over something left on the node: a node
//! resource that cannot be removed (a busy directory, an immutable file) is logged and left
//! for the next start. Only the database's errors stop it, since nothing can be decided
//! without it.

use std::collections::HashSet;
use std::sync::Arc;

use space_api::{SandboxId, Session, SessionId, SessionState, SnapshotKind};
use space_node_api::NodeApi;
use space_store::{SandboxRecord, SessionRecord, now_ms};

use crate::AppState;
use crate::api::suspend::{SUSPEND_LEASE, SUSPEND_LEASE_MS};
use crate::error::AppResult;
use crate::held::Held;
use crate::reconciler::{alive_handle, remove_sandbox, watch_exit};
use crate::replicas;

/// How the node is recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// At the start of the replica that keeps it: nothing else runs on it yet.
    Start,
    /// Taken over from a replica that died, while this one serves: only sessions are
    /// repaired, each under its lock, and nothing is removed.
    TakeOver,
}

/// A replica's start-up recovery. Returns the nodes this replica keeps (and recovered), each
/// with the incarnation it answered before its recovery (`None`: it did not answer).
pub async fn recover(state: &AppState) -> AppResult<Vec<(String, Option<String>)>> {
    let requeued = state.store.requeue_running_operations().await?;
    state.store.idempotency_interrupt_unfinished(true, now_ms()).await?;
    state.store.idempotency_expire(now_ms() - crate::idempotency::RETENTION_MS).await?;
    tracing::info!(requeued, "requeued this replica's operations");
    let mut kept = Vec::new();
    for (id, _) in state.nodes.iter() {
        if !replicas::keep_node(state, id).await? {
            let keeper = state.store.lease_holder(&replicas::node_lease(id), now_ms()).await?;
            tracing::info!(node = %id, keeper = ?keeper, "another replica keeps the node; this one takes it over if that one dies");
            continue;
        }
        let asked = tokio::time::timeout(crate::placement::ASK, state.nodes.get(id)?.incarnation()).await;
        recover_node(state, id, Mode::Start).await?;
        kept.push((id.to_owned(), asked.ok().and_then(Result::ok)));
    }
    Ok(kept)
}

/// The sessions in `states` placed on node `id`.
pub(crate) async fn placed_on(state: &AppState, id: &str, states: &[SessionState]) -> AppResult<Vec<SessionRecord>> {
    let records = state.store.sessions_in_states(states).await?;
    Ok(records.into_iter().filter(|r| r.session.node.as_deref() == Some(id)).collect())
}

/// Converges the sessions on node `id` on what the store says (see the module's doc).
pub async fn recover_node(state: &AppState, id: &str, mode: Mode) -> AppResult<()> {
    let node = state.nodes.get(id)?;
    let snapshots = match mode {
        Mode::Start => recover_snapshots(state, id, &node).await?,
        // Unfinished snapshots may be this replica's, being taken.
        Mode::TakeOver => 0,
    };
    let mut keep: HashSet<SandboxId> = HashSet::new();
    let sandboxes = state.store.live_sandboxes(id).await?;
    // Taking over, a suspend is finished once its lease runs out (see
    // `finish_abandoned_suspends`); it may be another live replica's.
    for record in placed_on(state, id, &[SessionState::Suspending]).await? {
        let _guard = state.session_lock(&record.session.id).await;
        if mode == Mode::Start
            && abandoned_at_start(state, &record.session.id).await?
            && let Some(current) = state.store.session_any(&record.session.id).await?
            && current.session.state == SessionState::Suspending
        {
            finish_suspend(state, node.as_ref(), &current.session, &sandboxes).await?;
        }
    }
    let with_sandbox = [SessionState::Running, SessionState::Paused, SessionState::Interrupted];
    for record in placed_on(state, id, &with_sandbox).await? {
        if let Some(kept) = recover_session(state, &node, &record.session.id, &sandboxes, mode).await? {
            keep.insert(kept);
        }
    }
    if mode == Mode::TakeOver {
        tracing::info!(node = %id, kept = keep.len(), "took the node over");
        return Ok(());
    }
    let mut removed = 0;
    for sandbox in &sandboxes {
        if !keep.contains(&sandbox.id) {
            match remove_sandbox(node.as_ref(), state, &sandbox.id).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox.id, error = %e.0.message, "cannot remove; next start tries again")
                }
            }
        }
    }
    let orphans = node.sweep(&keep).await.unwrap_or_else(|e| {
        tracing::warn!(node = %id, error = %e, "cannot sweep the node's orphans; next start tries again");
        Vec::new()
    });
    tracing::info!(node = %id, removed, orphans = orphans.len(), kept = keep.len(), snapshots, "recovered the node");
    Ok(())
}

/// A running or paused session, under its lock: kept on its sandbox (returned) if that
/// lives, else failed with the reason.
async fn recover_session(
    state: &AppState,
    node: &Arc<dyn NodeApi>,
    id: &SessionId,
    sandboxes: &[SandboxRecord],
    mode: Mode,
) -> AppResult<Option<SandboxId>> {
    let _guard = state.session_lock(id).await;
    let Some(record) = state.store.session_any(id).await? else { return Ok(None) };
    let was = record.session.state;
    if !matches!(was, SessionState::Running | SessionState::Paused | SessionState::Interrupted) {
        return Ok(None);
    }
    let sandbox = record.session.sandbox_id.as_ref();
    // Taking over, this replica serves meanwhile: the session may have moved to a sandbox
    // recorded after the list was read.
    let fresh;
    let sandboxes = if mode == Mode::TakeOver && !sandboxes.iter().any(|s| Some(&s.id) == sandbox) {
        fresh = state.store.live_sandboxes(&node.node_id()).await?;
        &fresh
    } else {
        sandboxes
    };
    let Some(handle) = alive_handle(node.as_ref(), sandboxes, sandbox).await else {
        if was == SessionState::Interrupted {
            // Its node was lost and its sandbox is gone: it resumes from its durable snapshot.
            return Ok(None);
        }
        let message = "the sandbox stopped while the server was down; destroy the session and create a new one";
        let from = [SessionState::Running, SessionState::Paused];
        state.store.transition(id, &from, SessionState::Failed, Some(message)).await?;
        return Ok(None);
    };
    // A crash between freezing and recording the state leaves them disagreeing: the recorded
    // state wins.
    let frozen = match record.session.state {
        SessionState::Paused => node.pause_sandbox(&handle.id).await,
        _ => node.resume_sandbox(&handle.id).await,
    };
    if let Err(e) = frozen {
        // A session that reads `running` must answer: one left frozen would not.
        tracing::warn!(session = %id, error = %e, "cannot bring the sandbox to its recorded state");
        let message = format!(
            "the sandbox could not be brought back to {:?} after a restart: {e}; destroy the session, or \
             restore it from a snapshot",
            record.session.state
        );
        let from = [SessionState::Running, SessionState::Paused];
        state.store.transition(id, &from, SessionState::Failed, Some(&message)).await?;
        return Ok(None);
    }
    // A root started where limits were not yet enforced gets them now.
    if let Err(e) = node.limit_disk(&handle.id, &crate::reconciler::disk_quota(&record.session)).await {
        tracing::warn!(session = %id, error = %e, "cannot apply the session's disk limit");
    }
    // The gateway's listeners died with the previous process.
    if let Err(e) = node.reattach_gateway(&handle, id).await {
        tracing::warn!(session = %id, error = %e, "the sandbox has no egress until it is restored");
    }
    // Interrupted while its node was lost, and the node is back with its sandbox: it runs on.
    if was == SessionState::Interrupted {
        let message = format!("node {} is back: the session runs on its sandbox there", node.node_id());
        if state.store.transition(id, &[was], SessionState::Running, None).await? {
            crate::api::note(state, id, "resume", message).await;
        }
    }
    let kept = handle.id.clone();
    watch_exit(state.clone(), node.clone(), id.clone(), handle);
    Ok(Some(kept))
}

/// Whether a `suspending` session's suspend was abandoned, at this replica's start: nobody
/// holds its lease, or this replica's earlier process did (it is dead: this one starts).
async fn abandoned_at_start(state: &AppState, id: &SessionId) -> AppResult<bool> {
    let holder = state.store.lease_holder(&format!("{SUSPEND_LEASE}{id}"), now_ms()).await?;
    Ok(holder.is_none_or(|h| crate::held::replica_of(&h) == Some(state.store.replica())))
}

/// Finishes every suspend abandoned while replicas serve: a session `suspending` whose
/// suspend's lease ran out (its replica died, or its request was dropped). Each is taken
/// under that lease and the session's lock, so one replica finishes it.
pub async fn finish_abandoned_suspends(state: &AppState) -> AppResult<()> {
    for record in state.store.sessions_in_states(&[SessionState::Suspending]).await? {
        let id = &record.session.id;
        let Some(held) = Held::take(state, &format!("{SUSPEND_LEASE}{id}"), SUSPEND_LEASE_MS).await? else { continue };
        // One that cannot be finished now (its node does not answer) does not hold the others.
        if let Err(e) = finish_abandoned(state, id).await {
            tracing::warn!(session = %id, error = %e.0.message, "cannot finish an abandoned suspend; trying again later");
        }
        held.release().await;
    }
    Ok(())
}

/// [`finish_suspend`] of session `id` if it is still `suspending`, then its sandbox removed
/// (suspended) or thawed (running again).
async fn finish_abandoned(state: &AppState, id: &SessionId) -> AppResult<()> {
    let _guard = state.session_lock(id).await;
    let Some(record) = state.store.session_any(id).await? else { return Ok(()) };
    if record.session.state != SessionState::Suspending {
        return Ok(());
    }
    let node = state.nodes.of(&record.session)?;
    let sandboxes = state.store.live_sandboxes(&node.node_id()).await?;
    let to = finish_suspend(state, node.as_ref(), &record.session, &sandboxes).await?;
    tracing::info!(session = %id, to = ?to, "finished a suspend whose replica stopped");
    let Some(sandbox) = record.session.sandbox_id.as_ref() else { return Ok(()) };
    match to {
        SessionState::Suspended => remove_sandbox(node.as_ref(), state, sandbox).await?,
        SessionState::Running => {
            if let Err(e) = node.resume_sandbox(sandbox).await {
                tracing::warn!(session = %id, error = %e, "cannot thaw the sandbox of an abandoned suspend");
            }
        }
        _ => {}
    }
    Ok(())
}

/// A suspend the crash interrupted: if its full snapshot was completed, the session is
/// suspended (at a replica's start, the sandbox is removed below with the other unkept ones);
/// otherwise it goes back to running on its sandbox, or fails if that is gone too. Returns the
/// state it is in now.
async fn finish_suspend(
    state: &AppState,
    node: &dyn NodeApi,
    session: &Session,
    sandboxes: &[SandboxRecord],
) -> AppResult<SessionState> {
    let id = &session.id;
    let snapshots = state.store.list_snapshots(id).await?;
    let suspended_at =
        state.store.events(id).await?.iter().rev().find(|e| e.to_state == Some(SessionState::Suspending)).map(|e| e.at);
    let snapshot_taken = snapshots.iter().any(|s| s.kind == SnapshotKind::Full && Some(s.created_at) >= suspended_at);
    let alive = alive_handle(node, sandboxes, session.sandbox_id.as_ref()).await.is_some();
    let (to, message) = match (snapshot_taken, alive) {
        (true, _) => (SessionState::Suspended, None),
        (false, true) => (SessionState::Running, Some("the server stopped during a suspend; the session kept running")),
        (false, false) => (SessionState::Failed, Some("the server stopped during a suspend and the sandbox is gone")),
    };
    state.store.transition(id, &[SessionState::Suspending], to, message).await?;
    Ok(to)
}

/// Snapshots a crash interrupted on node `id` are deleted (they were never listed); snapshot
/// directories without a row are orphans. Returns how many were removed.
async fn recover_snapshots(state: &AppState, id: &str, node: &Arc<dyn NodeApi>) -> AppResult<usize> {
    let mut keep = HashSet::new();
    for (session, snapshot, ready) in state.store.all_snapshots().await? {
        if ready {
            keep.insert(snapshot);
            continue;
        }
        let placed = state.store.session_any(&session).await?.and_then(|r| r.session.node);
        if placed.as_deref() != Some(id) {
            continue;
        }
        state.store.delete_snapshot_row(&snapshot).await?;
        // Without its row it is an orphan, which the sweep below (or the next) removes.
        if let Err(e) = node.delete_snapshot(&session, &snapshot).await {
            tracing::warn!(%snapshot, error = %e, "cannot delete an interrupted snapshot");
        }
    }
    Ok(node.sweep_snapshots(&keep).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot remove orphaned snapshots; next start tries again");
        0
    }))
}
