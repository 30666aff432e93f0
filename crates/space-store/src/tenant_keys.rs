//! Tenants' own key-encryption keys (BYOK): which key wraps what is sealed for a tenant, and
//! the sealed values to re-wrap when it changes.

use space_api::{TenantId, TenantKeyId};
use sqlx::Row;

use crate::sealed::{ca_value, credential_value};
use crate::{Result, SealedOwner, SealedValue, Store, StoreError, now_ms, parse};

/// A key in a tenant's KMS. Never changes once stored.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantKeyRecord {
    pub id: TenantKeyId,
    pub tenant_id: TenantId,
    /// `openbao` (OpenBao or HashiCorp Vault Transit).
    pub provider: String,
    pub address: String,
    pub mount: String,
    pub key_name: String,
    /// The token that lets space use the key, sealed by the server's local key.
    pub token_sealed: Vec<u8>,
    /// Set by a tenant, not the operator: refused at loopback and private addresses.
    pub public_only: bool,
    pub created_at_ms: i64,
}

impl std::fmt::Debug for TenantKeyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantKeyRecord")
            .field("id", &self.id)
            .field("tenant_id", &self.tenant_id)
            .field("provider", &self.provider)
            .field("address", &self.address)
            .field("key_name", &self.key_name)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "id, tenant_id, provider, address, mount, key_name, token_sealed, created_at, public_only";

fn record(row: &sqlx::any::AnyRow) -> Result<TenantKeyRecord> {
    Ok(TenantKeyRecord {
        id: parse("tenant key id", row.get::<&str, _>(0))?,
        tenant_id: parse("tenant id", row.get::<&str, _>(1))?,
        provider: row.get(2),
        address: row.get(3),
        mount: row.get(4),
        key_name: row.get(5),
        token_sealed: row.get(6),
        created_at_ms: row.get(7),
        public_only: row.get::<i64, _>(8) != 0,
    })
}

impl Store {
    /// Stores `key` (not yet the tenant's current key: see [`Store::set_tenant_key_ref`]).
    pub async fn insert_tenant_key(&self, key: &TenantKeyRecord) -> Result<()> {
        sqlx::query(&format!("INSERT INTO tenant_keys ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"))
            .bind(key.id.as_str())
            .bind(key.tenant_id.as_str())
            .bind(&key.provider)
            .bind(&key.address)
            .bind(&key.mount)
            .bind(&key.key_name)
            .bind(&key.token_sealed)
            .bind(now_ms())
            .bind(i64::from(key.public_only))
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn tenant_key(&self, id: &TenantKeyId) -> Result<Option<TenantKeyRecord>> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM tenant_keys WHERE id = $1"))
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(record).transpose()
    }

    /// The tenant's current key; `None` for the server's local key.
    pub async fn current_tenant_key(&self, tenant: &TenantId) -> Result<Option<TenantKeyRecord>> {
        let key_ref: Option<Option<String>> = sqlx::query_scalar("SELECT key_ref FROM tenants WHERE id = $1")
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(id) = key_ref.flatten() else { return Ok(None) };
        let id: TenantKeyId = parse("tenant key id", &id)?;
        let key = self.tenant_key(&id).await?;
        key.map(Some).ok_or_else(|| StoreError::Corrupt(format!("tenant {tenant}'s key {id} is not stored")))
    }

