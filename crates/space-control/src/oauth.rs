//! The OAuth broker: access tokens for `oauth2` credentials, got from their token endpoints
//! by the control plane, kept sealed in the store (one current token per credential, shared
//! by every replica), refreshed before they expire and pushed to the gateways of the sessions
//! holding them. A client secret or refresh token never leaves the control plane: a node
//! (and its gateway) gets the access token only, as it gets a static credential's value.
//!
//! One replica at a time asks for a credential's token (a lease in the store), so a refresh
//! token the endpoint rotates is never spent twice. After a failure the credential is
//! `failing`, its sessions' requests to its hosts get 502 with the reason, each session's
//! audit log records it, and the next attempt waits (doubling, up to [`MAX_BACKOFF_MS`]): an
//! endpoint that fails is not hammered.

use std::time::Duration;

use space_api::egress::{AuditDecision, AuditEvent, OAuth2ClientAuth, OAuth2GrantType, OAuth2Status};
use space_api::{CredentialId, TenantId};
use space_keys::Zeroizing;
use space_oauth::{ClientAuth, Grant, OAuthClient, OAuthError, TokenRequest};
use space_store::{CredentialRecord, OAuthSettings, Store};

use crate::AppState;
use crate::egress::credential_owner;
use crate::error::{AppError, AppResult};
use crate::keyring::Keyring;

/// A token is refreshed this long before it expires.
pub const REFRESH_MARGIN_SECS: i64 = 60;
/// A token is used by a new push only while it has this long left.
const MIN_LEFT_SECS: i64 = 5;
/// What a token the endpoint gave no lifetime for is taken to last.
const DEFAULT_LIFETIME_SECS: u64 = 3600;
/// The lease on asking for a credential's token: longer than a token request can take.
const CLAIM_MS: i64 = 30_000;
/// How long a push waits for another replica's refresh before giving up.
const WAIT_FOR_OTHER: Duration = Duration::from_secs(20);
/// Waits after the first failure, doubling with each one up to [`MAX_BACKOFF_MS`].
const FIRST_BACKOFF_MS: i64 = 15_000;
const MAX_BACKOFF_MS: i64 = 600_000;
/// How often due tokens are looked for.
const TICK: Duration = Duration::from_secs(5);

/// What the secrets of an `oauth2` credential are sealed as (its value).
#[derive(serde::Serialize, serde::Deserialize, Default)]
pub struct Secrets {
    pub client_secret: Option<String>,
    pub refresh_token: Option<String>,
}

impl Drop for Secrets {
    fn drop(&mut self) {
        use space_keys::Zeroizing as Z;
        drop(self.client_secret.take().map(Z::new));
        drop(self.refresh_token.take().map(Z::new));
    }
}

impl Secrets {
    pub fn to_json(&self) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// Associated data that binds a credential's sealed access token to it.
pub fn access_owner(tenant: &TenantId, id: &CredentialId) -> String {
    format!("credential-access/{tenant}/{id}")
}

/// When `token` expires (Unix s).
pub fn expiry(token: &space_oauth::Token) -> i64 {
    let lifetime = token.expires_in.unwrap_or(DEFAULT_LIFETIME_SECS).min(u64::from(u32::MAX));
    unix_now() + lifetime as i64
}

pub fn unix_now() -> i64 {
    space_store::now_ms() / 1000
}

/// The token endpoint client of the control plane.
pub struct Broker {
    pub client: OAuthClient,
}

impl Broker {
    pub fn new(net: &space_oauth::NetConfig) -> Result<Broker, OAuthError> {
        Ok(Broker { client: OAuthClient::new(net)? })
    }

    /// The credential's current access token, asked for first if there is none usable; the
    /// reason there is none otherwise (it does not ask while a failure's wait runs).
    pub async fn access_token(
        &self,
        store: &Store,
        keys: &Keyring,
        record: &CredentialRecord,
    ) -> Result<Zeroizing<String>, String> {
        let id = &record.credential.id;
        let tokens = store.oauth_tokens(id).await.map_err(|e| e.to_string())?.unwrap_or_default();
        if let Some(token) = usable(keys, record, &tokens, MIN_LEFT_SECS).await {
            return Ok(token);
        }
        if tokens.retry_at.is_some_and(|at| at > space_store::now_ms()) {
            return Err(reason_of(record));
        }
        self.refresh(store, keys, record).await
    }

