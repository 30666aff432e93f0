//! The sandbox's pid 1 between fork and serving: builds the sandbox and confines itself.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};

use crate::listener::Pid1Link;
use crate::sync::{self, FromInit, InitConfig};
use crate::sys::{self, ctx, io_ctx};
use crate::{InitError, InitOutcome, mounts, reexec, security};

pub(crate) fn run(channel: &UnixStream, config: &InitConfig, link: Pid1Link) -> Result<InitOutcome, InitError> {
    let mut warnings = Vec::new();
    security::set_not_dumpable()?;
    // Session leader: CRIU restores a tree whose root leads its own session without --shell-job.
    nix::unistd::setsid().map_err(ctx("setsid"))?;
    let reexec = reexec::self_is_static();
    if !reexec {
        warnings.push(format!(
            "{} is dynamically linked: pid 1 stays the host's binary and the sandbox cannot be checkpointed",
            std::env::args().next().unwrap_or_default()
        ));
    }
    mounts::prepare(config, reexec, &mut warnings)?;
    // The node's listener is replaced by one CRIU can checkpoint (see listener.rs); it must be
    // made before pivot_root, while the host directory it is bound in is still reachable.
    let listener = link.make_listener()?;
    // SAFETY: dup2 onto fd 4, the node's listener inherited from the bootstrap, which no Rust
    // object wraps; the old socket is closed by the replacement.
    let rc = unsafe { libc::dup2(listener.as_raw_fd(), sync::LISTENER_FD) };
    nix::errno::Errno::result(rc).map_err(ctx("install the sandbox's listener"))?;
    drop(listener);
    mounts::finish(config)?;
    nix::unistd::sethostname(&config.hostname).map_err(ctx("sethostname"))?;
    sys::link_up("lo")?;
    nix::unistd::chdir("/").map_err(ctx("chdir /"))?;
    reopen_stdio()?;
    // Keeps 0-2 (the sandbox's /dev/null), the sync channel and the listener.
    sys::close_from(sync::LISTENER_FD as u32 + 1)?;
    sys::set_cloexec(sync::LISTENER_FD, true)?;
    security::drop_capabilities()?;
    security::set_no_new_privs()?;
    security::apply_seccomp()?;
    if reexec {
        return Err(reexec::exec_self(&warnings));
    }
    sync::send(channel, &FromInit::Ready { warnings }).map_err(io_ctx("send ready"))?;
    // SAFETY: fd 4 is the inherited listening socket (checked by the bootstrap); nothing else
    // in this process owns it.
    let listener = UnixListener::from(unsafe { sys::adopt(sync::LISTENER_FD) });
    Ok(InitOutcome { listener })
}

/// Points stdin, stdout and stderr at the sandbox's own /dev/null: the host's /dev/null the
/// node passed must not stay reachable.
fn reopen_stdio() -> Result<(), InitError> {
    let null: OwnedFd =
        std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").map_err(io_ctx("open /dev/null"))?.into();
    for fd in 0..=2 {
        if null.as_raw_fd() != fd {
            // SAFETY: dup2 onto the standard descriptors, which no Rust object owns.
            let rc = unsafe { libc::dup2(null.as_raw_fd(), fd) };
            nix::errno::Errno::result(rc).map_err(ctx(format!("dup2 /dev/null to {fd}")))?;
        }
    }
    if null.as_raw_fd() <= 2 {
        std::mem::forget(null); // it is one of the standard descriptors now
    }
    Ok(())
}
