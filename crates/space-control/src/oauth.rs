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

use futures::StreamExt as _;
use space_api::egress::{AuditDecision, AuditEvent, OAuth2ClientAuth, OAuth2GrantType, OAuth2Status};
use space_api::{CredentialId, ErrorCode, TenantId};
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
/// The lease on asking for a credential's token: well beyond what a token request (15 s at
/// most) and sealing what it got can take.
const CLAIM_MS: i64 = 60_000;
/// A credential gets no new token sooner than this after the last (a provider that hands out
/// tokens with a lifetime below the refresh margin is not asked in a loop).
const MIN_INTERVAL_MS: i64 = 15_000;
/// Token requests the refresher makes at once, and per tenant in one round.
const REFRESH_CONCURRENCY: usize = 8;
const REFRESH_PER_TENANT: usize = 2;
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

/// Why there is no token: said on the credential and, in a 502, to the sandbox's requests.
type Reason = String;

impl Broker {
    pub fn new(net: &space_oauth::NetConfig) -> Result<Broker, OAuthError> {
        Ok(Broker { client: OAuthClient::new(net)? })
    }

    /// The credential's current access token; without a usable one, asked for now if `ask`
    /// (and no failure's wait runs), else the reason there is none.
    pub async fn access_token(
        &self,
        store: &Store,
        keys: &Keyring,
        record: &CredentialRecord,
        ask: bool,
    ) -> Result<Zeroizing<String>, Reason> {
        let tokens = store.oauth_tokens(&record.credential.id).await.map_err(unavailable)?.unwrap_or_default();
        if let Some(token) = usable(keys, record, &tokens, MIN_LEFT_SECS).await {
            return Ok(token);
        }
        if !ask || tokens.retry_at.is_some_and(|at| at > space_store::now_ms()) {
            return Err(reason_of(record));
        }
        self.refresh(store, keys, &record.credential.id).await
    }

    /// Asks the token endpoint for a new token under the lease, and records the outcome. If
    /// another replica holds the lease, waits for its token instead; if one got a token while
    /// this one waited for the lease, that token is it.
    pub async fn refresh(&self, store: &Store, keys: &Keyring, id: &CredentialId) -> Result<Zeroizing<String>, Reason> {
        if !store.claim_oauth_refresh(id, space_store::now_ms() + CLAIM_MS).await.map_err(unavailable)? {
            return wait_for_other(store, keys, id).await;
        }
        let outcome = self.refresh_claimed(store, keys, id).await;
        if outcome.is_err() {
            // Whatever was recorded, the lease is not kept past the attempt.
            let _ = store.release_oauth_claim(id).await;
        }
        outcome
    }

    async fn refresh_claimed(
        &self,
        store: &Store,
        keys: &Keyring,
        id: &CredentialId,
    ) -> Result<Zeroizing<String>, Reason> {
        // Read under the lease: what was read before may hold a refresh token spent since.
        let record = store.credential_by_id(id).await.map_err(unavailable)?.ok_or("the credential was deleted")?;
        let tokens = store.oauth_tokens(id).await.map_err(unavailable)?.unwrap_or_default();
        if let Some(token) = usable(keys, &record, &tokens, REFRESH_MARGIN_SECS).await {
            store.release_oauth_claim(id).await.map_err(unavailable)?;
            return Ok(token);
        }
        match self.ask(keys, &record).await {
            Ok(token) => {
                if let Some(rotated) = &token.refresh_token {
                    // Kept first: the endpoint has spent the old one.
                    let rotated = rotated.to_string();
                    change_secrets(store, keys, id, |s| s.refresh_token = Some(rotated.clone()))
                        .await
                        .map_err(|e| e.0.message)?;
                }
                let tenant = &record.tenant_id;
                let sealed = keys.seal(tenant, token.access_token.as_bytes(), &access_owner(tenant, id)).await;
                let sealed = sealed.map_err(|e| e.0.message)?;
                store.oauth_refreshed(id, &sealed, expiry(&token)).await.map_err(unavailable)?;
                Ok(token.access_token)
            }
            Err((status, reason)) => {
                let wait = (FIRST_BACKOFF_MS << tokens.failures.min(10)).min(MAX_BACKOFF_MS);
                if let Err(e) = store.oauth_failed(id, status, &reason, space_store::now_ms() + wait).await {
                    tracing::warn!(credential = %id, error = %e, "cannot record a failed token request");
                }
                audit_failure(store, &record, &reason).await;
                Err(reason)
            }
        }
    }

    /// A token request to the credential's endpoint with `grant`.
    pub async fn token(
        &self,
        settings: &OAuthSettings,
        secrets: &Secrets,
        grant: Grant<'_>,
    ) -> Result<space_oauth::Token, OAuthError> {
        let token_url = self.client.check_url("token_url", &settings.token_url)?;
        let request = TokenRequest {
            token_url: &token_url,
            client_id: &settings.client_id,
            client_secret: secrets.client_secret.as_deref(),
            auth: client_auth(settings.client_auth),
            scopes: &settings.scopes,
            grant,
        };
        self.client.token(&request).await
    }

    /// One token request.
    async fn ask(
        &self,
        keys: &Keyring,
        record: &CredentialRecord,
    ) -> Result<space_oauth::Token, (OAuth2Status, Reason)> {
        let failing = |reason: String| (OAuth2Status::Failing, reason);
        let settings = settings_of(record).map_err(|e| failing(e.0.message))?;
        let secrets = open_secrets(keys, record).await.map_err(|e| failing(e.0.message))?;
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
        self.token(&settings, &secrets, grant).await.map_err(|e| failing(e.to_string()))
    }
}

