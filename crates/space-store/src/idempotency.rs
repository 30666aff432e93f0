//! `Idempotency-Key` bookkeeping: the first request with a key records its response; a retry
//! with the same key and the same request gets that response back.
//!
//! A record is unfinished (`status` NULL), finished (`status` and `body`), or finished with
//! its response withheld (`status` set, `body` NULL): the response carried a secret, which
//! is never stored, so a retry learns only that the request already succeeded. An unfinished
//! record whose replica stopped is `interrupted`: its request may have taken effect, so it is
//! never run again under that key. Records expire ([`Store::idempotency_expire`]).
//!
//! The fingerprint is computed by the caller; it must not let anyone who reads the database
//! test guesses of the request (space-control keys it with [`Store::idempotency_key_sealed`]).

use space_api::TenantId;
use sqlx::Row;

use crate::{Result, Store, now_ms};

/// The `meta` row holding the sealed key of idempotency fingerprints (hex).
const KEY_META: &str = "idempotency_key_sealed";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyBegin {
    /// First time: run the request, then call [`Store::idempotency_finish`] (or
    /// [`Store::idempotency_withhold`]).
    New,
    /// Seen before and finished: replay this response.
    Replay { status: u16, body: String },
    /// Seen before and finished, but its response carried a secret and was not kept.
    Withheld { status: u16 },
    /// The first request with this key is still running.
    InProgress,
    /// The first request with this key was cut off by a server stop; it may have taken effect.
    Interrupted,
    /// The key was used for a different request.
    Mismatch,
}

