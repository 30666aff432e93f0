//! cgroup v1: one hierarchy per controller (or per group of co-mounted controllers).

use std::path::{Path, PathBuf};

use space_runtime::{Limits, SandboxStats};

use super::{Backend, CgroupError, CgroupMount, V1_CONTROLLERS, keyed, mkdir_all, read, read_u64, write};

#[derive(Debug)]
pub(crate) struct V1 {
    /// The distinct hierarchies holding [`V1_CONTROLLERS`], and cpuset's when it has one.
    hierarchies: Vec<CgroupMount>,
}

/// Not needed for any limit, but joined where mounted: lxcfs finds a reader's cgroup by its
/// cpuset path and reads the CFS quota there, so a sandbox left in the root cpuset would see
/// the host's CPU count in lxcfs's `cpuinfo`.
const CPUSET: &str = "cpuset";

impl V1 {
    /// Finds a hierarchy for every needed controller, and cpuset's if it has one; on failure
    /// returns the missing ones.
    pub fn from_mounts(mounts: &[CgroupMount]) -> Result<V1, Vec<String>> {
        let mut hierarchies: Vec<CgroupMount> = Vec::new();
        let mut missing = Vec::new();
        for controller in V1_CONTROLLERS.iter().copied().chain([CPUSET]) {
            match v1_of(mounts, controller) {
                Some(m) if !hierarchies.iter().any(|h| h.mount_point == m.mount_point) => hierarchies.push(m.clone()),
                Some(_) => {}
                None if controller == CPUSET => {}
                None => missing.push(controller.to_string()),
            }
        }
        if missing.is_empty() { Ok(V1 { hierarchies }) } else { Err(missing) }
    }

    fn hierarchy(&self, controller: &str) -> &CgroupMount {
        self.hierarchies.iter().find(|h| h.carries(controller)).expect("from_mounts found every controller")
    }

    fn dir(&self, controller: &str, name: &Path) -> PathBuf {
        self.hierarchy(controller).mount_point.join(name)
    }

    fn apply_limits(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError> {
        let memory = self.dir("memory", name);
        if limits.memory_mib > 0 {
            let bytes = limits.memory_mib * 1024 * 1024;
            // Without swap accounting the file is absent; with it, swap must not extend the limit.
            // The kernel keeps memsw ≥ memory at every step, so the order depends on the direction.
            let memsw = memory.join("memory.memsw.limit_in_bytes").exists();
            let raising = memsw && read_u64(&memory, "memory.memsw.limit_in_bytes")? < bytes;
            if raising {
                write(&memory, "memory.memsw.limit_in_bytes", &bytes.to_string())?;
            }
            write(&memory, "memory.limit_in_bytes", &bytes.to_string())?;
            if memsw && !raising {
                write(&memory, "memory.memsw.limit_in_bytes", &bytes.to_string())?;
            }
        }
        let cpu = self.dir("cpu", name);
        write(&cpu, "cpu.cfs_period_us", &super::CPU_PERIOD_US.to_string())?;
        let quota = super::cpu_quota_us(limits.millicpus).map_or("-1".to_string(), |q| q.to_string());
        write(&cpu, "cpu.cfs_quota_us", &quota)?;
        let pids = if limits.pids > 0 { limits.pids.to_string() } else { "max".to_string() };
        write(&self.dir("pids", name), "pids.max", &pids)
    }
}

/// The v1 hierarchy among `mounts` that carries `controller`.
fn v1_of<'a>(mounts: &'a [CgroupMount], controller: &str) -> Option<&'a CgroupMount> {
    mounts.iter().find(|m| !m.is_v2() && m.carries(controller))
}

/// A hierarchy that also carries cpuset starts new cgroups with no cpus/mems: copy the parent's.
fn init_cpuset(mount: &CgroupMount, name: &Path) -> Result<(), CgroupError> {
    if !mount.carries(CPUSET) {
        return Ok(());
    }
    let mut dir = mount.mount_point.clone();
    for component in name.components() {
        let child = dir.join(component);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if read(&child, file)?.trim().is_empty() {
                write(&child, file, read(&dir, file)?.trim())?;
            }
        }
        dir = child;
    }
    Ok(())
}

/// v1 reports "no limit" as a huge page-aligned number.
fn normalize_limit(value: u64) -> u64 {
    if value >= 1 << 62 { u64::MAX } else { value }
}

impl Backend for V1 {
    fn version(&self) -> u8 {
        1
    }

