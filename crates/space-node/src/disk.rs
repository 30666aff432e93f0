//! Session disk limits and what snapshots hold on disk (see `space_storage::quota`).

use space_api::{SandboxId, SessionId, SnapshotId};
use space_node_api::{DiskQuota, DiskUsage};

use crate::{Node, Result, blocking};

static WALKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

impl Node {
    /// Charges what `sandbox` writes to `disk`'s session, with its cap. Call before the
    /// sandbox is handed out.
    pub async fn limit_disk(&self, sandbox: &SandboxId, disk: &DiskQuota) -> Result<()> {
        let (pool, sbx, disk) = (self.pool.clone(), sandbox.clone(), disk.clone());
        blocking(move || crate::charge(&pool, &sbx, Some(&disk))).await
    }

    /// What `session` is charged for on this node's disk (see
    /// `space_storage::Pool::session_disk_usage`).
    /// Full snapshots' process images, outside the pool, are counted too.
    pub fn disk_usage(&self, session: &SessionId) -> Result<DiskUsage> {
        let used = self.pool.session_disk_usage(session)?.unwrap_or(0);
        let images = self.pool.session_images_dir(session);
        let images = if images.exists() { space_storage::apparent_size(&images)? } else { 0 };
        Ok(DiskUsage { used_bytes: used + images, enforced: self.pool.disk_limits_enforced() })
    }

    /// Bytes only this snapshot holds on disk: what deleting it frees (its process images
    /// included). Walks every file: slow for large trees.
    pub async fn snapshot_exclusive_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        // One walk at a time: each reads every file of a snapshot.
        let _turn = WALKS.acquire().await.map_err(|e| crate::NodeError::Internal(e.to_string()))?;
        let root = self.pool.snapshot_dir(session, snapshot).join("rootfs");
        let images = self.pool.snapshot_images_dir(session, snapshot);
        blocking(move || {
            let files = space_storage::exclusive_size(&root)?;
            let images = match images.exists() {
                true => space_storage::apparent_size(&images)?,
                false => 0,
            };
            Ok(files + images)
        })
        .await
    }
}

/// Puts `sandbox`'s root in `disk`'s session group (nothing for a pod no session has yet).
pub(crate) fn charge(pool: &space_storage::Pool, sandbox: &SandboxId, disk: Option<&DiskQuota>) -> Result<()> {
    if let Some(disk) = disk {
        pool.limit_session_disk(sandbox, &disk.session, disk.limit_bytes)?;
    }
    Ok(())
}
