//! What the node does at two of CRIU's steps while it restores a sandbox (`space-criu` answers
//! CRIU's step notifications with these):
//!
//! - `setup-namespaces`: the restored network namespace is created empty (see `space-criu`),
//!   so its `lo` is brought up ([`bring_up_loopback`]) before CRIU restores the sockets bound
//!   to it.
//! - `pre-resume`: the agent directory goes back to host root, mode 0700
//!   ([`seal_agent_dir`]), before any restored process runs (see `space-criu`'s restore docs
//!   for why).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use nix::sched::{CloneFlags, setns};

use crate::InitError;
use crate::sys::{ctx, io_ctx, link_up};

/// Brings up `lo` in the network namespace of process `pid`. Enters that namespace on the
/// calling thread and leaves it there: call it on a thread of its own that ends afterwards.
pub fn bring_up_loopback(pid: u32) -> Result<(), InitError> {
    let path = format!("/proc/{pid}/ns/net");
    let netns = File::open(&path).map_err(io_ctx(format!("open {path}")))?;
    // The caller then rewrites the namespace's routes: never the host's.
    let ours = std::fs::metadata("/proc/self/ns/net").map_err(io_ctx("stat /proc/self/ns/net"))?;
    let theirs = netns.metadata().map_err(io_ctx(format!("stat {path}")))?;
    if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(InitError(format!("process {pid} is in the node's own network namespace")));
    }
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
