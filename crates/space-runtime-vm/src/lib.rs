//! The vm runtime: every sandbox is a QEMU `microvm` with its own guest kernel, whose pid 1
//! is `spaced` serving the node on a virtio-serial port. QEMU exposes that port on the host
//! as the unix socket [`VmRuntime::agent_socket`], so the node speaks the same protocol to
//! a VM as to a linux sandbox (`space_proto::client::AgentClient::connect_unix`).
//!
//! The VMM is jailed like firecracker's jailer does it (see `jail/mod.rs`): an unprivileged
//! host uid of its own (the root of a host id range, `space_host::ranges`),
//! no_new_privs, new pid/mount/network/ipc/uts namespaces, a tmpfs root with read-only binds
//! of QEMU and the guest kernel, QEMU's own seccomp filter, and the sandbox's cgroup. Its
//! network namespace holds only `lo` and the guest's tap: the node's gateway opens its
//! listeners there ([`VmRuntime::network_namespace`]), exactly as for a linux sandbox.
//!
//! Per sandbox the runtime owns, named after the sandbox id: the cgroup
//! `<cgroup parent>/<id>` (every hierarchy), the directory `<run dir>/vm/<id>` and a host id
//! range, recorded in `<run dir>/vm/uid-ranges`. `list` finds sandboxes by the first two and
//! `destroy` removes all three, so both work after a node restart.
//!
//! Guest memory and vCPUs are fixed when the VM boots: [`VmRuntime::set_limits`] changes the
//! CPU quota only and refuses another memory size.

mod accel;
mod agent;
mod checkpoint;
mod error;
mod image;
mod initrd;
pub mod jail;
mod qemu;
pub mod qmp;
mod restore;
mod runtime;
mod stale;
mod start;
mod state_input;
mod sys;
mod teardown;
mod template;
mod tsc;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use space_host::cgroup::{self, Backend};
use space_host::ranges::Ranges;
use space_proto::client::AgentClient;
use space_runtime::{Limits, SandboxId, SandboxStats};

pub use accel::{AccelPolicy, Accelerator, PROBE_TIMEOUT};
pub use checkpoint::{STATE_FILE, STATE_RECORD};
pub use error::VmError;
pub use image::make_root_image;
pub use qemu::{AccelKind, GATEWAY_ADDR, GUEST_ADDR};
pub use space_runtime::IdMap;
pub use template::TemplateState;
pub use tsc::TscFrequency;

/// Guest RAM when the limits give none.
pub const DEFAULT_MEMORY_MIB: u64 = 256;
/// The smallest guest the sandbox kernel and spaced boot in.
pub const MIN_MEMORY_MIB: u64 = 64;

/// Configuration of a [`VmRuntime`].
#[derive(Debug, Clone)]
pub struct VmOptions {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// The `space-vm-jailer` binary (built with this crate).
    pub jailer: PathBuf,
    /// The guest artifacts: `vmlinux`, `initrd.cpio`, `kernel-version`, `READY`.
    pub guest_dir: PathBuf,
    /// The host's static `spaced` (with guest mode): appended to the initrd as `/spaced`.
    pub spaced: PathBuf,
    /// The runtime keeps everything under `<run_dir>/vm` (created 0700).
    pub run_dir: PathBuf,
    /// Relative cgroup path the VMs' cgroups go under. Must not be the linux runtime's, whose
    /// `list` would report the VMs as its own.
    pub cgroup_parent: String,
    /// The storage's id range. VMMs run as the root of a range of their own after it.
    pub id_map: IdMap,
    /// Slots (ranges) below this are left to the linux runtime, whose sandboxes take slots
    /// `1..=DEFAULT_RANGES` of the same storage range: no VMM shares a uid with a sandbox.
    pub first_slot: u32,
    /// How many VMs can hold an id range at once.
    pub slots: u32,
    pub accel: AccelPolicy,
    /// Bound on `start` until the agent answers.
    pub start_timeout: Duration,
    /// Bound on `destroy` waiting for the VMM to die.
    pub stop_timeout: Duration,
    /// Bound on `checkpoint` writing the VM's state (a restore is bounded by
    /// `start_timeout`).
    pub checkpoint_timeout: Duration,
    /// What the VMM needs beyond guest RAM (QEMU, its libraries, the TCG translation cache,
    /// device buffers); the cgroup's memory limit is guest RAM plus this.
    pub memory_overhead_mib: u64,
    /// TCG's translation cache (counted in the overhead).
    pub tb_size_mib: u64,
    /// Tasks the VMM may have (QEMU's threads: vCPUs, I/O workers, RCU, ...). The guest's own
    /// processes are not host tasks.
    pub vmm_pids: u32,
    /// Extra guest kernel parameters (debugging, tests).
    pub extra_cmdline: Vec<String>,
    /// Keeps the guest console in `<vm dir>/sock/console.log` (debugging only: the guest
    /// controls how much it writes).
    pub console_log: bool,
}

