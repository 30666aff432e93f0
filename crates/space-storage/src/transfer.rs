//! Moving a snapshot's root between pools: a `btrfs send` stream out of one, `btrfs receive`
//! into another. The stream format is btrfs-progs', so btrfs-progs writes and reads it.
//!
//! A stream sent against a parent holds only what changed since that parent; the receiving
//! pool must already hold the parent (received earlier, or taken there), which `receive`
//! finds by the UUID btrfs records.

use std::path::Path;
use std::process::Command;

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use space_api::{SessionId, SnapshotId, TemplateInfo};

use crate::btrfs;
use crate::cmd;
use crate::error::{IoContext, Result, StorageError};
use crate::pool::Pool;
use crate::template::TemplateStore;
use crate::util::remove_any;

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

impl TemplateStore {
    /// Writes the send stream of template `info` (a read-only subvolume) to `out`.
    pub fn send(&self, info: &TemplateInfo, out: &Path) -> Result<()> {
        let root = self.path(info)?;
        let mut send = Command::new("btrfs");
        send.args(["send", "--quiet", "-f"]).arg(out).arg(&root);
        cmd::run(&mut send, "a template is a read-only subvolume of this pool").map(drop)
    }

    /// Makes template `info`, its very version, from a stream [`TemplateStore::send`] wrote in
    /// a pool whose templates have this store's id range. That version, if this store has it
    /// already with the same metadata, is left as it is; another template under that version
    /// (made here apart, or deleted and made again elsewhere while this node missed it) is
    /// replaced. Nothing is left of a stream that does not receive whole, and nothing is
    /// published before it is whole and read-only. Call one at a time per store.
    pub fn receive(&self, info: &TemplateInfo, stream: &Path) -> Result<TemplateInfo> {
        match self.get(&info.name, info.version) {
            Ok(existing) if &existing == info => return Ok(existing),
            Ok(_) => {
                tracing::info!(template = %format!("{}@{}", info.name, info.version), "replacing another template of that version");
                self.delete(&info.name, info.version)?;
            }
            Err(_) => {}
        }
        let target = self.path(info)?;
        let dir = self.dir().join(format!(".receive-{}-{:08x}", info.name, rand::random::<u32>()));
        std::fs::create_dir(&dir).ctx("create directory", &dir)?;
        let placed = receive_into(&dir, stream).and_then(|subvolume| place(&subvolume, &target));
        remove_received(&dir);
        placed?;
        if let Err(e) = self.publish(info) {
            let _ = remove_any(&target);
            return Err(e);
        }
        self.get(&info.name, info.version)
    }
}

/// Moves the received `subvolume` to `target` and makes it read-only; `target` is gone again
/// if that fails. A `target` that exists (a build here is publishing that version) is not
/// taken.
fn place(subvolume: &Path, target: &Path) -> Result<()> {
    // btrfs moves a subvolume to another directory only while it is writable.
    btrfs::set_readonly(subvolume, false)?;
    match renameat2(AT_FDCWD, subvolume, AT_FDCWD, target, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => btrfs::set_readonly(target, true).inspect_err(|_| {
            let _ = remove_any(target);
        }),
        Err(e) => Err(e).ctx("rename template into place", target),
    }
}

/// `btrfs receive`s `stream` into the empty directory `dir`; the one read-only subvolume it made.
fn receive_into(dir: &Path, stream: &Path) -> Result<std::path::PathBuf> {
    let mut receive = Command::new("btrfs");
    // `--chroot`: whatever paths the stream names, nothing lands outside `dir`.
    receive.args(["receive", "--quiet", "--chroot", "-f"]).arg(stream).arg(dir);
    cmd::run(&mut receive, "a template's stream is a whole subvolume")?;
    let mut made = std::fs::read_dir(dir).ctx("read directory", dir)?;
    let (Some(Ok(first)), None) = (made.next(), made.next()) else {
        return Err(StorageError::NotAStream { path: stream.to_owned() });
    };
    let subvolume = first.path();
    if !btrfs::is_subvolume(&subvolume)? || !btrfs::is_readonly(&subvolume)? {
        return Err(StorageError::NotAStream { path: stream.to_owned() });
    }
    Ok(subvolume)
}

/// Removes a receive's directory and the subvolume a failed receive left in it (a directory
/// holding a subvolume is not removed whole by `remove_dir_all`).
pub(crate) fn remove_received(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if let Err(e) = remove_any(&entry.path()) {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a received template");
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %dir.display(), error = %e, "could not remove a template's receive directory");
    }
}
