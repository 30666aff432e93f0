//! The node's warm pool: how many ready sandboxes each template keeps, and how it is doing.

use axum::extract::State;
use space_api::{ErrorBody, PoolStatus, SetPoolSizeRequest};
use space_node_api::MAX_POOL_SIZE;

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiJson, ApiPath, AppError, AppResult};

/// Warm pool state: per template its size, ready and filling pods, hits and misses.
#[utoipa::path(get, path = "/v1/pool", responses((status = 200, body = PoolStatus)))]
pub async fn get_pool(State(state): State<AppState>) -> AppResult<ApiJson<PoolStatus>> {
    Ok(ApiJson(state.node.pool_status().await))
}

/// Sets how many ready pods the node keeps for a template (admin only; 0 turns it off).
/// Takes effect at once and lasts until the server restarts; `space serve --pool` sets it at start.
#[utoipa::path(put, path = "/v1/pool/{template}", params(("template" = String, Path)), request_body = SetPoolSizeRequest,
    responses((status = 200, body = PoolStatus), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn set_pool_size(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(template): ApiPath<String>,
    ApiJson(request): ApiJson<SetPoolSizeRequest>,
) -> AppResult<ApiJson<PoolStatus>> {
    if request.size > MAX_POOL_SIZE {
        return Err(AppError::bad_request(format!("size must be at most {MAX_POOL_SIZE}")));
    }
    super::sessions::check_template(&state, &template).await?;
    let runtime = request.runtime.unwrap_or(state.default_runtime);
    if request.size > 0 {
        super::sessions::check_runtime(&state, runtime)?;
    }
    state.node.clone().set_pool_size(&template, runtime, request.size).await;
    Ok(ApiJson(state.node.pool_status().await))
}
