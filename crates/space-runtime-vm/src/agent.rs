//! The node's connection to a VM's agent over virtio-serial: dialing with bounded, retried
//! handshakes, and letting go of it before a checkpoint.

use std::os::fd::OwnedFd;
use std::time::Duration;

use serde_json::{Value, json};
use space_proto::client::AgentClient;
use space_runtime::SandboxId;
use tokio::time::Instant;

use crate::qmp::{Qmp, QmpError};
use crate::stale::SkipToHello;
use crate::{AGENT_ATTEMPT, AGENT_RETRY_PAUSE, VmError, VmRuntime, bounded, sys};

/// How often [`VmRuntime::release_agent`] asks QEMU whether the host end is closed.
const RELEASE_POLL: Duration = Duration::from_millis(2);
/// How long the agent gets to act on a hang-up its guest's driver has taken in (see
/// [`VmRuntime::release_agent`]). Nothing on the host can tell when it has: this only spares
/// a restore's first handshake from landing in the old connection, which the retry covers.
const RELEASE_SETTLE: Duration = Duration::from_millis(20);

/// virtio-serial's control queue to the guest (queue 2 of a multiport device), and the device.
const CONTROL_IN_QUEUE: u16 = 2;
const SERIAL_DEVICE: &str = "/machine/peripheral/vs0";
/// How long a dial waits for the guest to take in the news of its connection.
const OPEN_BOUND: Duration = Duration::from_secs(1);
const OPEN_POLL: Duration = Duration::from_millis(1);
/// How long a dial waits for the monitor before it falls back to [`OPEN_FALLBACK`].
const QMP_FOR_OPEN: Duration = Duration::from_millis(200);
/// The wait when QEMU cannot tell (the query below is one of QEMU's unstable `x-` commands):
/// what the guest took to handle the open under TCG on a loaded host, with a margin.
const OPEN_FALLBACK: Duration = Duration::from_millis(20);

/// The guest's available index and QEMU's used index of the control queue to the guest, and
/// its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ControlQueue {
    avail: u16,
    used: u16,
    size: u16,
}

impl ControlQueue {
    /// Whether the guest has handled every control message QEMU gave it: its driver fills the
    /// queue, and hands each buffer back once it has acted on the message in it.
    fn all_handled(&self) -> bool {
        self.avail.wrapping_sub(self.used) == self.size
    }
}

async fn control_queue(qmp: &mut Qmp) -> Result<ControlQueue, QmpError> {
    let args = json!({ "path": SERIAL_DEVICE, "queue": CONTROL_IN_QUEUE });
    // The element query reads both indices from guest memory; the status gives the size.
    let element = bounded(qmp.execute("x-query-virtio-queue-element", Some(args.clone()))).await?;
    let status = bounded(qmp.execute("x-query-virtio-queue-status", Some(args))).await?;
    let index = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    match (index(&element["avail"]["idx"]), index(&element["used"]["idx"]), index(&status["vring-num"])) {
        (Some(avail), Some(used), Some(size)) => Ok(ControlQueue { avail, used, size }),
        _ => Err(QmpError::Protocol(format!("x-query-virtio-queue-element returned {element}"))),
    }
}

/// Waits (at most [`OPEN_BOUND`]) until QEMU has told the guest of the connection just made
/// and the guest has handled that. The node speaks first on a connection, and what arrives
/// before the guest knows a host is there is taken for the last host's leftovers and dropped:
/// the guest's driver handles data as it comes, control messages later, from a work queue.
async fn wait_for_open(qmp: &mut Qmp, before: ControlQueue) {
    let deadline = Instant::now() + OPEN_BOUND;
    loop {
        match control_queue(qmp).await {
            Ok(now) if now.used != before.used && now.all_handled() => return,
            Ok(_) if Instant::now() < deadline => tokio::time::sleep(OPEN_POLL).await,
            Ok(_) => return tracing::debug!("the guest did not take in the agent connection within {OPEN_BOUND:?}"),
            Err(e) => {
                tracing::debug!(error = %e, "cannot see the guest's control queue");
                return tokio::time::sleep(OPEN_FALLBACK).await;
            }
        }
    }
}

impl VmRuntime {
    /// A connection to the VM's agent: the one `start` made while it is open, else a new one.
    ///
    /// Dialing [`VmRuntime::agent_socket`] directly works too, with one caveat of
    /// virtio-serial: the guest learns of a host disconnect only from a flag, so a connection
    /// made right after another one closed can land in the old byte stream, its hello lost
    /// with it, and an attempt given up on can leave its late hello to the next one. A dial is
    /// therefore bounded per attempt ([`AGENT_ATTEMPT`]), proved with a round trip after the
    /// handshake, and retried after a pause, until [`crate::VmOptions::start_timeout`].
    pub async fn agent(&self, id: &SandboxId) -> Result<AgentClient, VmError> {
        let kept = self.tracked.lock().expect("tracked lock").get(id).and_then(|t| t.agent.clone());
        if let Some(client) = kept.filter(|c| !c.is_closed()) {
            return Ok(client);
        }
        let deadline = Instant::now() + self.opts.start_timeout;
        let (client, _) = self.dial_agent(id, None, deadline).await?;
        self.keep_agent(id, &client);
        Ok(client)
    }

