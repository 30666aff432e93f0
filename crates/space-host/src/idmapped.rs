//! Idmapped mounts of sandbox roots: files stay owned by the storage's id range on disk, and
//! each sandbox sees them through a mount that maps that range to the sandbox's own host range
//! (see `ranges.rs`). Only host root can make one (the kernel wants `CAP_SYS_ADMIN` over the
//! filesystem's user namespace); the sandbox gets it as a detached mount to attach.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::process;

/// A user namespace whose map is `inner outer count` (uid and gid), held by a descriptor only:
/// the process created in it exits before this returns. Used as a mount's idmapping, never to
/// run anything.
pub fn mapping_userns(inner: u32, outer: u32, count: u32) -> io::Result<OwnedFd> {
    // Close-on-exec: no program another thread spawns meanwhile keeps the write end open.
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let child = clone_into_userns(read_end.as_raw_fd(), write_end.as_raw_fd())?;
    drop(read_end);
    // Our unreaped child: the pid cannot name another process before the wait below.
    let made = process::write_maps(child, inner, outer, count)
        .and_then(|()| std::fs::File::open(format!("/proc/{child}/ns/user")).map(OwnedFd::from));
    drop(write_end); // the child's read returns: it exits
    let mut status = 0;
    // SAFETY: waitpid on our own child, into a local int.
    let rc = unsafe { libc::waitpid(child as libc::pid_t, &mut status, 0) };
    if rc < 0 {
        tracing::warn!(pid = child, error = %io::Error::last_os_error(), "cannot reap an id map's holder");
    }
    made
}

/// Forks a child in a new user namespace that closes its copy of `write_fd`, waits until
/// `wait_fd` (the pipe's other end) reaches end of file, then exits. Returns its pid.
fn clone_into_userns(wait_fd: i32, write_fd: i32) -> io::Result<u32> {
    // SAFETY: a raw clone without a new stack behaves like fork; the child only makes the
    // async-signal-safe calls close, read and _exit (this process may be multi-threaded).
    let pid =
        unsafe { libc::syscall(libc::SYS_clone, libc::CLONE_NEWUSER | libc::SIGCHLD, 0usize, 0usize, 0usize, 0usize) };
    match pid {
        0 => {
            let mut byte = 0u8;
            // SAFETY: read into a local byte from an fd this process holds; then _exit, which
            // runs nothing of the parent's state.
            unsafe {
                libc::close(write_fd);
                while libc::read(wait_fd, (&raw mut byte).cast(), 1) > 0 {}
                libc::_exit(0)
            }
        }
        pid if pid < 0 => Err(io::Error::last_os_error()),
        pid => Ok(pid as u32),
    }
}

/// A detached copy of the mount at `path` (not recursive: a sandbox root is one subvolume),
/// idmapped through `userns`: the sandbox's pid 1 attaches it (or CRIU's restore, through a
/// path space-criu attaches it at).
pub fn idmapped_clone(path: &Path, userns: &impl AsFd) -> io::Result<OwnedFd> {
    let cpath = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    // SAFETY: cpath is NUL-terminated and outlives the call, which returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, cpath.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree just returned this fd; nothing else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_fd().as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a valid mount_attr of the size passed, read only during the call; the
    // empty path with AT_EMPTY_PATH names `tree` itself.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &raw const attr,
            size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// Root only: a file owned by 100000 on disk shows as 300000 through the mount.
    #[test]
    fn the_clone_shows_files_in_the_mapped_range() {
        if !nix::unistd::geteuid().is_root() {
            let err = mapping_userns(100_000, 300_000, 65_536).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        std::os::unix::fs::lchown(dir.path().join("f"), Some(100_005), Some(100_006)).unwrap();
        let userns = mapping_userns(100_000, 300_000, 65_536).unwrap();
        let tree = idmapped_clone(dir.path(), &userns).unwrap();
        let meta = std::fs::metadata(format!("/proc/self/fd/{}/f", tree.as_raw_fd())).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (300_005, 300_006));
        assert_eq!(std::fs::metadata(dir.path().join("f")).unwrap().uid(), 100_005);
    }
}
