//! `Idempotency-Key` bookkeeping: the first request with a key records its response; a retry
//! with the same key and the same request gets that response back.

use space_api::TenantId;
use sqlx::Row;

use crate::{Result, Store, now_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyBegin {
    /// First time: run the request, then call [`Store::idempotency_finish`].
    New,
    /// Seen before and finished: replay this response.
    Replay { status: u16, body: String },
    /// The first request with this key is still running.
    InProgress,
    /// The key was used for a different request.
    Mismatch,
}

impl Store {
    pub async fn idempotency_begin(&self, tenant: &TenantId, key: &str, fingerprint: &str) -> Result<IdempotencyBegin> {
        let inserted = sqlx::query(
            "INSERT INTO idempotency (tenant_id, key, fingerprint, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (tenant_id, key) DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(key)
        .bind(fingerprint)
        .bind(now_ms())
        .execute(&self.writer)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(IdempotencyBegin::New);
        }
        let row = sqlx::query("SELECT fingerprint, status, body FROM idempotency WHERE tenant_id = $1 AND key = $2")
            .bind(tenant.as_str())
            .bind(key)
            .fetch_one(&self.pool)
            .await?;
        let stored: String = row.get(0);
        if stored != fingerprint {
            return Ok(IdempotencyBegin::Mismatch);
        }
        match (row.get::<Option<i64>, _>(1), row.get::<Option<String>, _>(2)) {
            (Some(status), Some(body)) => Ok(IdempotencyBegin::Replay { status: status as u16, body }),
            _ => Ok(IdempotencyBegin::InProgress),
        }
    }

    pub async fn idempotency_finish(&self, tenant: &TenantId, key: &str, status: u16, body: &str) -> Result<()> {
        sqlx::query("UPDATE idempotency SET status = $1, body = $2 WHERE tenant_id = $3 AND key = $4")
            .bind(status as i64)
            .bind(body)
            .bind(tenant.as_str())
            .bind(key)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Forgets a key whose request failed before producing a response worth replaying.
    pub async fn idempotency_abandon(&self, tenant: &TenantId, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM idempotency WHERE tenant_id = $1 AND key = $2 AND status IS NULL")
            .bind(tenant.as_str())
            .bind(key)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// After a restart no request is in flight: unfinished keys may be retried.
    pub async fn idempotency_clear_unfinished(&self) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM idempotency WHERE status IS NULL").execute(&self.writer).await?.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::IdempotencyBegin;
    use crate::test_store;

    #[tokio::test]
    async fn replay_mismatch_and_in_progress() {
        let (store, _dir) = test_store().await;
        let t = store.ensure_tenant("t").await.unwrap();
        assert_eq!(store.idempotency_begin(&t, "k", "f1").await.unwrap(), IdempotencyBegin::New);
        assert_eq!(store.idempotency_begin(&t, "k", "f1").await.unwrap(), IdempotencyBegin::InProgress);
        store.idempotency_finish(&t, "k", 201, "{}").await.unwrap();
        assert_eq!(
            store.idempotency_begin(&t, "k", "f1").await.unwrap(),
            IdempotencyBegin::Replay { status: 201, body: "{}".into() }
        );
        assert_eq!(store.idempotency_begin(&t, "k", "f2").await.unwrap(), IdempotencyBegin::Mismatch);
    }
}
