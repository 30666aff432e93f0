//! Makes the sandbox's listening socket one that CRIU can checkpoint and restore.
//!
//! The node binds the listener at `<run dir>/<id>.d/agent.sock` before the sandbox exists:
//! that socket belongs to the host's network namespace and its path to a host mount. CRIU
//! finds sockets only through the network namespaces of the tree it dumps, and restores a
//! bound socket by binding its name again through the dumped mount it was bound through. So
//! pid 1 gets a new listener instead, at the same host path (the node notices nothing):
//! - created inside the sandbox's network namespace (a path-bound unix socket is reachable
//!   from every network namespace);
//! - bound as [`AGENT_DIR`]`/agent.sock` inside the sandbox's mount namespace, where
//!   [`AGENT_DIR`] is a bind mount of the socket's directory `<run dir>/<id>.d`, which holds
//!   nothing else: host root's, mode 0700, so no sandbox process can enter it (capabilities
//!   do not apply to inodes of unmapped owners);
//! - its file owned by sandbox root (CRIU restores the owner from inside the sandbox).
//!
//! On restore CRIU recreates the socket in the restored network namespace and binds it again
//! through the restored bind mount, which the restorer points at a directory of the new
//! sandbox's: each restored copy gets its own socket, with no fd passed in.
//!
//! Creating the socket needs a process inside the sandbox's namespaces; binding the host
//! directory into it needs host root. After unsharing its user namespace the bootstrap is
//! neither, so it first forks a [`Helper`] that keeps the host's credentials. Pid 1, once its
//! /dev exists and before pivot_root, asks the helper, which enters pid 1's network and mount
//! namespaces, mounts the directory, binds, listens, passes the socket back and exits. It runs
//! only this code, before anything of the sandbox runs.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr, getsockname, recvmsg, sendmsg};
use nix::sys::statvfs::statvfs;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use crate::InitError;
use crate::sys::{ctx, io_ctx};

/// Where the directory of the agent's socket is mounted inside the sandbox.
pub const AGENT_DIR: &str = "/dev/.spaced-agent";

/// The longest error message the helper sends back.
const MAX_ERROR: usize = 4096;
/// First byte of the helper's answer: the socket is attached / an error message follows.
const OK_TAG: u8 = b'l';
const ERROR_TAG: u8 = b'e';

/// The forked helper, as the bootstrap sees it.
pub(crate) struct Helper {
    pid: Option<Pid>,
    /// Bootstrap → helper: pid 1's host pid.
    to_helper: Option<UnixStream>,
    /// Pid 1 ↔ helper; pid 1 inherits it from the bootstrap.
    pid1_end: Option<UnixStream>,
}

/// Pid 1's end of the helper.
pub(crate) struct Pid1Link(UnixStream);

impl Helper {
    /// Forks the helper. Call while still in the host's namespaces; `listener` is the node's
    /// listening socket, `rootfs` the sandbox's root (host path).
    pub(crate) fn spawn(listener: RawFd, rootfs: &Path) -> Result<Helper, InitError> {
        let (to_helper, from_bootstrap) = UnixStream::pair().map_err(io_ctx("socketpair for the listener helper"))?;
        let (pid1_end, helper_end) = UnixStream::pair().map_err(io_ctx("socketpair for the listener helper"))?;
        let bootstrap = nix::unistd::getpid();
        // SAFETY: the bootstrap is single-threaded (run_init's contract), so the child may run
        // arbitrary code after fork.
        match unsafe { fork() }.map_err(ctx("fork listener helper"))? {
            ForkResult::Parent { child } => {
                drop((from_bootstrap, helper_end));
                Ok(Helper { pid: Some(child), to_helper: Some(to_helper), pid1_end: Some(pid1_end) })
            }
            ForkResult::Child => {
                drop((to_helper, pid1_end));
                // Only the bootstrap and pid 1 talk to the node; a helper running as host root
                // must not outlive its bootstrap.
                let _ = nix::unistd::close(crate::sync::SYNC_FD);
                let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
                let code = match helper_main(&from_bootstrap, &helper_end, bootstrap, listener, rootfs) {
                    Ok(()) => 0,
                    Err(e) => {
                        let mut message = e.0.into_bytes();
                        message.truncate(MAX_ERROR);
                        message.insert(0, ERROR_TAG);
                        let _ = (&helper_end).write_all(&message);
                        1
                    }
                };
                // SAFETY: _exit ends this forked child without running the parent's atexit
                // handlers or destructors a second time.
                unsafe { libc::_exit(code) }
            }
        }
    }

