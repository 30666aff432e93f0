//! Moving a snapshot's root between pools: a `btrfs send` stream out of one, `btrfs receive`
//! into another. The stream format is btrfs-progs', so btrfs-progs writes and reads it.
//!
//! A stream sent against a parent holds only what changed since that parent; the receiving
//! pool must already hold the parent (received earlier, or taken there), which `receive`
//! finds by the UUID btrfs records.

use std::path::Path;
use std::process::Command;

use space_api::{SessionId, SnapshotId};

use crate::btrfs;
use crate::cmd;
use crate::error::{IoContext, Result, StorageError};
use crate::pool::Pool;

impl Pool {
    /// Writes the send stream of the snapshot's root to `out`: whole, or against `parent`
    /// (another snapshot in this pool, which the receiving pool holds too).
    pub fn send_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<(&SessionId, &SnapshotId)>,
        out: &Path,
    ) -> Result<()> {
        let root = self.snapshot_dir(session, snapshot).join("rootfs");
        let mut send = Command::new("btrfs");
        send.args(["send", "--quiet", "-f"]).arg(out);
        if let Some((session, snapshot)) = parent {
            send.arg("-p").arg(self.snapshot_dir(session, snapshot).join("rootfs"));
        }
        send.arg(&root);
        cmd::run(&mut send, "the snapshot (and its parent) must be read-only subvolumes of this pool").map(drop)
    }

    /// Makes the snapshot of `session` from a stream [`Pool::send_snapshot`] wrote (replacing
    /// what an interrupted attempt left). Its parent, if it was sent against one, must be in
    /// this pool.
    pub fn receive_snapshot(&self, session: &SessionId, snapshot: &SnapshotId, stream: &Path) -> Result<()> {
        let dir = self.snapshot_dir(session, snapshot);
        std::fs::create_dir_all(&dir).ctx("create directory", &dir)?;
        let root = dir.join("rootfs");
        if std::fs::symlink_metadata(&root).is_ok() {
            crate::util::remove_any(&root)?;
        }
        let mut receive = Command::new("btrfs");
        // `--chroot`: whatever paths the stream names, nothing lands outside `dir`.
        receive.args(["receive", "--quiet", "--chroot", "-f"]).arg(stream).arg(&dir);
        cmd::run(&mut receive, "an incremental stream needs its parent snapshot received first")?;
        if !btrfs::is_subvolume(&root)? || !btrfs::is_readonly(&root)? {
            return Err(StorageError::NotAStream { path: stream.to_owned() });
        }
        Ok(())
    }
}
