//! Snapshots to and from the node's blob store (the volume manager, `space-volume`). A
//! snapshot is exported while its session runs on: nothing of it changes once taken.

use std::collections::HashSet;
use std::time::Duration;

use space_api::durable::TemplateExport;
use space_api::{SessionId, SnapshotId, TemplateInfo};
use space_node_api::{BlobSweep, ParentDisk, SnapshotExport, SnapshotKey};

use crate::{Node, NodeError, Result};

impl Node {
    /// Stores the snapshot in the blob store (encrypted with `key` when given), its root
    /// against `parent` when this node holds that root; says what it became.
    pub async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<SnapshotExport> {
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        Ok(volumes.export_snapshot(session, snapshot, parent, key).await?)
    }

    /// Makes the snapshot here from its export (with the ancestors of its root this node
    /// lacks, from `parents`), unless it is here already.
    pub async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
        parents: &[ParentDisk],
    ) -> Result<()> {
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        volumes.import_snapshot(session, snapshot, export, key, parents).await?;
        tracing::info!(%session, %snapshot, bytes = export.size(), parent = ?export.disk.parent,
            "snapshot imported from the blob store");
        Ok(())
    }

    /// Stores version `version` of global template `name` in the blob store; says what it
    /// became. A tenant's template is refused.
    pub async fn export_template(&self, name: &str, version: u64) -> Result<TemplateExport> {
        // A tenant's own template (its name holds the tenant's scope and `..`) stays here: the
        // blob store holds no tenant data in clear.
        if name.contains("..") {
            return Err(NodeError::Internal(format!("{name} is a tenant's template, which is never exported")));
        }
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        let info = self.pool.templates().get(name, version)?;
        Ok(volumes.export_template(&info).await?)
    }

    /// Makes the template `export` describes here, its very version, unless it is here already.
    pub async fn import_template_export(&self, export: &TemplateExport) -> Result<TemplateInfo> {
        let volumes = self.volumes.as_ref().ok_or(NodeError::NoBlobStore)?;
        let info = volumes.import_template(export).await?;
        tracing::info!(template = %format!("{}@{}", info.name, info.version), bytes = export.stream.size,
            "template imported from the blob store");
        Ok(info)
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
