//! Cgroups of the sandboxes: one cgroup per sandbox, named `<parent>/<sandbox id>` in every
//! hierarchy the runtime uses. Two backends behind [`Backend`]: cgroup v1 (one hierarchy per
//! controller, as on these hosts) and the unified cgroup v2 hierarchy.
//!
//! Everything here is synchronous file I/O on cgroupfs; the async orchestration (waiting for
//! a freeze, for a cgroup to empty) lives in the runtime.

mod mountinfo;
mod v1;
mod v2;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use space_runtime::{Limits, SandboxStats};

pub(crate) use mountinfo::CgroupMount;

/// Controllers the runtime needs, by their v1 names.
pub(crate) const V1_CONTROLLERS: &[&str] = &["memory", "cpu", "cpuacct", "pids", "freezer"];
/// Controllers the runtime enables on v2 (freezing and cpu accounting are built in).
pub(crate) const V2_CONTROLLERS: &[&str] = &["memory", "cpu", "pids"];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{0}")]
    Unsupported(String),
    #[error("{op} {}: {source}", path.display())]
    Io { op: &'static str, path: PathBuf, source: io::Error },
}

impl CgroupError {
    pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
        let path = path.to_path_buf();
        move |source| CgroupError::Io { op, path, source }
    }
}

/// The operations the runtime needs from a cgroup hierarchy (or set of v1 hierarchies).
/// `name` is the sandbox cgroup's path below the hierarchy root: `<parent>/<id>`.
pub trait Backend: Send + Sync + std::fmt::Debug {
    fn version(&self) -> u8;
    /// Creates the cgroup (and its parents) and applies the limits.
    fn create(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError>;
    /// Replaces the limits of an existing cgroup.
    fn set_limits(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError>;
    /// Before CRIU restores into the cgroup: creates the parts whose first values must be this
    /// host's rather than those recorded where the image was dumped (v1's cpuset: CRIU sets
    /// the properties of the cgroups it creates, and another node may have other CPUs).
    fn prepare_restore(&self, _name: &Path) -> Result<(), CgroupError> {
        Ok(())
    }
    /// Moves a process into the cgroup in every hierarchy.
    fn attach(&self, name: &Path, pid: u32) -> Result<(), CgroupError>;
    fn exists(&self, name: &Path) -> bool;
    /// Requests freezing (true) or thawing (false); returns immediately.
    fn set_frozen(&self, name: &Path, frozen: bool) -> Result<(), CgroupError>;
    /// Whether the freeze requested with `set_frozen(true)` has completed.
    fn is_frozen(&self, name: &Path) -> bool;
    /// Kills every process with one kernel operation (v2 `cgroup.kill`), if supported.
    fn kill_all(&self, name: &Path) -> Result<bool, CgroupError>;
    /// The directories of this cgroup, one per hierarchy.
    fn dirs(&self, name: &Path) -> Vec<PathBuf>;
    /// Directories under which sandbox cgroups live, one per hierarchy.
    fn parent_dirs(&self, parent: &Path) -> Vec<PathBuf>;
    fn stats(&self, name: &Path) -> Result<SandboxStats, CgroupError>;
    /// Processes the kernel's OOM killer killed in this cgroup (one file read; exec checks it
    /// before and after every command).
    fn oom_kills(&self, name: &Path) -> Result<u64, CgroupError>;
    /// The path `/proc/<pid>/cgroup` shows for a member of this cgroup, and the hierarchy's
    /// selector there (a v1 controller name, or "" for v2).
    fn membership(&self, name: &Path) -> (String, String);
    /// Per hierarchy: its controllers (v1: `memory`, `cpu,cpuacct`; v2: `None`) and this
    /// cgroup's path within it, as CRIU's `--cgroup-root` takes them.
    fn hierarchy_paths(&self, name: &Path) -> Vec<(Option<String>, String)>;
    /// The directory whose freezer state covers the cgroup (CRIU's `--freeze-cgroup`).
    fn freezer_dir(&self, name: &Path) -> PathBuf;
}

/// Every pid in cgroup `name` (and its children) across `cg`'s hierarchies, deduplicated.
pub fn members(cg: &dyn Backend, name: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for dir in cg.dirs(name) {
        procs_recursive(&dir, &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Checks a cgroup parent is a relative path of `[A-Za-z0-9._-]` components (it becomes a
/// directory under every controller); the reason otherwise.
pub fn validate_parent(parent: &str) -> Result<(), String> {
    use std::path::Component;
    let valid = !parent.is_empty()
        && Path::new(parent).components().all(|c| matches!(c, Component::Normal(_)))
        && parent.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
    match valid {
        true => Ok(()),
        false => Err(format!("cgroup parent {parent:?} must be a relative path of [A-Za-z0-9._-] components")),
    }
}

/// Picks the backend for this host from `/proc/self/mountinfo`: v2 when /sys/fs/cgroup is
/// cgroup2, else v1 when every needed controller has a hierarchy, else v2 on any cgroup2 mount
/// with the needed controllers.
pub fn detect() -> Result<Box<dyn Backend>, CgroupError> {
    let text = fs::read_to_string("/proc/self/mountinfo")
        .map_err(CgroupError::io("read", Path::new("/proc/self/mountinfo")))?;
    let mounts = mountinfo::parse(&text);
    let v2_with_controllers = |m: &&CgroupMount| {
        let available = fs::read_to_string(m.mount_point.join("cgroup.controllers")).unwrap_or_default();
        V2_CONTROLLERS.iter().all(|c| available.split_whitespace().any(|a| a == *c))
    };
    if let Some(m) = mounts.iter().find(|m| m.is_v2() && m.mount_point == Path::new("/sys/fs/cgroup")) {
        return Ok(Box::new(v2::V2::new(m.clone())));
    }
    match v1::V1::from_mounts(&mounts) {
        Ok(v1) => Ok(Box::new(v1)),
        Err(missing) => match mounts.iter().filter(|m| m.is_v2()).find(v2_with_controllers) {
            Some(m) => Ok(Box::new(v2::V2::new(m.clone()))),
            None => Err(CgroupError::Unsupported(format!(
                "no cgroup v1 hierarchy for {} and no cgroup v2 mount with {}",
                missing.join(", "),
                V2_CONTROLLERS.join(", ")
            ))),
        },
    }
}

/// `mkdir -p`, tolerating directories that already exist.
pub(crate) fn mkdir_all(path: &Path) -> Result<(), CgroupError> {
    fs::create_dir_all(path).map_err(CgroupError::io("mkdir", path))
}

pub(crate) fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    fs::write(&path, value).map_err(CgroupError::io("write", &path))
}

pub(crate) fn read(dir: &Path, file: &str) -> Result<String, CgroupError> {
    let path = dir.join(file);
    fs::read_to_string(&path).map_err(CgroupError::io("read", &path))
}

pub(crate) fn read_u64(dir: &Path, file: &str) -> Result<u64, CgroupError> {
    let text = read(dir, file)?;
    let text = text.trim();
    if text == "max" {
        return Ok(u64::MAX);
    }
    text.parse().map_err(|_| CgroupError::Io {
        op: "parse",
        path: dir.join(file),
        source: io::Error::new(io::ErrorKind::InvalidData, format!("not a number: {text:?}")),
    })
}

/// The value of `key` in a flat keyed file ("key value" lines: memory.events, cpu.stat, ...).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key)).then(|| parts.next()?.parse().ok())?
    })
}

/// Every pid in `dir`'s cgroup.procs and in those of its descendants.
pub fn procs_recursive(dir: &Path, out: &mut Vec<u32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    for child in subdirs(dir) {
        procs_recursive(&child, out);
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
}

/// Names of the sub-cgroups of `dir` (empty if it does not exist).
pub fn child_names(dir: &Path) -> Vec<String> {
    subdirs(dir).iter().filter_map(|p| p.file_name()?.to_str().map(str::to_owned)).collect()
}

/// Removes `dir` and its descendants, deepest first. Missing directories are fine.
pub fn rmdir_recursive(dir: &Path) -> Result<(), CgroupError> {
    for child in subdirs(dir) {
        rmdir_recursive(&child)?;
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(CgroupError::io("rmdir", dir)(e)),
        _ => Ok(()),
    }
}

/// CFS quota in microseconds per [`CPU_PERIOD_US`] for a limit in millicpus; `None` = no limit.
pub(crate) fn cpu_quota_us(millicpus: u32) -> Option<u64> {
    (millicpus > 0).then(|| (u64::from(millicpus) * CPU_PERIOD_US / 1000).max(1000))
}

pub(crate) const CPU_PERIOD_US: u64 = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_from_millicpus() {
        assert_eq!(cpu_quota_us(0), None);
        assert_eq!(cpu_quota_us(1000), Some(100_000));
        assert_eq!(cpu_quota_us(2500), Some(250_000));
        assert_eq!(cpu_quota_us(1), Some(1000));
    }

    #[test]
    fn keyed_files() {
        let text = "low 0\nhigh 3\nmax 0\noom 2\noom_kill 1\n";
        assert_eq!(keyed(text, "oom_kill"), Some(1));
        assert_eq!(keyed(text, "oom"), Some(2));
        assert_eq!(keyed(text, "nope"), None);
    }

    #[test]
    fn tree_helpers_on_plain_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let sbx = dir.path().join("p/s1");
        mkdir_all(&sbx.join("inner")).unwrap();
        fs::write(sbx.join("cgroup.procs"), "12\n13\n").unwrap();
        fs::write(sbx.join("inner/cgroup.procs"), "14\n").unwrap();
        let mut pids = Vec::new();
        procs_recursive(&sbx, &mut pids);
        pids.sort();
        assert_eq!(pids, vec![12, 13, 14]);
        assert_eq!(child_names(&dir.path().join("p")), vec!["s1".to_string()]);
        assert!(child_names(&dir.path().join("missing")).is_empty());
    }
}
