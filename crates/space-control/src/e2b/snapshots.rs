//! E2B's fork and snapshots. An E2B snapshot is a space snapshot of the session (memory and
//! processes too where the node can checkpoint them) that outlives it, as E2B's do: killing
//! the sandbox leaves it until it is deleted. Naming its id as a create's template forks a new
//! session from it, as E2B starts a sandbox from a snapshot.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use space_api::{CreateSnapshotRequest, ForkRequest, Session, SessionState, Snapshot, SnapshotId, SnapshotKind};

use super::errors::{E2bError, E2bResult};
use super::sandboxes::{E2bJson, SandboxOut, any_sandbox, end_in, sandbox};
use crate::AppState;
use crate::api::lifecycle::{self, require_checkpoints};
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiQuery, AppError};

#[derive(Debug, Default, Deserialize)]
pub struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct ForkResult {
    sandbox: SandboxOut,
}

/// `POST /sandboxes/{id}/fork`: `count` new sandboxes from a snapshot taken now.
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<ForkBody>,
) -> E2bResult<(StatusCode, Json<Vec<ForkResult>>)> {
    sandbox(&state, &caller, &id).await?;
    let native = ForkRequest { from: None, count: Some(request.count.unwrap_or(1)) };
    let children = forked(&state, &caller, id, native, request.timeout).await?;
    let results = children.iter().map(|s| ForkResult { sandbox: SandboxOut::of(&state, s, "") }).collect();
    Ok((StatusCode::CREATED, Json(results)))
}

/// Forks session `id` (as `request` says) and gives each child its E2B timeout.
async fn forked(
    state: &AppState,
    caller: &Caller,
    id: String,
    request: ForkRequest,
    timeout: Option<u64>,
) -> E2bResult<Vec<Session>> {
    let (_, ApiJson(list)) =
        lifecycle::fork(State(state.clone()), Extension(caller.clone()), ApiPath(id), ApiJson(request)).await?;
    let mut children = Vec::new();
    for child in list.sessions {
        children.push(end_in(state, caller, &child, timeout.unwrap_or(super::sandboxes::DEFAULT_TIMEOUT_SECS)).await?);
    }
    Ok(children)
}

/// The snapshot a create names as its template, if it names one of the caller's.
pub async fn as_template(state: &AppState, caller: &Caller, template: &str) -> E2bResult<Option<Snapshot>> {
    let Ok(id) = template.parse::<SnapshotId>() else { return Ok(None) };
    Ok(state.store.snapshot(&caller.tenant_id, &id).await.map_err(AppError::from)?)
}

/// A create from a snapshot: a fork of its session from it, then the create's settings.
pub async fn create_from(
    state: &AppState,
    caller: &Caller,
    snapshot: Snapshot,
    timeout: u64,
    metadata: BTreeMap<String, String>,
) -> E2bResult<Session> {
    let request = ForkRequest { from: Some(snapshot.id.clone()), count: Some(1) };
    let child = forked(state, caller, snapshot.session_id.to_string(), request, Some(timeout)).await?;
    let child = child.into_iter().next().ok_or_else(|| E2bError::new(500, "the fork made no sandbox"))?;
    if metadata.is_empty() {
        return Ok(child);
    }
    let update = space_api::UpdateSessionRequest { metadata: Some(metadata), ..Default::default() };
    let path = ApiPath(child.id.to_string());
    let ApiJson(child) =
        crate::api::sessions::update_session(State(state.clone()), Extension(caller.clone()), path, ApiJson(update))
            .await?;
    Ok(child)
}

