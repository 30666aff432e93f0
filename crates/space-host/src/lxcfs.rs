//! lxcfs: a FUSE filesystem whose `proc/meminfo`, `proc/cpuinfo`, `proc/uptime`, … answer
//! from the cgroups and pid namespace of the process that reads them. Bound over the same
//! files of a sandbox's `/proc` and `/sys`, they make `free`, `top`, `uptime` and the CPU
//! count glibc reports inside show the sandbox's limits and age instead of the host's. One lxcfs serves every sandbox of the
//! host; `scripts/install-deps.sh` starts it at [`DEFAULT_DIR`].

use std::path::{Path, PathBuf};

/// Where Debian's lxcfs package mounts it.
pub const DEFAULT_DIR: &str = "/var/lib/lxcfs";

/// The files taken from lxcfs, by their path under its mount point, which is also where each
/// is bound in a sandbox (over its `/proc` and `/sys`). (`loadavg` only answers per sandbox
/// when lxcfs runs with `-l`; `slabinfo` is the host's either way.) The CPU counts of
/// `cpuinfo`, `stat` and `cpu/online` follow the sandbox's CFS quota when lxcfs runs with
/// `--enable-cfs` and finds the sandbox's cpuset cgroup beside its cpu one.
pub const FILES: &[&str] = &[
    "proc/meminfo",
    "proc/cpuinfo",
    "proc/stat",
    "proc/uptime",
    "proc/swaps",
    "proc/diskstats",
    "sys/devices/system/cpu/online",
];

/// A working lxcfs and the [`FILES`] it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lxcfs {
    /// Its mount point.
    pub dir: PathBuf,
    /// Paths under `dir` (and in a sandbox), a subset of [`FILES`].
    pub files: Vec<PathBuf>,
}

impl Lxcfs {
    /// The lxcfs mounted at `dir`, when it works; `None` otherwise (the sandboxes then see the
    /// host's figures). A mount whose daemon died answers ENOTCONN: reading one file tells the
    /// two apart.
    pub fn at(dir: &Path) -> Option<Lxcfs> {
        if !mounted_at(dir) {
            return None;
        }
        if let Err(e) = std::fs::read(dir.join(FILES[0])) {
            tracing::warn!(dir = %dir.display(), error = %e, "lxcfs is mounted but does not answer; sandboxes see the host's /proc figures");
            return None;
        }
        let files = FILES.iter().map(PathBuf::from).filter(|f| dir.join(f).is_file()).collect();
        Some(Lxcfs { dir: dir.to_owned(), files })
    }
}

/// Whether `dir` is the mount point of a `fuse.lxcfs` mount in this mount namespace.
fn mounted_at(dir: &Path) -> bool {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    mountinfo.lines().any(|line| is_lxcfs_mount(line, dir))
}

/// One mountinfo line: `id parent major:minor root mount-point options … - fstype source …`.
fn is_lxcfs_mount(line: &str, dir: &Path) -> bool {
    let mut fields = line.split(' ');
    let Some(point) = fields.nth(4) else { return false };
    let fstype = line.split(" - ").nth(1).and_then(|rest| rest.split(' ').next());
    Path::new(point) == dir && fstype == Some("fuse.lxcfs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_lxcfs_mount_by_point_and_type() {
        let line = "46 27 0:42 / /var/lib/lxcfs rw,nosuid,nodev,relatime - fuse.lxcfs lxcfs rw,user_id=0,group_id=0,allow_other";
        assert!(is_lxcfs_mount(line, Path::new("/var/lib/lxcfs")));
        assert!(!is_lxcfs_mount(line, Path::new("/var/lib")));
        let other = "47 27 0:43 / /var/lib/lxcfs rw - tmpfs tmpfs rw";
        assert!(!is_lxcfs_mount(other, Path::new("/var/lib/lxcfs")));
        assert!(!is_lxcfs_mount("garbage", Path::new("/var/lib/lxcfs")));
    }

    #[test]
    fn nothing_where_no_lxcfs_is_mounted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/meminfo"), "MemTotal: 1 kB\n").unwrap();
        assert_eq!(Lxcfs::at(dir.path()), None, "a plain directory is not lxcfs");
    }
}
