//! Session disk limits and what snapshots hold on disk (see `space_storage::quota`).

use space_api::{SandboxId, SessionId, SnapshotId};
use space_node_api::DiskUsage;

use crate::{Node, Result, blocking};

impl Node {
    /// Charges what `sandbox` writes to `session` and caps the session's total at
    /// `limit_bytes` (`None`: no cap). Call before the sandbox is handed out.
    pub async fn limit_disk(&self, sandbox: &SandboxId, session: &SessionId, limit_bytes: Option<u64>) -> Result<()> {
        let pool = self.pool.clone();
        let (sbx, ses) = (sandbox.clone(), session.clone());
        blocking(move || Ok(pool.limit_session_disk(&sbx, &ses, limit_bytes)?)).await
    }

    /// What `session` is charged for on this node's disk (see
    /// `space_storage::Pool::session_disk_usage`).
    pub fn disk_usage(&self, session: &SessionId) -> Result<DiskUsage> {
        let used = self.pool.session_disk_usage(session)?;
        Ok(DiskUsage { used_bytes: used.map_or(0, |u| u.used_bytes), enforced: self.pool.disk_limits_enforced() })
    }

    /// Bytes only this snapshot holds on disk: what deleting it frees (its process images
    /// included). Walks every file: slow for large trees.
    pub async fn snapshot_exclusive_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
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
