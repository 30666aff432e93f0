//! Restoring a VM from a checkpoint: a new jailed QEMU with the recorded machine, waiting
//! for its state (`-incoming defer`), which the node hands over as a descriptor
//! (`getfd`) and loads with `migrate-incoming fd:`. Then `cont`, the agent, and fresh
//! entropy and time for the guest before anything else is asked of it.
//!
//! Every restore is a VM of its own (id range, cgroup, jail with its network namespace and
//! tap, disk): restoring one state several times forks it.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use space_proto::client::AgentClient;
use space_proto::{RESEED_MAX_ENTROPY, RESEED_MIN_ENTROPY};
use space_runtime::{SandboxId, SnapshotKey};
use tokio::time::Instant;

use crate::checkpoint::{STATE_FD, StateRecord, failure, set_ignore_shared};
use crate::qemu::Boot;
use crate::qmp::Qmp;
use crate::start::{Hostname, validate_spec};
use crate::state_input::StateInput;
use crate::{QMP_TIMEOUT, VmError, VmHandle, VmRuntime, VmSpec, bounded, sys};

/// How often a restore looks at QEMU while it loads the state.
const POLL: Duration = Duration::from_millis(2);
/// How long a failed load may take QEMU to exit with its reason.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// Entropy given to a restored guest: the CRNG's key is 32 bytes, the input pool's hash 64.
const ENTROPY_BYTES: usize = 64;
/// A machine id's bytes (machine-id(5): 128 bits, as 32 hex digits).
const MACHINE_ID_BYTES: usize = 16;
const _: () = assert!(ENTROPY_BYTES >= RESEED_MIN_ENTROPY && ENTROPY_BYTES <= RESEED_MAX_ENTROPY);

impl VmRuntime {
    /// Starts VM `spec.id` from the checkpoint in the directory `state` (see
    /// [`VmRuntime::checkpoint`]), its files encrypted with `sealed` if given (`space-keys`'
    /// stream format: opened as QEMU reads them, never into a file), on `spec.disk`, a copy of
    /// the disk taken with it. A state that does not open whole is [`VmError::StateSealed`]. Memory
    /// and vCPUs are the recorded ones (`spec.limits.memory_mib` must be 0 or the same);
    /// `millicpus` sets the CPU quota; an empty `spec.hostname` keeps the guest's.
    ///
    /// Returns once the guest's agent has answered and has been given fresh entropy and the
    /// current time (`Request::Reseed`): until then the guest runs with the RNG state of the
    /// checkpoint, which every restore of it shares. Bounded by
    /// [`crate::VmOptions::start_timeout`]; on failure nothing of the VM is left.
    pub async fn restore(
        &self,
        spec: &VmSpec,
        state: &Path,
        sealed: Option<&SnapshotKey>,
    ) -> Result<VmHandle, VmError> {
        validate_spec(spec, Hostname::Optional)?;
        let record = StateRecord::read_maybe_sealed(state, sealed)?;
        self.check_record(&record)?;
        let memory_mib = record.machine.memory_mib;
        if spec.limits.memory_mib != 0 && spec.limits.memory_mib != memory_mib {
            return Err(VmError::MemoryFixedAtBoot { boot_mib: memory_mib, asked_mib: spec.limits.memory_mib });
        }
        if record.ram_in_template {
            return Err(VmError::StateMismatch {
                what: "memory",
                saved: "RAM in a template's memory file".into(),
                here: "none given (see start_from_template_state)".into(),
            });
        }
        self.restore_with(spec, state, &record, None, sealed).await
    }

    /// A restore of a checked state; `memory`: the template's memory file for a state that
    /// holds no RAM; `sealed`: the key the state is sealed with.
    pub(crate) async fn restore_with(
        &self,
        spec: &VmSpec,
        state: &Path,
        record: &StateRecord,
        memory: Option<&OwnedFd>,
        sealed: Option<&SnapshotKey>,
    ) -> Result<VmHandle, VmError> {
        if let Some(handle) = self.running(&spec.id) {
            return Ok(handle);
        }
        self.destroy(&spec.id).await?; // leftovers of an earlier attempt
        match self.restore_new(spec, state, record, memory, sealed).await {
            Ok(handle) => Ok(handle),
            Err(e) => {
                if let Err(cleanup) = self.destroy(&spec.id).await {
                    tracing::warn!(sandbox = %spec.id, error = %cleanup, "cleanup after a failed restore");
                }
                Err(e)
            }
        }
    }

    /// The state must come from this QEMU, this guest kernel and this accelerator.
    pub(crate) fn check_record(&self, record: &StateRecord) -> Result<(), VmError> {
        let mismatch = |what, saved: &str, here: &str| VmError::StateMismatch {
            what,
            saved: saved.to_owned(),
            here: here.to_owned(),
        };
        if record.qemu_version != self.qemu_version {
            return Err(mismatch("QEMU version", &record.qemu_version, &self.qemu_version));
        }
        if record.kernel_version != self.kernel_version {
            return Err(mismatch("guest kernel", &record.kernel_version, &self.kernel_version));
        }
        if record.machine.accel != self.accel.kind {
            let name = |k| format!("{k:?}");
            return Err(mismatch("accelerator", &name(record.machine.accel), &name(self.accel.kind)));
        }
        if !record.machine.is_complete() {
            return Err(mismatch("machine", "incomplete", "complete"));
        }
        Ok(())
    }

