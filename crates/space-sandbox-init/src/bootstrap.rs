//! The bootstrap process: user namespace, id maps (written by the node), the other
//! namespaces, and the fork that creates the sandbox's pid 1.

use std::io::BufReader;
use std::os::unix::net::UnixStream;

use nix::sched::{CloneFlags, unshare};
use nix::unistd::{ForkResult, Gid, Uid, fork, setgroups, setresgid, setresuid};

use crate::sync::{self, FromInit, InitConfig, ToInit};
use crate::sys::{ctx, io_ctx};
use crate::{InitError, InitOutcome, listener, pid1};

/// Namespaces created after the user namespace (so that it owns them).
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWPID
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP);

pub(crate) fn run(channel: &UnixStream) -> Result<InitOutcome, InitError> {
    if !crate::sys::is_listening_socket(sync::LISTENER_FD) {
        return Err(InitError(format!("fd {} is not a listening socket", sync::LISTENER_FD)));
    }
    let mut reader = BufReader::new(channel);
    let config = match sync::recv(&mut reader).map_err(io_ctx("read config"))? {
        Some(ToInit::Config(config)) => config,
        other => {
            return Err(InitError(format!("expected config from the node, got {other:?}")));
        }
    };
    validate(&config)?;
    // Forked while this process still has the host's credentials (see listener.rs).
    let helper = listener::Helper::spawn(sync::LISTENER_FD, &config.rootfs)?;
    unshare(CloneFlags::CLONE_NEWUSER).map_err(ctx("unshare user namespace"))?;
    sync::send(channel, &FromInit::UserNs).map_err(io_ctx("send user_ns"))?;
    match sync::recv(&mut reader).map_err(io_ctx("wait for id maps"))? {
        Some(ToInit::Mapped) => {}
        other => {
            return Err(InitError(format!("expected mapped from the node, got {other:?}")));
        }
    }
    become_root()?;
    unshare(NAMESPACES).map_err(ctx("unshare namespaces"))?;
    // SAFETY: this process is single-threaded (run_init's contract), so the child may run
    // arbitrary code after fork.
    match unsafe { fork() }.map_err(ctx("fork pid 1"))? {
        ForkResult::Parent { child } => {
            let reported = sync::send(channel, &FromInit::Child { host_pid: child.as_raw() as u32 });
            // Pid 1 reports the helper's failures itself; this only ends the bootstrap.
            let helped = helper.finish(child);
            // The node (a child subreaper) adopts the child.
            std::process::exit(if helped.is_ok() && reported.is_ok() { 0 } else { 1 })
        }
        ForkResult::Child => pid1::run(channel, &config, helper.into_pid1_link()),
    }
}

fn validate(config: &InitConfig) -> Result<(), InitError> {
    if !config.rootfs.is_absolute() {
        return Err(InitError(format!("rootfs {} is not an absolute path", config.rootfs.display())));
    }
    if config.hostname.is_empty() || config.hostname.len() > 64 {
        return Err(InitError(format!("hostname {:?} must be 1 to 64 bytes", config.hostname)));
    }
    Ok(())
}

/// Switches to uid/gid 0 of the new user namespace (host uid = the map's base) and drops the
/// host's supplementary groups, which would otherwise still grant access to host files.
fn become_root() -> Result<(), InitError> {
    setgroups(&[]).map_err(ctx("setgroups"))?;
    let root_gid = Gid::from_raw(0);
    setresgid(root_gid, root_gid, root_gid).map_err(ctx("setresgid 0"))?;
    let root_uid = Uid::from_raw(0);
    setresuid(root_uid, root_uid, root_uid).map_err(ctx("setresuid 0"))
}
