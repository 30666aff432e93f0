//! The control plane's record of its nodes: each renews a lease with a heartbeat, and one
//! whose lease ran out is `lost` (docs/control-plane.md, "Nodes"). `space serve` has one
//! node, in its own process; its heartbeats come from this process too.

use std::time::Duration;

use space_api::{Node, NodeCapacity, NodeList, NodeState, TemplatePool};
use space_store::{NodeHeartbeat, NodeRecord, StoreError, now_ms};

use crate::AppState;

/// How long a heartbeat keeps a node's lease: a node not heard of for this long is lost.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a node beats: three chances per lease.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// Records a heartbeat of this control plane's node now.
pub async fn heartbeat(state: &AppState) -> Result<(), StoreError> {
    let pool = serde_json::to_string(&state.node.pool_status().await.templates).unwrap_or_else(|_| "[]".into());
    let capacity = state.node.capacity().await;
    let beat = NodeHeartbeat {
        id: state.node_id.clone(),
        address: None,
        version: env!("CARGO_PKG_VERSION").into(),
        cpus: capacity.cpus,
        memory_mib: capacity.memory_mib,
        pool,
    };
    state.store.heartbeat_node(&beat, now_ms(), crate::replicas::lease_ms(LEASE)).await
}

/// Beats every [`HEARTBEAT_EVERY`] from now on, the first one period from now (start-up wrote
/// one already). A beat that fails (the database cannot answer) is logged; the next one tries
/// again.
pub fn spawn_heartbeats(state: AppState) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT_EVERY, HEARTBEAT_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(e) = heartbeat(&state).await {
                tracing::warn!(error = %e, "node heartbeat");
            }
        }
    });
}

/// Every node, as the API shows it at `now`.
pub async fn list(state: &AppState, now: i64) -> Result<NodeList, StoreError> {
    let sessions = state.store.sessions_per_node().await?;
    let nodes = state.store.nodes().await?;
    let view = |record: NodeRecord| {
        let state = if record.lost(now) { NodeState::Lost } else { NodeState::Ready };
        let sessions = sessions.get(&record.heartbeat.id).copied().unwrap_or(0);
        let pool: Vec<TemplatePool> = serde_json::from_str(&record.heartbeat.pool).unwrap_or_default();
        let beat = record.heartbeat;
        Node {
            capacity: NodeCapacity { cpus: beat.cpus, memory_mib: beat.memory_mib },
            id: beat.id,
            state,
            address: beat.address,
            version: beat.version,
            sessions,
            pool,
            joined_at: record.joined_at,
            heartbeat_at: record.heartbeat_at,
            lease_expires_at: record.lease_expires_at,
        }
    };
    Ok(NodeList { nodes: nodes.into_iter().map(view).collect() })
}
