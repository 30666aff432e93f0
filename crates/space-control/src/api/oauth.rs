//! `oauth2` credentials: their settings checked at creation, and a human's sign-in (the
//! authorization-code grant with PKCE) that leaves the refresh token with the control plane.

use axum::Extension;
use axum::extract::{Query, State};
use sha2::{Digest, Sha256};
use space_api::egress::{
    CredentialKind, OAuth2GrantType, OAuth2Login, OAuth2LoginRequest, OAuth2Request, OAuth2Status,
};
use space_api::error::echo;
use space_api::{ErrorBody, ErrorCode};
use space_oauth::{Grant, Pkce};
use space_store::{CredentialRecord, OAuthLogin, OAuthSettings};

use crate::AppState;
use crate::auth::Caller;
use crate::egress::{credential_not_found, push_credential_sessions};
use crate::error::{ApiJson, ApiPath, AppError, AppResult};
use crate::idempotency::CarriesSecret;
use crate::oauth::{Secrets, access_owner, change_secrets, expiry, open_secrets, settings_of, unix_now};

/// The path a provider redirects a sign-in to.
pub const CALLBACK_PATH: &str = "/v1/oauth/callback";
/// How long a sign-in may take.
const LOGIN_TTL_SECS: i64 = 600;
const MAX_SCOPES: usize = 64;
const MAX_FIELD: usize = 2048;

/// What an `oauth2` credential stores: settings, secrets (to seal as its value) and its
/// first status. 400 for anything that cannot work.
pub fn checked(state: &AppState, o: &OAuth2Request) -> AppResult<(OAuthSettings, Secrets, OAuth2Status)> {
    let url = |what: &str, text: &str| {
        state
            .oauth
            .client
            .check_url(what, text)
            .map(|u| u.to_string())
            .map_err(|e| AppError::bad_request(e.to_string()))
    };
    let token_url = url("oauth2.token_url", &o.token_url)?;
    let authorize_url = o.authorize_url.as_deref().map(|a| url("oauth2.authorize_url", a)).transpose()?;
    let redirect_uri = o.redirect_uri.as_deref().map(check_redirect).transpose()?;
    check_text("oauth2.client_id", &o.client_id)?;
    for (what, secret) in [("oauth2.client_secret", &o.client_secret), ("oauth2.refresh_token", &o.refresh_token)] {
        if let Some(secret) = secret {
            space_oauth::check_token(secret).map_err(|why| AppError::bad_request(format!("{what} {why}")))?;
        }
    }
    if o.scopes.len() > MAX_SCOPES {
        return Err(AppError::bad_request(format!("oauth2.scopes: at most {MAX_SCOPES}")));
    }
    for scope in &o.scopes {
        if scope.is_empty()
            || scope.len() > 256
            || !scope.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            return Err(AppError::bad_request(format!(
                "oauth2.scopes: {} is not a scope (printable, no spaces, quotes or backslashes)",
                echo(scope)
            )));
        }
    }
    let status = match o.grant_type {
        OAuth2GrantType::ClientCredentials if authorize_url.is_some() => {
            return Err(AppError::bad_request(
                "oauth2.authorize_url is for grant_type refresh_token (a user's sign-in); the client_credentials \
                 grant signs in as the client itself",
            ));
        }
        OAuth2GrantType::ClientCredentials if o.client_secret.is_none() => {
            return Err(AppError::bad_request("the client_credentials grant needs oauth2.client_secret"));
        }
        OAuth2GrantType::ClientCredentials if o.refresh_token.is_some() => {
            return Err(AppError::bad_request(
                "oauth2.refresh_token is for grant_type refresh_token; the client_credentials grant uses none",
            ));
        }
        OAuth2GrantType::ClientCredentials => OAuth2Status::Pending,
        OAuth2GrantType::RefreshToken if o.refresh_token.is_some() => OAuth2Status::Pending,
        OAuth2GrantType::RefreshToken if authorize_url.is_none() => {
            return Err(AppError::bad_request(
                "grant_type refresh_token needs oauth2.refresh_token, or oauth2.authorize_url to sign in with \
                 `space credential login`",
            ));
        }
        OAuth2GrantType::RefreshToken => OAuth2Status::NeedsLogin,
    };
    let settings = OAuthSettings {
        token_url,
        client_id: o.client_id.clone(),
        scopes: o.scopes.clone(),
        grant_type: o.grant_type,
        authorize_url,
        redirect_uri,
        client_auth: o.client_auth,
    };
    let secrets = Secrets { client_secret: o.client_secret.clone(), refresh_token: o.refresh_token.clone() };
    Ok((settings, secrets, status))
}

