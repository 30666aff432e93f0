//! What one sandbox may hold of the gateway at once, so that no sandbox can starve the node's
//! API or the other sandboxes' egress.
//!
//! The charge is the client connection: every task and buffer the gateway keeps for a
//! sandbox belongs to one of its connections (the connection's own task, a CONNECT tunnel or
//! a WebSocket splice that took the connection over, its upstream connection and their
//! bounded buffers), or to its idle upstream pool, which has a cap of its own. So capping the
//! connections caps the tasks and the bytes. DNS holds nothing: each query is answered inline
//! by the sandbox's responder task, never forwarded.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Operator limits, per sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Client connections open at once through the explicit proxy and the transparent ports
    /// 80 and 443 together (`--gateway-max-connections`). Beyond it a new connection is
    /// refused: 503 on the proxy and port 80, closed (RST) on port 443.
    pub max_connections: usize,
}

impl SandboxLimits {
    /// Well above what package managers, browsers and test suites open at once, far below
    /// what would take the node's descriptors or memory.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits { max_connections: SandboxLimits::DEFAULT_MAX_CONNECTIONS }
    }
}

/// At most one audit event per this interval says that connections were refused (a sandbox
/// that keeps hitting its limit would otherwise spend its whole audit budget on that, or
/// fill the log): it counts those refused since the previous one.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// A sandbox's connection slots.
pub(crate) struct ConnectionLimit {
    slots: Arc<Semaphore>,
    max: usize,
    report: Mutex<Report>,
}

#[derive(Default)]
struct Report {
    last: Option<Instant>,
    refused: u64,
}

/// One admitted connection: its slot is free again when this is dropped, with whatever holds
/// the connection last (its task, a tunnel, a WebSocket splice).
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl ConnectionLimit {
    pub(crate) fn new(max: usize) -> ConnectionLimit {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        ConnectionLimit { slots: Arc::new(Semaphore::new(max)), max, report: Mutex::default() }
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A slot for a new connection, if the sandbox has one left.
    pub(crate) fn admit(&self) -> Option<Slot> {
        self.slots.clone().try_acquire_owned().ok().map(|permit| Slot { _permit: permit })
    }

    /// Connections holding a slot now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// Counts a refused connection: `Some(refused so far)` when an event is due.
    pub(crate) fn refused(&self, now: Instant) -> Option<u64> {
        let mut report = self.report.lock().ok()?;
        report.refused += 1;
        report.due(now)
    }

    /// `Some(refused)` when refusals are still unreported and an event is due.
    pub(crate) fn unreported(&self, now: Instant) -> Option<u64> {
        let mut report = self.report.lock().ok()?;
        if report.refused == 0 {
            return None;
        }
        report.due(now)
    }
}

impl Report {
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.saturating_duration_since(last) < REPORT_INTERVAL) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.refused))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back_and_refusals_are_reported_at_most_once_a_second() {
        let limit = ConnectionLimit::new(2);
        let (a, b) = (limit.admit().unwrap(), limit.admit().unwrap());
        assert!(limit.admit().is_none());
        assert_eq!(limit.open(), 2);
        drop(a);
        let c = limit.admit().unwrap();
        assert!(limit.admit().is_none());
        drop((b, c));
        assert_eq!(limit.open(), 0);

        let start = Instant::now();
        assert_eq!(limit.refused(start), Some(1));
        assert_eq!(limit.refused(start), None);
        assert_eq!(limit.refused(start + Duration::from_millis(500)), None);
        assert_eq!(limit.unreported(start + Duration::from_millis(900)), None);
        let later = start + REPORT_INTERVAL;
        assert_eq!(limit.unreported(later), Some(2));
        assert_eq!(limit.unreported(later + REPORT_INTERVAL), None);
        assert_eq!(limit.refused(later + REPORT_INTERVAL), Some(1));
    }
}
