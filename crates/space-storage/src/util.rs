//! Small filesystem helpers shared by the pool and the template store.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::btrfs;
use crate::error::{IoContext, Result};
use crate::mount;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Creates `path` (and parents) if missing and sets its mode.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<()> {
    std::fs::create_dir_all(path).ctx("create directory", path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).ctx("chmod", path)
}

/// Removes whatever is at `path`: a subvolume (even read-only, with nested subvolumes), a
/// directory tree, or a file. Anything mounted below it is lazily unmounted first. Missing is
/// fine.
pub fn remove_any(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).ctx("stat", path),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path).ctx("remove", path);
    }
    if btrfs::is_subvolume(path)? {
        return match btrfs::delete_subvolume(path) {
            Err(e) if e.errno() == Some(nix::errno::Errno::EBUSY) => {
                mount::unmount_tree(path)?;
                btrfs::delete_subvolume(path)
            }
            other => other,
        };
    }
    mount::unmount_tree(path)?;
    std::fs::remove_dir_all(path).ctx("remove directory", path)
}

/// Writes `bytes` to `path` atomically and durably: temp file, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{}.tmp", name.unwrap_or_default()));
    let mut file =
        OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp).ctx("create", &tmp)?;
    file.write_all(bytes).ctx("write", &tmp)?;
    file.sync_all().ctx("fsync", &tmp)?;
    std::fs::rename(&tmp, path).ctx("rename", path)?;
    File::open(dir).and_then(|d| d.sync_all()).ctx("fsync", dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_and_remove_any() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.json");
        write_atomic(&file, b"{}").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"{}");
        assert!(!dir.path().join(".a.json.tmp").exists());
        let tree = dir.path().join("t/u");
        std::fs::create_dir_all(&tree).unwrap();
        remove_any(&dir.path().join("t")).unwrap();
        remove_any(&dir.path().join("t")).unwrap();
        remove_any(&file).unwrap();
        assert!(!file.exists());
    }
}
