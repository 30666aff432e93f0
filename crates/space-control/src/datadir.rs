//! Permissions of the data directory: nothing in it may be read by another local user.
//!
//! The database holds exec output, environments and replay records; the key files wrap every
//! credential; CRIU images hold whatever the sandboxes had in memory. Each is made readable by
//! root only at every start, and a looser mode found there is fixed loudly (an operator who
//! copied a data dir with `cp -r` gets told, not silently served).
//!
//! The data dir itself is `0711`, not `0700`: a sandbox's root is bind-mounted from inside its
//! user namespace by its mapped root, which must be able to traverse the path to
//! `pool/sandboxes/<id>/rootfs`. `x` alone lists nothing and opens nothing whose name is not
//! known, and every entry that holds data is itself `0600`/`0700`.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the data dir (see the module docs for why not 0700).
pub const DATA_DIR_MODE: u32 = 0o711;

/// Files of the data dir that only root may read or write.
const PRIVATE_FILES: &[&str] = &["space.db", "space.db-wal", "space.db-shm", "admin.key", "pool.lock", "pool.img"];

/// Directories of the data dir that only root may enter.
const PRIVATE_DIRS: &[&str] = &["keys", "images", "memory", "uploads", "staged"];

#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", path.display())]
pub struct DataDirError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn fail(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError {
    move |source| DataDirError { what, path: path.to_owned(), source }
}

/// Creates the data dir if missing and tightens every entry named above. Returns what it had
/// to fix, already logged. (The store creates a new database 0600 itself, and refuses one that
/// is not private: this runs first, so a data dir copied with loose modes is fixed, not refused.)
pub fn secure(data_dir: &Path) -> Result<Vec<String>, DataDirError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATA_DIR_MODE)
        .create(data_dir)
        .map_err(fail("create", data_dir))?;
    let mut fixed = Vec::new();
    tighten(data_dir, DATA_DIR_MODE, &mut fixed)?;
    for name in PRIVATE_FILES {
        tighten(&data_dir.join(name), 0o600, &mut fixed)?;
    }
    for name in PRIVATE_DIRS {
        tighten(&data_dir.join(name), 0o700, &mut fixed)?;
    }
    Ok(fixed)
}

/// Clears every permission bit of `path` beyond `allowed` (a missing path is fine).
fn tighten(path: &Path, allowed: u32, fixed: &mut Vec<String>) -> Result<(), DataDirError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fail("stat", path)(e)),
    };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & !allowed == 0 {
        return Ok(());
    }
    let new = mode & allowed;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(new)).map_err(fail("chmod", path))?;
    let note = format!("{} was mode {mode:04o}, readable beyond root; now {new:04o}", path.display());
    tracing::warn!("{note}");
    fixed.push(note);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_fresh_data_dir_is_private_and_loose_modes_are_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert!(secure(&data).unwrap().is_empty(), "a fresh data dir needs no fixing");
        assert_eq!(mode(&data), 0o711);

        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(data.join("space.db"), "").unwrap();
        std::fs::set_permissions(data.join("space.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir(data.join("images")).unwrap();
        std::fs::set_permissions(data.join("images"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(data.join("admin.key"), "k").unwrap();
        std::fs::set_permissions(data.join("admin.key"), std::fs::Permissions::from_mode(0o640)).unwrap();
        let fixed = secure(&data).unwrap();
        assert_eq!(fixed.len(), 4, "{fixed:?}");
        assert_eq!(mode(&data), 0o711);
        assert_eq!(mode(&data.join("space.db")), 0o600);
        assert_eq!(mode(&data.join("images")), 0o700);
        assert_eq!(mode(&data.join("admin.key")), 0o600);
        assert!(secure(&data).unwrap().is_empty(), "a second pass finds nothing");
    }
}
