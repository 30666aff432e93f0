//! What a tree of files costs: its apparent size, and the bytes on disk that no other
//! subvolume shares (what deleting it would free), from each file's extent map (`FIEMAP`).
//! Both walk every file, so callers run them off the request path.

use std::collections::HashSet;
use std::fs::{File, Metadata, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{IoContext, Result};

/// Calls `f` once per regular file below `path` (hard links once; symlinks not followed;
/// other filesystems not entered).
fn for_each_file(path: &Path, mut f: impl FnMut(&Path, &Metadata) -> Result<()>) -> Result<()> {
    let dev = std::fs::symlink_metadata(path).ctx("stat", path)?.dev();
    let (mut seen, mut stack) = (HashSet::new(), vec![path.to_path_buf()]);
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ctx("read directory", &dir)? {
            let entry = entry.ctx("read directory", &dir)?;
            let meta = entry.metadata().ctx("stat", entry.path())?;
            if meta.is_dir() && meta.dev() == dev {
                stack.push(entry.path());
            } else if meta.is_file() && (meta.nlink() == 1 || seen.insert((meta.dev(), meta.ino()))) {
                f(&entry.path(), &meta)?;
            }
        }
    }
    Ok(())
}

/// Apparent size of the regular files below `path`.
pub fn apparent_size(path: &Path) -> Result<u64> {
    let mut total = 0;
    for_each_file(path, |_, meta| {
        total += meta.len();
        Ok(())
    })?;
    Ok(total)
}

/// Bytes of file data below `path` that no other file or subvolume shares. Data stored inline
/// in metadata and data not yet written out are not counted.
pub fn exclusive_size(path: &Path) -> Result<u64> {
    let mut total = 0;
    for_each_file(path, |file, meta| {
        if meta.blocks() > 0 {
            let opened = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(file);
            total += fiemap::unshared_bytes(&opened.ctx("open", file)?).ctx("map extents of", file)?;
        }
        Ok(())
    })?;
    Ok(total)
}

mod fiemap {
    use super::*;

    const EXTENTS_PER_CALL: usize = 64;
    const FLAG_LAST: u32 = 0x1;
    const FLAG_UNKNOWN: u32 = 0x2;
    const FLAG_DELALLOC: u32 = 0x4;
    const FLAG_INLINE: u32 = 0x200;
    const FLAG_SHARED: u32 = 0x2000;

    /// `struct fiemap_extent`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }

    /// `struct fiemap` with room for [`EXTENTS_PER_CALL`] extents.
    #[repr(C)]
    struct Request {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [Extent; EXTENTS_PER_CALL],
    }

    const _: () = assert!(std::mem::size_of::<Extent>() == 56);
    // `FS_IOC_FIEMAP` is `_IOWR('f', 11, struct fiemap)` with the 32-byte header only.
    nix::ioctl_readwrite_bad!(fs_ioc_fiemap, nix::request_code_readwrite!(b'f', 11, 32), Request);

    /// Sum of the lengths of `file`'s extents not shared with anything else.
    pub(super) fn unshared_bytes(file: &File) -> nix::Result<u64> {
        let (mut total, mut start) = (0, 0);
        loop {
            let mut req = Request {
                start,
                length: u64::MAX,
                flags: 0,
                mapped_extents: 0,
                extent_count: EXTENTS_PER_CALL as u32,
                reserved: 0,
                extents: [Extent::default(); EXTENTS_PER_CALL],
            };
            // SAFETY: `file` is open for the call; `req` is a `struct fiemap` header followed by
            // room for `extent_count` extents, which is all the kernel writes.
            unsafe { fs_ioc_fiemap(file.as_raw_fd(), &mut req) }?;
            let mapped = &req.extents[..(req.mapped_extents as usize).min(EXTENTS_PER_CALL)];
            let Some(last) = mapped.last() else { return Ok(total) };
            total += mapped.iter().filter(|e| is_unshared_data(e.flags)).map(|e| e.length).sum::<u64>();
            if last.flags & FLAG_LAST != 0 {
                return Ok(total);
            }
            start = last.logical + last.length;
        }
    }

    fn is_unshared_data(flags: u32) -> bool {
        flags & (FLAG_SHARED | FLAG_INLINE | FLAG_DELALLOC | FLAG_UNKNOWN) == 0
    }

    #[cfg(test)]
    #[test]
    fn request_number_matches_the_kernel() {
        assert_eq!(nix::request_code_readwrite!(b'f', 11, 32), 0xc020_660b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apparent_size_counts_hard_links_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 1000]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/c"), b"xyz").unwrap();
        assert_eq!(apparent_size(dir.path()).unwrap(), 1003);
    }

    #[test]
    fn written_data_is_exclusive() {
        // In the build's target dir, on the disk the workspace is on (ext4 or btrfs here):
        // tmpfs, which a temp dir may be, maps no extents.
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")).unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        File::open(&path).unwrap().sync_all().unwrap();
        // Nothing else shares a new file's data.
        assert_eq!(exclusive_size(dir.path()).unwrap(), 1 << 20);
    }
}
