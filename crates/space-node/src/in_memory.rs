//! Where a full snapshot's process images are in clear: only in memory, on a tmpfs of the
//! node's own mounted at `<data dir>/memory`. A VM's checkpoint writes its state there before
//! it is sealed into the pool, and a restore unseals the images there (`space_volume::sealed`,
//! docs/byok.md).
//!
//! The tmpfs is the node's own rather than a directory in `/dev/shm` so that it can use huge
//! pages (`huge=within_size`): filling and freeing the memory of an image of many MiB is much
//! of what opening it costs, and with 4 KiB pages that is a page fault per 4 KiB. Small images
//! (most of CRIU's) stay in small pages: a huge page is used only where the file's size
//! reaches past it, so an image opened into it is sized first (space-keys' `decrypt_file`).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;
use nix::sys::statfs::{TMPFS_MAGIC, statfs};

use crate::{Node, NodeError, Result};

/// This node's tmpfs for images in clear, in its data directory (so that servers sharing a
/// machine never share one).
pub fn root_for(data_dir: &Path) -> PathBuf {
    data_dir.join("memory")
}

/// Mounts the node's tmpfs at `root` (0700, no devices, setuid files or executables) or, when
/// a node that stopped left it mounted, empties it.
pub(crate) fn mount(root: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(root) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(internal(root, "create", &e)),
        _ => {}
    }
    if let Some(data_dir) = root.parent() {
        remove_legacy(data_dir);
    }
    // Made looser by hand (or by a tmpfs mounted without `mode=`): tightened, as the data
    // dir's other private entries are.
    let meta = metadata(root)?;
    if meta.is_dir() && meta.uid() == nix::unistd::geteuid().as_raw() && meta.mode() & 0o077 != 0 {
        tracing::warn!(path = %root.display(), mode = format!("{:o}", meta.mode() & 0o7777), "made 0700");
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| internal(root, "chmod", &e))?;
    }
    if is_mounted(root)? {
        for entry in std::fs::read_dir(root).map_err(|e| internal(root, "list", &e))?.flatten() {
            remove(&entry.path());
        }
        return Ok(());
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mount = |options: &str| nix::mount::mount(Some("space-memory"), root, Some("tmpfs"), flags, Some(options));
    match mount("mode=0700,huge=within_size") {
        // A kernel without transparent huge pages knows no `huge=`.
        Err(nix::errno::Errno::EINVAL) => {
            tracing::warn!(path = %root.display(), "no huge pages for the node's tmpfs: mounted without");
            mount("mode=0700")
        }
        mounted => mounted,
    }
    .map_err(|e| internal(root, "mount a tmpfs at", &std::io::Error::from(e)))
}

/// Is `root` a tmpfs mounted there (not a directory of a tmpfs the data dir is on)? One that
/// others could enter (not a directory of the node's own, 0700) is refused: the files in it
/// are readable by anyone who reaches them (restored tasks read them as their mapped root).
fn is_mounted(root: &Path) -> Result<bool> {
    let parent = root.parent().unwrap_or(root);
    let (own, above) = (metadata(root)?, metadata(parent)?);
    let private = own.is_dir() && own.uid() == nix::unistd::geteuid().as_raw() && own.mode() & 0o077 == 0;
    if !private {
        return Err(NodeError::Internal(format!(
            "{} is not a directory of this node's own (owner {}, mode {:o}): unmount or remove it",
            root.display(),
            own.uid(),
            own.mode() & 0o7777
        )));
    }
    let tmpfs = statfs(root).map_err(|e| internal(root, "statfs", &e.into()))?.filesystem_type() == TMPFS_MAGIC;
    Ok(tmpfs && own.dev() != above.dev())
}

/// Not followed if a link: the tmpfs is the node's only where it is.
fn metadata(path: &Path) -> Result<std::fs::Metadata> {
    std::fs::symlink_metadata(path).map_err(|e| internal(path, "stat", &e))
}

/// Removes the directory in `/dev/shm` where nodes before the tmpfs of their own kept images
/// in clear (named by the data dir's device and inode), with what a crash left in it. Only if
/// it is the node's own: anyone may make a directory in `/dev/shm`.
fn remove_legacy(data_dir: &Path) {
    let Ok(data) = std::fs::metadata(data_dir) else { return };
    let legacy = Path::new("/dev/shm").join(format!("space-{}-{}", data.dev(), data.ino()));
    let Ok(meta) = std::fs::symlink_metadata(&legacy) else { return };
    if meta.is_dir() && meta.uid() == nix::unistd::geteuid().as_raw() {
        remove(&legacy);
    }
}

/// A directory in memory, removed with what it holds when dropped.
pub(crate) struct InMemory(PathBuf);

impl InMemory {
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for InMemory {
    fn drop(&mut self) {
        remove(&self.0);
    }
}

fn remove(path: &Path) {
    let removed = match path.is_dir() {
        true => std::fs::remove_dir_all(path),
        false => std::fs::remove_file(path),
    };
    if let Err(e) = removed
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove images in memory");
    }
}

impl Node {
    /// The directory `name` in memory, not made yet (the checkpoint or the unsealing makes
    /// it), removed when the guard is dropped.
    pub(crate) fn in_memory(&self, name: &str) -> Result<InMemory> {
        let root = &self.in_memory_root;
        // Unmounted meanwhile (by hand), images in clear would go to the data dir's disk.
        if !is_mounted(root)? {
            return Err(NodeError::Internal(format!(
                "{} is no longer the node's tmpfs, and process images are in clear only in memory: restart the \
                 node, which mounts it again",
                root.display()
            )));
        }
        let dir = InMemory(root.join(name));
        remove(dir.path());
        Ok(dir)
    }
}

fn internal(path: &Path, what: &str, e: &std::io::Error) -> NodeError {
    NodeError::Internal(format!("{what} {}: {e}", path.display()))
}
