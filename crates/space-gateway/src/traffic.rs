//! What each session sent and received through the gateway, and the node-wide metrics of
//! its decisions. Both are counted from the audit events, before the audit budget drops
//! any: a sandbox flooding the gateway is still counted in full.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use space_api::SessionId;
use space_api::egress::AuditEvent;

/// Bytes a session moved through the gateway since its egress was set on this node (the
/// server's start, or the session's creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionTraffic {
    /// From the sandbox to upstreams.
    pub bytes_out: u64,
    /// From upstreams to the sandbox.
    pub bytes_in: u64,
}

#[derive(Default)]
struct Counters {
    out: AtomicU64,
    r#in: AtomicU64,
}

/// Per-session counters, kept exactly for the sessions whose egress the gateway holds: an
/// event for a session forgotten meanwhile (a connection that outlived its session) is not
/// counted, so the table never grows past the sessions the node serves.
#[derive(Default)]
pub(crate) struct Traffic {
    sessions: RwLock<HashMap<SessionId, Arc<Counters>>>,
}

impl Traffic {
    pub(crate) fn track(&self, session: &SessionId) {
        if let Ok(mut sessions) = self.sessions.write() {
            sessions.entry(session.clone()).or_default();
        }
    }

    pub(crate) fn forget(&self, session: &SessionId) {
        if let Ok(mut sessions) = self.sessions.write() {
            sessions.remove(session);
        }
    }

    pub(crate) fn of(&self, session: &SessionId) -> Option<SessionTraffic> {
        let sessions = self.sessions.read().ok()?;
        let counters = sessions.get(session)?;
        Some(SessionTraffic {
            bytes_out: counters.out.load(Ordering::Relaxed),
            bytes_in: counters.r#in.load(Ordering::Relaxed),
        })
    }

    /// Counts one decision: the node's metrics, and the session's bytes.
    pub(crate) fn count(&self, event: &AuditEvent) {
        space_metrics::gateway_decision(event.decision, &event.protocol, event.bytes_sent, event.bytes_received);
        if event.bytes_sent == 0 && event.bytes_received == 0 {
            return;
        }
        let Ok(sessions) = self.sessions.read() else { return };
        if let Some(counters) = sessions.get(&event.session_id) {
            counters.out.fetch_add(event.bytes_sent, Ordering::Relaxed);
            counters.r#in.fetch_add(event.bytes_received, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(session: &SessionId, sent: u64, received: u64) -> AuditEvent {
        let mut event = AuditEvent::allowed(session.clone(), 0, "https", "example.com", 443);
        (event.bytes_sent, event.bytes_received) = (sent, received);
        event
    }

    #[test]
    fn bytes_are_counted_per_tracked_session_and_dropped_when_it_is_forgotten() {
        let traffic = Traffic::default();
        let (a, b) = (SessionId::generate(), SessionId::generate());
        traffic.track(&a);
        traffic.count(&event(&a, 10, 200));
        traffic.count(&event(&a, 5, 0));
        traffic.count(&event(&b, 7, 7));
        assert_eq!(traffic.of(&a), Some(SessionTraffic { bytes_out: 15, bytes_in: 200 }));
        assert_eq!(traffic.of(&b), None, "an untracked session is not counted");
        traffic.track(&a);
        assert_eq!(traffic.of(&a).unwrap().bytes_out, 15, "tracking again keeps the counts");
        traffic.forget(&a);
        traffic.count(&event(&a, 1, 1));
        assert_eq!(traffic.of(&a), None);
        assert!(traffic.sessions.read().unwrap().is_empty());
    }
}
