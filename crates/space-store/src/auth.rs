//! Tenants and API keys. Keys are stored as SHA-256 hashes computed by the caller.

use space_api::TenantId;
use sqlx::Row;

use crate::{Result, Store, now_ms, parse};

/// Who an API key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    pub tenant_id: TenantId,
    pub tenant: String,
    pub admin: bool,
}

impl Store {
    /// Returns the tenant named `name`, creating it if needed.
    pub async fn ensure_tenant(&self, name: &str) -> Result<TenantId> {
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
            .bind(TenantId::generate().as_str())
            .bind(name)
            .bind(now_ms())
            .execute(&self.writer)
            .await?;
        let id: String =
            sqlx::query_scalar("SELECT id FROM tenants WHERE name = $1").bind(name).fetch_one(&self.pool).await?;
        parse("tenant id", &id)
    }

    pub async fn insert_key(&self, hash: &str, tenant: &TenantId, admin: bool) -> Result<()> {
        sqlx::query("INSERT INTO api_keys (hash, tenant_id, admin, created_at) VALUES ($1, $2, $3, $4)")
            .bind(hash)
            .bind(tenant.as_str())
            .bind(admin)
            .bind(now_ms())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn find_key(&self, hash: &str) -> Result<Option<KeyOwner>> {
        let row = sqlx::query(
            "SELECT k.tenant_id, t.name, k.admin FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(KeyOwner { tenant_id: parse("tenant id", r.get::<&str, _>(0))?, tenant: r.get(1), admin: r.get(2) })
        })
        .transpose()
    }

    pub async fn count_admin_keys(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM api_keys WHERE admin").fetch_one(&self.pool).await?)
    }
}

#[cfg(test)]
mod tests {
    use crate::test_store;

    #[tokio::test]
    async fn keys_resolve_to_their_tenant() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        assert_eq!(store.ensure_tenant("a").await.unwrap(), a);
        store.insert_key("h1", &a, false).await.unwrap();
        let owner = store.find_key("h1").await.unwrap().unwrap();
        assert_eq!(owner.tenant_id, a);
        assert!(!owner.admin);
        assert!(store.find_key("nope").await.unwrap().is_none());
    }
}
