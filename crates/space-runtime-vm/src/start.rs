//! Starting a VM: id range, cgroup, directory, the jailer, then waiting for the agent.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_proto::client::AgentClient;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use crate::jail::JailConfig;
use crate::qemu::{self, Boot, Machine, Ram};
use crate::{
    BOOT_RECORD, BootRecord, DEFAULT_MEMORY_MIB, GUEST_KERNEL, JAIL_DIR, LOG_FILE, MIN_MEMORY_MIB, SOCK_DIR, Tracked,
    VmError, VmHandle, VmRuntime, VmSpec, sys,
};

/// How often a start looks for the agent socket before QEMU has created it.
const SOCKET_POLL: Duration = Duration::from_millis(5);

impl VmRuntime {
    /// Boots the VM and returns once its agent has answered a handshake (that connection is
    /// kept for [`VmRuntime::agent`]). Fails within
    /// [`crate::VmOptions::start_timeout`] otherwise, leaving no VMM, cgroup, directory or
    /// id range behind. A start of a VM that runs already returns its handle.
    pub async fn start(&self, spec: &VmSpec) -> Result<VmHandle, VmError> {
        validate_spec(spec, Hostname::Required)?;
        if let Some(handle) = self.running(&spec.id) {
            return Ok(handle);
        }
        self.destroy(&spec.id).await?; // leftovers of an earlier attempt
        match self.start_new(spec).await {
            Ok(handle) => Ok(handle),
            Err(e) => {
                if let Err(cleanup) = self.destroy(&spec.id).await {
                    tracing::warn!(sandbox = %spec.id, error = %cleanup, "cleanup after a failed start");
                }
                Err(e)
            }
        }
    }

    /// The handle of a VM this instance started and whose VMM still runs.
    pub(crate) fn running(&self, id: &space_runtime::SandboxId) -> Option<VmHandle> {
        let pid = self.tracked.lock().expect("tracked lock").get(id).map(|t| t.pid)?;
        let handle = self.handle(id, pid);
        self.is_alive(&handle).then_some(handle)
    }

    pub(crate) fn handle(&self, id: &space_runtime::SandboxId, pid: u32) -> VmHandle {
        VmHandle { id: id.clone(), pid, agent_socket: self.agent_socket(id) }
    }

    async fn start_new(&self, spec: &VmSpec) -> Result<VmHandle, VmError> {
        self.boot(spec, None).await
    }

    /// Boots a fresh VM, its RAM QEMU's own or (`memory`) a file it shares, and waits for
    /// its agent.
    pub(crate) async fn boot(&self, spec: &VmSpec, memory: Option<&OwnedFd>) -> Result<VmHandle, VmError> {
        let deadline = Instant::now() + self.opts.start_timeout;
        let memory_mib = if spec.limits.memory_mib == 0 { DEFAULT_MEMORY_MIB } else { spec.limits.memory_mib };
        let machine = Machine {
            accel: self.accel.kind,
            tb_size_mib: self.opts.tb_size_mib,
            vcpus: qemu::vcpus(spec.limits.millicpus),
            memory_mib,
            tsc_khz: self.tsc.khz,
            hostname: spec.hostname.clone(),
            extra_cmdline: self.opts.extra_cmdline.clone(),
            console_log: self.opts.console_log,
            memory_backend: memory.is_some(),
        };
        let (pid, pidfd) = self.launch(spec, &machine, Boot::Fresh, memory).await?;
        let client = self.wait_for_agent(&spec.id, &pidfd, deadline).await?;
        if let Some(t) = self.tracked.lock().expect("tracked lock").get_mut(&spec.id) {
            t.agent = Some(client);
        }
        Ok(self.handle(&spec.id, pid))
    }

