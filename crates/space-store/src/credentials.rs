//! Credentials (values sealed by the caller; never stored in clear) and their grants to
//! sessions.

use std::collections::BTreeMap;

use space_api::egress::{Credential, CredentialKind, OAuth2Status};
use space_api::{CredentialId, SessionId, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::oauth::{OAuthSettings, delete_oauth, insert_oauth, oauth_info_from_row};
use crate::{Result, Store, StoreError, now_ms, parse};

/// What [`Store::insert_credential`] records.
#[derive(Clone)]
pub struct NewCredential {
    pub id: CredentialId,
    pub tenant_id: TenantId,
    pub name: String,
    pub hosts: Vec<String>,
    pub header: String,
    /// The value, sealed (space-keys) for this tenant and id.
    pub value_sealed: Vec<u8>,
    pub expires_at: Option<i64>,
    pub rate_limit_per_min: Option<u32>,
    pub placeholder_env: Option<String>,
    /// An `oauth2` credential's settings and first status (its value holds its secrets).
    pub oauth: Option<(OAuthSettings, OAuth2Status)>,
}

impl std::fmt::Debug for NewCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewCredential").field("id", &self.id).field("name", &self.name).finish_non_exhaustive()
    }
}

/// A credential as stored: its listing and its sealed value.
#[derive(Clone)]
pub struct CredentialRecord {
    pub tenant_id: TenantId,
    pub credential: Credential,
    pub value_sealed: Vec<u8>,
}

impl std::fmt::Debug for CredentialRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialRecord").field("credential", &self.credential).finish_non_exhaustive()
    }
}

/// A change to a credential; `None` leaves a field as it is.
#[derive(Clone, Default)]
pub struct CredentialChange {
    pub hosts: Option<Vec<String>>,
    pub header: Option<String>,
    /// A new sealed value: bumps the version.
    pub value_sealed: Option<Vec<u8>>,
    /// `Some(None)` removes the expiry.
    pub expires_at: Option<Option<i64>>,
    /// `Some(None)` removes the limit.
    pub rate_limit_per_min: Option<Option<u32>>,
}

impl std::fmt::Debug for CredentialChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialChange")
            .field("hosts", &self.hosts)
            .field("header", &self.header)
            .field("new_value", &self.value_sealed.is_some())
            .finish_non_exhaustive()
    }
}

/// A credential's columns and its OAuth state's, from `credentials c` and `credential_oauth o`.
const CREDENTIAL_COLUMNS: &str = "c.id, c.tenant_id, c.name, c.hosts, c.header, c.value_sealed, c.expires_at, c.rate_limit_per_min, c.placeholder_env, c.version, c.created_at, c.updated_at, o.settings, o.status, o.reason, o.refreshed_at, o.access_expires_at";
/// Where [`CREDENTIAL_COLUMNS`] come from.
const CREDENTIAL_FROM: &str = "credentials c LEFT JOIN credential_oauth o ON o.credential_id = c.id";

fn credential_from_row(row: &AnyRow) -> Result<CredentialRecord> {
    let hosts: &str = row.get(3);
    let oauth2 = oauth_info_from_row(row, 12)?;
    let credential = Credential {
        id: parse("credential id", row.get::<&str, _>(0))?,
        name: row.get(2),
        hosts: serde_json::from_str(hosts).map_err(|e| StoreError::Corrupt(format!("credential hosts: {e}")))?,
        header: row.get(4),
        expires_at: row.get(6),
        rate_limit_per_min: row.get::<Option<i64>, _>(7).map(|v| v as u32),
        placeholder_env: row.get(8),
        kind: if oauth2.is_some() { CredentialKind::Oauth2 } else { CredentialKind::Static },
        oauth2,
        version: row.get::<i64, _>(9) as u32,
        created_at: row.get(10),
        updated_at: row.get(11),
    };
    Ok(CredentialRecord { tenant_id: parse("tenant id", row.get::<&str, _>(1))?, credential, value_sealed: row.get(5) })
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|d| d.is_unique_violation())
}

/// How granting or revoking changes the session's environment.
#[derive(Debug, Clone)]
pub struct PlaceholderEnv {
    pub name: String,
    pub placeholder: String,
}

