//! The linux runtime: sandboxes are process trees in their own user, pid, mount, net, ipc, uts
//! and cgroup namespaces, confined by capabilities, no_new_privs and seccomp, limited by
//! cgroups, with `spaced` as pid 1. The in-sandbox half is `space-sandbox-init`; see
//! docs/sandbox-isolation.md for the isolation decisions.
//!
//! Per sandbox the runtime owns three host resources, named after the sandbox id: the cgroup
//! `<cgroup parent>/<id>` (in every hierarchy used), the directory `<run dir>/<id>.d` holding
//! the agent's socket `agent.sock` (the sandbox binds it through a mount of that directory,
//! see `space-sandbox-init`'s listener), and its host id range, recorded in
//! `<run dir>/uid-ranges` (`ranges.rs`). `list` finds sandboxes by the first two and `destroy`
//! removes all three, so both work after a node restart.
//!
//! Checkpoints (full snapshots) use CRIU (`checkpoint.rs`); without a usable CRIU everything
//! else works and [`Runtime::checkpoint_support`] says why checkpoints do not.

mod boot;
mod checkpoint;
mod sealed;
mod sealed_images;
mod spawn;
mod teardown;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use space_runtime::{
    AgentTransport, CheckpointArtifacts, CheckpointStats, Limits, PortAddress, RootDisk, RootDiskKind, Runtime,
    RuntimeError, RuntimeKind, SandboxHandle, SandboxId, SandboxSpec, SandboxStats,
};
use space_sandbox_init::sync::{HostFile, InitConfig, ToInit};

use space_host::{affinity, cgroup, idmapped, process, ranges};

use crate::boot::{Boot, Pid1};
use crate::cgroup::Backend;

pub use space_host::ranges::DEFAULT_RANGES;
pub use space_runtime::IdMap;

/// `<run dir>/<id>.d`: the sandbox's agent directory.
const AGENT_DIR_SUFFIX: &str = ".d";
/// The socket's name in it (and, inside the sandbox, in `space_sandbox_init::AGENT_DIR`).
const AGENT_SOCKET: &str = "agent.sock";

/// Configuration of a [`LinuxRuntime`].
#[derive(Debug, Clone)]
pub struct LinuxOptions {
    /// The host's static `spaced` binary, started as `spaced init`.
    pub spaced: PathBuf,
    /// Where sandbox sockets live (`<run_dir>/<id>.d/agent.sock`); created 0700 if missing.
    pub run_dir: PathBuf,
    /// Relative cgroup path all sandbox cgroups go under, e.g. `space/<node>`.
    pub cgroup_parent: String,
    /// The storage's id range: who owns the files of sandbox roots on disk. No sandbox runs
    /// in it; each gets a range of its own ([`LinuxOptions::ranges`] of them follow it) and
    /// sees its root through an idmapped mount.
    pub id_map: IdMap,
    /// How many sandboxes can hold a host id range at once (see `ranges.rs`).
    pub ranges: u32,
    /// Bound on `start` until `spaced` is ready.
    pub start_timeout: Duration,
    /// Bound on `destroy` waiting for the sandbox's processes to die.
    pub stop_timeout: Duration,
    /// OOM score adjustment for each sandbox's pid 1, so the OOM killer picks sandbox
    /// processes before `spaced`. Lowering needs CAP_SYS_RESOURCE; without it a warning is logged.
    pub pid1_oom_score_adj: i32,
    /// The CRIU binary for checkpoints; `None` looks in the usual places
    /// ([`space_criu::Criu::locate`]).
    pub criu: Option<PathBuf>,
    /// The most bytes a full snapshot's copies of deleted-but-open files may take together.
    pub ghost_total_limit: u64,
    /// The lxcfs whose files are bound over every sandbox's `/proc` and `/sys` files of the
    /// same names (see [`space_host::lxcfs`]); `None`: the kernel's, which show the host's
    /// figures.
    pub lxcfs: Option<space_host::lxcfs::Lxcfs>,
}

impl LinuxOptions {
    pub fn new(spaced: impl Into<PathBuf>, run_dir: impl Into<PathBuf>, cgroup_parent: impl Into<String>) -> Self {
        LinuxOptions {
            spaced: spaced.into(),
            run_dir: run_dir.into(),
            cgroup_parent: cgroup_parent.into(),
            id_map: IdMap::default(),
            ranges: DEFAULT_RANGES,
            start_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(10),
            pid1_oom_score_adj: -1000,
            criu: None,
            ghost_total_limit: space_criu::GHOST_TOTAL_LIMIT,
            lxcfs: None,
        }
    }
}

