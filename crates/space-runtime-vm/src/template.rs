//! Templates for warm pods: one booted guest's RAM kept in a memory file, from which pods
//! start in a restore's time without reading or copying it.
//!
//! [`VmRuntime::make_template_state`] boots a VM whose RAM is a memfd the node made
//! (`memory-backend-file,share=on` on `/proc/self/fd/6`: QEMU opens memory backends by path
//! only), waits for its agent, lets go of it, pauses and saves the device state with
//! `x-ignore-shared` (RAM stays in the memfd), then destroys the template VM and seals the
//! memfd against every change (write, grow, shrink; the seals themselves are sealed).
//!
//! [`VmRuntime::start_from_template_state`] restores a pod as a checkpoint is restored, with
//! the memfd mapped private (`share=off`): the pod reads the template's pages and copies those
//! it writes. QEMU 7.2 opens a private backend read-write; it can, because a memfd's mode is
//! 0777, and the seals are what keep a pod's QEMU (untrusted) from changing the template's
//! memory under the other pods. The pod is then an ordinary VM; a checkpoint of it holds all
//! its RAM, and restores without the template.
//!
//! The memfd lives as long as the [`TemplateState`] (the node process): templates do not
//! survive a node restart. Its pages are charged to the template VM's cgroup when it touched
//! them, and to that cgroup's parent once the template VM is gone.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use space_runtime::CheckpointStats;

use crate::checkpoint::StateRecord;
use crate::start::{Hostname, validate_spec};
use crate::{DEFAULT_MEMORY_MIB, VmError, VmHandle, VmRuntime, VmSpec};

/// A template: the device state in its directory, the guest RAM in a sealed memfd.
#[derive(Debug)]
pub struct TemplateState {
    dir: PathBuf,
    memory: OwnedFd,
    record: StateRecord,
    stats: CheckpointStats,
}

impl TemplateState {
    /// The directory with the device state (`vm.state`, `vm.json`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn memory_mib(&self) -> u64 {
        self.record.machine.memory_mib
    }

    /// The sealed memfd with the template's RAM.
    pub fn memory(&self) -> &OwnedFd {
        &self.memory
    }

    /// What saving the device state cost (its bytes exclude RAM).
    pub fn stats(&self) -> CheckpointStats {
        self.stats
    }
}

/// Where pod templates keep their device states, in the run dir.
const POD_TEMPLATES: &str = "vm-pod-templates";

/// A [`TemplateState`] made for the node's warm pool ([`space_runtime::Runtime::make_pod_template`]):
/// its directory goes with it.
#[derive(Debug)]
pub(crate) struct PodTemplateState(pub(crate) TemplateState);

impl Drop for PodTemplateState {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(self.0.dir()) {
            tracing::warn!(dir = %self.0.dir().display(), error = %e, "removing a pod template's state");
        }
    }
}

impl VmRuntime {
    /// Where the pod template booted as sandbox `id` keeps its device state.
    pub(crate) fn pod_template_dir(&self, id: &space_runtime::SandboxId) -> PathBuf {
        self.opts.run_dir.join(POD_TEMPLATES).join(id.as_str())
    }

