//! Rolling snapshots: every tick, each running session whose policy says a snapshot is due
//! gets one (a full one only while no exec, attach or watch stream is open, as it would end
//! them), and snapshots its retention no longer wants are deleted. Paused sessions are
//! left alone (nothing changes in them). Deletions go through the node's trash, which caps
//! the kernel's pending subvolume deletions.
//!
//! The same tick enforces session lifetimes: a session past its maximum age is destroyed
//! (whatever its state), a running or paused one idle for its idle timeout is suspended.
//!
//! Of several replicas, the one holding the schedule's lease runs it ([`crate::replicas`]).

use std::time::Duration;

use space_api::policy::{Candidate, next_due, prune};
use space_api::{
    MaxAgeAction, Session, SessionState, Snapshot, SnapshotKind, SnapshotPolicy, TenantId, UpdateSessionRequest,
};
use space_store::now_ms;

use crate::AppState;
use crate::api::{suspend_session, take_snapshot};
use crate::error::AppResult;

pub fn spawn(state: AppState, tick: Duration) {
    tokio::spawn(async move {
        let mut full_unavailable_logged = false;
        loop {
            tokio::time::sleep(tick).await;
            // One replica at a time runs the schedule: two would take each due snapshot twice.
            match crate::replicas::run_schedule(&state, tick).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "snapshot schedule: cannot take its lease");
                    continue;
                }
            }
            let began = std::time::Instant::now();
            if let Err(e) = run_once(&state, &mut full_unavailable_logged).await {
                tracing::warn!(error = %e.0.message, "snapshot schedule");
            }
            space_metrics::schedule_ran(began.elapsed());
        }
    });
}

async fn run_once(state: &AppState, full_unavailable_logged: &mut bool) -> AppResult<()> {
    let now = now_ms();
    for record in state.store.sessions_in_states(&[SessionState::Suspended]).await? {
        expire(state, &record.tenant_id, &record.session, now).await?;
    }
    let live = [SessionState::Running, SessionState::Paused];
    // One read of every live session's snapshots, not one per session.
    let mut all_snapshots = state.store.snapshots_of_sessions_in_states(&live).await?;
    for record in state.store.sessions_in_states(&live).await? {
        let session = &record.session;
        if expire(state, &record.tenant_id, session, now).await?
            || suspend_if_idle(state, &record.tenant_id, session, now, full_unavailable_logged).await
        {
            continue;
        }
        let mut snapshots = all_snapshots.remove(&session.id).unwrap_or_default();
        if session.state == SessionState::Running {
            for kind in due_kinds(&session.snapshot_policy, session, &snapshots, now) {
                if kind == SnapshotKind::Full {
                    if let Err(why) = state.nodes.first().checkpoint_support(session.runtime) {
                        if !std::mem::replace(full_unavailable_logged, true) {
                            tracing::warn!("scheduled full snapshots are skipped: {why}");
                        }
                        continue;
                    }
                    // A full snapshot ends the streams open to the sandbox's agent: wait for a
                    // tick without any (user-requested ones do not wait).
                    if state.activity.has_open_streams(&session.id) {
                        continue;
                    }
                }
                match take_snapshot(state, &record.tenant_id, &session.id, kind, Default::default()).await {
                    Ok(taken) => snapshots.push(taken),
                    Err(e) => tracing::warn!(session = %session.id, error = %e.0.message, "scheduled snapshot"),
                }
            }
        }
        prune_session(state, session, &snapshots, now).await?;
    }
    Ok(())
}

/// Destroys (or suspends, as its lifetime says) the session if it is past its maximum age;
/// returns whether it did.
async fn expire(state: &AppState, tenant: &TenantId, session: &Session, now: i64) -> AppResult<bool> {
    let Some(max_age) = session.lifetime.max_age_secs else { return Ok(false) };
    if now - session.created_at < (max_age as i64).saturating_mul(1000) {
        return Ok(false);
    }
    if session.lifetime.on_max_age == MaxAgeAction::Suspend {
        return suspend_at_max_age(state, tenant, session, max_age).await;
    }
    let message = format!("destroyed: the session reached its maximum age of {max_age} s");
    if state.store.begin_destroy(tenant, &session.id).await?.is_some() {
        state.store.record_event(&session.id, "max_age", &message).await?;
        state.activity.forget(&session.id);
        state.reconciler.wake();
    }
    Ok(true)
}

/// Suspends a session that reached its maximum age, then clears that age, so that it lives
/// on once resumed (a caller resuming it sets a new one, as E2B's `connect` does). Forced, as
/// the idle timeout's suspend is.
async fn suspend_at_max_age(state: &AppState, tenant: &TenantId, session: &Session, max_age: u64) -> AppResult<bool> {
    if session.state != SessionState::Suspended
        && let Err(e) = suspend_session(state, tenant, &session.id, true).await
    {
        // Tried again at the next tick; the other sessions' turn is not lost.
        tracing::warn!(session = %session.id, error = %e.0.message, "suspend at maximum age");
        return Ok(true);
    }
    // Read again: the suspend took a while, and a setting may have changed meanwhile.
    let Some(now) = state.store.session(tenant, &session.id).await? else { return Ok(true) };
    let lifetime = now.lifetime.updated(&UpdateSessionRequest { max_age_secs: Some(0), ..Default::default() });
    state.store.set_settings(&now.id, &now.snapshot_policy, &lifetime).await?;
    let message = format!("suspended: the session reached its maximum age of {max_age} s");
    state.store.record_event(&session.id, "max_age", &message).await?;
    Ok(true)
}

