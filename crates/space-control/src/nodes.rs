//! The nodes a control plane drives, and its record of them: each renews a lease with a
//! heartbeat, and one whose lease ran out is `lost` (docs/control-plane.md, "Nodes").
//! `space serve` has one node, in its own process; its heartbeats come from this process too.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use space_api::error::ErrorCode;
use space_api::{Node, NodeCapacity, NodeList, NodeState, Session, TemplatePool};
use space_node_api::NodeApi;
use space_store::{NodeHeartbeat, NodeRecord, StoreError, now_ms};

use crate::AppState;
use crate::error::{AppError, AppResult};

/// The nodes this control plane drives, by id; which implementation each is, nothing here
/// knows. Cheap to clone.
#[derive(Clone)]
pub struct Nodes(Arc<BTreeMap<String, Arc<dyn NodeApi>>>);

/// Why a set of nodes cannot be driven.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    /// Sandboxes would be recorded under either.
    #[error("two nodes have the id {0}: give each node its own name")]
    Duplicate(String),
    #[error("a control plane needs at least one node")]
    Empty,
}

impl Nodes {
    pub fn new(nodes: Vec<Arc<dyn NodeApi>>) -> Result<Nodes, NodesError> {
        let mut by_id = BTreeMap::new();
        for node in nodes {
            let id = node.node_id();
            if by_id.insert(id.clone(), node).is_some() {
                return Err(NodesError::Duplicate(id));
            }
        }
        if by_id.is_empty() {
            return Err(NodesError::Empty);
        }
        Ok(Nodes(Arc::new(by_id)))
    }

    /// Node `id`, if this control plane drives it.
    pub fn find(&self, id: &str) -> Option<&Arc<dyn NodeApi>> {
        self.0.get(id)
    }

    /// Node `id`, or the error that says this control plane does not drive it.
    pub fn get(&self, id: &str) -> AppResult<Arc<dyn NodeApi>> {
        self.find(id).cloned().ok_or_else(|| {
            AppError::new(
                ErrorCode::SandboxUnavailable,
                format!("node {id} is not driven by this control plane; start it with --node for that node's address"),
            )
        })
    }

    /// The node `session` is placed on (where its sandboxes run and its snapshots are).
    pub fn of(&self, session: &Session) -> AppResult<Arc<dyn NodeApi>> {
        match &session.node {
            Some(id) => self.get(id),
            None => Err(AppError::new(
                ErrorCode::Conflict,
                format!("session {} is not placed on a node yet; try again once it is running", session.id),
            )),
        }
    }

    /// Every node, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn NodeApi>)> {
        self.0.iter().map(|(id, node)| (id.as_str(), node))
    }

    /// The first node by id: it answers what every node answers alike (the built-in
    /// templates, the runtimes a cluster offers: its nodes run one build of `space`).
    pub fn first(&self) -> &Arc<dyn NodeApi> {
        self.0.values().next().expect("Nodes::new refuses an empty set")
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How long a heartbeat keeps a node's lease: a node not heard of for this long is lost.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a node beats: three chances per lease.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// Records a heartbeat of each of this control plane's nodes now, all at once: one that does
/// not answer within a beat's period delays no other. The first failure of the store is
/// returned after every node was tried.
pub async fn heartbeat(state: &AppState) -> Result<(), StoreError> {
    let beats = state.nodes.iter().map(|(id, node)| async move {
        match tokio::time::timeout(HEARTBEAT_EVERY, beat(state, id, node.as_ref())).await {
            Ok(beaten) => beaten,
            Err(_) => {
                tracing::warn!(node = %id, "the node did not answer within a heartbeat's period: no heartbeat for it");
                Ok(())
            }
        }
    });
    futures::future::join_all(beats).await.into_iter().find(Result::is_err).unwrap_or(Ok(()))
}

/// One node's heartbeat, if it answers; one that does not is not beaten for (and is lost once
/// its lease runs out).
async fn beat(state: &AppState, id: &str, node: &dyn NodeApi) -> Result<(), StoreError> {
    let capacity = match node.capacity().await {
        Ok(capacity) => capacity,
        Err(e) => {
            tracing::warn!(node = %id, error = %e, "the node does not answer: no heartbeat for it");
            return Ok(());
        }
    };
    let pool = serde_json::to_string(&node.pool_status().await.templates).unwrap_or_else(|_| "[]".into());
    let beat = NodeHeartbeat {
        id: id.to_owned(),
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
    Ok(NodeList { nodes: nodes.into_iter().map(|record| view(record, &sessions, now)).collect() })
}

/// Node `id` as the API shows it at `now`, if it ever joined.
pub async fn one(state: &AppState, id: &str, now: i64) -> Result<Option<Node>, StoreError> {
    Ok(list(state, now).await?.nodes.into_iter().find(|n| n.id == id))
}

fn view(record: NodeRecord, sessions: &HashMap<String, u64>, now: i64) -> Node {
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
        cordoned: record.cordoned,
        joined_at: record.joined_at,
        heartbeat_at: record.heartbeat_at,
        lease_expires_at: record.lease_expires_at,
    }
}

#[cfg(test)]
mod tests {
    use space_node_sim::{SimConfig, SimNode};

    use super::*;

    fn sim(id: &str) -> Arc<dyn NodeApi> {
        SimNode::new(SimConfig { node_id: id.into(), ..SimConfig::default() }).api()
    }

    #[test]
    fn nodes_are_found_by_id_and_two_with_one_id_or_none_are_refused() {
        let nodes = Nodes::new(vec![sim("b"), sim("a")]).unwrap();
        assert_eq!(nodes.first().node_id(), "a", "the first by id");
        assert_eq!(nodes.iter().map(|(id, _)| id).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(nodes.get("b").unwrap().node_id(), "b");
        let unknown = nodes.get("c").err().unwrap();
        assert_eq!(unknown.0.code, ErrorCode::SandboxUnavailable);
        assert!(unknown.0.message.contains("node c is not driven by this control plane"), "{}", unknown.0.message);
        assert!(matches!(Nodes::new(vec![sim("a"), sim("a")]), Err(NodesError::Duplicate(id)) if id == "a"));
        assert!(matches!(Nodes::new(vec![]), Err(NodesError::Empty)));
    }
}
