//! The last confinement steps of pid 1: capabilities, no_new_privs, seccomp.
//! See docs/sandbox-isolation.md for why each capability and syscall is in or out.

use std::collections::BTreeMap;

use caps::{CapSet, Capability, CapsHashSet};
use nix::errno::Errno;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::InitError;
use crate::sys::ctx;

/// Docker's default capability set less `CAP_NET_RAW` (raw and packet sockets have no use
/// behind the gateway and are kernel attack surface): everything else leaves the bounding set.
pub const KEPT_CAPABILITIES: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_MKNOD,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

/// Syscalls that fail with EPERM whatever their arguments.
const DENIED: &[(&str, i64)] = &[
    ("bpf", libc::SYS_bpf),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("acct", libc::SYS_acct),
    ("syslog", libc::SYS_syslog),
    ("quotactl", libc::SYS_quotactl),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("uselib", libc::SYS_uselib),
    ("ioperm", libc::SYS_ioperm),
    ("iopl", libc::SYS_iopl),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("setns", libc::SYS_setns),
];

/// Syscalls that fail with EPERM when their flags argument (arg 0) asks for a new user namespace.
const DENIED_WITH_NEWUSER: &[i64] = &[libc::SYS_unshare, libc::SYS_clone];

/// The only address families `socket(2)` may create; any other fails with EAFNOSUPPORT.
/// `AF_UNIX` and `AF_INET`/`AF_INET6` are what programs use (the gateway is reached over
/// IPv4); `AF_NETLINK` because glibc's `getaddrinfo` (AI_ADDRCONFIG), `ip` and `ss` query the
/// sandbox's own network namespace through it. Everything else is refused, above all
/// `AF_VSOCK` (one port space for the whole host, not per network namespace) and `AF_PACKET`.
pub const ALLOWED_SOCKET_FAMILIES: &[i32] = &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK];

/// The netlink protocols an `AF_NETLINK` socket may use: routing (addresses, links, routes of
/// the sandbox's namespace) and socket diagnostics (`ss`). Generic netlink, audit, netfilter,
/// uevents and the rest reach kernel subsystems that are not the sandbox's business.
pub const ALLOWED_NETLINK_PROTOCOLS: &[i32] = &[libc::NETLINK_ROUTE, libc::NETLINK_SOCK_DIAG];

/// The bit that marks an x32 system call on x86_64. x32 calls share the x86_64 audit
/// architecture, so seccompiler's architecture check lets them through, and a filter keyed on
/// syscall numbers never matches `nr | X32_SYSCALL_BIT`: they are refused as a whole.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// [`KEPT_CAPABILITIES`] as a bit mask (the form of `/proc/PID/status`'s `Cap*` lines).
pub fn kept_mask() -> u64 {
    KEPT_CAPABILITIES.iter().map(|c| c.bitmask()).sum()
}

/// Reduces the bounding, permitted, effective and inheritable sets to [`KEPT_CAPABILITIES`]
/// and clears the ambient set.
pub(crate) fn drop_capabilities() -> Result<(), InitError> {
    let keep: CapsHashSet = KEPT_CAPABILITIES.iter().copied().collect();
    let cap_err = |what: &'static str| move |e: caps::errors::CapsError| InitError(format!("{what}: {e}"));
    for cap in caps::all().difference(&keep) {
        caps::drop(None, CapSet::Bounding, *cap).map_err(cap_err("drop from bounding set"))?;
    }
    drop_unknown_bounding(&keep)?;
    caps::clear(None, CapSet::Ambient).map_err(cap_err("clear ambient set"))?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new()).map_err(cap_err("clear inheritable set"))?;
    // Effective first: it must stay a subset of permitted at every step.
    caps::set(None, CapSet::Effective, &keep).map_err(cap_err("set effective set"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(cap_err("set permitted set"))
}

/// Drops capabilities newer than the `caps` crate knows (it cannot name them).
fn drop_unknown_bounding(keep: &CapsHashSet) -> Result<(), InitError> {
    let known_max = caps::all().iter().map(|c| c.index()).max().unwrap_or(0);
    debug_assert!(keep.iter().all(|c| c.index() <= known_max));
    for cap in (u32::from(known_max) + 1)..64 {
        // SAFETY: PR_CAPBSET_READ/DROP take a capability number and touch no memory.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
        if present != 1 {
            break; // EINVAL: beyond the kernel's last capability.
        }
        // SAFETY: as above.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        Errno::result(rc).map_err(ctx(format!("drop capability {cap} from bounding set")))?;
    }
    Ok(())
}

pub(crate) fn set_no_new_privs() -> Result<(), InitError> {
    nix::sys::prctl::set_no_new_privs().map_err(ctx("PR_SET_NO_NEW_PRIVS"))
}

/// Sandbox processes cannot ptrace pid 1 or read its memory, even as sandbox root with the
/// same host uid: its mm belongs to the host user namespace.
pub(crate) fn set_not_dumpable() -> Result<(), InitError> {
    nix::sys::prctl::set_dumpable(false).map_err(ctx("PR_SET_DUMPABLE"))
}

/// The filter's rules: syscall number → conditions (empty = always).
pub fn seccomp_rules() -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    for nr in DENIED_WITH_NEWUSER {
        let newuser = libc::CLONE_NEWUSER as u64;
        let cond = SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(newuser), newuser)
            .expect("valid condition");
        rules.insert(*nr, vec![SeccompRule::new(vec![cond]).expect("non-empty rule")]);
    }
    rules
}

