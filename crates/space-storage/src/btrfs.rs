//! btrfs subvolume operations through the kernel's ioctls (no `btrfs` CLI on hot paths).
//!
//! Structures and request numbers are from `include/uapi/linux/btrfs.h`.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::statfs::{BTRFS_SUPER_MAGIC, statfs};

use crate::error::{IoContext, Result, StorageError};

/// Inode number of every subvolume's root directory (`BTRFS_FIRST_FREE_OBJECTID`).
pub const SUBVOLUME_ROOT_INODE: u64 = 256;
/// `BTRFS_SUBVOL_RDONLY`: the subvolume flag that makes it read-only.
const SUBVOL_RDONLY: u64 = 1 << 1;
const PATH_NAME_MAX: usize = 4087;
const SUBVOL_NAME_MAX: usize = 4039;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` (the qgroup/size union is left zeroed).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; SUBVOL_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_subvol_wait` (Linux 6.13+).
#[repr(C)]
struct SubvolWait {
    subvolid: u64,
    mode: u32,
    count: u32,
}

// Modes of `BTRFS_IOC_SUBVOL_SYNC_WAIT` (the others: WAIT_FOR_QUEUED 1, PEEK_FIRST 3).
const SUBVOL_SYNC_WAIT_FOR_ONE: u32 = 0;
const SUBVOL_SYNC_COUNT: u32 = 2;
/// Despite its name this reads the head of the kernel's `dead_roots` list: deletions are queued
/// at the tail and the cleaner takes the head, so this is the next subvolume it will clean.
const SUBVOL_SYNC_PEEK_LAST: u32 = 4;

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);
const _: () = assert!(std::mem::size_of::<SubvolWait>() == 16);

mod ioctl {
    use super::{SubvolWait, VolArgs, VolArgsV2};
    const MAGIC: u8 = 0x94;
    /// `_IOW(0x94, 65, struct btrfs_ioctl_subvol_wait)`. Declared write-only, but the kernel
    /// copies the struct back (count, subvolid), hence the `*mut` "bad" wrapper.
    pub const SUBVOL_SYNC_WAIT: nix::sys::ioctl::ioctl_num_type =
        nix::request_code_write!(MAGIC, 65, std::mem::size_of::<SubvolWait>());
    nix::ioctl_readwrite_bad!(subvol_sync_wait, SUBVOL_SYNC_WAIT, SubvolWait);
    nix::ioctl_write_ptr!(subvol_create, MAGIC, 14, VolArgs);
    nix::ioctl_write_ptr!(snap_destroy, MAGIC, 15, VolArgs);
    nix::ioctl_write_ptr!(snap_create_v2, MAGIC, 23, VolArgsV2);
    nix::ioctl_read!(start_sync, MAGIC, 24, u64);
    nix::ioctl_read!(subvol_getflags, MAGIC, 25, u64);
    nix::ioctl_write_ptr!(subvol_setflags, MAGIC, 26, u64);
    nix::ioctl_write_ptr!(snap_destroy_v2, MAGIC, 63, VolArgsV2);
}

/// Copies a single path component into a NUL-terminated ioctl name buffer.
fn fill_name(dst: &mut [u8], name: &OsStr) -> std::result::Result<(), Errno> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    if bytes.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if bytes.len() >= dst.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    dst[..bytes.len()].copy_from_slice(bytes);
    dst[bytes.len()] = 0;
    Ok(())
}

/// Splits `path` into its parent directory and final component.
fn split<'a>(op: &'static str, path: &'a Path) -> Result<(PathBuf, &'a OsStr)> {
    let name = path.file_name().ok_or_else(|| StorageError::btrfs(op, path, Errno::EINVAL))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Opens a directory without following a symlink in the last component.
pub(crate) fn open_dir(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ctx("open directory", path)
}

/// Is `path` on a btrfs filesystem?
pub fn is_btrfs(path: &Path) -> Result<bool> {
    let st = statfs(path).ctx("statfs", path)?;
    Ok(st.filesystem_type() == BTRFS_SUPER_MAGIC)
}

/// Is `path` the root directory of a btrfs subvolume? (A directory with inode 256 on btrfs.)
pub fn is_subvolume(path: &Path) -> Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(StorageError::io("stat", path, e)),
    };
    Ok(meta.is_dir() && meta.ino() == SUBVOLUME_ROOT_INODE && is_btrfs(path)?)
}

