//! Cordon and drain (docs/control-plane.md, "Placement": cordon and drain). A cordoned node takes no new
//! sessions, and resumes and forks from durable snapshots kept on it start elsewhere
//! ([`crate::durable::node_for_snapshot`]). A drain cordons the node and moves every session
//! off it with nothing lost: a running or paused one is suspended into a durable snapshot and
//! resumed on another node (paused again if it was); a suspended one has its newest full
//! snapshot stored in the blob store, so that it resumes on another node.

use space_api::error::ErrorCode;
use space_api::{DrainFailure, DrainReport, Node, Session, SessionId, SessionState, SnapshotKind};
use space_store::{SessionRecord, now_ms};

use crate::AppState;
use crate::api::{find_session, note};
use crate::auth::Caller;
use crate::error::{AppError, AppResult};

/// Cordons node `id` (`cordoned`) or lifts its cordon; answers the node as it is then.
pub async fn set_cordoned(state: &AppState, id: &str, cordoned: bool) -> AppResult<Node> {
    require_several_nodes(state, id)?;
    if !state.store.set_node_cordoned(id, cordoned).await? {
        return Err(unknown_node(id));
    }
    let verb = if cordoned { "cordoned: it takes no new sessions" } else { "uncordoned: it takes new sessions again" };
    tracing::info!(node = id, "node {verb}");
    crate::nodes::one(state, id, now_ms()).await?.ok_or_else(|| unknown_node(id))
}

/// Cordons node `id` and moves its sessions off it, one at a time (see the module docs).
/// Sessions that could not be moved are reported, still on the node; a drain may be repeated.
pub async fn drain(state: &AppState, id: &str) -> AppResult<DrainReport> {
    let node = set_cordoned(state, id, true).await?;
    if node.state == space_api::NodeState::Lost {
        return Err(AppError::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "node {id} is lost, so its sessions cannot be suspended; it is cordoned now. Suspended sessions \
                 whose snapshots are durable resume on other nodes already; drain again once it is back"
            ),
        ));
    }
    let mut report = DrainReport { node, moved: Vec::new(), durable: Vec::new(), failed: Vec::new() };
    // What the node lacks for every session (no blob store, no checkpoints): the rest are
    // not suspended only to come back where they were.
    let mut node_lacks: Option<AppError> = None;
    for record in sessions_on(state, id).await? {
        let session = record.session.id.clone();
        let moved = match &node_lacks {
            Some(e) => Err(AppError::new(e.0.code, format!("not tried, as for an earlier session: {}", e.0.message))),
            None => move_off(state, id, record).await,
        };
        match moved {
            Ok(Moved::Running) => report.moved.push(session),
            Ok(Moved::Durable) => report.durable.push(session),
            Err(e) => {
                tracing::warn!(node = id, %session, error = %e.0.message, "drain: a session stays on the node");
                if e.0.code == ErrorCode::FeatureUnavailable && node_lacks.is_none() {
                    node_lacks = Some(AppError::new(e.0.code, e.0.message.clone()));
                }
                report.failed.push(DrainFailure { session, code: e.0.code, message: e.0.message });
            }
        }
    }
    report.node = crate::nodes::one(state, id, now_ms()).await?.ok_or_else(|| unknown_node(id))?;
    Ok(report)
}

/// Where a session went.
enum Moved {
    /// Its sandbox runs (or is paused) on another node.
    Running,
    /// It is suspended with its newest full snapshot in the blob store.
    Durable,
}

/// The sessions (not destroyed) whose newest sandbox is on node `id`, oldest first.
async fn sessions_on(state: &AppState, id: &str) -> AppResult<Vec<SessionRecord>> {
    use SessionState::*;
    let states = [Creating, Running, Paused, Restoring, Suspending, Suspended, Destroying, Failed, Interrupted];
    crate::recovery::placed_on(state, id, &states).await
}