/// A started sandbox this runtime instance knows the pidfd of.
#[derive(Debug)]
struct Tracked {
    pid: u32,
    pidfd: Arc<OwnedFd>,
}

/// The linux [`Runtime`].
#[derive(Debug)]
pub struct LinuxRuntime {
    opts: LinuxOptions,
    cgroups: Arc<dyn Backend>,
    tracked: Mutex<HashMap<SandboxId, Tracked>>,
    oom_warned: std::sync::atomic::AtomicBool,
    /// CRIU, or why there is none.
    criu: Result<space_criu::Criu, String>,
    /// Striped by sandbox id: serialises the create, attach and remove steps on one sandbox's
    /// cgroups (see [`LinuxRuntime::cgroup_step`]).
    cgroup_step_locks: Vec<Arc<tokio::sync::Mutex<()>>>,
    /// What `start` executes: a sealed copy of `opts.spaced` that no sandbox can reach.
    spaced: sealed::SealedBinary,
    /// Each sandbox's host id range.
    ranges: ranges::Ranges,
    /// The CPUs this node may use, which sandboxes' masks are drawn from.
    cpus: Vec<usize>,
    /// The CPU mask each sandbox was given (see space-host's `affinity`).
    masks: Mutex<HashMap<SandboxId, Vec<usize>>>,
    mask_warned: std::sync::atomic::AtomicBool,
}

/// Where running CRIU dumps are recorded, in the run dir.
const CRIU_RECORDS: &str = "criu";

/// Where the sandboxes' id ranges are recorded, in the run dir.
const RANGE_RECORDS: &str = "uid-ranges";

/// How long a start waits for the previous server's CRIU dumps at most: longer than any dump
/// of a sandbox within its memory limit takes.
const SURVIVOR_WAIT: Duration = Duration::from_secs(120);

/// Enough stripes that concurrent starts of different sandboxes rarely share one.
const CGROUP_STEP_STRIPES: usize = 64;

fn unsupported(what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Unsupported(what.to_string())
}

