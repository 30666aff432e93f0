//! In-sandbox half of the linux runtime, run by `spaced init`.
//!
//! The node starts `spaced init` with fd 3 = the sync channel (see [`sync`]), fd 4 = a
//! bound, listening unix socket whose path only the node can see, and (when the config says
//! so) fd 5 = the sandbox's root as a detached idmapped mount, which pid 1 attaches at the
//! rootfs path. [`run_init`] then:
//! 1. (bootstrap process) reads the [`sync::InitConfig`], enters a new user namespace and waits
//!    for the node to write its uid/gid maps and put it into the sandbox's cgroups;
//! 2. becomes root of that namespace, unshares pid, mount, net, ipc, uts and cgroup namespaces
//!    and forks; the bootstrap reports the child's host pid and exits (the node, a child
//!    subreaper, inherits the child);
//! 3. (the child, pid 1 of the sandbox) builds the mount namespace, replaces the node's
//!    listener by one CRIU can checkpoint (same host path, but created in the sandbox's network
//!    namespace and bound through a mount of the socket's host directory at [`AGENT_DIR`], see
//!    `listener.rs`),
//!    pivots into the rootfs,
//!    sets the hostname, brings up `lo`, closes every other fd, drops capabilities, sets
//!    no_new_privs, installs the seccomp filter;
//! 4. executes its own binary again from inside the sandbox ([`SELF_EXE`], see `reexec.rs`:
//!    CRIU can only checkpoint a pid 1 whose executable and memory belong to the sandbox); the
//!    new image, entering [`run_init`] as pid 1, reports `Ready`, closes the sync channel and
//!    returns the listener. A dynamically linked binary skips the exec (and reports `Ready`
//!    from step 3).
//!
//! Any failure is reported on the sync channel as one line naming the step and errno
//! ("mount /proc: EPERM (...)"), and [`run_init`] returns it as an error: the caller must then
//! exit non-zero. Must be called while the process is single-threaded (before any runtime).

mod bootstrap;
mod confinement;
mod listener;
mod mounts;
mod pid1;
mod reexec;
mod restore_steps;
mod security;
pub mod sync;
mod sys;

use std::os::unix::net::{UnixListener, UnixStream};

pub use confinement::{Confinement, check_tree as check_restored_tree};
pub use listener::AGENT_DIR;
pub use reexec::SELF_EXE;
pub use restore_steps::{bring_up_loopback, seal_agent_dir};
pub use security::{KEPT_CAPABILITIES, seccomp_programs, seccomp_rules};
pub use sys::attach_mount;

/// What pid 1 of a fresh sandbox gets back from [`run_init`].
pub struct InitOutcome {
    /// The node's connections arrive here.
    pub listener: UnixListener,
}

#[derive(Debug, thiserror::Error)]
#[error("sandbox init: {0}")]
pub struct InitError(pub String);

/// Runs the bootstrap protocol; returns only in the sandbox's pid 1 (the bootstrap process
/// exits inside). On error the caller must exit with a non-zero status.
pub fn run_init() -> Result<InitOutcome, InitError> {
    if !sys::is_socket(sync::SYNC_FD) {
        return Err(InitError(format!(
            "fd {} is not the sync socket: start `spaced init` from the node",
            sync::SYNC_FD
        )));
    }
    // SAFETY: fd 3 is the inherited sync socket (checked above); nothing else owns it.
    let channel = UnixStream::from(unsafe { sys::adopt(sync::SYNC_FD) });
    // Only the re-executed sandbox init is pid 1: the node starts the bootstrap in its own pid
    // namespace, as its child.
    let stage = if nix::unistd::getpid().as_raw() == 1 {
        sys::set_cloexec(sync::SYNC_FD, true).and_then(|()| reexec::resume(&channel))
    } else {
        sys::set_cloexec(sync::SYNC_FD, true).and_then(|()| bootstrap::run(&channel))
    };
    match stage {
        Ok(outcome) => Ok(outcome),
        Err(e) => {
            let _ = sync::send(&channel, &sync::FromInit::Error { message: e.0.clone() });
            Err(e)
        }
    }
}

/// For processes `spaced` starts: resets the OOM score adjustment inherited from pid 1 (which
/// the node lowers so the OOM killer spares it). Only raises the value, which needs no
/// privilege. Async-signal-safe (no allocation): call it between fork and exec, e.g. in
/// `Command::pre_exec`.
pub fn reset_oom_score_adj() -> std::io::Result<()> {
    sys::write_file_raw(c"/proc/self/oom_score_adj", b"0")
}
