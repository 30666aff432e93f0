//! `spaced` as CRIU's action script when a sandbox is restored (`--action-script`: CRIU
//! runs it with no arguments, once per step, naming the step in `CRTOOLS_SCRIPT_ACTION`).
//! A binary instead of a shell script: a restore runs the hook seven times, and each
//! `sh` (plus the tools it starts) cost several milliseconds from CRIU's large process.
//!
//! - `setup-namespaces`: the restored network namespace is created empty (`--empty-ns net`,
//!   see `space-criu`), so its `lo` is brought up here, before CRIU restores the sockets
//!   bound to it.
//! - `pre-resume`: the agent directory ([`AGENT_DIR_ENV`]) goes back to host root, mode
//!   0700, before any restored process runs (see `space-criu`'s restore docs for why).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use nix::sched::{CloneFlags, setns};

use crate::InitError;
use crate::sys::{ctx, io_ctx, link_up};

/// The variable CRIU names the step in.
pub const ACTION_ENV: &str = "CRTOOLS_SCRIPT_ACTION";
/// The host directory of the restored sandbox's agent socket.
pub const AGENT_DIR_ENV: &str = "SPACE_CRIU_AGENT_DIR";
/// The host pid of the restored tree's root, set by CRIU.
const INIT_PID_ENV: &str = "CRTOOLS_INIT_PID";

/// Runs the step `action`; steps without work succeed.
pub fn run_criu_hook(action: &str) -> Result<(), InitError> {
    match action {
        "setup-namespaces" => bring_up_loopback(&env(INIT_PID_ENV)?),
        "pre-resume" => seal_agent_dir(Path::new(&env(AGENT_DIR_ENV)?)),
        _ => Ok(()),
    }
}

fn env(name: &str) -> Result<String, InitError> {
    std::env::var(name).map_err(|_| InitError(format!("{name} is not set")))
}

fn bring_up_loopback(pid: &str) -> Result<(), InitError> {
    let pid: u32 = pid.parse().map_err(|_| InitError(format!("{INIT_PID_ENV}={pid:?} is not a pid")))?;
    let path = format!("/proc/{pid}/ns/net");
    let netns = File::open(&path).map_err(io_ctx(format!("open {path}")))?;
    // This process is single-threaded and exits right after.
    setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(ctx("enter the restored network namespace"))?;
    link_up("lo")
}

/// Gives a restored sandbox's agent directory back to host root, 0700. Opened without
/// following a symlink, then changed through the descriptor: nothing the sandbox may have
/// put at that path is followed.
pub fn seal_agent_dir(dir: &Path) -> Result<(), InitError> {
    let shown = dir.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(io_ctx(format!("open agent dir {shown}")))?;
    std::os::unix::fs::fchown(&file, Some(0), Some(0)).map_err(io_ctx(format!("chown {shown}")))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o700)).map_err(io_ctx(format!("chmod {shown}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_without_work_succeed_and_others_need_their_variables() {
        assert!(run_criu_hook("post-restore").is_ok());
        assert!(run_criu_hook("network-unlock").is_ok());
        // The test runner does not set CRIU's variables.
        if std::env::var_os(INIT_PID_ENV).is_none() {
            assert!(run_criu_hook("setup-namespaces").is_err());
        }
        if std::env::var_os(AGENT_DIR_ENV).is_none() {
            assert!(run_criu_hook("pre-resume").is_err());
        }
    }

    #[test]
    fn a_symlink_is_not_sealed() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(seal_agent_dir(&link).is_err());
        if nix::unistd::geteuid().is_root() {
            seal_agent_dir(&target).unwrap();
            let meta = std::fs::metadata(&target).unwrap();
            assert_eq!(std::os::unix::fs::MetadataExt::mode(&meta) & 0o777, 0o700);
        }
    }
}
