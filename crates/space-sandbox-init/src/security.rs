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

/// Docker's default capability set: everything else leaves the bounding set.
pub const KEPT_CAPABILITIES: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_MKNOD,
    Capability::CAP_NET_RAW,
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

/// Compiles the sandbox filters, in installation order:
/// 1. default allow; [`DENIED`] and new user namespaces → EPERM;
/// 2. clone3 → ENOSYS: its flags live in memory a filter cannot read, so libc falls back to
///    clone, whose flags the first filter inspects.
///
/// seccompiler gives one match action per filter, hence two; the kernel runs both and they
/// match disjoint syscalls. Syscalls of any other architecture (i386 `int 0x80`) kill the process.
pub fn seccomp_programs() -> Result<Vec<BpfProgram>, InitError> {
    let arch: seccompiler::TargetArch =
        std::env::consts::ARCH.try_into().map_err(|e| InitError(format!("seccomp: unsupported architecture: {e}")))?;
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
    let clone3 = [(libc::SYS_clone3, Vec::new())].into_iter().collect();
    [(seccomp_rules(), eperm), (clone3, enosys)]
        .into_iter()
        .map(|(rules, action)| {
            let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch)
                .map_err(|e| InitError(format!("seccomp filter: {e}")))?;
            filter.try_into().map_err(|e| InitError(format!("seccomp compile: {e}")))
        })
        .collect()
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
        assert_eq!(programs.len(), 2);
        assert!(programs.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn rules_cover_the_documented_list() {
        let rules = seccomp_rules();
        assert_eq!(rules.len(), DENIED.len() + DENIED_WITH_NEWUSER.len());
        assert!(rules[&libc::SYS_clone].len() == 1 && rules[&libc::SYS_bpf].is_empty());
        assert!(!rules.contains_key(&libc::SYS_clone3));
    }

    #[test]
    fn kept_capabilities_are_dockers_default() {
        let mask: u64 = KEPT_CAPABILITIES.iter().map(|c| c.bitmask()).sum();
        assert_eq!(mask, 0xa80425fb);
    }
}
