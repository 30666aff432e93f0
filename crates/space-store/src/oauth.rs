//! The state of `oauth2` credentials' tokens, and sign-ins waiting for their redirect.
//!
//! A credential's client secret and refresh token are its sealed value (in `credentials`);
//! here are its settings, its sealed current access token (a cache shared by replicas), the
//! outcome of the last attempt, and the lease of the replica refreshing it.

use space_api::egress::{OAuth2ClientAuth, OAuth2GrantType, OAuth2Info, OAuth2Status};
use space_api::{CredentialId, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Result, Store, StoreError, now_ms, parse};

/// An `oauth2` credential's settings: no secret among them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OAuthSettings {
    pub token_url: String,
    pub client_id: String,
    pub scopes: Vec<String>,
    pub grant_type: OAuth2GrantType,
    pub authorize_url: Option<String>,
    pub redirect_uri: Option<String>,
    pub client_auth: OAuth2ClientAuth,
}

/// Where an `oauth2` credential's tokens stand.
#[derive(Clone, Default)]
pub struct OAuthTokenState {
    /// The current access token, sealed for the tenant.
    pub access_sealed: Option<Vec<u8>>,
    /// Unix seconds.
    pub access_expires_at: Option<i64>,
    /// Failed attempts since the last success.
    pub failures: u32,
    /// Unix milliseconds before which no new attempt is made after a failure.
    pub retry_at: Option<i64>,
}

impl std::fmt::Debug for OAuthTokenState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthTokenState")
            .field("access_expires_at", &self.access_expires_at)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

/// A sign-in waiting for its redirect.
pub struct OAuthLogin {
    pub credential_id: CredentialId,
    /// The PKCE verifier, sealed for the credential's tenant.
    pub verifier_sealed: Vec<u8>,
    pub redirect_uri: String,
}

fn status_str(status: OAuth2Status) -> &'static str {
    match status {
        OAuth2Status::Pending => "pending",
        OAuth2Status::NeedsLogin => "needs_login",
        OAuth2Status::Ok => "ok",
        OAuth2Status::Failing => "failing",
    }
}

fn status_of(text: &str) -> Result<OAuth2Status> {
    Ok(match text {
        "pending" => OAuth2Status::Pending,
        "needs_login" => OAuth2Status::NeedsLogin,
        "ok" => OAuth2Status::Ok,
        "failing" => OAuth2Status::Failing,
        other => return Err(StoreError::Corrupt(format!("oauth status {other:?}"))),
    })
}

/// The OAuth info in `row` from column `at` on (settings, status, reason, refreshed_at,
/// access_expires_at); `None` for a static credential.
pub(crate) fn oauth_info_from_row(row: &AnyRow, at: usize) -> Result<Option<OAuth2Info>> {
    let Some(settings) = row.get::<Option<&str>, _>(at) else {
        return Ok(None);
    };
    let s: OAuthSettings =
        serde_json::from_str(settings).map_err(|e| StoreError::Corrupt(format!("oauth settings: {e}")))?;
    Ok(Some(OAuth2Info {
        token_url: s.token_url,
        client_id: s.client_id,
        scopes: s.scopes,
        grant_type: s.grant_type,
        authorize_url: s.authorize_url,
        redirect_uri: s.redirect_uri,
        client_auth: s.client_auth,
        status: status_of(row.get(at + 1))?,
        reason: row.get(at + 2),
        refreshed_at: row.get(at + 3),
        token_expires_at: row.get(at + 4),
    }))
}