    /// Closes the kept agent connection (the next [`VmRuntime::agent`] dials anew).
    pub fn forget_agent(&self, id: &SandboxId) {
        let kept = self.tracked.lock().expect("tracked lock").get_mut(id).and_then(|t| t.agent.take());
        if let Some(client) = kept {
            client.close();
        }
    }

    /// Closes the kept agent connection and waits (at most `timeout`) until QEMU reports the
    /// host end of the port closed and the guest's driver has taken in the hang-up, then a
    /// little longer for the agent to act on it. Called on a running VM before a checkpoint
    /// (what the node's `wait_agent_released` does): a state saved before the guest saw the
    /// hang-up resumes in the middle of that connection, where a restore's first handshake
    /// is lost (and retried after [`AGENT_ATTEMPT`]). Connections held elsewhere must be
    /// closed by their holders.
    pub async fn release_agent(&self, id: &SandboxId, timeout: Duration) -> Result<(), VmError> {
        self.forget_agent(id);
        let deadline = Instant::now() + timeout;
        loop {
            let mut qmp = self.qmp(id).await?;
            let connected = bounded(qmp.chardev_connected(crate::qemu::AGENT_CHARDEV)).await?;
            // QEMU sent the hang-up when it saw the close: once the guest has handled every
            // control message, its driver knows. A paused guest handles nothing (it will
            // when it runs: a checkpoint taken now has it in the old connection). Where QEMU
            // cannot tell, the settle below is all there is.
            let running = bounded(qmp.query_status()).await?.running;
            let handled = !connected && (!running || control_queue(&mut qmp).await.map_or(true, |q| q.all_handled()));
            drop(qmp);
            if handled {
                break;
            }
            if Instant::now() >= deadline {
                return Err(VmError::AgentHeld { waited: timeout });
            }
            tokio::time::sleep(RELEASE_POLL).await;
        }
        tokio::time::sleep(RELEASE_SETTLE.min(deadline.saturating_duration_since(Instant::now()))).await;
        Ok(())
    }

    pub(crate) fn keep_agent(&self, id: &SandboxId, client: &AgentClient) {
        if let Some(t) = self.tracked.lock().expect("tracked lock").get_mut(id) {
            t.agent = Some(client.clone());
        }
    }

    /// Dials until a handshake succeeds, each attempt bounded by [`AGENT_ATTEMPT`], until
    /// `deadline` (or until `vmm`, QEMU's pidfd, reports it exited). Returns the client and
    /// how many attempts failed before it.
    pub(crate) async fn dial_agent(
        &self,
        id: &SandboxId,
        vmm: Option<&OwnedFd>,
        deadline: Instant,
    ) -> Result<(AgentClient, u32), VmError> {
        let socket = self.agent_socket(id);
        let mut failed = 0;
        loop {
            if !socket.exists() {
                return Err(VmError::NotFound(id.clone()));
            }
            let attempt = async {
                // QEMU serves one monitor client at a time: one busy elsewhere (a checkpoint
                // holds it while it streams) leaves the fallback wait.
                let mut qmp = tokio::time::timeout(QMP_FOR_OPEN, self.qmp(id)).await.ok().and_then(Result::ok);
                let before = match &mut qmp {
                    Some(qmp) => control_queue(qmp).await.ok(),
                    None => None,
                };
                let stream = tokio::net::UnixStream::connect(&socket).await.map_err(|e| e.to_string())?;
                match (qmp, before) {
                    (Some(mut qmp), Some(before)) => wait_for_open(&mut qmp, before).await,
                    _ => tokio::time::sleep(OPEN_FALLBACK).await,
                }
                let client = AgentClient::connect(SkipToHello::new(stream)).await.map_err(|e| e.to_string())?;
                // The hello can be a stale one: the answer to an earlier attempt's, which QEMU
                // kept and handed to this connection while the guest still serves (or drains)
                // that earlier one and never sees this one's requests. A round trip shows the
                // guest serves this connection; without it the first request would wait for ever.
                client.health().await.map_err(|e| format!("no answer after the handshake: {e}"))?;
                Ok(client)
            };
            let bound = AGENT_ATTEMPT.min(deadline.saturating_duration_since(Instant::now()));
            let failure = match tokio::time::timeout(bound, attempt).await {
                Ok(Ok(client)) => return Ok((client, failed)),
                Ok(Err(e)) => e,
                Err(_) => format!("no hello within {bound:?}"),
            };
            failed += 1;
            if vmm.is_some_and(sys::has_exited) {
                return Err(VmError::VmmExited { last_line: self.last_error(id) });
            }
            if Instant::now() + AGENT_RETRY_PAUSE >= deadline {
                return Err(VmError::Agent(failure));
            }
            tracing::debug!(sandbox = %id, error = %failure, "agent handshake failed; dialing again");
            tokio::time::sleep(AGENT_RETRY_PAUSE).await;
        }
    }
}
