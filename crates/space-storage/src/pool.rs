//! The node's storage pool: one btrfs filesystem at `<data_dir>/pool` holding templates,
//! sandbox roots, snapshots and warm-pool slots.

use std::collections::HashMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, Flock, FlockArg, RenameFlags, renameat2};
use space_api::SandboxId;

use crate::btrfs;
use crate::error::{IoContext, Result, StorageError};
use crate::identity::{SandboxIdentity, validate_hostname, write_identity};
use crate::mount;
use crate::quota::Quotas;
use crate::snapshots::FileStamp;
use crate::template::{TemplateInfo, TemplateStore};
use crate::util::{ensure_dir, remove_any};
use space_api::IdMap;

/// The pool's directories and their modes. Sandbox roots live below `sandboxes` and `pods`,
/// which the sandboxes' mapped root uids must traverse (`0711`: nothing listable), and so must
/// `snapshots`: CRIU binds a full snapshot's `spaced` from inside the restored sandbox's user
/// namespace. The trash is reached by root alone.
const LAYOUT: [(&str, u32); 6] = [
    ("templates", DIR_MODE),
    ("sandboxes", DIR_MODE),
    ("snapshots", DIR_MODE),
    ("pods", DIR_MODE),
    ("trash", 0o700),
    (crate::layers::LAYERS_DIR, 0o700),
];
const DIR_MODE: u32 = 0o711;
/// The disk image in the root subvolume of a sandbox that boots from one (`vm`).
pub const ROOT_IMAGE: &str = "disk.img";

/// How to open a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// Size of `pool.img` when one has to be created (ignored for an existing image); `None`:
    /// half the space free on the data dir's disk. The image is sparse: it only uses what is
    /// written, so its size is what the pool may grow to.
    pub image_size_bytes: Option<u64>,
    /// The host id range sandboxes (and so templates) are owned by.
    pub id_map: IdMap,
    /// Mount a pool image with `nobarrier`: snapshots (sandbox roots) get ~8x faster on a
    /// loop-mounted image (no disk-cache flush per transaction commit), but a host crash or
    /// power loss can corrupt the whole pool. Only for pools whose content can be rebuilt
    /// (CI, development, nodes whose snapshots are exported). Ignored when the data dir
    /// itself is btrfs.
    pub nobarrier: bool,
}

/// What the pool's btrfs filesystem lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// The data dir itself is on btrfs; the pool is a plain directory in it.
    DataDir,
    /// `<data_dir>/pool.img`, loop-mounted at the pool root.
    Image { image: PathBuf },
    /// Some other btrfs filesystem the operator mounted at the pool root.
    Device { source: String },
}

/// An open storage pool. Holds an exclusive lock on the data dir: share one `Pool` per data
/// dir (e.g. in an `Arc`). Operations block on disk I/O; call them from blocking threads.
#[derive(Debug)]
pub struct Pool {
    data_dir: PathBuf,
    root: PathBuf,
    backing: Backing,
    id_map: IdMap,
    templates: TemplateStore,
    /// `None` where session disk limits cannot be enforced.
    quotas: Option<Quotas>,
    /// Two reclaimers racing on one trash entry would fail each other's deletions.
    reclaim: Mutex<()>,
    /// Held while a session group is set up or unused groups are swept, so a sweep never
    /// removes a group between its creation and its first member.
    pub(crate) quota_groups: Mutex<()>,
    /// Kept binaries whose content was checked against their names: when, and as they were then.
    pub(crate) checked_binaries: Mutex<HashMap<String, (std::time::Instant, FileStamp)>>,
    _lock: Flock<File>,
}

impl Pool {
    /// Opens (creating and mounting if needed) the pool of `data_dir`, and removes what
    /// interrupted template builds left behind.
    pub fn open(data_dir: impl AsRef<Path>, options: PoolOptions) -> Result<Pool> {
        let map = options.id_map;
        map.validate().map_err(|reason| StorageError::InvalidIdMap {
            host_base: map.host_base,
            count: map.count,
            reason,
        })?;
        if !nix::unistd::geteuid().is_root() {
            return Err(StorageError::NotRoot);
        }
        let data_dir = data_dir.as_ref();
        std::fs::create_dir_all(data_dir).ctx("create data dir", data_dir)?;
        let data_dir = std::fs::canonicalize(data_dir).ctx("resolve data dir", data_dir)?;
        let lock = lock_data_dir(&data_dir)?;
        let root = data_dir.join("pool");
        let backing = prepare_root(&data_dir, &root, &options)?;
        ensure_dir(&root, DIR_MODE)?;
        for (sub, mode) in LAYOUT {
            ensure_dir(&root.join(sub), mode)?;
        }
        // Full snapshots' process images: whatever the sandboxes had in memory.
        ensure_dir(&data_dir.join("images"), 0o700)?;
        let templates = TemplateStore::new(root.join("templates"), options.id_map);
        templates.cleanup()?;
        crate::layers::Layers::new(root.join(crate::layers::LAYERS_DIR)).clear_staging()?;
        let quotas = crate::disk::open_quotas(&root, &backing)?;
        tracing::info!(root = %root.display(), ?backing, disk_limits = quotas.is_some(), "storage pool open");
        let id_map = options.id_map;
        Ok(Pool {
            data_dir,
            root,
            backing,
            id_map,
            templates,
            quotas,
            reclaim: Mutex::new(()),
            quota_groups: Mutex::new(()),
            checked_binaries: Mutex::new(HashMap::new()),
            _lock: lock,
        })
    }

