//! Session snapshots: `snapshots/<session>/<snapshot>/rootfs`, a read-only btrfs snapshot of a
//! sandbox root (taken by the caller while the sandbox is frozen), next to the `spaced` a full
//! snapshot's processes ran. New sandbox roots are writable snapshots of it: restore and fork
//! cost one ioctl whatever the root's size.
//!
//! A full snapshot's process images live outside the pool, in `<data dir>/images/<session>/
//! <snapshot>`: they are plain files written once and read back whole, and writing 100 MiB to
//! the loop-mounted btrfs costs about 100 ms more than to the data dir's filesystem.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use space_api::{SandboxId, SessionId, SnapshotId};

use crate::btrfs;
use crate::error::{IoContext, Result};
use crate::identity::SandboxIdentity;
use crate::pool::Pool;

impl Pool {
    /// `<pool>/snapshots/<session>/<snapshot>`.
    pub fn snapshot_dir(&self, session: &SessionId, snapshot: &SnapshotId) -> PathBuf {
        self.root().join("snapshots").join(session.as_str()).join(snapshot.as_str())
    }

    /// Snapshots the sandbox's root, read-only, into the snapshot's directory (replacing what
    /// an interrupted attempt left). The caller freezes the sandbox around this call.
    pub fn snapshot_sandbox_root(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
    ) -> Result<PathBuf> {
        let dir = self.snapshot_dir(session, snapshot);
        std::fs::create_dir_all(&dir).ctx("create directory", &dir)?;
        let rootfs = dir.join("rootfs");
        if std::fs::symlink_metadata(&rootfs).is_ok() {
            crate::util::remove_any(&rootfs)?;
        }
        btrfs::snapshot(&self.sandbox_dir(sandbox).join("rootfs"), &rootfs, true)?;
        Ok(dir)
    }

    /// Whether the snapshot's root is here whole: a read-only subvolume (one taken here is
    /// read-only from the start; `btrfs receive` makes one read-only only once the stream
    /// ended whole).
    pub fn snapshot_root_whole(&self, session: &SessionId, snapshot: &SnapshotId) -> bool {
        let root = self.snapshot_dir(session, snapshot).join("rootfs");
        btrfs::is_subvolume(&root).unwrap_or(false) && btrfs::is_readonly(&root).unwrap_or(false)
    }

    /// Where a full snapshot keeps its process images (see the module docs).
    pub fn snapshot_images_dir(&self, session: &SessionId, snapshot: &SnapshotId) -> PathBuf {
        self.images_root().join(session.as_str()).join(snapshot.as_str())
    }

    /// `<data dir>/images/<session>`: the process images of all the session's full snapshots.
    pub fn session_images_dir(&self, session: &SessionId) -> PathBuf {
        self.images_root().join(session.as_str())
    }

    fn images_root(&self) -> PathBuf {
        self.data_dir().join("images")
    }

    /// The `spaced` a full snapshot's processes ran: `<snapshot dir>/spaced`. A restore needs
    /// that very binary (CRIU checks its build id), whatever the node runs by then.
    pub fn snapshot_binary(&self, session: &SessionId, snapshot: &SnapshotId) -> PathBuf {
        self.snapshot_dir(session, snapshot).join("spaced")
    }

    /// Whether the snapshot holds process images (a full snapshot), not only a root.
    pub fn snapshot_has_images(&self, session: &SessionId, snapshot: &SnapshotId) -> bool {
        self.snapshot_binary(session, snapshot).is_file()
    }