/// `socket(2)` calls outside [`ALLOWED_SOCKET_FAMILIES`] and [`ALLOWED_NETLINK_PROTOCOLS`],
/// and `socketpair(2)` of any family but `AF_UNIX`: one rule per refused shape (rules are
/// or-ed, a rule's conditions and-ed).
pub fn socket_rules() -> BTreeMap<i64, Vec<SeccompRule>> {
    let arg = |index: u8, op: SeccompCmpOp, value: i32| {
        SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value as u64).expect("valid condition")
    };
    let other_family = ALLOWED_SOCKET_FAMILIES.iter().map(|f| arg(0, SeccompCmpOp::Ne, *f)).collect();
    let other_netlink = std::iter::once(arg(0, SeccompCmpOp::Eq, libc::AF_NETLINK))
        .chain(ALLOWED_NETLINK_PROTOCOLS.iter().map(|p| arg(2, SeccompCmpOp::Ne, *p)))
        .collect();
    let rules = [other_family, other_netlink].into_iter().map(|c| SeccompRule::new(c).expect("non-empty rule"));
    // socketpair(2) creates sockets of its family too (only AF_UNIX has a use for it).
    let pair = SeccompRule::new(vec![arg(0, SeccompCmpOp::Ne, libc::AF_UNIX)]).expect("non-empty rule");
    [(libc::SYS_socket, rules.collect()), (libc::SYS_socketpair, vec![pair])].into_iter().collect()
}

/// Compiles the sandbox filters, in installation order:
/// 1. default allow; [`DENIED`] and new user namespaces → EPERM;
/// 2. clone3 → ENOSYS: its flags live in memory a filter cannot read, so libc falls back to
///    clone, whose flags the first filter inspects;
/// 3. sockets of other families or netlink protocols ([`socket_rules`]) → EAFNOSUPPORT, the
///    errno a kernel without that family gives, which programs already handle;
/// 4. every x32 system call → EPERM ([`x32_program`]).
///
/// seccompiler gives one match action per filter, hence several; the kernel runs them all and
/// they match disjoint syscalls. Syscalls of any other architecture (i386 `int 0x80`) kill the
/// process.
pub fn seccomp_programs() -> Result<Vec<BpfProgram>, InitError> {
    let arch: seccompiler::TargetArch =
        std::env::consts::ARCH.try_into().map_err(|e| InitError(format!("seccomp: unsupported architecture: {e}")))?;
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
    let eafnosupport = SeccompAction::Errno(libc::EAFNOSUPPORT as u32);
    let clone3 = [(libc::SYS_clone3, Vec::new())].into_iter().collect();
    let mut programs = [(seccomp_rules(), eperm), (clone3, enosys), (socket_rules(), eafnosupport)]
        .into_iter()
        .map(|(rules, action)| {
            let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch)
                .map_err(|e| InitError(format!("seccomp filter: {e}")))?;
            filter.try_into().map_err(|e| InitError(format!("seccomp compile: {e}")))
        })
        .collect::<Result<Vec<BpfProgram>, InitError>>()?;
    programs.extend(x32_program());
    Ok(programs)
}