impl LinuxRuntime {
    /// Checks the host (spaced binary, cgroup controllers), creates the run dir and makes this
    /// process a child subreaper: sandbox pid 1s are re-parented to it.
    pub fn new(opts: LinuxOptions) -> Result<Self, RuntimeError> {
        validate_cgroup_parent(&opts.cgroup_parent)?;
        validate_id_map(opts.id_map)?;
        check_spaced(&opts.spaced)?;
        let spaced = sealed::SealedBinary::load(&opts.spaced)
            .map_err(|e| unsupported(format!("sealed copy of {}: {e}", opts.spaced.display())))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&opts.run_dir)
            .map_err(|source| RuntimeError::Io { path: opts.run_dir.clone(), source })?;
        let ranges = ranges::Ranges::new(opts.run_dir.join(RANGE_RECORDS), opts.id_map, opts.ranges)?;
        let cgroups: Arc<dyn Backend> = cgroup::detect().map_err(unsupported)?.into();
        process::become_subreaper().map_err(|e| unsupported(format!("PR_SET_CHILD_SUBREAPER: {e}")))?;
        tracing::debug!(version = cgroups.version(), parent = %opts.cgroup_parent, "linux runtime ready");
        // A dump the previous server left running must end before any sandbox is touched: it
        // would freeze again a sandbox thawed meanwhile (see space-criu's survivors.rs).
        let records = opts.run_dir.join(CRIU_RECORDS);
        let waited = space_criu::wait_for_survivors(&records, SURVIVOR_WAIT);
        if waited > 0 {
            tracing::info!(waited, "waited for the previous server's CRIU dumps");
        }
        let criu =
            space_criu::Criu::locate(opts.criu.as_deref()).map(|c| c.with_records(records)).map_err(|e| e.to_string());
        let cpus = affinity::allowed().map_err(|e| unsupported(format!("sched_getaffinity: {e}")))?;
        let runtime = LinuxRuntime {
            spaced,
            cpus,
            masks: Mutex::new(HashMap::new()),
            mask_warned: Default::default(),
            opts,
            cgroups,
            tracked: Mutex::new(HashMap::new()),
            oom_warned: Default::default(),
            criu,
            cgroup_step_locks: (0..CGROUP_STEP_STRIPES).map(|_| Default::default()).collect(),
            ranges,
        };
        // A start killed between taking a range and making the cgroup leaves only the record.
        // Never fatal: a record left behind only keeps one range out of use.
        match runtime.list().and_then(|ids| runtime.ranges.sweep(&ids)) {
            Ok(0) => {}
            Ok(swept) => tracing::info!(swept, "freed the id ranges of sandboxes that are gone"),
            Err(e) => tracing::warn!(error = %e, "cannot sweep the id range records"),
        }
        // A restore killed with the node leaves its work directory and a bind mount of an agent
        // directory in the host's mount namespace.
        let swept = space_criu::sweep_leftover_work(&runtime.restore_work_prefix());
        if swept > 0 {
            tracing::info!(swept, "removed what interrupted restores left");
        }
        Ok(runtime)
    }

    pub fn options(&self) -> &LinuxOptions {
        &self.opts
    }

    /// The cgroup version in use (1 or 2).
    pub fn cgroup_version(&self) -> u8 {
        self.cgroups.version()
    }

    /// Host directories of the sandbox's cgroup, one per hierarchy (for diagnostics and tests).
    pub fn cgroup_dirs(&self, id: &SandboxId) -> Vec<PathBuf> {
        self.cgroups.dirs(&self.cgroup_name(id))
    }

    /// Host path of the sandbox's socket.
    pub fn socket_path(&self, id: &SandboxId) -> PathBuf {
        self.agent_dir(id).join(AGENT_SOCKET)
    }

    /// The host directory holding only the sandbox's socket (mounted into the sandbox).
    fn agent_dir(&self, id: &SandboxId) -> PathBuf {
        self.opts.run_dir.join(format!("{id}{AGENT_DIR_SUFFIX}"))
    }

    /// Removes the (empty) cgroup parent directories, e.g. when a node scope is retired.
    /// Fails if sandboxes still have cgroups there.
    pub fn remove_cgroup_parent(&self) -> Result<(), RuntimeError> {
        for dir in self.cgroups.parent_dirs(Path::new(&self.opts.cgroup_parent)) {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(RuntimeError::Io { path: dir, source: e });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Prefix of this runtime's restore work directories: the cgroup parent names the node.
    fn restore_work_prefix(&self) -> String {
        format!("{}{}-", space_criu::WORK_PREFIX, self.opts.cgroup_parent.replace('/', "_"))
    }

    fn cgroup_name(&self, id: &SandboxId) -> PathBuf {
        Path::new(&self.opts.cgroup_parent).join(id.as_str())
    }

    fn tracked_pidfd(&self, handle: &SandboxHandle) -> Option<Arc<OwnedFd>> {
        let tracked = self.tracked.lock().expect("tracked lock");
        tracked.get(&handle.id).filter(|t| t.pid == handle.pid).map(|t| t.pidfd.clone())
    }

    fn track(&self, id: &SandboxId, pid1: Pid1) {
        self.protect_from_oom(pid1.pid);
        let entry = Tracked { pid: pid1.pid, pidfd: Arc::new(pid1.pidfd) };
        self.tracked.lock().expect("tracked lock").insert(id.clone(), entry);
    }

    fn handle(&self, id: &SandboxId, pid: u32) -> SandboxHandle {
        SandboxHandle { id: id.clone(), runtime: RuntimeKind::Linux, pid }
    }

    /// Thaws a paused sandbox (the freezer is synchronous to leave).
    pub(crate) fn thaw(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let name = self.cgroup_name(id);
        if !self.cgroups.exists(&name) {
            return Err(RuntimeError::NotFound(id.clone()));
        }
        self.cgroups.set_frozen(&name, false).map_err(|e| RuntimeError::Cgroup(e.to_string()))
    }

    /// The CPUs sandbox `id` may run on under `limits`: those it holds when they are as many,
    /// else the least held (see space-host's `affinity`), recorded as its.
    fn cpus_of(&self, id: &SandboxId, limits: &Limits) -> Vec<usize> {
        let mut masks = self.masks.lock().expect("masks lock");
        let want = affinity::count(self.cpus.len(), limits.millicpus);
        if let Some(held) = masks.get(id).filter(|held| held.len() == want) {
            return held.clone();
        }
        let others = masks.iter().filter(|(other, _)| *other != id).map(|(_, mask)| mask.as_slice());
        let cpus = affinity::pick(&self.cpus, limits.millicpus, others, id.as_str());
        masks.insert(id.clone(), cpus.clone());
        cpus
    }

    /// Gives every thread of the sandbox the CPU mask its limits call for, unless its pid 1
    /// has it already (what it started with, or was given last; tasks inherit it). A mask that
    /// cannot be set (the node's cgroup parent allows other CPUs than the node runs on) leaves
    /// the sandbox on the CPUs it has, said once: the mask is what the sandbox sees of its
    /// CPUs, and the quota stays its bound.
    fn set_cpus(&self, id: &SandboxId, limits: &Limits) {
        let cpus = self.cpus_of(id, limits);
        let pid1 = self.tracked.lock().expect("tracked lock").get(id).map(|t| t.pid);
        if pid1.is_some_and(|pid| affinity::of(pid).is_ok_and(|has| has == cpus)) {
            return;
        }
        let members = cgroup::members(&*self.cgroups, &self.cgroup_name(id));
        self.mask_failed(affinity::set_all(&members, &cpus));
    }

    fn mask_failed(&self, set: nix::Result<()>) {
        if let Err(e) = set
            && !self.mask_warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(error = %e, "cannot set sandboxes' CPU masks: they see every CPU (said once)");
        }
    }

    /// The handle of a sandbox this instance started and whose pid 1 still runs.
    fn running(&self, id: &SandboxId) -> Option<SandboxHandle> {
        let pid = self.tracked.lock().expect("tracked lock").get(id).map(|t| t.pid)?;
        let handle = self.handle(id, pid);
        self.is_alive(&handle).then_some(handle)
    }

    /// Runs a structural step on the cgroups of sandbox `id` on a blocking thread. The step
    /// holds the sandbox's lock until it has finished, even when its caller is cancelled: a
    /// dropped `start` cannot leave a `create` running behind the `destroy` that follows it.
    async fn cgroup_step<T: Send + 'static>(
        &self,
        id: &SandboxId,
        f: impl FnOnce(&dyn Backend) -> Result<T, RuntimeError> + Send + 'static,
    ) -> Result<T, RuntimeError> {
        let held = self.cgroup_step_lock(id).lock_owned().await;
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || {
            let _held = held;
            f(&*cgroups)
        })
        .await
        .map_err(|e| RuntimeError::Cgroup(format!("cgroup task: {e}")))?
    }

    fn cgroup_step_lock(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut hasher);
        self.cgroup_step_locks[hasher.finish() as usize % self.cgroup_step_locks.len()].clone()
    }

    /// The host id range of sandbox `id` (taken now if it has none), and a detached mount of
    /// `rootfs` that shows the storage's ids as that range's.
    pub(crate) fn range_and_root(&self, id: &SandboxId, rootfs: &Path) -> Result<(IdMap, OwnedFd), RuntimeError> {
        let slot = self.ranges.allocate(id)?;
        let root = idmapped::idmapped_clone(rootfs, &*self.ranges.mapping(slot)?)
            .map_err(|e| RuntimeError::Start(format!("idmapped mount of {}: {e}", rootfs.display())))?;
        Ok((self.ranges.map(slot), root))
    }

    /// The host id range sandbox `id` runs in, if it holds one.
    pub fn id_range(&self, id: &SandboxId) -> Option<IdMap> {
        self.ranges.slot_of(id).map(|slot| self.ranges.map(slot))
    }

    /// lxcfs's files, each bound over its own path in the sandbox.
    fn host_files(&self) -> Vec<HostFile> {
        let Some(lxcfs) = &self.opts.lxcfs else { return Vec::new() };
        lxcfs.files.iter().map(|at| HostFile { host: lxcfs.dir.join(at), at: at.clone() }).collect()
    }

    async fn boot(&self, boot: &mut Boot, spec: &SandboxSpec, map: IdMap) -> Result<(), RuntimeError> {
        let config = InitConfig {
            exe: Some(self.opts.spaced.clone()),
            root_mount: true,
            host_files: self.host_files(),
            ..InitConfig::new(rootfs_of(spec)?, &spec.hostname)
        };
        boot.send(&ToInit::Config(config)).await?;
        let (name, pid) = (self.cgroup_name(&spec.id), boot.bootstrap_pid());
        // Joining happens while the bootstrap unshares its user namespace.
        self.cgroup_step(&spec.id, move |cg| cg.attach(&name, pid).map_err(|e| RuntimeError::Cgroup(e.to_string())))
            .await?;
        // Single-threaded still (it unshares a user namespace): all it forks inherits this.
        let cpus = self.cpus_of(&spec.id, &spec.limits);
        self.mask_failed(affinity::set(pid, &cpus));
        boot.expect_user_ns().await?;
        process::write_id_maps(pid, map.host_base, map.count)
            .map_err(|e| RuntimeError::Start(format!("write id maps of {pid}: {e}")))?;
        boot.send(&ToInit::Mapped).await?;
        boot.wait_ready().await
    }

    async fn start_new(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        let (name, limits) = (self.cgroup_name(&spec.id), spec.limits);
        self.cgroup_step(&spec.id, move |cg| {
            cg.create(&name, &limits).map_err(|e| RuntimeError::Cgroup(e.to_string()))
        })
        .await?;
        self.agent_dir_fresh(&spec.id)?;
        let (map, root) = match self.range_and_root(&spec.id, rootfs_of(spec)?) {
            Ok(taken) => taken,
            Err(e) => {
                self.cleanup_failed_start(&spec.id).await;
                return Err(e);
            }
        };
        let mut boot = Boot::spawn(&self.spaced.exec_path(), &self.socket_path(&spec.id), root.as_fd())?;
        drop(root); // the child holds it
        let result = match tokio::time::timeout(self.opts.start_timeout, self.boot(&mut boot, spec, map)).await {
            Ok(result) => result,
            Err(_) => Err(RuntimeError::Start(format!("spaced not ready after {:?}", self.opts.start_timeout))),
        };
        let pid1 = boot.pid1.take();
        if let Err(e) = result {
            boot.abort().await;
            if let Some(pid1) = pid1 {
                self.track(&spec.id, pid1); // so destroy reaps it
            }
            self.cleanup_failed_start(&spec.id).await;
            return Err(e);
        }
        let pid1 = pid1.ok_or_else(|| RuntimeError::Start("spaced init never reported pid 1".into()))?;
        for warning in &boot.warnings {
            tracing::warn!(sandbox = %spec.id, "{warning}");
        }
        let handle = self.handle(&spec.id, pid1.pid);
        self.track(&spec.id, pid1);
        Ok(handle)
    }

    async fn cleanup_failed_start(&self, id: &SandboxId) {
        if let Err(cleanup) = self.destroy(id).await {
            tracing::warn!(sandbox = %id, error = %cleanup, "cleanup after failed start");
        }
    }

    fn protect_from_oom(&self, pid: u32) {
        if let Err(e) = process::set_oom_score_adj(pid, self.opts.pid1_oom_score_adj) {
            // The same for every sandbox (the host lacks CAP_SYS_RESOURCE): say it once.
            if !self.oom_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e, "cannot protect spaced from the OOM killer (said once)");
            }
        }
    }

    /// Creates the sandbox's agent directory, empty and host root's (mode 0700: no sandbox
    /// process can enter it).
    fn agent_dir_fresh(&self, id: &SandboxId) -> Result<PathBuf, RuntimeError> {
        let dir = self.agent_dir(id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| RuntimeError::Io { path: dir.clone(), source })?;
        Ok(dir)
    }

    /// Reaps the sandbox's pid 1 if this instance started it (it is our child once the
    /// bootstrap exits), waiting a bounded time for it to exit.
    async fn reap_tracked(&self, id: &SandboxId) {
        let tracked = self.tracked.lock().expect("tracked lock").remove(id);
        if let Some(t) = tracked {
            // Normally dead already (killed through the cgroup); this covers a pid 1 whose
            // cgroups vanished. The pidfd cannot hit anything else.
            let _ = process::pidfd_signal(&*t.pidfd, libc::SIGKILL);
            let _ = tokio::time::timeout(self.opts.stop_timeout, process::wait_pidfd(&t.pidfd)).await;
            process::reap(&*t.pidfd);
        }
    }
}

