//! Full snapshots of linux-runtime sandboxes with CRIU (>= 4.2): [`Criu::dump`] checkpoints a
//! sandbox's whole process tree (pid 1 `spaced` and everything below it, with its user, pid,
//! mount, net, ipc, uts and cgroup namespaces), [`Criu::restore`] brings an image back as a
//! new sandbox. Restoring one image twice forks it: each copy gets its own namespaces, cgroup,
//! root filesystem and agent socket.
//!
//! What a sandbox needs from its start sequence for this (done by `space-sandbox-init`):
//! pid 1 is a session leader, runs its executable from a mount inside the sandbox
//! ([`SELF_EXE`]), is dumpable, and listens on a socket created in the sandbox's network
//! namespace and bound through a mount of the sandbox's own host directory at [`AGENT_DIR`].
//! See the `space-sandbox-init` docs for why.
//!
//! The caller's part: drop its agent connections before a dump (a connection to the host is a
//! socket CRIU cannot take along), freeze the tree's cgroup and dump it through that cgroup
//! ([`DumpOptions::freeze_cgroup`]: CRIU leaves it frozen), snapshot the rootfs before thawing,
//! and restore onto a writable copy of that snapshot (then thaw the restored cgroup: CRIU
//! restores the freezer state too). CRIU runs as host root; sandbox images are only as trustworthy as the host
//! directory they are kept in.
//!
//! The CRIU flags, and why each is there, are documented where they are built (`dump_args`
//! in dump.rs, `restore_opts` in restore.rs; restores go through CRIU's RPC, see rpc.rs).

mod dump;
mod error;
mod kerndat;
mod restore;
mod rpc;
mod run;
mod streamer;
mod survivors;
mod userns_image;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub use dump::{DumpOptions, DumpStats, GHOST_TOTAL_LIMIT};
pub use error::{CriuError, Result};
pub use kerndat::CACHE_DIR as KERNDAT_CACHE_DIR;
pub use restore::{CgroupRoot, RestoreOptions, RestoredTree, WORK_PREFIX, sweep_leftover_work};
pub use space_sandbox_init::{AGENT_DIR, SELF_EXE};
pub use streamer::{CaptureError, ImageStore};
pub use survivors::wait_for_survivors;

/// Where `scripts/install-criu.sh` puts its wrapper.
pub const DEFAULT_CRIU: &str = "/var/cache/space/criu/bin/criu";

/// Older versions fail on current kernels: 3.17 on the vdso, 4.1 on inet sockets (>= 6.16).
pub const MIN_VERSION: (u32, u32) = (4, 2);

/// A CRIU binary that is new enough.
#[derive(Debug, Clone)]
pub struct Criu {
    path: PathBuf,
    version: String,
    /// A tmpfs to show CRIU as `/run`, where it keeps its kernel probes (see `kerndat.rs`).
    private_run: Option<PathBuf>,
    /// Where running dumps are recorded ([`wait_for_survivors`]); `None`: nowhere.
    records: Option<PathBuf>,
}

impl Criu {
    /// Finds CRIU: `explicit` if given (and nothing else), else [`DEFAULT_CRIU`], else `criu`
    /// on PATH. Checks that `--version` reports at least [`MIN_VERSION`]. Sets up the cache of
    /// CRIU's kernel probes (mounting a tmpfs at [`KERNDAT_CACHE_DIR`] if the host's `/run` is
    /// not one).
    pub fn locate(explicit: Option<&Path>) -> Result<Criu> {
        let candidates: Vec<PathBuf> = match explicit {
            Some(path) => vec![path.to_path_buf()],
            None => {
                let on_path = std::env::var_os("PATH")
                    .map(|p| std::env::split_paths(&p).map(|dir| dir.join("criu")).collect::<Vec<_>>())
                    .unwrap_or_default();
                std::iter::once(PathBuf::from(DEFAULT_CRIU)).chain(on_path).collect()
            }
        };
        let Some(path) = candidates.iter().find(|p| is_executable(p)) else {
            let tried = candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            return Err(CriuError::NotFound { tried });
        };
        let version = query_version(path)?;
        if !at_least(&version, MIN_VERSION) {
            let needed = format!("{}.{}", MIN_VERSION.0, MIN_VERSION.1);
            return Err(CriuError::TooOld { path: path.clone(), found: version, needed });
        }
        Ok(Criu { path: path.clone(), version, private_run: kerndat::private_run_dir(), records: None })
    }

    /// Records every running dump in `dir`, for a restarted server to wait for
    /// ([`wait_for_survivors`]).
    pub fn with_records(mut self, dir: impl Into<PathBuf>) -> Criu {
        self.records = Some(dir.into());
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version CRIU reports, e.g. `4.2.1`.
    pub fn version(&self) -> String {
        self.version.clone()
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn query_version(path: &Path) -> Result<String> {
    let version_err = |detail: String| CriuError::Version { path: path.to_path_buf(), detail };
    let output = std::process::Command::new(path)
        .arg("--version")
        .output()
        .map_err(|source| CriuError::Spawn { path: path.to_path_buf(), source })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(version_err(format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim())));
    }
    parse_version(&stdout).ok_or_else(|| version_err(format!("no version in {:?}", stdout.trim())))
}

/// The `Version: 4.2.1` line of `criu --version`.
fn parse_version(text: &str) -> Option<String> {
    let version = text.lines().find_map(|l| l.trim().strip_prefix("Version:"))?.trim();
    let numeric = version.split(|c: char| !c.is_ascii_digit() && c != '.').next()?;
    (!numeric.is_empty()).then(|| numeric.to_string())
}

fn at_least(version: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

/// `--flag value` as two arguments.
fn flag(args: &mut Vec<std::ffi::OsString>, name: &str, value: impl AsRef<OsStr>) {
    args.push(name.into());
    args.push(value.as_ref().to_os_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_parsed_and_compared() {
        assert_eq!(parse_version("Version: 4.2.1\nGitID: v4.2.1\n").as_deref(), Some("4.2.1"));
        assert_eq!(parse_version("Version: 3.17.1\n").as_deref(), Some("3.17.1"));
        assert_eq!(parse_version("Version: 4.2-rc1\n").as_deref(), Some("4.2"));
        assert_eq!(parse_version("criu: unknown option\n"), None);
        assert!(at_least("4.2", (4, 2)) && at_least("4.2.1", (4, 2)) && at_least("5.0", (4, 2)));
        assert!(!at_least("3.17.1", (4, 2)) && !at_least("4.1.1", (4, 2)));
    }

    #[test]
    fn a_missing_explicit_criu_says_how_to_install() {
        let err = Criu::locate(Some(Path::new("/nonexistent/criu"))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/criu") && text.contains("scripts/install-criu.sh"), "{text}");
    }

    #[test]
    fn an_old_criu_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("criu");
        std::fs::write(&fake, "#!/bin/sh\necho 'Version: 3.17.1'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        // A test thread forking meanwhile can hold our just-closed write fd until it execs.
        let busy = |e: &CriuError| matches!(e, CriuError::Spawn { source, .. } if source.raw_os_error() == Some(libc::ETXTBSY));
        let mut attempts = 0;
        let err = loop {
            let err = Criu::locate(Some(&fake)).unwrap_err();
            attempts += 1;
            if !busy(&err) || attempts == 100 {
                break err;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(matches!(err, CriuError::TooOld { ref found, .. } if found == "3.17.1"), "{err}");
        assert!(err.to_string().contains("scripts/install-criu.sh"));
    }
}
