//! Full snapshots of a VM: QEMU's migration stream, written to a file the node opens.
//!
//! QEMU runs under `-sandbox spawn=deny`, so `exec:` migrations (a shell writing the file)
//! cannot work, and the jail has no path to write to anyway: the node opens
//! `<state>/vm.state`, hands the descriptor over QMP (`getfd`, SCM_RIGHTS) and migrates to
//! `fd:`. Next to the state goes `<state>/vm.json` ([`StateRecord`]): what a restore must run
//! to load it (the same QEMU, guest kernel and machine).
//!
//! After the migration QEMU keeps the VM paused (`postmigrate`) with its block devices
//! inactivated (flushed and released): the node snapshots the disk image then, and the
//! next `cont` (the node's resume) activates them again. QEMU refuses to migrate a VM in
//! `postmigrate` again, so a VM is checkpointed once per pause.

use std::fs::OpenOptions;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use space_runtime::{CheckpointStats, SandboxId, SnapshotKey};
use tokio::time::Instant;

use crate::qemu::Machine;
use crate::qmp::Qmp;
use crate::{VmError, VmRuntime, bounded};

/// The state file and its record in a checkpoint directory.
pub const STATE_FILE: &str = "vm.state";
pub const STATE_RECORD: &str = "vm.json";
/// Version of the directory's layout and of [`StateRecord`].
const STATE_FORMAT: u32 = 1;
/// What a state holds beside the guest's RAM (devices, the migration stream's framing), as
/// reserved ahead in memory: QEMU writes past it if it needs to.
const STATE_MARGIN: u64 = 64 << 20;
/// The name the state's descriptor gets in QEMU's monitor.
pub(crate) const STATE_FD: &str = "state";
/// How often a migration's progress is asked for.
const MIGRATE_POLL: Duration = Duration::from_millis(2);
/// `max-bandwidth` of a checkpoint, in bytes per second. QEMU's default (128 MiB/s) is meant
/// for a network shared with running guests; this stream goes to a local file of a paused
/// VM, so only the disk should bound it.
const MIGRATE_BANDWIDTH: u64 = 1 << 40;

/// What a restore of a checkpoint must match, recorded next to its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StateRecord {
    pub format: u32,
    /// QEMU's version: microvm has no versioned machine types, so a state loads only into
    /// the QEMU that saved it.
    pub qemu_version: String,
    /// The guest kernel's (`kernel-version`): QEMU loads the kernel into guest RAM and keeps
    /// the image in fw_cfg; a restore boots with the node's current one.
    pub kernel_version: String,
    pub machine: Machine,
    /// Length of `vm.state`: a shorter file was cut (a crash while it was written, a bad copy).
    pub state_bytes: u64,
    /// The state holds no RAM: it is a template's, whose RAM is its memory file.
    #[serde(default)]
    pub ram_in_template: bool,
}

impl StateRecord {
    pub(crate) fn read(dir: &Path) -> Result<StateRecord, VmError> {
        let path = dir.join(STATE_RECORD);
        let text = std::fs::read(&path).map_err(VmError::io("read", &path))?;
        StateRecord::parse(&path, &text)
    }

    /// The record of the checkpoint in `dir`, sealed with `key` if given.
    pub(crate) fn read_maybe_sealed(dir: &Path, sealed: Option<&SnapshotKey>) -> Result<StateRecord, VmError> {
        let Some(key) = sealed else { return StateRecord::read(dir) };
        let path = dir.join(STATE_RECORD);
        let mut text = Vec::new();
        space_keys::stream::decrypt_to(key.bytes(), &path, &mut text, Path::new("memory"))
            .map_err(|source| VmError::StateSealed { path: path.clone(), source })?;
        StateRecord::parse(&path, &text)
    }

    /// The record in `text`, read from `path`.
    pub(crate) fn parse(path: &Path, text: &[u8]) -> Result<StateRecord, VmError> {
        let record: StateRecord =
            serde_json::from_slice(text).map_err(|source| VmError::StateRecord { path: path.to_owned(), source })?;
        if record.format != STATE_FORMAT {
            return Err(VmError::StateMismatch {
                what: "format",
                saved: record.format.to_string(),
                here: STATE_FORMAT.to_string(),
            });
        }
        Ok(record)
    }
}

impl VmRuntime {
    /// Saves a paused VM's memory and device state into the directory `state` (created;
    /// it must not hold a state already): `vm.state` and `vm.json`. The VM stays paused, and
    /// runs on after a [`VmRuntime::resume`]. Bounded by
    /// [`crate::VmOptions::checkpoint_timeout`]; on failure nothing of the checkpoint is left.
    pub async fn checkpoint(&self, id: &SandboxId, state: &Path) -> Result<CheckpointStats, VmError> {
        self.save_state(id, state, false).await
    }

