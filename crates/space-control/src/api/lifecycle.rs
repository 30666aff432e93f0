//! Session lifecycle: pause and resume in place, snapshots, restore and fork.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use space_api::error::clip;
use space_api::{
    CreateSnapshotRequest, ErrorBody, ErrorCode, ForkRequest, RestoreRequest, Session, SessionId, SessionList,
    SessionState, Snapshot, SnapshotId, SnapshotKind, SnapshotList, TenantId,
};
use space_node_api::NodeApi;
use space_store::{Demand, NewSession, NewSnapshot, SessionMeta};

use super::find_session;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, AppError, AppResult};
use crate::reconciler::RestoreInput;

/// Most sessions one fork call may create.
pub const MAX_FORK: u32 = 16;
const MAX_NAME: usize = 128;
const WAIT: Duration = Duration::from_secs(600);

pub(crate) fn invalid_state(session: &Session, action: &str) -> AppError {
    AppError::new(
        ErrorCode::InvalidState,
        format!("session {} is {}; only running or paused sessions can {action}", session.id, session.state.as_str()),
    )
}

/// The caller's session `id`, or 404 also when it was destroyed: nothing can be done with it.
pub(crate) async fn live_session(state: &AppState, caller: &Caller, id: &str) -> AppResult<Session> {
    let session = find_session(state, caller, id).await?;
    if session.state == SessionState::Destroyed {
        return Err(AppError::new(ErrorCode::NotFound, format!("session {id} was destroyed; create a new one")));
    }
    Ok(session)
}

pub(crate) fn sandbox_of(session: &Session) -> AppResult<space_api::SandboxId> {
    session.sandbox_id.clone().ok_or_else(|| AppError::internal(format!("session {} has no sandbox", session.id)))
}

/// Freezes every process of the session in place; memory stays on the node. Idempotent.
#[utoipa::path(post, path = "/v1/sessions/{id}/pause", params(("id" = String, Path)),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn pause(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Session>> {
    Ok(ApiJson(set_frozen(&state, &caller, &id, true).await?))
}

/// Thaws a paused session, or brings a suspended one back from its full snapshot (processes
/// continue where they were), or an interrupted one back on its sandbox if its node is back,
/// else from its newest durable full snapshot on another node. Idempotent on a running one.
#[utoipa::path(post, path = "/v1/sessions/{id}/resume", params(("id" = String, Path)),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Session>> {
    let session = live_session(&state, &caller, &id).await?;
    match session.state {
        SessionState::Suspended => {
            return Ok(ApiJson(super::suspend::resume_suspended(&state, &caller, &session).await?));
        }
        SessionState::Interrupted => return Ok(ApiJson(crate::interrupt::resume(&state, &caller, &session).await?)),
        _ => {}
    }
    Ok(ApiJson(set_frozen(&state, &caller, &id, false).await?))
}

/// Pause (`frozen`) or resume: the sandbox first, then the recorded state (recovery makes the
/// sandbox follow the record if a crash comes in between).
pub(crate) async fn set_frozen(state: &AppState, caller: &Caller, id: &str, frozen: bool) -> AppResult<Session> {
    let (from, to, action) = match frozen {
        true => (SessionState::Running, SessionState::Paused, "be paused"),
        false => (SessionState::Paused, SessionState::Running, "be resumed"),
    };
    let session = live_session(state, caller, id).await?;
    let _guard = state.session_lock(&session.id).await;
    let session = find_session(state, caller, id).await?;
    if session.state == to {
        return Ok(session);
    }
    if session.state != from {
        return Err(invalid_state(&session, action));
    }
    let (sandbox, node) = (sandbox_of(&session)?, state.nodes.of(&session)?);
    if frozen {
        node.pause_sandbox(&sandbox).await?;
    } else {
        node.resume_sandbox(&sandbox).await?;
    }
    if !state.store.transition(&session.id, &[from], to, None).await? {
        if frozen {
            node.resume_sandbox(&sandbox).await?;
        }
        return Err(AppError::new(ErrorCode::Conflict, format!("session {id} changed state meanwhile; try again")));
    }
    find_session(state, caller, id).await
}