impl Store {
    /// Records a credential; `None` if the tenant already has one with that name.
    pub async fn insert_credential(&self, new: &NewCredential) -> Result<Option<Credential>> {
        let now = now_ms();
        let mut tx = self.write_tx().await?;
        let inserted = sqlx::query(
            "INSERT INTO credentials (id, tenant_id, name, hosts, header, value_sealed, expires_at, rate_limit_per_min, placeholder_env, version, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10)",
        )
        .bind(new.id.as_str())
        .bind(new.tenant_id.as_str())
        .bind(&new.name)
        .bind(serde_json::to_string(&new.hosts).unwrap_or_default())
        .bind(&new.header)
        .bind(&new.value_sealed)
        .bind(new.expires_at)
        .bind(new.rate_limit_per_min.map(i64::from))
        .bind(&new.placeholder_env)
        .bind(now)
        .execute(&mut *tx)
        .await;
        match inserted {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        if let Some((settings, status)) = &new.oauth {
            insert_oauth(&mut tx, &new.id, settings, *status).await?;
        }
        tx.commit().await?;
        Ok(self.credential(&new.tenant_id, &new.name).await?.map(|r| r.credential))
    }

    /// The tenant's credential `name`.
    pub async fn credential(&self, tenant: &TenantId, name: &str) -> Result<Option<CredentialRecord>> {
        let sql = format!("SELECT {CREDENTIAL_COLUMNS} FROM {CREDENTIAL_FROM} WHERE c.tenant_id = $1 AND c.name = $2");
        let row = sqlx::query(&sql).bind(tenant.as_str()).bind(name).fetch_optional(&self.pool).await?;
        row.map(|r| credential_from_row(&r)).transpose()
    }

    /// A credential by id, whoever's it is.
    pub async fn credential_by_id(&self, id: &CredentialId) -> Result<Option<CredentialRecord>> {
        let sql = format!("SELECT {CREDENTIAL_COLUMNS} FROM {CREDENTIAL_FROM} WHERE c.id = $1");
        let row = sqlx::query(&sql).bind(id.as_str()).fetch_optional(&self.pool).await?;
        row.map(|r| credential_from_row(&r)).transpose()
    }

    /// The tenant's credentials by name.
    pub async fn list_credentials(&self, tenant: &TenantId) -> Result<Vec<Credential>> {
        let sql = format!("SELECT {CREDENTIAL_COLUMNS} FROM {CREDENTIAL_FROM} WHERE c.tenant_id = $1 ORDER BY c.name");
        let rows = sqlx::query(&sql).bind(tenant.as_str()).fetch_all(&self.pool).await?;
        rows.iter().map(|r| credential_from_row(r).map(|c| c.credential)).collect()
    }

    /// Applies `change` to the tenant's credential `name` in one transaction; `None` if there
    /// is no such credential.
    pub async fn update_credential(
        &self,
        tenant: &TenantId,
        name: &str,
        change: &CredentialChange,
    ) -> Result<Option<CredentialRecord>> {
        let mut tx = self.write_tx().await?;
        let sql = format!("SELECT {CREDENTIAL_COLUMNS} FROM {CREDENTIAL_FROM} WHERE c.tenant_id = $1 AND c.name = $2");
        let row = sqlx::query(&sql).bind(tenant.as_str()).bind(name).fetch_optional(&mut *tx).await?;
        let Some(mut record) = row.map(|r| credential_from_row(&r)).transpose()? else {
            return Ok(None);
        };
        let c = &mut record.credential;
        if let Some(hosts) = &change.hosts {
            c.hosts = hosts.clone();
        }
        if let Some(header) = &change.header {
            c.header = header.clone();
        }
        if let Some(sealed) = &change.value_sealed {
            record.value_sealed = sealed.clone();
            c.version += 1;
        }
        if let Some(expires_at) = change.expires_at {
            c.expires_at = expires_at;
        }
        if let Some(limit) = change.rate_limit_per_min {
            c.rate_limit_per_min = limit;
        }
        c.updated_at = now_ms();
        // The value is written only when it changes: one changed meanwhile by a compare-and-swap
        // (an OAuth rotation, a re-wrap) is not put back.
        sqlx::query(
            "UPDATE credentials SET hosts = $1, header = $2, value_sealed = COALESCE($3, value_sealed), expires_at = $4, rate_limit_per_min = $5, version = $6, updated_at = $7 WHERE id = $8",
        )
        .bind(serde_json::to_string(&c.hosts).unwrap_or_default())
        .bind(&c.header)
        .bind(change.value_sealed.as_deref())
        .bind(c.expires_at)
        .bind(c.rate_limit_per_min.map(i64::from))
        .bind(i64::from(c.version))
        .bind(c.updated_at)
        .bind(c.id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    /// Deletes the tenant's credential `name` and its grants, removing its placeholder from
    /// the environment of the sessions that held it. Returns the credential and those sessions.
    pub async fn delete_credential(
        &self,
        tenant: &TenantId,
        name: &str,
    ) -> Result<Option<(Credential, Vec<SessionId>)>> {
        let mut tx = self.write_tx().await?;
        let sql = format!("SELECT {CREDENTIAL_COLUMNS} FROM {CREDENTIAL_FROM} WHERE c.tenant_id = $1 AND c.name = $2");
        let row = sqlx::query(&sql).bind(tenant.as_str()).bind(name).fetch_optional(&mut *tx).await?;
        let Some(record) = row.map(|r| credential_from_row(&r)).transpose()? else {
            return Ok(None);
        };
        let id = record.credential.id.as_str();
        let sessions: Vec<String> = sqlx::query_scalar("SELECT session_id FROM grants WHERE credential_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        let sessions = sessions.iter().map(|s| parse("session id", s)).collect::<Result<Vec<SessionId>>>()?;
        if let Some(env) = placeholder_of(&record.credential) {
            for session in &sessions {
                edit_env(&mut tx, session, |vars| remove_placeholder(vars, &env)).await?;
            }
        }
        sqlx::query("DELETE FROM grants WHERE credential_id = $1").bind(id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM credentials WHERE id = $1").bind(id).execute(&mut *tx).await?;
        delete_oauth(&mut tx, id).await?;
        tx.commit().await?;
        Ok(Some((record.credential, sessions)))
    }

    /// Sessions holding a grant of `credential`.
    pub async fn sessions_granted(&self, credential: &CredentialId) -> Result<Vec<SessionId>> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT session_id FROM grants WHERE credential_id = $1")
            .bind(credential.as_str())
            .fetch_all(&self.pool)
            .await?;
        ids.iter().map(|s| parse("session id", s)).collect()
    }

    /// The credentials granted to `session`, by name.
    pub async fn session_grants(&self, session: &SessionId) -> Result<Vec<CredentialRecord>> {
        let sql = format!(
            "SELECT {CREDENTIAL_COLUMNS} FROM {CREDENTIAL_FROM} JOIN grants g ON g.credential_id = c.id \
             WHERE g.session_id = $1 ORDER BY c.name"
        );
        let rows = sqlx::query(&sql).bind(session.as_str()).fetch_all(&self.pool).await?;
        rows.iter().map(credential_from_row).collect()
    }

    /// Grants `credential` to `session` and, if it has a placeholder, sets that variable in
    /// the session's environment. Returns false if it was already granted. A grant made on the
    /// session is its own: one it held from its parent (a fork's) stops following the
    /// parent's revocations.
    pub async fn grant(&self, session: &SessionId, credential: &Credential) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let held: Option<i64> = sqlx::query_scalar("SELECT 1 FROM grants WHERE session_id = $1 AND credential_id = $2")
            .bind(session.as_str())
            .bind(credential.id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO grants (session_id, credential_id, created_at) VALUES ($1, $2, $3)
             ON CONFLICT (session_id, credential_id) DO UPDATE SET inherited_from = NULL",
        )
        .bind(session.as_str())
        .bind(credential.id.as_str())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        if let Some(env) = placeholder_of(credential) {
            edit_env(&mut tx, session, |vars| {
                vars.insert(env.name.clone(), env.placeholder.clone());
            })
            .await?;
        }
        tx.commit().await?;
        Ok(held.is_none())
    }

    /// Revokes `credential` from `session` and from every session that inherited that grant
    /// from it (its forks, theirs, and so on, unless detached or granted it themselves),
    /// removing the placeholder variable where it is still the placeholder. Returns those
    /// sessions, `session` first; empty if `session` does not hold the grant.
    pub async fn revoke(&self, session: &SessionId, credential: &Credential) -> Result<Vec<SessionId>> {
        let mut tx = self.write_tx().await?;
        let held: Option<i64> = sqlx::query_scalar("SELECT 1 FROM grants WHERE session_id = $1 AND credential_id = $2")
            .bind(session.as_str())
            .bind(credential.id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if held.is_none() {
            return Ok(Vec::new());
        }
        // UNION (not UNION ALL) visits each session once, so even a corrupt cycle ends.
        let heirs: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE heirs(id) AS (
                 SELECT $1
                 UNION
                 SELECT g.session_id FROM grants g JOIN heirs h ON g.inherited_from = h.id
                 WHERE g.credential_id = $2
             )
             SELECT id FROM heirs",
        )
        .bind(session.as_str())
        .bind(credential.id.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let mut sessions = vec![session.clone()];
        for heir in &heirs {
            let heir: SessionId = parse("session id", heir)?;
            if &heir != session {
                sessions.push(heir);
            }
        }
        let env = placeholder_of(credential);
        for revoked in &sessions {
            sqlx::query("DELETE FROM grants WHERE session_id = $1 AND credential_id = $2")
                .bind(revoked.as_str())
                .bind(credential.id.as_str())
                .execute(&mut *tx)
                .await?;
            if let Some(env) = &env {
                edit_env(&mut tx, revoked, |vars| remove_placeholder(vars, env)).await?;
            }
        }
        tx.commit().await?;
        Ok(sessions)
    }

    /// Makes every grant `session` inherited from its parent its own: revoking them on the
    /// parent no longer reaches it. Its own forks' grants still follow it. Returns how many
    /// grants were inherited.
    pub async fn detach_grants(&self, session: &SessionId) -> Result<u64> {
        let done =
            sqlx::query("UPDATE grants SET inherited_from = NULL WHERE session_id = $1 AND inherited_from IS NOT NULL")
                .bind(session.as_str())
                .execute(&self.writer)
                .await?;
        Ok(done.rows_affected())
    }

    /// Names of the credentials `session` holds from its parent (see [`Store::revoke`]).
    pub async fn inherited_grants(&self, session: &SessionId) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT c.name FROM grants g JOIN credentials c ON c.id = g.credential_id
             WHERE g.session_id = $1 AND g.inherited_from IS NOT NULL ORDER BY c.name",
        )
        .bind(session.as_str())
        .fetch_all(&self.pool)
        .await?)
    }
}

/// The placeholder variable a credential sets, if any.
fn placeholder_of(credential: &Credential) -> Option<PlaceholderEnv> {
    let name = credential.placeholder_env.clone()?;
    Some(PlaceholderEnv { name, placeholder: space_api::egress::placeholder_for(&credential.name) })
}

fn remove_placeholder(vars: &mut BTreeMap<String, String>, env: &PlaceholderEnv) {
    if vars.get(&env.name) == Some(&env.placeholder) {
        vars.remove(&env.name);
    }
}

/// Read-modify-write of a session's environment inside `tx`.
pub(crate) async fn edit_env(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    session: &SessionId,
    edit: impl FnOnce(&mut BTreeMap<String, String>),
) -> Result<()> {
    let env: Option<String> = sqlx::query_scalar("SELECT env FROM sessions WHERE id = $1")
        .bind(session.as_str())
        .fetch_optional(&mut **tx)
        .await?;
    let Some(env) = env else { return Ok(()) };
    let mut vars: BTreeMap<String, String> =
        serde_json::from_str(&env).map_err(|e| StoreError::Corrupt(format!("session env: {e}")))?;
    let before = vars.clone();
    edit(&mut vars);
    if vars != before {
        sqlx::query("UPDATE sessions SET env = $1, updated_at = $2 WHERE id = $3")
            .bind(serde_json::to_string(&vars).unwrap_or_default())
            .bind(now_ms())
            .bind(session.as_str())
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_store;
    use crate::{NewSession, NewSessionEgress, SessionEgressRecord};
    use space_api::egress::{AuditDecision, AuditEvent, NetworkPolicy, NetworkPolicyUpdate};
    use space_api::{Resources, SnapshotPolicy};

    pub(crate) fn new_credential(tenant: &TenantId, name: &str) -> NewCredential {
        NewCredential {
            id: CredentialId::generate(),
            tenant_id: tenant.clone(),
            name: name.into(),
            hosts: vec!["api.example.com".into()],
            header: "Authorization: Bearer {secret}".into(),
            value_sealed: vec![1, 2, 3],
            expires_at: None,
            rate_limit_per_min: Some(60),
            placeholder_env: Some("TOKEN".into()),
            oauth: None,
        }
    }

    pub(crate) async fn new_session(store: &Store, tenant: &TenantId, grants: Vec<CredentialId>) -> SessionId {
        insert_session(store, tenant, grants, None).await
    }

    /// A fork of `parent`, holding `parent`'s grants.
    async fn fork(store: &Store, tenant: &TenantId, parent: &SessionId) -> SessionId {
        let grants = store.session_grants(parent).await.unwrap().into_iter().map(|r| r.credential.id).collect();
        insert_session(store, tenant, grants, Some(parent.clone())).await
    }

    async fn insert_session(
        store: &Store,
        tenant: &TenantId,
        grants: Vec<CredentialId>,
        inherited_from: Option<SessionId>,
    ) -> SessionId {
        let id = SessionId::generate();
        let new = NewSession {
            id: id.clone(),
            tenant_id: tenant.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: Resources::default(),
            env: [("KEEP".to_string(), "1".to_string())].into(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        };
        let policy = NetworkPolicy { allow: vec!["a.com".into()], ..Default::default() };
        let egress = SessionEgressRecord { policy, ca_cert: Some("CERT".into()), ca_key_sealed: Some(vec![9]) };
        store
            .insert_session_with_egress(
                &new,
                &NewSessionEgress { egress, grants, inherited_from, idempotency_key: None },
            )
            .await
            .unwrap();
        id
    }

    #[tokio::test]
    async fn credentials_are_unique_per_tenant_and_scoped() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        let b = store.ensure_tenant("b").await.unwrap();
        let created = store.insert_credential(&new_credential(&a, "gh")).await.unwrap().unwrap();
        assert_eq!((created.version, created.rate_limit_per_min), (1, Some(60)));
        assert!(store.insert_credential(&new_credential(&a, "gh")).await.unwrap().is_none());
        assert!(store.insert_credential(&new_credential(&b, "gh")).await.unwrap().is_some());
        assert!(store.credential(&b, "nope").await.unwrap().is_none());
        assert_eq!(store.list_credentials(&a).await.unwrap().len(), 1);

        let change =
            CredentialChange { value_sealed: Some(vec![4]), rate_limit_per_min: Some(None), ..Default::default() };
        let updated = store.update_credential(&a, "gh", &change).await.unwrap().unwrap();
        assert_eq!((updated.credential.version, updated.credential.rate_limit_per_min), (2, None));
        assert_eq!(updated.value_sealed, vec![4]);
        assert_eq!(store.credential(&a, "gh").await.unwrap().unwrap().value_sealed, vec![4]);
        let hosts = CredentialChange { hosts: Some(vec!["x.com".into()]), ..Default::default() };
        assert_eq!(store.update_credential(&a, "gh", &hosts).await.unwrap().unwrap().credential.version, 2);
        assert!(store.update_credential(&b, "nope", &hosts).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn grants_set_and_clear_placeholders() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        let cred = store.insert_credential(&new_credential(&a, "gh")).await.unwrap().unwrap();
        let session = new_session(&store, &a, vec![]).await;
        assert!(store.grant(&session, &cred).await.unwrap());
        assert!(!store.grant(&session, &cred).await.unwrap());
        let env = store.session(&a, &session).await.unwrap().unwrap().env;
        assert_eq!(env.get("TOKEN").map(String::as_str), Some("space-placeholder-gh"));
        assert_eq!(store.session_grants(&session).await.unwrap()[0].credential.name, "gh");
        assert_eq!(store.sessions_granted(&cred.id).await.unwrap(), vec![session.clone()]);
        assert_eq!(store.revoke(&session, &cred).await.unwrap(), vec![session.clone()]);
        assert!(store.revoke(&session, &cred).await.unwrap().is_empty());
        let env = store.session(&a, &session).await.unwrap().unwrap().env;
        assert!(!env.contains_key("TOKEN") && env.contains_key("KEEP"));

        // Granted at create; deleting the credential removes the grant.
        let other = new_session(&store, &a, vec![cred.id.clone()]).await;
        assert_eq!(store.session_grants(&other).await.unwrap().len(), 1);
        let (_, sessions) = store.delete_credential(&a, "gh").await.unwrap().unwrap();
        assert_eq!(sessions, vec![other.clone()]);
        assert!(store.session_grants(&other).await.unwrap().is_empty());
        assert!(store.delete_credential(&a, "gh").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_revoke_reaches_the_forks_that_inherited_the_grant() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        let gh = store.insert_credential(&new_credential(&a, "gh")).await.unwrap().unwrap();
        let parent = new_session(&store, &a, vec![gh.id.clone()]).await;
        let child = fork(&store, &a, &parent).await;
        let grandchild = fork(&store, &a, &child).await;
        assert_eq!(store.inherited_grants(&grandchild).await.unwrap(), vec!["gh".to_string()]);
        // Detached: its grants are its own; its forks still follow it.
        let detached = fork(&store, &a, &parent).await;
        let under_detached = fork(&store, &a, &detached).await;
        assert_eq!(store.detach_grants(&detached).await.unwrap(), 1);
        assert!(store.inherited_grants(&detached).await.unwrap().is_empty());
        // Granted on the fork itself: its own too.
        let regranted = fork(&store, &a, &parent).await;
        assert!(!store.grant(&regranted, &gh).await.unwrap(), "already held");
        assert!(store.inherited_grants(&regranted).await.unwrap().is_empty());
        // Granted the same credential, not forked.
        let unrelated = new_session(&store, &a, vec![gh.id.clone()]).await;

        let mut revoked = store.revoke(&parent, &gh).await.unwrap();
        assert_eq!(revoked[0], parent, "the session itself first");
        revoked.sort_by(|x, y| x.as_str().cmp(y.as_str()));
        let mut expected = vec![parent.clone(), child.clone(), grandchild.clone()];
        expected.sort_by(|x, y| x.as_str().cmp(y.as_str()));
        assert_eq!(revoked, expected);
        for session in [&parent, &child, &grandchild] {
            assert!(store.session_grants(session).await.unwrap().is_empty());
            assert!(!store.session(&a, session).await.unwrap().unwrap().env.contains_key("TOKEN"));
        }
        for session in [&detached, &under_detached, &regranted, &unrelated] {
            assert_eq!(store.session_grants(session).await.unwrap().len(), 1, "{session}");
        }
        assert!(store.revoke(&parent, &gh).await.unwrap().is_empty());
        // Revoked on the detached fork, it reaches that fork's own fork.
        assert_eq!(store.revoke(&detached, &gh).await.unwrap(), vec![detached.clone(), under_detached.clone()]);
    }

    #[tokio::test]
    async fn policy_updates_and_audit_round_trip() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        let session = new_session(&store, &a, vec![]).await;
        let egress = store.session_egress(&session).await.unwrap().unwrap();
        assert_eq!((egress.policy.allow.len(), egress.ca_cert.as_deref()), (1, Some("CERT")));
        let update = NetworkPolicyUpdate { deny: vec!["a.com".into()], ..Default::default() };
        let next = store.update_network_policy(&session, |p| p.updated(&update)).await.unwrap().unwrap().unwrap();
        assert_eq!((next.allow.len(), next.deny.len()), (0, 1));
        let bad = NetworkPolicyUpdate { allow: vec!["bad host".into()], ..Default::default() };
        assert!(store.update_network_policy(&session, |p| p.updated(&bad)).await.unwrap().unwrap().is_err());
        assert_eq!(store.session_egress(&session).await.unwrap().unwrap().policy, next);
        assert!(store.update_network_policy(&SessionId::generate(), |p| Ok(p.clone())).await.unwrap().is_none());

        let events: Vec<AuditEvent> = (0..5)
            .map(|i| AuditEvent {
                decision: if i % 2 == 0 { AuditDecision::Allowed } else { AuditDecision::Denied },
                method: Some("GET".into()),
                bytes_sent: 10,
                bytes_received: 20,
                ..AuditEvent::allowed(session.clone(), 1000 + i, "https", &format!("h{i}.com"), 443)
            })
            .collect();
        store.insert_audit_events(&events).await.unwrap();
        let last = store.audit_events(&session, 3).await.unwrap();
        assert_eq!(last, events[2..].to_vec());
    }
}
