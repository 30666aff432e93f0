//! Peer sandbox runtimes (runc, bubblewrap) timed on the same host and rootfs as `space bench`,
//! so our numbers sit next to reference points measured under identical conditions instead of
//! figures quoted from elsewhere. Every sample starts a fresh sandbox that runs `/bin/true`.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

const RUNC_INSTALL: &str = "apt-get install runc";
const BWRAP_INSTALL: &str = "apt-get install bubblewrap";

/// Memory in use on the host (MemTotal − MemAvailable), the figure that shows what idle
/// sandboxes really cost, page cache excluded.
pub fn host_memory_used_bytes() -> anyhow::Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    memory_used_bytes(&meminfo)
}

/// `runc run` of a fresh container per sample, from spawn until exit. Needs root: the config
/// is the rootful one `runc spec` produces (see [`runc_config`]).
pub fn runc_true(rootfs: &Path, work_dir: &Path, n: usize) -> anyhow::Result<Vec<Duration>> {
    let rootfs = checked_rootfs(rootfs)?;
    anyhow::ensure!(
        nix::unistd::Uid::effective().is_root(),
        "the runc comparison needs root (rootful runc creates namespaces and cgroups): rerun as root, e.g. with sudo"
    );
    let bundle = Bundle::create(work_dir, &rootfs)?;
    let prefix = format!("space-bench-{}", std::process::id());
    (0..n).map(|i| runc_run_once(&bundle.dir, &format!("{prefix}-{i}"))).collect()
}

/// `bwrap --unshare-all --ro-bind <rootfs> / /bin/true` per sample: about the least a namespace
/// sandbox can do, so it serves as the lower bound. No `--proc`/`--dev`, to match the reference
/// measurement we compare against.
pub fn bwrap_true(rootfs: &Path, n: usize) -> anyhow::Result<Vec<Duration>> {
    let rootfs = checked_rootfs(rootfs)?;
    (0..n)
        .map(|_| {
            let mut cmd = Command::new("bwrap");
            cmd.arg("--unshare-all").arg("--ro-bind").arg(&rootfs).arg("/").arg("/bin/true");
            time_to_exit(&mut cmd, BWRAP_INSTALL)
        })
        .collect()
}

