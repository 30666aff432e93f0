//! What a session uses: its sandbox's memory, CPU and processes, its disk, and what each
//! snapshot alone keeps on disk.

use axum::Extension;
use axum::extract::State;
use space_api::{DiskStats, ErrorBody, NetworkUsage, SandboxUsage, SessionState, SessionStats, Snapshot};

use super::find_session;
use super::lifecycle::find_snapshot;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, AppResult};

/// The session's current usage: its sandbox's memory (now and at its peak), CPU time and
/// processes; its disk (root and snapshots) against the limit it was created with; and the
/// bytes it sent and received through the egress gateway.
#[utoipa::path(get, path = "/v1/sessions/{id}/stats", params(("id" = String, Path)),
    responses((status = 200, body = SessionStats), (status = 404, body = ErrorBody)))]
pub async fn session_stats(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<SessionStats>> {
    let session = find_session(&state, &caller, &id).await?;
    let running = matches!(session.state, SessionState::Running | SessionState::Paused);
    let Ok(node) = state.nodes.of(&session) else { return Ok(ApiJson(unplaced_stats(&session))) };
    // A sandbox that went away meanwhile just has no usage to report.
    let sandbox = match session.sandbox_id.as_ref().filter(|_| running) {
        Some(s) => node.sandbox_stats(s).await.ok(),
        None => None,
    };
    let sandbox = sandbox.map(|s| SandboxUsage {
        memory_bytes: s.memory_bytes,
        memory_peak_bytes: s.memory_peak_bytes,
        memory_limit_bytes: s.memory_limit_bytes,
        oom_kills: s.oom_kills,
        pids: s.pids,
        cpu_usage_ns: s.cpu_usage_ns,
    });
    let used = node.disk_usage(&session.id).await?;
    let snapshots = state.store.list_snapshots(&session.id).await?;
    let disk = DiskStats {
        used_bytes: used.used_bytes,
        limit_bytes: session.resources.disk_limit_bytes(),
        enforced: used.enforced,
        snapshots: snapshots.len() as u64,
        snapshot_bytes: snapshots.iter().filter_map(|s| s.size_bytes).sum(),
    };
    let traffic = node.session_traffic(&session.id).await.unwrap_or_default();
    let network = NetworkUsage { bytes_out: traffic.bytes_out, bytes_in: traffic.bytes_in };
    Ok(ApiJson(SessionStats { sandbox, disk, network }))
}

/// A session on no node yet (being created) has used nothing.
fn unplaced_stats(session: &space_api::Session) -> SessionStats {
    let disk = DiskStats {
        used_bytes: 0,
        limit_bytes: session.resources.disk_limit_bytes(),
        enforced: false,
        snapshots: 0,
        snapshot_bytes: 0,
    };
    SessionStats { sandbox: None, disk, network: NetworkUsage { bytes_out: 0, bytes_in: 0 } }
}

/// One snapshot, with `exclusive_bytes` measured now (every file of the snapshot is read:
/// this takes a moment for large trees).
#[utoipa::path(get, path = "/v1/sessions/{id}/snapshots/{snapshot}", params(("id" = String, Path), ("snapshot" = String, Path)),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody)))]
pub async fn get_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, snapshot)): ApiPath<(String, String)>,
) -> AppResult<ApiJson<Snapshot>> {
    let session = find_session(&state, &caller, &id).await?;
    let mut snapshot = find_snapshot(&state, &caller, &session.id, &snapshot).await?;
    snapshot.exclusive_bytes =
        Some(state.nodes.of(&session)?.snapshot_exclusive_size(&session.id, &snapshot.id).await?);
    Ok(ApiJson(snapshot))
}
