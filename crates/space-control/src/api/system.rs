//! Health, status, API keys and operations.
//!
//! Keys: the admin creates them; the admin manages every key, a tenant its own (list,
//! revoke, rotate). See docs/tenancy.md.

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use space_api::{
    ApiKey, CreateKeyRequest, CreatedKey, ErrorBody, ErrorCode, FullSnapshotSupport, KeyId, KeyList, Operation,
    OperationId, OperationLog, Status,
};
use space_store::{KeyRecord, RevokeRefused};

use space_api::error::clip;

use super::templates::visible_view;
use crate::AppState;
use crate::auth::{Admin, Caller, KeySpec, create_key as make_key};
use crate::error::{ApiJson, ApiPath, ApiQuery, AppError, AppResult};
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
    let first = state.nodes.first();
    let templates = first.templates().await.iter().filter_map(|t| visible_view(&caller.tenant_id, t)).collect();
    Ok(ApiJson(Status {
        version: env!("CARGO_PKG_VERSION").into(),
        node_id: first.node_id(),
        sessions,
        templates,
        pool: super::pool::pool_status(&state).await,
        full_snapshots: full_snapshot_support(&state),
        runtimes: first.runtimes(),
    }))
}

pub(crate) fn full_snapshot_support(state: &AppState) -> FullSnapshotSupport {
    match state.nodes.first().checkpoint_support(state.default_runtime) {
        Ok(tool) => FullSnapshotSupport { available: true, detail: tool },
        Err(why) => FullSnapshotSupport {
            available: false,
            detail: format!("{why}; run scripts/install-criu.sh and restart the server"),
        },
    }
}

/// Longest accepted key lifetime: ten years.
const MAX_KEY_LIFETIME_SECS: u64 = 10 * 366 * 24 * 3600;
const MAX_KEY_NAME: usize = 128;

/// Tenant names: 1-64 letters, digits, '-', '_' or '.'.
pub(crate) fn check_tenant_name(tenant: &str) -> AppResult<()> {
    let valid = !tenant.is_empty()
        && tenant.len() <= 64
        && tenant.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(AppError::bad_request("tenant names are 1-64 characters of letters, digits, '-', '_' or '.'"));
    }
    Ok(())
}

fn check_key_request(request: &CreateKeyRequest) -> AppResult<()> {
    check_tenant_name(request.tenant.trim())?;
    if let Some(name) = &request.name
        && (name.is_empty() || name.len() > MAX_KEY_NAME || name.chars().any(char::is_control))
    {
        return Err(AppError::bad_request(format!(
            "key names are 1-{MAX_KEY_NAME} characters, without control characters"
        )));
    }
    if request.expires_in_secs.is_some_and(|s| s == 0 || s > MAX_KEY_LIFETIME_SECS) {
        return Err(AppError::bad_request(format!(
            "expires_in_secs must be between 1 and {MAX_KEY_LIFETIME_SECS} (ten years); leave it out for a key that \
             does not expire"
        )));
    }
    Ok(())
}

pub(crate) fn key_view(key: &KeyRecord) -> ApiKey {
    ApiKey {
        id: key.id.clone(),
        name: key.name.clone(),
        tenant: key.tenant.clone(),
        tenant_id: key.tenant_id.clone(),
        admin: key.admin,
        created_at: key.created_at,
        last_used_at: key.last_used_at,
        expires_at: key.expires_at,
        revoked_at: key.revoked_at,
        scope: key.scope.clone(),
    }
}

pub(crate) fn created_view(secret: String, key: &KeyRecord) -> CreatedKey {
    CreatedKey {
        key: secret,
        id: key.id.clone(),
        name: key.name.clone(),
        tenant: key.tenant.clone(),
        tenant_id: key.tenant_id.clone(),
        created_at: key.created_at,
        expires_at: key.expires_at,
        scope: key.scope.clone(),
    }
}