    /// Asks the token endpoint for a new token under the lease, and records the outcome. If
    /// another replica holds the lease, waits for its token instead.
    pub async fn refresh(
        &self,
        store: &Store,
        keys: &Keyring,
        record: &CredentialRecord,
    ) -> Result<Zeroizing<String>, String> {
        let id = &record.credential.id;
        if !store.claim_oauth_refresh(id, space_store::now_ms() + CLAIM_MS).await.map_err(|e| e.to_string())? {
            return wait_for_other(store, keys, record).await;
        }
        match self.ask(keys, record).await {
            Ok((token, value)) => {
                let expires_at = expiry(&token);
                let tenant = &record.tenant_id;
                let sealed = keys.seal(tenant, token.access_token.as_bytes(), &access_owner(tenant, id)).await;
                let sealed = sealed.map_err(|e| e.0.message)?;
                let value = value.as_ref().map(|new| (record.value_sealed.as_slice(), new.as_slice()));
                store.oauth_refreshed(id, &sealed, expires_at, value).await.map_err(|e| e.to_string())?;
                Ok(token.access_token)
            }
            Err((status, reason)) => {
                let tokens = store.oauth_tokens(id).await.ok().flatten().unwrap_or_default();
                let wait = (FIRST_BACKOFF_MS << tokens.failures.min(10)).min(MAX_BACKOFF_MS);
                if let Err(e) = store.oauth_failed(id, status, &reason, space_store::now_ms() + wait).await {
                    tracing::warn!(credential = %id, error = %e, "cannot record a failed token request");
                }
                audit_failure(store, record, &reason).await;
                Err(reason)
            }
        }
    }

    /// One token request; the token and, when the endpoint rotated the refresh token, the
    /// credential's new sealed value.
    async fn ask(
        &self,
        keys: &Keyring,
        record: &CredentialRecord,
    ) -> Result<(space_oauth::Token, Option<Vec<u8>>), (OAuth2Status, String)> {
        let failing = |reason: String| (OAuth2Status::Failing, reason);
        let settings = settings_of(record).map_err(|e| failing(e.0.message))?;
        let owner = credential_owner(&record.tenant_id, &record.credential.id);
        let opened = keys.open(&record.value_sealed, &owner).await.map_err(|e| failing(e.0.message))?;
        let mut secrets: Secrets = serde_json::from_slice(&opened)
            .map_err(|_| failing("the credential's stored secrets are not readable".into()))?;
        let token_url = self.client.check_url("token_url", &settings.token_url).map_err(|e| failing(e.to_string()))?;
        let grant = match (settings.grant_type, secrets.refresh_token.as_deref()) {
            (OAuth2GrantType::ClientCredentials, _) => Grant::ClientCredentials,
            (OAuth2GrantType::RefreshToken, Some(token)) => Grant::RefreshToken(token),
            (OAuth2GrantType::RefreshToken, None) => {
                let name = &record.credential.name;
                return Err((
                    OAuth2Status::NeedsLogin,
                    format!("no refresh token yet: sign in with `space credential login {name}`"),
                ));
            }
        };
        let request = TokenRequest {
            token_url: &token_url,
            client_id: &settings.client_id,
            client_secret: secrets.client_secret.as_deref(),
            auth: client_auth(settings.client_auth),
            scopes: &settings.scopes,
            grant,
        };
        let token = self.client.token(&request).await.map_err(|e| failing(e.to_string()))?;
        let rotated = token.refresh_token.as_ref().filter(|new| Some(new.as_str()) != secrets.refresh_token.as_deref());
        let Some(rotated) = rotated else { return Ok((token, None)) };
        secrets.refresh_token = Some(rotated.to_string());
        let sealed =
            keys.seal(&record.tenant_id, &secrets.to_json(), &owner).await.map_err(|e| failing(e.0.message))?;
        Ok((token, Some(sealed)))
    }
}

pub fn client_auth(auth: OAuth2ClientAuth) -> ClientAuth {
    match auth {
        OAuth2ClientAuth::Basic => ClientAuth::Basic,
        OAuth2ClientAuth::Post => ClientAuth::Post,
    }
}

/// The stored settings of an `oauth2` credential.
pub fn settings_of(record: &CredentialRecord) -> AppResult<OAuthSettings> {
    let info = record.credential.oauth2.as_ref().ok_or_else(|| {
        AppError::bad_request(format!("credential {:?} is not an oauth2 credential", record.credential.name))
    })?;
    Ok(OAuthSettings {
        token_url: info.token_url.clone(),
        client_id: info.client_id.clone(),
        scopes: info.scopes.clone(),
        grant_type: info.grant_type,
        authorize_url: info.authorize_url.clone(),
        redirect_uri: info.redirect_uri.clone(),
        client_auth: info.client_auth,
    })
}

/// The stored access token if it opens and has `left` seconds left.
async fn usable(
    keys: &Keyring,
    record: &CredentialRecord,
    tokens: &space_store::OAuthTokenState,
    left: i64,
) -> Option<Zeroizing<String>> {
    let (Some(sealed), Some(expires_at)) = (&tokens.access_sealed, tokens.access_expires_at) else { return None };
    if expires_at < unix_now() + left {
        return None;
    }
    // One that no longer opens (a tenant key changed or revoked) is asked for again.
    let opened = keys.open(sealed, &access_owner(&record.tenant_id, &record.credential.id)).await.ok()?;
    String::from_utf8(opened.to_vec()).ok().map(Zeroizing::new)
}

/// Another replica is asking: its token once it is stored, or why there is none.
async fn wait_for_other(store: &Store, keys: &Keyring, record: &CredentialRecord) -> Result<Zeroizing<String>, String> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_OTHER;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let tokens = store.oauth_tokens(&record.credential.id).await.map_err(|e| e.to_string())?.unwrap_or_default();
        if let Some(token) = usable(keys, record, &tokens, MIN_LEFT_SECS).await {
            return Ok(token);
        }
        if tokens.retry_at.is_some_and(|at| at > space_store::now_ms()) {
            let fresh = store.credential_by_id(&record.credential.id).await.ok().flatten();
            return Err(reason_of(fresh.as_ref().unwrap_or(record)));
        }
    }
    Err("another control plane replica is asking for a token and has not finished".into())
}

