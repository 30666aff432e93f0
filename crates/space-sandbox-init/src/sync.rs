//! The sync channel between the node and a starting sandbox: newline-delimited JSON on the
//! socketpair end the node passes as fd [`SYNC_FD`].
//!
//! ```text
//! node                                   spaced init (bootstrap)           sandbox pid 1
//!  ── ToInit::Config ─────────────────►  unshare(CLONE_NEWUSER)
//!  ◄──────────────── FromInit::UserNs ──
//!  write uid_map/gid_map, join cgroups
//!  ── ToInit::Mapped ─────────────────►  setresuid/gid(0), unshare(pid,mnt,net,ipc,uts,cgroup)
//!                                         fork ───────────────────────────► mounts, pivot_root,
//!  ◄──── FromInit::Child{host_pid} ────  exit(0)                           hostname, lo, fds,
//!                                                                           caps, no_new_privs,
//!  ◄──────────────────────────────────────────────── FromInit::Ready ──── seccomp; close fd 3
//! ```
//!
//! `Child` and `Ready` come from two processes writing the same socket, so the node accepts them
//! in either order. Any process may send [`FromInit::Error`] instead and then exits non-zero.
//! After `Ready` the channel is closed: nothing in the sandbox can reach it any more.

use std::io::{self, BufRead, Write};
use std::os::fd::RawFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The sync channel's fd in `spaced init`.
pub const SYNC_FD: RawFd = 3;
/// The fd of the bound, listening unix socket `spaced` serves the node on.
pub const LISTENER_FD: RawFd = 4;
/// The sandbox's root as a detached mount (an idmapped mount the node made), when the config
/// says so ([`InitConfig::root_mount`]).
pub const ROOT_MOUNT_FD: RawFd = 5;
/// Longest line either side accepts.
pub const MAX_LINE: usize = 64 * 1024;

/// Paths under the sandbox's /proc and /sys hidden from it (OCI runtimes' default list): files
/// get /dev/null bound over them, directories an empty read-only tmpfs. Missing ones are skipped.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/sys/devices/virtual/powercap",
    "/sys/firmware",
];

/// Paths re-bound read-only inside the sandbox. Missing ones are skipped.
pub const DEFAULT_READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// What the node tells the sandbox to build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitConfig {
    /// Host path of the sandbox's root filesystem. Every parent directory must be searchable
    /// by the mapped root uid.
    pub rootfs: PathBuf,
    pub hostname: String,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    /// Host path of the binary pid 1 re-executes from inside the sandbox (bound read-only at
    /// `SELF_EXE`); `None`: the running executable's own path. The node passes its pool copy
    /// because it starts `spaced init` from a sealed memfd, which has no path to bind.
    #[serde(default)]
    pub exe: Option<PathBuf>,
    /// The node passes the root as a detached mount at [`ROOT_MOUNT_FD`] (idmapped from the
    /// storage's id range to the sandbox's own: only host root can make one), which pid 1
    /// attaches at `rootfs`; `false`: pid 1 binds `rootfs` itself.
    #[serde(default)]
    pub root_mount: bool,
    /// Host files bound over files of the sandbox's `/proc` and `/sys` (lxcfs's `meminfo`,
    /// `uptime`, …: see `space_host::lxcfs`), so they answer from the sandbox's cgroups.
    #[serde(default)]
    pub host_files: Vec<HostFile>,
}

/// A host file bound over a file of the sandbox's fresh `/proc` or `/sys` mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFile {
    /// The file on the host.
    pub host: PathBuf,
    /// Where in the sandbox, relative to its root: under `proc/` or `sys/`.
    pub at: PathBuf,
}

impl InitConfig {
    /// A config with the default masked and read-only paths.
    pub fn new(rootfs: impl Into<PathBuf>, hostname: impl Into<String>) -> Self {
        InitConfig {
            rootfs: rootfs.into(),
            hostname: hostname.into(),
            masked_paths: DEFAULT_MASKED_PATHS.iter().map(|p| p.to_string()).collect(),
            readonly_paths: DEFAULT_READONLY_PATHS.iter().map(|p| p.to_string()).collect(),
            exe: None,
            root_mount: false,
            host_files: Vec::new(),
        }
    }
}

/// Node → init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToInit {
    Config(InitConfig),
    /// uid_map and gid_map are written and the bootstrap process is in the sandbox's cgroups.
    Mapped,
}

/// Init → node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromInit {
    /// The bootstrap process is in its new user namespace: write its uid/gid maps.
    UserNs,
    /// The sandbox's pid 1 as the host sees it; the bootstrap process exits next.
    Child { host_pid: u32 },
    /// Pid 1 is fully confined and about to serve the listener.
    Ready {
        /// Optional steps that did not work here (e.g. sysfs not mountable).
        #[serde(default)]
        warnings: Vec<String>,
    },
    /// A step failed; the sender exits non-zero.
    Error { message: String },
}

/// Writes one message as a single line with one `write` call.
pub fn send<W: Write, T: Serialize>(mut w: W, msg: &T) -> io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)
}

/// Reads one message; `Ok(None)` on a clean end of stream.
pub fn recv<R: BufRead, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<T>> {
    let mut line = Vec::new();
    let n = io::Read::take(&mut *r, MAX_LINE as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    parse_line(&line).map(Some)
}

/// Parses one received line (with or without its newline).
pub fn parse_line<T: DeserializeOwned>(line: &[u8]) -> io::Result<T> {
    if line.len() > MAX_LINE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "sync message too long"));
    }
    if line.last() != Some(&b'\n') {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated sync message"));
    }
    serde_json::from_slice(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        send(&mut buf, &ToInit::Config(InitConfig::new("/r", "h"))).unwrap();
        send(&mut buf, &ToInit::Mapped).unwrap();
        let mut r = io::Cursor::new(buf);
        let first: ToInit = recv(&mut r).unwrap().unwrap();
        assert_eq!(first, ToInit::Config(InitConfig::new("/r", "h")));
        assert_eq!(recv::<_, ToInit>(&mut r).unwrap(), Some(ToInit::Mapped));
        assert_eq!(recv::<_, ToInit>(&mut r).unwrap(), None);
    }

    #[test]
    fn wire_format_is_tagged() {
        let mut buf = Vec::new();
        send(&mut buf, &FromInit::Child { host_pid: 42 }).unwrap();
        assert_eq!(buf, b"{\"type\":\"child\",\"host_pid\":42}\n");
        let ready: FromInit = parse_line(b"{\"type\":\"ready\"}\n").unwrap();
        assert_eq!(ready, FromInit::Ready { warnings: vec![] });
    }

    #[test]
    fn rejects_truncated_and_oversized() {
        assert!(parse_line::<FromInit>(b"{\"type\":\"user_ns\"}").is_err());
        let mut r = io::Cursor::new(vec![b'x'; MAX_LINE + 10]);
        assert!(recv::<_, FromInit>(&mut r).is_err());
    }
}
