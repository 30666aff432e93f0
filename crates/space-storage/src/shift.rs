//! Shifts a template tree's ownership into the storage id range, once, at build time, so
//! sandboxes never need a per-start chown (each sees the storage range as its own range
//! through an idmapped mount, see the linux runtime).
//!
//! For every entry (never following symlinks): uid/gid `n` → `host_base + n`; setuid/setgid
//! bits are re-applied after `lchown` (which clears them); file capabilities are rewritten as
//! namespaced (v3) capabilities owned by the mapped root; device nodes other than the harmless
//! ones a rootfs needs (null, zero, full, random, urandom, tty, ptmx) are removed. Hard links
//! are shifted once.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::{major, minor};

use crate::error::{IoContext, Result};
use crate::progress::{Progress, ProgressFn};
use space_api::IdMap;

const CAPS_XATTR: &std::ffi::CStr = c"security.capability";
const CAP_REVISION_MASK: u32 = 0xFF00_0000;
const CAP_REVISION_1: u32 = 0x0100_0000;
const CAP_REVISION_2: u32 = 0x0200_0000;
const CAP_REVISION_3: u32 = 0x0300_0000;
const CAP_FLAGS_EFFECTIVE: u32 = 0x0000_0001;
const ALLOWED_DEVICES: [(u64, u64); 7] = [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)];
const PROGRESS_EVERY: u64 = 2000;

/// What a shift saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ShiftStats {
    pub entries: u64,
    /// Apparent size of regular files, each inode counted once.
    pub size_bytes: u64,
    pub removed_devices: u64,
}

/// Shifts everything under (and including) `root`. Does not descend into other filesystems.
pub fn shift_tree(root: &Path, map: IdMap, progress: ProgressFn) -> Result<ShiftStats> {
    let root_dev = std::fs::symlink_metadata(root).ctx("stat", root)?.dev();
    let mut stats = ShiftStats::default();
    let mut seen = HashSet::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    shift_entry(root, &std::fs::symlink_metadata(root).ctx("stat", root)?, map)?;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ctx("read directory", &dir)? {
            let path = entry.ctx("read directory", &dir)?.path();
            let meta = std::fs::symlink_metadata(&path).ctx("stat", &path)?;
            if meta.dev() != root_dev {
                continue;
            }
            if is_unwanted_device(&meta) {
                tracing::warn!(path = %path.display(), "removing device node from template");
                std::fs::remove_file(&path).ctx("remove device node", &path)?;
                stats.removed_devices += 1;
                continue;
            }
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            if meta.is_file() {
                stats.size_bytes += meta.len();
            }
            shift_entry(&path, &meta, map)?;
            if meta.is_dir() {
                stack.push(path);
            }
            stats.entries += 1;
            if stats.entries.is_multiple_of(PROGRESS_EVERY) {
                progress(Progress::new("shifting ownership", stats.entries, None));
            }
        }
    }
    progress(Progress::new("shifting ownership", stats.entries, Some(stats.entries)));
    Ok(stats)
}

fn is_unwanted_device(meta: &Metadata) -> bool {
    let ft = meta.file_type();
    if !(ft.is_char_device() || ft.is_block_device()) {
        return false;
    }
    let dev = (major(meta.rdev()), minor(meta.rdev()));
    ft.is_block_device() || !ALLOWED_DEVICES.contains(&dev)
}

fn shift_entry(path: &Path, meta: &Metadata, map: IdMap) -> Result<()> {
    let caps = if meta.is_file() { read_caps(path)? } else { None };
    let (uid, gid) = (map.to_host(meta.uid()), map.to_host(meta.gid()));
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).ctx("chown", path)?;
    let mode = meta.mode() & 0o7777;
    if !meta.file_type().is_symlink() && mode & 0o6000 != 0 {
        let perms = std::fs::Permissions::from_mode(mode);
        std::fs::set_permissions(path, perms).ctx("chmod", path)?;
    }
    if let Some(caps) = caps {
        let shifted = namespaced_caps(&caps, map).unwrap_or_default();
        write_caps(path, &shifted)?;
    }
    Ok(())
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        .ctx("encode path", path)
}