async fn move_off(state: &AppState, node: &str, record: SessionRecord) -> AppResult<Moved> {
    let caller = Caller::acting_for(record.tenant_id);
    let session = record.session;
    match session.state {
        SessionState::Running | SessionState::Paused => move_running(state, node, &caller, &session).await,
        SessionState::Suspended => make_durable(state, node, &session).await.map(|()| Moved::Durable),
        SessionState::Failed => Err(AppError::new(
            ErrorCode::InvalidState,
            format!("session {} failed (its sandbox is gone); restore it from a snapshot, or destroy it", session.id),
        )),
        other => Err(AppError::new(
            ErrorCode::InvalidState,
            format!("session {} is {}; drain again once that is done", session.id, other.as_str()),
        )),
    }
}

/// Suspends the session into a durable snapshot and resumes it on another node: the node it
/// is on is cordoned, so the resume goes elsewhere.
async fn move_running(state: &AppState, node: &str, caller: &Caller, session: &Session) -> AppResult<Moved> {
    let paused = session.state == SessionState::Paused;
    crate::api::suspend_session(state, &caller.tenant_id, &session.id, false).await?;
    let durable = newest_full_is_durable(state, &session.id).await?;
    let suspended = find_session(state, caller, session.id.as_str()).await?;
    // Not durable: it can only resume where it was, which it does.
    let resumed = crate::api::resume_suspended(state, caller, &suspended).await.map_err(|e| {
        let message = format!(
            "session {} was suspended by the drain, with its processes in a durable snapshot, and could not be \
             resumed on another node: {}; resume it (`space session resume {}`)",
            session.id, e.0.message, session.id
        );
        AppError::new(e.0.code, message)
    })?;
    if paused {
        crate::api::set_frozen(state, caller, session.id.as_str(), true).await?;
    }
    if !durable {
        return Err(no_blob_store(node, session));
    }
    let to = resumed.node.as_deref().unwrap_or("(unknown)");
    note(state, &session.id, "drain", format!("moved from node {node} to node {to} by a drain of node {node}")).await;
    Ok(Moved::Running)
}

/// Stores the newest full snapshot of a suspended session in the blob store, unless it is
/// there already.
async fn make_durable(state: &AppState, node: &str, session: &Session) -> AppResult<()> {
    let _guard = state.session_lock(&session.id).await;
    let snapshots = state.store.list_snapshots(&session.id).await?;
    let Some(newest) = snapshots.iter().rev().find(|s| s.kind == SnapshotKind::Full) else {
        return Err(AppError::new(
            ErrorCode::SnapshotNotFound,
            format!("session {} is suspended without a full snapshot; restore or destroy it", session.id),
        ));
    };
    if newest.durable {
        return Ok(());
    }
    let on = state.nodes.get(node)?;
    match crate::durable::export(state, on.as_ref(), &session.id, &newest.id).await? {
        true => Ok(()),
        false => Err(no_blob_store(node, session)),
    }
}

async fn newest_full_is_durable(state: &AppState, session: &SessionId) -> AppResult<bool> {
    let snapshots = state.store.list_snapshots(session).await?;
    Ok(snapshots.iter().rev().find(|s| s.kind == SnapshotKind::Full).is_some_and(|s| s.durable))
}

fn no_blob_store(node: &str, session: &Session) -> AppError {
    AppError::new(
        ErrorCode::FeatureUnavailable,
        format!(
            "session {} stays on node {node}: the node has no blob store (`space node run --blob-store URL`), so \
             its snapshots cannot leave it",
            session.id
        ),
    )
}

/// Cordon and drain move sessions between nodes; `space serve`'s one node has no other.
fn require_several_nodes(state: &AppState, id: &str) -> AppResult<()> {
    if state.nodes.len() > 1 {
        return Ok(());
    }
    if state.nodes.find(id).is_none() {
        return Err(unknown_node(id));
    }
    Err(AppError::new(
        ErrorCode::Conflict,
        format!(
            "node {id} is this control plane's only node: cordoning or draining it would leave sessions nowhere \
             to go; drive several nodes (`space control --node A --node B`) to move sessions between them"
        ),
    ))
}

fn unknown_node(id: &str) -> AppError {
    AppError::new(
        ErrorCode::NotFound,
        format!("node {} not found; `space node list` shows the nodes", space_api::error::clip(id)),
    )
}
