//! Durable snapshots (docs/control-plane.md, "Durable snapshots"): the node that took a
//! snapshot exports it to the blob store, and the export is recorded with the snapshot, so a
//! session resumes, restores or forks on any node, also once the node it ran on is lost.
//!
//! Each snapshot that leaves its node's memory has a data key of its own, sealed with the
//! session's tenant's key and recorded with the snapshot: a full snapshot's when it is taken
//! (its process images are sealed with it on the node), another's when it is exported. An
//! export is encrypted with it. The node gets the key in clear only to take, start from,
//! export or import the snapshot (docs/byok.md). A tenant key that is unavailable stops each
//! with `key_unavailable`.

use std::sync::Arc;

use space_api::durable::{ParentDisk, SnapshotExport, SnapshotKey};
use space_api::error::ErrorCode;
use space_api::{Session, SessionId, SnapshotId};
use space_node_api::{NodeApi, NodeError};

use crate::AppState;
use crate::error::{AppError, AppResult};

/// Exports `snapshot` of `session` from `node` and records it durable. `Ok(false)`: the node
/// has no blob store, so the snapshot stays on its disk (as with one node and no
/// `--blob-store`); any other failure is `blob_store_unavailable`.
pub async fn export(
    state: &AppState,
    node: &dyn NodeApi,
    session: &SessionId,
    snapshot: &SnapshotId,
) -> AppResult<bool> {
    let exporting = crate::retention::exporting(state, snapshot).await?;
    let exported = export_held(state, node, session, snapshot).await;
    exporting.end().await;
    exported
}

async fn export_held(
    state: &AppState,
    node: &dyn NodeApi,
    session: &SessionId,
    snapshot: &SnapshotId,
) -> AppResult<bool> {
    let recorded = state.store.snapshot_place(snapshot).await?.and_then(|place| place.key_sealed);
    let (key, key_sealed) = match recorded {
        Some(sealed) => (open_snapshot_key(state, session, snapshot, &sealed).await?, sealed),
        None => first_snapshot_key(state, session, snapshot).await?,
    };
    let key = (key, key_sealed.as_slice());
    let base = export_base(state, session, snapshot).await?;
    if let Some(done) = export_against(state, node, session, snapshot, base.as_ref(), &key).await? {
        return Ok(done);
    }
    // The base was deleted while the export ran (it had no other export to keep it): whole.
    match export_against(state, node, session, snapshot, None, &key).await? {
        Some(done) => Ok(done),
        None => Err(AppError::internal(format!("snapshot {snapshot}'s whole export could not be recorded"))),
    }
}

/// One export of `snapshot` against `parent`, recorded: `Some(true)` once recorded,
/// `Some(false)` when the node has no blob store, `None` when `parent` was deleted while it
/// ran, so the export names what is gone and is not recorded.
async fn export_against(
    state: &AppState,
    node: &dyn NodeApi,
    session: &SessionId,
    snapshot: &SnapshotId,
    parent: Option<&SnapshotId>,
    (key, key_sealed): &(SnapshotKey, &[u8]),
) -> AppResult<Option<bool>> {
    let export = match node.export_snapshot(session, snapshot, parent, Some(key)).await {
        Ok(export) => export,
        Err(NodeError::NoBlobStore) => return Ok(Some(false)),
        Err(e) => {
            return Err(AppError::new(
                ErrorCode::BlobStoreUnavailable,
                format!(
                    "snapshot {snapshot} could not be stored in the blob store, so it is on node {} only: {e}",
                    node.node_id()
                ),
            ));
        }
    };
    // A node that does not encrypt (an older one) would put the tenant's data in clear.
    if !export.encrypted {
        return Err(AppError::new(
            ErrorCode::BlobStoreUnavailable,
            format!(
                "node {} exported snapshot {snapshot} without encrypting it; upgrade the node (its export is not \
                 recorded, and the snapshot stays on the node only)",
                node.node_id()
            ),
        ));
    }
    if !state.store.set_snapshot_export(snapshot, &export, Some(key_sealed)).await? {
        return Ok(None);
    }
    tracing::info!(%session, %snapshot, bytes = export.size(), parent = ?export.disk.parent,
        "snapshot exported to the blob store");
    Ok(Some(true))
}

