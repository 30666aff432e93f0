//! lxcfs: a FUSE filesystem whose `proc/meminfo`, `proc/cpuinfo`, `proc/uptime`, … answer
//! from the cgroups and pid namespace of the process that reads them. Bound over the same
//! files of a sandbox's `/proc`, they make `free`, `top` and `uptime` inside show the
//! sandbox's limits and age instead of the host's. One lxcfs serves every sandbox of the
//! host; `scripts/install-deps.sh` starts it at [`DEFAULT_DIR`].

use std::path::{Path, PathBuf};

/// Where Debian's lxcfs package mounts it.
pub const DEFAULT_DIR: &str = "/var/lib/lxcfs";

/// The `/proc` files taken from lxcfs. (`loadavg` only answers per sandbox when lxcfs runs
/// with `-l`; `slabinfo` is the host's either way.)
pub const PROC_FILES: &[&str] = &["meminfo", "cpuinfo", "stat", "uptime", "swaps", "diskstats"];

/// The host paths of lxcfs's [`PROC_FILES`] under `dir`, when a working lxcfs is mounted
/// there; empty otherwise (the sandboxes then see the host's figures). A mount whose daemon
/// died answers ENOTCONN: reading one file tells the two apart.
pub fn proc_files(dir: &Path) -> Vec<PathBuf> {
    if !mounted_at(dir) {
        return Vec::new();
    }
    let files: Vec<PathBuf> = PROC_FILES.iter().map(|name| dir.join("proc").join(name)).collect();
    match std::fs::read(&files[0]) {
        Ok(_) => files.into_iter().filter(|f| f.is_file()).collect(),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "lxcfs is mounted but does not answer; sandboxes see the host's /proc figures");
            Vec::new()
        }
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
        assert!(proc_files(dir.path()).is_empty(), "a plain directory is not lxcfs");
    }
}