    /// In pid 1 right after the fork: keeps only pid 1's end.
    pub(crate) fn into_pid1_link(mut self) -> Pid1Link {
        self.pid = None; // the helper is the bootstrap's child, not ours
        self.to_helper = None;
        Pid1Link(self.pid1_end.take().expect("pid 1 end present until the fork"))
    }

    /// In the bootstrap after forking pid 1: tells the helper pid 1's host pid and waits until
    /// it has served pid 1 and exited.
    pub(crate) fn finish(mut self, pid1: Pid) -> Result<(), InitError> {
        self.pid1_end = None; // pid 1 has its copy; ours would keep the helper waiting
        let mut to_helper = self.to_helper.take().expect("channel present until finish");
        let sent = to_helper.write_all(&(pid1.as_raw() as u32).to_le_bytes()).map_err(io_ctx("tell the helper pid 1"));
        drop(to_helper);
        let status = self.reap();
        sent?;
        match status {
            Some(WaitStatus::Exited(_, 0)) => Ok(()),
            // Its message went to pid 1, which reports it on the sync channel.
            status => Err(InitError(format!("listener helper ended with {status:?}"))),
        }
    }

    fn reap(&mut self) -> Option<WaitStatus> {
        let pid = self.pid.take()?;
        waitpid(pid, None).ok()
    }
}

impl Drop for Helper {
    /// A bootstrap failing before `finish` closes both channels, so the helper sees EOF and
    /// exits; reaping it here keeps it from becoming the node's zombie.
    fn drop(&mut self) {
        self.to_helper = None;
        self.pid1_end = None;
        self.reap();
    }
}

impl Pid1Link {
    /// Asks the helper for the sandbox's listener (pid 1 must have created the mount point
    /// `<rootfs>`[`AGENT_DIR`]) and returns it.
    pub(crate) fn make_listener(self) -> Result<UnixListener, InitError> {
        (&self.0).write_all(b"g").map_err(io_ctx("start the listener helper"))?;
        let mut tag = [0u8; 1];
        let mut space = nix::cmsg_space!(RawFd);
        let mut iov = [IoSliceMut::new(&mut tag)];
        let msg = recvmsg::<()>(self.0.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(ctx("receive the listener"))?;
        let fd = msg.cmsgs().ok().into_iter().flatten().find_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        });
        // SAFETY: SCM_RIGHTS just installed this fd in our table; nothing else owns it.
        let fd = fd.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        match (fd, tag[0]) {
            (Some(fd), OK_TAG) => Ok(UnixListener::from(fd)),
            (_, ERROR_TAG) => {
                let mut message = Vec::new();
                let _ = (&self.0).take(MAX_ERROR as u64).read_to_end(&mut message);
                Err(InitError(format!("listener helper: {}", String::from_utf8_lossy(&message))))
            }
            _ => Err(InitError("listener helper exited without an answer".into())),
        }
    }
}