    /// Lazily unmounts the pool of `data_dir` if something is mounted there (for tests and
    /// teardown). Deletes nothing; the loop device is released once the filesystem is no
    /// longer busy. Idempotent. Drop every `Pool` of this data dir first.
    pub fn unmount(data_dir: impl AsRef<Path>) -> Result<()> {
        let data_dir = match std::fs::canonicalize(data_dir.as_ref()) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).ctx("resolve data dir", data_dir.as_ref()),
        };
        let root = data_dir.join("pool");
        // Loop in case the pool was mounted more than once on top of itself.
        for _ in 0..16 {
            if mount::mount_at(&root)?.is_none() {
                return Ok(());
            }
            tracing::info!(root = %root.display(), "unmounting pool");
            mount::detach(&root)?;
        }
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The pool's root directory (`<data_dir>/pool`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    pub fn id_map(&self) -> IdMap {
        self.id_map
    }

    pub fn templates(&self) -> &TemplateStore {
        &self.templates
    }

    pub(crate) fn quotas(&self) -> Option<&Quotas> {
        self.quotas.as_ref()
    }

    /// `<pool>/snapshots`, for session snapshots.
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// `<pool>/pods`, for warm-pool slots.
    pub fn pods_dir(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// `<pool>/sandboxes/<id>`: the sandbox's directory (its root filesystem and anything the
    /// runtime keeps next to it).
    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.root.join("sandboxes").join(id.as_str())
    }

    /// `<pool>/sandboxes/<id>/rootfs`.
    pub fn sandbox_root_path(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_dir(id).join("rootfs")
    }

    /// Writes `files` into the sandbox's `/etc/<dir>`, owned by its root (see
    /// [`crate::write_etc_dir_files`]: safe while the sandbox runs).
    pub fn write_sandbox_etc_files(&self, id: &SandboxId, dir: &str, files: &[(&str, &[u8])]) -> Result<()> {
        crate::write_etc_dir_files(&self.sandbox_root_path(id), dir, files, self.id_map.root())
    }

    /// Creates the writable root filesystem of a sandbox: one btrfs snapshot of the template
    /// (O(1)) plus its own `/etc/hostname`, `/etc/machine-id` and `/etc/hosts`. A root left by
    /// an interrupted attempt is replaced. Returns the root's path.
    pub fn create_sandbox_root(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        identity: SandboxIdentity,
    ) -> Result<PathBuf> {
        let source = self.templates.path(template)?;
        let rootfs = self.create_root_from(id, &source, Some(&identity)).map_err(|e| match e.errno() {
            Some(Errno::ENOENT) => {
                StorageError::TemplateNotFound { name: template.name.clone(), version: Some(template.version) }
            }
            _ => e,
        })?;
        tracing::debug!(sandbox = %id, template = %format!("{}@{}", template.name, template.version), "sandbox root created");
        Ok(rootfs)
    }

    /// The root of a sandbox that runs a build step: a writable snapshot of build layer
    /// `layer` with identity files of its own.
    pub fn create_build_root(&self, id: &SandboxId, layer: &Path, identity: SandboxIdentity) -> Result<PathBuf> {
        self.create_root_from(id, layer, Some(&identity))
    }

    /// Creates the root of a sandbox that boots from a disk image: a fresh subvolume (so
    /// disk limits, snapshots and deletion treat it like any root) holding
    /// [`ROOT_IMAGE`], a reflink of `image`. A root left by an interrupted attempt is
    /// replaced. Returns the image's path.
    pub fn create_sandbox_image_root(&self, id: &SandboxId, image: &Path) -> Result<PathBuf> {
        let dir = self.sandbox_dir(id);
        match DirBuilder::new().mode(DIR_MODE).create(&dir) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(e).ctx("create directory", &dir),
            _ => {}
        }
        let rootfs = dir.join("rootfs");
        if std::fs::symlink_metadata(&rootfs).is_ok() {
            tracing::warn!(sandbox = %id, "replacing the root left by an interrupted attempt");
            remove_any(&rootfs)?;
        }
        btrfs::create_subvolume(&rootfs)?;
        let disk = rootfs.join(ROOT_IMAGE);
        if let Err(e) = crate::reflink(image, &disk) {
            let _ = remove_any(&rootfs);
            return Err(e);
        }
        Ok(disk)
    }

    /// A sandbox root as a writable snapshot of the subvolume `source`, with a new identity
    /// unless `identity` is `None` (a restored process tree keeps the one it had).
    pub(crate) fn create_root_from(
        &self,
        id: &SandboxId,
        source: &Path,
        identity: Option<&SandboxIdentity>,
    ) -> Result<PathBuf> {
        if let Some(identity) = identity {
            validate_hostname(&identity.hostname)?;
        }
        let dir = self.sandbox_dir(id);
        match DirBuilder::new().mode(DIR_MODE).create(&dir) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                return Err(e).ctx("create directory", &dir);
            }
            _ => {}
        }
        let rootfs = dir.join("rootfs");
        if std::fs::symlink_metadata(&rootfs).is_ok() {
            tracing::warn!(sandbox = %id, "replacing the root left by an interrupted attempt");
            remove_any(&rootfs)?;
        }
        btrfs::snapshot(source, &rootfs, false)?;
        if let Some(identity) = identity
            && let Err(e) = write_identity(&rootfs, identity, self.id_map.root())
        {
            let _ = remove_any(&rootfs);
            return Err(e);
        }
        Ok(rootfs)
    }

    /// Deletes a sandbox's root and directory. Missing is fine.
    pub fn delete_sandbox_root(&self, id: &SandboxId) -> Result<()> {
        let dir = self.sandbox_dir(id);
        remove_any(&dir.join("rootfs"))?;
        remove_any(&dir)
    }

    /// `<pool>/trash`: retired sandbox directories waiting for [`Pool::reclaim_trash`].
    pub(crate) fn trash_dir(&self) -> PathBuf {
        self.root.join("trash")
    }

    /// Takes a sandbox's directory (root filesystem included) out of the pool's sandboxes by
    /// moving it to `trash/`, for [`Pool::reclaim_trash`] to delete later: deleting subvolumes
    /// queues work for the kernel's cleaner that slows down new snapshots, so teardown should
    /// not pay for it. One rename, atomic and cheap. Missing is fine; a sandbox id retired
    /// again while the earlier one is still in the trash gets the name `<id>.<n>`.
    pub fn retire_sandbox_root(&self, id: &SandboxId) -> Result<()> {
        self.retire(&self.sandbox_dir(id), id.as_str())
    }

    /// Moves `dir` to `trash/<name>` (or `<name>.<n>` if taken). Missing is fine.
    pub(crate) fn retire(&self, dir: &Path, name: &str) -> Result<()> {
        let trash = self.trash_dir();
        for n in 0..=u32::MAX {
            let dest = trash.join(trash_name(name, n));
            match renameat2(AT_FDCWD, dir, AT_FDCWD, &dest, RenameFlags::RENAME_NOREPLACE) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), trash = %dest.display(), "retired");
                    return Ok(());
                }
                Err(Errno::EEXIST) => continue,
                Err(Errno::ENOENT) if std::fs::symlink_metadata(dir).is_err() => return Ok(()),
                Err(e) => return Err(e).ctx("move to trash", dir),
            }
        }
        Err(Errno::EEXIST).ctx("move to trash", dir)
    }

    /// How many entries are in the trash.
    pub fn trash_len(&self) -> Result<usize> {
        let trash = self.trash_dir();
        std::fs::read_dir(&trash).ctx("read directory", &trash)?.try_fold(0, |n, entry| {
            entry.ctx("read directory", &trash)?;
            Ok(n + 1)
        })
    }

    /// Deletes everything in the trash and returns how many entries it removed. Before each
    /// subvolume deletion, waits while the kernel has `max_pending` or more deletions queued
    /// (0 means until none is), so reclaiming never piles up more cleaner work than that; on
    /// kernels that cannot count them (before 6.13) it does not wait. Blocks for as long as
    /// that takes: run it on a background thread. Calls are serialised. An entry that cannot
    /// be deleted does not stop the others; the first such error is returned at the end.
    pub fn reclaim_trash(&self, max_pending: u64) -> Result<usize> {
        let _guard = self.reclaim.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let trash = self.trash_dir();
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&trash).ctx("read directory", &trash)? {
            entries.push(entry.ctx("read directory", &trash)?.path());
        }
        let (mut removed, mut first_err) = (0, None);
        for entry in entries {
            match self.reclaim_entry(&entry, max_pending) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(entry = %entry.display(), error = %e, "cannot delete trash entry");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    fn reclaim_entry(&self, entry: &Path, max_pending: u64) -> Result<()> {
        let meta = match std::fs::symlink_metadata(entry) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).ctx("stat", entry),
        };
        if meta.is_dir() {
            let rootfs = entry.join("rootfs");
            if btrfs::is_subvolume(&rootfs)? {
                self.throttle_deletions(max_pending)?;
            }
            remove_any(&rootfs)?;
        }
        if btrfs::is_subvolume(entry)? {
            self.throttle_deletions(max_pending)?;
        }
        remove_any(entry)
    }

    /// Waits while `max_pending` or more subvolume deletions are queued in the kernel.
    fn throttle_deletions(&self, max_pending: u64) -> Result<()> {
        while must_wait(btrfs::pending_deletions(&self.root)?, max_pending) {
            btrfs::wait_for_one_deletion(&self.root)?;
        }
        Ok(())
    }

    /// The sandboxes that have a directory in the pool (entries that are not sandbox ids are
    /// ignored), sorted.
    pub fn list_sandbox_roots(&self) -> Result<Vec<SandboxId>> {
        let dir = self.root.join("sandboxes");
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&dir).ctx("read directory", &dir)? {
            let entry = entry.ctx("read directory", &dir)?;
            if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                ids.push(id);
            }
        }
        ids.sort();
        Ok(ids)
    }
}

