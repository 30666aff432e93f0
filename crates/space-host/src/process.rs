//! Host-side process primitives: pidfds, reaping, /proc inspection, id maps.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, waitid};

/// Makes this process the reaper of orphaned descendants (the sandboxes' pid 1s, whose
/// bootstrap parent exits).
pub fn become_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)
}

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` through a pidfd: never hits a process that merely reused the pid.
pub fn pidfd_signal(pidfd: &impl AsFd, signal: i32) -> io::Result<()> {
    // SAFETY: the fd is a valid pidfd for the duration of the call; no info struct is passed.
    let rc = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_fd().as_raw_fd(), signal, std::ptr::null::<u8>(), 0)
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Reaps the process if it is an exited child of ours. ECHILD (not our child, e.g. after a
/// node restart, or already reaped) counts as done.
pub fn reap(pidfd: &impl AsFd) -> bool {
    match waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG) {
        Ok(nix::sys::wait::WaitStatus::StillAlive) => false,
        Ok(_) | Err(Errno::ECHILD) => true,
        Err(e) => {
            tracing::debug!(error = %e, "waitid on pidfd");
            true
        }
    }
}

/// Whether the process behind the pidfd has exited (the pidfd polls readable).
pub fn has_exited(pidfd: &impl AsFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

/// Writes `0 <base> <count>` to the process's uid_map and gid_map.
pub fn write_id_maps(pid: u32, base: u32, count: u32) -> io::Result<()> {
    write_maps(pid, 0, base, count)
}

/// Writes `<inner> <outer> <count>` to the process's uid_map and gid_map.
pub fn write_maps(pid: u32, inner: u32, outer: u32, count: u32) -> io::Result<()> {
    let line = format!("{inner} {outer} {count}\n");
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        let mut f = fs::OpenOptions::new().write(true).open(&path)?;
        io::Write::write_all(&mut f, line.as_bytes()).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    }
    Ok(())
}

pub fn set_oom_score_adj(pid: u32, value: i32) -> io::Result<()> {
    fs::write(format!("/proc/{pid}/oom_score_adj"), value.to_string())
}

/// What the runtime checks about a pid that should be a sandbox's pid 1.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProcInfo {
    pub zombie: bool,
    /// The pid in the process's innermost pid namespace (last field of NSpid).
    pub innermost_pid: Option<u32>,
}

pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_status(&status))
}

fn parse_status(status: &str) -> ProcInfo {
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    ProcInfo {
        zombie: field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X')),
        innermost_pid: field("NSpid:").and_then(|s| s.split_whitespace().last()?.parse().ok()),
    }
}

/// Waits until the process behind `pidfd` has exited, then reaps it if it is our child.
pub async fn wait_pidfd(pidfd: &OwnedFd) {
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    // Each waiter registers its own duplicate: epoll refuses the same fd twice.
    let registered = pidfd.try_clone().map_err(|e| e.to_string()).and_then(|fd| {
        // SAFETY: the AsyncFd owns this fresh duplicate, which stays open and refers to the
        // same pidfd until the AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.to_string())
    });
    match registered {
        Ok(fd) => {
            let _ = fd.readable().await;
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot register pidfd; polling");
            while !has_exited(pidfd) {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    reap(pidfd);
}

/// Whether `/proc/<pid>/status` shows a zombie (or a dead task, or none).
pub fn is_zombie(pid: u32) -> bool {
    proc_info(pid).is_none_or(|info| info.zombie)
}

/// Resident memory of a process in bytes (`VmRSS` of /proc/<pid>/status).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    Some(kib * 1024)
}

/// The cgroup path of `pid` in the hierarchy selected by `selector` (a v1 controller name,
/// or "" for the v2 unified hierarchy), from `/proc/<pid>/cgroup`.
pub fn cgroup_of(pid: u32, selector: &str) -> Option<String> {
    let text = fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("cgroup")).ok()?;
    parse_cgroup(&text, selector)
}

fn parse_cgroup(text: &str, selector: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if selector.is_empty() {
            id == "0" && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == selector)
        };
        hit.then(|| path.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let status = "Name:\tspaced\nState:\tS (sleeping)\nNSpid:\t4242\t1\n";
        assert_eq!(parse_status(status), ProcInfo { zombie: false, innermost_pid: Some(1) });
        let zombie = "State:\tZ (zombie)\nNSpid:\t7\n";
        assert_eq!(parse_status(zombie), ProcInfo { zombie: true, innermost_pid: Some(7) });
    }

    #[test]
    fn cgroup_lines() {
        let text = "9:name=systemd:/\n8:pids:/space/t/sbx_1\n2:cpu,cpuacct:/x\n0::/u\n";
        assert_eq!(parse_cgroup(text, "pids").as_deref(), Some("/space/t/sbx_1"));
        assert_eq!(parse_cgroup(text, "cpuacct").as_deref(), Some("/x"));
        assert_eq!(parse_cgroup(text, "").as_deref(), Some("/u"));
        assert_eq!(parse_cgroup(text, "memory"), None);
    }

    #[test]
    fn pidfd_of_self_child() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        let _ = child.wait();
        // Already reaped by std: ECHILD counts as done.
        assert!(reap(&fd));
        assert!(pidfd_signal(&fd, 0).is_err());
    }
}
