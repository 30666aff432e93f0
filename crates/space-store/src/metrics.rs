//! What the metrics scrape reads from the store.

use sqlx::Row;

use crate::{Result, Store};

impl Store {
    /// Sessions of every tenant by state (the state as stored), destroyed ones left out.
    pub async fn count_all_sessions_by_state(&self) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query("SELECT state, COUNT(*) FROM sessions WHERE state <> 'destroyed' GROUP BY state")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}
