//! Suspend: a full snapshot of the session, then its sandbox is destroyed and every node
//! resource it held is freed; resume restores that snapshot in a new sandbox.

use axum::Extension;
use axum::extract::State;
use space_api::{
    ErrorBody, ErrorCode, SandboxId, Session, SessionId, SessionLifetime, SessionState, Snapshot, SnapshotKind,
    TenantId,
};
use space_node_api::NodeApi;

use super::find_session;
use super::lifecycle::{
    invalid_state, live_session, note_snapshot, require_checkpoints, run_restore, sandbox_of, snapshot_locked,
};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiQuery, AppError, AppResult};
use crate::held::Held;
use crate::reconciler::{RestoreInput, remove_sandbox};

#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SuspendParams {
    /// Suspend also when the snapshot cannot be stored in the blob store: it then stays on
    /// the session's node only (not durable), and the session cannot resume elsewhere.
    #[serde(default)]
    pub force: bool,
}

/// Suspends a running or paused session: its processes, memory and files go into a full
/// snapshot and its sandbox is freed. With a blob store, the snapshot is stored there first
/// (durable), so the session can resume on any node; if that fails, the session keeps running
/// (503 `blob_store_unavailable`) unless `force`. Idempotent on a suspended one.
#[utoipa::path(post, path = "/v1/sessions/{id}/suspend", params(("id" = String, Path), SuspendParams),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 501, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn suspend(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<SuspendParams>,
) -> AppResult<ApiJson<Session>> {
    let session = live_session(&state, &caller, &id).await?;
    suspend_session(&state, &caller.tenant_id, &session.id, params.force).await?;
    Ok(ApiJson(find_session(&state, &caller, &id).await?))
}

/// What the lease a suspend holds while it runs is named after (it adds the session). A
/// suspend whose replica died, or whose request was dropped, leaves its session `suspending`
/// with this lease running out; any replica then finishes it
/// ([`crate::recovery::finish_abandoned_suspends`]).
pub(crate) const SUSPEND_LEASE: &str = "suspend:";
/// How long a suspend's lease lasts unrenewed.
pub(crate) const SUSPEND_LEASE_MS: i64 = 30_000;

/// Suspends the session (see [`suspend`]); also used by the idle timeout. On failure the
/// session returns to the state it was in, with the error recorded, and keeps its sandbox.
pub(crate) async fn suspend_session(state: &AppState, tenant: &TenantId, id: &SessionId, force: bool) -> AppResult<()> {
    let _guard = state.session_lock(id).await;
    let session = state.store.session(tenant, id).await?.ok_or_else(|| AppError::session_not_found(id.as_str()))?;
    require_checkpoints(state, session.runtime)?;
    let paused = match session.state {
        SessionState::Suspended => return Ok(()),
        SessionState::Running => false,
        SessionState::Paused => true,
        _ => return Err(invalid_state(&session, "be suspended")),
    };
    let Some(held) = Held::take(state, &format!("{SUSPEND_LEASE}{id}"), SUSPEND_LEASE_MS).await? else {
        return Err(AppError::new(ErrorCode::Conflict, format!("session {id} is being suspended already; try again")));
    };
    let suspended = suspend_held(state, tenant, &session, paused, force).await;
    held.release().await;
    suspended
}

/// [`suspend_session`] of `session` (running, or `paused`) with its lock and lease held.
async fn suspend_held(
    state: &AppState,
    tenant: &TenantId,
    session: &Session,
    paused: bool,
    force: bool,
) -> AppResult<()> {
    let (id, was) = (&session.id, session.state);
    let sandbox = sandbox_of(session)?;
    if !state.store.transition(id, &[was], SessionState::Suspending, None).await? {
        return Err(AppError::new(ErrorCode::Conflict, format!("session {id} changed state meanwhile; try again")));
    }
    let node = state.nodes.of(session)?;
    // Frozen from here on, so that nothing it does while its snapshot is exported is lost
    // when its sandbox is removed; thawed again if the suspend fails.
    let frozen = match paused {
        true => Ok(()),
        false => node.pause_sandbox(&sandbox).await.map_err(AppError::from),
    };
    let suspended = match frozen {
        Ok(()) => snapshot_durably(state, tenant, session, node.as_ref(), force).await,
        Err(e) => Err(e),
    };
    match suspended {
        Ok(snapshot) => {
            note_snapshot(state, &snapshot, " to suspend").await;
            remove_sandbox(node.as_ref(), state, &sandbox).await?;
            state.store.transition(id, &[SessionState::Suspending], SessionState::Suspended, None).await?;
            Ok(())
        }
        Err(e) => {
            if !paused && let Err(thaw) = node.resume_sandbox(&sandbox).await {
                tracing::warn!(session = %id, error = %thaw, "the sandbox of a failed suspend could not be thawed");
            }
            let message = format!("suspend failed, the session kept its sandbox: {}", e.0.message);
            state.store.transition(id, &[SessionState::Suspending], was, Some(&message)).await?;
            Err(e)
        }
    }
}