/// Creates an empty subvolume at `path` (its parent must exist on btrfs).
pub fn create_subvolume(path: &Path) -> Result<()> {
    const OP: &str = "subvolume create";
    let (parent, name) = split(OP, path)?;
    let mut args = VolArgs { fd: 0, name: [0; PATH_NAME_MAX + 1] };
    fill_name(&mut args.name, name).map_err(|e| StorageError::btrfs(OP, path, e))?;
    let dir = open_dir(&parent)?;
    // SAFETY: `dir` is an open directory fd for the whole call and `args` is a fully initialised
    // `btrfs_ioctl_vol_args` (repr(C), size checked above) with a NUL-terminated name; the kernel
    // only reads it.
    unsafe { ioctl::subvol_create(dir.as_raw_fd(), &args) }.map_err(|e| StorageError::btrfs(OP, path, e))?;
    Ok(())
}

/// Snapshots the subvolume `source` to the new path `dest` (same filesystem). O(1): one ioctl.
pub fn snapshot(source: &Path, dest: &Path, readonly: bool) -> Result<()> {
    const OP: &str = "snapshot";
    let src = open_dir(source)?;
    let meta = src.metadata().ctx("stat", source)?;
    if meta.ino() != SUBVOLUME_ROOT_INODE {
        // The kernel would silently snapshot the subvolume *containing* `source`.
        return Err(StorageError::BadTemplateContent {
            path: source.to_path_buf(),
            reason: "not a btrfs subvolume, cannot snapshot it".into(),
        });
    }
    let (parent, name) = split(OP, dest)?;
    let mut args = VolArgsV2 {
        fd: i64::from(src.as_raw_fd()),
        transid: 0,
        flags: if readonly { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; SUBVOL_NAME_MAX + 1],
    };
    fill_name(&mut args.name, name).map_err(|e| StorageError::btrfs(OP, dest, e))?;
    let dir = open_dir(&parent)?;
    // SAFETY: `dir` and `src` (whose fd is in `args.fd`) stay open for the whole call; `args` is
    // a fully initialised `btrfs_ioctl_vol_args_v2` with a NUL-terminated name and no qgroup
    // pointer (flags has no QGROUP_INHERIT bit); the kernel only reads it.
    unsafe { ioctl::snap_create_v2(dir.as_raw_fd(), &args) }.map_err(|e| StorageError::btrfs(OP, dest, e))?;
    Ok(())
}

/// Deletes the subvolume at `path`, with its content, even when it is read-only. Nested
/// subvolumes inside it are deleted first.
pub fn delete_subvolume(path: &Path) -> Result<()> {
    match destroy(path) {
        Err(e) if e.errno() == Some(Errno::ENOTEMPTY) => {
            tracing::debug!(path = %path.display(), "deleting nested subvolumes first");
            delete_nested(path)?;
            destroy(path)
        }
        other => other,
    }
}

fn destroy(path: &Path) -> Result<()> {
    const OP: &str = "subvolume delete";
    let (parent, name) = split(OP, path)?;
    let dir = open_dir(&parent)?;
    let mut v2 = VolArgsV2 { fd: 0, transid: 0, flags: 0, unused: [0; 4], name: [0; SUBVOL_NAME_MAX + 1] };
    fill_name(&mut v2.name, name).map_err(|e| StorageError::btrfs(OP, path, e))?;
    // SAFETY: `dir` is an open directory fd for the whole call; `v2` is a fully initialised
    // `btrfs_ioctl_vol_args_v2` naming a child of `dir` (no SPEC_BY_ID flag); the kernel only
    // reads it.
    let res = unsafe { ioctl::snap_destroy_v2(dir.as_raw_fd(), &v2) };
    match res {
        // Kernels before 5.7 lack the v2 ioctl.
        Err(Errno::ENOTTY) => destroy_v1(&dir, name, path),
        other => other.map(drop).map_err(|e| StorageError::btrfs(OP, path, e)),
    }
}

