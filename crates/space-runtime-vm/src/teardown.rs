//! Destroying a VM: kill the VMM through its cgroup, then remove the cgroup, the VM's
//! directory and its id range, in that order (the range is free only once nothing of the
//! VM runs as its uid).

use std::path::Path;
use std::time::Duration;

use space_host::cgroup::{Backend, members};
use space_runtime::SandboxId;
use tokio::time::Instant;

use crate::{VmError, VmRuntime, sys};

const POLL: Duration = Duration::from_millis(2);

impl VmRuntime {
    /// Kills the VMM (every task of its cgroup), removes its cgroup, directory and id range.
    /// Succeeds when there is nothing left to remove.
    pub async fn destroy(&self, id: &SandboxId) -> Result<(), VmError> {
        let name = self.cgroup_name(id);
        let tracked = self.tracked.lock().expect("tracked lock").remove(id);
        if let Some(t) = &tracked {
            if let Some(agent) = &t.agent {
                agent.close();
            }
            // Also covers a VMM whose cgroup is gone; the pidfd cannot hit another process.
            let _ = sys::pidfd_signal(&*t.pidfd, libc::SIGKILL);
        }
        if self.cgroups.exists(&name) {
            kill_members(&*self.cgroups, &name, id, self.opts.stop_timeout).await?;
        }
        if let Some(t) = tracked {
            let _ = tokio::time::timeout(self.opts.stop_timeout, sys::wait_pidfd(&t.pidfd)).await;
        }
        let cgroups = self.cgroups.clone();
        let removed = name.clone();
        tokio::task::spawn_blocking(move || remove_cgroup(&*cgroups, &removed))
            .await
            .map_err(|e| VmError::Jailer(format!("cgroup task: {e}")))??;
        let dir = self.vm_dir(id);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(VmError::io("remove", dir)(e)),
            _ => {}
        }
        self.ranges.release(id).map_err(VmError::Range)
    }
}

/// SIGKILLs the cgroup's members until it is empty. A VMM cannot fork (QEMU's seccomp
/// filter denies it), so there is nothing to freeze first; a member's pidfd is checked for
/// membership after opening, so a pid reused by another process is never signalled.
async fn kill_members(cg: &dyn Backend, name: &Path, id: &SandboxId, timeout: Duration) -> Result<(), VmError> {
    let deadline = Instant::now() + timeout;
    if cg.kill_all(name)? {
        // cgroup v2's cgroup.kill did it in one step.
    }
    let (path, controller) = cg.membership(name);
    loop {
        let left = members(cg, name);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(VmError::StillAlive { id: id.clone(), processes: left.len(), waited: timeout });
        }
        for pid in left {
            let Ok(pidfd) = sys::pidfd_open(pid) else { continue };
            if sys::cgroup_of(pid, &controller).as_deref() == Some(path.as_str()) {
                let _ = sys::pidfd_signal(&pidfd, libc::SIGKILL);
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Removes the cgroup's directories, retrying while a just-emptied v1 cgroup is still busy.
fn remove_cgroup(cg: &dyn Backend, name: &Path) -> Result<(), VmError> {
    let mut attempt = 0;
    loop {
        let mut failed = None;
        for dir in cg.dirs(name) {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => failed = Some((dir, e)),
                _ => {}
            }
        }
        match failed {
            None => return Ok(()),
            Some((dir, e)) if attempt >= 100 => return Err(VmError::io("remove cgroup", dir)(e)),
            Some(_) => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}
