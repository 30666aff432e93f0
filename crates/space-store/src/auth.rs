//! Tenants and API keys. Keys are stored as SHA-256 hashes computed by the caller; a revoked
//! key keeps its row (with `revoked_at`), so it is listed and its hash never works again.

use space_api::{KeyId, SessionId, SessionScope, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Result, Store, StoreError, now_ms, parse};

/// An API key as stored, with its tenant's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: KeyId,
    pub name: Option<String>,
    pub tenant_id: TenantId,
    pub tenant: String,
    pub admin: bool,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// A session-scoped token's session and scopes.
    pub scope: Option<SessionScope>,
}

impl KeyRecord {
    pub fn expired_at(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// What [`Store::insert_key`] records.
#[derive(Debug, Clone)]
pub struct NewKey<'a> {
    pub id: KeyId,
    pub hash: &'a str,
    pub tenant_id: &'a TenantId,
    pub admin: bool,
    pub name: Option<&'a str>,
    /// Unix time in milliseconds, as `expires_at`.
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub scope: Option<&'a SessionScope>,
}

/// Why [`Store::revoke_key`] left a key as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeRefused {
    /// No key has that id.
    NotFound,
    /// It is the last admin key in effect: revoking it would leave nobody able to manage
    /// the server.
    LastAdminKey,
}

/// How often the last use of a key is written: at most once a minute per key, so the
/// requests a key authenticates do not each cost a write.
pub const LAST_USED_RESOLUTION_MS: i64 = 60_000;

/// Forks followed up from a session at most when looking for its root.
const MAX_FORK_DEPTH: i64 = 256;

const KEY_COLUMNS: &str = "k.id, k.name, k.tenant_id, t.name, CASE WHEN k.admin THEN 1 ELSE 0 END, k.created_at, k.last_used_at, k.expires_at, \
     k.revoked_at, k.scope_session, k.scope_permissions FROM api_keys k JOIN tenants t ON t.id = k.tenant_id";

fn key_from_row(row: &AnyRow) -> Result<KeyRecord> {
    Ok(KeyRecord {
        id: parse("key id", row.get::<&str, _>(0))?,
        name: row.get(1),
        tenant_id: parse("tenant id", row.get::<&str, _>(2))?,
        tenant: row.get(3),
        admin: row.get::<i64, _>(4) != 0,
        created_at: row.get(5),
        last_used_at: row.get(6),
        expires_at: row.get(7),
        revoked_at: row.get(8),
        scope: scope_from(row.get(9), row.get(10))?,
    })
}

