//! cgroup v2: one unified hierarchy; controllers enabled top-down through cgroup.subtree_control.

use std::path::{Path, PathBuf};

use space_runtime::{Limits, SandboxStats};

use super::{Backend, CgroupError, CgroupMount, V2_CONTROLLERS, keyed, read, read_u64, write};

#[derive(Debug)]
pub(crate) struct V2 {
    mount: CgroupMount,
}

impl V2 {
    pub fn new(mount: CgroupMount) -> V2 {
        V2 { mount }
    }

    fn dir(&self, name: &Path) -> PathBuf {
        self.mount.mount_point.join(name)
    }

    fn apply_limits(&self, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
        if limits.memory_mib > 0 {
            write(dir, "memory.max", &(limits.memory_mib * 1024 * 1024).to_string())?;
            if dir.join("memory.swap.max").exists() {
                write(dir, "memory.swap.max", "0")?;
            }
        }
        let quota = super::cpu_quota_us(limits.millicpus).map_or("max".to_string(), |q| q.to_string());
        write(dir, "cpu.max", &format!("{quota} {}", super::CPU_PERIOD_US))?;
        let pids = if limits.pids > 0 { limits.pids.to_string() } else { "max".to_string() };
        write(dir, "pids.max", &pids)
    }
}

/// Enables the needed controllers for `dir`'s children (those `dir` itself has).
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = read(dir, "cgroup.controllers")?;
    let enabled = read(dir, "cgroup.subtree_control")?;
    let wanted: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .filter(|c| !enabled.split_whitespace().any(|e| e == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if wanted.is_empty() { Ok(()) } else { write(dir, "cgroup.subtree_control", &wanted.join(" ")) }
}

impl Backend for V2 {
    fn version(&self) -> u8 {
        2
    }

    fn create(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError> {
        let mut dir = self.mount.mount_point.clone();
        for component in name.components() {
            enable_controllers(&dir)?;
            dir.push(component);
            super::mkdir_all(&dir)?;
        }
        self.apply_limits(&dir, limits)
    }

    fn set_limits(&self, name: &Path, limits: &Limits) -> Result<(), CgroupError> {
        self.apply_limits(&self.dir(name), limits)
    }

    fn attach(&self, name: &Path, pid: u32) -> Result<(), CgroupError> {
        write(&self.dir(name), "cgroup.procs", &pid.to_string())
    }

    fn exists(&self, name: &Path) -> bool {
        self.dir(name).is_dir()
    }

    fn set_frozen(&self, name: &Path, frozen: bool) -> Result<(), CgroupError> {
        write(&self.dir(name), "cgroup.freeze", if frozen { "1" } else { "0" })
    }

    fn is_frozen(&self, name: &Path) -> bool {
        read(&self.dir(name), "cgroup.events").is_ok_and(|t| keyed(&t, "frozen") == Some(1))
    }

    fn kill_all(&self, name: &Path) -> Result<bool, CgroupError> {
        let dir = self.dir(name);
        if !dir.join("cgroup.kill").exists() {
            return Ok(false);
        }
        write(&dir, "cgroup.kill", "1").map(|()| true)
    }

    fn dirs(&self, name: &Path) -> Vec<PathBuf> {
        vec![self.dir(name)]
    }

    fn parent_dirs(&self, parent: &Path) -> Vec<PathBuf> {
        vec![self.dir(parent)]
    }

    fn stats(&self, name: &Path) -> Result<SandboxStats, CgroupError> {
        let dir = self.dir(name);
        Ok(SandboxStats {
            memory_bytes: read_u64(&dir, "memory.current")?,
            // Linux 5.19+.
            memory_peak_bytes: read_u64(&dir, "memory.peak").ok(),
            memory_limit_bytes: read_u64(&dir, "memory.max")?,
            oom_kills: self.oom_kills(name)?,
            pids: read_u64(&dir, "pids.current")?,
            cpu_usage_ns: keyed(&read(&dir, "cpu.stat")?, "usage_usec").unwrap_or(0) * 1000,
        })
    }

    fn oom_kills(&self, name: &Path) -> Result<u64, CgroupError> {
        Ok(keyed(&read(&self.dir(name), "memory.events")?, "oom_kill").unwrap_or(0))
    }

    fn membership(&self, name: &Path) -> (String, String) {
        (Path::new(&self.mount.root).join(name).to_string_lossy().into_owned(), String::new())
    }

    fn hierarchy_paths(&self, name: &Path) -> Vec<(Option<String>, String)> {
        vec![(None, Path::new(&self.mount.root).join(name).to_string_lossy().into_owned())]
    }

    fn freezer_dir(&self, name: &Path) -> PathBuf {
        self.dir(name)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// A directory tree shaped like cgroup2 (the kernel's files faked as plain files).
    fn fake_root() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        fs::write(root.path().join("cgroup.subtree_control"), "cpu\n").unwrap();
        root
    }

    fn v2(root: &Path) -> V2 {
        V2::new(CgroupMount {
            root: "/".into(),
            mount_point: root.into(),
            fstype: "cgroup2".into(),
            controllers: vec![],
        })
    }

    #[test]
    fn create_enables_controllers_and_writes_limits() {
        let root = fake_root();
        let cg = v2(root.path());
        // Each level's control files appear when the kernel creates it; pre-create them here.
        let parent = root.path().join("space");
        fs::create_dir(&parent).unwrap();
        fs::write(parent.join("cgroup.controllers"), "memory pids cpu\n").unwrap();
        fs::write(parent.join("cgroup.subtree_control"), "").unwrap();
        let limits = Limits { memory_mib: 64, millicpus: 500, pids: 100 };
        cg.create(Path::new("space/sbx"), &limits).unwrap();
        let read = |p: &str| fs::read_to_string(root.path().join(p)).unwrap();
        assert_eq!(read("cgroup.subtree_control"), "+memory +pids");
        assert_eq!(read("space/cgroup.subtree_control"), "+memory +cpu +pids");
        assert_eq!(read("space/sbx/memory.max"), (64u64 << 20).to_string());
        assert_eq!(read("space/sbx/cpu.max"), "50000 100000");
        assert_eq!(read("space/sbx/pids.max"), "100");
        assert_eq!(cg.membership(Path::new("space/sbx")), ("/space/sbx".to_string(), String::new()));
    }

    #[test]
    fn stats_from_files() {
        let root = fake_root();
        let dir = root.path().join("s");
        fs::create_dir(&dir).unwrap();
        for (file, text) in [
            ("memory.current", "1000\n"),
            ("memory.peak", "4000\n"),
            ("memory.max", "max\n"),
            ("memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n"),
            ("pids.current", "3\n"),
            ("cpu.stat", "usage_usec 7\nuser_usec 5\n"),
        ] {
            fs::write(dir.join(file), text).unwrap();
        }
        let stats = v2(root.path()).stats(Path::new("s")).unwrap();
        let expected = SandboxStats {
            memory_bytes: 1000,
            memory_peak_bytes: Some(4000),
            memory_limit_bytes: u64::MAX,
            oom_kills: 1,
            pids: 3,
            cpu_usage_ns: 7000,
        };
        assert_eq!(stats, expected);
    }
}