fn validate_cgroup_parent(parent: &str) -> Result<(), RuntimeError> {
    cgroup::validate_parent(parent).map_err(unsupported)
}

/// Sandbox root must never be host root, and the range must fit in a uid.
fn validate_id_map(map: IdMap) -> Result<(), RuntimeError> {
    map.validate().map_err(|reason| unsupported(format!("id map {map:?}: {reason}")))
}

fn check_spaced(path: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| unsupported(format!("spaced binary {}: {e}", path.display())))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(unsupported(format!("spaced binary {} is not an executable file", path.display())));
    }
    Ok(())
}

fn validate_spec(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    let h = &spec.hostname;
    if h.is_empty() || h.len() > 63 || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
        return Err(RuntimeError::Start(format!("hostname {h:?} is not a valid host name")));
    }
    let rootfs = rootfs_of(spec)?;
    if !rootfs.is_absolute() || !rootfs.is_dir() {
        return Err(RuntimeError::Start(format!("rootfs {} is not an absolute path to a directory", rootfs.display())));
    }
    Ok(())
}

/// The root directory of a spec, or `WrongKind` for an image.
pub(crate) fn rootfs_of(spec: &SandboxSpec) -> Result<&Path, RuntimeError> {
    match &spec.root {
        RootDisk::Directory(dir) => Ok(dir),
        RootDisk::Image(_) => Err(RuntimeError::WrongKind { runtime: RuntimeKind::Linux, what: "a disk image" }),
    }
}