/// Takes a snapshot of a running or paused session.
#[utoipa::path(post, path = "/v1/sessions/{id}/snapshots", params(("id" = String, Path)), request_body = CreateSnapshotRequest,
    responses((status = 201, body = Snapshot), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 501, body = ErrorBody), (status = 400, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn create_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CreateSnapshotRequest>,
) -> AppResult<(StatusCode, ApiJson<Snapshot>)> {
    if request.name.as_ref().is_some_and(|n| n.is_empty() || n.len() > MAX_NAME || n.contains('\0')) {
        return Err(AppError::bad_request(format!("snapshot names are 1-{MAX_NAME} characters")));
    }
    let session = live_session(&state, &caller, &id).await?;
    let kind = request.kind.unwrap_or(SnapshotKind::Disk);
    let keeping = Keeping { name: request.name, outlives_session: request.outlives_session.unwrap_or(false) };
    let snapshot = take_snapshot(&state, &caller.tenant_id, &session.id, kind, keeping).await?;
    note_snapshot(&state, &snapshot, "").await;
    Ok((StatusCode::CREATED, ApiJson(snapshot)))
}

/// How many snapshots that outlive their sessions a tenant may have (429 `quota_exceeded`
/// past it): they count against no session's disk limit once their session is destroyed, so
/// their number is bounded instead.
pub(crate) const MAX_KEPT_SNAPSHOTS: u64 = 100;

/// Records an event of `kind` on the session. The work it tells of is done, so a failure
/// to record it is logged rather than answered.
pub(crate) async fn note(state: &AppState, id: &SessionId, kind: &str, message: String) {
    if let Err(e) = state.store.record_event(id, kind, &message).await {
        tracing::warn!(session = %id, kind, error = %e, "cannot record a session event");
    }
}

/// The `snapshot` event of a snapshot taken on request (`why` says what for, if not the
/// API's own call): `snapshot snp_… (disk) taken`. Scheduled snapshots have none (one a
/// minute would bury every other event); `GET …/snapshots` lists them.
pub(crate) async fn note_snapshot(state: &AppState, snapshot: &Snapshot, why: &str) {
    let name = snapshot.name.as_ref().map(|n| format!(" named {}", space_api::error::echo(n))).unwrap_or_default();
    let message = format!("snapshot {} ({}){name} taken{why}", snapshot.id, snapshot.kind.as_str());
    note(state, &snapshot.session_id, "snapshot", message).await;
}

/// How a snapshot is kept: its name (named ones are never pruned), and whether it outlives its
/// session ([`Snapshot::outlives_session`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Keeping {
    pub name: Option<String>,
    pub outlives_session: bool,
}

/// Takes a snapshot under the session's lifecycle lock; the row exists (as `creating`)
/// before anything is on disk, so a crash leaves a record of what to clean up.
pub(crate) async fn take_snapshot(
    state: &AppState,
    tenant: &TenantId,
    id: &SessionId,
    kind: SnapshotKind,
    keeping: Keeping,
) -> AppResult<Snapshot> {
    let _guard = state.session_lock(id).await;
    let session = state.store.session(tenant, id).await?.ok_or_else(|| AppError::session_not_found(id.as_str()))?;
    if kind == SnapshotKind::Full {
        require_checkpoints(state, session.runtime)?;
    }
    let paused = match session.state {
        SessionState::Running => false,
        SessionState::Paused => true,
        _ => return Err(invalid_state(&session, "be snapshotted")),
    };
    if kind != SnapshotKind::Full {
        return snapshot_locked(state, tenant, &session, paused, kind, keeping).await;
    }
    check_room_for_images(state, &session).await?;
    let snapshot = snapshot_locked(state, tenant, &session, paused, kind, keeping).await?;
    let node = state.nodes.of(&session)?;
    if let Err(e) = check_room_for_images(state, &session).await {
        crate::durable::delete_snapshot(state, &session, &snapshot.id).await?;
        return Err(e);
    }
    crate::durable::export_in_background(state, node, &session.id, &snapshot.id);
    Ok(snapshot)
}

