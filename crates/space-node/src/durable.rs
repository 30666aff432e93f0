//! Snapshots to and from the node's blob store (the volume manager, `space-volume`). A
//! snapshot is exported while its session runs on: nothing of it changes once taken.

use std::collections::HashSet;
use std::time::Duration;

use space_api::{SessionId, SnapshotId};
use space_node_api::{BlobSweep, SnapshotExport, SnapshotKey};

use crate::{Node, NodeError, Result};

impl Node {
    /// Stores the snapshot whole in the blob store (encrypted with `key` when given); says
    /// what it became.
    pub async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        key: Option<&SnapshotKey>,
    ) -> Result<SnapshotExport> {
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        Ok(volumes.export_snapshot(session, snapshot, None, key).await?)
    }

    /// Makes the snapshot here from its export, unless it is here already.
    pub async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
    ) -> Result<()> {
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        volumes.import_snapshot(session, snapshot, export, key).await?;
        tracing::info!(%session, %snapshot, bytes = export.size(), "snapshot imported from the blob store");
        Ok(())
    }

    /// Deletes the blob store's objects that `keep` does not name, once `min_age` old, for
    /// at most `budget`.
    pub async fn sweep_blobs(&self, keep: &HashSet<String>, min_age: Duration, budget: Duration) -> Result<BlobSweep> {
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        let swept = volumes.sweep_blobs(keep, min_age, budget).await?;
        let (deleted, bytes, complete) = (swept.deleted_objects, swept.deleted_bytes, swept.complete);
        tracing::info!(deleted, bytes, complete, "blob store swept");
        Ok(swept)
    }
}
