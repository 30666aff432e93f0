//! Init duties: reap every child and deliver exit statuses to whoever spawned the process.
//!
//! As pid 1 (or a child subreaper in `spaced serve`) spaced inherits every orphan, so it
//! must `waitpid(-1)` on each SIGCHLD or zombies pile up. That rules out
//! `std::process::Child::wait` and `tokio::process`: they wait for one pid and would race
//! with the reaper. Instead processes are spawned through [`Reaper::spawn`], which
//! registers the pid for its exit status.
//!
//! One race needs care: when `exec` fails, std's `Command::spawn` itself waits for the
//! failed child and panics if someone else reaped it first. So spawning holds a shared
//! lock that the reaper takes exclusively around its `waitpid` loop; a spawn in flight
//! delays reaping by at most the duration of one `fork` + `exec`. Because the pid is
//! registered before that lock is released, a child can never exit "unregistered";
//! statuses of pids nobody registered (orphans) are still kept for a while, bounded.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, RwLock};

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use space_proto::ExitStatus;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

use crate::lock;

/// Exit statuses of pids nobody has claimed (yet) that are remembered.
const MAX_UNCLAIMED: usize = 1024;

#[derive(Default)]
struct Table {
    waiters: HashMap<i32, oneshot::Sender<ExitStatus>>,
    unclaimed: HashMap<i32, ExitStatus>,
    unclaimed_order: VecDeque<i32>,
}

#[derive(Default)]
struct Inner {
    table: Mutex<Table>,
    /// Shared while spawning, exclusive while reaping (see the module docs).
    spawning: RwLock<()>,
}

/// Cheap to clone; all clones share one table.
#[derive(Clone, Default)]
pub struct Reaper {
    inner: Arc<Inner>,
}

impl Reaper {
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `cmd` and registers its pid; the receiver yields the exit status.
    /// Blocking (fork + exec): call it from a blocking thread.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, oneshot::Receiver<ExitStatus>)> {
        let _guard = self.inner.spawning.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let child = cmd.spawn()?;
        let rx = self.register(child.id() as i32);
        Ok((child, rx))
    }

    /// Registers interest in `pid`'s exit status; delivers it at once if already reaped.
    pub fn register(&self, pid: i32) -> oneshot::Receiver<ExitStatus> {
        let (tx, rx) = oneshot::channel();
        let mut table = lock(&self.inner.table);
        if let Some(status) = table.unclaimed.remove(&pid) {
            table.unclaimed_order.retain(|p| *p != pid);
            let _ = tx.send(status);
        } else {
            table.waiters.insert(pid, tx);
        }
        rx
    }

    /// Reaps every child that has exited. Blocking: waits for spawns in flight.
    pub fn reap_all(&self) {
        let _guard = self.inner.spawning.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.deliver(pid.as_raw(), exited(code)),
                Ok(WaitStatus::Signaled(pid, sig, _core)) => self.deliver(pid.as_raw(), signaled(sig as i32)),
                // Without WUNTRACED/WCONTINUED nothing else is reported; keep draining.
                Ok(WaitStatus::StillAlive) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                // ECHILD: no children at all.
                Err(_) => return,
            }
        }
    }

    fn deliver(&self, pid: i32, status: ExitStatus) {
        let mut table = lock(&self.inner.table);
        if let Some(tx) = table.waiters.remove(&pid) {
            // The receiver may be gone (its owner gave up); the status is then moot.
            let _ = tx.send(status);
            return;
        }
        table.unclaimed.insert(pid, status);
        table.unclaimed_order.push_back(pid);
        while table.unclaimed_order.len() > MAX_UNCLAIMED {
            if let Some(old) = table.unclaimed_order.pop_front() {
                table.unclaimed.remove(&old);
            }
        }
    }

    /// Reaps on every SIGCHLD, forever. Signals coalesce, so each wakeup drains all
    /// exited children; one initial pass catches children that exited before the handler
    /// was installed.
    pub async fn run(self) -> io::Result<()> {
        let mut sigchld = signal(SignalKind::child())?;
        loop {
            let reaper = self.clone();
            // The write lock may wait for a spawn in flight: keep that off the runtime.
            if let Err(e) = tokio::task::spawn_blocking(move || reaper.reap_all()).await {
                tracing::error!(error = %e, "reaper pass failed");
            }
            if sigchld.recv().await.is_none() {
                return Ok(());
            }
        }
    }
}

fn exited(code: i32) -> ExitStatus {
    ExitStatus { code: Some(code), signal: None, timed_out: false }
}

fn signaled(signal: i32) -> ExitStatus {
    ExitStatus { code: None, signal: Some(signal), timed_out: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_of_an_unregistered_pid_waits_for_its_owner() {
        let reaper = Reaper::new();
        reaper.deliver(4242, exited(3));
        let mut rx = reaper.register(4242);
        assert_eq!(rx.try_recv().ok(), Some(exited(3)));
    }

    #[test]
    fn registered_waiters_get_their_status() {
        let reaper = Reaper::new();
        let mut rx = reaper.register(77);
        reaper.deliver(77, signaled(9));
        assert_eq!(rx.try_recv().ok(), Some(signaled(9)));
    }

    #[test]
    fn unclaimed_statuses_are_bounded() {
        let reaper = Reaper::new();
        for pid in 0..(MAX_UNCLAIMED as i32 + 10) {
            reaper.deliver(pid, exited(0));
        }
        let table = lock(&reaper.inner.table);
        assert_eq!(table.unclaimed.len(), MAX_UNCLAIMED);
        assert!(!table.unclaimed.contains_key(&0));
    }
}