/// The snapshot whose root an export of `snapshot` goes against: the session's newest
/// durable snapshot taken before it, while its chain of incremental exports is shorter than
/// [`MAX_CHAIN`] and ends in a whole one; else none (the export goes whole). The node goes
/// whole too when it does not hold that snapshot's root.
async fn export_base(state: &AppState, session: &SessionId, snapshot: &SnapshotId) -> AppResult<Option<SnapshotId>> {
    let Some(base) = state.store.newest_durable_before(session, snapshot).await? else { return Ok(None) };
    let chain = state.store.export_chain(&base).await?;
    let ends_whole = chain.last().is_some_and(|link| link.export.disk.parent.is_none());
    Ok((ends_whole && chain.len() < MAX_CHAIN).then_some(base))
}

/// The most exports an import may have to receive for one snapshot (itself and the
/// ancestors its root was sent against): every one is fetched, checked and received on a
/// node that holds none of them, so a chain this long is ended by a whole export.
const MAX_CHAIN: usize = 8;

/// The ancestors an import of `export` may need (newest first), each with its data key
/// opened when its export is encrypted.
async fn parent_disks(state: &AppState, session: &SessionId, export: &SnapshotExport) -> AppResult<Vec<ParentDisk>> {
    let Some(parent) = &export.disk.parent else { return Ok(Vec::new()) };
    let mut parents = Vec::new();
    for link in state.store.export_chain(parent).await? {
        let key = match (&link.key_sealed, link.export.encrypted) {
            (Some(sealed), true) => Some(open_snapshot_key(state, session, &link.snapshot, sealed).await?),
            (None, true) => {
                return Err(AppError::internal(format!(
                    "snapshot {}'s export is encrypted, but no key is recorded for it",
                    link.snapshot
                )));
            }
            (_, false) => None,
        };
        parents.push(ParentDisk { snapshot: link.snapshot, disk: link.export.disk, key });
    }
    Ok(parents)
}

/// Exports a full snapshot off the call that took it (a scheduled one, one asked for, one to
/// fork from): the session runs on meanwhile, since nothing of a snapshot changes once taken,
/// and the snapshot shows `durable` once every object has landed. A node without a blob store
/// has nothing to do; a failure is logged and the snapshot stays on its node only (the next
/// full snapshot tries again).
pub fn export_in_background(state: &AppState, node: Arc<dyn NodeApi>, session: &SessionId, snapshot: &SnapshotId) {
    let (state, session, snapshot) = (state.clone(), session.clone(), snapshot.clone());
    tokio::spawn(async move {
        if let Err(e) = export(&state, node.as_ref(), &session, &snapshot).await {
            tracing::warn!(%session, %snapshot, error = %e.0.message, "a full snapshot stays on its node only");
        }
    });
}

/// The node a sandbox of `session` starts on from `snapshot` (taken of `origin`: the session
/// itself, or the parent of a fork), with the snapshot there, and the snapshot's data key
/// that the start needs (`key_unavailable` while its tenant's key is).
///
/// The session's own node, if it is placed and that node is not lost; else where the snapshot
/// is kept; otherwise placement picks one. With `leave_cordoned` (a resume or a fork: no
/// sandbox of the session is left behind), a durable snapshot does not start on a cordoned
/// node either. A node that does not hold the snapshot imports it from its export, so only a
/// durable snapshot can start elsewhere.
pub async fn node_for_snapshot(
    state: &AppState,
    session: &Session,
    origin: &Session,
    snapshot: &SnapshotId,
    leave_cordoned: bool,
) -> AppResult<(Arc<dyn NodeApi>, Option<SnapshotKey>)> {
    let place = state.store.snapshot_place(snapshot).await?.ok_or_else(|| {
        AppError::new(
            ErrorCode::SnapshotNotFound,
            format!("snapshot {snapshot} was deleted before the sandbox started"),
        )
    })?;
    let key = match &place.key_sealed {
        Some(sealed) => Some(open_snapshot_key(state, &origin.id, snapshot, sealed).await?),
        None => None,
    };
    let lost = crate::placement::lost_nodes(state).await?;
    // A cordoned node keeps what cannot leave it; a durable snapshot leaves it (a drain).
    let cordoned = match leave_cordoned && place.export.is_some() {
        true => crate::placement::cordoned_nodes(state).await?,
        false => Default::default(),
    };
    let usable = |id: &String| state.nodes.find(id).filter(|_| !lost.contains(id) && !cordoned.contains(id)).cloned();
    let kept_on = place.node_id.clone().or_else(|| origin.node.clone());
    let target = match start_on(session.node.as_ref().and_then(usable), kept_on.as_ref().and_then(usable)) {
        Some(node) => node,
        None => crate::placement::place(state, session).await?,
    };
    let target_id = target.node_id();
    if kept_on.as_deref() == Some(target_id.as_str()) {
        return Ok((target, key));
    }
    let Some(export) = place.export else {
        return Err(not_durable(snapshot, kept_on.as_deref(), &lost, &target_id, session));
    };
    if export.encrypted && key.is_none() {
        return Err(AppError::internal(format!(
            "snapshot {snapshot}'s export is encrypted, but no key is recorded for it"
        )));
    }
    let parents = parent_disks(state, &origin.id, &export).await?;
    let key_for = key.as_ref().filter(|_| export.encrypted);
    match target.import_snapshot(&origin.id, snapshot, &export, key_for, &parents).await {
        Ok(()) => Ok((target, key)),
        Err(NodeError::Corrupt(why)) => Err(corrupt(state, origin, snapshot, &why).await),
        Err(e) => Err(e.into()),
    }
}