fn destroy_v1(dir: &File, name: &OsStr, path: &Path) -> Result<()> {
    const OP: &str = "subvolume delete";
    let mut args = VolArgs { fd: 0, name: [0; PATH_NAME_MAX + 1] };
    fill_name(&mut args.name, name).map_err(|e| StorageError::btrfs(OP, path, e))?;
    // SAFETY: as in `destroy`: open fd, fully initialised `btrfs_ioctl_vol_args`, read-only use.
    unsafe { ioctl::snap_destroy(dir.as_raw_fd(), &args) }.map_err(|e| StorageError::btrfs(OP, path, e))?;
    Ok(())
}

/// Deletes every subvolume nested anywhere below `path` (which is made writable first, so the
/// nested entries can be unlinked from it).
fn delete_nested(path: &Path) -> Result<()> {
    if is_readonly(path)? {
        set_readonly(path, false)?;
    }
    let root_dev = std::fs::symlink_metadata(path).ctx("stat", path)?.dev();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ctx("read directory", &dir)? {
            let child = entry.ctx("read directory", &dir)?.path();
            let meta = std::fs::symlink_metadata(&child).ctx("stat", &child)?;
            if !meta.is_dir() {
                continue;
            }
            if meta.dev() == root_dev {
                stack.push(child);
            } else if meta.ino() == SUBVOLUME_ROOT_INODE {
                delete_subvolume(&child)?;
            }
        }
    }
    Ok(())
}

fn get_flags(file: &File, path: &Path) -> Result<u64> {
    let mut flags: u64 = 0;
    // SAFETY: `file` is open for the call and `flags` is a valid, writable u64 the kernel fills.
    unsafe { ioctl::subvol_getflags(file.as_raw_fd(), &mut flags) }
        .map_err(|e| StorageError::btrfs("get subvolume flags", path, e))?;
    Ok(flags)
}

/// Is the subvolume at `path` read-only?
pub fn is_readonly(path: &Path) -> Result<bool> {
    let dir = open_dir(path)?;
    Ok(get_flags(&dir, path)? & SUBVOL_RDONLY != 0)
}

/// Makes the subvolume at `path` read-only (or writable again).
pub fn set_readonly(path: &Path, readonly: bool) -> Result<()> {
    let dir = open_dir(path)?;
    let old = get_flags(&dir, path)?;
    let new = if readonly { old | SUBVOL_RDONLY } else { old & !SUBVOL_RDONLY };
    if new == old {
        return Ok(());
    }
    // SAFETY: `dir` is open for the call and `new` is a valid u64 the kernel only reads.
    unsafe { ioctl::subvol_setflags(dir.as_raw_fd(), &new) }
        .map_err(|e| StorageError::btrfs("set subvolume flags", path, e))?;
    Ok(())
}

/// One `BTRFS_IOC_SUBVOL_SYNC_WAIT` call; a signal during a wait restarts it.
fn subvol_sync(dir: &File, args: &mut SubvolWait) -> std::result::Result<(), Errno> {
    loop {
        // SAFETY: `dir` is an open fd on the filesystem for the whole call and `args` is a fully
        // initialised, exclusively borrowed `btrfs_ioctl_subvol_wait` (repr(C), size checked
        // above) that the kernel reads and may overwrite with another valid one.
        match unsafe { ioctl::subvol_sync_wait(dir.as_raw_fd(), args) } {
            Err(Errno::EINTR) => continue,
            other => return other.map(drop),
        }
    }
}

/// The kernel (or filesystem) has no `BTRFS_IOC_SUBVOL_SYNC_WAIT`, or not this mode.
fn sync_wait_unsupported(errno: Errno) -> bool {
    matches!(errno, Errno::ENOTTY | Errno::EINVAL | Errno::EOPNOTSUPP)
}

/// How many deleted subvolumes of the filesystem holding `fs_path` are queued for the kernel's
/// cleaner thread and not yet cleaned (the one being cleaned right now is not counted). `None`
/// when the kernel cannot tell: before Linux 6.13, or when `fs_path` is not on btrfs.
pub fn pending_deletions(fs_path: &Path) -> Result<Option<u64>> {
    let dir = open_dir(fs_path)?;
    let mut args = SubvolWait { subvolid: 0, mode: SUBVOL_SYNC_COUNT, count: 0 };
    match subvol_sync(&dir, &mut args) {
        Ok(()) => Ok(Some(u64::from(args.count))),
        Err(e) if sync_wait_unsupported(e) => Ok(None),
        Err(e) => Err(StorageError::btrfs("count pending subvolume deletions", fs_path, e)),
    }
}