/// Name of the `n`th trash entry tried for a sandbox: `<id>`, then `<id>.<n>`.
fn trash_name(id: &str, n: u32) -> String {
    if n == 0 { id.to_owned() } else { format!("{id}.{n}") }
}

/// Should reclaiming wait before queueing another subvolume deletion?
fn must_wait(pending: Option<u64>, max_pending: u64) -> bool {
    matches!(pending, Some(n) if n > 0 && n >= max_pending)
}

/// Makes `root` a btrfs filesystem: reuse a mount already there, use the data dir if it is
/// btrfs, or create/format/mount `pool.img`.
fn prepare_root(data_dir: &Path, root: &Path, options: &PoolOptions) -> Result<Backing> {
    std::fs::create_dir_all(root).ctx("create directory", root)?;
    let image = data_dir.join("pool.img");
    if let Some(m) = mount::mount_at(root)? {
        if m.fstype != "btrfs" {
            return Err(StorageError::NotBtrfsMount { path: root.to_path_buf(), fstype: m.fstype });
        }
        tracing::debug!(root = %root.display(), "pool already mounted");
        if !image.exists() {
            return Ok(Backing::Device { source: m.source });
        }
        if m.has_option("nobarrier") != options.nobarrier {
            mount::remount_barrier(root, options.nobarrier)?;
        }
        return Ok(Backing::Image { image });
    }
    if btrfs::is_btrfs(data_dir)? {
        return Ok(Backing::DataDir);
    }
    mount::ensure_image(&image, || match options.image_size_bytes {
        Some(size) => Ok(size),
        None => crate::disk::default_image_size(data_dir),
    })?;
    mount::mount_image(&image, root, options.nobarrier)?;
    Ok(Backing::Image { image })
}