/// Creates an API key for a tenant (admin only). The key is shown once: the response is not
/// kept for `Idempotency-Key` replays (a retry gets 409 `idempotency_conflict`).
#[utoipa::path(post, path = "/v1/keys", request_body = CreateKeyRequest,
    responses((status = 201, body = CreatedKey), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create_key(
    State(state): State<AppState>,
    _admin: Admin,
    ApiJson(request): ApiJson<CreateKeyRequest>,
) -> AppResult<(StatusCode, Extension<CarriesSecret>, ApiJson<CreatedKey>)> {
    check_key_request(&request)?;
    let lifetime_ms = request.expires_in_secs.map(|s| s as i64 * 1000);
    let spec = KeySpec {
        tenant: request.tenant.trim(),
        admin: false,
        name: request.name.as_deref(),
        lifetime_ms,
        scope: None,
    };
    let (secret, key) = make_key(&state.store, spec).await?;
    Ok((StatusCode::CREATED, Extension(CarriesSecret), ApiJson(created_view(secret, &key))))
}

/// API keys, oldest first, never their secrets: every tenant's for the admin, the caller's
/// tenant's for others. Revoked keys are listed (with `revoked_at`).
#[utoipa::path(get, path = "/v1/keys", responses((status = 200, body = KeyList)))]
pub async fn list_keys(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> AppResult<ApiJson<KeyList>> {
    let tenant = (!caller.admin).then_some(&caller.tenant_id);
    let keys = state.store.list_keys(tenant).await?;
    Ok(ApiJson(KeyList { keys: keys.iter().map(key_view).collect() }))
}

/// Key `id` if the caller may manage it: the admin any key, others their tenant's (404
/// otherwise, as for a key that does not exist).
async fn manageable_key(state: &AppState, caller: &Caller, id: &str) -> AppResult<KeyRecord> {
    let not_found =
        || AppError::new(ErrorCode::NotFound, format!("API key {} not found; `space key list` shows yours", clip(id)));
    let parsed: KeyId = id.parse().map_err(|_| not_found())?;
    let key = state.store.key(&parsed).await?.ok_or_else(not_found)?;
    if !caller.admin && key.tenant_id != caller.tenant_id {
        return Err(not_found());
    }
    Ok(key)
}

/// Revokes an API key: the next request made with it fails with 401 `key_revoked`. The
/// admin may revoke any key, a tenant its own. Idempotent. The last admin key in effect
/// cannot be revoked (409): rotate it instead.
#[utoipa::path(delete, path = "/v1/keys/{id}", params(("id" = String, Path)),
    responses((status = 200, body = ApiKey), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn revoke_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<ApiKey>> {
    let key = manageable_key(&state, &caller, &id).await?;
    match state.store.revoke_key(&key.id).await? {
        Ok(revoked) => Ok(ApiJson(key_view(&revoked))),
        Err(RevokeRefused::NotFound) => Err(AppError::internal(format!("key {} vanished", key.id))),
        Err(RevokeRefused::LastAdminKey) => Err(AppError::new(
            ErrorCode::Conflict,
            format!(
                "{} is the last admin key in effect, and without one nobody can manage the server; rotate it \
                 instead (`space key rotate {}`)",
                key.id, key.id
            ),
        )),
    }
}

/// Replaces an API key by a new one of the same tenant and name (and a lifetime as long as
/// the old one's) and revokes the old one, at once. The admin may rotate any key, a tenant
/// its own. Rotating the admin key that `DATA_DIR/admin.key` holds writes the new one there.
#[utoipa::path(post, path = "/v1/keys/{id}/rotate", params(("id" = String, Path)),
    responses((status = 201, body = CreatedKey), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn rotate_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<(StatusCode, Extension<CarriesSecret>, ApiJson<CreatedKey>)> {
    let old = manageable_key(&state, &caller, &id).await?;
    let Some((secret, new)) = crate::auth::rotate_key(&state.store, &old).await? else {
        return Err(AppError::new(
            ErrorCode::Conflict,
            format!("API key {} was revoked and cannot be rotated; create a new key (`space key create`)", old.id),
        ));
    };
    if old.admin {
        crate::auth::follow_admin_rotation(&state.store, &state.admin_key_file, &old.id, &secret).await?;
    }
    Ok((StatusCode::CREATED, Extension(CarriesSecret), ApiJson(created_view(secret, &new))))
}

/// 404 for operation `id`: unknown, another tenant's, or not an operation id at all.
fn operation_not_found(id: &str) -> AppError {
    AppError::new(ErrorCode::NotFound, format!("operation {} not found", clip(id)))
}

/// Which lines of an operation's log to read.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// The number of the first line (`next` of the previous page); default 0.
    #[serde(default)]
    pub after: i64,
    /// At most this many lines (default and maximum 1000).
    pub limit: Option<i64>,
}

/// The log of an operation (a Dockerfile build's steps and their output), a page at a time.
#[utoipa::path(get, path = "/v1/operations/{id}/logs", params(("id" = String, Path), LogParams),
    responses((status = 200, body = OperationLog), (status = 404, body = ErrorBody)))]
pub async fn operation_log(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<LogParams>,
) -> AppResult<ApiJson<OperationLog>> {
    let not_found = || operation_not_found(&id);
    let parsed: OperationId = id.parse().map_err(|_| not_found())?;
    let limit = params.limit.unwrap_or(1000).clamp(1, 1000);
    let after = params.after.max(0);
    let lines = state.store.operation_log(&caller.tenant_id, &parsed, after, limit).await?.ok_or_else(not_found)?;
    let next = lines.last().map_or(after, |(seq, _)| seq + 1);
    Ok(ApiJson(OperationLog { lines: lines.into_iter().map(|(_, line)| line).collect(), next }))
}

/// An operation: what the reconciler is doing or did for a request.
#[utoipa::path(get, path = "/v1/operations/{id}", params(("id" = String, Path)),
    responses((status = 200, body = Operation), (status = 404, body = ErrorBody)))]
pub async fn get_operation(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Operation>> {
    let not_found = || operation_not_found(&id);
    let parsed: OperationId = id.parse().map_err(|_| not_found())?;
    let op = state.store.operation(&caller.tenant_id, &parsed).await?.ok_or_else(not_found)?;
    Ok(ApiJson(op))
}