#[derive(Debug, Default, Deserialize)]
pub struct SnapshotBody {
    name: Option<String>,
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
#[derive(Debug, Serialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

impl SnapshotInfo {
    fn of(snapshot: &Snapshot) -> SnapshotInfo {
        SnapshotInfo { snapshot_id: snapshot.id.to_string(), names: snapshot.name.iter().cloned().collect() }
    }
}

/// `POST /sandboxes/{id}/snapshots`: with memory unless `memory: false` or the node cannot
/// checkpoint processes (then files only, as a fork does).
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<SnapshotBody>,
) -> E2bResult<(StatusCode, Json<SnapshotInfo>)> {
    let session = sandbox(&state, &caller, &id).await?;
    let kind = match request.memory {
        Some(false) => SnapshotKind::Disk,
        Some(true) => SnapshotKind::Full,
        None if require_checkpoints(&state, session.runtime).is_ok() => SnapshotKind::Full,
        None => SnapshotKind::Disk,
    };
    // E2B's snapshots stay when their sandbox is killed, until deleted.
    let native = CreateSnapshotRequest { kind: Some(kind), name: request.name, outlives_session: Some(true) };
    let (_, ApiJson(snapshot)) =
        lifecycle::create_snapshot(State(state.clone()), Extension(caller), ApiPath(id), ApiJson(native)).await?;
    Ok((StatusCode::CREATED, Json(SnapshotInfo::of(&snapshot))))
}

#[derive(Debug, Default, Deserialize)]
pub struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /snapshots`: the caller's snapshots (of one sandbox with `sandboxID`), newest first,
/// also those of sandboxes that were killed since.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<SnapshotQuery>,
) -> E2bResult<(HeaderMap, Json<Vec<SnapshotInfo>>)> {
    let mut snapshots = Vec::new();
    match &query.sandbox_id {
        Some(id) => {
            // A sandbox that was killed keeps the snapshots that outlive it, as in E2B.
            let session = any_sandbox(&state, &caller, id).await?;
            let all = state.store.list_snapshots(&session.id).await.map_err(AppError::from)?;
            let killed = matches!(session.state, SessionState::Destroyed | SessionState::Destroying);
            snapshots.extend(all.into_iter().filter(|s| !killed || s.outlives_session));
        }
        None => {
            let sessions = super::sandboxes::matching(&state, &caller, None, &["running", "paused"]).await?;
            for session in &sessions {
                snapshots.extend(state.store.list_snapshots(&session.id).await.map_err(AppError::from)?);
            }
            snapshots.extend(state.store.outliving_snapshots(&caller.tenant_id).await.map_err(AppError::from)?);
        }
    }
    snapshots.retain(|s| query.name.as_ref().is_none_or(|n| s.name.as_ref() == Some(n)));
    snapshots.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.as_str().cmp(a.id.as_str())));
    // A session killed between the two reads above has its kept snapshots in both.
    snapshots.dedup_by(|a, b| a.id == b.id);
    let start = match &query.next_token {
        Some(token) => snapshots
            .iter()
            .position(|s| s.id.as_str() == token)
            .ok_or_else(|| E2bError::bad_request("nextToken names no snapshot of this list; start again"))?,
        None => 0,
    };
    let limit = query.limit.unwrap_or(100).clamp(1, 100);
    let mut headers = HeaderMap::new();
    if let Some(next) = snapshots.get(start + limit)
        && let Ok(value) = HeaderValue::from_str(next.id.as_str())
    {
        headers.insert("x-next-token", value);
    }
    let page = snapshots.iter().skip(start).take(limit).map(SnapshotInfo::of).collect();
    Ok((headers, Json(page)))
}

/// `DELETE /templates/{id}`: E2B deletes snapshots as templates; any other id names one of
/// the caller's templates ([`super::template_list::delete_template`]).
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> E2bResult<StatusCode> {
    let Some(snapshot) = as_template(&state, &caller, &id).await? else {
        return super::template_list::delete_template(state, caller, id).await;
    };
    let path = ApiPath((snapshot.session_id.to_string(), snapshot.id.to_string()));
    lifecycle::delete_snapshot(State(state), Extension(caller), path).await?;
    Ok(StatusCode::NO_CONTENT)
}
