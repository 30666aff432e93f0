//! Pause and resume in place, disk snapshots, and sandboxes started from a snapshot.

use std::collections::HashSet;

use space_api::RuntimeKind;
use space_api::{SandboxId, SessionId, SnapshotId};
use space_node_api::DiskQuota;
use space_runtime::{Limits, RootDisk, RootDiskKind, SandboxHandle};
use space_storage::SandboxIdentity;

use crate::{Node, NodeError, Result, blocking};

impl Node {
    /// Freezes every process of the sandbox; memory stays where it is.
    pub async fn pause_sandbox(&self, id: &SandboxId) -> Result<()> {
        Ok(self.runtimes.of(id)?.pause(id).await?)
    }

    pub async fn resume_sandbox(&self, id: &SandboxId) -> Result<()> {
        Ok(self.runtimes.of(id)?.resume(id).await?)
    }

    /// A read-only copy of the sandbox's root, consistent because the sandbox is frozen while
    /// it is taken (unless `already_paused`, it is thawed right after). A guest's filesystem
    /// (an image root) is also flushed and frozen from inside first: its page cache and
    /// journal are guest memory. Its size is measured apart ([`Node::snapshot_disk_size`]):
    /// walking the tree takes longer than the snapshot.
    pub async fn snapshot_disk(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
    ) -> Result<()> {
        let runtime = self.runtimes.of(sandbox)?;
        let guest_fs = runtime.root_disk() == RootDiskKind::Image;
        if guest_fs {
            if already_paused {
                runtime.resume(sandbox).await?; // only a running guest can freeze
            }
            let frozen = self.freeze_root(sandbox, true).await;
            if let Err(e) = frozen {
                if already_paused {
                    runtime.pause(sandbox).await?;
                }
                return Err(e);
            }
        }
        if !already_paused || guest_fs {
            runtime.pause(sandbox).await?;
        }
        let pool = self.pool.clone();
        let (sbx, ses, snap) = (sandbox.clone(), session.clone(), snapshot.clone());
        let taken = blocking(move || Ok(pool.snapshot_sandbox_root(&sbx, &ses, &snap)?)).await;
        if !already_paused || guest_fs {
            runtime.resume(sandbox).await?;
        }
        if guest_fs {
            self.freeze_root(sandbox, false).await?;
            if already_paused {
                runtime.pause(sandbox).await?;
            }
        }
        taken.map(drop)
    }

    /// Freezes or thaws the root filesystem of a sandbox from inside (see
    /// `Request::FreezeRoot`).
    async fn freeze_root(&self, sandbox: &SandboxId, frozen: bool) -> Result<()> {
        let agent = self.agent(sandbox).await?;
        agent.freeze_root(frozen).await.map_err(|e| NodeError::Agent {
            sandbox: sandbox.clone(),
            reason: format!("{} the root filesystem: {e}", if frozen { "freezing" } else { "thawing" }),
        })
    }

    /// The apparent size of a disk snapshot's files.
    /// For a root that is a disk image (`vm`), the blocks the image holds: its apparent size
    /// is the guest filesystem's, mostly holes.
    pub async fn snapshot_disk_size(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<u64> {
        let rootfs = self.pool.snapshot_dir(session, snapshot).join("rootfs");
        blocking(move || {
            use std::os::unix::fs::MetadataExt;
            match std::fs::symlink_metadata(rootfs.join(space_storage::ROOT_IMAGE)) {
                Ok(image) if image.is_file() => Ok(image.blocks() * 512),
                _ => Ok(space_storage::apparent_size(&rootfs)?),
            }
        })
        .await
    }

    /// Starts a sandbox whose root is a writable copy of `snapshot` (of `session`), with a
    /// fresh identity (named after `id`) like any new sandbox.
    pub async fn start_sandbox_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
    ) -> Result<SandboxHandle> {
        let kind = self.runtimes.get(runtime)?.root_disk();
        let hostname = crate::hostname_for(id);
        let identity = crate::egress::sandbox_identity(&hostname);
        let root = self.root_from_snapshot(id, session, snapshot, kind, Some(identity), disk).await?;
        self.boot(id, runtime, root, limits, &hostname, None).await
    }

    /// A new root for sandbox `id` from `snapshot`'s, of the `kind` its runtime boots from,
    /// charged to `disk`. A snapshot of an image root holds the image.
    pub(crate) async fn root_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        kind: RootDiskKind,
        identity: Option<SandboxIdentity>,
        disk: &DiskQuota,
    ) -> Result<RootDisk> {
        let pool = self.pool.clone();
        let (sid, ses, snap, disk) = (id.clone(), session.clone(), snapshot.clone(), disk.clone());
        blocking(move || {
            let rootfs = pool.create_sandbox_root_from_snapshot(&sid, &ses, &snap, identity)?;
            crate::charge(&pool, &sid, Some(&disk))?;
            Ok(match kind {
                RootDiskKind::Directory => RootDisk::Directory(rootfs),
                RootDiskKind::Image => RootDisk::Image(rootfs.join(space_storage::ROOT_IMAGE)),
            })
        })
        .await
    }

    /// Deletes a snapshot (in the background). Missing is fine.
    pub async fn delete_snapshot(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<()> {
        let pool = self.pool.clone();
        let (ses, snap) = (session.clone(), snapshot.clone());
        blocking(move || Ok(pool.delete_snapshot(&ses, &snap)?)).await?;
        self.reclaim.notify_one();
        Ok(())
    }

    /// Deletes every snapshot on disk that is not in `keep`; returns how many.
    pub async fn sweep_snapshots(&self, keep: &HashSet<SnapshotId>) -> Result<usize> {
        let pool = self.pool.clone();
        let found = blocking(move || Ok(pool.list_snapshots()?)).await?;
        let mut removed = 0;
        for (session, snapshot) in found.into_iter().filter(|(_, s)| !keep.contains(s)) {
            tracing::info!(%session, %snapshot, "removing orphaned snapshot");
            match self.delete_snapshot(&session, &snapshot).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(%snapshot, error = %e, "cannot remove an orphaned snapshot; left for the next start")
                }
            }
        }
        Ok(removed)
    }
}
