//! Process primitives of the node side (pidfds, /proc), shared with the linux runtime.

pub(crate) use space_host::process::{
    cgroup_of, has_exited, is_zombie, pidfd_open, pidfd_signal, rss_bytes, wait_pidfd,
};

/// Allocates `bytes` of `file`'s pages ahead, beyond its end (its size stays), when it is on
/// a tmpfs; elsewhere does nothing. A tmpfs page is charged to the memory cgroup of whoever
/// first writes it: reserved here, a VM's state written into memory by QEMU is the node's
/// charge, not the VM's, whose limit (guest RAM and QEMU's overhead) has no room for a second
/// copy of its RAM. Pages reserved and not written are freed with the file.
pub(crate) fn reserve_if_in_memory(file: &std::fs::File, bytes: u64) -> std::io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};
    if fstatfs(file)?.filesystem_type() != TMPFS_MAGIC {
        return Ok(());
    }
    let len = i64::try_from(bytes).map_err(std::io::Error::other)?;
    fallocate(file, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, len)?;
    Ok(())
}