fn read_caps(path: &Path) -> Result<Option<Vec<u8>>> {
    let cpath = c_path(path)?;
    let mut buf = [0u8; 64];
    // SAFETY: `cpath` and `CAPS_XATTR` are NUL-terminated and live for the call; `buf` is
    // writable for `buf.len()` bytes, which is what we pass as its size.
    let n = unsafe { libc::lgetxattr(cpath.as_ptr(), CAPS_XATTR.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    match Errno::result(n) {
        Ok(n) => Ok(Some(buf[..n as usize].to_vec())),
        Err(Errno::ENODATA | Errno::EOPNOTSUPP) => Ok(None),
        Err(e) => Err(e).ctx("read file capabilities", path),
    }
}

fn write_caps(path: &Path, value: &[u8]) -> Result<()> {
    if value.is_empty() {
        tracing::warn!(path = %path.display(), "dropping unparseable file capabilities");
        return Ok(());
    }
    let cpath = c_path(path)?;
    // SAFETY: `cpath` and `CAPS_XATTR` are NUL-terminated and live for the call; `value` is
    // readable for `value.len()` bytes.
    let rc = unsafe { libc::lsetxattr(cpath.as_ptr(), CAPS_XATTR.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    Errno::result(rc).map(drop).ctx("write file capabilities", path)
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Converts a `security.capability` value (v1, v2 or v3) into a v3 value whose root is the
/// mapped root, so the capabilities apply inside the sandbox's user namespace. `None` if the
/// value is not a capability set.
pub fn namespaced_caps(value: &[u8], map: IdMap) -> Option<Vec<u8>> {
    let magic = le32(value, 0);
    let (words, rootid) = match (magic & CAP_REVISION_MASK, value.len()) {
        (CAP_REVISION_1, 12) => (1, 0),
        (CAP_REVISION_2, 20) => (2, 0),
        (CAP_REVISION_3, 24) => (2, le32(value, 20)),
        _ => return None,
    };
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&(CAP_REVISION_3 | (magic & CAP_FLAGS_EFFECTIVE)).to_le_bytes());
    for i in 0..2 {
        let (permitted, inheritable) =
            if i < words { (le32(value, 4 + 8 * i), le32(value, 8 + 8 * i)) } else { (0, 0) };
        out.extend_from_slice(&permitted.to_le_bytes());
        out.extend_from_slice(&inheritable.to_le_bytes());
    }
    out.extend_from_slice(&map.to_host(rootid).to_le_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(effective: bool, permitted: u32) -> Vec<u8> {
        let mut v = Vec::new();
        let magic = CAP_REVISION_2 | u32::from(effective);
        for w in [magic, permitted, 0, 0, 0] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v
    }

    #[test]
    fn v2_caps_become_v3_owned_by_mapped_root() {
        let out = namespaced_caps(&v2(true, 1 << 13), IdMap::default()).unwrap();
        assert_eq!(out.len(), 24);
        assert_eq!(le32(&out, 0), CAP_REVISION_3 | CAP_FLAGS_EFFECTIVE);
        assert_eq!(le32(&out, 4), 1 << 13);
        assert_eq!(le32(&out, 20), 100_000);
    }

    #[test]
    fn v3_rootid_is_shifted_and_garbage_rejected() {
        let mut v3 = v2(false, 5);
        v3[3] = 0x03;
        v3.extend_from_slice(&1000u32.to_le_bytes());
        let out = namespaced_caps(&v3, IdMap::default()).unwrap();
        assert_eq!(le32(&out, 0), CAP_REVISION_3);
        assert_eq!(le32(&out, 20), 101_000);
        assert!(namespaced_caps(&[1, 2, 3], IdMap::default()).is_none());
        assert!(namespaced_caps(&v2(true, 1)[..16], IdMap::default()).is_none());
    }
}