pub(crate) async fn insert_oauth(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &CredentialId,
    settings: &OAuthSettings,
    status: OAuth2Status,
) -> Result<()> {
    let settings = serde_json::to_string(settings).map_err(|e| StoreError::Corrupt(format!("oauth settings: {e}")))?;
    sqlx::query("INSERT INTO credential_oauth (credential_id, settings, status) VALUES ($1, $2, $3)")
        .bind(id.as_str())
        .bind(settings)
        .bind(status_str(status))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn delete_oauth(tx: &mut sqlx::Transaction<'_, sqlx::Any>, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM credential_oauth WHERE credential_id = $1").bind(id).execute(&mut **tx).await?;
    sqlx::query("DELETE FROM oauth_logins WHERE credential_id = $1").bind(id).execute(&mut **tx).await?;
    Ok(())
}

impl Store {
    /// Where `credential`'s tokens stand; `None` for a static (or unknown) credential.
    pub async fn oauth_tokens(&self, credential: &CredentialId) -> Result<Option<OAuthTokenState>> {
        let row = sqlx::query(
            "SELECT access_sealed, access_expires_at, failures, retry_at FROM credential_oauth WHERE credential_id = $1",
        )
        .bind(credential.as_str())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| OAuthTokenState {
            access_sealed: r.get(0),
            access_expires_at: r.get(1),
            failures: r.get::<i64, _>(2).clamp(0, i64::from(u32::MAX)) as u32,
            retry_at: r.get(3),
        }))
    }

    /// Takes the lease on refreshing `credential` until `until` (Unix ms) if nobody holds
    /// it; whether it was taken.
    pub async fn claim_oauth_refresh(&self, credential: &CredentialId, until: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE credential_oauth SET claim_until = $1 WHERE credential_id = $2 \
             AND (claim_until IS NULL OR claim_until < $3)",
        )
        .bind(until)
        .bind(credential.as_str())
        .bind(now_ms())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Releases the lease on refreshing `credential` (after an attempt that recorded nothing).
    pub async fn release_oauth_claim(&self, credential: &CredentialId) -> Result<()> {
        sqlx::query("UPDATE credential_oauth SET claim_until = NULL WHERE credential_id = $1")
            .bind(credential.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Records a new access token (and releases the lease).
    pub async fn oauth_refreshed(
        &self,
        credential: &CredentialId,
        access_sealed: &[u8],
        expires_at: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE credential_oauth SET access_sealed = $1, access_expires_at = $2, status = 'ok', reason = NULL, \
             refreshed_at = $3, failures = 0, retry_at = NULL, claim_until = NULL WHERE credential_id = $4",
        )
        .bind(access_sealed)
        .bind(expires_at)
        .bind(now_ms())
        .bind(credential.as_str())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Replaces a credential's sealed value if it is still `old`; whether it was replaced.
    pub async fn replace_credential_value(&self, credential: &CredentialId, old: &[u8], new: &[u8]) -> Result<bool> {
        let done = sqlx::query("UPDATE credentials SET value_sealed = $1 WHERE id = $2 AND value_sealed = $3")
            .bind(new)
            .bind(credential.as_str())
            .bind(old)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a failed attempt (and releases the lease): `status` (failing or needs_login)
    /// with `reason`, and no new attempt before `retry_at` (Unix ms).
    pub async fn oauth_failed(
        &self,
        credential: &CredentialId,
        status: OAuth2Status,
        reason: &str,
        retry_at: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE credential_oauth SET status = $1, reason = $2, failures = failures + 1, retry_at = $3, \
             claim_until = NULL WHERE credential_id = $4",
        )
        .bind(status_str(status))
        .bind(reason)
        .bind(retry_at)
        .bind(credential.as_str())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Forgets the access token and the failures after the user changed the secrets: the
    /// next use asks again at once.
    pub async fn oauth_reset(&self, credential: &CredentialId, status: OAuth2Status) -> Result<()> {
        sqlx::query(
            "UPDATE credential_oauth SET status = $1, reason = NULL, access_sealed = NULL, access_expires_at = NULL, \
             failures = 0, retry_at = NULL WHERE credential_id = $2",
        )
        .bind(status_str(status))
        .bind(credential.as_str())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// `oauth2` credentials (with their tenant) granted to a session that is not destroyed
    /// whose access token expires before `before` (Unix s) or that has none, that may be tried
    /// now (no failure's wait running) and that got no token in the last `min_interval_ms`.
    pub async fn oauth_due(&self, before: i64, min_interval_ms: i64) -> Result<Vec<(CredentialId, TenantId)>> {
        let now = now_ms();
        let rows = sqlx::query(
            "SELECT o.credential_id, c.tenant_id FROM credential_oauth o JOIN credentials c ON c.id = o.credential_id \
             WHERE o.status <> 'needs_login' \
             AND (o.access_expires_at IS NULL OR o.access_expires_at < $1) \
             AND (o.retry_at IS NULL OR o.retry_at <= $2) \
             AND (o.refreshed_at IS NULL OR o.refreshed_at <= $3) \
             AND EXISTS (SELECT 1 FROM grants g JOIN sessions s ON s.id = g.session_id \
                         WHERE g.credential_id = o.credential_id AND s.state <> 'destroyed') \
             ORDER BY o.credential_id",
        )
        .bind(before)
        .bind(now)
        .bind(now - min_interval_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((parse("credential id", r.get::<&str, _>(0))?, parse("tenant id", r.get::<&str, _>(1))?)))
            .collect()
    }

    /// Records a sign-in waiting for the redirect that carries `state` (the caller's digest of
    /// it), replacing any other of the credential's, and deletes those that expired.
    pub async fn insert_oauth_login(&self, state: &str, login: &OAuthLogin, expires_at: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM oauth_logins WHERE expires_at < $1 OR credential_id = $2")
            .bind(now_ms())
            .bind(login.credential_id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO oauth_logins (state, credential_id, verifier_sealed, redirect_uri, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(state)
        .bind(login.credential_id.as_str())
        .bind(&login.verifier_sealed)
        .bind(&login.redirect_uri)
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The sign-in `state` names, deleted (a state is used once); `None` if there is none
    /// or it expired. Looked up on the readers first: a flood of made-up states never writes.
    pub async fn take_oauth_login(&self, state: &str) -> Result<Option<OAuthLogin>> {
        let known: Option<i64> = sqlx::query_scalar("SELECT 1 FROM oauth_logins WHERE state = $1")
            .bind(state)
            .fetch_optional(&self.pool)
            .await?;
        if known.is_none() {
            return Ok(None);
        }
        let row = sqlx::query(
            "DELETE FROM oauth_logins WHERE state = $1 RETURNING credential_id, verifier_sealed, redirect_uri, expires_at",
        )
        .bind(state)
        .fetch_optional(&self.writer)
        .await?;
        let Some(row) = row else { return Ok(None) };
        if row.get::<i64, _>(3) < now_ms() {
            return Ok(None);
        }
        Ok(Some(OAuthLogin {
            credential_id: parse("credential id", row.get::<&str, _>(0))?,
            verifier_sealed: row.get(1),
            redirect_uri: row.get(2),
        }))
    }
}

#[cfg(test)]
mod tests {
    use space_api::egress::OAuth2Status;

    use super::*;
    use crate::credentials::tests::{new_credential, new_session};
    use crate::test_store;

    fn settings() -> OAuthSettings {
        OAuthSettings {
            token_url: "https://auth.example.com/token".into(),
            client_id: "c".into(),
            scopes: vec!["repo".into()],
            grant_type: OAuth2GrantType::RefreshToken,
            authorize_url: None,
            redirect_uri: None,
            client_auth: OAuth2ClientAuth::Basic,
        }
    }

    #[tokio::test]
    async fn tokens_are_refreshed_by_one_holder_of_the_lease_and_listed_with_their_state() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        let mut new = new_credential(&a, "gh");
        new.oauth = Some((settings(), OAuth2Status::Pending));
        let c = store.insert_credential(&new).await.unwrap().unwrap();
        let info = c.oauth2.clone().unwrap();
        assert_eq!((info.status, info.scopes), (OAuth2Status::Pending, vec!["repo".to_string()]));
        assert_eq!(store.list_credentials(&a).await.unwrap()[0].kind, space_api::egress::CredentialKind::Oauth2);

        // Due only while a live session holds it.
        assert!(store.oauth_due(i64::MAX, 0).await.unwrap().is_empty(), "nobody holds it");
        let session = new_session(&store, &a, vec![c.id.clone()]).await;
        assert_eq!(store.session_grants(&session).await.unwrap()[0].credential.oauth2.as_ref().unwrap().client_id, "c");
        assert_eq!(store.oauth_due(0, 0).await.unwrap(), vec![(c.id.clone(), a.clone())], "no token yet");

        // One lease at a time; a lapsed one may be taken over.
        let until = now_ms() + 60_000;
        assert!(store.claim_oauth_refresh(&c.id, until).await.unwrap());
        assert!(!store.claim_oauth_refresh(&c.id, until).await.unwrap(), "held");
        store.release_oauth_claim(&c.id).await.unwrap();
        assert!(store.claim_oauth_refresh(&c.id, until).await.unwrap(), "released");
        // A rotated refresh token replaces the value only if it is still the one read.
        assert!(!store.replace_credential_value(&c.id, &[9], &[7]).await.unwrap());
        let kept = store.credential_by_id(&c.id).await.unwrap().unwrap().value_sealed;
        assert_eq!(kept, vec![1, 2, 3], "changed meanwhile");
        assert!(store.replace_credential_value(&c.id, &[1, 2, 3], &[4]).await.unwrap());
        store.oauth_refreshed(&c.id, b"sealed-access", 5_000).await.unwrap();
        let record = store.credential_by_id(&c.id).await.unwrap().unwrap();
        assert_eq!(record.value_sealed, vec![4]);
        let info = record.credential.oauth2.unwrap();
        assert_eq!((info.status, info.token_expires_at), (OAuth2Status::Ok, Some(5_000)));
        assert!(store.claim_oauth_refresh(&c.id, until).await.unwrap(), "a refresh releases the lease");
        let tokens = store.oauth_tokens(&c.id).await.unwrap().unwrap();
        assert_eq!(tokens.access_sealed.as_deref(), Some(&b"sealed-access"[..]));
        assert!(store.oauth_due(4_000, 0).await.unwrap().is_empty(), "valid past the horizon");
        assert_eq!(store.oauth_due(6_000, 0).await.unwrap().len(), 1, "expires before it");
        assert!(store.oauth_due(6_000, 60_000).await.unwrap().is_empty(), "refreshed a moment ago");

        // A failure waits until retry_at, and counts.
        store.oauth_failed(&c.id, OAuth2Status::Failing, "invalid_grant", now_ms() + 60_000).await.unwrap();
        assert!(store.oauth_due(6_000, 0).await.unwrap().is_empty(), "waiting after a failure");
        let info = store.credential_by_id(&c.id).await.unwrap().unwrap().credential.oauth2.unwrap();
        assert_eq!((info.status, info.reason.as_deref()), (OAuth2Status::Failing, Some("invalid_grant")));
        assert_eq!(store.oauth_tokens(&c.id).await.unwrap().unwrap().failures, 1);
        store.oauth_reset(&c.id, OAuth2Status::Pending).await.unwrap();
        let tokens = store.oauth_tokens(&c.id).await.unwrap().unwrap();
        assert!(tokens.access_sealed.is_none() && tokens.failures == 0 && tokens.retry_at.is_none());
        store.oauth_failed(&c.id, OAuth2Status::NeedsLogin, "sign in", 0).await.unwrap();
        assert!(store.oauth_due(i64::MAX, 0).await.unwrap().is_empty(), "a sign-in is needed first");

        // Deleting the credential deletes its OAuth state and sign-ins.
        let login = OAuthLogin { credential_id: c.id.clone(), verifier_sealed: vec![1], redirect_uri: "u".into() };
        store.insert_oauth_login("s1", &login, now_ms() + 60_000).await.unwrap();
        store.delete_credential(&a, "gh").await.unwrap().unwrap();
        assert!(store.oauth_tokens(&c.id).await.unwrap().is_none());
        assert!(store.take_oauth_login("s1").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_sign_in_is_taken_once_and_not_after_it_expired() {
        let (store, _dir) = test_store().await;
        let id = CredentialId::generate();
        let login =
            OAuthLogin { credential_id: id.clone(), verifier_sealed: vec![5], redirect_uri: "https://x".into() };
        store.insert_oauth_login("replaced", &login, now_ms() + 60_000).await.unwrap();
        store.insert_oauth_login("stale", &login, now_ms() - 1).await.unwrap();
        assert!(store.take_oauth_login("replaced").await.unwrap().is_none(), "one sign-in per credential");
        let other = OAuthLogin { credential_id: CredentialId::generate(), ..login };
        store.insert_oauth_login("stale", &other, now_ms() - 1).await.unwrap();
        let login =
            OAuthLogin { credential_id: id.clone(), verifier_sealed: vec![5], redirect_uri: "https://x".into() };
        store.insert_oauth_login("fresh", &login, now_ms() + 60_000).await.unwrap();
        let taken = store.take_oauth_login("fresh").await.unwrap().unwrap();
        assert_eq!(
            (taken.credential_id, taken.verifier_sealed, taken.redirect_uri.as_str()),
            (id, vec![5], "https://x")
        );
        assert!(store.take_oauth_login("fresh").await.unwrap().is_none(), "used once");
        assert!(store.take_oauth_login("stale").await.unwrap().is_none(), "expired");
        assert!(store.take_oauth_login("never").await.unwrap().is_none());
    }
}
