//! The sandbox's pid 1 between fork and serving: builds the sandbox and confines itself.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};

use crate::sync::{self, FromInit, InitConfig};
use crate::sys::{self, ctx, io_ctx};
use crate::{InitError, InitOutcome, mounts, security};

pub(crate) fn run(channel: &UnixStream, config: &InitConfig) -> Result<InitOutcome, InitError> {
    let mut warnings = Vec::new();
    security::set_not_dumpable()?;
    nix::unistd::setsid().map_err(ctx("setsid"))?;
    mounts::setup(config, &mut warnings)?;
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