/// Why the credential has no token, as last recorded.
fn reason_of(record: &CredentialRecord) -> String {
    let info = record.credential.oauth2.as_ref();
    info.and_then(|i| i.reason.clone()).unwrap_or_else(|| "the last token request failed".into())
}

/// One audit event per session holding the credential: its requests fail until a token comes.
async fn audit_failure(store: &Store, record: &CredentialRecord, reason: &str) {
    let Ok(sessions) = store.sessions_granted(&record.credential.id).await else { return };
    let host = record
        .credential
        .oauth2
        .as_ref()
        .and_then(|i| url::Url::parse(&i.token_url).ok())
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_default();
    let events: Vec<AuditEvent> = sessions
        .into_iter()
        .map(|session| {
            let mut event = AuditEvent::allowed(session, space_store::now_ms(), "audit", &host, 443);
            event.decision = AuditDecision::Denied;
            event.credential = Some(record.credential.name.clone());
            event.reason = Some(format!("token request for credential {} failed: {reason}", record.credential.name));
            event
        })
        .collect();
    if let Err(e) = store.insert_audit_events(&events).await {
        tracing::warn!(error = %e, "cannot record a failed token request in the audit log");
    }
}

/// Refreshes, every [`TICK`], the tokens of credentials held by sessions that expire within
/// [`REFRESH_MARGIN_SECS`] (or that have none, once a failure's wait is over), and pushes
/// the sessions holding them.
pub fn spawn_refresher(state: AppState) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK).await;
            let due = match state.store.oauth_due(unix_now() + REFRESH_MARGIN_SECS).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for OAuth tokens to refresh");
                    continue;
                }
            };
            for record in due {
                refresh_and_push(&state, &record).await;
            }
        }
    });
}

/// Asks for `record`'s token and pushes every session holding it, whatever the outcome (a
/// failure makes its hosts answer 502 with the reason).
pub async fn refresh_and_push(state: &AppState, record: &CredentialRecord) {
    let outcome = state.oauth.refresh(&state.store, &state.keys, record).await;
    if let Err(reason) = &outcome {
        tracing::warn!(credential = %record.credential.id, reason, "OAuth token request failed");
    }
    let sessions = match state.store.sessions_granted(&record.credential.id).await {
        Ok(sessions) => sessions,
        Err(e) => return tracing::warn!(error = %e, "cannot list the sessions holding a credential"),
    };
    if let Err(e) = crate::egress::push_credential_sessions(state, &sessions).await {
        tracing::warn!(credential = %record.credential.id, error = %e, "cannot push a refreshed token");
    }
}
