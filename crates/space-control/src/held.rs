//! Leases held by one piece of work (an export, a sweep, a suspend) rather than by a replica:
//! each under a holder name of its own, so two such works of one replica are two holders,
//! and renewed while the work runs. A replica that dies stops renewing; the lease runs out and
//! whoever looks for it next knows the work was abandoned.

use std::time::Duration;

use space_store::{Store, now_ms};
use tokio::task::JoinHandle;

use crate::AppState;
use crate::error::AppResult;

/// What separates the replica from the token in a holder name (`REPLICA#TOKEN`).
const HOLDER_SEPARATOR: char = '#';

/// The replica a [`Held`] lease's holder name was made by, if it is one.
pub(crate) fn replica_of(holder: &str) -> Option<&str> {
    holder.split_once(HOLDER_SEPARATOR).map(|(replica, _)| replica)
}

/// A lease held under a holder name of its own, renewed every third of its length until it
/// is released. Dropped unreleased (its task cancelled), it stops being renewed and runs out.
pub(crate) struct Held {
    store: Store,
    name: String,
    renewing: JoinHandle<()>,
}

impl Held {
    /// Takes lease `name`; `None` if another holder has it.
    pub(crate) async fn take(state: &AppState, name: &str, lease_ms: i64) -> AppResult<Option<Held>> {
        let holder = format!("{}{HOLDER_SEPARATOR}{}", state.store.replica(), hex::encode(rand::random::<[u8; 8]>()));
        let store = state.store.clone().as_replica(&holder);
        if !store.acquire_lease(name, now_ms(), lease_ms).await? {
            return Ok(None);
        }
        let (renewer, lease) = (store.clone(), name.to_owned());
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(lease_ms as u64 / 3)).await;
                match renewer.acquire_lease(&lease, now_ms(), lease_ms).await {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(%lease, "a lease ran out before it was renewed"),
                    Err(e) => tracing::warn!(%lease, error = %e, "a lease could not be renewed"),
                }
            }
        });
        Ok(Some(Held { store, name: name.to_owned(), renewing }))
    }

    pub(crate) async fn release(self) {
        self.renewing.abort();
        if let Err(e) = self.store.release_lease(&self.name).await {
            tracing::warn!(lease = %self.name, error = %e, "a lease stays until it runs out");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renewing.abort();
    }
}