/// Deletes snapshot `snapshot` of `session`: its row, then its copies on the node it was taken
/// on and on the session's node (which imported it to resume, restore or fork there). A copy
/// left behind (its node down, failing or not driven here) has no row, so it is an orphan,
/// which that node's sweep removes when it next starts. Returns why a copy was left, if one was.
pub async fn delete_snapshot(state: &AppState, session: &Session, snapshot: &SnapshotId) -> AppResult<Option<String>> {
    let taken_on = state.store.snapshot_place(snapshot).await?.and_then(|place| place.node_id);
    state.store.delete_snapshot_row(snapshot).await?;
    let mut holders: Vec<String> = taken_on.into_iter().chain(session.node.clone()).collect();
    holders.dedup();
    let mut left = None;
    for id in holders {
        let deleted = match state.nodes.find(&id) {
            Some(node) => node.delete_snapshot(&session.id, snapshot).await.map_err(|e| e.to_string()),
            None => Err("the node is not driven by this control plane".to_owned()),
        };
        if let Err(why) = deleted {
            tracing::warn!(%snapshot, node = %id, error = %why, "a deleted snapshot's copy stays until the node's sweep");
            left = Some(format!("snapshot {snapshot} stays on node {id} until its sweep: {why}"));
        }
    }
    Ok(left)
}

/// Associated data that binds a sealed snapshot key to its snapshot (named for exports, for
/// which such keys were first made: keys sealed then must still open).
pub fn snapshot_key_owner(session: &SessionId, snapshot: &SnapshotId) -> String {
    format!("snapshot-export/{session}/{snapshot}")
}

/// A fresh data key for `snapshot` of `session`, and the key sealed with `tenant`'s key
/// (`key_unavailable` when that is).
pub async fn new_snapshot_key(
    state: &AppState,
    tenant: &space_api::TenantId,
    session: &SessionId,
    snapshot: &SnapshotId,
) -> AppResult<(SnapshotKey, Vec<u8>)> {
    let key = space_keys::data_key().map_err(crate::keyring::key_error)?;
    let sealed = state.keys.seal(tenant, &key[..], &snapshot_key_owner(session, snapshot)).await?;
    Ok((SnapshotKey::new(*key), sealed))
}

/// A data key for a snapshot that has none (a disk snapshot being exported), recorded before
/// the export, so that every export of it uses one key: the one recorded first.
async fn first_snapshot_key(
    state: &AppState,
    session: &SessionId,
    snapshot: &SnapshotId,
) -> AppResult<(SnapshotKey, Vec<u8>)> {
    let tenant = state.store.session_any(session).await?;
    let tenant = tenant.ok_or_else(|| AppError::session_not_found(session.as_str()))?.tenant_id;
    let (key, sealed) = new_snapshot_key(state, &tenant, session, snapshot).await?;
    match state.store.record_snapshot_key(snapshot, &sealed).await? {
        Some(kept) if kept == sealed => Ok((key, sealed)),
        Some(kept) => Ok((open_snapshot_key(state, session, snapshot, &kept).await?, kept)),
        None => Err(AppError::new(
            ErrorCode::SnapshotNotFound,
            format!("snapshot {snapshot} was deleted before its export began"),
        )),
    }
}

