//! Nodes and their leases. A node renews its lease with every heartbeat; one whose lease has
//! run out is lost (docs/control-plane.md, "Nodes").

use std::collections::HashMap;

use sqlx::Row;

use crate::{Result, Store, StoreError};

/// What a node says of itself in a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHeartbeat {
    pub id: String,
    /// Where the control plane reaches it (`None`: in the control plane's process).
    pub address: Option<String>,
    pub version: String,
    pub cpus: u32,
    pub memory_mib: u64,
    /// Its warm pool, as JSON (`space_api::TemplatePool` list).
    pub pool: String,
}

/// A node as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub heartbeat: NodeHeartbeat,
    /// Unix times in milliseconds.
    pub joined_at: i64,
    pub heartbeat_at: i64,
    pub lease_expires_at: i64,
    /// Takes no new sessions (`space node cordon`).
    pub cordoned: bool,
}

impl NodeRecord {
    /// Whether its lease has run out at `now`.
    pub fn lost(&self, now: i64) -> bool {
        now >= self.lease_expires_at
    }
}

fn node_from_row(row: &sqlx::any::AnyRow) -> Result<NodeRecord> {
    let count = |i, what: &str| {
        u64::try_from(row.get::<i64, _>(i)).map_err(|_| StoreError::Corrupt(format!("a node's {what} is negative")))
    };
    Ok(NodeRecord {
        heartbeat: NodeHeartbeat {
            id: row.get(0),
            address: row.get(1),
            version: row.get(2),
            cpus: u32::try_from(count(3, "cpus")?).map_err(|_| StoreError::Corrupt("a node's cpus".into()))?,
            memory_mib: count(4, "memory")?,
            pool: row.get(5),
        },
        joined_at: row.get(6),
        heartbeat_at: row.get(7),
        lease_expires_at: row.get(8),
        cordoned: row.get::<i64, _>(9) != 0,
    })
}

impl Store {
    /// Records `node`'s heartbeat at `now` and renews its lease until `now + lease_ms`; a node
    /// not known yet joins.
    pub async fn heartbeat_node(&self, node: &NodeHeartbeat, now: i64, lease_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO nodes (id, address, version, cpus, memory_mib, pool, joined_at, heartbeat_at, lease_expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, version = excluded.version,
                 cpus = excluded.cpus, memory_mib = excluded.memory_mib, pool = excluded.pool,
                 heartbeat_at = excluded.heartbeat_at, lease_expires_at = excluded.lease_expires_at",
        )
        .bind(&node.id)
        .bind(&node.address)
        .bind(&node.version)
        .bind(i64::from(node.cpus))
        .bind(i64::try_from(node.memory_mib).unwrap_or(i64::MAX))
        .bind(&node.pool)
        .bind(now)
        .bind(now.saturating_add(lease_ms))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Every node that ever joined, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let rows = sqlx::query(
            "SELECT id, address, version, cpus, memory_mib, pool, joined_at, heartbeat_at, lease_expires_at, cordoned
             FROM nodes ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(node_from_row).collect()
    }

    /// Cordons node `id` (or lifts it); `false` if no such node ever joined. A heartbeat
    /// leaves it as it is.
    pub async fn set_node_cordoned(&self, id: &str, cordoned: bool) -> Result<bool> {
        let done = sqlx::query("UPDATE nodes SET cordoned = $1 WHERE id = $2")
            .bind(i64::from(cordoned))
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// How many sessions (not destroyed) have their sandbox on each node.
    pub async fn sessions_per_node(&self) -> Result<HashMap<String, u64>> {
        let rows = sqlx::query(
            "SELECT b.node_id, COUNT(*) FROM sessions s JOIN sandboxes b ON b.id = s.sandbox_id
             WHERE s.state <> 'destroyed' GROUP BY b.node_id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|row| (row.get::<String, _>(0), row.get::<i64, _>(1).max(0) as u64)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store;

    fn heartbeat(id: &str, cpus: u32) -> NodeHeartbeat {
        NodeHeartbeat {
            id: id.into(),
            address: None,
            version: "0.1.0".into(),
            cpus,
            memory_mib: 24_000,
            pool: "[]".into(),
        }
    }

    #[tokio::test]
    async fn a_heartbeat_renews_the_lease_and_a_node_without_one_is_lost() {
        let (store, _dir) = test_store().await;
        store.heartbeat_node(&heartbeat("nod_a", 2), 1_000, 15_000).await.unwrap();
        store.heartbeat_node(&heartbeat("nod_b", 4), 1_000, 15_000).await.unwrap();
        // b beats again later, with what it has now; a does not.
        store.heartbeat_node(&heartbeat("nod_b", 8), 10_000, 15_000).await.unwrap();

        let nodes = store.nodes().await.unwrap();
        let [a, b] = nodes.as_slice() else { panic!("{nodes:?}") };
        assert_eq!((a.heartbeat.id.as_str(), a.joined_at, a.lease_expires_at), ("nod_a", 1_000, 16_000));
        assert_eq!((b.heartbeat.cpus, b.joined_at, b.heartbeat_at, b.lease_expires_at), (8, 1_000, 10_000, 25_000));
        assert!(!a.lost(15_999) && a.lost(16_000));
        assert!(!b.lost(16_000));
    }

    #[tokio::test]
    async fn a_cordon_holds_across_heartbeats_until_it_is_lifted() {
        let (store, _dir) = test_store().await;
        store.heartbeat_node(&heartbeat("nod_a", 2), 1_000, 15_000).await.unwrap();
        assert!(!store.nodes().await.unwrap()[0].cordoned);
        assert!(store.set_node_cordoned("nod_a", true).await.unwrap());
        store.heartbeat_node(&heartbeat("nod_a", 2), 2_000, 15_000).await.unwrap();
        assert!(store.nodes().await.unwrap()[0].cordoned, "a heartbeat keeps the cordon");
        assert!(store.set_node_cordoned("nod_a", false).await.unwrap());
        assert!(!store.nodes().await.unwrap()[0].cordoned);
        assert!(!store.set_node_cordoned("nod_unknown", true).await.unwrap(), "no such node");
    }
}