    /// Makes `key` (one of the tenant's, or `None`: the local key) what new values of the
    /// tenant are sealed with.
    pub async fn set_tenant_key_ref(&self, tenant: &TenantId, key: Option<&TenantKeyId>) -> Result<()> {
        sqlx::query("UPDATE tenants SET key_ref = $1 WHERE id = $2")
            .bind(key.map(TenantKeyId::as_str))
            .bind(tenant.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Deletes the tenant's keys but those of `keep` (call once no sealed value of the
    /// tenant names them); how many.
    pub async fn delete_tenant_keys_except(&self, tenant: &TenantId, keep: &[Option<&TenantKeyId>; 2]) -> Result<u64> {
        let id = |k: Option<&TenantKeyId>| k.map_or("", TenantKeyId::as_str).to_owned();
        let done = sqlx::query("DELETE FROM tenant_keys WHERE tenant_id = $1 AND id <> $2 AND id <> $3")
            .bind(tenant.as_str())
            .bind(id(keep[0]))
            .bind(id(keep[1]))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }

    /// What is sealed for `tenant`: its credentials' values, the CA keys of its sessions that
    /// may still be opened (see [`crate::sealed::OPENED`]) and the data keys of its snapshots'
    /// exports.
    pub async fn tenant_sealed_values(&self, tenant: &TenantId) -> Result<Vec<SealedValue>> {
        let mut out = Vec::new();
        let rows =
            sqlx::query("SELECT tenant_id, id, name, value_sealed FROM credentials WHERE tenant_id = $1 ORDER BY name")
                .bind(tenant.as_str())
                .fetch_all(&self.pool)
                .await?;
        for row in &rows {
            out.push(credential_value(row)?);
        }
        let sql = format!(
            "SELECT id, ca_key_sealed FROM sessions WHERE tenant_id = $1 AND ca_key_sealed IS NOT NULL \
             AND ({}) ORDER BY id",
            crate::sealed::OPENED
        );
        let rows = sqlx::query(&sql).bind(tenant.as_str()).fetch_all(&self.pool).await?;
        for row in &rows {
            out.push(ca_value(row)?);
        }
        let rows = sqlx::query(
            "SELECT s.session_id, s.id, s.export_key_sealed FROM snapshots s JOIN sessions ss ON ss.id = s.session_id \
             WHERE ss.tenant_id = $1 AND s.export_key_sealed IS NOT NULL ORDER BY s.id",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        for row in rows {
            out.push(SealedValue {
                owner: SealedOwner::SnapshotKey {
                    session: parse("session id", row.get::<&str, _>(0))?,
                    snapshot: parse("snapshot id", row.get::<&str, _>(1))?,
                },
                sealed: row.get(2),
            });
        }
        Ok(out)
    }

    /// Replaces `owner`'s sealed value if it is still `old` (so that a value changed
    /// meanwhile, e.g. a rotated credential, is not overwritten); whether it was replaced.
    pub async fn replace_sealed(&self, owner: &SealedOwner, old: &[u8], new: &[u8]) -> Result<bool> {
        let (sql, id) = match owner {
            SealedOwner::Credential { id, .. } => {
                ("UPDATE credentials SET value_sealed = $1 WHERE id = $2 AND value_sealed = $3", id.as_str())
            }
            SealedOwner::SessionCa { session } => {
                ("UPDATE sessions SET ca_key_sealed = $1 WHERE id = $2 AND ca_key_sealed = $3", session.as_str())
            }
            SealedOwner::SnapshotKey { snapshot, .. } => (
                "UPDATE snapshots SET export_key_sealed = $1 WHERE id = $2 AND export_key_sealed = $3",
                snapshot.as_str(),
            ),
        };
        let done = sqlx::query(sql).bind(new).bind(id).bind(old).execute(&self.writer).await?;
        Ok(done.rows_affected() == 1)
    }
}

#[cfg(test)]
mod tests {
    use space_api::CredentialId;

    use super::*;
    use crate::{NewCredential, test_store};

    async fn credential(store: &Store, tenant: &TenantId, name: &str, sealed: &[u8]) -> CredentialId {
        let new = NewCredential {
            id: CredentialId::generate(),
            tenant_id: tenant.clone(),
            name: name.into(),
            hosts: vec!["api.github.com".into()],
            header: "Authorization: Bearer {secret}".into(),
            value_sealed: sealed.to_vec(),
            expires_at: None,
            rate_limit_per_min: None,
            placeholder_env: None,
            oauth: None,
        };
        store.insert_credential(&new).await.unwrap().unwrap();
        new.id
    }

    #[tokio::test]
    async fn a_tenants_key_and_its_sealed_values_are_its_own() {
        let (store, _dir) = test_store().await;
        let (a, b) = (store.ensure_tenant("a").await.unwrap(), store.ensure_tenant("b").await.unwrap());
        assert!(store.current_tenant_key(&a).await.unwrap().is_none(), "the local key by default");
        let key = TenantKeyRecord {
            id: TenantKeyId::generate(),
            tenant_id: a.clone(),
            provider: "openbao".into(),
            address: "http://127.0.0.1:8200".into(),
            mount: "transit".into(),
            key_name: "a".into(),
            token_sealed: vec![9, 9],
            created_at_ms: 0,
            public_only: true,
        };
        store.insert_tenant_key(&key).await.unwrap();
        assert!(store.current_tenant_key(&a).await.unwrap().is_none(), "stored is not current");
        store.set_tenant_key_ref(&a, Some(&key.id)).await.unwrap();
        let current = store.current_tenant_key(&a).await.unwrap().unwrap();
        assert_eq!((current.id, current.token_sealed, current.public_only), (key.id.clone(), vec![9, 9], true));
        assert!(store.current_tenant_key(&b).await.unwrap().is_none());

        let ours = credential(&store, &a, "gh", &[1]).await;
        credential(&store, &b, "gh", &[2]).await;
        let values = store.tenant_sealed_values(&a).await.unwrap();
        assert_eq!(values.len(), 1);
        assert_eq!(values[0].owner, SealedOwner::Credential { tenant_id: a.clone(), id: ours, name: "gh".into() });
        // Replaced only while it is still what was read.
        assert!(store.replace_sealed(&values[0].owner, &[1], &[3]).await.unwrap());
        assert!(!store.replace_sealed(&values[0].owner, &[1], &[4]).await.unwrap(), "changed meanwhile");
        assert_eq!(store.tenant_sealed_values(&a).await.unwrap()[0].sealed, vec![3]);
        assert_eq!(store.tenant_sealed_values(&b).await.unwrap()[0].sealed, vec![2], "another tenant's is untouched");

        store.set_tenant_key_ref(&a, None).await.unwrap();
        assert!(store.current_tenant_key(&a).await.unwrap().is_none());
        assert!(store.tenant_key(&key.id).await.unwrap().is_some(), "kept while values may name it");
        assert_eq!(store.delete_tenant_keys_except(&b, &[None, None]).await.unwrap(), 0, "another tenant's");
        assert_eq!(store.delete_tenant_keys_except(&a, &[None, Some(&key.id)]).await.unwrap(), 0, "kept");
        assert_eq!(store.delete_tenant_keys_except(&a, &[None, None]).await.unwrap(), 1);
        assert!(store.tenant_key(&key.id).await.unwrap().is_none());
    }
}