impl Store {
    pub async fn idempotency_begin(&self, tenant: &TenantId, key: &str, fingerprint: &str) -> Result<IdempotencyBegin> {
        let inserted = sqlx::query(
            "INSERT INTO idempotency (tenant_id, key, fingerprint, created_at, replica) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (tenant_id, key) DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(key)
        .bind(fingerprint)
        .bind(now_ms())
        .bind(&*self.replica)
        .execute(&self.writer)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(IdempotencyBegin::New);
        }
        let row = sqlx::query(
            "SELECT fingerprint, status, body, interrupted FROM idempotency WHERE tenant_id = $1 AND key = $2",
        )
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
            (Some(status), None) => Ok(IdempotencyBegin::Withheld { status: status as u16 }),
            _ if row.get::<i64, _>(3) != 0 => Ok(IdempotencyBegin::Interrupted),
            _ => Ok(IdempotencyBegin::InProgress),
        }
    }

    /// Takes over a key whose request a restart interrupted, to run that request again; `false`
    /// if another retry took it first.
    pub async fn idempotency_resume(&self, tenant: &TenantId, key: &str) -> Result<bool> {
        let taken = sqlx::query(
            "UPDATE idempotency SET interrupted = 0 WHERE tenant_id = $1 AND key = $2 AND interrupted != 0 AND status IS NULL",
        )
        .bind(tenant.as_str())
        .bind(key)
        .execute(&self.writer)
        .await?
        .rows_affected();
        Ok(taken == 1)
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

    /// Finishes a key whose response carried a secret: records that it succeeded, with
    /// `status`, but not the response.
    pub async fn idempotency_withhold(&self, tenant: &TenantId, key: &str, status: u16) -> Result<()> {
        sqlx::query("UPDATE idempotency SET status = $1, body = NULL WHERE tenant_id = $2 AND key = $3")
            .bind(status as i64)
            .bind(tenant.as_str())
            .bind(key)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Forgets a key whose request failed before producing a response worth replaying.
    pub async fn idempotency_abandon(&self, tenant: &TenantId, key: &str) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let given_back = sqlx::query("DELETE FROM idempotency WHERE tenant_id = $1 AND key = $2 AND status IS NULL")
            .bind(tenant.as_str())
            .bind(key)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if given_back > 0 {
            // What the failed request created under the key is not its retry's.
            sqlx::query("UPDATE sessions SET idempotency_key = NULL WHERE tenant_id = $1 AND idempotency_key = $2")
                .bind(tenant.as_str())
                .bind(key)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Marks interrupted the unfinished keys whose replica is not alive at `now` (its
    /// `replica:NAME` lease ran out), and with `own` those of this handle's replica (at its
    /// start, none of its requests is in flight). Keys of no replica count as a dead one's.
    pub async fn idempotency_interrupt_unfinished(&self, own: bool, now: i64) -> Result<u64> {
        let marked = sqlx::query(
            "UPDATE idempotency SET interrupted = 1 WHERE status IS NULL AND interrupted = 0
             AND ((replica = $1 AND $2 = 1) OR replica IS NULL OR (replica <> $1 AND NOT EXISTS
                 (SELECT 1 FROM leases l WHERE l.name = 'replica:' || idempotency.replica AND l.expires_at > $3)))",
        )
        .bind(&*self.replica)
        .bind(i64::from(own))
        .bind(now)
        .execute(&self.writer)
        .await?
        .rows_affected();
        Ok(marked)
    }

    /// Forgets records created before `before_ms` (Unix ms): a key can be used again after.
    pub async fn idempotency_expire(&self, before_ms: i64) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let deleted =
            sqlx::query("DELETE FROM idempotency WHERE created_at < $1").bind(before_ms).execute(&mut *tx).await?;
        // A session created under a forgotten key is no longer what that key names.
        sqlx::query(
            "UPDATE sessions SET idempotency_key = NULL WHERE idempotency_key IS NOT NULL AND NOT EXISTS
             (SELECT 1 FROM idempotency i WHERE i.tenant_id = sessions.tenant_id AND i.key = sessions.idempotency_key)",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(deleted.rows_affected())
    }

    /// The sealed key of idempotency fingerprints: the stored one, or `candidate` if none is
    /// stored yet (every replica ends up with the same key).
    pub async fn idempotency_key_sealed(&self, candidate: &[u8]) -> Result<Vec<u8>> {
        let stored = self.meta_get_or_insert(KEY_META, &hex::encode(candidate)).await?;
        hex::decode(&stored).map_err(|e| crate::StoreError::Corrupt(format!("meta {KEY_META}: {e}")))
    }

    /// Replaces the sealed fingerprint key `old` with `new` and, in the same transaction,
    /// forgets every record: their fingerprints were made with the old key and could never
    /// match again. Returns false (changing nothing) if the stored key is no longer `old`.
    pub async fn idempotency_replace_key(&self, old: &[u8], new: &[u8]) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let replaced = sqlx::query("UPDATE meta SET value = $1 WHERE key = $2 AND value = $3")
            .bind(hex::encode(new))
            .bind(KEY_META)
            .bind(hex::encode(old))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if replaced == 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM idempotency").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::IdempotencyBegin;
    use crate::now_ms;
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

    #[tokio::test]
    async fn a_key_unfinished_at_a_restart_is_interrupted_not_forgotten_and_expires() {
        let (store, _dir) = test_store().await;
        let t = store.ensure_tenant("t").await.unwrap();
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::New);
        assert_eq!(store.idempotency_interrupt_unfinished(true, now_ms()).await.unwrap(), 1);
        // Forgetting it would run the request again: a second session for one key.
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::Interrupted);
        assert_eq!(store.idempotency_begin(&t, "k", "other").await.unwrap(), IdempotencyBegin::Mismatch);
        assert_eq!(store.idempotency_expire(now_ms() + 1).await.unwrap(), 1);
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::New);
    }

    #[tokio::test]
    async fn a_key_is_interrupted_by_its_own_replicas_death_only() {
        let (store, _dir) = test_store().await;
        let (a, b) = (store.clone().as_replica("a"), store.as_replica("b"));
        let t = a.ensure_tenant("t").await.unwrap();
        let now = now_ms();
        a.announce_replica(now, 15_000).await.unwrap();
        b.announce_replica(now, 15_000).await.unwrap();
        assert_eq!(a.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::New);
        // b starting, or beating, leaves a's request in flight while a lives.
        assert_eq!(b.idempotency_interrupt_unfinished(true, now).await.unwrap(), 0);
        assert_eq!(b.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::InProgress);
        // a's lease ran out: its request was cut off.
        assert_eq!(b.idempotency_interrupt_unfinished(false, now + 15_000).await.unwrap(), 1);
        assert_eq!(b.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::Interrupted);
    }

    /// A session created under `key` (as `POST /v1/sessions` does).
    async fn session_under(store: &crate::Store, tenant: &space_api::TenantId, key: &str) -> space_api::SessionId {
        let id = space_api::SessionId::generate();
        let new = crate::NewSession {
            id: id.clone(),
            tenant_id: tenant.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: space_api::Resources::default(),
            env: Default::default(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: space_api::SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        };
        let egress = crate::SessionEgressRecord { policy: Default::default(), ca_cert: None, ca_key_sealed: None };
        let stored =
            crate::NewSessionEgress { egress, grants: vec![], inherited_from: None, idempotency_key: Some(key.into()) };
        store.insert_session_with_egress(&new, &stored).await.unwrap();
        id
    }

    #[tokio::test]
    async fn a_session_created_under_a_key_is_found_until_the_key_is_given_back_or_forgotten() {
        let (store, _dir) = test_store().await;
        let (t, other) = (store.ensure_tenant("t").await.unwrap(), store.ensure_tenant("o").await.unwrap());
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::New);
        let id = session_under(&store, &t, "k").await;
        let found = store.session_created_under_key(&t, "k").await.unwrap().unwrap();
        assert_eq!((&found.0, found.1.is_some()), (&id, true), "the session and its create operation");
        assert!(store.session_created_under_key(&other, "k").await.unwrap().is_none(), "keys are per tenant");

        // Interrupted: the first retry takes the key over, a second does not.
        store.idempotency_interrupt_unfinished(true, now_ms()).await.unwrap();
        assert!(store.idempotency_resume(&t, "k").await.unwrap());
        assert!(!store.idempotency_resume(&t, "k").await.unwrap());
        // A 5xx gives the key back and the session with it.
        store.idempotency_abandon(&t, "k").await.unwrap();
        assert!(store.session_created_under_key(&t, "k").await.unwrap().is_none());

        assert_eq!(store.idempotency_begin(&t, "k2", "f").await.unwrap(), IdempotencyBegin::New);
        session_under(&store, &t, "k2").await;
        store.idempotency_finish(&t, "k2", 201, "{}").await.unwrap();
        store.idempotency_abandon(&t, "k2").await.unwrap();
        assert!(store.session_created_under_key(&t, "k2").await.unwrap().is_some(), "a finished key stays");
        store.idempotency_expire(now_ms() + 1).await.unwrap();
        assert!(store.session_created_under_key(&t, "k2").await.unwrap().is_none(), "a forgotten key names nothing");
    }

    #[tokio::test]
    async fn withheld_responses_are_finished_but_not_kept() {
        let (store, _dir) = test_store().await;
        let t = store.ensure_tenant("t").await.unwrap();
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::New);
        store.idempotency_withhold(&t, "k", 201).await.unwrap();
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::Withheld { status: 201 });
        // Finished: neither a restart nor an abandon makes it retryable.
        store.idempotency_interrupt_unfinished(true, now_ms()).await.unwrap();
        store.idempotency_abandon(&t, "k").await.unwrap();
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::Withheld { status: 201 });
    }

    #[tokio::test]
    async fn the_fingerprint_key_is_stored_once_and_replaced_with_the_records() {
        let (store, _dir) = test_store().await;
        assert_eq!(store.idempotency_key_sealed(&[1, 2, 0xff]).await.unwrap(), vec![1, 2, 0xff]);
        assert_eq!(store.idempotency_key_sealed(&[9]).await.unwrap(), vec![1, 2, 0xff], "the first one stays");
        let t = store.ensure_tenant("t").await.unwrap();
        store.idempotency_begin(&t, "k", "f").await.unwrap();
        store.idempotency_finish(&t, "k", 200, "{}").await.unwrap();
        assert!(!store.idempotency_replace_key(&[9], &[7]).await.unwrap(), "not the stored key");
        assert_eq!(
            store.idempotency_begin(&t, "k", "f").await.unwrap(),
            IdempotencyBegin::Replay { status: 200, body: "{}".into() }
        );
        assert!(store.idempotency_replace_key(&[1, 2, 0xff], &[7]).await.unwrap());
        assert_eq!(store.idempotency_key_sealed(&[9]).await.unwrap(), vec![7]);
        assert_eq!(store.idempotency_begin(&t, "k", "f").await.unwrap(), IdempotencyBegin::New);
    }
}