/// A snapshot's recorded data key, unsealed (`key_unavailable` when its tenant's key is).
async fn open_snapshot_key(
    state: &AppState,
    session: &SessionId,
    snapshot: &SnapshotId,
    sealed: &[u8],
) -> AppResult<SnapshotKey> {
    let opened = state
        .keys
        .open(sealed, &snapshot_key_owner(session, snapshot))
        .await
        .map_err(|e| AppError::new(e.0.code, format!("the key of snapshot {snapshot}: {}", e.0.message)))?;
    let bytes: [u8; 32] =
        opened[..].try_into().map_err(|_| AppError::internal(format!("snapshot {snapshot}'s key is not 32 bytes")))?;
    Ok(SnapshotKey::new(bytes))
}

/// Of the nodes that can be reached, the one a sandbox starts on from a snapshot: the
/// session's own (its other snapshots are there), else the one that keeps the snapshot (so
/// nothing is imported; also when the session's own node is lost), else none: placement
/// picks one, which imports the snapshot.
fn start_on<N>(own: Option<N>, keeper: Option<N>) -> Option<N> {
    own.or(keeper)
}

/// Why a snapshot that lives on one node's disk only cannot start on `target`.
fn not_durable(
    snapshot: &SnapshotId,
    kept_on: Option<&str>,
    lost: &std::collections::HashSet<String>,
    target: &str,
    session: &Session,
) -> AppError {
    let kept_on = kept_on.unwrap_or("(unknown)");
    if lost.contains(kept_on) {
        return AppError::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "snapshot {snapshot} is on node {kept_on}, which is lost (`space node list`), and is not durable (its \
                 node has no blob store): it can be used again once node {kept_on} is back"
            ),
        );
    }
    AppError::new(
        ErrorCode::Conflict,
        format!(
            "snapshot {snapshot} is kept on node {kept_on} and session {} runs on node {target}, and it is not \
             durable (no blob store): restore one of the session's own snapshots, or fork a new session from this one",
            session.id
        ),
    )
}

/// `snapshot_corrupt`, naming the newest older durable snapshot of the session to use instead:
/// one whose import does not need the link that failed (the snapshot itself, or the ancestor
/// the node's message names).
async fn corrupt(state: &AppState, origin: &Session, snapshot: &SnapshotId, why: &str) -> AppError {
    let chain = state.store.export_chain(snapshot).await.unwrap_or_default();
    let bad = chain.iter().map(|link| &link.snapshot).find(|id| *id != snapshot && why.contains(id.as_str()));
    let bad = bad.unwrap_or(snapshot).clone();
    let mut older = None;
    if let Ok(list) = state.store.list_snapshots(&origin.id).await {
        let before = list.iter().position(|s| s.id == *snapshot).unwrap_or(list.len());
        for candidate in list[..before].iter().rev().filter(|s| s.durable) {
            let needs = state.store.export_chain(&candidate.id).await.unwrap_or_default();
            if !needs.iter().any(|link| link.snapshot == bad) {
                older = Some(candidate.id.clone());
                break;
            }
        }
    }
    let instead = match older {
        Some(id) => format!("restore the older durable snapshot {id} instead"),
        None => "the session has no older durable snapshot".to_owned(),
    };
    AppError::new(
        ErrorCode::SnapshotCorrupt,
        format!("snapshot {snapshot} was not restored: its copy in the blob store is corrupt ({why}); {instead}"),
    )
}

#[cfg(test)]
mod tests {
    use super::start_on;

    #[test]
    fn a_sandbox_starts_on_its_own_node_else_where_the_snapshot_is_else_where_placed() {
        assert_eq!(start_on(Some("own"), Some("keeper")), Some("own"));
        // A fork (never placed), and a session whose own node is lost, go where the snapshot
        // is kept while that node can be reached: nothing has to be imported.
        assert_eq!(start_on(None, Some("keeper")), Some("keeper"));
        assert_eq!(start_on(Some("own"), None), Some("own"));
        assert_eq!(start_on::<&str>(None, None), None);
    }
}
