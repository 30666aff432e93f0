//! Per-session disk limits on the pool, with btrfs simple quotas (see [`crate::quota`]): every
//! root a session's sandboxes get joins the session's level-1 qgroup, whose limit is the
//! session's. The kernel refuses writes past it with `EDQUOT`, inside the sandbox only.

use std::path::Path;

use sha2::{Digest, Sha256};
use space_api::{SandboxId, SessionId};

use crate::error::{IoContext, Result, StorageError};
use crate::pool::{Backing, Pool};
use crate::quota::{QgroupId, QuotaMode, Quotas, subvolume_id};

/// The session's level-1 qgroup: 48 bits of a hash of its id, so the group needs no record
/// of its own and every root the session gets (restores, resumes) finds the same one.
fn session_group(session: &SessionId) -> QgroupId {
    let digest = Sha256::digest(session.as_str().as_bytes());
    let mut n = [0u8; 8];
    n[2..].copy_from_slice(&digest[..6]);
    QgroupId::level1(u64::from_be_bytes(n))
}

/// Turns simple quotas on for a pool the node owns (its image), and uses them where the
/// operator did; `None` when disk limits cannot be enforced, which is logged.
pub(crate) fn open_quotas(root: &Path, backing: &Backing) -> Result<Option<Quotas>> {
    let quotas = Quotas::of(root)?;
    match (quotas.mode()?, backing) {
        (QuotaMode::Simple, _) => Ok(Some(quotas)),
        (QuotaMode::Disabled, Backing::Image { .. }) => match quotas.enable_simple() {
            Ok(()) => {
                tracing::info!(root = %root.display(), "simple quotas enabled on the pool");
                Ok(Some(quotas))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot enable btrfs simple quotas (Linux 6.7+): disk limits are not enforced");
                Ok(None)
            }
        },
        (mode, _) => {
            tracing::warn!(
                ?mode,
                root = %root.display(),
                "the pool's btrfs is not the node's own image and has no simple quotas: disk limits are not \
                 enforced (enable them with `btrfs quota enable --simple` after disabling other quotas)"
            );
            Ok(None)
        }
    }
}

impl Pool {
    /// Are session disk limits enforced on this pool?
    pub fn disk_limits_enforced(&self) -> bool {
        self.quotas().is_some()
    }

    /// Charges what sandbox `sandbox` writes to `session` and limits the session to
    /// `limit_bytes` in all (`None`: no limit). Idempotent; a no-op where limits are not
    /// enforced.
    pub fn limit_session_disk(&self, sandbox: &SandboxId, session: &SessionId, limit_bytes: Option<u64>) -> Result<()> {
        let Some(quotas) = self.quotas() else { return Ok(()) };
        let group = session_group(session);
        let _guard = self.quota_groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        quotas.create_group(group)?;
        quotas.limit(group, limit_bytes)?;
        let root = subvolume_id(&self.sandbox_root_path(sandbox))?;
        quotas.assign(QgroupId::of_subvolume(root), group)
    }

    /// Removes the qgroups nothing uses any more and returns how many: those of deleted
    /// subvolumes charged for nothing, then session groups left without members. Without it
    /// every session ever run here would keep its group, and every deleted root its own, for
    /// the filesystem's life. The kernel refuses groups with members or charged for data (see
    /// [`Quotas::destroy_group`]); a live subvolume's group is skipped here. Only on the node's
    /// own image: on a filesystem the operator mounted, the groups may be theirs. A group that
    /// cannot be read or removed does not stop the others; the first error is returned at the end.
    pub fn sweep_quota_groups(&self) -> Result<usize> {
        let (Some(quotas), Backing::Image { .. }) = (self.quotas(), self.backing()) else { return Ok(0) };
        let groups = quotas.groups()?;
        let (mut removed, mut first_err) = (0, None);
        // Members first: a session group is only empty once its deleted roots' groups are gone.
        for level in [0, 1] {
            for &group in groups.iter().filter(|g| g.level() == level) {
                match self.remove_if_unused(quotas, group) {
                    Ok(done) => removed += usize::from(done),
                    Err(e) => {
                        tracing::warn!(%group, error = %e, "cannot remove an unused quota group");
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    fn remove_if_unused(&self, quotas: &Quotas, group: QgroupId) -> Result<bool> {
        if quotas.usage(group)? != Some(0) {
            return Ok(false);
        }
        if let Some(subvolume) = group.subvolume()
            && quotas.subvolume_exists(subvolume)?
        {
            return Ok(false);
        }
        // Only around the removal: starts wait on this lock, not on the scan.
        let _guard = self.quota_groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        quotas.destroy_group(group)
    }

    /// Bytes the session is charged for on disk, as of the last transaction commit: data its
    /// sandboxes wrote that still exists anywhere (in its root, its snapshots or forks made
    /// from them). `None` where limits are not enforced or the session never had a root here.
    pub fn session_disk_usage(&self, session: &SessionId) -> Result<Option<u64>> {
        match self.quotas() {
            Some(quotas) => quotas.usage(session_group(session)),
            None => Ok(None),
        }
    }
}

/// Half the space free on the filesystem holding `data_dir`, in whole GiB: the size of a new
/// pool image when none is given, so a pool that fills up never fills the host's disk too.
pub(crate) fn default_image_size(data_dir: &Path) -> Result<u64> {
    const GIB: u64 = 1 << 30;
    const MIN: u64 = 2 * GIB;
    let st = nix::sys::statvfs::statvfs(data_dir).ctx("statvfs", data_dir)?;
    let free = st.blocks_available().saturating_mul(st.fragment_size());
    let size = free / 2 / GIB * GIB;
    if size < MIN {
        return Err(StorageError::DiskTooSmall { path: data_dir.to_path_buf(), free_bytes: free });
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_get_distinct_stable_level1_groups() {
        let (a, b) = (SessionId::generate(), SessionId::generate());
        assert_eq!(session_group(&a), session_group(&a));
        assert_ne!(session_group(&a), session_group(&b));
        assert!(session_group(&a).to_string().starts_with("1/"));
    }
}