impl VmOptions {
    pub fn new(
        jailer: impl Into<PathBuf>,
        spaced: impl Into<PathBuf>,
        run_dir: impl Into<PathBuf>,
        cgroup_parent: impl Into<String>,
    ) -> VmOptions {
        VmOptions {
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            jailer: jailer.into(),
            guest_dir: "/var/cache/space/vm".into(),
            spaced: spaced.into(),
            run_dir: run_dir.into(),
            cgroup_parent: cgroup_parent.into(),
            id_map: IdMap::default(),
            first_slot: space_host::ranges::DEFAULT_RANGES + 1,
            slots: 1024,
            accel: AccelPolicy::Auto,
            start_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
            checkpoint_timeout: Duration::from_secs(120),
            memory_overhead_mib: 160,
            tb_size_mib: 64,
            vmm_pids: 128,
            extra_cmdline: Vec::new(),
            console_log: false,
        }
    }
}

/// Everything `start` needs for one VM.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub id: SandboxId,
    /// Raw ext4 image: this sandbox's own copy (a reflink of a template image, `space_storage::reflink`).
    pub disk: PathBuf,
    pub hostname: String,
    /// `memory_mib` is guest RAM (0: [`DEFAULT_MEMORY_MIB`]), `millicpus` sets the vCPUs
    /// (rounded up) and the cgroup's CPU quota; `pids` is the guest's business, not the
    /// VMM's ([`VmOptions::vmm_pids`]).
    pub limits: Limits,
}

/// A started VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmHandle {
    pub id: SandboxId,
    /// Host pid of the VMM (QEMU).
    pub pid: u32,
    /// Host path of the agent's socket.
    pub agent_socket: PathBuf,
}

/// What a VM was booted with; recorded in its directory (`vm.json`) for adoption and for
/// checkpoints (which record the machine with the state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BootRecord {
    pub pid: u32,
    #[serde(flatten)]
    pub machine: qemu::Machine,
}

/// A VMM this instance holds a pidfd of.
#[derive(Debug)]
struct Tracked {
    pid: u32,
    pidfd: Arc<OwnedFd>,
    /// The agent connection made by `start` or [`VmRuntime::agent`].
    agent: Option<AgentClient>,
}

/// The vm runtime.
#[derive(Debug)]
pub struct VmRuntime {
    opts: VmOptions,
    cgroups: Arc<dyn Backend>,
    ranges: Ranges,
    accel: Accelerator,
    tsc: TscFrequency,
    qemu_version: String,
    kernel_version: String,
    /// `<run_dir>/vm/initrd`: the cached initrd with `/spaced` appended.
    initrd: PathBuf,
    tracked: Mutex<HashMap<SandboxId, Tracked>>,
}

fn unsupported(what: impl std::fmt::Display) -> VmError {
    VmError::Unsupported(what.to_string())
}

/// Names in the guest directory.
const GUEST_KERNEL: &str = "vmlinux";
const GUEST_INITRD: &str = "initrd.cpio";
const GUEST_READY: &str = "READY";
/// A VM directory's parts.
const SOCK_DIR: &str = "sock";
const JAIL_DIR: &str = "jail";
const LOG_FILE: &str = "qemu.log";
const BOOT_RECORD: &str = "vm.json";

