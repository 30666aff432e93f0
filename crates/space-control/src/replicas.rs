//! Several control replicas over one database (docs/control-plane.md, "Replicas").
//!
//! Each replica has a unique name. It records itself alive with a lease (`replica:NAME`),
//! leases every operation it claims, and renews both every [`HEARTBEAT_EVERY`]: a replica
//! that dies stops renewing, and at their expiry another claims its operations again (each
//! step is idempotent) and counts its unfinished idempotent requests as interrupted.
//!
//! The work that must not run twice at once has a lease of its own: each node's (its
//! recovery, the start of its background work) and the snapshot scheduler's. The replica
//! that holds a node's lease keeps the node; when it dies, the next to take the lease
//! recovers the node's sessions ([`recovery::Mode::TakeOver`]). A node whose process was
//! started again (it answers another incarnation) is taken back the same way by its keeper.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use space_store::{StoreError, now_ms};

use crate::AppState;
use crate::error::AppResult;
use crate::nodes::{HEARTBEAT_EVERY, LEASE};
use crate::recovery;

/// The lease of the replica that keeps node `id`.
pub fn node_lease(id: &str) -> String {
    format!("node:{id}")
}

/// A lease's length as the store takes it (milliseconds).
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Records this replica alive for a lease from now (at start, and with every beat).
pub async fn announce(state: &AppState) -> Result<(), StoreError> {
    state.store.announce_replica(now_ms(), lease_ms(LEASE)).await
}

/// Takes or renews node `id`'s lease; returns whether this replica keeps the node.
pub async fn keep_node(state: &AppState, id: &str) -> Result<bool, StoreError> {
    state.store.acquire_lease(&node_lease(id), now_ms(), lease_ms(LEASE)).await
}

/// Takes or renews the snapshot scheduler's lease, which lasts `tick`'s three times (at
/// least a node lease): returns whether this replica runs the schedule now.
pub async fn run_schedule(state: &AppState, tick: Duration) -> Result<bool, StoreError> {
    let lease = (tick * 3).max(LEASE);
    state.store.acquire_lease("scheduler", now_ms(), lease_ms(lease)).await
}

/// Beats every [`HEARTBEAT_EVERY`] from now on: renews this replica's liveness and its
/// operations' leases, interrupts the idempotent requests of replicas that died, and keeps
/// its nodes (taking one over when its keeper died, or taking it back when its process was
/// started again). `kept` are the nodes this replica keeps now, with their incarnations. A
/// beat the database cannot answer is logged; the next tries again.
pub fn spawn_beats(state: AppState, kept: Vec<(String, Option<String>)>) {
    let incarnations = kept.iter().filter_map(|(id, incarnation)| Some((id.clone(), incarnation.clone()?))).collect();
    let kept = Kept { kept: kept.into_iter().map(|(id, _)| id).collect(), taking: BTreeSet::new(), incarnations };
    let nodes = Arc::new(Mutex::new(kept));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT_EVERY, HEARTBEAT_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for beats in 1u64.. {
            ticks.tick().await;
            if let Err(e) = beat(&state, &nodes).await {
                tracing::warn!(error = %e.0.message, "replica heartbeat");
            }
            if beats.is_multiple_of(SWEEP_LEASES_EVERY) {
                sweep_leases(&state).await;
            }
        }
    });
}

/// Every how many beats the leases that ran out an hour ago are deleted (about hourly).
const SWEEP_LEASES_EVERY: u64 = 3600 / HEARTBEAT_EVERY.as_secs();

/// Deletes the leases that ran out more than an hour ago (see
/// [`space_store::Store::delete_expired_leases`]).
async fn sweep_leases(state: &AppState) {
    match state.store.delete_expired_leases(now_ms() - 3_600_000).await {
        Ok(0) => {}
        Ok(deleted) => tracing::info!(deleted, "deleted leases that ran out an hour ago"),
        Err(e) => tracing::warn!(error = %e, "deleting leases that ran out"),
    }
}

/// The nodes this replica keeps, and those it is taking over (their recovery runs).
struct Kept {
    kept: BTreeSet<String>,
    taking: BTreeSet<String>,
    /// The incarnation each kept node answered when it was last asked.
    incarnations: HashMap<String, String>,
}

