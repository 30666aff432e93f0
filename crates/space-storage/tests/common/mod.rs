//! Shared fixture of the integration tests: a pool on a loop-mounted image under a fresh
//! tempdir (on this host /tmp is not btrfs, so the image path is exercised), cleaned up on
//! drop even when the test fails.

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use space_storage::{Pool, PoolOptions, btrfs};

/// Fails the test when not running as root: a skipped test would pass without testing anything.
/// Returns `Some` so callers keep their `?`.
pub fn require_root(test: &str) -> Option<()> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{test} needs root (mounts btrfs, creates subvolumes, chowns): run it as root (scripts/test.sh)"
    );
    Some(())
}

/// A pool in a tempdir. Drop deletes every subvolume it holds, unmounts and removes the dir.
pub struct TestPool {
    pool: Option<Pool>,
    dir: Option<tempfile::TempDir>,
    pub options: PoolOptions,
}

impl TestPool {
    pub fn new(test: &str) -> Option<TestPool> {
        require_root(test)?;
        let dir = tempfile::Builder::new().prefix(&format!("space-storage-{test}-")).tempdir().expect("tempdir");
        let mut fixture = TestPool { pool: None, dir: Some(dir), options: PoolOptions::default() };
        fixture.reopen();
        Some(fixture)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.as_ref().expect("dir").path().to_path_buf()
    }

    pub fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool is open")
    }

    /// Drops the pool (releasing its lock) without unmounting.
    pub fn close(&mut self) {
        self.pool = None;
    }

    /// Closes and opens the pool again.
    pub fn reopen(&mut self) {
        self.close();
        let pool = Pool::open(self.data_dir(), self.options).expect("open pool");
        self.pool = Some(pool);
    }

    fn delete_everything(pool: &Pool) {
        for id in pool.list_sandbox_roots().unwrap_or_default() {
            let _ = pool.delete_sandbox_root(&id);
        }
        for (session, snapshot) in pool.list_snapshots().unwrap_or_default() {
            let _ = pool.delete_snapshot(&session, &snapshot);
        }
        let _ = pool.reclaim_trash(u64::MAX);
        for t in pool.templates().list().unwrap_or_default() {
            let _ = pool.templates().delete(&t.name, t.version);
        }
        for dir in [pool.snapshots_dir(), pool.pods_dir(), pool.root().join("templates")] {
            delete_subvolumes_in(&dir);
        }
    }
}

/// Deletes the subvolumes directly in `dir`.
pub fn delete_subvolumes_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if btrfs::is_subvolume(&entry.path()).unwrap_or(false) {
            let _ = btrfs::delete_subvolume(&entry.path());
        }
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        if self.pool.is_none() && self.dir.is_some() {
            // Reopen so leftovers of a failed test can be found and deleted.
            self.pool = Pool::open(self.data_dir(), self.options).ok();
        }
        if let Some(pool) = self.pool.take() {
            Self::delete_everything(&pool);
        }
        if let Some(dir) = self.dir.take() {
            if let Err(e) = Pool::unmount(dir.path()) {
                eprintln!("cleanup: unmount failed: {e}");
            }
            drop(dir);
        }
    }
}

/// Is something mounted exactly at `path`?
pub fn is_mounted(path: &Path) -> bool {
    space_storage::mount::mount_at(path).expect("mountinfo").is_some()
}

pub fn owner(path: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid())
}

pub fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

pub fn is_erofs(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(libc::EROFS)
}

/// p50 and p90 of durations in microseconds.
pub fn percentiles(mut micros: Vec<u128>) -> (u128, u128) {
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() as f64 * q) as usize).min(micros.len() - 1)];
    (at(0.5), at(0.9))
}
