//! Named leases: work that one control replica at a time does (a node's recovery and exit
//! watches, the snapshot scheduler), and each replica's own liveness (`replica:NAME`). A
//! lease is held until its expiry; its holder renews it, and anyone may take one that ran out.

use crate::{Result, Store};

/// The lease naming a replica's liveness.
pub fn replica_lease(name: &str) -> String {
    format!("replica:{name}")
}

impl Store {
    /// Takes or renews lease `name` for this handle's replica until `now + lease_ms`, unless
    /// another replica holds it unexpired. Returns whether this replica holds it now.
    pub async fn acquire_lease(&self, name: &str, now: i64, lease_ms: i64) -> Result<bool> {
        let taken = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
             WHERE leases.holder = excluded.holder OR leases.expires_at <= $4",
        )
        .bind(name)
        .bind(&*self.replica)
        .bind(now.saturating_add(lease_ms))
        .bind(now)
        .execute(&self.writer)
        .await?
        .rows_affected();
        Ok(taken == 1)
    }

    /// Who holds lease `name` unexpired at `now`, if anyone.
    pub async fn lease_holder(&self, name: &str, now: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT holder FROM leases WHERE name = $1 AND expires_at > $2")
            .bind(name)
            .bind(now)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Gives up lease `name` if this handle's replica holds it, so others need not wait for
    /// its expiry.
    pub async fn release_lease(&self, name: &str) -> Result<()> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(&*self.replica)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// How many leases whose names start with `prefix` are held unexpired at `now`, by any
    /// replica.
    pub async fn leases_held(&self, prefix: &str, now: i64) -> Result<u64> {
        let escaped = prefix.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
        let held: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM leases WHERE name LIKE $1 ESCAPE '\\' AND expires_at > $2")
                .bind(format!("{escaped}%"))
                .bind(now)
                .fetch_one(&self.pool)
                .await?;
        Ok(held as u64)
    }

    /// Deletes the leases that ran out before `before`: nobody holds them (a lease that ran
    /// out is free to take, and one taken again is written anew). Leases named per piece of
    /// work (an export, a suspend) would otherwise stay for ever when their holder died.
    /// Returns how many were deleted.
    pub async fn delete_expired_leases(&self, before: i64) -> Result<u64> {
        let deleted =
            sqlx::query("DELETE FROM leases WHERE expires_at < $1").bind(before).execute(&self.writer).await?;
        Ok(deleted.rows_affected())
    }

    /// Records this handle's replica as alive until `now + lease_ms`, whatever the lease
    /// says: a replica starting under a name takes it over from the earlier process of that
    /// name, which is dead (names are unique among live replicas).
    pub async fn announce_replica(&self, now: i64, lease_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
        )
        .bind(replica_lease(&self.replica))
        .bind(&*self.replica)
        .bind(now.saturating_add(lease_ms))
        .execute(&self.writer)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::test_store;

    #[tokio::test]
    async fn a_lease_has_one_holder_until_it_runs_out() {
        let (store, _dir) = test_store().await;
        let a = store.clone().as_replica("a");
        let b = store.as_replica("b");
        assert!(a.acquire_lease("node:n", 1_000, 15_000).await.unwrap());
        assert!(!b.acquire_lease("node:n", 10_000, 15_000).await.unwrap(), "a holds it");
        assert!(a.acquire_lease("node:n", 10_000, 15_000).await.unwrap(), "its holder renews it");
        assert_eq!(b.lease_holder("node:n", 24_999).await.unwrap().as_deref(), Some("a"));
        assert!(!b.acquire_lease("node:n", 24_999, 15_000).await.unwrap());
        // a stopped renewing: at its expiry, b takes it, and a no longer holds it.
        assert!(b.acquire_lease("node:n", 25_000, 15_000).await.unwrap());
        assert!(!a.acquire_lease("node:n", 26_000, 15_000).await.unwrap());
        assert_eq!(a.lease_holder("node:n", 26_000).await.unwrap().as_deref(), Some("b"));
        assert_eq!(a.lease_holder("node:n", 40_000).await.unwrap(), None);
    }

    #[tokio::test]
    async fn leases_that_ran_out_long_ago_are_deleted_and_held_ones_stay() {
        let (store, _dir) = test_store().await;
        let a = store.clone().as_replica("a");
        assert!(a.acquire_lease("export:old", 1_000, 15_000).await.unwrap());
        assert!(a.acquire_lease("node:n", 50_000, 15_000).await.unwrap());
        assert_eq!(a.delete_expired_leases(60_000).await.unwrap(), 1);
        assert_eq!(a.lease_holder("node:n", 60_000).await.unwrap().as_deref(), Some("a"));
        assert!(store.as_replica("b").acquire_lease("export:old", 60_000, 15_000).await.unwrap(), "free to take");
    }

    #[tokio::test]
    async fn a_released_lease_is_free_at_once_and_leases_are_counted_by_prefix() {
        let (store, _dir) = test_store().await;
        let a = store.clone().as_replica("a");
        let b = store.as_replica("b");
        assert!(a.acquire_lease("export:x_1", 1_000, 15_000).await.unwrap());
        assert!(b.acquire_lease("export:y", 1_000, 15_000).await.unwrap());
        assert!(a.acquire_lease("exportxy", 1_000, 15_000).await.unwrap());
        assert_eq!(a.leases_held("export:", 2_000).await.unwrap(), 2);
        assert_eq!(a.leases_held("export:x_", 2_000).await.unwrap(), 1, "_ is itself, not any character");
        assert_eq!(a.leases_held("export:", 16_000).await.unwrap(), 0, "expired ones are not held");
        b.release_lease("export:x_1").await.unwrap();
        assert_eq!(a.leases_held("export:", 2_000).await.unwrap(), 2, "only its holder releases a lease");
        a.release_lease("export:x_1").await.unwrap();
        assert_eq!(a.leases_held("export:", 2_000).await.unwrap(), 1);
        assert!(b.acquire_lease("export:x_1", 2_000, 15_000).await.unwrap(), "free at once");
    }
}
