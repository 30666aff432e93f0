//! Starting `spaced init` with posix_spawn (CLONE_VFORK under glibc: no copy of the node's
//! page tables, unlike fork + pre_exec, which cost ~4.5 ms per start here) and owning the
//! child through a pidfd.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawn};
use nix::sys::signal::SigSet;
use nix::sys::stat::Mode;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use space_sandbox_init::sync::{LISTENER_FD, ROOT_MOUNT_FD, SYNC_FD};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::process;

/// A child process owned through a pidfd; killed and reaped on drop if still unreaped.
#[derive(Debug)]
pub(crate) struct Child {
    pid: u32,
    pidfd: OwnedFd,
    reaped: bool,
}

impl Child {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the child to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<WaitStatus> {
        let dup = self.pidfd.try_clone()?;
        // SAFETY: the AsyncFd owns this fresh duplicate of the pidfd, which stays open and
        // unchanged until the AsyncFd is dropped at the end of this function.
        let fd = unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }.map_err(io::Error::other)?;
        let _guard = fd.readable().await?;
        self.reap_now()
    }

    fn reap_now(&mut self) -> io::Result<WaitStatus> {
        let status = waitid(Id::PIDFd(self.pidfd.as_fd()), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG)?;
        if !matches!(status, WaitStatus::StillAlive) {
            self.reaped = true;
        }
        Ok(status)
    }

    pub fn kill(&self) {
        let _ = process::pidfd_signal(&self.pidfd, libc::SIGKILL);
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.kill();
        // A SIGKILLed process exits promptly; do not block a dropping task for long.
        for _ in 0..100 {
            if !matches!(self.reap_now(), Ok(WaitStatus::StillAlive)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::warn!(pid = self.pid, "spaced init bootstrap did not exit after SIGKILL; left unreaped");
    }
}

/// Spawns `<spaced> init` with stdio on /dev/null, `sync_end` at fd 3, `listener` at fd 4,
/// `root` (the sandbox's root, a detached mount) at fd 5, every signal at its default disposition and unblocked, in a process group of its own, and
/// only `env` in its environment.
pub(crate) fn spawn_init(
    spaced: &Path,
    sync_end: BorrowedFd<'_>,
    listener: BorrowedFd<'_>,
    root: BorrowedFd<'_>,
    env: &[(String, String)],
) -> io::Result<Child> {
    // Copies at fd >= 10 (close-on-exec) so the dup2 actions cannot clobber one another; dup2
    // clears close-on-exec on the targets 3 and 4.
    let sync_high = high_fd(sync_end)?;
    let listener_high = high_fd(listener)?;
    let root_high = high_fd(root)?;
    let mut actions = PosixSpawnFileActions::init()?;
    for (fd, flags) in [(0, OFlag::O_RDONLY), (1, OFlag::O_WRONLY), (2, OFlag::O_WRONLY)] {
        actions.add_open(fd, "/dev/null", flags, Mode::empty())?;
    }
    actions.add_dup2(sync_high.as_raw_fd(), SYNC_FD)?;
    actions.add_dup2(listener_high.as_raw_fd(), LISTENER_FD)?;
    actions.add_dup2(root_high.as_raw_fd(), ROOT_MOUNT_FD)?;
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETPGROUP,
    )?;
    attr.set_sigdefault(&SigSet::all())?;
    attr.set_sigmask(&SigSet::empty())?;
    attr.set_pgroup(Pid::from_raw(0))?;
    let program = CString::new(spaced.as_os_str().as_bytes())?;
    // argv[0] is what the sandbox sees as pid 1's command line: not the host path.
    let args = [CString::new("spaced")?, CString::new("init")?];
    let envp: Vec<CString> = env.iter().map(|(k, v)| CString::new(format!("{k}={v}"))).collect::<Result<_, _>>()?;
    let pid = posix_spawn(program.as_c_str(), &actions, &attr, &args, &envp)?;
    let pid = pid.as_raw() as u32;
    // Our unreaped child: its pid cannot be reused before we wait for it.
    let pidfd = process::pidfd_open(pid)?;
    Ok(Child { pid, pidfd, reaped: false })
}

fn high_fd(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let raw = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))?;
    // SAFETY: F_DUPFD_CLOEXEC just returned this new fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    /// `sh` stands in for spaced: it checks that fds 3, 4 and 5 arrived and that stdio is /dev/null.
    #[tokio::test]
    async fn fds_arrive_at_3_4_and_5() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fake-spaced");
        std::fs::write(
            &script,
            "#!/bin/sh\n[ \"$1\" = init ] && [ -S /proc/self/fd/3 ] || exit 3\n\
             [ \"$(readlink /proc/self/fd/0)\" = /dev/null ] || exit 4\n\
             [ -e /proc/self/fd/5 ] || exit 6\n\
             [ \"$FOO\" = bar ] || exit 5\necho ok >&3\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (_l1, l2) = UnixStream::pair().unwrap();
        let env = [("FOO".to_string(), "bar".to_string()), ("PATH".to_string(), "/usr/bin:/bin".to_string())];
        let root = std::fs::File::open("/").unwrap();
        let mut child = spawn_init(&script, theirs.as_fd(), l2.as_fd(), root.as_fd(), &env).unwrap();
        drop(theirs);
        let status = child.wait().await.unwrap();
        assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
        let mut got = String::new();
        std::io::Read::read_to_string(&mut &ours, &mut got).unwrap();
        assert_eq!(got, "ok\n");
    }
}