fn scope_from(session: Option<&str>, permissions: Option<&str>) -> Result<Option<SessionScope>> {
    let (Some(session), Some(permissions)) = (session, permissions) else { return Ok(None) };
    let scopes = serde_json::from_str(permissions).map_err(|e| StoreError::Corrupt(format!("token scopes: {e}")))?;
    Ok(Some(SessionScope { session_id: parse("session id", session)?, scopes }))
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

    /// The tenant named `name`, if there is one.
    pub async fn tenant_named(&self, name: &str) -> Result<Option<TenantId>> {
        let id: Option<String> =
            sqlx::query_scalar("SELECT id FROM tenants WHERE name = $1").bind(name).fetch_optional(&self.pool).await?;
        id.map(|id| parse("tenant id", &id)).transpose()
    }

    pub async fn insert_key(&self, new: &NewKey<'_>) -> Result<KeyRecord> {
        let mut tx = self.write_tx().await?;
        insert_key_tx(&mut tx, new).await?;
        tx.commit().await?;
        self.key(&new.id).await?.ok_or_else(|| StoreError::Corrupt(format!("key {} vanished", new.id)))
    }

    /// The key whose hash is `hash`, revoked and expired ones included (the caller says why
    /// they are refused).
    pub async fn find_key(&self, hash: &str) -> Result<Option<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} WHERE k.hash = $1");
        let row = sqlx::query(&sql).bind(hash).fetch_optional(&self.pool).await?;
        row.as_ref().map(key_from_row).transpose()
    }

    pub async fn key(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} WHERE k.id = $1");
        let row = sqlx::query(&sql).bind(id.as_str()).fetch_optional(&self.pool).await?;
        row.as_ref().map(key_from_row).transpose()
    }

    /// The keys of `tenant` (all tenants' with `None`), oldest first.
    pub async fn list_keys(&self, tenant: Option<&TenantId>) -> Result<Vec<KeyRecord>> {
        let filter = if tenant.is_some() { "WHERE k.tenant_id = $1 " } else { "" };
        let sql = format!("SELECT {KEY_COLUMNS} {filter}ORDER BY k.created_at, k.id");
        let mut query = sqlx::query(&sql);
        if let Some(tenant) = tenant {
            query = query.bind(tenant.as_str());
        }
        query.fetch_all(&self.pool).await?.iter().map(key_from_row).collect()
    }

    /// Records that key `id` was used at `now`, unless that was already recorded less than
    /// [`LAST_USED_RESOLUTION_MS`] before: the condition is in the statement, so replicas
    /// sharing the database do not each write it. Returns whether it wrote.
    pub async fn touch_key(&self, id: &KeyId, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE api_keys SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at <= $3)",
        )
        .bind(now)
        .bind(id.as_str())
        .bind(now - LAST_USED_RESOLUTION_MS)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Revokes key `id` (a key already revoked keeps its first `revoked_at`). The last
    /// admin key in effect is refused.
    pub async fn revoke_key(&self, id: &KeyId) -> Result<std::result::Result<KeyRecord, RevokeRefused>> {
        let mut tx = self.write_tx().await?;
        let admin: Option<i64> =
            sqlx::query_scalar("SELECT CASE WHEN admin THEN 1 ELSE 0 END FROM api_keys WHERE id = $1")
                .bind(id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let Some(admin) = admin else {
            return Ok(Err(RevokeRefused::NotFound));
        };
        if admin != 0 && other_admin_keys(&mut tx, id).await? == 0 {
            return Ok(Err(RevokeRefused::LastAdminKey));
        }
        revoke_tx(&mut tx, id).await?;
        tx.commit().await?;
        self.key(id).await?.map(Ok).ok_or_else(|| StoreError::Corrupt(format!("key {id} vanished")))
    }

    /// Replaces key `old` by `new` in one transaction: `new` is recorded and `old` revoked.
    /// Returns `None` (and changes nothing) if `old` does not exist or is already revoked.
    pub async fn rotate_key(&self, old: &KeyId, new: &NewKey<'_>) -> Result<Option<KeyRecord>> {
        let mut tx = self.write_tx().await?;
        let revoked = revoke_tx(&mut tx, old).await?;
        if !revoked {
            return Ok(None);
        }
        insert_key_tx(&mut tx, new).await?;
        tx.commit().await?;
        self.key(&new.id).await
    }

    /// Whether `session` is `root` or was forked from it, at any depth (`forked_from`, kept
    /// when the snapshot a fork came from is deleted). One query, bounded in depth so a
    /// corrupt cycle ends too.
    pub async fn session_descends_from(&self, session: &SessionId, root: &SessionId) -> Result<bool> {
        let found: Option<i64> = sqlx::query_scalar(
            "WITH RECURSIVE up(id, depth) AS (
                 SELECT CAST($1 AS TEXT), 0
                 UNION ALL
                 SELECT s.forked_from, up.depth + 1 FROM sessions s JOIN up ON s.id = up.id
                 WHERE s.forked_from IS NOT NULL AND up.depth < $3
             )
             SELECT 1 FROM up WHERE id = $2 LIMIT 1",
        )
        .bind(session.as_str())
        .bind(root.as_str())
        .bind(MAX_FORK_DEPTH)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }

    /// Admin keys in effect (not revoked).
    pub async fn count_admin_keys(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM api_keys WHERE admin AND revoked_at IS NULL")
            .fetch_one(&self.pool)
            .await?)
    }
}