    async fn restore_new(
        &self,
        spec: &VmSpec,
        state: &Path,
        record: &StateRecord,
        memory: Option<&OwnedFd>,
        sealed: Option<&SnapshotKey>,
    ) -> Result<VmHandle, VmError> {
        let deadline = Instant::now() + self.opts.start_timeout;
        let input = StateInput::open(state, record, sealed)?;
        let began = std::time::Instant::now();
        let (pid, pidfd) = self.launch(spec, &record.machine, Boot::Incoming, memory).await?;
        let launched = began.elapsed();
        let mut qmp = self.wait_for_qmp(&spec.id, &pidfd, deadline).await?;
        let monitor = began.elapsed();
        let loaded = async {
            if memory.is_some() {
                set_ignore_shared(&mut qmp, true).await?;
            }
            bounded(qmp.getfd(STATE_FD, input.fd())).await?;
            bounded(qmp.migrate_incoming(&format!("fd:{STATE_FD}"))).await?;
            self.wait_incoming(&mut qmp, deadline).await
        }
        .await;
        // Not an instruction of the guest runs before its whole state has opened.
        match loaded {
            Ok(()) => input.finish(EXIT_GRACE).await?,
            Err(e) => match input.failure(EXIT_GRACE).await {
                Some(unopened) => return Err(unopened),
                None => return Err(self.load_failure(&spec.id, &pidfd, e).await),
            },
        }
        if let Err(e) = bounded(qmp.cont()).await {
            return Err(self.load_failure(&spec.id, &pidfd, e.into()).await);
        }
        drop(qmp);
        let running = began.elapsed();
        let (client, failed) = self.dial_agent(&spec.id, Some(&pidfd), deadline).await?;
        let answered = began.elapsed();
        if failed > 0 {
            tracing::debug!(sandbox = %spec.id, failed, "restored agent answered after failed handshakes");
        }
        let hostname =
            (!spec.hostname.is_empty() && spec.hostname != record.machine.hostname).then(|| spec.hostname.clone());
        reseed(&client, hostname, deadline).await?;
        tracing::debug!(sandbox = %spec.id, ?launched, ?monitor, ?running, ?answered, reseeded = ?began.elapsed(),
            "restored; each part since the start");
        self.keep_agent(&spec.id, &client);
        Ok(self.handle(&spec.id, pid))
    }

    /// Why a load failed: QEMU exits when the state does not load, and its log says why (the
    /// exit may follow the failure QMP reports); else `e`.
    async fn load_failure(&self, id: &SandboxId, pidfd: &OwnedFd, e: VmError) -> VmError {
        let exited = tokio::time::timeout(EXIT_GRACE, sys::wait_pidfd(pidfd)).await.is_ok();
        if exited { VmError::IncomingFailed { last_line: self.last_error(id) } } else { e }
    }

    /// Connects to QEMU's monitor as soon as it listens.
    async fn wait_for_qmp(&self, id: &SandboxId, pidfd: &OwnedFd, deadline: Instant) -> Result<Qmp, VmError> {
        let path = self.qmp_socket(id);
        loop {
            if sys::has_exited(pidfd) {
                return Err(VmError::VmmExited { last_line: self.last_error(id) });
            }
            if Instant::now() >= deadline {
                return Err(VmError::AgentTimeout { bound: self.opts.start_timeout, last_line: self.last_error(id) });
            }
            // Not there yet, or not accepting yet: QEMU makes it early in its start-up.
            if let Ok(Ok(qmp)) = tokio::time::timeout(QMP_TIMEOUT, Qmp::connect(&path)).await {
                return Ok(qmp);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until QEMU has loaded the whole state and left `inmigrate` (it activates the
    /// disk and sets the saved run state in a step after the load itself).
    async fn wait_incoming(&self, qmp: &mut Qmp, deadline: Instant) -> Result<(), VmError> {
        loop {
            let info = bounded(qmp.query_migrate()).await?;
            match info.get("status").and_then(Value::as_str) {
                Some("completed") => {
                    let status = bounded(qmp.query_status()).await?;
                    if status.status != "inmigrate" {
                        return Ok(());
                    }
                }
                Some(status @ ("failed" | "cancelled")) => return Err(VmError::Migration(failure(status, &info))),
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(VmError::MigrationTimeout { bound: self.opts.start_timeout });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Gives the guest fresh entropy from the host, the host's clock and, if given, a new host
/// name, with a new machine id (a new name is a new sandbox); bounded by `deadline`.
async fn reseed(client: &AgentClient, hostname: Option<String>, deadline: Instant) -> Result<(), VmError> {
    let mut entropy = vec![0u8; ENTROPY_BYTES + MACHINE_ID_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut entropy))
        .map_err(VmError::io("read", "/dev/urandom"))?;
    let id_bytes = entropy.split_off(ENTROPY_BYTES);
    let machine_id = hostname.as_ref().map(|_| id_bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let unix_time_ns = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
    match tokio::time::timeout_at(deadline, client.reseed(entropy, unix_time_ns, hostname, machine_id)).await {
        Ok(result) => result.map_err(VmError::Reseed),
        Err(_) => Err(VmError::Agent("no answer to the reseed before the restore's deadline".into())),
    }
}