    /// Keeps `binary` (from [`Pool::keep_binary`]) with the snapshot, as a hard link. Written
    /// last: a snapshot with it is complete.
    pub fn link_snapshot_binary(&self, session: &SessionId, snapshot: &SnapshotId, kept: &Path) -> Result<()> {
        let link = self.snapshot_binary(session, snapshot);
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link).ctx("remove", &link)?;
        }
        std::fs::hard_link(kept, &link).ctx("link", &link)
    }

    /// A copy of `binary` in the pool, named by its content (`<pool>/binaries/<sha256>`), made
    /// once; snapshots hard-link it. A kept copy whose content no longer matches its name
    /// (sandboxes execute it: it must be exactly what was kept) is written anew.
    pub fn keep_binary(&self, binary: &Path) -> Result<PathBuf> {
        use sha2::Digest;
        let content = std::fs::read(binary).ctx("read", binary)?;
        let digest = sha2::Sha256::digest(&content);
        let name = hex::encode(digest);
        let dir = self.root().join("binaries");
        std::fs::create_dir_all(&dir).ctx("create directory", &dir)?;
        let kept = dir.join(&name);
        if self.kept_binary(&name).is_none() {
            let partial = dir.join(format!(".partial-{}", std::process::id()));
            std::fs::write(&partial, &content).ctx("write", &partial)?;
            std::fs::set_permissions(&partial, std::os::unix::fs::PermissionsExt::from_mode(0o555))
                .ctx("chmod", &partial)?;
            std::fs::rename(&partial, &kept).ctx("rename", &kept)?;
        }
        Ok(kept)
    }

    /// The binary kept by [`Pool::keep_binary`] under `sha256`, if the pool has it intact: an
    /// import need not fetch a `spaced` the pool already runs. Its content is read and hashed,
    /// and read again only when the file's inode, size or mtime changed or the last check is
    /// [`RECHECK_AFTER`] old: so one altered in place is found at once, and one whose blocks
    /// went bad (btrfs checksums them: a read fails) within that time, and then written anew.
    /// Anything but 64 lower-case hex digits names none (it would otherwise become part of a
    /// path).
    pub fn kept_binary(&self, sha256: &str) -> Option<PathBuf> {
        use sha2::Digest;
        if !space_api::durable::is_sha256(sha256) {
            return None;
        }
        let kept = self.root().join("binaries").join(sha256);
        let stamp = FileStamp::of(&kept)?;
        let mut checked = self.checked_binaries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let fresh = |(when, seen): &(Instant, FileStamp)| *seen == stamp && when.elapsed() < RECHECK_AFTER;
        if checked.get(sha256).is_some_and(fresh) {
            return Some(kept);
        }
        let content = std::fs::read(&kept).ok()?;
        if hex::encode(sha2::Sha256::digest(&content)) != sha256 {
            return None;
        }
        checked.insert(sha256.to_owned(), (Instant::now(), stamp));
        Some(kept)
    }

    /// The SHA-256 of the snapshot's `spaced`, known without reading it: the name of the
    /// binary the pool keeps ([`Pool::keep_binary`]) that the snapshot's link shares an inode
    /// with. `None` for a snapshot whose binary is no kept one's link.
    pub fn snapshot_binary_sha256(&self, session: &SessionId, snapshot: &SnapshotId) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let link = std::fs::metadata(self.snapshot_binary(session, snapshot)).ok()?;
        let kept = std::fs::read_dir(self.root().join("binaries")).ok()?;
        kept.flatten().find_map(|entry| {
            let meta = entry.metadata().ok()?;
            let name = entry.file_name().into_string().ok()?;
            (meta.ino() == link.ino() && meta.dev() == link.dev() && space_api::durable::is_sha256(&name))
                .then_some(name)
        })
    }

    /// A new sandbox root from a snapshot; `identity` as for a template (`None` keeps the
    /// snapshot's, as a restored process tree needs).
    pub fn create_sandbox_root_from_snapshot(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        identity: Option<SandboxIdentity>,
    ) -> Result<PathBuf> {
        let source = self.snapshot_dir(session, snapshot).join("rootfs");
        self.create_root_from(id, &source, identity.as_ref())
    }

    /// Deletes the snapshot's images and moves its root to the trash (deleted in the
    /// background). Missing is fine.
    pub fn delete_snapshot(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<()> {
        let images = self.snapshot_images_dir(session, snapshot);
        match std::fs::remove_dir_all(&images) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e).ctx("remove", &images),
            _ => {}
        }
        self.retire(&self.snapshot_dir(session, snapshot), snapshot.as_str())
    }

    /// Every snapshot with a directory in the pool or images, for the start-up sweep.
    pub fn list_snapshots(&self) -> Result<Vec<(SessionId, SnapshotId)>> {
        let mut found = Vec::new();
        for base in [self.root().join("snapshots"), self.images_root()] {
            for session in read_ids::<SessionId>(&base)? {
                for snapshot in read_ids::<SnapshotId>(&base.join(session.as_str()))? {
                    found.push((session.clone(), snapshot));
                }
            }
        }
        found.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
        found.dedup();
        Ok(found)
    }
}

fn read_ids<T: std::str::FromStr>(dir: &Path) -> Result<Vec<T>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).ctx("read directory", dir),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.ctx("read directory", dir)?;
        if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// How long a kept binary's check stands while its file looks unchanged.
const RECHECK_AFTER: Duration = Duration::from_secs(60);

/// What identifies a version of a file's content without reading it: a file replaced gets
/// another inode, one written in place another mtime (unless its owner sets the old one back,
/// which only root can for a kept binary). Not the ctime: each snapshot's hard link to a kept
/// binary changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        })
    }
}