fn locked(nodes: &Mutex<Kept>) -> MutexGuard<'_, Kept> {
    // Two sets, each changed in one call: never left half-changed by a panic.
    nodes.lock().unwrap_or_else(|e| e.into_inner())
}

/// One beat. A node whose keeper died is taken over on a task of its own: its recovery may
/// wait minutes for a node that does not answer, and the beats (this replica's leases)
/// must go on meanwhile. A takeover that failed is tried again at a later beat.
async fn beat(state: &AppState, nodes: &Arc<Mutex<Kept>>) -> AppResult<()> {
    // The replica's lease and its operations' are separate rows: a failure to renew the one
    // must not let the others run out.
    if let Err(e) = announce(state).await {
        tracing::warn!(error = %e, "renewing this replica's lease");
    }
    let now = now_ms();
    let running = state.reconciler.running();
    state.store.renew_operation_leases(&running, now.saturating_add(lease_ms(LEASE))).await?;
    let interrupted = state.store.idempotency_interrupt_unfinished(false, now).await?;
    if interrupted > 0 {
        tracing::info!(interrupted, "idempotent requests of a replica that stopped are interrupted");
    }
    for (id, _) in state.nodes.iter() {
        let keeps = keep_node(state, id).await?;
        let mut set = locked(nodes);
        let keeping = set.kept.contains(id) || set.taking.contains(id);
        if keeps && !keeping {
            tracing::info!(node = %id, "the node's keeper stopped: this replica takes the node over");
            set.taking.insert(id.to_owned());
            take_over(state.clone(), nodes.clone(), id.to_owned());
        } else if !keeps && set.kept.remove(id) {
            tracing::warn!(node = %id, "another replica took the node over (this one stalled past its lease)");
        }
    }
    take_back_restarted(state, nodes).await;
    Ok(())
}

/// Asks each kept node its incarnation, all at once and each for at most
/// [`crate::placement::ASK`]: one whose process was started again since it was last asked is
/// recovered as in a takeover (its sandboxes' listeners, its gateway's sessions and its
/// background work went with the old process).
async fn take_back_restarted(state: &AppState, nodes: &Arc<Mutex<Kept>>) {
    let kept: Vec<String> = locked(nodes).kept.iter().cloned().collect();
    let asks = kept.iter().filter_map(|id| Some((id, state.nodes.find(id)?.clone()))).map(|(id, node)| async move {
        let answer = tokio::time::timeout(crate::placement::ASK, node.incarnation()).await;
        (id, answer.ok().and_then(Result::ok))
    });
    for (id, answer) in futures::future::join_all(asks).await {
        let Some(incarnation) = answer else { continue };
        let mut set = locked(nodes);
        let before = set.incarnations.insert(id.clone(), incarnation.clone());
        if before.is_some_and(|before| before != incarnation) && set.kept.remove(id) {
            tracing::info!(node = %id, "the node's process was started again: this replica takes it back");
            set.taking.insert(id.clone());
            take_over(state.clone(), nodes.clone(), id.clone());
        }
    }
}

/// Recovers node `id`'s sessions and starts its background work; the node is kept from then
/// on, or, if that failed, left for a later beat to try again.
fn take_over(state: AppState, nodes: Arc<Mutex<Kept>>, id: String) {
    tokio::spawn(async move {
        // Asked before the recovery: a process started again after it is taken back at a
        // later beat.
        if let Some(node) = state.nodes.find(&id)
            && let Ok(Ok(incarnation)) = tokio::time::timeout(crate::placement::ASK, node.incarnation()).await
        {
            locked(&nodes).incarnations.insert(id.clone(), incarnation);
        }
        let recovered = match recovery::recover_node(&state, &id, recovery::Mode::TakeOver).await {
            // The node may be a process started again, which has forgotten every session's
            // egress: it is handed them again.
            Ok(()) => crate::interrupt::push_egress(&state, &id).await,
            Err(e) => Err(e),
        };
        let mut set = locked(&nodes);
        set.taking.remove(&id);
        match (recovered, state.nodes.get(&id)) {
            (Ok(()), Ok(node)) => {
                node.clone().start_background();
                set.kept.insert(id);
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(node = %id, error = %e.0.message, "taking the node over failed; a later beat tries again")
            }
        }
    });
}
