//! `GET /v1/nodes`: the nodes, their state, capacity, pools and sessions; cordon and drain
//! (admin only).

use axum::extract::State;
use space_api::durable::BlobSweepReport;
use space_api::{DrainReport, ErrorBody, Node, NodeList};
use space_store::now_ms;

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiJson, ApiPath, AppResult};

/// Every node that joined: `ready` while its lease holds, `lost` once it ran out; its
/// capacity, warm pool and session count as of its last heartbeat (admin only).
#[utoipa::path(get, path = "/v1/nodes", responses((status = 200, body = NodeList), (status = 403, body = ErrorBody)))]
pub async fn list_nodes(State(state): State<AppState>, _admin: Admin) -> AppResult<ApiJson<NodeList>> {
    Ok(ApiJson(crate::nodes::list(&state, now_ms()).await?))
}

/// Cordons a node: it takes no new sessions, and resumes and forks from durable snapshots
/// kept on it start on another node. Sessions on it run on. Idempotent (admin only; 409 on a
/// control plane with one node).
#[utoipa::path(post, path = "/v1/nodes/{id}/cordon", params(("id" = String, Path)),
    responses((status = 200, body = Node), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn cordon(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Node>> {
    Ok(ApiJson(crate::drain::set_cordoned(&state, &id, true).await?))
}

/// Lifts a node's cordon: it takes new sessions again (admin only).
#[utoipa::path(post, path = "/v1/nodes/{id}/uncordon", params(("id" = String, Path)),
    responses((status = 200, body = Node), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn uncordon(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Node>> {
    Ok(ApiJson(crate::drain::set_cordoned(&state, &id, false).await?))
}

/// Cordons a node and moves every session off it with nothing lost: a running or paused
/// session is suspended into a durable snapshot and resumed (paused again if it was) on
/// another node; a suspended one gets its newest full snapshot stored in the blob store, so
/// it resumes elsewhere. Sessions that could not be moved are listed with why; repeat the
/// drain to move what is left (admin only; 503 if the node is lost).
#[utoipa::path(post, path = "/v1/nodes/{id}/drain", params(("id" = String, Path)),
    responses((status = 200, body = DrainReport), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn drain(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<DrainReport>> {
    Ok(ApiJson(crate::drain::drain(&state, &id).await?))
}

/// Deletes the objects of the blob store that no recorded export names and that are at least
/// 15 minutes old: what deleted snapshots (and destroyed sessions) left there. Each replica
/// also does it hourly. Put off, with why, while a snapshot is being exported or another
/// replica sweeps (admin only; 503 if the blob store fails).
#[utoipa::path(post, path = "/v1/blobs/sweep",
    responses((status = 200, body = BlobSweepReport), (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn sweep_blobs(State(state): State<AppState>, _admin: Admin) -> AppResult<ApiJson<BlobSweepReport>> {
    Ok(ApiJson(crate::retention::sweep(&state).await?))
}
