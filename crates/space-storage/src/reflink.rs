//! Whole-file copy-on-write clones (`FICLONE`): how a `vm` sandbox gets its own root disk
//! image from its template's, in O(extents) and sharing every block until either writes.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{IoContext, Result, StorageError};

mod ioctl {
    // `_IOW(0x94, 9, int)`: the generic FICLONE (originally BTRFS_IOC_CLONE).
    nix::ioctl_write_int!(ficlone, 0x94, 9);
}

/// Makes `dest` (created, mode 0600; must not exist) a clone of `source`.
pub fn reflink(source: &Path, dest: &Path) -> Result<()> {
    let src = File::open(source).ctx("open", source)?;
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(dest)
        .ctx("create", dest)?;
    // SAFETY: both fds are open for the whole call; FICLONE takes the source fd by value and
    // writes nothing to user memory.
    let cloned = unsafe { ioctl::ficlone(dst.as_raw_fd(), src.as_raw_fd() as nix::sys::ioctl::ioctl_param_type) };
    if let Err(errno) = cloned {
        drop(dst);
        let _ = std::fs::remove_file(dest);
        return Err(StorageError::btrfs("FICLONE", dest, errno));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_onto_an_existing_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"y").unwrap();
        assert!(reflink(&a, &b).is_err());
        assert_eq!(std::fs::read(&b).unwrap(), b"y", "the existing file is untouched");
    }
}