impl VmRuntime {
    /// Checks QEMU, the jailer and the guest artifacts, builds `<run_dir>/vm/initrd` and
    /// picks the accelerator (a KVM probe of at most [`PROBE_TIMEOUT`]). Blocking.
    pub fn new(opts: VmOptions) -> Result<VmRuntime, VmError> {
        validate_cgroup_parent(&opts.cgroup_parent)?;
        opts.id_map.validate().map_err(|why| unsupported(format!("id map {:?}: {why}", opts.id_map)))?;
        for (what, path) in [("QEMU", &opts.qemu), ("jailer", &opts.jailer), ("spaced", &opts.spaced)] {
            check_executable(what, path)?;
        }
        let ready = opts.guest_dir.join(GUEST_READY);
        if !ready.exists() {
            return Err(unsupported(format!(
                "no guest artifacts: {} is missing (run scripts/install-vm.sh)",
                ready.display()
            )));
        }
        let kernel_version = std::fs::read_to_string(opts.guest_dir.join("kernel-version"))
            .map(|v| v.trim().to_owned())
            .map_err(|e| unsupported(format!("{}/kernel-version: {e}", opts.guest_dir.display())))?;
        let qemu_version = qemu_version(&opts.qemu)?;
        let tsc = tsc::host_tsc().ok_or_else(|| unsupported("cannot find the host's TSC frequency"))?;
        let base = opts.run_dir.join("vm");
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&base).map_err(VmError::io("create", &base))?;
        let initrd = base.join("initrd");
        initrd::build(&opts.guest_dir.join(GUEST_INITRD), &opts.spaced, &initrd)
            .map_err(VmError::io("build initrd", &initrd))?;
        // Ranges hands out slots 1..=n of the id map it is given: shifting the map's base
        // by `first_slot - 1` ranges makes its slot 1 the node's slot `first_slot`.
        let offset = u64::from(opts.first_slot.saturating_sub(1)) * u64::from(opts.id_map.count);
        let shifted = u32::try_from(u64::from(opts.id_map.host_base) + offset)
            .map_err(|_| unsupported(format!("slot {} of {:?} is past 32-bit ids", opts.first_slot, opts.id_map)))?;
        let ranges =
            Ranges::new(base.join("uid-ranges"), IdMap { host_base: shifted, count: opts.id_map.count }, opts.slots)
                .map_err(VmError::Range)?;
        let cgroups: Arc<dyn Backend> = cgroup::detect().map_err(|e| unsupported(e.to_string()))?.into();
        // Host-wide (every node on this host shares the guest directory), for this boot only.
        let probe_cache = opts.guest_dir.join("kvm-probe");
        let accel = accel::choose(opts.accel, &opts.qemu, &opts.guest_dir.join(GUEST_KERNEL), tsc.khz, &probe_cache);
        tracing::info!(accel = ?accel.kind, reason = %accel.reason, qemu = %qemu_version, "vm runtime ready");
        let runtime = VmRuntime {
            opts,
            cgroups,
            ranges,
            accel,
            tsc,
            qemu_version,
            kernel_version,
            initrd,
            tracked: Mutex::new(HashMap::new()),
        };
        // A start killed between taking a range and making its directory leaves the record.
        match runtime.list().and_then(|ids| runtime.ranges.sweep(&ids).map_err(VmError::Range)) {
            Ok(0) => {}
            Ok(swept) => tracing::info!(swept, "freed the id ranges of VMs that are gone"),
            Err(e) => tracing::warn!(error = %e, "cannot sweep the VM id range records"),
        }
        runtime.sweep_pod_templates();
        Ok(runtime)
    }

    pub fn options(&self) -> &VmOptions {
        &self.opts
    }

    /// The accelerator in use, and why (the KVM probe's result).
    pub fn accelerator(&self) -> &Accelerator {
        &self.accel
    }

    /// What VMs run with here, e.g. `QEMU 7.2.22, TCG (KVM probe: ...), guest kernel ...`, or
    /// why they cannot run any more (the guest artifacts went away).
    pub fn support(&self) -> Result<String, String> {
        if !self.opts.guest_dir.join(GUEST_READY).exists() || !self.initrd.exists() {
            return Err(format!("the guest artifacts in {} are gone", self.opts.guest_dir.display()));
        }
        let accel = match self.accel.kind {
            AccelKind::Kvm => "KVM",
            AccelKind::Tcg => "TCG",
        };
        Ok(format!(
            "QEMU {}, {accel} ({}), guest kernel {}, TSC {} kHz ({})",
            self.qemu_version, self.accel.reason, self.kernel_version, self.tsc.khz, self.tsc.source
        ))
    }

    /// The guest's `uname -r`.
    pub fn kernel_version(&self) -> &str {
        &self.kernel_version
    }

    /// Host path of the VM's agent socket (QEMU's end of the virtio-serial port `agent`).
    pub fn agent_socket(&self, id: &SandboxId) -> PathBuf {
        self.sock_dir(id).join("agent.sock")
    }

    /// Host path of the VM's QMP socket.
    pub fn qmp_socket(&self, id: &SandboxId) -> PathBuf {
        self.sock_dir(id).join("qmp.sock")
    }

    /// A fresh QMP connection to the VM (QEMU serves one at a time: drop it soon).
    pub async fn qmp(&self, id: &SandboxId) -> Result<qmp::Qmp, VmError> {
        let path = self.qmp_socket(id);
        if !path.exists() {
            return Err(VmError::NotFound(id.clone()));
        }
        Ok(tokio::time::timeout(QMP_TIMEOUT, qmp::Qmp::connect(&path))
            .await
            .map_err(|_| qmp::QmpError::Protocol(format!("no greeting within {QMP_TIMEOUT:?}")))??)
    }

    /// The last line QEMU wrote to its log (why it failed or exited), if any.
    pub fn last_error(&self, id: &SandboxId) -> Option<String> {
        let text = std::fs::read(self.vm_dir(id).join(LOG_FILE)).ok()?;
        let text = String::from_utf8_lossy(&text[text.len().saturating_sub(8192)..]).into_owned();
        text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_owned())
    }

    /// The host uid (and gid) the VM's QEMU runs as, if it holds a range.
    pub fn vmm_uid(&self, id: &SandboxId) -> Option<u32> {
        self.ranges.slot_of(id).map(|slot| self.ranges.map(slot).host_base)
    }

    /// Host directories of the VM's cgroup, one per hierarchy.
    pub fn cgroup_dirs(&self, id: &SandboxId) -> Vec<PathBuf> {
        self.cgroups.dirs(&self.cgroup_name(id))
    }

    /// Stops the guest's vCPUs (QMP `stop`); returns once QEMU reports it paused. The VMM
    /// keeps running: its sockets accept, nothing in the guest answers.
    pub async fn pause(&self, id: &SandboxId) -> Result<(), VmError> {
        let mut qmp = self.qmp(id).await?;
        bounded(qmp.stop()).await?;
        let status = bounded(qmp.query_status()).await?;
        if status.running {
            return Err(VmError::Qmp(qmp::QmpError::Protocol(format!("still {} after stop", status.status))));
        }
        Ok(())
    }

    /// Lets a paused guest run again (QMP `cont`).
    pub async fn resume(&self, id: &SandboxId) -> Result<(), VmError> {
        let mut qmp = self.qmp(id).await?;
        bounded(qmp.cont()).await.map_err(VmError::from)
    }

    /// Changes the CPU quota. Guest memory and vCPUs are fixed at boot: a `memory_mib` other
    /// than the boot size is refused (0 keeps it); `pids` does not apply to the VMM.
    pub fn set_limits(&self, id: &SandboxId, limits: &Limits) -> Result<(), VmError> {
        let name = self.cgroup_name(id);
        if !self.cgroups.exists(&name) {
            return Err(VmError::NotFound(id.clone()));
        }
        let boot = self.boot_record(id).ok_or_else(|| VmError::NotFound(id.clone()))?;
        let memory_mib = boot.machine.memory_mib;
        if limits.memory_mib != 0 && limits.memory_mib != memory_mib {
            return Err(VmError::MemoryFixedAtBoot { boot_mib: memory_mib, asked_mib: limits.memory_mib });
        }
        Ok(self.cgroups.set_limits(&name, &self.vmm_limits(memory_mib, limits.millicpus))?)
    }

    /// Whether the VMM recorded in `handle` still runs (same pid, in the VM's cgroup).
    pub fn is_alive(&self, handle: &VmHandle) -> bool {
        if let Some(pidfd) = self.tracked_pidfd(handle) {
            return !sys::has_exited(&*pidfd);
        }
        self.is_member(handle.id.clone(), handle.pid)
    }

    /// Takes over a VM an earlier instance started; returns whether it is alive (and now
    /// adopted).
    pub fn adopt(&self, handle: &VmHandle) -> bool {
        if self.tracked_pidfd(handle).is_some() {
            return self.is_alive(handle);
        }
        match sys::pidfd_open(handle.pid) {
            // Checked after opening: the pidfd then refers to that very process.
            Ok(pidfd) if self.is_member(handle.id.clone(), handle.pid) => {
                let entry = Tracked { pid: handle.pid, pidfd: Arc::new(pidfd), agent: None };
                self.tracked.lock().expect("tracked lock").insert(handle.id.clone(), entry);
                true
            }
            _ => false,
        }
    }

    /// The network namespace QEMU runs in, where the node's gateway opens its listeners.
    /// Opened through the VMM's pidfd: never the namespace of a process that reused its pid.
    pub fn network_namespace(&self, handle: &VmHandle) -> Result<OwnedFd, VmError> {
        let pidfd = match self.tracked_pidfd(handle) {
            Some(fd) => fd,
            None if self.adopt(handle) => {
                self.tracked_pidfd(handle).ok_or_else(|| VmError::NotFound(handle.id.clone()))?
            }
            None => return Err(VmError::NotFound(handle.id.clone())),
        };
        let path = format!("/proc/{}/ns/net", handle.pid);
        let netns = std::fs::File::open(&path);
        // Checked after opening: while the pidfd's process lives its pid cannot be reused, so
        // the namespace opened is that process's.
        if sys::has_exited(&*pidfd) {
            return Err(VmError::NotFound(handle.id.clone()));
        }
        Ok(netns.map_err(VmError::io("open", path))?.into())
    }

    /// Resolves when the VMM has exited ([`VmRuntime::last_error`] then says why).
    pub async fn wait_exit(&self, handle: &VmHandle) {
        let pidfd = match self.tracked_pidfd(handle) {
            Some(fd) => fd,
            None => match sys::pidfd_open(handle.pid) {
                Ok(fd) if self.is_member(handle.id.clone(), handle.pid) => Arc::new(fd),
                _ => return,
            },
        };
        sys::wait_pidfd(&pidfd).await;
    }

    /// Resource use of the VMM's cgroup (QEMU: guest RAM it touched, its own memory, the
    /// image's page cache; its CPU time; its threads).
    pub fn stats(&self, id: &SandboxId) -> Result<SandboxStats, VmError> {
        let name = self.cgroup_name(id);
        if !self.cgroups.exists(&name) {
            return Err(VmError::NotFound(id.clone()));
        }
        Ok(self.cgroups.stats(&name)?)
    }

    /// Resident memory of the VMM process itself (RSS), if it runs.
    pub fn vmm_rss_bytes(&self, id: &SandboxId) -> Option<u64> {
        sys::rss_bytes(self.tracked_pid(id)?)
    }

    /// The VMM's pid, while this instance tracks the VM.
    pub fn tracked_pid(&self, id: &SandboxId) -> Option<u32> {
        self.tracked.lock().expect("tracked lock").get(id).map(|t| t.pid)
    }

    /// Every VM with runtime resources on this node, alive or not.
    pub fn list(&self) -> Result<Vec<SandboxId>, VmError> {
        let mut names: Vec<String> = Vec::new();
        for dir in self.cgroups.parent_dirs(Path::new(&self.opts.cgroup_parent)) {
            names.extend(cgroup::child_names(&dir));
        }
        let base = self.base_dir();
        for entry in std::fs::read_dir(&base).map_err(VmError::io("list", &base))?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                names.extend(entry.file_name().to_str().map(str::to_owned));
            }
        }
        let mut ids: Vec<SandboxId> = names.iter().filter_map(|n| n.parse().ok()).collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    fn base_dir(&self) -> PathBuf {
        self.opts.run_dir.join("vm")
    }

    fn vm_dir(&self, id: &SandboxId) -> PathBuf {
        self.base_dir().join(id.as_str())
    }

    fn sock_dir(&self, id: &SandboxId) -> PathBuf {
        self.vm_dir(id).join(SOCK_DIR)
    }

    fn cgroup_name(&self, id: &SandboxId) -> PathBuf {
        Path::new(&self.opts.cgroup_parent).join(id.as_str())
    }

    /// The VMM cgroup's limits for a guest of `memory_mib`.
    fn vmm_limits(&self, memory_mib: u64, millicpus: u32) -> Limits {
        Limits { memory_mib: memory_mib + self.opts.memory_overhead_mib, millicpus, pids: self.opts.vmm_pids }
    }

    fn boot_record(&self, id: &SandboxId) -> Option<BootRecord> {
        let text = std::fs::read(self.vm_dir(id).join(BOOT_RECORD)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn tracked_pidfd(&self, handle: &VmHandle) -> Option<Arc<OwnedFd>> {
        let tracked = self.tracked.lock().expect("tracked lock");
        tracked.get(&handle.id).filter(|t| t.pid == handle.pid).map(|t| t.pidfd.clone())
    }

    /// Whether `pid` is a live member of the VM's cgroup.
    fn is_member(&self, id: SandboxId, pid: u32) -> bool {
        let (path, controller) = self.cgroups.membership(&self.cgroup_name(&id));
        !sys::is_zombie(pid) && sys::cgroup_of(pid, &controller).as_deref() == Some(path.as_str())
    }
}

/// Bound on one handshake attempt of [`VmRuntime::agent`]: a booted guest answers within
/// milliseconds, even under TCG.
pub const AGENT_ATTEMPT: Duration = Duration::from_secs(2);
/// Pause after a failed attempt: long enough for the guest to see the hang-up.
pub(crate) const AGENT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Bound on one QMP exchange: QEMU answers from its main loop, within milliseconds.
pub(crate) const QMP_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn bounded<T>(f: impl Future<Output = Result<T, qmp::QmpError>>) -> Result<T, qmp::QmpError> {
    tokio::time::timeout(QMP_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(qmp::QmpError::Protocol(format!("no answer within {QMP_TIMEOUT:?}"))))
}

fn validate_cgroup_parent(parent: &str) -> Result<(), VmError> {
    cgroup::validate_parent(parent).map_err(unsupported)
}

fn check_executable(what: &str, path: &Path) -> Result<(), VmError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| unsupported(format!("{what} {}: {e}", path.display())))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(unsupported(format!("{what} {} is not an executable file", path.display())));
    }
    Ok(())
}

/// "QEMU emulator version 7.2.22 (Debian ...)" → "7.2.22".
fn qemu_version(qemu: &Path) -> Result<String, VmError> {
    let output = std::process::Command::new(qemu)
        .arg("--version")
        .output()
        .map_err(|e| unsupported(format!("{} --version: {e}", qemu.display())))?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| unsupported(format!("{} --version printed {text:?}", qemu.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_parent_validation() {
        assert!(validate_cgroup_parent("space/node-1/vm").is_ok());
        for bad in ["", "/abs", "a/../b", "sp ace"] {
            assert!(validate_cgroup_parent(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn qemu_version_of_this_host() {
        let version = qemu_version(Path::new("/usr/bin/qemu-system-x86_64")).unwrap();
        assert!(version.chars().next().unwrap().is_ascii_digit(), "{version}");
    }

    #[test]
    fn missing_binaries_are_reported() {
        let err = check_executable("jailer", Path::new("/nonexistent/jailer")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/jailer"), "{err}");
    }
}