/// A store error as the reason for no token, without its detail (which the sandbox's 502
/// would show): the detail is logged.
fn unavailable(e: space_store::StoreError) -> Reason {
    tracing::warn!(error = %e, "the store failed while getting an OAuth token");
    "the server's database did not answer; retry".into()
}

/// The credential's secrets, unsealed.
pub async fn open_secrets(keys: &Keyring, record: &CredentialRecord) -> AppResult<Secrets> {
    let owner = credential_owner(&record.tenant_id, &record.credential.id);
    let opened = keys.open(&record.value_sealed, &owner).await?;
    serde_json::from_slice(&opened).map_err(|_| AppError::internal("the credential's stored secrets are not readable"))
}

/// Applies `change` to the credential's secrets and stores them sealed again, unless they
/// changed meanwhile (a rotation, a user's update, a re-wrap), in which case it starts over
/// from the new ones: no change is lost.
pub async fn change_secrets(
    store: &Store,
    keys: &Keyring,
    id: &CredentialId,
    change: impl Fn(&mut Secrets),
) -> AppResult<()> {
    for _ in 0..5 {
        let record =
            store.credential_by_id(id).await?.ok_or_else(|| AppError::internal("the credential was deleted"))?;
        let mut secrets = open_secrets(keys, &record).await?;
        change(&mut secrets);
        let owner = credential_owner(&record.tenant_id, id);
        let sealed = keys.seal(&record.tenant_id, &secrets.to_json(), &owner).await?;
        if store.replace_credential_value(id, &record.value_sealed, &sealed).await? {
            return Ok(());
        }
    }
    Err(AppError::new(ErrorCode::Conflict, "the credential's secrets kept changing while this changed them; retry"))
}

fn client_auth(auth: OAuth2ClientAuth) -> ClientAuth {
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

/// Another replica (or task) is asking: its token once it is stored, or why there is none.
async fn wait_for_other(store: &Store, keys: &Keyring, id: &CredentialId) -> Result<Zeroizing<String>, Reason> {
    let deleted = || Reason::from("the credential was deleted");
    let record = store.credential_by_id(id).await.map_err(unavailable)?.ok_or_else(deleted)?;
    let deadline = tokio::time::Instant::now() + WAIT_FOR_OTHER;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let tokens = store.oauth_tokens(id).await.map_err(unavailable)?.unwrap_or_default();
        if let Some(token) = usable(keys, &record, &tokens, MIN_LEFT_SECS).await {
            return Ok(token);
        }
        if tokens.retry_at.is_some_and(|at| at > space_store::now_ms()) {
            // The reason the other one recorded.
            let failed = store.credential_by_id(id).await.map_err(unavailable)?.ok_or_else(deleted)?;
            return Err(reason_of(&failed));
        }
    }
    Err("another control plane replica is asking for a token and has not finished".into())
}

/// Why the credential has no token, as last recorded.
fn reason_of(record: &CredentialRecord) -> Reason {
    let info = record.credential.oauth2.as_ref();
    match info.map(|i| (i.status, i.reason.clone())) {
        Some((_, Some(reason))) => reason,
        Some((OAuth2Status::Pending | OAuth2Status::Ok, None)) => {
            "no token yet: the server is asking the token endpoint".into()
        }
        _ => "the last token request failed".into(),
    }
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
/// the sessions holding them. Several at once, and at most [`REFRESH_PER_TENANT`] of one
/// tenant's per round, so that one tenant's slow endpoint does not hold up the others.
pub fn spawn_refresher(state: AppState) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK).await;
            let due = match state.store.oauth_due(unix_now() + REFRESH_MARGIN_SECS, MIN_INTERVAL_MS).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for OAuth tokens to refresh");
                    continue;
                }
            };
            let mut per_tenant: std::collections::HashMap<TenantId, usize> = Default::default();
            let round: Vec<CredentialId> = due
                .into_iter()
                .filter(|(_, tenant)| {
                    let n = per_tenant.entry(tenant.clone()).or_default();
                    *n += 1;
                    *n <= REFRESH_PER_TENANT
                })
                .map(|(id, _)| id)
                .collect();
            futures::stream::iter(round)
                .for_each_concurrent(REFRESH_CONCURRENCY, |id| {
                    let state = state.clone();
                    async move { refresh_and_push(&state, &id).await }
                })
                .await;
        }
    });
}

/// Asks for the credential's token and pushes every session holding it, whatever the outcome
/// (a failure makes its hosts answer 502 with the reason).
pub async fn refresh_and_push(state: &AppState, id: &CredentialId) {
    if let Err(reason) = state.oauth.refresh(&state.store, &state.keys, id).await {
        tracing::warn!(credential = %id, reason, "OAuth token request failed");
    }
    let sessions = match state.store.sessions_granted(id).await {
        Ok(sessions) => sessions,
        Err(e) => return tracing::warn!(error = %e, "cannot list the sessions holding a credential"),
    };
    for session in &sessions {
        if let Err(e) = crate::egress::push_session_cached(state, session).await {
            tracing::warn!(credential = %id, %session, error = %e, "cannot push a refreshed token");
        }
    }
}
