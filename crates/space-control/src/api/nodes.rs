//! `GET /v1/nodes`: the nodes, their state, capacity, pools and sessions (admin only).

use axum::extract::State;
use space_api::{ErrorBody, NodeList};
use space_store::now_ms;

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiJson, AppResult};

/// Every node that joined: `ready` while its lease holds, `lost` once it ran out; its
/// capacity, warm pool and session count as of its last heartbeat (admin only).
#[utoipa::path(get, path = "/v1/nodes", responses((status = 200, body = NodeList), (status = 403, body = ErrorBody)))]
pub async fn list_nodes(State(state): State<AppState>, _admin: Admin) -> AppResult<ApiJson<NodeList>> {
    Ok(ApiJson(crate::nodes::list(&state, now_ms()).await?))
}