/// Takes a snapshot of a session whose sandbox runs (or, `paused`, is paused) and whose
/// lifecycle lock the caller holds.
pub(crate) async fn snapshot_locked(
    state: &AppState,
    tenant: &TenantId,
    session: &Session,
    paused: bool,
    kind: SnapshotKind,
    keeping: Keeping,
) -> AppResult<Snapshot> {
    let (id, sandbox, node) = (&session.id, sandbox_of(session)?, state.nodes.of(session)?);
    let snapshot_id = SnapshotId::generate();
    // A full snapshot's process images are sealed with a key of its own on the node.
    let key = match kind {
        SnapshotKind::Full => Some(crate::durable::new_snapshot_key(state, tenant, id, &snapshot_id).await?),
        SnapshotKind::Disk => None,
    };
    let new = NewSnapshot {
        id: snapshot_id,
        session_id: id.clone(),
        tenant_id: tenant.clone(),
        kind,
        name: keeping.name,
        outlives_session: keeping.outlives_session,
        node_id: node.node_id(),
        key_sealed: key.as_ref().map(|(_, sealed)| sealed.clone()),
    };
    state.store.insert_snapshot(&new, MAX_KEPT_SNAPSHOTS).await?;
    let began = Instant::now();
    let taken = match kind {
        SnapshotKind::Disk => node.snapshot_disk(&sandbox, id, &new.id, paused).await.map(|()| None),
        SnapshotKind::Full => {
            node.snapshot_full(&sandbox, id, &new.id, paused, key.as_ref().map(|(key, _)| key)).await.map(Some)
        }
    };
    space_metrics::snapshot_taken(kind, session.runtime, taken.is_ok(), began.elapsed());
    match taken {
        Ok(size) => {
            state.store.set_snapshot_ready(&new.id, size).await?;
            match size {
                Some(size) => space_metrics::snapshot_size(kind, session.runtime, size),
                None => measure_in_background(state.clone(), node, session, new.id.clone()),
            }
        }
        Err(e) => {
            crate::durable::delete_snapshot(state, session, &new.id).await?;
            return Err(e.into());
        }
    }
    state.store.snapshot(tenant, &new.id).await?.ok_or_else(|| AppError::internal("snapshot vanished"))
}

/// A full snapshot's process images are written outside the pool, where no quota counts
/// them: the session's usage includes them, and a full snapshot that takes the session past
/// its limit is deleted again (suspending still works: the memory has to go somewhere).
async fn check_room_for_images(state: &AppState, session: &Session) -> AppResult<()> {
    let Some(limit) = session.resources.disk_limit_bytes() else { return Ok(()) };
    let usage = state.nodes.of(session)?.disk_usage(&session.id).await?;
    if usage.enforced && usage.used_bytes > limit {
        return Err(AppError::new(
            ErrorCode::DiskQuotaExceeded,
            format!(
                "session {} uses {} of its {} MiB disk limit, and a full snapshot's memory images count \
                 against it: delete snapshots or files of the session first",
                session.id,
                usage.used_bytes >> 20,
                limit >> 20
            ),
        ));
    }
    Ok(())
}

/// Fills in a disk snapshot's size once its files are walked (off the request: the walk
/// takes longer than the snapshot itself).
fn measure_in_background(state: AppState, node: Arc<dyn NodeApi>, session: &Session, snapshot: SnapshotId) {
    let (runtime, session) = (session.runtime, session.id.clone());
    tokio::spawn(async move {
        let measured = match node.snapshot_disk_size(&session, &snapshot).await {
            Ok(size) => {
                space_metrics::snapshot_size(SnapshotKind::Disk, runtime, size);
                state.store.set_snapshot_size(&snapshot, size).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        // A snapshot deleted meanwhile has nothing left to measure.
        if let Err(e) = measured {
            tracing::debug!(%snapshot, error = %e, "measuring a disk snapshot");
        }
    });
}

/// Fails with `feature_unavailable` unless the nodes can take full snapshots of `runtime`'s
/// sandboxes (they run one build of `space`: the first answers for all).
pub(crate) fn require_checkpoints(state: &AppState, runtime: space_api::RuntimeKind) -> AppResult<()> {
    let support =
        state.nodes.first().checkpoint_support(runtime).map_err(space_node_api::NodeError::CheckpointUnavailable);
    Ok(support.map(drop)?)
}

/// The session's snapshots, oldest first.
#[utoipa::path(get, path = "/v1/sessions/{id}/snapshots", params(("id" = String, Path)),
    responses((status = 200, body = SnapshotList), (status = 404, body = ErrorBody)))]