async fn insert_key_tx(tx: &mut sqlx::Transaction<'_, sqlx::Any>, new: &NewKey<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO api_keys (hash, id, name, tenant_id, admin, created_at, expires_at, scope_session, scope_permissions) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(new.hash)
    .bind(new.id.as_str())
    .bind(new.name)
    .bind(new.tenant_id.as_str())
    .bind(new.admin)
    .bind(new.created_at)
    .bind(new.expires_at)
    .bind(new.scope.map(|s| s.session_id.as_str().to_owned()))
    .bind(new.scope.map(|s| serde_json::to_string(&s.scopes).unwrap_or_default()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Revokes `id` if it is in effect; returns whether it was.
async fn revoke_tx(tx: &mut sqlx::Transaction<'_, sqlx::Any>, id: &KeyId) -> Result<bool> {
    let done = sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
        .bind(now_ms())
        .bind(id.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

async fn other_admin_keys(tx: &mut sqlx::Transaction<'_, sqlx::Any>, id: &KeyId) -> Result<i64> {
    let now = now_ms();
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM api_keys WHERE admin AND revoked_at IS NULL AND id <> $1 \
         AND (expires_at IS NULL OR expires_at > $2)",
    )
    .bind(id.as_str())
    .bind(now)
    .fetch_one(&mut **tx)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store;

    fn new_key<'a>(hash: &'a str, tenant: &'a TenantId, admin: bool) -> NewKey<'a> {
        let created_at = now_ms();
        NewKey {
            id: KeyId::generate(),
            hash,
            tenant_id: tenant,
            admin,
            name: Some("ci"),
            created_at,
            expires_at: None,
            scope: None,
        }
    }

    #[tokio::test]
    async fn keys_resolve_to_their_tenant() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        assert_eq!(store.ensure_tenant("a").await.unwrap(), a);
        let created = store.insert_key(&new_key("h1", &a, false)).await.unwrap();
        let found = store.find_key("h1").await.unwrap().unwrap();
        assert_eq!(found, created);
        assert_eq!((found.tenant_id, found.tenant.as_str(), found.admin), (a, "a", false));
        assert!(store.find_key("nope").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn last_use_is_written_at_most_once_a_minute() {
        let (store, _dir) = test_store().await;
        let a = store.ensure_tenant("a").await.unwrap();
        let key = store.insert_key(&new_key("h1", &a, false)).await.unwrap();
        let t = 1_000_000_000;
        assert!(store.touch_key(&key.id, t).await.unwrap());
        assert!(!store.touch_key(&key.id, t + LAST_USED_RESOLUTION_MS - 1).await.unwrap());
        assert_eq!(store.key(&key.id).await.unwrap().unwrap().last_used_at, Some(t));
        assert!(store.touch_key(&key.id, t + LAST_USED_RESOLUTION_MS).await.unwrap());
    }

    #[tokio::test]
    async fn rotation_revokes_the_old_key_and_the_last_admin_key_stays() {
        let (store, _dir) = test_store().await;
        let admin = store.ensure_tenant("admin").await.unwrap();
        let first = store.insert_key(&new_key("h1", &admin, true)).await.unwrap();
        assert_eq!(store.revoke_key(&first.id).await.unwrap(), Err(RevokeRefused::LastAdminKey));
        let second = store.rotate_key(&first.id, &new_key("h2", &admin, true)).await.unwrap().unwrap();
        assert!(store.find_key("h1").await.unwrap().unwrap().revoked_at.is_some());
        assert_eq!(store.count_admin_keys().await.unwrap(), 1);
        assert!(store.rotate_key(&first.id, &new_key("h3", &admin, true)).await.unwrap().is_none());
        assert!(store.find_key("h3").await.unwrap().is_none(), "a revoked key is not rotated twice");
        let missing = KeyId::generate();
        assert_eq!(store.revoke_key(&missing).await.unwrap(), Err(RevokeRefused::NotFound));
        assert_eq!(store.list_keys(Some(&admin)).await.unwrap().len(), 2);
        let all = store.list_keys(None).await.unwrap();
        assert!(all.iter().any(|k| k.id == second.id && k.revoked_at.is_none()), "{all:?}");
    }
}
