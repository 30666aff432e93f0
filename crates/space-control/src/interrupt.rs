//! Sessions of a lost node (docs/control-plane.md, "Lost nodes"). A running or paused session
//! whose node is lost becomes `interrupted`: its sandbox may still run there (a lease that
//! ran out does not prove a node dead), so nothing is started elsewhere on its own unless the
//! session asks for it (`auto_resume`). `resume` continues it on its sandbox if the node is
//! back, else from its newest durable full snapshot on another node. When a lost node
//! answers again, its interrupted sessions whose sandbox lives run on, the sandboxes of
//! sessions that moved away meanwhile are removed from it, and it is handed its sessions'
//! egress again.

use std::collections::HashSet;
use std::time::Duration;

use space_api::error::ErrorCode;
use space_api::{SandboxId, Session, SessionId, SessionState, Snapshot, SnapshotKind};
use space_node_api::NodeApi;
use space_store::SessionRecord;

use crate::AppState;
use crate::api::{find_session, note, run_restore};
use crate::auth::Caller;
use crate::error::{AppError, AppResult};
use crate::reconciler::{RestoreInput, alive_handle, remove_sandbox};
use crate::recovery::placed_on;

/// How often the lost nodes are looked at: as often as nodes beat.
const EVERY: Duration = crate::nodes::HEARTBEAT_EVERY;

/// Looks at the lost nodes, and at suspends whose replica stopped, every [`EVERY`], on a task
/// of its own (what it does may wait for a session's lock, which must not hold up heartbeats).
pub fn spawn(state: AppState) {
    tokio::spawn(async move {
        let mut lost_before: HashSet<String> = HashSet::new();
        loop {
            tokio::time::sleep(EVERY).await;
            match round(&state, &lost_before).await {
                Ok(lost) => lost_before = lost,
                Err(e) => tracing::warn!(error = %e.0.message, "sessions of lost nodes"),
            }
            // As often, and for the same reason (a replica, not a node, stopped): suspends
            // left half done.
            if let Err(e) = crate::recovery::finish_abandoned_suspends(&state).await {
                tracing::warn!(error = %e.0.message, "abandoned suspends");
            }
        }
    });
}

/// Interrupts the sessions of the nodes lost now and settles those of the nodes that were
/// lost in the last round and are back; returns the nodes lost now.
async fn round(state: &AppState, lost_before: &HashSet<String>) -> AppResult<HashSet<String>> {
    let lost = crate::placement::lost_nodes(state).await?;
    for node in lost_before.difference(&lost) {
        if let Err(e) = returned(state, node).await {
            tracing::warn!(node = %node, error = %e.0.message, "a node that is back could not be settled");
        }
    }
    if lost.is_empty() {
        return Ok(lost);
    }
    for record in state.store.sessions_in_states(&[SessionState::Running, SessionState::Paused]).await? {
        if let Some(node) = record.session.node.clone().filter(|n| lost.contains(n)) {
            interrupt(state, &record, &node).await?;
        }
    }
    Ok(lost)
}

/// The newest full snapshot of the session that is durable (can start on any node).
async fn newest_durable(state: &AppState, session: &SessionId) -> AppResult<Option<Snapshot>> {
    let snapshots = state.store.list_snapshots(session).await?;
    Ok(snapshots.into_iter().rev().find(|s| s.kind == SnapshotKind::Full && s.durable))
}

async fn interrupt(state: &AppState, record: &SessionRecord, node: &str) -> AppResult<()> {
    let session = &record.session;
    let Some(newest) = mark(state, session, node).await? else { return Ok(()) };
    if session.auto_resume && newest.is_some() {
        let (state, caller, session) = (state.clone(), Caller::acting_for(record.tenant_id.clone()), session.clone());
        tokio::spawn(async move {
            match resume(&state, &caller, &session).await {
                Ok(resumed) => note(&state, &session.id, "auto_resume", moved_message(&resumed)).await,
                Err(e) => {
                    tracing::warn!(session = %session.id, error = %e.0.message, "cannot resume an interrupted session")
                }
            }
        });
    }
    Ok(())
}

/// Marks a running or paused `session` of lost node `node` interrupted. `None` if it was in
/// another state by then; else its newest durable full snapshot, if any.
async fn mark(state: &AppState, session: &Session, node: &str) -> AppResult<Option<Option<Snapshot>>> {
    let newest = newest_durable(state, &session.id).await?;
    let then = match &newest {
        Some(s) => format!(
            "its newest durable snapshot is {} (full, taken at {} ms since the epoch): resume continues from it on \
             another node, or on its sandbox if node {node} comes back",
            s.id, s.created_at
        ),
        None => format!("it has no durable full snapshot: it continues once node {node} is back"),
    };
    let message = format!("interrupted: node {node} was lost while the session ran there; {then}");
    let from = [SessionState::Running, SessionState::Paused];
    if !state.store.transition(&session.id, &from, SessionState::Interrupted, Some(&message)).await? {
        return Ok(None);
    }
    tracing::warn!(session = %session.id, node, durable = newest.is_some(), "session interrupted: its node is lost");
    Ok(Some(newest))
}

