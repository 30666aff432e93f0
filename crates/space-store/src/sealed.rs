//! What the database holds sealed (by space-keys) that the server needs to open: the values
//! of credentials and the CA keys of sessions that are not destroyed. At start the server
//! checks that its key opens them (a new key would not), before it serves anything.

use space_api::{CredentialId, SessionId, SnapshotId, TenantId};
use sqlx::Row;

use crate::{Result, Store, parse};

/// What a sealed value belongs to: the owner it was sealed for is derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealedOwner {
    Credential {
        tenant_id: TenantId,
        id: CredentialId,
        name: String,
    },
    SessionCa {
        session: SessionId,
    },
    /// The data key of a durable snapshot's export (not opened at start: see
    /// [`Store::sealed_values`]).
    SnapshotKey {
        session: SessionId,
        snapshot: SnapshotId,
    },
}

/// A sealed value and its owner.
#[derive(Clone)]
pub struct SealedValue {
    pub owner: SealedOwner,
    pub sealed: Vec<u8>,
}

impl std::fmt::Debug for SealedValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedValue").field("owner", &self.owner).finish_non_exhaustive()
    }
}

/// Sessions (`sessions` rows) whose CA key may still be opened: those not destroyed, and
/// destroyed ones that a snapshot outlived.
pub(crate) const OPENED: &str = "state <> 'destroyed' OR EXISTS (SELECT 1 FROM snapshots k \
     WHERE k.session_id = sessions.id AND k.outlives_session = 1)";

impl Store {
    /// Every credential value, and the CA key of every session whose key may still be opened:
    /// one not destroyed, or a destroyed one with a snapshot that outlived it (a fork from it
    /// opens the key). Not the data keys of snapshot exports: there may be many, and the
    /// start-up check needs only some value of each key.
    pub async fn sealed_values(&self) -> Result<Vec<SealedValue>> {
        let mut out = Vec::new();
        let rows = sqlx::query("SELECT tenant_id, id, name, value_sealed FROM credentials ORDER BY tenant_id, name")
            .fetch_all(&self.pool)
            .await?;
        for row in &rows {
            out.push(credential_value(row)?);
        }
        let sql = format!(
            "SELECT id, ca_key_sealed FROM sessions WHERE ca_key_sealed IS NOT NULL AND ({OPENED}) ORDER BY id"
        );
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        for row in &rows {
            out.push(ca_value(row)?);
        }
        Ok(out)
    }
}

/// A credential's value from `tenant_id, id, name, value_sealed`.
pub(crate) fn credential_value(row: &sqlx::any::AnyRow) -> Result<SealedValue> {
    Ok(SealedValue {
        owner: SealedOwner::Credential {
            tenant_id: parse("tenant id", row.get::<&str, _>(0))?,
            id: parse("credential id", row.get::<&str, _>(1))?,
            name: row.get(2),
        },
        sealed: row.get(3),
    })
}

/// A session's CA key from `id, ca_key_sealed`.
pub(crate) fn ca_value(row: &sqlx::any::AnyRow) -> Result<SealedValue> {
    Ok(SealedValue {
        owner: SealedOwner::SessionCa { session: parse("session id", row.get::<&str, _>(0))? },
        sealed: row.get(1),
    })
}

impl Store {}

#[cfg(test)]
mod tests {
    use space_api::egress::NetworkPolicy;
    use space_api::{Resources, SessionState, SnapshotPolicy};

    use super::*;
    use crate::{NewCredential, NewSession, NewSessionEgress, SessionEgressRecord, test_store};

    async fn session(store: &Store, tenant: &TenantId, ca_key: Option<Vec<u8>>) -> SessionId {
        let id = SessionId::generate();
        let new = NewSession {
            id: id.clone(),
            tenant_id: tenant.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: Resources::default(),
            env: Default::default(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        };
        let egress = SessionEgressRecord {
            policy: NetworkPolicy::default(),
            ca_cert: ca_key.as_ref().map(|_| "CERT".into()),
            ca_key_sealed: ca_key,
        };
        store
            .insert_session_with_egress(
                &new,
                &NewSessionEgress { egress, grants: vec![], inherited_from: None, idempotency_key: None },
            )
            .await
            .unwrap();
        id
    }

    #[tokio::test]
    async fn lists_credential_values_and_the_ca_keys_of_live_sessions() {
        let (store, _dir) = test_store().await;
        assert!(store.sealed_values().await.unwrap().is_empty());
        let tenant = store.ensure_tenant("a").await.unwrap();
        let credential = NewCredential {
            id: CredentialId::generate(),
            tenant_id: tenant.clone(),
            name: "gh".into(),
            hosts: vec!["api.github.com".into()],
            header: "Authorization: Bearer {secret}".into(),
            value_sealed: vec![1],
            expires_at: None,
            rate_limit_per_min: None,
            placeholder_env: None,
            oauth: None,
        };
        store.insert_credential(&credential).await.unwrap().unwrap();
        let live = session(&store, &tenant, Some(vec![2])).await;
        let gone = session(&store, &tenant, Some(vec![3])).await;
        assert!(store.transition(&gone, &[SessionState::Creating], SessionState::Destroyed, None).await.unwrap());
        session(&store, &tenant, None).await;

        let values = store.sealed_values().await.unwrap();
        let owners: Vec<_> = values.iter().map(|v| (v.owner.clone(), v.sealed.clone())).collect();
        assert_eq!(
            owners,
            vec![
                (SealedOwner::Credential { tenant_id: tenant, id: credential.id, name: "gh".into() }, vec![1]),
                (SealedOwner::SessionCa { session: live }, vec![2]),
            ]
        );
    }
}
