//! Process primitives of the node side: pidfds, /proc inspection.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// `pidfd_open(pid, 0)`.
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` through a pidfd: never hits a process that merely reused the pid.
pub(crate) fn pidfd_signal(pidfd: &impl AsFd, signal: i32) -> io::Result<()> {
    // SAFETY: the fd is a valid pidfd for the duration of the call; no info struct is passed.
    let rc = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_fd().as_raw_fd(), signal, std::ptr::null::<u8>(), 0)
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Whether the process behind the pidfd has exited (the pidfd polls readable).
pub(crate) fn has_exited(pidfd: &impl AsFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

/// Reaps the process if it is an exited child of ours; ECHILD (not ours: adopted after a
/// node restart, or reaped already) counts as done.
pub(crate) fn reap(pidfd: &impl AsFd) -> bool {
    match waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG) {
        Ok(WaitStatus::StillAlive) => false,
        Ok(_) | Err(Errno::ECHILD) => true,
        Err(_) => true,
    }
}

/// Resolves once the process behind `pidfd` has exited (and reaps it if it is our child).
pub(crate) async fn wait_pidfd(pidfd: &OwnedFd) {
    // Each waiter registers its own duplicate: epoll refuses the same fd twice.
    let registered = pidfd.try_clone().and_then(|fd| {
        // SAFETY: the AsyncFd owns this fresh duplicate, which stays open and refers to the
        // same pidfd until the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
    });
    match registered {
        Ok(fd) => {
            let _ = fd.readable().await;
        }
        Err(_) => {
            while !has_exited(pidfd) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    reap(pidfd);
}

/// The cgroup path of `pid` in the v1 hierarchy of `controller` (or v2's with ""), from
/// `/proc/<pid>/cgroup`.
pub(crate) fn cgroup_of(pid: u32, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_cgroup(&text, controller)
}

fn parse_cgroup(text: &str, controller: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            id == "0" && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_owned())
    })
}

/// Whether `/proc/<pid>/status` shows a zombie (or a dead task).
pub(crate) fn is_zombie(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return true };
    status.lines().find_map(|l| l.strip_prefix("State:")).is_some_and(|s| {
        let s = s.trim();
        s.starts_with('Z') || s.starts_with('X')
    })
}

/// Resident memory of a process in bytes (`VmRSS` of /proc/<pid>/status).
pub(crate) fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines() {
        let text = "9:name=systemd:/\n8:pids:/space/t/sbx_1\n2:cpu,cpuacct:/x\n0::/u\n";
        assert_eq!(parse_cgroup(text, "pids").as_deref(), Some("/space/t/sbx_1"));
        assert_eq!(parse_cgroup(text, "cpuacct").as_deref(), Some("/x"));
        assert_eq!(parse_cgroup(text, "").as_deref(), Some("/u"));
        assert_eq!(parse_cgroup(text, "memory"), None);
    }

    #[test]
    fn own_process() {
        assert!(!is_zombie(std::process::id()));
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