/// Takes the data dir's exclusive lock (`pool.lock`, holding the owner's pid).
fn lock_data_dir(data_dir: &Path) -> Result<Flock<File>> {
    let path = data_dir.join("pool.lock");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .ctx("open lock", &path)?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = format!("pid {}", holder.trim());
            return Err(StorageError::PoolBusy { lock: path, holder });
        }
        Err((_, e)) => return Err(e).ctx("lock", &path),
    };
    lock.set_len(0).ctx("write lock", &path)?;
    lock.rewind().ctx("write lock", &path)?;
    write!(lock, "{}", std::process::id()).ctx("write lock", &path)?;
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trash_names_are_unique_per_attempt() {
        assert_eq!(trash_name("sbx_1", 0), "sbx_1");
        assert_eq!(trash_name("sbx_1", 1), "sbx_1.1");
        assert_eq!(trash_name("sbx_1", 12), "sbx_1.12");
    }

    #[test]
    fn reclaim_waits_only_at_the_cap() {
        assert!(!must_wait(None, 0), "kernels that cannot count never wait");
        assert!(!must_wait(Some(0), 0), "an empty queue never waits");
        assert!(must_wait(Some(1), 0));
        assert!(!must_wait(Some(0), 1));
        assert!(must_wait(Some(1), 1));
        assert!(!must_wait(Some(3), 4));
        assert!(must_wait(Some(5), 4));
        assert!(!must_wait(Some(u64::MAX - 1), u64::MAX));
    }
}
