//! Credentials: values the gateway injects into requests to their hosts. Values are sealed at
//! rest and never returned.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use space_api::egress::{
    CreateCredentialRequest, Credential, CredentialKind, CredentialList, OAuth2Status, UpdateCredentialRequest,
};
use space_api::{CredentialId, ErrorBody, ErrorCode};
use space_store::{CredentialChange, NewCredential};

use space_keys::Zeroizing;

use super::oauth;
use crate::AppState;
use crate::auth::Caller;
use crate::egress::{
    credential_not_found, credential_owner, parse_header, push_credential_sessions, validate_credential_name,
    validate_env_name, validate_hosts, validate_value,
};
use crate::error::{ApiJson, ApiPath, AppError, AppResult};

/// What an `oauth2` credential injects unless told otherwise.
const DEFAULT_OAUTH_HEADER: &str = "Authorization: Bearer {secret}";

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
    let owner = credential_owner(&caller.tenant_id, &id);
    let (header, value, oauth) = match (request.kind, &request.oauth2) {
        (CredentialKind::Static, Some(_)) => {
            return Err(AppError::bad_request("oauth2 settings need \"kind\": \"oauth2\""));
        }
        (CredentialKind::Static, None) => {
            validate_value(&request.value)?;
            (request.header.trim().to_owned(), Zeroizing::new(request.value.clone().into_bytes()), None)
        }
        (CredentialKind::Oauth2, None) => {
            return Err(AppError::bad_request(
                "an oauth2 credential needs oauth2 settings: token_url, client_id and grant_type at least",
            ));
        }
        (CredentialKind::Oauth2, Some(o)) => {
            if !request.value.is_empty() {
                return Err(AppError::bad_request(
                    "an oauth2 credential has no value: the gateway injects the access tokens its token endpoint gives",
                ));
            }
            let header = match request.header.trim() {
                "" => DEFAULT_OAUTH_HEADER.to_owned(),
                header => header.to_owned(),
            };
            let (settings, secrets, status) = oauth::checked(&state, o)?;
            (header, secrets.to_json(), Some((settings, status)))
        }
    };
    parse_header(&header)?;
    let value_sealed = state.keys.seal(&caller.tenant_id, &value, &owner).await?;
    let new = NewCredential {
        id,
        tenant_id: caller.tenant_id.clone(),
        name: request.name.clone(),
        hosts,
        header,
        value_sealed,
        expires_at: request.expires_at,
        rate_limit_per_min: request.rate_limit_per_min,
        placeholder_env: request.placeholder_env,
        oauth,
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
    let oauth2 = current.credential.kind == CredentialKind::Oauth2;
    if let Some(value) = &request.value {
        if oauth2 {
            return Err(AppError::bad_request(
                "an oauth2 credential has no value: change its client_secret or refresh_token instead",
            ));
        }
        validate_value(value)?;
        let owner = credential_owner(&caller.tenant_id, &current.credential.id);
        change.value_sealed = Some(state.keys.seal(&caller.tenant_id, value.as_bytes(), &owner).await?);
    }
    let new_secrets = request.client_secret.is_some() || request.refresh_token.is_some();
    if new_secrets {
        if !oauth2 {
            return Err(AppError::bad_request(format!(
                "credential {name:?} is static: client_secret and refresh_token are for oauth2 credentials; \
                 `value` rotates a static one"
            )));
        }
        for (what, new) in [("client_secret", &request.client_secret), ("refresh_token", &request.refresh_token)] {
            if let Some(new) = new {
                space_oauth::check_token(new).map_err(|why| AppError::bad_request(format!("{what} {why}")))?;
            }
        }
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
    if new_secrets {
        // Last, once everything else was found valid: a refused request changes nothing.
        let (secret, refresh) = (request.client_secret.clone(), request.refresh_token.clone());
        crate::oauth::change_secrets(&state.store, &state.keys, &current.credential.id, |s| {
            if let Some(secret) = &secret {
                s.client_secret = Some(secret.clone());
            }
            if let Some(refresh) = &refresh {
                s.refresh_token = Some(refresh.clone());
            }
        })
        .await?;
    }
    let record = state
        .store
        .update_credential(&caller.tenant_id, &name, &change)
        .await?
        .ok_or_else(|| credential_not_found(&name))?;
    if new_secrets {
        // New secrets: the next push asks for a token with them.
        state.store.oauth_reset(&record.credential.id, OAuth2Status::Pending).await?;
    }
    let sessions = state.store.sessions_granted(&record.credential.id).await?;
    push_credential_sessions(&state, &sessions).await?;
    let record =
        state.store.credential_by_id(&record.credential.id).await?.ok_or_else(|| credential_not_found(&name))?;
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
