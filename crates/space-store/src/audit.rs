//! The gateway's audit events.

use space_api::SessionId;
use space_api::egress::{AuditDecision, AuditEvent};
use sqlx::Row;

use crate::{Result, Store, StoreError, parse};

impl Store {
    /// Inserts `events` in one transaction.
    pub async fn insert_audit_events(&self, events: &[AuditEvent]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        for e in events {
            sqlx::query(
                "INSERT INTO audit_events (session_id, time, decision, reason, protocol, host, port, method, path, credential, bytes_sent, bytes_received)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(e.session_id.as_str())
            .bind(e.time)
            .bind(e.decision.as_str())
            .bind(&e.reason)
            .bind(&e.protocol)
            .bind(&e.host)
            .bind(i64::from(e.port))
            .bind(&e.method)
            .bind(&e.path)
            .bind(&e.credential)
            .bind(e.bytes_sent.min(i64::MAX as u64) as i64)
            .bind(e.bytes_received.min(i64::MAX as u64) as i64)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Deletes up to `limit` events older than `before` (ms since the epoch), the oldest
    /// first; returns how many went. Small batches keep each write transaction short.
    pub async fn prune_audit_events(&self, before: i64, limit: u32) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let deleted = sqlx::query(
            "DELETE FROM audit_events WHERE seq IN
               (SELECT seq FROM audit_events WHERE time < $1 ORDER BY time LIMIT $2)",
        )
        .bind(before)
        .bind(i64::from(limit))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }

    /// The session's latest `limit` audit events, oldest first.
    pub async fn audit_events(&self, session: &SessionId, limit: u32) -> Result<Vec<AuditEvent>> {
        let rows = sqlx::query(
            "SELECT session_id, time, decision, reason, protocol, host, port, method, path, credential, bytes_sent, bytes_received
             FROM audit_events WHERE session_id = $1 ORDER BY time DESC, seq DESC LIMIT $2",
        )
        .bind(session.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let mut events = rows
            .iter()
            .map(|r| {
                let decision: &str = r.get(2);
                Ok(AuditEvent {
                    session_id: parse("session id", r.get::<&str, _>(0))?,
                    time: r.get(1),
                    decision: decision.parse::<AuditDecision>().map_err(StoreError::Corrupt)?,
                    reason: r.get(3),
                    protocol: r.get(4),
                    host: r.get(5),
                    port: r.get::<i64, _>(6) as u16,
                    method: r.get(7),
                    path: r.get(8),
                    credential: r.get(9),
                    bytes_sent: r.get::<i64, _>(10) as u64,
                    bytes_received: r.get::<i64, _>(11) as u64,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        events.reverse();
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store;

    fn event(session: &SessionId, time: i64) -> AuditEvent {
        AuditEvent::allowed(session.clone(), time, "https", "h.com", 443)
    }

    #[tokio::test]
    async fn pruning_deletes_only_old_events_in_batches() {
        let (store, _dir) = test_store().await;
        let (a, b) = (SessionId::generate(), SessionId::generate());
        // Inserted out of time order, as a long connection's event is written when it ends.
        let times = [500, 100, 900, 300, 1000, 200];
        let events: Vec<_> =
            times.iter().enumerate().map(|(i, t)| event(if i % 2 == 0 { &a } else { &b }, *t)).collect();
        store.insert_audit_events(&events).await.unwrap();
        assert_eq!(store.prune_audit_events(600, 2).await.unwrap(), 2);
        assert_eq!(store.prune_audit_events(600, 2).await.unwrap(), 2);
        assert_eq!(store.prune_audit_events(600, 2).await.unwrap(), 0);
        let times_of = |events: Vec<AuditEvent>| events.iter().map(|e| e.time).collect::<Vec<_>>();
        assert_eq!(times_of(store.audit_events(&a, 10).await.unwrap()), vec![900, 1000]);
        assert!(store.audit_events(&b, 10).await.unwrap().is_empty());
    }
}