/// A restore of a running or paused session whose node is lost (before the next round marked
/// it) marks it interrupted first, as the round would: it is then restored as one. Returns
/// the session as it is then.
pub async fn if_node_lost(state: &AppState, caller: &Caller, session: &Session) -> AppResult<Session> {
    let has_sandbox = matches!(session.state, SessionState::Running | SessionState::Paused);
    let Some(node) = session.node.as_deref().filter(|_| has_sandbox) else { return Ok(session.clone()) };
    if !crate::placement::lost_nodes(state).await?.contains(node) {
        return Ok(session.clone());
    }
    mark(state, session, node).await?;
    find_session(state, caller, session.id.as_str()).await
}

fn moved_message(session: &Session) -> String {
    let node = session.node.as_deref().unwrap_or("(unknown)");
    format!("resumed on node {node}: its node was lost (auto_resume)")
}

/// Resumes an interrupted session (see the module docs). Under the session's lock: resumes
/// that come together resume it once.
pub async fn resume(state: &AppState, caller: &Caller, session: &Session) -> AppResult<Session> {
    let _guard = state.session_lock(&session.id).await;
    let session = find_session(state, caller, session.id.as_str()).await?;
    if session.state != SessionState::Interrupted {
        return match session.state {
            SessionState::Running => Ok(session),
            _ => Err(crate::api::invalid_state(&session, "be resumed")),
        };
    }
    if reattach(state, &session).await? {
        return find_session(state, caller, session.id.as_str()).await;
    }
    let Some(snapshot) = newest_durable(state, &session.id).await? else {
        let node = session.node.as_deref().unwrap_or("(unknown)");
        return Err(AppError::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "session {} was interrupted: node {node} is lost and the session has no durable full snapshot to \
                 continue from elsewhere; resume it once node {node} is back (`space node list`)",
                session.id
            ),
        ));
    };
    let input = RestoreInput {
        snapshot: snapshot.id,
        sandbox: SandboxId::generate(),
        from_suspended: false,
        from_interrupted: true,
    };
    run_restore(state, caller, &session.id, input, &[SessionState::Interrupted], "be resumed").await
}

/// Puts an interrupted session back on its sandbox if its node is back and the sandbox
/// lives (thawed: a resume runs it). Returns whether it did.
async fn reattach(state: &AppState, session: &Session) -> AppResult<bool> {
    let Some(node_id) = session.node.as_deref() else { return Ok(false) };
    if crate::placement::lost_nodes(state).await?.contains(node_id) {
        return Ok(false);
    }
    let Some(node) = state.nodes.find(node_id).cloned() else { return Ok(false) };
    let live = state.store.live_sandboxes(node_id).await?;
    let Some(handle) = alive_handle(node.as_ref(), &live, session.sandbox_id.as_ref()).await else {
        return Ok(false);
    };
    node.resume_sandbox(&handle.id).await?;
    let message = format!("node {node_id} is back: the session runs on its sandbox there");
    if !state.store.transition(&session.id, &[SessionState::Interrupted], SessionState::Running, None).await? {
        return Ok(false);
    }
    note(state, &session.id, "resume", message).await;
    Ok(true)
}

/// A node that was lost answers again: its interrupted sessions whose sandbox lives run on,
/// and the sandboxes of sessions that moved to another node meanwhile are removed from it.
async fn returned(state: &AppState, node_id: &str) -> AppResult<()> {
    tracing::info!(node = node_id, "a lost node is back");
    for record in placed_on(state, node_id, &[SessionState::Interrupted]).await? {
        let _guard = state.session_lock(&record.session.id).await;
        if let Some(current) = state.store.session_any(&record.session.id).await?
            && current.session.state == SessionState::Interrupted
        {
            reattach(state, &current.session).await?;
        }
    }
    let node = state.nodes.get(node_id)?;
    remove_moved(state, node.as_ref()).await?;
    push_egress(state, node_id).await
}

/// Hands the egress of every session placed on `node_id` to it again: a node that restarted
/// while it was lost has forgotten what it was given (its gateway keeps it in memory).
pub(crate) async fn push_egress(state: &AppState, node_id: &str) -> AppResult<()> {
    use SessionState::*;
    let placed = [Creating, Running, Paused, Restoring, Suspending, Suspended, Failed, Interrupted];
    for record in placed_on(state, node_id, &placed).await? {
        if let Err(e) = crate::egress::push_session_cached(state, &record.session.id).await {
            tracing::warn!(session = %record.session.id, error = %e.0.message, "cannot hand a session's egress to its node again");
        }
    }
    Ok(())
}

/// Removes from `node` the sandboxes of sessions whose newest sandbox is on another node
/// (they moved while this node was lost), or that were destroyed. A session whose newest
/// sandbox is on this node keeps every sandbox here: a restore may be starting one.
async fn remove_moved(state: &AppState, node: &dyn NodeApi) -> AppResult<()> {
    let node_id = node.node_id();
    for sandbox in state.store.live_sandboxes(&node_id).await? {
        let session = state.store.session_any(&sandbox.session_id).await?;
        let stays = session.is_some_and(|r| {
            r.session.state != SessionState::Destroyed && r.session.node.as_deref() == Some(node_id.as_str())
        });
        if stays {
            continue;
        }
        match remove_sandbox(node, state, &sandbox.id).await {
            Ok(()) => {
                tracing::info!(sandbox = %sandbox.id, node = %node_id, "removed the sandbox of a session that moved")
            }
            Err(e) => {
                tracing::warn!(sandbox = %sandbox.id, error = %e.0.message, "cannot remove a moved session's sandbox")
            }
        }
    }
    Ok(())
}