    /// Takes an id range, makes the cgroup and the VM's directory, runs QEMU in its jail and
    /// records the machine (`vm.json`). `memory` is a template's guest memory, mapped shared
    /// by a fresh boot (the template itself) and private by an incoming one (a pod); without
    /// it a machine with a memory backend gets QEMU's own memory. Returns QEMU's pid and pidfd
    /// (tracked). The caller destroys the VM on failure.
    pub(crate) async fn launch(
        &self,
        spec: &VmSpec,
        machine: &Machine,
        boot: Boot,
        memory: Option<&OwnedFd>,
    ) -> Result<(u32, Arc<OwnedFd>), VmError> {
        let slot = self.ranges.allocate(&spec.id).map_err(VmError::Range)?;
        let uid = self.ranges.map(slot).host_base;
        let (cgroups, name) = (self.cgroups.clone(), self.cgroup_name(&spec.id));
        let limits = self.vmm_limits(machine.memory_mib, spec.limits.millicpus);
        tokio::task::spawn_blocking(move || cgroups.create(&name, &limits))
            .await
            .map_err(|e| VmError::Jailer(format!("cgroup task: {e}")))??;
        let dir = self.make_vm_dir(&spec.id, uid)?;
        let ram = match memory {
            Some(_) => Ram::File { shared: boot == Boot::Fresh },
            None => Ram::Own,
        };
        let mut config = self.jail_config(spec, &dir, uid, qemu::argv(machine, boot, ram));
        // The jailer opens the node's memfd through procfs: a fresh open file of the same memory.
        config.memory = memory.map(|fd| PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd())));
        let pid = self.spawn_jailed(&spec.id, &config).await?;
        let record = BootRecord { pid, machine: machine.clone() };
        let record_path = dir.join(BOOT_RECORD);
        std::fs::write(&record_path, serde_json::to_vec(&record).expect("plain struct"))
            .map_err(VmError::io("write", record_path))?;
        let pidfd = self.tracked.lock().expect("tracked lock").get(&spec.id).map(|t| t.pidfd.clone());
        Ok((pid, pidfd.ok_or_else(|| VmError::NotFound(spec.id.clone()))?))
    }

    /// `<base>/<id>/`, root's 0700, with an empty `jail/` (the jail root's mount point, in
    /// the VMM's mount namespace only) and `sock/`, the VMM uid's 0700 (QEMU's sockets).
    fn make_vm_dir(&self, id: &space_runtime::SandboxId, uid: u32) -> Result<PathBuf, VmError> {
        let dir = self.vm_dir(id);
        let mkdir =
            |path: &Path| std::fs::DirBuilder::new().mode(0o700).create(path).map_err(VmError::io("create", path));
        mkdir(&dir)?;
        mkdir(&dir.join(JAIL_DIR))?;
        let sock = dir.join(SOCK_DIR);
        mkdir(&sock)?;
        std::os::unix::fs::chown(&sock, Some(uid), Some(uid)).map_err(VmError::io("chown", &sock))?;
        Ok(dir)
    }

    fn jail_config(&self, spec: &VmSpec, dir: &Path, uid: u32, argv: Vec<String>) -> JailConfig {
        let mut ro_paths: Vec<PathBuf> =
            ["/usr", "/lib", "/lib64", "/etc/ld.so.cache"].iter().map(PathBuf::from).filter(|p| p.exists()).collect();
        let qemu = std::fs::canonicalize(&self.opts.qemu).unwrap_or_else(|_| self.opts.qemu.clone());
        if !qemu.starts_with("/usr") {
            ro_paths.push(qemu.clone());
        }
        JailConfig {
            cgroup_procs: self
                .cgroups
                .dirs(&self.cgroup_name(&spec.id))
                .iter()
                .map(|d| d.join("cgroup.procs"))
                .collect(),
            root_mount_point: dir.join(JAIL_DIR),
            ro_paths,
            ro_files: vec![
                (self.opts.guest_dir.join(GUEST_KERNEL), qemu::JAIL_KERNEL.into()),
                (self.initrd.clone(), qemu::JAIL_INITRD.into()),
            ],
            run_dir: dir.join(SOCK_DIR),
            log: dir.join(LOG_FILE),
            disk: spec.disk.clone(),
            memory: None,
            kvm: self.accel.kind == qemu::AccelKind::Kvm,
            guest_addr: qemu::GUEST_ADDR,
            uid,
            gid: uid,
            program: qemu,
            argv,
        }
    }

    /// Runs the jailer; returns QEMU's pid once it has exec'd, tracked (a pidfd: QEMU is
    /// this process's child, the jailer clones it with CLONE_PARENT).
    async fn spawn_jailed(&self, id: &space_runtime::SandboxId, config: &JailConfig) -> Result<u32, VmError> {
        let jailer_err = |what: &str, e: std::io::Error| VmError::Jailer(format!("{what}: {e}"));
        let mut child = tokio::process::Command::new(&self.opts.jailer)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| jailer_err(&format!("run {}", self.opts.jailer.display()), e))?;
        let input = serde_json::to_vec(config).expect("plain struct");
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(&input).await.map_err(|e| jailer_err("write its configuration", e))?;
        drop(stdin);
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut pid = None;
        let mut failure = None;
        let mut ok = false;
        while let Some(line) = lines.next_line().await.map_err(|e| jailer_err("read its report", e))? {
            if let Some(n) = line.strip_prefix("pid ").and_then(|n| n.parse::<u32>().ok()) {
                // Our unreaped child: the pid cannot name another process yet.
                let pidfd = sys::pidfd_open(n).map_err(|e| jailer_err("pidfd_open of QEMU", e))?;
                let entry = Tracked { pid: n, pidfd: Arc::new(pidfd), agent: None };
                self.tracked.lock().expect("tracked lock").insert(id.clone(), entry);
                pid = Some(n);
            } else if line == "ok" {
                ok = true;
            } else {
                failure = Some(line.strip_prefix("error ").unwrap_or(&line).to_owned());
            }
        }
        let status = child.wait().await.map_err(|e| jailer_err("wait", e))?;
        match (pid, ok, failure) {
            (Some(pid), true, None) if status.success() => Ok(pid),
            (_, _, Some(failure)) => Err(VmError::Jailer(failure)),
            _ => Err(VmError::Jailer(format!("ended with {status} without reporting QEMU"))),
        }
    }

    /// Dials the agent socket until the guest's spaced answers the handshake, QEMU exits or
    /// the deadline passes. The connection is kept: see [`VmRuntime::agent`].
    async fn wait_for_agent(
        &self,
        id: &space_runtime::SandboxId,
        pidfd: &Arc<OwnedFd>,
        deadline: Instant,
    ) -> Result<AgentClient, VmError> {
        let socket = self.agent_socket(id);
        let handshake = async {
            loop {
                let Ok(stream) = tokio::net::UnixStream::connect(&socket).await else {
                    tokio::time::sleep(SOCKET_POLL).await;
                    continue;
                };
                // QEMU holds what the node writes until the guest opens its port; the guest's
                // hello is the answer.
                // No attempt bound: nothing was connected before, so no earlier connection's
                // hang-up can swallow this one's hello (see `VmRuntime::agent`).
                match AgentClient::connect(stream).await {
                    Ok(client) => return client,
                    Err(e) => {
                        tracing::debug!(sandbox = %id, error = %e, "agent handshake failed; dialing again");
                        tokio::time::sleep(SOCKET_POLL).await;
                    }
                }
            }
        };
        tokio::select! {
            client = handshake => Ok(client),
            () = sys::wait_pidfd(pidfd) => Err(VmError::VmmExited { last_line: self.last_error(id) }),
            () = tokio::time::sleep_until(deadline) => {
                Err(VmError::AgentTimeout { bound: self.opts.start_timeout, last_line: self.last_error(id) })
            }
        }
    }
}

/// Whether a spec must name the guest's host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hostname {
    Required,
    /// A restore: empty keeps the restored guest's.
    Optional,
}

pub(crate) fn validate_spec(spec: &VmSpec, hostname: Hostname) -> Result<(), VmError> {
    let h = &spec.hostname;
    let keep = h.is_empty() && hostname == Hostname::Optional;
    if !keep {
        if h.is_empty() || h.len() > 63 || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
            return Err(VmError::Spec(format!("hostname {h:?} is not a valid host name")));
        }
        if h.starts_with(['-', '.']) {
            return Err(VmError::Spec(format!("hostname {h:?} starts with {:?}", &h[..1])));
        }
    }
    if !spec.disk.is_absolute() || !spec.disk.is_file() {
        return Err(VmError::Spec(format!("disk {} is not an absolute path to a file", spec.disk.display())));
    }
    if spec.limits.memory_mib != 0 && spec.limits.memory_mib < MIN_MEMORY_MIB {
        return Err(VmError::Spec(format!(
            "{} MiB of guest memory is below the minimum of {MIN_MEMORY_MIB} MiB",
            spec.limits.memory_mib
        )));
    }
    Ok(())
}