fn runc_run_once(bundle: &Path, id: &str) -> anyhow::Result<Duration> {
    let mut cmd = Command::new("runc");
    cmd.arg("run").arg("--bundle").arg(bundle).arg(id);
    let result = time_to_exit(&mut cmd, RUNC_INSTALL);
    if result.is_err() {
        // `runc run` normally destroys its container on exit, but one that failed half-way can
        // leave state (and a cgroup) behind that would outlive the bench.
        let _ = Command::new("runc").args(["delete", "-f", id]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
    result
}

/// Spawns `cmd` with no input or output and times it until exit; stderr is kept for the error.
fn time_to_exit(cmd: &mut Command, install: &str) -> anyhow::Result<Duration> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let start = Instant::now();
    let child = cmd.spawn().map_err(|e| spawn_error(&program, install, e))?;
    let output = child.wait_with_output().with_context(|| format!("waiting for {program}"))?;
    let elapsed = start.elapsed();
    anyhow::ensure!(
        output.status.success(),
        "{program} running /bin/true failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(elapsed)
}

fn spawn_error(program: &str, install: &str, error: std::io::Error) -> anyhow::Error {
    if error.kind() == ErrorKind::NotFound {
        anyhow::anyhow!("{program} not found: install it with `{install}`")
    } else {
        anyhow::Error::new(error).context(format!("starting {program}"))
    }
}

/// Absolute, so the OCI config does not depend on the bundle's location; `/bin/true` is checked
/// up front because a missing one otherwise surfaces as an obscure exec error inside the sandbox.
fn checked_rootfs(rootfs: &Path) -> anyhow::Result<PathBuf> {
    let rootfs = rootfs.canonicalize().with_context(|| format!("rootfs {} not found", rootfs.display()))?;
    anyhow::ensure!(
        rootfs.join("bin/true").symlink_metadata().is_ok(),
        "rootfs {} has no /bin/true, which the peer benchmarks run: use a template rootfs (e.g. busybox)",
        rootfs.display()
    );
    Ok(rootfs)
}

/// An OCI bundle that is removed again on drop, so an error mid-bench leaves nothing behind.
struct Bundle {
    dir: PathBuf,
}

impl Bundle {
    fn create(work_dir: &Path, rootfs: &Path) -> anyhow::Result<Bundle> {
        let dir = work_dir.join(format!("runc-bundle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating runc bundle {}", dir.display()))?;
        let bundle = Bundle { dir };
        let root = rootfs.to_str().with_context(|| format!("rootfs path {} is not UTF-8", rootfs.display()))?;
        let config = serde_json::to_vec_pretty(&runc_config(root))?;
        std::fs::write(bundle.dir.join("config.json"), config).context("writing the runc bundle's config.json")?;
        Ok(bundle)
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What `runc spec` of runc 1.1.5 writes, with the process and root changed, written out here so
/// the comparison does not shift when a newer runc changes its defaults. That `runc spec` lacks
/// the cgroup namespace; it is added so runc isolates as much as the sandboxes it is compared to.
fn runc_config(rootfs: &str) -> serde_json::Value {
    let caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let namespaces = ["pid", "network", "ipc", "uts", "mount", "cgroup"].map(|t| serde_json::json!({ "type": t }));
    serde_json::json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": ["/bin/true"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": { "bounding": caps, "effective": caps, "permitted": caps, "ambient": caps },
            "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024 }],
            "noNewPrivileges": true
        },
        "root": { "path": rootfs, "readonly": true },
        "hostname": "runc",
        "mounts": runc_mounts(),
        "linux": {
            "resources": { "devices": [{ "allow": false, "access": "rwm" }] },
            "namespaces": namespaces,
            "maskedPaths": [
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"
            ],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

fn runc_mounts() -> serde_json::Value {
    let mount = |destination: &str, kind: &str, source: &str, options: &[&str]| serde_json::json!({ "destination": destination, "type": kind, "source": source, "options": options });
    serde_json::json!([
        mount("/proc", "proc", "proc", &[]),
        mount("/dev", "tmpfs", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]
        ),
        mount("/dev/shm", "tmpfs", "shm", &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
        mount("/dev/mqueue", "mqueue", "mqueue", &["nosuid", "noexec", "nodev"]),
        mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", "ro"]),
        mount("/sys/fs/cgroup", "cgroup", "cgroup", &["nosuid", "noexec", "nodev", "relatime", "ro"]),
    ])
}

fn memory_used_bytes(meminfo: &str) -> anyhow::Result<u64> {
    let field =
        |name: &str| meminfo_kib(meminfo, name).with_context(|| format!("/proc/meminfo has no readable {name} line"));
    let (total, available) = (field("MemTotal")?, field("MemAvailable")?);
    Ok(total.saturating_sub(available) * 1024)
}

/// The kernel prints every /proc/meminfo size in kB (KiB), whatever the line.
fn meminfo_kib(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?.trim();
        value.strip_suffix("kB")?.trim_end().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:        2014180 kB\nMemFree:          104324 kB\n\
                           MemAvailable:    1509564 kB\nBuffers:           60108 kB\n";

    #[test]
    fn memory_used_is_total_minus_available() {
        assert_eq!(memory_used_bytes(MEMINFO).unwrap(), (2014180 - 1509564) * 1024);
    }

    #[test]
    fn meminfo_fields_match_whole_names_only() {
        let meminfo = "MemTotalX:  5 kB\nMemTotal:  7 kB\n";
        assert_eq!(meminfo_kib(meminfo, "MemTotal"), Some(7));
    }

    #[test]
    fn missing_mem_available_is_an_error() {
        let err = memory_used_bytes("MemTotal: 100 kB\nMemFree: 50 kB\n").unwrap_err();
        assert!(err.to_string().contains("MemAvailable"), "{err}");
    }

    #[test]
    fn config_runs_true_read_only_without_terminal() {
        let config = runc_config("/srv/rootfs");
        assert_eq!(config["process"]["args"], serde_json::json!(["/bin/true"]));
        assert_eq!(config["process"]["terminal"], false);
        assert_eq!(config["root"], serde_json::json!({ "path": "/srv/rootfs", "readonly": true }));
    }

    #[test]
    fn config_has_the_default_namespaces_plus_cgroup() {
        let config = runc_config("/r");
        let types: Vec<&str> =
            config["linux"]["namespaces"].as_array().unwrap().iter().map(|n| n["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["pid", "network", "ipc", "uts", "mount", "cgroup"]);
        assert_eq!(config["mounts"][0]["destination"], "/proc");
    }

    #[test]
    fn missing_program_error_says_how_to_install() {
        let mut cmd = Command::new("space-test-no-such-runtime");
        let err = time_to_exit(&mut cmd, RUNC_INSTALL).unwrap_err();
        assert_eq!(err.to_string(), "space-test-no-such-runtime not found: install it with `apt-get install runc`");
    }

    #[test]
    fn rootfs_without_true_is_rejected() {
        let err = bwrap_true(Path::new("/proc"), 1).unwrap_err();
        assert!(err.to_string().contains("has no /bin/true"), "{err}");
    }
}
