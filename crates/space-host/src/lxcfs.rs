//! lxcfs: a FUSE filesystem whose `proc/meminfo`, `proc/cpuinfo`, `proc/uptime`, … answer
//! from the cgroups and pid namespace of the process that reads them. Bound over the same
//! files of a sandbox's `/proc` and `/sys`, they make `free`, `top`, `uptime` and the CPU
//! count glibc reports inside show the sandbox's limits and age instead of the host's. One
//! lxcfs serves every sandbox of the host; `scripts/install-deps.sh` starts it at
//! [`DEFAULT_DIR`].

use std::path::{Path, PathBuf};

/// Where Debian's lxcfs package mounts it.
pub const DEFAULT_DIR: &str = "/var/lib/lxcfs";

/// Where lxcfs writes its pid unless told otherwise (Debian's unit and the script keep it).
const PIDFILE: &str = "/run/lxcfs.pid";

/// The flags `scripts/start-lxcfs.sh` starts lxcfs with.
pub const FLAGS: &[&str] = &["--enable-cfs", "-o", "direct_io"];

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
    /// Whether the daemon of [`PIDFILE`] runs with [`FLAGS`]: without them the CPU counts are
    /// the host's, and a longer answer can be cut to an earlier reader's size.
    pub flagged: bool,
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
        let flagged = daemon_args().is_some_and(|args| has_flags(&args));
        if !flagged {
            tracing::warn!(dir = %dir.display(), "lxcfs runs without {}: sandboxes see the host's CPU count; run scripts/start-lxcfs.sh", FLAGS.join(" "));
        }
        Some(Lxcfs { dir: dir.to_owned(), files, flagged })
    }
}

/// The command line of the process [`PIDFILE`] names, if it is lxcfs.
fn daemon_args() -> Option<Vec<String>> {
    let pid = std::fs::read_to_string(PIDFILE).ok()?;
    let proc = Path::new("/proc").join(pid.trim());
    (std::fs::read_to_string(proc.join("comm")).ok()?.trim() == "lxcfs").then_some(())?;
    let cmdline = std::fs::read(proc.join("cmdline")).ok()?;
    Some(cmdline.split(|b| *b == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect())
}

/// Whether `args` hold [`FLAGS`] in that order.
fn has_flags(args: &[String]) -> bool {
    args.windows(FLAGS.len()).any(|w| w.iter().zip(FLAGS).all(|(a, f)| a == f))
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
    fn the_flags_are_found_in_order() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert!(has_flags(&args("lxcfs --enable-cfs -o direct_io --pidfile=/run/lxcfs.pid /var/lib/lxcfs")));
        assert!(!has_flags(&args("lxcfs --pidfile=/run/lxcfs.pid /var/lib/lxcfs")));
        assert!(!has_flags(&args("lxcfs -o direct_io --enable-cfs /var/lib/lxcfs")));
    }

    #[test]
    fn nothing_where_no_lxcfs_is_mounted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/meminfo"), "MemTotal: 1 kB\n").unwrap();
        assert_eq!(Lxcfs::at(dir.path()), None, "a plain directory is not lxcfs");
    }
}
