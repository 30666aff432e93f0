//! `POST /v1/sessions/{id}/tokens`: tokens for sub-agents, limited to a session and its forks
//! (see [`crate::scope`]).

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use space_api::{CreateSessionTokenRequest, CreatedKey, ErrorBody, ErrorCode, SessionScope};

use super::find_session;
use super::system::created_view;
use crate::AppState;
use crate::auth::{Caller, KeySpec, create_key};
use crate::error::{ApiJson, ApiPath, AppError, AppResult};
use crate::idempotency::CarriesSecret;

const DEFAULT_TTL_SECS: u64 = 3600;
const MIN_TTL_SECS: u64 = 60;
const MAX_TTL_SECS: u64 = 7 * 86_400;

/// Creates a token that may do `scopes` to this session and the sessions forked from it, for
/// `ttl_secs`. Shown once (not kept for `Idempotency-Key` replays); `GET /v1/keys` lists it
/// with its scope, `DELETE /v1/keys/{id}` revokes it. A scoped token cannot make tokens.
#[utoipa::path(post, path = "/v1/sessions/{id}/tokens", params(("id" = String, Path)),
    request_body = CreateSessionTokenRequest,
    responses((status = 201, body = CreatedKey), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn create_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CreateSessionTokenRequest>,
) -> AppResult<(StatusCode, Extension<CarriesSecret>, ApiJson<CreatedKey>)> {
    if caller.scope.is_some() {
        // The guard refuses this route to scoped tokens already; a token never makes tokens.
        return Err(AppError::new(ErrorCode::Forbidden, "a session-scoped token cannot make tokens"));
    }
    let session = find_session(&state, &caller, &id).await?;
    let mut scopes = request.scopes.clone();
    scopes.sort();
    scopes.dedup();
    if scopes.is_empty() {
        return Err(AppError::bad_request(
            "a token needs at least one scope: read, exec, fork, snapshot or destroy (e.g. \"scopes\": [\"read\", \"exec\"])",
        ));
    }
    let ttl = request.ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    if !(MIN_TTL_SECS..=MAX_TTL_SECS).contains(&ttl) {
        return Err(AppError::bad_request(format!(
            "ttl_secs {ttl} is out of range: a session token lives {MIN_TTL_SECS} s to {MAX_TTL_SECS} s (7 days)"
        )));
    }
    if request.name.as_ref().is_some_and(|n| n.chars().count() > 128 || n.chars().any(char::is_control)) {
        return Err(AppError::bad_request("the name must be at most 128 printable characters"));
    }
    let scope = SessionScope { session_id: session.id, scopes };
    let spec = KeySpec {
        tenant: &caller.tenant,
        admin: false,
        name: request.name.as_deref(),
        lifetime_ms: Some(ttl as i64 * 1000),
        scope: Some(&scope),
    };
    let (secret, key) = create_key(&state.store, spec).await?;
    Ok((StatusCode::CREATED, Extension(CarriesSecret), ApiJson(created_view(secret, &key))))
}
