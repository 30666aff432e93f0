//! Process primitives of the node side (pidfds, /proc), shared with the linux runtime.

pub(crate) use space_host::process::{
    cgroup_of, has_exited, is_zombie, pidfd_open, pidfd_signal, rss_bytes, wait_pidfd,
};
