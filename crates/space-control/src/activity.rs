//! When each session was last used, for idle timeouts: every call that needs its running
//! sandbox (exec, files, processes, watch) counts, and a session with an exec, attach or
//! watch stream open is never idle.
//!
//! Kept in memory only (a write per request would cost every exec a database write): after a
//! restart, sessions count as used at the moment the server started.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use space_api::SessionId;
use space_store::now_ms;

#[derive(Debug, Default, Clone, Copy)]
struct Use {
    last_ms: i64,
    open_streams: u32,
}

#[derive(Debug)]
pub struct Activity {
    started_ms: i64,
    sessions: Mutex<HashMap<SessionId, Use>>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { started_ms: now_ms(), sessions: Mutex::new(HashMap::new()) }
    }
}

/// Keeps a session busy while alive (an open stream); dropping it counts as a last use.
pub struct Busy {
    activity: Arc<Activity>,
    session: SessionId,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.activity.update(&self.session, |u| u.open_streams = u.open_streams.saturating_sub(1));
    }
}

impl Activity {
    /// Records a use of the session now.
    pub fn touch(&self, session: &SessionId) {
        self.update(session, |_| {});
    }

    /// Marks the session busy until the returned guard is dropped.
    pub fn busy(self: &Arc<Self>, session: &SessionId) -> Busy {
        self.update(session, |u| u.open_streams += 1);
        Busy { activity: self.clone(), session: session.clone() }
    }

    /// Milliseconds since the session was last used at `now_ms` (`None` while a stream is open).
    /// `since_ms` is the earliest time that counts (e.g. when the session last resumed).
    pub fn idle_for(&self, session: &SessionId, since_ms: i64, now_ms: i64) -> Option<i64> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let used = sessions.get(session).copied().unwrap_or_default();
        (used.open_streams == 0).then(|| now_ms - used.last_ms.max(since_ms).max(self.started_ms))
    }

    /// Whether an exec, attach or watch stream of the session is open.
    pub fn has_open_streams(&self, session: &SessionId) -> bool {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.get(session).is_some_and(|u| u.open_streams > 0)
    }

    /// Forgets sessions that ended.
    pub fn forget(&self, session: &SessionId) {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).remove(session);
    }

    fn update(&self, session: &SessionId, change: impl FnOnce(&mut Use)) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let entry = sessions.entry(session.clone()).or_default();
        entry.last_ms = now_ms();
        change(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_streams_keep_a_session_busy_and_count_as_use_when_closed() {
        let activity = Arc::new(Activity::default());
        let id = SessionId::generate();
        let now = now_ms();
        assert!(activity.idle_for(&id, 0, now + 10_000).is_some_and(|idle| idle >= 10_000));
        let stream = activity.busy(&id);
        assert_eq!(activity.idle_for(&id, 0, now + 20_000), None);
        drop(stream);
        let idle = activity.idle_for(&id, 0, now + 20_000).unwrap();
        assert!(idle <= 20_000 && idle > 0, "{idle}");
        // A later resume restarts the clock.
        assert_eq!(activity.idle_for(&id, now + 30_000, now + 30_000), Some(0));
    }
}
