//! Template versions deleted through the API. Templates live on the nodes; the store keeps
//! only which versions were deleted, so that a node that missed a delete (it was down) has it
//! finished when a control plane starts, instead of giving the version back to the others.

use sqlx::Row;

use crate::{Result, Store, now_ms};

impl Store {
    /// Records that template `name@version` was deleted.
    pub async fn record_template_deleted(&self, name: &str, version: u64) -> Result<()> {
        sqlx::query(
            "INSERT INTO deleted_templates (name, version, deleted_at) VALUES ($1, $2, $3)
             ON CONFLICT (name, version) DO NOTHING",
        )
        .bind(name)
        .bind(i64::try_from(version).unwrap_or(i64::MAX))
        .bind(now_ms())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Forgets that `name@version` was deleted: a version of that number was made again.
    pub async fn forget_template_deleted(&self, name: &str, version: u64) -> Result<()> {
        sqlx::query("DELETE FROM deleted_templates WHERE name = $1 AND version = $2")
            .bind(name)
            .bind(i64::try_from(version).unwrap_or(i64::MAX))
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Every version deleted and not made again, as `(name, version)`.
    pub async fn deleted_templates(&self) -> Result<Vec<(String, u64)>> {
        let rows = sqlx::query("SELECT name, version FROM deleted_templates ORDER BY name, version")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|row| (row.get::<String, _>(0), u64::try_from(row.get::<i64, _>(1)).unwrap_or(0))).collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::test_store;

    #[tokio::test]
    async fn deleted_versions_are_kept_until_made_again() {
        let (store, _dir) = test_store().await;
        store.record_template_deleted("web", 2).await.unwrap();
        store.record_template_deleted("web", 2).await.unwrap();
        store.record_template_deleted("api", 1).await.unwrap();
        assert_eq!(store.deleted_templates().await.unwrap(), vec![("api".into(), 1), ("web".into(), 2)]);
        store.forget_template_deleted("web", 2).await.unwrap();
        assert_eq!(store.deleted_templates().await.unwrap(), vec![("api".to_owned(), 1)]);
    }
}