    fn create(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError> {
        for h in &self.hierarchies {
            mkdir_all(&h.mount_point.join(name))?;
            init_cpuset(h, name)?;
        }
        self.apply_limits(name, limits)
    }

    fn set_limits(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError> {
        self.apply_limits(name, limits)
    }

    fn prepare_restore(&self, name: &Path) -> Result<(), CgroupError> {
        for h in self.hierarchies.iter().filter(|h| h.carries(CPUSET)) {
            mkdir_all(&h.mount_point.join(name))?;
            init_cpuset(h, name)?;
        }
        Ok(())
    }

    fn attach(&self, name: &Path, pid: u32) -> Result<(), CgroupError> {
        self.hierarchies.iter().try_for_each(|h| write(&h.mount_point.join(name), "cgroup.procs", &pid.to_string()))
    }

    fn exists(&self, name: &Path) -> bool {
        self.hierarchies.iter().any(|h| h.mount_point.join(name).is_dir())
    }

    fn set_frozen(&self, name: &Path, frozen: bool) -> Result<(), CgroupError> {
        write(&self.dir("freezer", name), "freezer.state", if frozen { "FROZEN" } else { "THAWED" })
    }

    fn is_frozen(&self, name: &Path) -> bool {
        read(&self.dir("freezer", name), "freezer.state").is_ok_and(|s| s.trim() == "FROZEN")
    }

    fn kill_all(&self, _name: &Path) -> Result<bool, CgroupError> {
        Ok(false)
    }

    fn dirs(&self, name: &Path) -> Vec<PathBuf> {
        self.hierarchies.iter().map(|h| h.mount_point.join(name)).collect()
    }

    fn parent_dirs(&self, parent: &Path) -> Vec<PathBuf> {
        self.dirs(parent)
    }

    fn stats(&self, name: &Path) -> Result<SandboxStats, CgroupError> {
        let memory = self.dir("memory", name);
        Ok(SandboxStats {
            memory_bytes: read_u64(&memory, "memory.usage_in_bytes")?,
            memory_peak_bytes: Some(read_u64(&memory, "memory.max_usage_in_bytes")?),
            memory_limit_bytes: normalize_limit(read_u64(&memory, "memory.limit_in_bytes")?),
            oom_kills: self.oom_kills(name)?,
            pids: read_u64(&self.dir("pids", name), "pids.current")?,
            cpu_usage_ns: read_u64(&self.dir("cpuacct", name), "cpuacct.usage")?,
        })
    }

    fn oom_kills(&self, name: &Path) -> Result<u64, CgroupError> {
        Ok(keyed(&read(&self.dir("memory", name), "memory.oom_control")?, "oom_kill").unwrap_or(0))
    }

    fn membership(&self, name: &Path) -> (String, String) {
        let root = Path::new(&self.hierarchy("pids").root);
        (root.join(name).to_string_lossy().into_owned(), "pids".to_string())
    }

    fn hierarchy_paths(&self, name: &Path) -> Vec<(Option<String>, String)> {
        let path = |h: &CgroupMount| Path::new(&h.root).join(name).to_string_lossy().into_owned();
        self.hierarchies.iter().map(|h| (Some(h.controllers.join(",")), path(h))).collect()
    }

    fn freezer_dir(&self, name: &Path) -> PathBuf {
        self.dir("freezer", name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(point: &str, controllers: &[&str]) -> CgroupMount {
        CgroupMount {
            root: "/".into(),
            mount_point: point.into(),
            fstype: "cgroup".into(),
            controllers: controllers.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn finds_each_controller_once() {
        let mounts = vec![
            mount("/c/cpu,cpuacct", &["cpu", "cpuacct"]),
            mount("/c/memory", &["memory"]),
            mount("/c/pids", &["pids"]),
            mount("/c/freezer", &["freezer"]),
        ];
        let v1 = V1::from_mounts(&mounts).unwrap();
        assert_eq!(v1.hierarchies.len(), 4);
        assert_eq!(v1.dir("cpuacct", Path::new("a/b")), PathBuf::from("/c/cpu,cpuacct/a/b"));
        let missing = V1::from_mounts(&mounts[1..]).unwrap_err();
        assert_eq!(missing, vec!["cpu", "cpuacct"]);
        // cpuset is joined where it is mounted, and not required where it is not.
        let with_cpuset = [mounts.clone(), vec![mount("/c/cpuset", &["cpuset"])]].concat();
        let v1 = V1::from_mounts(&with_cpuset).unwrap();
        assert_eq!(v1.hierarchies.len(), 5);
        assert_eq!(v1.dir(CPUSET, Path::new("a")), PathBuf::from("/c/cpuset/a"));
    }

    #[test]
    fn unlimited_is_max() {
        assert_eq!(normalize_limit(9223372036854771712), u64::MAX);
        assert_eq!(normalize_limit(64 << 20), 64 << 20);
    }
}
