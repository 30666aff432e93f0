//! Freezing the root filesystem for a consistent disk snapshot of a `vm` sandbox: the
//! guest's page cache and journal live in guest memory, so a copy of the disk image is only
//! whole while the filesystem is frozen (`FIFREEZE` flushes everything and blocks writers).

use std::os::fd::AsRawFd;

use space_proto::Reply;

mod ioctl {
    // `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` of linux/fs.h.
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
}

/// Freezes or thaws `/`. Freezing a frozen or thawing a thawed filesystem is not an error.
pub async fn freeze_root(frozen: bool) -> Reply {
    let done = tokio::task::spawn_blocking(move || freeze("/", frozen)).await;
    match done {
        Ok(Ok(())) => Reply::Ok,
        Ok(Err(e)) => Reply::error(space_proto::ErrorKind::Other, e),
        Err(e) => Reply::error(space_proto::ErrorKind::Other, format!("freeze task: {e}")),
    }
}

fn freeze(path: &str, frozen: bool) -> Result<(), String> {
    let dir = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let mut arg: libc::c_int = 0;
    // SAFETY: `dir` is open for the call; both ioctls take a pointer to an int they ignore.
    let result = unsafe {
        match frozen {
            true => ioctl::fifreeze(dir.as_raw_fd(), &mut arg),
            false => ioctl::fithaw(dir.as_raw_fd(), &mut arg),
        }
    };
    match (result, frozen) {
        // EBUSY: already frozen; EINVAL: not frozen.
        (Ok(_), _) | (Err(nix::errno::Errno::EBUSY), true) | (Err(nix::errno::Errno::EINVAL), false) => Ok(()),
        (Err(e), _) => Err(format!("{} {path}: {e}", if frozen { "FIFREEZE" } else { "FITHAW" })),
    }
}
