//! A session's egress: its network policy, its grants and the gateway's audit of it.

use axum::Extension;
use axum::extract::State;
use serde::Deserialize;
use space_api::egress::{AuditList, GrantRequest, NetworkPolicyUpdate, SessionNetwork};
use space_api::{ErrorBody, ErrorCode, SessionId};
use utoipa::IntoParams;

use super::lifecycle::live_session;
use crate::AppState;
use crate::auth::Caller;
use crate::egress::{credential_not_found, push_session};
use crate::error::{ApiJson, ApiPath, ApiQuery, AppError, AppResult};

/// Audit events returned when no limit is given, and at most.
const DEFAULT_AUDIT_LIMIT: u32 = 1000;
const MAX_AUDIT_LIMIT: u32 = 100_000;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// The latest this many events (default 1000).
    pub limit: Option<u32>,
}

async fn network_of(state: &AppState, session: &SessionId) -> AppResult<SessionNetwork> {
    let egress =
        state.store.session_egress(session).await?.ok_or_else(|| AppError::session_not_found(session.as_str()))?;
    let grants = state.store.session_grants(session).await?;
    Ok(SessionNetwork {
        session_id: session.clone(),
        policy: egress.policy,
        grants: grants.into_iter().map(|g| g.credential.name).collect(),
        inherited: state.store.inherited_grants(session).await?,
    })
}

/// The session's network policy and granted credentials.
#[utoipa::path(get, path = "/v1/sessions/{id}/network", params(("id" = String, Path)),
    responses((status = 200, body = SessionNetwork), (status = 404, body = ErrorBody)))]
pub async fn get_network(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<SessionNetwork>> {
    let session = live_session(&state, &caller, &id).await?;
    Ok(ApiJson(network_of(&state, &session.id).await?))
}

/// Changes the session's network policy; new connections follow it at once. `detached`
/// makes a fork's inherited grants its own.
#[utoipa::path(patch, path = "/v1/sessions/{id}/network", params(("id" = String, Path)),
    request_body = NetworkPolicyUpdate,
    responses((status = 200, body = SessionNetwork), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn update_network(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(update): ApiJson<NetworkPolicyUpdate>,
) -> AppResult<ApiJson<SessionNetwork>> {
    let session = live_session(&state, &caller, &id).await?;
    let updated = state
        .store
        .update_network_policy(&session.id, |policy| policy.updated(&update))
        .await?
        .ok_or_else(|| AppError::session_not_found(&id))?;
    updated.map_err(|e| AppError::bad_request(format!("network: {e}")))?;
    if update.detached {
        state.store.detach_grants(&session.id).await?;
    }
    push_session(&state, &session.id).await?;
    Ok(ApiJson(network_of(&state, &session.id).await?))
}

/// Grants a credential to the session: the gateway injects it into requests to its hosts
/// from the next request on. Idempotent. A credential the server cannot unseal is not
/// granted (500, nothing stored).
#[utoipa::path(post, path = "/v1/sessions/{id}/grants", params(("id" = String, Path)), request_body = GrantRequest,
    responses((status = 200, body = SessionNetwork), (status = 404, body = ErrorBody)))]
pub async fn grant(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<GrantRequest>,
) -> AppResult<ApiJson<SessionNetwork>> {
    let session = live_session(&state, &caller, &id).await?;
    let name = &request.credential;
    let record = state.store.credential(&caller.tenant_id, name).await?.ok_or_else(|| credential_not_found(name))?;
    state.egress().grant(&session.id, &record).await?;
    Ok(ApiJson(network_of(&state, &session.id).await?))
}

/// Revokes a credential from the session, and from its forks that inherited the grant and
/// were not detached, effective from the next request.
#[utoipa::path(delete, path = "/v1/sessions/{id}/grants/{name}", params(("id" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = SessionNetwork), (status = 404, body = ErrorBody)))]
pub async fn revoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, name)): ApiPath<(String, String)>,
) -> AppResult<ApiJson<SessionNetwork>> {
    let session = live_session(&state, &caller, &id).await?;
    let record = state.store.credential(&caller.tenant_id, &name).await?.ok_or_else(|| credential_not_found(&name))?;
    if state.egress().revoke(&session.id, &record).await?.is_empty() {
        return Err(AppError::new(
            ErrorCode::CredentialNotFound,
            format!("credential {name:?} is not granted to session {id}; `space session policy {id}` shows its grants"),
        ));
    }
    Ok(ApiJson(network_of(&state, &session.id).await?))
}

/// The gateway's decisions for the session: the latest `limit`, oldest first.
#[utoipa::path(get, path = "/v1/sessions/{id}/audit", params(("id" = String, Path), AuditParams),
    responses((status = 200, body = AuditList), (status = 404, body = ErrorBody)))]
pub async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> AppResult<ApiJson<AuditList>> {
    let session = live_session(&state, &caller, &id).await?;
    let limit = params.limit.unwrap_or(DEFAULT_AUDIT_LIMIT);
    if limit == 0 || limit > MAX_AUDIT_LIMIT {
        return Err(AppError::bad_request(format!("limit must be between 1 and {MAX_AUDIT_LIMIT}")));
    }
    Ok(ApiJson(AuditList { events: state.store.audit_events(&session.id, limit).await? }))
}