    /// [`VmRuntime::checkpoint`]; with `ram_in_template`, the RAM of a VM whose memory
    /// backend is shared (a template's) stays out of the state (`x-ignore-shared`).
    pub(crate) async fn save_state(
        &self,
        id: &SandboxId,
        state: &Path,
        ram_in_template: bool,
    ) -> Result<CheckpointStats, VmError> {
        let started = std::time::Instant::now();
        let boot = self.boot_record(id).ok_or_else(|| VmError::NotFound(id.clone()))?;
        if !boot.machine.is_complete() {
            return Err(VmError::MachineUnrecorded(id.clone()));
        }
        let mut qmp = self.qmp(id).await?;
        let status = bounded(qmp.query_status()).await?;
        if status.running || status.status == "postmigrate" {
            return Err(VmError::NotCheckpointable { status: status.status });
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(state).map_err(VmError::io("create", state))?;
        let state_path = state.join(STATE_FILE);
        let record_path = state.join(STATE_RECORD);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&state_path)
            .map_err(VmError::io("create", &state_path))?;
        // Its RAM and a margin for the devices' state (a template's state holds no RAM).
        let ram = if ram_in_template { 0 } else { boot.machine.memory_mib << 20 };
        crate::sys::reserve_if_in_memory(&file, ram + STATE_MARGIN).map_err(VmError::io("reserve", &state_path))?;
        let saved = async {
            self.migrate_out(&mut qmp, &file, ram_in_template).await?;
            let state_bytes = file.metadata().map_err(VmError::io("stat", &state_path))?.len();
            let record = StateRecord {
                format: STATE_FORMAT,
                qemu_version: self.qemu_version.clone(),
                kernel_version: self.kernel_version.clone(),
                machine: boot.machine.clone(),
                state_bytes,
                ram_in_template,
            };
            let text = serde_json::to_vec_pretty(&record).expect("plain struct");
            write_new(&record_path, &text)?;
            Ok::<u64, VmError>(state_bytes + text.len() as u64)
        }
        .await;
        match saved {
            Ok(image_bytes) => Ok(CheckpointStats { wall: started.elapsed(), image_bytes }),
            Err(e) => {
                for path in [&state_path, &record_path] {
                    let _ = std::fs::remove_file(path);
                }
                Err(e)
            }
        }
    }

    /// Streams the VM's state into `file` and waits for QEMU to report it complete.
    async fn migrate_out(&self, qmp: &mut Qmp, file: &std::fs::File, ignore_shared: bool) -> Result<(), VmError> {
        bounded(qmp.execute("migrate-set-parameters", Some(json!({ "max-bandwidth": MIGRATE_BANDWIDTH })))).await?;
        // Set either way: a pod made from a template has it on from its restore.
        set_ignore_shared(qmp, ignore_shared).await?;
        bounded(qmp.getfd(STATE_FD, file.as_fd())).await?;
        bounded(qmp.migrate(&format!("fd:{STATE_FD}"))).await?;
        let bound = self.opts.checkpoint_timeout;
        let deadline = Instant::now() + bound;
        loop {
            let info = bounded(qmp.query_migrate()).await?;
            match info.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some(status @ ("failed" | "cancelled")) => return Err(VmError::Migration(failure(status, &info))),
                _ => {}
            }
            if Instant::now() >= deadline {
                // Cancelled, the VM stays paused as it was, its disk active.
                if let Err(e) = bounded(qmp.migrate_cancel()).await {
                    tracing::warn!(error = %e, "cannot cancel a migration that timed out");
                }
                return Err(VmError::MigrationTimeout { bound });
            }
            tokio::time::sleep(MIGRATE_POLL).await;
        }
    }
}

/// Whether migrations leave shared RAM out (both ends must agree: the stream says where each
/// left-out RAM block is).
pub(crate) async fn set_ignore_shared(qmp: &mut Qmp, on: bool) -> Result<(), VmError> {
    let capabilities = json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": on }] });
    bounded(qmp.execute("migrate-set-capabilities", Some(capabilities))).await?;
    Ok(())
}

/// QEMU's reason for a failed migration (`error-desc`), or its status alone.
pub(crate) fn failure(status: &str, info: &Value) -> String {
    match info.get("error-desc").and_then(Value::as_str) {
        Some(desc) => format!("{status}: {desc}"),
        None => status.to_owned(),
    }
}

fn write_new(path: &PathBuf, bytes: &[u8]) -> Result<(), VmError> {
    use std::io::Write;
    let mut file =
        OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(VmError::io("create", path))?;
    file.write_all(bytes).map_err(VmError::io("write", path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::AccelKind;

    fn record() -> StateRecord {
        StateRecord {
            format: STATE_FORMAT,
            qemu_version: "7.2.22".into(),
            kernel_version: "6.1.0-41-cloud-amd64".into(),
            machine: Machine {
                memory_mib: 256,
                vcpus: 1,
                accel: AccelKind::Tcg,
                tb_size_mib: 64,
                tsc_khz: 2_596_120,
                hostname: "box".into(),
                extra_cmdline: vec![],
                console_log: false,
                memory_backend: false,
            },
            state_bytes: 65 << 20,
            ram_in_template: false,
        }
    }

    #[test]
    fn records_round_trip_and_other_formats_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let text = serde_json::to_vec(&record()).unwrap();
        std::fs::write(dir.path().join(STATE_RECORD), &text).unwrap();
        assert_eq!(StateRecord::read(dir.path()).unwrap(), record());
        let later = StateRecord { format: STATE_FORMAT + 1, ..record() };
        std::fs::write(dir.path().join(STATE_RECORD), serde_json::to_vec(&later).unwrap()).unwrap();
        assert!(matches!(StateRecord::read(dir.path()), Err(VmError::StateMismatch { what: "format", .. })));
        std::fs::write(dir.path().join(STATE_RECORD), b"{").unwrap();
        assert!(matches!(StateRecord::read(dir.path()), Err(VmError::StateRecord { .. })));
    }

    #[test]
    fn failures_carry_qemu_s_reason() {
        let info = json!({ "status": "failed", "error-desc": "Unable to write to file: No space left on device" });
        assert_eq!(failure("failed", &info), "failed: Unable to write to file: No space left on device");
        assert_eq!(failure("cancelled", &json!({ "status": "cancelled" })), "cancelled");
    }
}