/// In the helper: waits for pid 1's host pid and go-ahead, then makes the listener inside pid
/// 1's namespaces and sends it back.
fn helper_main(
    from_bootstrap: &UnixStream,
    pid1: &UnixStream,
    bootstrap: Pid,
    listener: RawFd,
    rootfs: &Path,
) -> Result<(), InitError> {
    if nix::unistd::getppid() != bootstrap {
        return Ok(()); // the bootstrap died before the death signal was armed
    }
    let mut pid = [0u8; 4];
    if (&mut &*from_bootstrap).read_exact(&mut pid).is_err() {
        return Ok(()); // the bootstrap failed before forking pid 1
    }
    let pid = u32::from_le_bytes(pid);
    let mut go = [0u8; 1];
    if (&mut &*pid1).read(&mut go).map_err(io_ctx("wait for pid 1"))? == 0 {
        return Ok(()); // pid 1 failed (and reports it) before asking
    }
    let node_socket = bound_path(listener)?;
    let (Some(dir), Some(name)) = (node_socket.parent(), node_socket.file_name()) else {
        return Err(InitError(format!("{} is not a path in a directory", node_socket.display())));
    };
    // Opened before entering anything: these name pid 1's namespaces, as the host sees them.
    let open = |ns: &str| std::fs::File::open(format!("/proc/{pid}/ns/{ns}")).map_err(io_ctx(format!("open {ns} ns")));
    let (netns, mntns) = (open("net")?, open("mnt")?);
    let owner = (mapped_root(pid, "uid_map")?, mapped_root(pid, "gid_map")?);
    setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(ctx("enter the sandbox's netns"))?;
    // Before pivot_root the sandbox's mount namespace still holds (a copy of) the host's
    // mounts, so the host paths below resolve there too.
    setns(mntns.as_fd(), CloneFlags::CLONE_NEWNS).map_err(ctx("enter the sandbox's mount ns"))?;
    let target = rootfs.join(AGENT_DIR.trim_start_matches('/'));
    mount(Some(dir), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(ctx(format!("bind {} on {AGENT_DIR}", dir.display())))?;
    let locked = crate::mounts::locked_flags(statvfs(&target).map_err(ctx(format!("statvfs {AGENT_DIR}")))?.flags());
    let flags =
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | locked;
    mount(None::<&str>, &target, None::<&str>, flags, None::<&str>).map_err(ctx(format!("remount {AGENT_DIR}")))?;
    // The socket keeps the name it is bound by, and CRIU binds that name again inside the
    // restored sandbox: bind it by its path as seen from inside, i.e. from the rootfs.
    nix::unistd::chroot(rootfs).map_err(ctx("chroot into the rootfs"))?;
    nix::unistd::chdir("/").map_err(ctx("chdir /"))?;
    let socket_path = Path::new(AGENT_DIR).join(name);
    // The node's socket file: the node does not connect before `Ready`.
    std::fs::remove_file(&socket_path).map_err(io_ctx(format!("remove {}", node_socket.display())))?;
    let socket = UnixListener::bind(&socket_path).map_err(io_ctx(format!("bind {}", socket_path.display())))?;
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_ctx(format!("chmod {}", socket_path.display())))?;
    // Owned by sandbox root, as if pid 1 had bound it: CRIU restores the file's owner from
    // inside the sandbox, where host root has no id. Its directory keeps the sandbox out.
    std::os::unix::fs::lchown(&socket_path, Some(owner.0), Some(owner.1))
        .map_err(io_ctx(format!("chown {}", socket_path.display())))?;
    let fds = [socket.as_raw_fd()];
    let iov = [IoSlice::new(&[OK_TAG])];
    sendmsg::<()>(pid1.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
        .map_err(ctx("send the listener"))?;
    Ok(())
}

/// The host id that id 0 of pid `pid`'s user namespace maps to, from its `uid_map`/`gid_map`.
fn mapped_root(pid: u32, map: &str) -> Result<u32, InitError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{map}")).map_err(io_ctx(format!("read {map}")))?;
    text.lines()
        .find_map(|line| match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["0", outer, _] => outer.parse().ok(),
            _ => None,
        })
        .ok_or_else(|| InitError(format!("{map} of pid 1 does not map id 0")))
}

/// The filesystem path the node's listener is bound at.
fn bound_path(listener: RawFd) -> Result<PathBuf, InitError> {
    let addr: UnixAddr = getsockname(listener).map_err(ctx(format!("getsockname({listener})")))?;
    match addr.path() {
        Some(path) if !path.as_os_str().as_bytes().is_empty() => Ok(path.to_path_buf()),
        _ => Err(InitError(format!("fd {listener} is not bound to a filesystem path"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_path_of_a_listener() {
        let dir = std::env::temp_dir().join(format!("space-init-listener-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        assert_eq!(bound_path(listener.as_raw_fd()).unwrap(), path);
        let (unbound, _) = UnixStream::pair().unwrap();
        assert!(bound_path(unbound.as_raw_fd()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
