//! Credentials: values the gateway injects into requests to their hosts. Values are sealed at
//! rest and never returned.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use space_api::egress::{CreateCredentialRequest, Credential, CredentialList, UpdateCredentialRequest};
use space_api::{CredentialId, ErrorBody, ErrorCode};
use space_store::{CredentialChange, NewCredential};

use crate::AppState;
use crate::auth::Caller;
use crate::egress::{
    credential_not_found, credential_owner, parse_header, push_credential_sessions, validate_credential_name,
    validate_env_name, validate_hosts, validate_value,
};
use crate::error::{ApiJson, ApiPath, AppError, AppResult};

fn now_secs() -> i64 {
    space_store::now_ms() / 1000
}

fn check_expiry(expires_at: i64) -> AppResult<()> {
    if expires_at <= now_secs() {
        return Err(AppError::bad_request(format!(
            "expires_at {expires_at} is in the past; give a future Unix time in seconds (or omit it)"
        )));
    }
    Ok(())
}

/// Stores a credential. Its value is sealed at rest and never shown again.
#[utoipa::path(post, path = "/v1/credentials", request_body = CreateCredentialRequest,
    responses((status = 201, body = Credential), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn create_credential(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(request): ApiJson<CreateCredentialRequest>,
) -> AppResult<(StatusCode, ApiJson<Credential>)> {
    validate_credential_name(&request.name)?;
    let hosts = validate_hosts(&request.hosts, state.allow_wildcard_credential_hosts)?;
    parse_header(&request.header)?;
    validate_value(&request.value)?;
    if let Some(expires_at) = request.expires_at {
        check_expiry(expires_at)?;
    }
    if request.rate_limit_per_min == Some(0) {
        return Err(AppError::bad_request("rate_limit_per_min must be at least 1 (omit it for no limit)"));
    }
    if let Some(name) = &request.placeholder_env {
        validate_env_name(name)?;
    }
    let id = CredentialId::generate();
    let value_sealed =
        state.keys.seal(&caller.tenant_id, request.value.as_bytes(), &credential_owner(&caller.tenant_id, &id)).await?;
    let new = NewCredential {
        id,
        tenant_id: caller.tenant_id.clone(),
        name: request.name.clone(),
        hosts,
        header: request.header.trim().to_owned(),
        value_sealed,
        expires_at: request.expires_at,
        rate_limit_per_min: request.rate_limit_per_min,
        placeholder_env: request.placeholder_env,
    };
    match state.store.insert_credential(&new).await? {
        Some(credential) => Ok((StatusCode::CREATED, ApiJson(credential))),
        None => Err(AppError::new(
            ErrorCode::Conflict,
            format!(
                "a credential named {:?} exists already; `space credential rotate {0}` changes its value, \
                 `space credential update {0}` its settings",
                request.name
            ),
        )),
    }
}

/// The caller's credentials (never their values).
#[utoipa::path(get, path = "/v1/credentials", responses((status = 200, body = CredentialList)))]
pub async fn list_credentials(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> AppResult<ApiJson<CredentialList>> {
    Ok(ApiJson(CredentialList { credentials: state.store.list_credentials(&caller.tenant_id).await? }))
}

#[utoipa::path(get, path = "/v1/credentials/{name}", params(("name" = String, Path)),
    responses((status = 200, body = Credential), (status = 404, body = ErrorBody)))]
pub async fn get_credential(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> AppResult<ApiJson<Credential>> {
    let record = state.store.credential(&caller.tenant_id, &name).await?.ok_or_else(|| credential_not_found(&name))?;
    Ok(ApiJson(record.credential))
}

/// Changes a credential: a new `value` rotates it (bumping `version`). Sessions holding it
/// use the change from their next request.
#[utoipa::path(patch, path = "/v1/credentials/{name}", params(("name" = String, Path)),
    request_body = UpdateCredentialRequest,
    responses((status = 200, body = Credential), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn update_credential(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<UpdateCredentialRequest>,
) -> AppResult<ApiJson<Credential>> {
    let current = state.store.credential(&caller.tenant_id, &name).await?.ok_or_else(|| credential_not_found(&name))?;
    let mut change = CredentialChange::default();
    if let Some(hosts) = &request.hosts {
        change.hosts = Some(validate_hosts(hosts, state.allow_wildcard_credential_hosts)?);
    }
    if let Some(header) = &request.header {
        parse_header(header)?;
        change.header = Some(header.trim().to_owned());
    }
    if let Some(value) = &request.value {
        validate_value(value)?;
        let owner = credential_owner(&caller.tenant_id, &current.credential.id);
        change.value_sealed = Some(state.keys.seal(&caller.tenant_id, value.as_bytes(), &owner).await?);
    }
    change.expires_at = match request.expires_at {
        Some(0) => Some(None),
        Some(at) => {
            check_expiry(at)?;
            Some(Some(at))
        }
        None => None,
    };
    change.rate_limit_per_min = request.rate_limit_per_min.map(|n| (n > 0).then_some(n));
    let record = state
        .store
        .update_credential(&caller.tenant_id, &name, &change)
        .await?
        .ok_or_else(|| credential_not_found(&name))?;
    let sessions = state.store.sessions_granted(&record.credential.id).await?;
    push_credential_sessions(&state, &sessions).await?;
    Ok(ApiJson(record.credential))
}

/// Deletes a credential and every grant of it; sessions that held it lose it at once.
#[utoipa::path(delete, path = "/v1/credentials/{name}", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete_credential(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> AppResult<StatusCode> {
    let (_, sessions) =
        state.store.delete_credential(&caller.tenant_id, &name).await?.ok_or_else(|| credential_not_found(&name))?;
    push_credential_sessions(&state, &sessions).await?;
    Ok(StatusCode::NO_CONTENT)
}