/// Blocks until the kernel's cleaner has finished the next queued subvolume deletion of the
/// filesystem holding `fs_path` (and the kernel has forgotten the subvolume). Returns at once
/// when nothing is queued, and where [`pending_deletions`] is `None`.
pub fn wait_for_one_deletion(fs_path: &Path) -> Result<()> {
    const OP: &str = "wait for subvolume cleaning";
    let dir = open_dir(fs_path)?;
    let mut args = SubvolWait { subvolid: 0, mode: SUBVOL_SYNC_PEEK_LAST, count: 0 };
    match subvol_sync(&dir, &mut args) {
        Ok(()) => {}
        Err(e) if sync_wait_unsupported(e) => return Ok(()),
        Err(e) => return Err(StorageError::btrfs(OP, fs_path, e)),
    }
    if args.subvolid == 0 {
        return Ok(());
    }
    // WAIT_FOR_ONE needs an id: with 0 it answers ENOENT at once instead of waiting.
    args.mode = SUBVOL_SYNC_WAIT_FOR_ONE;
    // The cleaner starts when the transaction thread wakes it, and a cleaned subvolume is only
    // forgotten (what WAIT_FOR_ONE polls for, once a second) at the next commit: on an idle
    // filesystem both take up to the `commit=` interval, 30 s by default. Starting a commit
    // every second while waiting (a no-op when nothing is dirty) keeps the wait close to the
    // cleaning time.
    let done = AtomicBool::new(false);
    let res = std::thread::scope(|scope| {
        let kicker = std::thread::Builder::new().name("btrfs-commit-kick".into()).spawn_scoped(scope, || {
            while !done.load(Ordering::Acquire) {
                start_commit(&dir, fs_path);
                std::thread::park_timeout(Duration::from_secs(1));
            }
        });
        if let Err(e) = &kicker {
            tracing::debug!(error = %e, "no commit thread: waiting for the periodic commit instead");
        }
        let res = subvol_sync(&dir, &mut args);
        done.store(true, Ordering::Release);
        if let Ok(kicker) = kicker {
            kicker.thread().unpark();
        }
        res
    });
    match res {
        // ENOENT is what the kernel answers once the subvolume is gone, after waiting or not.
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(StorageError::btrfs(OP, fs_path, e)),
    }
}

/// Starts committing the running transaction, if there is one, without waiting for it.
fn start_commit(dir: &File, path: &Path) {
    let mut transid: u64 = 0;
    // SAFETY: `dir` is open for the call and `transid` is a valid, writable u64 the kernel fills.
    if let Err(e) = unsafe { ioctl::start_sync(dir.as_raw_fd(), &mut transid) } {
        // Only a nudge: without it the wait is just longer.
        tracing::debug!(path = %path.display(), error = %e, "btrfs start sync failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_components() {
        let mut buf = [0u8; 16];
        assert_eq!(fill_name(&mut buf, OsStr::new("rootfs")), Ok(()));
        assert_eq!(&buf[..7], b"rootfs\0");
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert_eq!(fill_name(&mut buf, OsStr::new(bad)), Err(Errno::EINVAL), "{bad:?}");
        }
        let long = "x".repeat(16);
        assert_eq!(fill_name(&mut buf, OsStr::new(&long)), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn split_handles_relative_paths() {
        let (parent, name) = split("t", Path::new("rootfs")).unwrap();
        assert_eq!(parent, PathBuf::from("."));
        assert_eq!(name, "rootfs");
        assert!(split("t", Path::new("/")).is_err());
    }

    #[test]
    fn subvol_sync_wait_request_matches_the_kernel() {
        // _IOW(0x94, 65, 16 bytes): dir write (1) << 30 | size << 16 | type << 8 | nr.
        assert_eq!(ioctl::SUBVOL_SYNC_WAIT, 0x4010_9441);
        assert!(sync_wait_unsupported(Errno::ENOTTY));
        assert!(!sync_wait_unsupported(Errno::EPERM));
    }
}
