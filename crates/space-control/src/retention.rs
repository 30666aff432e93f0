//! Retention in the blob store (docs/control-plane.md, "Retention of exported objects"): an
//! object stays while a recorded export names it, so deleting a snapshot (by hand, by the
//! scheduler's retention, with its session) frees the objects only it named. A sweep lists
//! the store and deletes what no export names.
//!
//! Objects are content-addressed and shared: an export finding an object stored already does
//! not store it again, and names it only once it is recorded. So a sweep must not run while
//! any export is under way. Each export holds a lease of its own, a sweep holds the one lease
//! for the cluster, and each side takes its own lease before it looks for the other's:
//! whichever looks second sees the first, so the two never overlap. A sweep that finds an
//! export puts itself off; an export that finds a sweep waits for it to end. Every lease is
//! held under a holder name of its own (two exports or sweeps of one replica are two holders)
//! and renewed while its work runs.

use std::collections::HashSet;
use std::time::Duration;

use space_api::SnapshotId;
use space_api::durable::{BlobSweep, BlobSweepReport};
use space_api::error::ErrorCode;
use space_node_api::NodeError;
use space_store::now_ms;

use crate::AppState;
use crate::error::{AppError, AppResult};
use crate::held::Held;

/// The lease a sweep holds, one for the cluster.
const SWEEP_LEASE: &str = "blob-sweep";
/// How long a sweep's lease lasts unrenewed: a replica that dies during a sweep holds exports
/// off this long.
const SWEEP_LEASE_MS: i64 = 2 * 60 * 1000;
/// How long a node deletes for in one sweep: less than [`SWEEP_LEASE_MS`], so a node whose
/// replica died mid-sweep has stopped before the lease runs out and exports go on.
const SWEEP_BUDGET: Duration = Duration::from_secs(60);
/// What the leases of exports are named after (each adds its snapshot and a token).
const EXPORT_LEASE: &str = "blob-export:";
/// How long an export's lease lasts unrenewed: a replica that dies during an export holds
/// sweeps off this long.
const EXPORT_LEASE_MS: i64 = 5 * 60 * 1000;
/// Objects younger than this are never deleted. It covers objects an export stored itself
/// when that export lost its lease (its replica stalled past it), not objects it found stored
/// already: those only the leases protect.
const MIN_AGE: Duration = Duration::from_secs(15 * 60);
/// How often each replica tries a sweep (one runs at a time in the cluster).
const EVERY: Duration = Duration::from_secs(60 * 60);
/// How often an export waiting for a sweep looks again.
const WAIT_STEP: Duration = Duration::from_millis(200);

/// An export under way: held from before the node stores anything until the export is
/// recorded (or failed). [`Exporting::end`] gives it up.
pub struct Exporting(Held);

/// Takes a lease for an export of `snapshot`, then waits for any sweep to end.
pub async fn exporting(state: &AppState, snapshot: &SnapshotId) -> AppResult<Exporting> {
    let name = format!("{EXPORT_LEASE}{snapshot}:{}", hex::encode(rand::random::<[u8; 8]>()));
    let held = Held::take(state, &name, EXPORT_LEASE_MS).await?.ok_or_else(|| {
        AppError::new(ErrorCode::Internal, format!("the lease {name} is held already; it names one export"))
    })?;
    loop {
        match state.store.lease_holder(SWEEP_LEASE, now_ms()).await {
            Ok(None) => return Ok(Exporting(held)),
            Ok(Some(_)) => tokio::time::sleep(WAIT_STEP).await,
            Err(e) => {
                held.release().await;
                return Err(e.into());
            }
        }
    }
}

impl Exporting {
    pub async fn end(self) {
        self.0.release().await;
    }
}

/// Sweeps the blob store unless an export is under way or another sweep runs: deletes every
/// object at least [`MIN_AGE`] old that no recorded export names. Runs on a task of its own,
/// so a caller that goes away does not leave the sweep's lease behind.
pub async fn sweep(state: &AppState) -> AppResult<BlobSweepReport> {
    let state = state.clone();
    tokio::spawn(async move {
        let Some(held) = Held::take(&state, SWEEP_LEASE, SWEEP_LEASE_MS).await? else {
            return Ok(put_off("another sweep of the blob store is under way"));
        };
        let swept = sweep_held(&state).await;
        held.release().await;
        swept
    })
    .await
    .map_err(|e| AppError::new(ErrorCode::Internal, format!("the sweep stopped: {e}")))?
}

async fn sweep_held(state: &AppState) -> AppResult<BlobSweepReport> {
    let exports = state.store.leases_held(EXPORT_LEASE, now_ms()).await?;
    if exports > 0 {
        return Ok(put_off(&format!("{exports} snapshot export(s) under way; sweep again once they end")));
    }
    let keep: HashSet<String> = state
        .store
        .all_snapshot_exports()
        .await?
        .iter()
        .flat_map(|export| export.blobs().map(|blob| blob.sha256.clone()))
        .collect();
    let lost = crate::placement::lost_nodes(state).await?;
    // The nodes share one blob store: any node that answers sweeps it.
    let Some((_, node)) = state.nodes.iter().find(|(id, _)| !lost.contains(*id)) else {
        return Ok(put_off("no node answers to sweep the blob store"));
    };
    match node.sweep_blobs(&keep, MIN_AGE, SWEEP_BUDGET).await {
        Ok(objects) => Ok(BlobSweepReport { swept: true, put_off: None, objects }),
        Err(NodeError::NoBlobStore) => {
            Ok(put_off(&format!("node {} has no blob store (--blob-store)", node.node_id())))
        }
        Err(e) => Err(AppError::new(
            ErrorCode::BlobStoreUnavailable,
            format!("the blob store could not be swept through node {}: {e}", node.node_id()),
        )),
    }
}

fn put_off(why: &str) -> BlobSweepReport {
    BlobSweepReport { swept: false, put_off: Some(why.to_owned()), objects: BlobSweep::default() }
}

/// Tries a sweep every [`EVERY`] on a task of its own.
pub fn spawn(state: AppState) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(EVERY).await;
            match sweep(&state).await {
                Ok(report) if !report.swept => {
                    tracing::debug!(why = report.put_off.as_deref().unwrap_or(""), "blob sweep put off")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e.0.message, "blob store sweep"),
            }
        }
    });
}