/// The full snapshot a suspend keeps, of the session's paused sandbox on `node`, exported to
/// the blob store if the node has one. An export that fails fails the suspend, and the
/// snapshot is deleted (it was taken only to suspend), unless `force`, which suspends with
/// the snapshot on the node only and says so in an event.
async fn snapshot_durably(
    state: &AppState,
    tenant: &TenantId,
    session: &Session,
    node: &dyn NodeApi,
    force: bool,
) -> AppResult<Snapshot> {
    let snapshot = snapshot_locked(state, tenant, session, true, SnapshotKind::Full, Default::default()).await?;
    match crate::durable::export(state, node, &session.id, &snapshot.id).await {
        Ok(durable) => Ok(Snapshot { durable, ..snapshot }),
        Err(e) if force => {
            let message =
                format!("suspended with snapshot {} on node {} only: {}", snapshot.id, node.node_id(), e.0.message);
            state.store.record_event(&session.id, "not_durable", &message).await?;
            Ok(snapshot)
        }
        Err(e) => {
            crate::durable::delete_snapshot(state, session, &snapshot.id).await?;
            let message = format!("{}; retry, or suspend with force=true to keep it on that node only", e.0.message);
            Err(AppError::new(ErrorCode::BlobStoreUnavailable, message))
        }
    }
}

/// Restores the newest full snapshot of a suspended session; it stays suspended if that fails.
/// Under the session's lock, so concurrent resumes restore it once: those that waited find
/// it running and return it.
pub(crate) async fn resume_suspended(state: &AppState, caller: &Caller, session: &Session) -> AppResult<Session> {
    let _guard = state.session_lock(&session.id).await;
    let session = find_session(state, caller, session.id.as_str()).await?;
    if session.state == SessionState::Running {
        return Ok(session);
    }
    resume_locked(state, caller, &session).await
}

/// [`resume_suspended`] with the session's lock held.
async fn resume_locked(state: &AppState, caller: &Caller, session: &Session) -> AppResult<Session> {
    let snapshots = state.store.list_snapshots(&session.id).await?;
    let Some(latest) = snapshots.iter().rev().find(|s| s.kind == SnapshotKind::Full) else {
        return Err(AppError::new(
            ErrorCode::SnapshotNotFound,
            format!("session {} has no full snapshot to resume from; restore a disk snapshot instead", session.id),
        ));
    };
    let input = RestoreInput {
        snapshot: latest.id.clone(),
        sandbox: SandboxId::generate(),
        from_suspended: true,
        from_interrupted: false,
    };
    run_restore(state, caller, &session.id, input, &[SessionState::Suspended], "be resumed").await
}

/// States in which a call that needs the sandbox of an `auto_resume` session waits for it:
/// suspended, or on the way in or out of it (the suspend or resume holds the session's lock).
pub(crate) fn wakes_on_use(state: SessionState) -> bool {
    matches!(state, SessionState::Suspended | SessionState::Suspending | SessionState::Restoring)
}

/// Resumes an `auto_resume` session for a call that needs its sandbox, and returns it as it
/// is then. However many such calls arrive together, one resumes it: the others wait for the
/// session's lock and find it running. A session suspending (its idle timeout) is resumed
/// once that is done.
pub(crate) async fn wake(state: &AppState, caller: &Caller, session: &Session) -> AppResult<Session> {
    let _guard = state.session_lock(&session.id).await;
    let session = find_session(state, caller, session.id.as_str()).await?;
    if session.state != SessionState::Suspended {
        return Ok(session);
    }
    tracing::info!(session = %session.id, "resuming a suspended session on use (auto_resume)");
    // Set before the resume, so that a maximum age passed while suspended does not suspend
    // the session again at the scheduler's next tick.
    let session = renew_max_age(state, session).await?;
    let resumed = resume_locked(state, caller, &session).await?;
    state.store.record_event(&session.id, "auto_resume", "resumed on use: a call needed its sandbox").await?;
    Ok(resumed)
}

/// The session with its maximum age set to end `auto_resume_max_age_secs` from now, when it
/// has that setting.
async fn renew_max_age(state: &AppState, mut session: Session) -> AppResult<Session> {
    let Some(secs) = session.lifetime.auto_resume_max_age_secs else { return Ok(session) };
    let max_age = SessionLifetime::max_age_ending_in(session.created_at, space_store::now_ms(), secs);
    session.lifetime.max_age_secs = Some(max_age);
    state.store.set_settings(&session.id, &session.snapshot_policy, &session.lifetime).await?;
    Ok(session)
}

/// 409 `session_suspended`: how to resume it, or make calls resume it.
pub(crate) fn suspended(id: &SessionId) -> AppError {
    AppError::new(
        ErrorCode::SessionSuspended,
        format!(
            "session {id} is suspended; resume it with `POST /v1/sessions/{id}/resume` (`space session resume {id}`), \
             or set auto_resume (`PATCH /v1/sessions/{id}` with {{\"auto_resume\": true}}) so that calls like this \
             one resume it"
        ),
    )
}
