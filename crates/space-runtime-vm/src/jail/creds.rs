//! Step 8 of the jail: the VMM gives up every privilege before it execs QEMU.

use std::io;

use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

/// Empties the capability bounding and ambient sets, replaces the supplementary groups, sets
/// every gid and uid to the given unprivileged ids (which clears the permitted and effective
/// capabilities) and sets no_new_privs: nothing QEMU execs could regain a privilege, and
/// QEMU's own seccomp filter needs no_new_privs (or CAP_SYS_ADMIN, which it no longer has).
pub(crate) fn drop_privileges(uid: u32, gid: u32) -> io::Result<()> {
    if uid == 0 || gid == 0 {
        return Err(io::Error::other("refusing to run the VMM as root"));
    }
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only; EINVAL past the last capability.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    setgroups(&[]).map_err(io::Error::from)?;
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    setresgid(gid, gid, gid).map_err(io::Error::from)?;
    setresuid(uid, uid, uid).map_err(io::Error::from)?;
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