fn check_text(what: &str, text: &str) -> AppResult<()> {
    if text.is_empty() || text.len() > MAX_FIELD || !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(AppError::bad_request(format!("{what} must be 1-{MAX_FIELD} printable characters")));
    }
    Ok(())
}

/// An absolute http(s) URL ending in [`CALLBACK_PATH`]: where the browser is sent back.
fn check_redirect(text: &str) -> AppResult<String> {
    let bad = || {
        AppError::bad_request(format!(
            "redirect_uri {} must be this control plane's URL followed by {CALLBACK_PATH}, e.g. \
             https://space.example.com{CALLBACK_PATH}",
            echo(text)
        ))
    };
    let url = url::Url::parse(text).map_err(|_| bad())?;
    let plain = matches!(url.scheme(), "http" | "https")
        && url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none()
        && url.path().ends_with(CALLBACK_PATH);
    if !plain {
        return Err(bad());
    }
    Ok(url.to_string())
}

/// Starts a sign-in: the URL where the human signs in. The provider then redirects to
/// `/v1/oauth/callback`, which stores the refresh token.
#[utoipa::path(post, path = "/v1/credentials/{name}/login", params(("name" = String, Path)),
    request_body = OAuth2LoginRequest,
    responses((status = 200, body = OAuth2Login), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn login(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<OAuth2LoginRequest>,
) -> AppResult<(Extension<CarriesSecret>, ApiJson<OAuth2Login>)> {
    let record = state.store.credential(&caller.tenant_id, &name).await?.ok_or_else(|| credential_not_found(&name))?;
    if record.credential.kind != CredentialKind::Oauth2 {
        return Err(AppError::bad_request(format!("credential {name:?} is static: only oauth2 credentials sign in")));
    }
    let settings = settings_of(&record)?;
    if settings.grant_type != OAuth2GrantType::RefreshToken {
        return Err(AppError::bad_request(format!(
            "credential {name:?} uses the client_credentials grant: it signs in as the client, not as a user"
        )));
    }
    let authorize = settings.authorize_url.as_deref().ok_or_else(|| {
        AppError::bad_request(format!(
            "credential {name:?} has no authorize_url: create it with one to sign in (`--authorize-url`)"
        ))
    })?;
    let redirect = match request.redirect_uri.as_deref().or(settings.redirect_uri.as_deref()) {
        Some(uri) => check_redirect(uri)?,
        None => {
            return Err(AppError::bad_request(format!(
                "credential {name:?} has no redirect_uri: give the one registered with the provider \
                 (this control plane's URL followed by {CALLBACK_PATH})"
            )));
        }
    };
    let authorize =
        state.oauth.client.check_url("authorize_url", authorize).map_err(|e| AppError::bad_request(e.to_string()))?;
    let pkce = Pkce::generate();
    let login_state = space_oauth::random_state();
    let owner = login_owner(&record, &login_state);
    let verifier_sealed = state.keys.seal(&caller.tenant_id, pkce.verifier.as_bytes(), &owner).await?;
    let expires_at = unix_now() + LOGIN_TTL_SECS;
    let login =
        OAuthLogin { credential_id: record.credential.id.clone(), verifier_sealed, redirect_uri: redirect.clone() };
    state.store.insert_oauth_login(&state_digest(&login_state), &login, expires_at * 1000).await?;
    let url = space_oauth::authorization_url(
        &authorize,
        &settings.client_id,
        &redirect,
        &settings.scopes,
        &login_state,
        &pkce.challenge,
    );
    // The URL holds the state: never kept by the idempotency layer.
    Ok((Extension(CarriesSecret), ApiJson(OAuth2Login { authorization_url: url.to_string(), expires_at })))
}

/// Associated data that binds a sign-in's sealed verifier to its credential and state.
fn login_owner(record: &CredentialRecord, state: &str) -> String {
    format!("oauth-login/{}/{}/{}", record.tenant_id, record.credential.id, state_digest(state))
}

/// What the store keeps of a sign-in's state: its SHA-256, so the table holds nothing that
/// completes a sign-in.
fn state_digest(state: &str) -> String {
    hex::encode(Sha256::digest(state.as_bytes()))
}

/// What the provider sends the browser back with.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
pub struct CallbackQuery {
    pub state: Option<String>,
    pub code: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

/// Where the provider sends the browser after a sign-in: exchanges the code (with the
/// sign-in's PKCE verifier) for tokens and keeps the refresh token. Needs no API key: the
/// single-use `state` of a sign-in started with one is the authorization.
#[utoipa::path(get, path = "/v1/oauth/callback", params(CallbackQuery), security(()),
    responses((status = 200, body = String), (status = 400, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn callback(State(state): State<AppState>, Query(query): Query<CallbackQuery>) -> AppResult<String> {
    let unknown = || {
        AppError::bad_request(
            "this sign-in is unknown, used already or expired: run `space credential login NAME` again",
        )
    };
    let login_state = query.state.as_deref().filter(|s| !s.is_empty() && s.len() <= 128).ok_or_else(unknown)?;
    let login = state.store.take_oauth_login(&state_digest(login_state)).await?.ok_or_else(unknown)?;
    let record = state.store.credential_by_id(&login.credential_id).await?.ok_or_else(unknown)?;
    let name = record.credential.name.clone();
    if let Some(error) = &query.error {
        let description = query.error_description.as_deref().map(|d| format!(" ({})", echo(d))).unwrap_or_default();
        let reason = format!("the sign-in was refused: {}{description}", echo(error));
        sign_in_failed(&state, &record, &reason).await?;
        return Err(AppError::bad_request(format!(
            "credential {name:?}: {reason}; run `space credential login {name}` again"
        )));
    }
    let code = query.code.as_deref().filter(|c| !c.is_empty() && c.len() <= 4096).ok_or_else(|| {
        AppError::bad_request("the provider sent no authorization code: run `space credential login NAME` again")
    })?;
    let verifier = state.keys.open(&login.verifier_sealed, &login_owner(&record, login_state)).await?;
    let verifier =
        String::from_utf8(verifier.to_vec()).map_err(|_| AppError::internal("a sign-in's verifier is not text"))?;
    exchange(&state, &record, code, &login.redirect_uri, &verifier).await?;
    Ok(format!("Signed in: credential {name} now gets its tokens from the provider. You can close this window.\n"))
}

/// A sign-in that failed: recorded on the credential if it has no refresh token to go on
/// with (one that has keeps working, and keeps its status).
async fn sign_in_failed(state: &AppState, record: &CredentialRecord, reason: &str) -> AppResult<()> {
    if open_secrets(&state.keys, record).await?.refresh_token.is_none() {
        state.store.oauth_failed(&record.credential.id, OAuth2Status::NeedsLogin, reason, 0).await?;
    }
    Ok(())
}

/// The authorization-code exchange: the refresh token goes into the credential's secrets,
/// the access token into its cache, and the sessions holding it get the new token.
async fn exchange(
    state: &AppState,
    record: &CredentialRecord,
    code: &str,
    redirect: &str,
    verifier: &str,
) -> AppResult<()> {
    let settings = settings_of(record)?;
    let secrets = open_secrets(&state.keys, record).await?;
    let name = &record.credential.name;
    let grant = Grant::AuthorizationCode { code, redirect_uri: redirect, verifier };
    let token = match state.oauth.token(&settings, &secrets, grant).await {
        Ok(token) => token,
        Err(e) => {
            let reason = format!("the sign-in's code exchange failed: {e}");
            sign_in_failed(state, record, &reason).await?;
            return Err(AppError::new(
                ErrorCode::OauthFailed,
                format!("{reason}; run `space credential login {name}` again"),
            ));
        }
    };
    let Some(refresh) = token.refresh_token.as_ref().map(|r| r.to_string()) else {
        let reason = "the provider returned no refresh token: ask for offline access (for many providers the \
                      offline_access scope) and sign in again";
        sign_in_failed(state, record, reason).await?;
        return Err(AppError::new(ErrorCode::OauthFailed, reason));
    };
    let id = &record.credential.id;
    change_secrets(&state.store, &state.keys, id, |s| s.refresh_token = Some(refresh.clone())).await?;
    let access =
        state.keys.seal(&record.tenant_id, token.access_token.as_bytes(), &access_owner(&record.tenant_id, id)).await?;
    state.store.oauth_refreshed(id, &access, expiry(&token)).await?;
    let sessions = state.store.sessions_granted(id).await?;
    push_credential_sessions(state, &sessions).await
}
