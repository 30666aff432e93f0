//! The VMM's jail (model: firecracker's jailer), built by `space-vm-jailer`, a fresh
//! single-threaded process the node runs as root for every VM. It never runs in a
//! `pre_exec` of the node: the node is a multi-threaded tokio program, and allocating (or
//! taking any lock) between fork and exec there can deadlock.
//!
//! The node writes a [`JailConfig`] as JSON to the jailer's stdin. The jailer:
//! 1. joins the sandbox's cgroup (every hierarchy), so QEMU and all its threads are in it
//!    from their first instruction;
//! 2. opens the log (QEMU's stdout and stderr) and the root disk image (handed to QEMU as a
//!    descriptor: the image's path is nowhere in the jail);
//! 3. clones the VMM process with new pid, mount, network, ipc and uts namespaces and
//!    `CLONE_PARENT`: its parent is the node, which thus owns, waits for and reaps it;
//! 4. reports the VMM's host pid on stdout (`pid N`), then `ok` once the VMM has exec'd QEMU,
//!    or `error <what failed>` (the VMM writes it to a close-on-exec pipe before exiting).
//!
//! The VMM process, still root but in its own namespaces:
//! 5. network (`net.rs`): `lo` up, the AnyIP route, `tap0` (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR)
//!    up with a `/32` route to the guest in table `local`; the tap's descriptor goes to QEMU;
//! 6. mounts (`mounts.rs`): everything private, a small tmpfs as the new root holding
//!    read-only binds of what QEMU needs (`/usr` and the `/lib*` links, the kernel and
//!    initrd), a read-write bind of the VM's socket directory at `/run`, device nodes made
//!    for QEMU alone (null, zero, random, urandom, kvm when used), a fresh /proc;
//!    `pivot_root` into it, the old root detached, the tmpfs remounted read-only;
//! 7. descriptors: log on 1 and 2, /dev/null on 0, tap on [`TAP_FD`], disk on [`DISK_FD`]
//!    and [`DISK_RO_FD`], a template's guest memory (if any) on [`MEMORY_FD`], every other one
//!    close-on-exec;
//! 8. credentials (`creds.rs`): capability bounding set emptied, supplementary groups
//!    replaced, gid and uid set to the sandbox's own unprivileged host id, no_new_privs;
//! 9. `execve` of QEMU (which then installs its own seccomp filter: `-sandbox on,...`).

mod creds;
mod mounts;
mod net;

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where QEMU finds the tap device's descriptor (`-netdev tap,fd=3`).
pub const TAP_FD: i32 = 3;
/// Where QEMU finds the root disk's descriptors (`-add-fd fd=4,set=1 -add-fd fd=5,set=1`):
/// read-write, and read-only. QEMU picks from a set by access mode, and it opens the image
/// read-only first and read-write once the device attaches.
pub const DISK_FD: i32 = 4;
pub const DISK_RO_FD: i32 = 5;
/// Where QEMU finds guest memory kept outside it (a template's memfd), as
/// `mem-path=/proc/self/fd/6`: QEMU opens memory backends by path only.
pub const MEMORY_FD: i32 = 6;

/// Everything the jailer is told, by the node, on stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JailConfig {
    /// `cgroup.procs` files to write the jailer's pid to (one per hierarchy).
    pub cgroup_procs: Vec<PathBuf>,
    /// An empty host directory the jail's tmpfs root is mounted on (in the VMM's own mount
    /// namespace only).
    pub root_mount_point: PathBuf,
    /// Host paths bound read-only at the same path in the jail (directories or files);
    /// a symlink is recreated as the same symlink instead (`/lib -> usr/lib`).
    pub ro_paths: Vec<PathBuf>,
    /// Host files bound read-only at another path in the jail: (host, jail).
    pub ro_files: Vec<(PathBuf, PathBuf)>,
    /// Host directory bound read-write at `/run` in the jail (sockets).
    pub run_dir: PathBuf,
    /// Host file QEMU's stdout and stderr are appended to.
    pub log: PathBuf,
    /// The root disk image, opened read-write and read-only, handed over at [`DISK_FD`] and
    /// [`DISK_RO_FD`].
    pub disk: PathBuf,
    /// Guest memory to open read-write and hand over at [`MEMORY_FD`] (the node's memfd, as
    /// `/proc/<node>/fd/<n>`).
    #[serde(default)]
    pub memory: Option<PathBuf>,
    /// Whether QEMU gets a `/dev/kvm` of its own.
    pub kvm: bool,
    /// The guest's address: routed to `tap0` in the VMM's namespace.
    pub guest_addr: Ipv4Addr,
    /// The VMM's host uid and gid (a sandbox's own, never shared with another VMM).
    pub uid: u32,
    pub gid: u32,
    /// Program to exec, as a path in the jail, and its full argv.
    pub program: PathBuf,
    pub argv: Vec<String>,
}

/// Entry point of `space-vm-jailer`; returns its exit code.
pub fn main() -> i32 {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        println!("error reading the configuration: {e}");
        return 2;
    }
    let config: JailConfig = match serde_json::from_slice(&input) {
        Ok(config) => config,
        Err(e) => {
            println!("error bad configuration: {e}");
            return 2;
        }
    };
    match launch(&config) {
        Ok(()) => 0,
        Err(e) => {
            println!("error {e}");
            let _ = std::io::stdout().flush();
            1
        }
    }
}