/// A filter that refuses every x32 system call with EPERM (EPERM, not ENOSYS, so a test can
/// tell the filter's answer from that of a kernel built without x32). seccompiler keys rules on
/// exact syscall numbers and cannot express "any number with this bit", hence four
/// instructions by hand. The other filters have already checked the architecture.
#[cfg(target_arch = "x86_64")]
fn x32_program() -> Option<BpfProgram> {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let stmt = |code, k| sock_filter { code, jt: 0, jf: 0, k };
    Some(vec![
        stmt(LD_W_ABS, 0), // seccomp_data.nr
        sock_filter { code: JSET_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
        stmt(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
    ])
}

#[cfg(not(target_arch = "x86_64"))]
fn x32_program() -> Option<BpfProgram> {
    None
}

/// Installs [`seccomp_programs`] on the calling (only) thread. Requires no_new_privs.
pub(crate) fn apply_seccomp() -> Result<(), InitError> {
    for program in seccomp_programs()? {
        seccompiler::apply_filter(&program).map_err(|e| InitError(format!("install seccomp filter: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        let programs = seccomp_programs().unwrap();
        assert_eq!(programs.len(), 4);
        assert!(programs.iter().all(|p| !p.is_empty()));
    }

    /// Runs `probe` in a forked child under the real filters; returns the errno of each call
    /// (0 when it succeeded). The child makes only raw syscalls before `_exit`, so forking a
    /// threaded test process is safe.
    fn errnos_under_filter(probes: &[fn() -> libc::c_long]) -> Vec<i32> {
        let programs = seccomp_programs().unwrap();
        let mut pipe = [0i32; 2];
        // SAFETY: pipe(2) writes two fds into the array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes syscalls and _exits (see above).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let _ = nix::sys::prctl::set_no_new_privs();
            let installed = programs.iter().all(|p| seccompiler::apply_filter(p).is_ok());
            for probe in probes {
                let errno = if !installed {
                    -1
                } else if probe() < 0 {
                    Errno::last_raw()
                } else {
                    0
                };
                // SAFETY: writes 4 bytes from a live i32 to our pipe.
                unsafe { libc::write(pipe[1], (&errno as *const i32).cast(), 4) };
            }
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: closes the parent's copy of the write end.
        unsafe { libc::close(pipe[1]) };
        let mut out = Vec::new();
        // SAFETY: pipe[0] is ours and owned from here on.
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
        std::io::Read::read_to_end(&mut file, &mut out).unwrap();
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        out.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    fn socket(family: i32, kind: i32, protocol: i32) -> libc::c_long {
        // SAFETY: socket(2) takes integers; the fd (if any) is left to the child's exit.
        unsafe { libc::syscall(libc::SYS_socket, family, kind, protocol) }
    }

    fn socketpair(family: i32, kind: i32) -> libc::c_long {
        let mut fds = [0i32; 2];
        // SAFETY: socketpair(2) writes two fds into the array.
        unsafe { libc::syscall(libc::SYS_socketpair, family, kind, 0, fds.as_mut_ptr()) }
    }

    #[test]
    fn the_installed_filter_refuses_what_it_must_and_allows_the_rest() {
        let got = errnos_under_filter(&[
            || socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
            || socket(libc::AF_PACKET, libc::SOCK_RAW, 0),
            || socket(libc::AF_BLUETOOTH, libc::SOCK_STREAM, 0),
            || socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT),
            || socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_GENERIC),
            || socketpair(libc::AF_TIPC, libc::SOCK_STREAM),
            // SAFETY: getpid through the x32 ABI touches no memory.
            || unsafe { libc::syscall(libc::SYS_getpid | X32_SYSCALL_BIT as i64) },
            // SAFETY: bpf(2) with a null attribute pointer; refused before it is read.
            || unsafe { libc::syscall(libc::SYS_bpf, 0, 0, 0) },
            // SAFETY: unshare takes flags only.
            || unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) },
            // SAFETY: clone3 with a null argument; refused before it is read.
            || unsafe { libc::syscall(libc::SYS_clone3, 0, 0) },
            // SAFETY: each with null pointers and invalid fds: refused before anything is read.
            || unsafe { libc::syscall(libc::SYS_perf_event_open, 0, 0, -1, -1, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_userfaultfd, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_finit_module, -1, 0, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_setns, -1, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_mount, 0, 0, 0, 0, 0) },
            // SAFETY: as above (what an idmapped mount of its own would need).
            || unsafe { libc::syscall(libc::SYS_open_tree, -1, 0, 0) },
            // SAFETY: as above.
            || unsafe { libc::syscall(libc::SYS_mount_setattr, -1, 0, 0, 0, 0) },
            || socket(libc::AF_UNIX, libc::SOCK_STREAM, 0),
            || socketpair(libc::AF_UNIX, libc::SOCK_STREAM),
            || socket(libc::AF_INET, libc::SOCK_STREAM, 0),
            || socket(libc::AF_INET6, libc::SOCK_DGRAM, 0),
            || socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
            || socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG),
            // SAFETY: getpid touches no memory.
            || unsafe { libc::syscall(libc::SYS_getpid) },
        ]);
        let (eperm, eafno, enosys) = (libc::EPERM, libc::EAFNOSUPPORT, libc::ENOSYS);
        let refused = [eafno, eafno, eafno, eafno, eafno, eafno, eperm, eperm, eperm, enosys];
        // perf, io_uring, userfaultfd, keyctl, finit_module, setns, mount, open_tree, mount_setattr
        let denied = [eperm; 9];
        let allowed = [0; 7];
        assert_eq!(got, [&refused[..], &denied, &allowed].concat());
    }

    #[test]
    fn rules_cover_the_documented_list() {
        let rules = seccomp_rules();
        assert_eq!(rules.len(), DENIED.len() + DENIED_WITH_NEWUSER.len());
        assert_eq!(socket_rules().len(), 2);
        assert!(rules[&libc::SYS_clone].len() == 1 && rules[&libc::SYS_bpf].is_empty());
        assert!(!rules.contains_key(&libc::SYS_clone3));
    }

    #[test]
    fn kept_capabilities_are_dockers_default() {
        assert_eq!(kept_mask(), 0xa80405fb, "Docker's 0xa80425fb without CAP_NET_RAW (bit 13)");
    }
}