pub async fn list_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<SnapshotList>> {
    let session = find_session(&state, &caller, &id).await?;
    Ok(ApiJson(SnapshotList { snapshots: state.store.list_snapshots(&session.id).await? }))
}

/// The caller's snapshot `snapshot` of session `session`, or 404.
pub(crate) async fn find_snapshot(
    state: &AppState,
    caller: &Caller,
    session: &SessionId,
    snapshot: &str,
) -> AppResult<Snapshot> {
    let not_found = || {
        AppError::new(
            ErrorCode::SnapshotNotFound,
            format!("snapshot {} not found in session {session}", clip(snapshot)),
        )
    };
    let parsed: SnapshotId = snapshot.parse().map_err(|_| not_found())?;
    let found = state.store.snapshot(&caller.tenant_id, &parsed).await?;
    found.filter(|s| &s.session_id == session).ok_or_else(not_found)
}

/// Deletes a snapshot. Sessions forked from it are not affected.
#[utoipa::path(delete, path = "/v1/sessions/{id}/snapshots/{snapshot}", params(("id" = String, Path), ("snapshot" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, snapshot)): ApiPath<(String, String)>,
) -> AppResult<StatusCode> {
    let session = find_session(&state, &caller, &id).await?;
    let snapshot = find_snapshot(&state, &caller, &session.id, &snapshot).await?;
    // Deleted once its row is: a copy a node could not delete now goes at its sweep.
    crate::durable::delete_snapshot(&state, &session, &snapshot.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Returns the session to a snapshot: a new sandbox starts from it and replaces the current one.
#[utoipa::path(post, path = "/v1/sessions/{id}/restore", params(("id" = String, Path)), request_body = RestoreRequest,
    responses((status = 200, body = Session), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn restore(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<RestoreRequest>,
) -> AppResult<ApiJson<Session>> {
    let session = live_session(&state, &caller, &id).await?;
    let snapshot = find_snapshot(&state, &caller, &session.id, request.snapshot.as_str()).await?;
    let _guard = state.session_lock(&session.id).await;
    let session = find_session(&state, &caller, &id).await?;
    let session = crate::interrupt::if_node_lost(&state, &caller, &session).await?;
    let input = RestoreInput {
        snapshot: snapshot.id,
        sandbox: space_api::SandboxId::generate(),
        from_suspended: session.state == SessionState::Suspended,
        from_interrupted: session.state == SessionState::Interrupted,
    };
    // A failed session too: one whose sandbox died comes back from its snapshots; and an
    // interrupted one, whose node is lost.
    use SessionState::*;
    let from = [Running, Paused, Suspended, Failed, Interrupted];
    Ok(ApiJson(run_restore(&state, &caller, &session.id, input, &from, "be restored").await?))
}

/// Moves the session (in a state of `from`) into `restoring`, queues the restore and waits
/// for it; errors name `action` ("be restored").
pub(crate) async fn run_restore(
    state: &AppState,
    caller: &Caller,
    id: &SessionId,
    input: RestoreInput,
    from: &[SessionState],
    action: &str,
) -> AppResult<Session> {
    let input = serde_json::to_string(&input).map_err(|e| AppError::internal(e.to_string()))?;
    let Some(op) = state.store.begin_restore(&caller.tenant_id, id, &input, from).await? else {
        let session = find_session(state, caller, id.as_str()).await?;
        return Err(invalid_state(&session, action));
    };
    state.reconciler.wake();
    let finished = state.reconciler.wait(state, &caller.tenant_id, &op, WAIT).await?;
    if let Some(error) = finished.error {
        let code = finished.error_code.unwrap_or(ErrorCode::SandboxUnavailable);
        return Err(AppError::new(code, format!("session {id} could not {action}: {error}")));
    }
    find_session(state, caller, id.as_str()).await
}

/// A destroyed (or destroying) session is forked only from a snapshot that outlived it, and
/// only with a tenant's key: a session token's reach ends with its session.
fn check_fork_of_destroyed(caller: &Caller, id: &str, named: Option<&Snapshot>) -> AppResult<()> {
    if caller.scope.is_some() {
        return Err(AppError::new(
            ErrorCode::NotFound,
            format!("session {id} was destroyed; forking from its snapshots takes an API key, not a session token"),
        ));
    }
    if named.is_some_and(|s| s.outlives_session) {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::NotFound,
        format!(
            "session {id} was destroyed; only its snapshots taken with outlives_session can still be forked from \
             (name one in `from`); or create a new session"
        ),
    ))
}

/// Creates `count` new sessions from a snapshot of this one (unless `from` names one, a new
/// snapshot of it as it is now: full if the node has CRIU, else disk). Each continues
/// independently. A destroyed session is forked from a snapshot that outlived it.
#[utoipa::path(post, path = "/v1/sessions/{id}/fork", params(("id" = String, Path)), request_body = ForkRequest,
    responses((status = 201, body = SessionList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 429, body = ErrorBody), (status = 501, body = ErrorBody),
        (status = 507, body = ErrorBody)))]
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<ForkRequest>,
) -> AppResult<(StatusCode, ApiJson<SessionList>)> {
    let count = request.count.unwrap_or(1);
    if count == 0 || count > MAX_FORK {
        return Err(AppError::bad_request(format!("count must be between 1 and {MAX_FORK}")));
    }
    let parent = find_session(&state, &caller, &id).await?;
    let named = match &request.from {
        Some(from) => Some(find_snapshot(&state, &caller, &parent.id, from.as_str()).await?),
        None => None,
    };
    if matches!(parent.state, SessionState::Destroying | SessionState::Destroyed) {
        check_fork_of_destroyed(&caller, &id, named.as_ref())?;
    }
    let demand = Demand::new_session(&parent.resources);
    let demand = Demand {
        sessions: u64::from(count),
        cpu_millis: demand.cpu_millis * u64::from(count),
        memory_mib: demand.memory_mib * u64::from(count),
        disk_mib: demand.disk_mib.map(|d| d * u64::from(count)),
    };
    // Before the snapshot, which a refused fork would leave behind; inserting checks again.
    state.store.check_quota(&caller.tenant_id, &demand).await?;
    let snapshot = match named {
        Some(snapshot) => snapshot,
        // Processes too when the node can checkpoint them; otherwise the files.
        None => {
            let full = require_checkpoints(&state, parent.runtime).is_ok();
            let kind = if full { SnapshotKind::Full } else { SnapshotKind::Disk };
            let snapshot = take_snapshot(&state, &caller.tenant_id, &parent.id, kind, Keeping::default()).await?;
            note_snapshot(&state, &snapshot, " to fork").await;
            snapshot
        }
    };
    let news: Vec<NewSession> = (0..count)
        .map(|_| NewSession {
            id: SessionId::generate(),
            tenant_id: caller.tenant_id.clone(),
            template: parent.template.clone(),
            runtime: parent.runtime,
            resources: parent.resources,
            env: parent.env.clone(),
            source_snapshot: Some(snapshot.id.clone()),
            template_version: parent.template_version,
            snapshot_policy: parent.snapshot_policy.clone(),
            lifetime: parent.lifetime,
            // Labels, metadata and auto_resume carry over (a fork is found as its parent
            // is); the name does not.
            meta: SessionMeta { name: None, ..SessionMeta::of(&parent) },
        })
        .collect();
    let ops = crate::egress::insert_forked_sessions(&state, &parent.id, &news).await?;
    let ids: Vec<SessionId> = news.into_iter().map(|n| n.id).collect();
    for id in &ids {
        note(&state, id, "forked_from", format!("forked from session {} at snapshot {}", parent.id, snapshot.id)).await;
    }
    let children = ids.iter().map(SessionId::as_str).collect::<Vec<_>>().join(", ");
    note(&state, &parent.id, "fork", format!("forked into {children} from snapshot {}", snapshot.id)).await;
    state.reconciler.wake();
    let mut sessions = Vec::new();
    for (op, id) in ops.iter().zip(&ids) {
        state.reconciler.wait(&state, &caller.tenant_id, op, WAIT).await?;
        sessions.push(find_session(&state, &caller, id.as_str()).await?);
    }
    Ok((StatusCode::CREATED, ApiJson(SessionList { sessions })))
}
