//! Keeping CRIU's cache of kernel facts between runs.
//!
//! Every CRIU run starts by probing the kernel (vDSO layout, memory tracking, socket and
//! namespace features: ~30–45 ms here). CRIU caches the result in `/run/criu.kdat`, but only
//! when `/run` is a tmpfs, so that the cache cannot outlive a reboot into another kernel.
//! Where the host's `/run` is not a tmpfs, each CRIU run gets a private mount namespace in
//! which [`CACHE_DIR`], a tmpfs mounted once per boot, is `/run`: the cache lives there,
//! with the same lifetime guarantee.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{TMPFS_MAGIC, statfs};

/// Where the cache's tmpfs is mounted when the host's `/run` is not one.
pub const CACHE_DIR: &str = "/var/cache/space/criu-kdat";

/// The directory CRIU keeps its cache in (compiled into CRIU).
const CRIU_RUN_DIR: &str = "/run";

/// Where CRIU runs must see a tmpfs at `/run`: `None` when the host's already is one (or the
/// cache cannot be set up: CRIU then probes on every run, which is only slower).
pub(crate) fn private_run_dir() -> Option<PathBuf> {
    if is_tmpfs(Path::new(CRIU_RUN_DIR)) {
        return None;
    }
    match ensure_tmpfs(Path::new(CACHE_DIR)) {
        Ok(()) => Some(PathBuf::from(CACHE_DIR)),
        Err(e) => {
            tracing::warn!(dir = CACHE_DIR, error = %e, "no cache of CRIU's kernel probes: every CRIU run probes again");
            None
        }
    }
}

fn is_tmpfs(path: &Path) -> bool {
    statfs(path).is_ok_and(|st| st.filesystem_type() == TMPFS_MAGIC)
}

/// Mounts a small tmpfs at `dir` unless one is there. Two servers racing here may stack two
/// mounts; the upper one is used and both are equivalent.
fn ensure_tmpfs(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if is_tmpfs(dir) {
        return Ok(());
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("space-criu-kdat"), dir, Some("tmpfs"), flags, Some("size=1m,mode=0700")).map_err(io::Error::from)
}

/// What the child does between fork and exec to see `dir` as `/run`; built before the fork
/// because the child may not allocate.
pub(crate) struct PrivateRun {
    source: CString,
    target: CString,
}

impl PrivateRun {
    pub(crate) fn new(dir: &Path) -> io::Result<PrivateRun> {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
        Ok(PrivateRun { source: c(dir)?, target: c(Path::new(CRIU_RUN_DIR))? })
    }

    /// In the forked child: a mount namespace of its own (receiving the host's mount events,
    /// sending none back) with the cache directory bound over `/run`.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: unshare takes a flag and touches no memory; no allocation between fork and exec.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let root = c"/";
        // SAFETY: a NUL-terminated static path and null pointers where mount(2) allows them.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_SLAVE | libc::MS_REC,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: NUL-terminated strings built before the fork, alive as long as `self`.
        let rc = unsafe {
            libc::mount(self.source.as_ptr(), self.target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_run_dir_is_a_tmpfs_or_none() {
        // As root this mounts the cache's tmpfs (once per boot); otherwise it gives up.
        match private_run_dir() {
            Some(dir) => assert!(is_tmpfs(&dir), "{} is not a tmpfs", dir.display()),
            None => assert!(is_tmpfs(Path::new(CRIU_RUN_DIR)) || !nix::unistd::geteuid().is_root()),
        }
    }
}