#[async_trait]
impl Runtime for LinuxRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Linux
    }

    fn describe(&self) -> String {
        format!("namespaces, seccomp and cgroup v{} on the host kernel", self.cgroup_version())
    }

    fn root_disk(&self) -> RootDiskKind {
        RootDiskKind::Directory
    }

    fn agent_transport(&self, id: &SandboxId) -> AgentTransport {
        AgentTransport::Unix(self.socket_path(id))
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        validate_spec(spec)?;
        if let Some(handle) = self.running(&spec.id) {
            return Ok(handle); // a replayed start
        }
        self.destroy(&spec.id).await?; // leftovers of an earlier attempt
        self.start_new(spec).await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let name = self.cgroup_name(id);
        if self.cgroups.exists(&name) {
            teardown::kill_all(&*self.cgroups, &name, self.opts.stop_timeout).await?;
        }
        self.reap_tracked(id).await;
        self.cgroup_step(id, move |cg| teardown::remove(cg, &name)).await?;
        let dir = self.agent_dir(id);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::Io { path: dir, source: e });
            }
            _ => {}
        }
        self.masks.lock().expect("masks lock").remove(id);
        // Last: the range is free only once no process of the sandbox runs in it.
        self.ranges.release(id)
    }

    fn set_limits(&self, id: &SandboxId, limits: &Limits) -> Result<(), RuntimeError> {
        let name = self.cgroup_name(id);
        if !self.cgroups.exists(&name) {
            return Err(RuntimeError::NotFound(id.clone()));
        }
        self.cgroups.set_limits(&name, limits).map_err(|e| RuntimeError::Cgroup(e.to_string()))?;
        self.set_cpus(id, limits);
        Ok(())
    }

    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let name = self.cgroup_name(id);
        if !self.cgroups.exists(&name) {
            return Err(RuntimeError::NotFound(id.clone()));
        }
        teardown::freeze(&*self.cgroups, &name, self.opts.stop_timeout).await
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.thaw(id)
    }

    fn is_alive(&self, handle: &SandboxHandle) -> bool {
        match process::proc_info(handle.pid) {
            Some(info) if !info.zombie && info.innermost_pid == Some(1) => {}
            _ => return false,
        }
        let (path, selector) = self.cgroups.membership(&self.cgroup_name(&handle.id));
        process::cgroup_of(handle.pid, &selector).as_deref() == Some(path.as_str())
    }

    fn adopt(&self, handle: &SandboxHandle) -> bool {
        if self.tracked_pidfd(handle).is_some() {
            return self.is_alive(handle);
        }
        match process::pidfd_open(handle.pid) {
            // Checked after opening: the pidfd then refers to that very process.
            Ok(pidfd) if self.is_alive(handle) => {
                let entry = Tracked { pid: handle.pid, pidfd: Arc::new(pidfd) };
                self.tracked.lock().expect("tracked lock").insert(handle.id.clone(), entry);
                true
            }
            _ => false,
        }
    }

    fn tracked_handle(&self, id: &SandboxId) -> Option<SandboxHandle> {
        let pid = self.tracked.lock().expect("tracked lock").get(id).map(|t| t.pid)?;
        Some(SandboxHandle { id: id.clone(), runtime: RuntimeKind::Linux, pid })
    }

    fn port_address(&self) -> PortAddress {
        PortAddress::SharedLoopback
    }

    fn network_namespace(&self, handle: &SandboxHandle) -> Result<OwnedFd, RuntimeError> {
        let pidfd = match self.tracked_pidfd(handle) {
            Some(fd) => fd,
            None if self.adopt(handle) => {
                self.tracked_pidfd(handle).ok_or_else(|| RuntimeError::NotFound(handle.id.clone()))?
            }
            None => return Err(RuntimeError::NotFound(handle.id.clone())),
        };
        let path = format!("/proc/{}/ns/net", handle.pid);
        let netns = std::fs::File::open(&path).map_err(|source| RuntimeError::Io { path: path.into(), source })?;
        // Checked after opening: while the pidfd's process lives its pid cannot be reused, so
        // the namespace opened is that process's.
        if process::has_exited(&*pidfd) {
            return Err(RuntimeError::NotFound(handle.id.clone()));
        }
        Ok(netns.into())
    }

    async fn wait_exit(&self, handle: &SandboxHandle) {
        let pidfd = match self.tracked_pidfd(handle) {
            Some(fd) => fd,
            None => match process::pidfd_open(handle.pid) {
                // Checked after opening: the pidfd then refers to that very process.
                Ok(fd) if self.is_alive(handle) => Arc::new(fd),
                _ => return,
            },
        };
        process::wait_pidfd(&pidfd).await;
    }

    fn stats(&self, id: &SandboxId) -> Result<SandboxStats, RuntimeError> {
        let name = self.cgroup_name(id);
        if !self.cgroups.exists(&name) {
            return Err(RuntimeError::NotFound(id.clone()));
        }
        self.cgroups.stats(&name).map_err(|e| RuntimeError::Cgroup(e.to_string()))
    }

    fn oom_kills(&self, id: &SandboxId) -> Result<u64, RuntimeError> {
        self.cgroups.oom_kills(&self.cgroup_name(id)).map_err(|e| RuntimeError::Cgroup(e.to_string()))
    }

    fn list(&self) -> Result<Vec<SandboxId>, RuntimeError> {
        let mut names: Vec<String> = Vec::new();
        for dir in self.cgroups.parent_dirs(Path::new(&self.opts.cgroup_parent)) {
            names.extend(cgroup::child_names(&dir));
        }
        let entries = std::fs::read_dir(&self.opts.run_dir)
            .map_err(|source| RuntimeError::Io { path: self.opts.run_dir.clone(), source })?;
        for entry in entries.flatten() {
            if let Some(stem) = entry.file_name().to_str().and_then(|n| n.strip_suffix(AGENT_DIR_SUFFIX)) {
                names.push(stem.to_owned());
            }
        }
        let mut ids: Vec<SandboxId> = names.iter().filter_map(|n| n.parse().ok()).collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    fn checkpoint_support(&self) -> Result<String, String> {
        self.criu.as_ref().map(|c| format!("CRIU {}", c.version())).map_err(Clone::clone)
    }

    async fn wait_agent_released(&self, id: &SandboxId, timeout: Duration) -> Result<(), RuntimeError> {
        checkpoint::wait_agent_released(self, id, timeout).await
    }

    async fn checkpoint(
        &self,
        id: &SandboxId,
        artifacts: &CheckpointArtifacts,
    ) -> Result<CheckpointStats, RuntimeError> {
        checkpoint::checkpoint(self, id, artifacts).await
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        artifacts: &CheckpointArtifacts,
    ) -> Result<SandboxHandle, RuntimeError> {
        checkpoint::restore(self, spec, artifacts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_parent_validation() {
        assert!(validate_cgroup_parent("space/node-1").is_ok());
        for bad in ["", "/abs", "a/../b", "./b", "sp ace", "a\\b"] {
            assert!(validate_cgroup_parent(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn id_map_validation() {
        assert!(validate_id_map(IdMap::default()).is_ok());
        for (host_base, count) in [(0, 65536), (100_000, 0), (u32::MAX - 10, 65536)] {
            assert!(validate_id_map(IdMap { host_base, count }).is_err());
        }
    }

    #[test]
    fn missing_spaced_is_reported() {
        let err = check_spaced(Path::new("/nonexistent/spaced")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/spaced"), "{err}");
    }
}
