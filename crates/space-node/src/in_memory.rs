//! Where a full snapshot's process images are in clear: only in memory. A checkpoint writes
//! them to a directory on a tmpfs, from which they are sealed into the pool, and a restore
//! unseals them into one (`space_volume::sealed`, docs/byok.md).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::{Node, NodeError, Result};

/// The tmpfs every Linux host mounts for shared memory.
const SHM: &str = "/dev/shm";

/// This node's directory in memory: named by its data directory's device and inode, so that
/// servers sharing a machine never share one, and a restarted node finds its own leftovers.
/// (Test harnesses remove it with the data dir.)
pub fn root_for(data_dir: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(data_dir).map_err(|e| internal(data_dir, "stat", &e))?;
    Ok(Path::new(SHM).join(format!("space-{}-{}", meta.dev(), meta.ino())))
}

/// Removes what a node that stopped meanwhile left in its directory in memory, and makes it
/// again at once: while it is there (root's, 0700), nobody else can take its name in the
/// world-writable `/dev/shm` (whose sticky bit keeps it root's).
pub(crate) fn clear(root: &Path) {
    remove(root);
    if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(root) {
        tracing::warn!(path = %root.display(), error = %e, "cannot make the node's directory in memory");
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

fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %dir.display(), error = %e, "cannot remove images in memory");
    }
}

impl Node {
    /// The directory `name` in memory, not made yet (the checkpoint or the unsealing makes
    /// it), removed when the guard is dropped.
    pub(crate) fn in_memory(&self, name: &str) -> Result<InMemory> {
        let root = &self.in_memory_root;
        let tmpfs = nix::sys::statfs::statfs(SHM).is_ok_and(|st| st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if !tmpfs {
            return Err(NodeError::Internal(format!(
                "a full snapshot's process images are in clear only in memory, and {SHM} is not a tmpfs on this \
                 node: mount one there"
            )));
        }
        match std::fs::DirBuilder::new().mode(0o700).create(root) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(internal(root, "create", &e)),
            _ => {}
        }
        // /dev/shm is everyone's: a directory someone else made in its place would show them
        // the images.
        let meta = std::fs::symlink_metadata(root).map_err(|e| internal(root, "stat", &e))?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
            return Err(NodeError::Internal(format!(
                "{} is not a directory of this node's own (owner {}, mode {:o}): remove it",
                root.display(),
                meta.uid(),
                meta.mode() & 0o7777
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