/// Steps 1-4 (see the module docs).
fn launch(config: &JailConfig) -> Result<(), String> {
    let pid = std::process::id().to_string();
    for procs in &config.cgroup_procs {
        std::fs::write(procs, &pid).map_err(|e| format!("join cgroup {}: {e}", procs.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&config.log)
        .map_err(|e| format!("open log {}: {e}", config.log.display()))?;
    let disk = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&config.disk)
        .map_err(|e| format!("open disk {}: {e}", config.disk.display()))?;
    let disk_ro = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&config.disk)
        .map_err(|e| format!("open disk {}: {e}", config.disk.display()))?;
    let memory = match &config.memory {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| format!("open guest memory {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let (err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // Everything the child needs is prepared here: it must not depend on the parent's state.
    let prepared = Prepared::new(config).map_err(|e| format!("prepare: {e}"))?;
    let flags = libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_PARENT;
    // SAFETY: a raw clone without a new stack behaves like fork. This process is single
    // threaded (the jailer never starts a thread before this point), so the child may
    // allocate and use any library state.
    let child = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if child < 0 {
        return Err(format!("clone: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        drop(err_read);
        let failure = vmm(config, &prepared, log, [disk, disk_ro], memory);
        let mut pipe = std::fs::File::from(err_write);
        let _ = pipe.write_all(failure.as_bytes());
        // SAFETY: _exit ends this child without running the parent's atexit handlers or
        // flushing buffers shared with it.
        unsafe { libc::_exit(1) }
    }
    drop(err_write);
    drop((log, disk, disk_ro, memory));
    println!("pid {child}");
    let _ = std::io::stdout().flush();
    let mut failure = String::new();
    let _ = std::fs::File::from(err_read).read_to_string(&mut failure);
    if failure.is_empty() {
        println!("ok");
        Ok(())
    } else {
        Err(failure)
    }
}

/// What the VMM process needs, as C strings made before the clone.
struct Prepared {
    program: CString,
    argv: Vec<CString>,
}

impl Prepared {
    fn new(config: &JailConfig) -> Result<Prepared, std::ffi::NulError> {
        Ok(Prepared {
            program: CString::new(config.program.as_os_str().as_bytes())?,
            argv: config.argv.iter().map(|a| CString::new(a.as_str())).collect::<Result<_, _>>()?,
        })
    }
}

/// Steps 5-9, in the VMM process. Returns only on failure, with what failed.
fn vmm(
    config: &JailConfig,
    prepared: &Prepared,
    log: std::fs::File,
    disk: [std::fs::File; 2],
    memory: Option<std::fs::File>,
) -> String {
    let tap = match net::setup(config.guest_addr, crate::GATEWAY_ADDR) {
        Ok(tap) => tap,
        Err(e) => return format!("network: {e}"),
    };
    if let Err(e) = mounts::enter_jail(config) {
        return format!("jail root: {e}");
    }
    let [disk, disk_ro] = disk;
    if let Err(e) = arrange_fds(log.into(), tap, disk.into(), disk_ro.into(), memory.map(OwnedFd::from)) {
        return format!("descriptors: {e}");
    }
    if let Err(e) = creds::drop_privileges(config.uid, config.gid) {
        return format!("credentials: {e}");
    }
    let argv: Vec<*const libc::c_char> =
        prepared.argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: program and every argv entry are NUL-terminated strings owned by `prepared`,
    // which outlives the call; both arrays end with a null pointer.
    unsafe { libc::execve(prepared.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    format!("execve {}: {}", config.program.display(), std::io::Error::last_os_error())
}

/// Step 7. Every source is first moved to a high number (and its low original closed):
/// no `dup2` may overwrite a source still needed, and no original may close a target later.
fn arrange_fds(
    log: OwnedFd,
    tap: OwnedFd,
    disk: OwnedFd,
    disk_ro: OwnedFd,
    memory: Option<OwnedFd>,
) -> std::io::Result<()> {
    let high = |fd: OwnedFd| -> std::io::Result<OwnedFd> {
        let raw = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(100))?;
        drop(fd);
        // SAFETY: F_DUPFD_CLOEXEC just returned this new fd; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    let null = high(std::fs::OpenOptions::new().read(true).open("/dev/null")?.into())?;
    let (log, tap, disk, disk_ro) = (high(log)?, high(tap)?, high(disk)?, high(disk_ro)?);
    let memory = memory.map(high).transpose()?;
    let mut moves = vec![(&null, 0), (&log, 1), (&log, 2), (&tap, TAP_FD), (&disk, DISK_FD), (&disk_ro, DISK_RO_FD)];
    if let Some(memory) = &memory {
        moves.push((memory, MEMORY_FD));
    }
    let last = moves.last().map_or(DISK_RO_FD, |(_, to)| *to);
    for (from, to) in moves {
        // SAFETY: both are descriptors of this process; the targets are the fixed numbers
        // QEMU is told about, and every source is >= 100, so none is overwritten.
        if unsafe { libc::dup2(from.as_raw_fd(), to) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: close_range only marks descriptors close-on-exec; the error pipe stays usable
    // until the exec, which then closes it (that is how the jailer learns of the exec).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, last as u32 + 1, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_as_json() {
        let config = JailConfig {
            cgroup_procs: vec!["/sys/fs/cgroup/memory/x/cgroup.procs".into()],
            root_mount_point: "/run/space/x/jail".into(),
            ro_paths: vec!["/usr".into(), "/lib".into()],
            ro_files: vec![("/var/cache/space/vm/vmlinux".into(), "/vm/vmlinux".into())],
            run_dir: "/run/space/x/sock".into(),
            log: "/run/space/x/qemu.log".into(),
            disk: "/pool/x.img".into(),
            memory: Some("/proc/1/fd/9".into()),
            kvm: false,
            guest_addr: Ipv4Addr::new(10, 254, 254, 2),
            uid: 165_536,
            gid: 165_536,
            program: "/usr/bin/qemu-system-x86_64".into(),
            argv: vec!["qemu-system-x86_64".into()],
        };
        let text = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<JailConfig>(&text).unwrap(), config);
    }
}
