//! The nodes' warm pools: how many ready sandboxes each template keeps, and how they are doing.

use axum::extract::State;
use space_api::{ErrorBody, PoolStatus, SetPoolSizeRequest, TemplatePool};
use space_node_api::MAX_POOL_SIZE;

use crate::AppState;
use crate::auth::Admin;
use crate::error::{ApiJson, ApiPath, AppError, AppResult};

/// Warm pool state: per template its size, ready and filling pods, hits and misses, summed
/// over the nodes (`space node list` shows each node's).
#[utoipa::path(get, path = "/v1/pool", responses((status = 200, body = PoolStatus)))]
pub async fn get_pool(State(state): State<AppState>) -> AppResult<ApiJson<PoolStatus>> {
    Ok(ApiJson(pool_status(&state).await))
}

/// Every node's pool, summed (per template and runtime for the templates), asked of all at
/// once: a node that does not answer within [`crate::placement::ASK`] (stalled, or lost) is
/// left out rather than holding the call.
pub(crate) async fn pool_status(state: &AppState) -> PoolStatus {
    let asked = state.nodes.iter().map(|(id, node)| async move {
        let answer = tokio::time::timeout(crate::placement::ASK, node.pool_status()).await;
        if answer.is_err() {
            tracing::warn!(node = %id, "the node did not say how its pool is: left out of the sum");
        }
        answer.ok()
    });
    let mut sum = PoolStatus::default();
    for one in futures::future::join_all(asked).await.into_iter().flatten() {
        sum.max_filling += one.max_filling;
        sum.filling += one.filling;
        sum.peak_filling += one.peak_filling;
        sum.pending_deletions += one.pending_deletions;
        for pool in one.templates {
            add_pool(&mut sum.templates, pool);
        }
    }
    sum
}

fn add_pool(sum: &mut Vec<TemplatePool>, pool: TemplatePool) {
    let Some(p) = sum.iter_mut().find(|p| p.template == pool.template && p.runtime == pool.runtime) else {
        sum.push(pool);
        return;
    };
    p.size += pool.size;
    p.ready += pool.ready;
    p.filling += pool.filling;
    p.hits += pool.hits;
    p.misses += pool.misses;
    p.failures += pool.failures;
    p.last_error = p.last_error.take().or(pool.last_error);
}

/// Sets how many ready pods each node keeps for a template (admin only; 0 turns it off).
/// Takes effect at once and lasts until the server restarts; `space serve --pool` sets it at start.
#[utoipa::path(put, path = "/v1/pool/{template}", params(("template" = String, Path)), request_body = SetPoolSizeRequest,
    responses((status = 200, body = PoolStatus), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn set_pool_size(
    State(state): State<AppState>,
    Admin(admin): Admin,
    ApiPath(template): ApiPath<String>,
    ApiJson(request): ApiJson<SetPoolSizeRequest>,
) -> AppResult<ApiJson<PoolStatus>> {
    if request.size > MAX_POOL_SIZE {
        return Err(AppError::bad_request(format!("size must be at most {MAX_POOL_SIZE}")));
    }
    super::sessions::check_template(&state, &admin.tenant_id, &template).await?;
    let runtime = request.runtime.unwrap_or(state.default_runtime);
    if request.size > 0 {
        super::sessions::check_runtime(&state, runtime)?;
    }
    for (_, node) in state.nodes.iter() {
        node.clone().set_pool_size(&template, runtime, request.size).await;
    }
    Ok(ApiJson(pool_status(&state).await))
}
