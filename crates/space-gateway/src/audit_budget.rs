//! How many audit events a sandbox may cause: a token bucket per sandbox, so a hostile
//! sandbox cannot grow the node's memory or the database without bound by, say, sending
//! DNS queries in a loop. Events over the budget are counted and reported in one event.

use std::time::Instant;

use space_api::egress::{AuditDecision, AuditEvent};

/// Sustained events per second per sandbox.
const PER_SECOND: f64 = 200.0;
/// Events a sandbox may cause at once.
const BURST: f64 = 2000.0;

pub(crate) struct AuditBudget {
    tokens: f64,
    last: Option<Instant>,
    dropped: u64,
}

impl Default for AuditBudget {
    fn default() -> Self {
        AuditBudget { tokens: BURST, last: None, dropped: 0 }
    }
}

pub(crate) enum Spent {
    /// Over budget: leave the event out.
    No,
    /// Record it, after a summary of the `dropped` events left out before it (if any).
    Yes { dropped: u64 },
}

impl AuditBudget {
    pub(crate) fn spend(&mut self, now: Instant) -> Spent {
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * PER_SECOND;
            self.tokens = (self.tokens + refill).min(BURST);
        }
        self.last = Some(now);
        if self.tokens < 1.0 {
            self.dropped += 1;
            return Spent::No;
        }
        self.tokens -= 1.0;
        Spent::Yes { dropped: std::mem::take(&mut self.dropped) }
    }
}

/// The event that stands for `dropped` events left out before `next`.
pub(crate) fn summary(next: &AuditEvent, dropped: u64) -> AuditEvent {
    AuditEvent {
        decision: AuditDecision::Denied,
        reason: Some(format!("{dropped} decisions not recorded: the sandbox made more than {PER_SECOND} per second")),
        protocol: "audit".into(),
        host: String::new(),
        port: 0,
        method: None,
        path: None,
        credential: None,
        bytes_sent: 0,
        bytes_received: 0,
        ..next.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_flood_is_cut_and_counted_then_the_budget_refills() {
        let mut budget = AuditBudget::default();
        let start = Instant::now();
        for _ in 0..BURST as u64 {
            assert!(matches!(budget.spend(start), Spent::Yes { dropped: 0 }));
        }
        for _ in 0..5 {
            assert!(matches!(budget.spend(start), Spent::No));
        }
        let later = start + Duration::from_secs(1);
        assert!(matches!(budget.spend(later), Spent::Yes { dropped: 5 }));
        assert!(matches!(budget.spend(later), Spent::Yes { dropped: 0 }));
    }
}