/// Suspends the session if it has been idle for its idle timeout; returns whether it tried.
async fn suspend_if_idle(
    state: &AppState,
    tenant: &TenantId,
    session: &Session,
    now: i64,
    full_unavailable_logged: &mut bool,
) -> bool {
    let Some(timeout) = session.lifetime.idle_timeout_secs else { return false };
    let idle = state.activity.idle_for(&session.id, session.updated_at, now);
    if idle.is_none_or(|idle| idle < (timeout as i64).saturating_mul(1000)) {
        return false;
    }
    if let Err(why) = state.nodes.first().checkpoint_support(session.runtime) {
        if !std::mem::replace(full_unavailable_logged, true) {
            tracing::warn!("idle sessions are not suspended: {why}");
        }
        return false;
    }
    // Forced: a blob store that is down must not keep an idle session's resources held; the
    // suspend says in an event that its snapshot stayed on its node.
    match suspend_session(state, tenant, &session.id, true).await {
        Ok(()) => {
            let message = format!("suspended after {timeout} s without activity");
            if let Err(e) = state.store.record_event(&session.id, "idle_timeout", &message).await {
                tracing::warn!(session = %session.id, error = %e, "recording the idle suspend");
            }
        }
        Err(e) => tracing::warn!(session = %session.id, error = %e.0.message, "idle suspend"),
    }
    true
}

/// Kinds whose next snapshot is due. A session that never had one counts from its creation,
/// so a new session is not snapshotted the moment it starts.
fn due_kinds(policy: &SnapshotPolicy, session: &Session, snapshots: &[Snapshot], now: i64) -> Vec<SnapshotKind> {
    [SnapshotKind::Disk, SnapshotKind::Full]
        .into_iter()
        .filter(|kind| {
            let last = snapshots.iter().filter(|s| s.kind == *kind).map(|s| s.created_at).max();
            let since = last.unwrap_or(session.created_at);
            next_due(policy, *kind, Some(since), now).is_some_and(|due| due <= now)
        })
        .collect()
}

/// What the retention policy weighs of `snapshot`: named ones and those that outlive their
/// session are kept whatever their age.
fn candidate(snapshot: &Snapshot) -> Candidate<'_> {
    let keep = snapshot.name.is_some() || snapshot.outlives_session;
    Candidate { id: snapshot.id.as_str(), created_at_ms: snapshot.created_at, kind: snapshot.kind, keep }
}

async fn prune_session(state: &AppState, session: &Session, snapshots: &[Snapshot], now: i64) -> AppResult<()> {
    let candidates: Vec<Candidate> = snapshots.iter().map(candidate).collect();
    for id in prune(&session.snapshot_policy.retention, now, &candidates) {
        let Some(snapshot) = snapshots.iter().find(|s| s.id.as_str() == id) else { continue };
        crate::durable::delete_snapshot(state, session, &snapshot.id).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(created_at: i64) -> Session {
        serde_json::from_value(serde_json::json!({
            "id": "ses_00000000000000000000", "template": "busybox", "template_version": 1, "state": "running",
            "resources": { "cpus": 1.0, "memory_mib": 512, "pids": 512 }, "env": {},
            "snapshot_policy": SnapshotPolicy::default(), "error": null, "sandbox_id": null,
            "created_at": created_at, "updated_at": created_at,
        }))
        .unwrap()
    }

    fn snapshot(kind: SnapshotKind, at: i64) -> Snapshot {
        serde_json::from_value(serde_json::json!({
            "id": "snap_00000000000000000000", "session_id": "ses_00000000000000000000", "kind": kind,
            "name": null, "parent": null, "size_bytes": 0, "created_at": at,
        }))
        .unwrap()
    }

    #[test]
    fn named_snapshots_and_those_that_outlive_their_session_are_never_pruned() {
        let policy = space_api::policy::Retention { keep_all_s: 0, tiers: Vec::new() };
        let at = |t| Snapshot { id: space_api::SnapshotId::generate(), ..snapshot(SnapshotKind::Disk, t) };
        let named = Snapshot { name: Some("n".into()), ..at(1) };
        let outliving = Snapshot { outlives_session: true, ..at(2) };
        let all = [named, outliving, at(3), at(4)];
        let candidates: Vec<Candidate> = all.iter().map(candidate).collect();
        assert_eq!(candidates.iter().map(|c| c.keep).collect::<Vec<_>>(), [true, true, false, false]);
        // A policy that keeps only the newest: the plain older one goes, the kept ones stay.
        assert_eq!(prune(&policy, 1_000_000, &candidates), [all[2].id.as_str()]);
    }

    #[test]
    fn new_sessions_wait_a_full_interval() {
        let policy = SnapshotPolicy::default();
        let s = session(1_000_000);
        assert!(due_kinds(&policy, &s, &[], 1_000_000 + 59_000).is_empty());
        assert_eq!(due_kinds(&policy, &s, &[], 1_000_000 + 60_000), vec![SnapshotKind::Disk]);
        assert_eq!(due_kinds(&policy, &s, &[], 1_000_000 + 900_000), vec![SnapshotKind::Disk, SnapshotKind::Full]);
    }

    #[test]
    fn the_last_snapshot_of_each_kind_sets_the_clock() {
        let policy = SnapshotPolicy::default();
        let s = session(0);
        let taken = [snapshot(SnapshotKind::Disk, 5_000_000), snapshot(SnapshotKind::Full, 4_500_000)];
        assert!(due_kinds(&policy, &s, &taken, 5_030_000).is_empty());
        assert_eq!(due_kinds(&policy, &s, &taken, 5_060_000), vec![SnapshotKind::Disk]);
        assert!(due_kinds(&SnapshotPolicy::off(), &s, &taken, 9_000_000_000).is_empty());
    }
}
