//! Ports of a session opened to callers without its tenant's API key.

use space_api::{SessionId, TenantId};
use sqlx::Row;

use crate::sessions::insert_event;
use crate::{Result, Store, StoreError, now_ms, parse};

/// A port opened by token, or to anyone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRecord {
    /// The tenant of the port's session.
    pub tenant_id: TenantId,
    pub port: u16,
    pub public: bool,
    /// SHA-256 (hex) of the port's token.
    pub token_hash: String,
    /// Unix time in milliseconds.
    pub created_at: i64,
}

const SELECT: &str = "SELECT p.port, p.public, p.token_hash, p.created_at, s.tenant_id FROM session_ports p \
     JOIN sessions s ON s.id = p.session_id";

fn record(row: &sqlx::any::AnyRow) -> Result<PortRecord> {
    Ok(PortRecord {
        port: row.get::<i64, _>(0).try_into().map_err(|_| StoreError::Corrupt("a port out of range".into()))?,
        public: row.get::<i64, _>(1) != 0,
        token_hash: row.get(2),
        created_at: row.get(3),
        tenant_id: parse("tenant id", row.get::<&str, _>(4))?,
    })
}

impl Store {
    /// Opens `port` of `session` with a new token (replacing the one it had) and records it
    /// in the session's events, atomically.
    pub async fn open_port(
        &self,
        session: &SessionId,
        port: u16,
        public: bool,
        token_hash: &str,
    ) -> Result<PortRecord> {
        let now = now_ms();
        let mut tx = self.write_tx().await?;
        let tenant: String = sqlx::query_scalar("SELECT tenant_id FROM sessions WHERE id = $1")
            .bind(session.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::Conflict(format!("session {session} does not exist")))?;
        sqlx::query(
            "INSERT INTO session_ports (session_id, port, public, token_hash, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (session_id, port) DO UPDATE SET public = excluded.public, token_hash = excluded.token_hash, \
             created_at = excluded.created_at",
        )
        .bind(session.as_str())
        .bind(i64::from(port))
        .bind(i64::from(public))
        .bind(token_hash)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let who = if public { "anyone" } else { "holders of its token" };
        insert_event(&mut tx, session, "port_opened", None, None, Some(&format!("port {port} opened to {who}")))
            .await?;
        tx.commit().await?;
        let tenant_id = parse("tenant id", &tenant)?;
        Ok(PortRecord { tenant_id, port, public, token_hash: token_hash.to_owned(), created_at: now })
    }

    /// The opened port `port` of `session`, if it is.
    pub async fn port(&self, session: &SessionId, port: u16) -> Result<Option<PortRecord>> {
        let row = sqlx::query(&format!("{SELECT} WHERE p.session_id = $1 AND p.port = $2"))
            .bind(session.as_str())
            .bind(i64::from(port))
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(record).transpose()
    }

    /// Every opened port of `session`, by number.
    pub async fn ports(&self, session: &SessionId) -> Result<Vec<PortRecord>> {
        let rows = sqlx::query(&format!("{SELECT} WHERE p.session_id = $1 ORDER BY p.port"))
            .bind(session.as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record).collect()
    }

    /// Closes `port` of `session` to all but its tenant's keys; whether it was open.
    pub async fn close_port(&self, session: &SessionId, port: u16) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let closed = sqlx::query("DELETE FROM session_ports WHERE session_id = $1 AND port = $2")
            .bind(session.as_str())
            .bind(i64::from(port))
            .execute(&mut *tx)
            .await?
            .rows_affected()
            > 0;
        if closed {
            insert_event(&mut tx, session, "port_closed", None, None, Some(&format!("port {port} closed"))).await?;
        }
        tx.commit().await?;
        Ok(closed)
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_port_opens_with_a_new_token_and_closes() {
        let (store, _dir) = crate::test_store().await;
        let (_, session) = crate::sessions::tests::new_session(&store, "t").await;
        assert_eq!(store.port(&session, 8000).await.unwrap(), None);
        store.open_port(&session, 8000, false, "a").await.unwrap();
        let reopened = store.open_port(&session, 8000, true, "b").await.unwrap();
        assert_eq!(store.port(&session, 8000).await.unwrap(), Some(reopened.clone()));
        assert_eq!(store.ports(&session).await.unwrap(), vec![reopened]);
        assert!(store.close_port(&session, 8000).await.unwrap());
        assert!(!store.close_port(&session, 8000).await.unwrap());
        assert!(store.ports(&session).await.unwrap().is_empty());
        let kinds: Vec<String> = store.events(&session).await.unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds.iter().filter(|k| *k == "port_opened").count(), 2, "{kinds:?}");
        assert!(kinds.contains(&"port_closed".to_owned()), "{kinds:?}");
    }
}
