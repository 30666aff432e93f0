//! Killing every process of a sandbox cgroup and waiting for it to empty.

use std::path::Path;
use std::time::{Duration, Instant};

use space_runtime::RuntimeError;

use crate::cgroup::{Backend, members};
use crate::process;

const POLL: Duration = Duration::from_millis(2);
/// A freeze of an idle sandbox completes within microseconds: poll finely.
const FREEZE_POLL: Duration = Duration::from_micros(200);
/// How long to wait for a freeze before killing anyway (a task stuck in the kernel can delay
/// freezing; the kill loop below copes with stragglers).
const FREEZE_WAIT: Duration = Duration::from_secs(1);

fn cgroup_err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Cgroup(e.to_string())
}

/// Freezes the cgroup, SIGKILLs every member, thaws, and waits until the cgroup is empty.
pub(crate) async fn kill_all(cg: &dyn Backend, name: &Path, timeout: Duration) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + timeout;
    if !cg.kill_all(name).map_err(cgroup_err)? {
        // While frozen nothing can fork, so one pass over the members kills them all. A start
        // interrupted by a crash may have created some hierarchies but not the freezer's: then
        // the kill loop below does the job without the freeze.
        let frozen = cg.set_frozen(name, true).is_ok();
        let freeze_deadline = Instant::now() + FREEZE_WAIT;
        while frozen && !cg.is_frozen(name) && Instant::now() < freeze_deadline {
            tokio::time::sleep(POLL).await;
        }
        kill_members(cg, name);
        if frozen {
            cg.set_frozen(name, false).map_err(cgroup_err)?;
        }
    }
    loop {
        let left = members(cg, name);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::Cgroup(format!(
                "{}: {} processes still alive after {timeout:?} (pids {:?})",
                name.display(),
                left.len(),
                &left[..left.len().min(10)]
            )));
        }
        kill_members(cg, name);
        tokio::time::sleep(POLL).await;
    }
}

/// Freezes the cgroup and waits until the kernel reports every member frozen. On timeout
/// the cgroup is thawed again, so a failed pause leaves the sandbox running.
pub(crate) async fn freeze(cg: &dyn Backend, name: &Path, timeout: Duration) -> Result<(), RuntimeError> {
    cg.set_frozen(name, true).map_err(cgroup_err)?;
    let deadline = Instant::now() + timeout;
    while !cg.is_frozen(name) {
        if Instant::now() >= deadline {
            let _ = cg.set_frozen(name, false);
            return Err(RuntimeError::Cgroup(format!("{}: not frozen after {timeout:?}", name.display())));
        }
        tokio::time::sleep(FREEZE_POLL).await;
    }
    Ok(())
}

/// SIGKILLs the cgroup's members through pidfds, checking each one's membership after
/// opening its pidfd: a pid that was reused by an unrelated process is never signalled.
fn kill_members(cg: &dyn Backend, name: &Path) {
    let (path, selector) = cg.membership(name);
    for pid in members(cg, name) {
        let Ok(pidfd) = process::pidfd_open(pid) else {
            continue;
        };
        if process::cgroup_of(pid, &selector).as_deref() == Some(path.as_str()) {
            let _ = process::pidfd_signal(&pidfd, libc::SIGKILL);
        }
    }
}

/// Removes the sandbox's cgroup directories, retrying while the kernel still reports them
/// busy (a just-emptied v1 cgroup can take a moment).
pub(crate) fn remove(cg: &dyn Backend, name: &Path) -> Result<(), RuntimeError> {
    let mut attempt = 0;
    loop {
        let result = cg.dirs(name).iter().try_for_each(|dir| crate::cgroup::rmdir_recursive(dir));
        match result {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 100 => {
                tracing::debug!(error = %e, "cgroup not removable yet");
                attempt += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(cgroup_err(e)),
        }
    }
}
