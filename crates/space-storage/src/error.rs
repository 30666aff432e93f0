//! The one error type of the storage crate. Every message names what failed and says what the
//! operator can do about it.

use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(
        "the storage pool needs root (CAP_SYS_ADMIN) to mount btrfs and create subvolumes: run the node agent as root"
    )]
    NotRoot,

    #[error("{action} {path}: {source}{}", io_hint(.source))]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("btrfs {op} on {path} failed: {errno}{}", btrfs_hint(*.errno))]
    Btrfs { op: &'static str, path: PathBuf, errno: Errno },

    #[error("`{program}` is not installed: run `apt-get install {package}`")]
    MissingTool { program: String, package: &'static str },

    #[error("`{command}` failed ({status}): {output}{}", hint_suffix(.hint))]
    Command { command: String, status: String, output: String, hint: &'static str },

    #[error(
        "the storage pool at {lock} is in use by another process ({holder}): stop it first, or share one Pool per data dir"
    )]
    PoolBusy { lock: PathBuf, holder: String },

    #[error("{path} is mounted as {fstype}, not btrfs: unmount it (`umount {path}`) so the pool can be mounted there")]
    NotBtrfsMount { path: PathBuf, fstype: String },

    #[error(
        "{path} did not make a snapshot's root (a read-only subvolume named rootfs): it is not a stream of `send_snapshot`"
    )]
    NotAStream { path: PathBuf },

    #[error(
        "the disk holding {path} has only {} MiB free, too little for a storage pool (half the free space, at \
         least 2 GiB): free some space or give the pool's size (`space serve --pool-size-gib N`)",
        free_bytes >> 20
    )]
    DiskTooSmall { path: PathBuf, free_bytes: u64 },

    #[error("invalid id map (host_base {host_base}, count {count}): {reason}")]
    InvalidIdMap { host_base: u32, count: u32, reason: &'static str },

    #[error("invalid template name '{name}': use 1-63 characters from a-z 0-9 - _ . starting with a letter or digit")]
    InvalidTemplateName { name: String },

    #[error(
        "invalid hostname '{hostname}': use 1-64 characters from a-z A-Z 0-9 - . starting and ending with a letter or digit"
    )]
    InvalidHostname { hostname: String },

    #[error("template {name}{} not found: list templates with `space template ls` or build it first", version.map(|v| format!("@{v}")).unwrap_or_default())]
    TemplateNotFound { name: String, version: Option<u64> },

    #[error("unknown built-in template '{name}': choose one of busybox, debian")]
    UnknownBuiltin { name: String },

    #[error("template metadata {path} is unreadable: {reason}; delete the template and build it again")]
    BadMetadata { path: PathBuf, reason: String },

    #[error("{path}: {reason}")]
    BadTemplateContent { path: PathBuf, reason: String },

    #[error(transparent)]
    Image(#[from] space_image::ImageError),
}

impl StorageError {
    pub(crate) fn io(action: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        StorageError::Io { action, path: path.as_ref().to_path_buf(), source }
    }

    pub(crate) fn btrfs(op: &'static str, path: impl AsRef<Path>, errno: Errno) -> Self {
        StorageError::Btrfs { op, path: path.as_ref().to_path_buf(), errno }
    }

    /// The errno behind this error, when there is one (lets callers treat ENOENT etc. specially).
    pub fn errno(&self) -> Option<Errno> {
        match self {
            StorageError::Btrfs { errno, .. } => Some(*errno),
            StorageError::Io { source, .. } => source.raw_os_error().map(Errno::from_raw),
            _ => None,
        }
    }
}

/// Adds the path and action to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, action: &'static str, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, action: &'static str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| StorageError::io(action, path, e))
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn ctx(self, action: &'static str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| StorageError::io(action, path, io::Error::from(e)))
    }
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() { String::new() } else { format!("; {hint}") }
}

fn io_hint(err: &io::Error) -> String {
    let hint = match err.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EACCES | Errno::EPERM) => "run the node agent as root",
        Some(Errno::ENOSPC) => "the disk or pool is full: delete unused templates, snapshots or sandboxes",
        Some(Errno::EROFS) => "the filesystem or subvolume is read-only",
        Some(Errno::EBUSY) => "something is still mounted there or using it: unmount it first",
        _ => "",
    };
    hint_suffix(hint)
}

fn btrfs_hint(errno: Errno) -> String {
    let hint = match errno {
        Errno::EPERM | Errno::EACCES => "run the node agent as root (needs CAP_SYS_ADMIN)",
        Errno::ENOTTY => "the path is not on a btrfs filesystem",
        Errno::ENOSPC => {
            "the pool is full: delete unused templates, snapshots or sandboxes, or grow pool.img \
             (`truncate -s +20G pool.img && btrfs filesystem resize max <pool>`)"
        }
        Errno::EEXIST => "something already exists at that path: delete it first",
        Errno::EXDEV => "source and destination must be on the same btrfs filesystem",
        Errno::EROFS => "the parent subvolume is read-only",
        Errno::EBUSY => "something is mounted inside it or it is being sent: unmount it first",
        Errno::ENOTEMPTY => "it contains nested subvolumes that could not be deleted",
        _ => "",
    };
    hint_suffix(hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_do() {
        let e = StorageError::btrfs("snapshot", "/x", Errno::ENOSPC);
        assert!(e.to_string().contains("grow pool.img"), "{e}");
        let e = StorageError::TemplateNotFound { name: "debian".into(), version: Some(3) };
        assert!(e.to_string().contains("debian@3"), "{e}");
        let e = StorageError::MissingTool { program: "busybox".into(), package: "busybox-static" };
        assert!(e.to_string().contains("apt-get install busybox-static"));
    }
}
