//! How many file watches may be open at once: per session, per tenant and on the node.
//!
//! Each watch is an inotify instance in the sandbox's `spaced`, and the kernel charges the
//! inotify instances of every sandbox to host root (which owns every sandbox's user
//! namespace), 128 per user by default. Without these limits, one tenant's watch WebSockets
//! used up host root's instances, breaking watches for every tenant and for root on the host.
//! The node's limit stays below the kernel's so that root keeps some.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use space_api::{ErrorCode, SessionId, TenantId};

use crate::error::AppError;

/// The limits, and the watches open now.
#[derive(Debug)]
pub struct WatchLimits {
    per_session: usize,
    per_tenant: usize,
    per_node: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    sessions: HashMap<SessionId, usize>,
    tenants: HashMap<TenantId, usize>,
    node: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits::new(8, 32, 96)
    }
}

/// One open watch; its place is given back when dropped.
#[derive(Debug)]
pub struct WatchSlot {
    limits: Arc<WatchLimits>,
    session: SessionId,
    tenant: TenantId,
}

impl WatchLimits {
    pub fn new(per_session: usize, per_tenant: usize, per_node: usize) -> WatchLimits {
        WatchLimits { per_session, per_tenant, per_node, open: Mutex::default() }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        // The counts stay consistent whatever a panicking holder did: each change is one step.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more watch of `session` (of `tenant`), or 429 `limit_exceeded` naming
    /// the limit that was reached.
    pub fn acquire(self: &Arc<Self>, tenant: &TenantId, session: &SessionId) -> Result<WatchSlot, AppError> {
        let mut open = self.open();
        let full = |what: &str, limit: usize| {
            AppError::new(
                ErrorCode::LimitExceeded,
                format!("at most {limit} file watches may be open {what}; close one (end its WebSocket) first"),
            )
        };
        if open.sessions.get(session).copied().unwrap_or(0) >= self.per_session {
            return Err(full("per session", self.per_session));
        }
        if open.tenants.get(tenant).copied().unwrap_or(0) >= self.per_tenant {
            return Err(full("per tenant", self.per_tenant));
        }
        if open.node >= self.per_node {
            return Err(full("on this node", self.per_node));
        }
        *open.sessions.entry(session.clone()).or_default() += 1;
        *open.tenants.entry(tenant.clone()).or_default() += 1;
        open.node += 1;
        Ok(WatchSlot { limits: self.clone(), session: session.clone(), tenant: tenant.clone() })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.limits.open();
        let give_back = |counts: &mut usize| *counts = counts.saturating_sub(1);
        if let Some(n) = open.sessions.get_mut(&self.session) {
            give_back(n);
            if *n == 0 {
                open.sessions.remove(&self.session);
            }
        }
        if let Some(n) = open.tenants.get_mut(&self.tenant) {
            give_back(n);
            if *n == 0 {
                open.tenants.remove(&self.tenant);
            }
        }
        give_back(&mut open.node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_refuses_the_next_watch_until_one_closes() {
        let limits = Arc::new(WatchLimits::new(2, 3, 4));
        let (a, b) = (TenantId::generate(), TenantId::generate());
        let (s1, s2, s3) = (SessionId::generate(), SessionId::generate(), SessionId::generate());
        let first = limits.acquire(&a, &s1).unwrap();
        let _second = limits.acquire(&a, &s1).unwrap();
        let err = limits.acquire(&a, &s1).unwrap_err();
        assert!(err.0.message.contains("per session"), "{}", err.0.message);
        let _third = limits.acquire(&a, &s2).unwrap();
        assert!(limits.acquire(&a, &s2).unwrap_err().0.message.contains("per tenant"));
        let _fourth = limits.acquire(&b, &s3).unwrap();
        assert!(limits.acquire(&b, &s3).unwrap_err().0.message.contains("on this node"));
        drop(first);
        let again = limits.acquire(&a, &s1).expect("a closed watch gives its place back");
        assert_eq!(again.session, s1);
        assert_eq!(err.0.code, ErrorCode::LimitExceeded);
    }
}
