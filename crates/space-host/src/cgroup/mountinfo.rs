//! Cgroup mounts from `/proc/self/mountinfo`.

use std::path::PathBuf;

/// One cgroupfs mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// The hierarchy path mounted here (usually "/").
    pub root: String,
    pub mount_point: PathBuf,
    /// "cgroup" (v1) or "cgroup2".
    pub fstype: String,
    /// v1 controllers bound to this hierarchy (from the super options); empty for v2.
    pub controllers: Vec<String>,
}

impl CgroupMount {
    pub fn is_v2(&self) -> bool {
        self.fstype == "cgroup2"
    }

    /// Whether `controller` is one of this hierarchy's.
    pub fn carries(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// Parses mountinfo lines: `id parent maj:min root mount_point opts [optional...] - fstype source super_opts`.
pub(crate) fn parse(text: &str) -> Vec<CgroupMount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<CgroupMount> {
    let (left, right) = line.split_once(" - ")?;
    let fields: Vec<&str> = left.split(' ').collect();
    let mut right = right.split(' ');
    let fstype = right.next()?;
    if fstype != "cgroup" && fstype != "cgroup2" {
        return None;
    }
    let _source = right.next()?;
    let super_opts = right.next().unwrap_or("");
    let controllers = if fstype == "cgroup" {
        super_opts.split(',').filter(|o| KNOWN_V1.contains(o)).map(str::to_owned).collect()
    } else {
        Vec::new()
    };
    Some(CgroupMount {
        root: unescape(fields.get(3)?),
        mount_point: PathBuf::from(unescape(fields.get(4)?)),
        fstype: fstype.to_owned(),
        controllers,
    })
}

/// v1 controller names (super options also carry rw, name=..., clone_children, ...).
const KNOWN_V1: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// Undoes mountinfo's octal escapes (`\040` for space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:5 - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 /docker/x /sys/fs/cgroup/cpu\\040x rw - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn parses_v1_and_v2_mounts() {
        let mounts = parse(HYBRID);
        assert_eq!(mounts.len(), 6);
        assert_eq!(mounts[0].controllers, vec!["cpu"]);
        assert_eq!(mounts[2].mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert!(mounts[3].controllers.is_empty(), "name=systemd has no controller");
        assert!(mounts[4].is_v2());
        assert_eq!(mounts[5].root, "/docker/x");
        assert_eq!(mounts[5].mount_point, PathBuf::from("/sys/fs/cgroup/cpu x"));
        assert_eq!(mounts[5].controllers, vec!["cpu", "cpuacct"]);
    }
}
