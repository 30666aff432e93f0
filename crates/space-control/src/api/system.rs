//! Health, status, API keys and operations.

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use space_api::{
    CreateKeyRequest, CreatedKey, ErrorBody, ErrorCode, FullSnapshotSupport, Operation, OperationId, Status,
};

use space_api::error::clip;

use super::templates::template_view;
use crate::AppState;
use crate::auth::{Admin, Caller, create_key as make_key};
use crate::error::{ApiJson, ApiPath, AppError, AppResult};
use crate::idempotency::CarriesSecret;

/// Liveness probe; needs no key.
#[utoipa::path(get, path = "/v1/health", security(()), responses((status = 200, description = "The server is up")))]
pub async fn health() -> &'static str {
    "ok\n"
}

/// Server status: version, node, the caller's session counts and the templates.
#[utoipa::path(get, path = "/v1/status", responses((status = 200, body = Status)))]
pub async fn status(State(state): State<AppState>, Extension(caller): Extension<Caller>) -> AppResult<ApiJson<Status>> {
    let counts = state.store.count_sessions_by_state(&caller.tenant_id).await?;
    let sessions: BTreeMap<String, u64> = counts.into_iter().map(|(s, n)| (s, n as u64)).collect();
    let templates = state.node.templates().iter().map(template_view).collect();
    Ok(ApiJson(Status {
        version: env!("CARGO_PKG_VERSION").into(),
        node_id: state.node_id.clone(),
        sessions,
        templates,
        pool: state.node.pool_status(),
        full_snapshots: full_snapshot_support(&state),
        runtimes: state.node.runtimes(),
    }))
}

pub(crate) fn full_snapshot_support(state: &AppState) -> FullSnapshotSupport {
    match state.node.checkpoint_support(state.default_runtime) {
        Ok(tool) => FullSnapshotSupport { available: true, detail: tool },
        Err(why) => FullSnapshotSupport {
            available: false,
            detail: format!("{why}; run scripts/install-criu.sh and restart the server"),
        },
    }
}

/// Creates an API key for a tenant (admin only). The key is shown once: the response is not
/// kept for `Idempotency-Key` replays (a retry gets 409 `idempotency_conflict`).
#[utoipa::path(post, path = "/v1/keys", request_body = CreateKeyRequest,
    responses((status = 201, body = CreatedKey), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_key(
    State(state): State<AppState>,
    _admin: Admin,
    ApiJson(request): ApiJson<CreateKeyRequest>,
) -> AppResult<(StatusCode, Extension<CarriesSecret>, ApiJson<CreatedKey>)> {
    let tenant = request.tenant.trim();
    let valid = !tenant.is_empty()
        && tenant.len() <= 64
        && tenant.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(AppError::bad_request("tenant names are 1-64 characters of letters, digits, '-', '_' or '.'"));
    }
    let (key, tenant_id) = make_key(&state.store, tenant, false).await?;
    Ok((
        StatusCode::CREATED,
        Extension(CarriesSecret),
        ApiJson(CreatedKey { key, tenant: tenant.to_owned(), tenant_id }),
    ))
}

/// An operation: what the reconciler is doing or did for a request.
#[utoipa::path(get, path = "/v1/operations/{id}", params(("id" = String, Path)),
    responses((status = 200, body = Operation), (status = 404, body = ErrorBody)))]
pub async fn get_operation(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Operation>> {
    let not_found = || AppError::new(ErrorCode::NotFound, format!("operation {} not found", clip(&id)));
    let parsed: OperationId = id.parse().map_err(|_| not_found())?;
    let op = state.store.operation(&caller.tenant_id, &parsed).await?.ok_or_else(not_found)?;
    Ok(ApiJson(op))
}