    /// Removes the states pod templates of an earlier run left: useless without their memory,
    /// which lived in that run's node process.
    pub(crate) fn sweep_pod_templates(&self) {
        let dir = self.opts.run_dir.join(POD_TEMPLATES);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove old pod template states");
            }
            _ => {}
        }
    }

    /// Boots `spec` as a template (its RAM in a memfd), saves its device state into `dir`
    /// (created; must not hold a state) and destroys it; returns the template. `spec.disk` is
    /// the template's disk: every pod needs a copy of it as it is when this returns (the
    /// guest's page cache is part of the template). Bounded by the start and checkpoint
    /// timeouts; on failure nothing of the VM is left.
    pub async fn make_template_state(&self, spec: &VmSpec, dir: &Path) -> Result<TemplateState, VmError> {
        validate_spec(spec, Hostname::Required)?;
        let memory_mib = if spec.limits.memory_mib == 0 { DEFAULT_MEMORY_MIB } else { spec.limits.memory_mib };
        let memory = memory_file(memory_mib)?;
        self.destroy(&spec.id).await?; // leftovers of an earlier attempt
        let saved = async {
            self.boot(spec, Some(&memory)).await?;
            self.release_agent(&spec.id, self.opts.start_timeout).await?;
            self.pause(&spec.id).await?;
            self.save_state(&spec.id, dir, true).await
        }
        .await;
        // The template VM itself is never used again: its RAM is the memfd now.
        let destroyed = self.destroy(&spec.id).await;
        let stats = saved?;
        destroyed?;
        seal(&memory)?;
        let record = StateRecord::read(dir)?;
        Ok(TemplateState { dir: dir.to_owned(), memory, record, stats })
    }

    /// Starts VM `spec.id` from `template` on `spec.disk` (a copy of the template's disk), as
    /// [`VmRuntime::restore`] does (agent and reseed included), with its RAM a private mapping
    /// of the template's memory. Memory and vCPUs are the template's.
    pub async fn start_from_template_state(
        &self,
        spec: &VmSpec,
        template: &TemplateState,
    ) -> Result<VmHandle, VmError> {
        validate_spec(spec, Hostname::Optional)?;
        self.check_record(&template.record)?;
        let memory_mib = template.memory_mib();
        if spec.limits.memory_mib != 0 && spec.limits.memory_mib != memory_mib {
            return Err(VmError::MemoryFixedAtBoot { boot_mib: memory_mib, asked_mib: spec.limits.memory_mib });
        }
        self.restore_with(spec, &template.dir, &template.record, Some(&template.memory), None).await
    }
}

/// A sealable memfd of the guest's RAM size.
fn memory_file(memory_mib: u64) -> Result<OwnedFd, VmError> {
    let fd = memfd_create(c"space-vm-template", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(|e| VmError::io("memfd_create", "space-vm-template")(e.into()))?;
    nix::unistd::ftruncate(&fd, (memory_mib << 20) as libc::off_t)
        .map_err(|e| VmError::io("size", "space-vm-template")(e.into()))?;
    Ok(fd)
}

/// Seals the memfd against writes, resizing and further seals (refused while the template's
/// QEMU still had it mapped shared).
fn seal(memory: &impl AsFd) -> Result<(), VmError> {
    let seals = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(memory, FcntlArg::F_ADD_SEALS(seals))
        .map(drop)
        .map_err(|e| VmError::io("seal", "space-vm-template")(e.into()))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// What a pod's QEMU could try on the template's memory, once sealed: nothing changes it.
    #[test]
    fn a_sealed_template_memory_cannot_change() {
        let memory = memory_file(1).unwrap();
        std::fs::File::from(memory.try_clone().unwrap()).write_all(b"template").unwrap();
        seal(&memory).unwrap();
        // Reopened read-write as QEMU does (through procfs), writes still fail.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&memory));
        let mut reopened = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        assert_eq!(reopened.write(b"x").unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert!(nix::unistd::ftruncate(&reopened, 0).is_err());
        assert!(fcntl(&reopened, FcntlArg::F_ADD_SEALS(SealFlag::empty())).is_err(), "seals not sealed");
        // A private mapping may be written (copy-on-write), a shared writable one is refused,
        // and the file keeps its bytes.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&reopened);
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh private mapping of 1 MiB of the memfd, written once and unmapped
        // here; nothing else refers to it.
        unsafe {
            let map = libc::mmap(std::ptr::null_mut(), 1 << 20, prot, libc::MAP_PRIVATE, fd, 0);
            assert_ne!(map, libc::MAP_FAILED);
            map.cast::<u8>().write(b'X');
            assert_eq!(libc::munmap(map, 1 << 20), 0);
        }
        // SAFETY: as above; the call is expected to fail, and a mapping it made is unmapped.
        let shared = unsafe { libc::mmap(std::ptr::null_mut(), 1 << 20, prot, libc::MAP_SHARED, fd, 0) };
        if shared != libc::MAP_FAILED {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(shared, 1 << 20) };
            panic!("a shared writable mapping of the sealed memory was allowed");
        }
        let mut head = [0u8; 8];
        std::io::Read::read_exact(&mut std::fs::File::open(&path).unwrap(), &mut head).unwrap();
        assert_eq!(&head, b"template");
    }
}
