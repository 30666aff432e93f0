//! Start-up recovery: whatever instant the previous process died at, converge before serving.
//!
//! 1. Operations that were running are queued again (each step is idempotent).
//! 2. Running sessions whose sandbox survived are kept (spaced outlives the server); those
//!    whose sandbox is gone fail with a recorded reason.
//! 3. Every node resource (cgroup, socket, subvolume) not owned by a kept sandbox is destroyed.
//!
//! Snapshots come first: one a crash interrupted is deleted, so a `suspending` session whose
//! full snapshot is listed is known to be resumable.
//!
//! Recovery never stops the server from starting over something left on the node: a node
//! resource that cannot be removed (a busy directory, an immutable file) is logged and left
//! for the next start. Only the database's errors stop it, since nothing can be decided
//! without it.

use std::collections::HashSet;

use space_api::{SandboxId, SessionState, SnapshotKind};

use crate::AppState;
use crate::error::AppResult;
use crate::reconciler::{alive_handle, remove_sandbox, watch_exit};

pub async fn recover(state: &AppState) -> AppResult<()> {
    let requeued = state.store.requeue_running_operations().await?;
    state.store.idempotency_interrupt_unfinished().await?;
    state.store.idempotency_expire(space_store::now_ms() - crate::idempotency::RETENTION_MS).await?;
    let mut keep: HashSet<SandboxId> = HashSet::new();
    let snapshots = recover_snapshots(state).await?;
    let suspending = state.store.sessions_in_states(&[SessionState::Suspending]).await?;
    let sandboxes = state.store.live_sandboxes(&state.node_id).await?;
    for record in suspending {
        finish_suspend(state, &record.session, &sandboxes).await?;
    }
    let running = state.store.sessions_in_states(&[SessionState::Running, SessionState::Paused]).await?;
    for record in running {
        let id = &record.session.id;
        match alive_handle(state, &sandboxes, record.session.sandbox_id.as_ref()).await {
            Some(handle) => {
                // A crash between freezing and recording the state leaves them disagreeing:
                // the recorded state wins.
                let frozen = match record.session.state {
                    SessionState::Paused => state.node.pause_sandbox(&handle.id).await,
                    _ => state.node.resume_sandbox(&handle.id).await,
                };
                if let Err(e) = frozen {
                    // A session that reads `running` must answer: one left frozen would not.
                    tracing::warn!(session = %id, error = %e, "cannot bring the sandbox to its recorded state");
                    let message = format!(
                        "the sandbox could not be brought back to {:?} after a restart: {e}; destroy \
                         the session, or restore it from a snapshot",
                        record.session.state
                    );
                    let from = [SessionState::Running, SessionState::Paused];
                    state.store.transition(id, &from, SessionState::Failed, Some(&message)).await?;
                    continue;
                }
                // A root started where limits were not yet enforced gets them now.
                if let Err(e) = state.node.limit_disk(&handle.id, &crate::reconciler::disk_quota(&record.session)).await
                {
                    tracing::warn!(session = %id, error = %e, "cannot apply the session's disk limit");
                }
                // The gateway's listeners died with the previous process.
                if let Err(e) = state.node.reattach_gateway(&handle, id).await {
                    tracing::warn!(session = %id, error = %e, "the sandbox has no egress until it is restored");
                }
                keep.insert(handle.id.clone());
                watch_exit(state.clone(), id.clone(), handle);
            }
            None => {
                let message = "the sandbox stopped while the server was down; destroy the session and create a new one";
                let from = [SessionState::Running, SessionState::Paused];
                state.store.transition(id, &from, SessionState::Failed, Some(message)).await?;
            }
        }
    }
    let mut removed = 0;
    for sandbox in &sandboxes {
        if !keep.contains(&sandbox.id) {
            match remove_sandbox(state, &sandbox.id).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox.id, error = %e.0.message, "cannot remove; next start tries again")
                }
            }
        }
    }
    let orphans = state.node.sweep(&keep).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot sweep the node's orphans; next start tries again");
        Vec::new()
    });
    tracing::info!(requeued, removed, orphans = orphans.len(), kept = keep.len(), snapshots, "recovered");
    Ok(())
}

/// A suspend the crash interrupted: if its full snapshot was completed, the session is
/// suspended (the sandbox is removed below with the other unkept ones); otherwise it goes back
/// to running on its sandbox, or fails if that is gone too.
async fn finish_suspend(
    state: &AppState,
    session: &space_api::Session,
    sandboxes: &[space_store::SandboxRecord],
) -> AppResult<()> {
    let id = &session.id;
    let snapshots = state.store.list_snapshots(id).await?;
    let suspended_at =
        state.store.events(id).await?.iter().rev().find(|e| e.to_state == Some(SessionState::Suspending)).map(|e| e.at);
    let snapshot_taken = snapshots.iter().any(|s| s.kind == SnapshotKind::Full && Some(s.created_at) >= suspended_at);
    let alive = alive_handle(state, sandboxes, session.sandbox_id.as_ref()).await.is_some();
    let (to, message) = match (snapshot_taken, alive) {
        (true, _) => (SessionState::Suspended, None),
        (false, true) => (SessionState::Running, Some("the server stopped during a suspend; the session kept running")),
        (false, false) => (SessionState::Failed, Some("the server stopped during a suspend and the sandbox is gone")),
    };
    state.store.transition(id, &[SessionState::Suspending], to, message).await?;
    Ok(())
}

/// Snapshots a crash interrupted are deleted (they were never listed); snapshot directories
/// without a row are orphans. Returns how many were removed.
async fn recover_snapshots(state: &AppState) -> AppResult<usize> {
    let mut keep = HashSet::new();
    for (session, snapshot, ready) in state.store.all_snapshots().await? {
        if ready {
            keep.insert(snapshot);
        } else {
            state.store.delete_snapshot_row(&snapshot).await?;
            // Without its row it is an orphan, which the sweep below (or the next) removes.
            if let Err(e) = state.node.delete_snapshot(&session, &snapshot).await {
                tracing::warn!(%snapshot, error = %e, "cannot delete an interrupted snapshot");
            }
        }
    }
    Ok(state.node.sweep_snapshots(&keep).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot remove orphaned snapshots; next start tries again");
        0
    }))
}
