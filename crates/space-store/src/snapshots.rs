//! Snapshot rows. A row is written in `creating` before the snapshot is taken and becomes
//! `ready` once every artifact is on disk; only ready snapshots are listed or restorable.

use std::collections::HashMap;

use space_api::durable::SnapshotExport;
use space_api::{SessionId, SessionState, Snapshot, SnapshotId, SnapshotKind, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{QuotaExceeded, QuotaLimit, Result, Store, StoreError, now_ms, parse};

/// What [`Store::insert_snapshot`] records.
#[derive(Debug, Clone)]
pub struct NewSnapshot {
    pub id: SnapshotId,
    pub session_id: SessionId,
    pub tenant_id: TenantId,
    pub kind: SnapshotKind,
    pub name: Option<String>,
    /// Kept when its session is destroyed, and never pruned (see [`Snapshot::outlives_session`]).
    pub outlives_session: bool,
    /// The node it is taken on.
    pub node_id: String,
    /// Its data key, sealed (a full snapshot's process images are sealed with it on its node;
    /// its export is encrypted with it).
    pub key_sealed: Option<Vec<u8>>,
}

/// Where a snapshot is: the node it was taken on (`None` for one taken before snapshots
/// recorded it: its session's node), and its export if it is durable.
#[derive(Debug, Clone)]
pub struct SnapshotPlace {
    pub node_id: Option<String>,
    pub export: Option<SnapshotExport>,
    /// The snapshot's data key, sealed: recorded when a full snapshot is taken (its process
    /// images are sealed with it) or when it is exported (an encrypted export has one).
    pub key_sealed: Option<Vec<u8>>,
}

/// `durable` is a number both backends decode alike, as `outlives_session` is stored.
const COLUMNS: &str = "id, session_id, kind, name, parent, size_bytes, created_at, CAST(CASE WHEN export IS NULL THEN 0 ELSE 1 END AS BIGINT), outlives_session";
/// `size_bytes` of a snapshot not measured yet.
const UNMEASURED: i64 = -1;

fn snapshot_from_row(row: &AnyRow) -> Result<Snapshot> {
    let kind: &str = row.get(2);
    let parent: Option<&str> = row.get(4);
    Ok(Snapshot {
        id: parse("snapshot id", row.get::<&str, _>(0))?,
        session_id: parse("session id", row.get::<&str, _>(1))?,
        kind: SnapshotKind::parse(kind).ok_or_else(|| StoreError::Corrupt(format!("snapshot kind {kind}")))?,
        name: row.get(3),
        parent: parent.map(|p| parse("snapshot id", p)).transpose()?,
        size_bytes: u64::try_from(row.get::<i64, _>(5)).ok(),
        exclusive_bytes: None,
        created_at: row.get(6),
        durable: row.get::<i64, _>(7) != 0,
        outlives_session: row.get::<i64, _>(8) != 0,
    })
}

impl Store {
    /// Records a snapshot about to be taken; its parent is the session's newest ready one. One
    /// that outlives its session is refused (`QuotaExceeded`, nothing written) when its tenant
    /// already keeps `max_kept` such snapshots: counted in the write transaction, so that
    /// concurrent snapshots cannot go over together.
    pub async fn insert_snapshot(&self, new: &NewSnapshot, max_kept: u64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        if new.outlives_session {
            let kept: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM snapshots WHERE tenant_id = $1 AND outlives_session = 1")
                    .bind(new.tenant_id.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
            let kept = u64::try_from(kept).unwrap_or(0);
            if kept >= max_kept {
                return Err(StoreError::QuotaExceeded(QuotaExceeded {
                    tenant: new.tenant_id.to_string(),
                    limit: QuotaLimit::KeptSnapshots,
                    max: max_kept,
                    in_use: kept,
                    requested: 1,
                }));
            }
        }
        let parent: Option<String> = sqlx::query_scalar(
            "SELECT id FROM snapshots WHERE session_id = $1 AND state = 'ready' ORDER BY created_at DESC, id LIMIT 1",
        )
        .bind(new.session_id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO snapshots (id, session_id, tenant_id, kind, name, parent, state, size_bytes, created_at, node_id, outlives_session, export_key_sealed)
             VALUES ($1, $2, $3, $4, $5, $6, 'creating', 0, $7, $8, $9, $10)",
        )
        .bind(new.id.as_str())
        .bind(new.session_id.as_str())
        .bind(new.tenant_id.as_str())
        .bind(new.kind.as_str())
        .bind(&new.name)
        .bind(parent)
        .bind(now_ms())
        .bind(&new.node_id)
        .bind(i64::from(new.outlives_session))
        .bind(new.key_sealed.as_deref())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Marks a snapshot usable; a size of `None` (stored as -1: the column predates it and
    /// is NOT NULL) is filled in later with [`Store::set_snapshot_size`].
    pub async fn set_snapshot_ready(&self, id: &SnapshotId, size_bytes: Option<u64>) -> Result<()> {
        sqlx::query("UPDATE snapshots SET state = 'ready', size_bytes = $1 WHERE id = $2")
            .bind(size_bytes.map_or(UNMEASURED, |s| s as i64))
            .bind(id.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn set_snapshot_size(&self, id: &SnapshotId, size_bytes: u64) -> Result<()> {
        sqlx::query("UPDATE snapshots SET size_bytes = $1 WHERE id = $2")
            .bind(size_bytes as i64)
            .bind(id.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Records `key_sealed` as the snapshot's data key unless it has one already (another
    /// export of it recorded one first); the key it has then, `None` if it is gone.
    pub async fn record_snapshot_key(&self, id: &SnapshotId, key_sealed: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut tx = self.write_tx().await?;
        sqlx::query("UPDATE snapshots SET export_key_sealed = COALESCE(export_key_sealed, $1) WHERE id = $2")
            .bind(key_sealed)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let kept: Option<Option<Vec<u8>>> = sqlx::query_scalar("SELECT export_key_sealed FROM snapshots WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(kept.flatten())
    }

    /// Where a ready snapshot is, if it exists.
    pub async fn snapshot_place(&self, id: &SnapshotId) -> Result<Option<SnapshotPlace>> {
        let row =
            sqlx::query("SELECT node_id, export, export_key_sealed FROM snapshots WHERE id = $1 AND state = 'ready'")
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await?;
        let Some(row) = row else { return Ok(None) };
        let export = row
            .get::<Option<&str>, _>(1)
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("export of snapshot {id}: {e}")))?;
        Ok(Some(SnapshotPlace { node_id: row.get(0), export, key_sealed: row.get(2) }))
    }

    /// The session's ready snapshots, oldest first.
    pub async fn list_snapshots(&self, session: &SessionId) -> Result<Vec<Snapshot>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE session_id = $1 AND state = 'ready' ORDER BY created_at, id"
        );
        let rows = sqlx::query(&sql).bind(session.as_str()).fetch_all(&self.pool).await?;
        rows.iter().map(snapshot_from_row).collect()
    }

    /// The ready snapshots of every session in one of `states`, by session, each list as
    /// [`Store::list_snapshots`] orders it. A snapshot taken after the sessions were read may
    /// be missing; one of a session that left those states may be present.
    pub async fn snapshots_of_sessions_in_states(
        &self,
        states: &[SessionState],
    ) -> Result<HashMap<SessionId, Vec<Snapshot>>> {
        let list = states.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE state = 'ready' \
             AND session_id IN (SELECT id FROM sessions WHERE state IN ({list})) ORDER BY created_at, id"
        );
        let mut by_session: HashMap<SessionId, Vec<Snapshot>> = HashMap::new();
        for row in sqlx::query(&sql).fetch_all(&self.pool).await? {
            let snapshot = snapshot_from_row(&row)?;
            by_session.entry(snapshot.session_id.clone()).or_default().push(snapshot);
        }
        Ok(by_session)
    }

    /// The tenant's ready snapshots that outlive their sessions, of sessions destroyed or
    /// being destroyed, oldest first.
    pub async fn outliving_snapshots(&self, tenant: &TenantId) -> Result<Vec<Snapshot>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE tenant_id = $1 AND state = 'ready' AND outlives_session = 1 \
             AND session_id IN (SELECT id FROM sessions WHERE tenant_id = $1 \
             AND state IN ('destroyed', 'destroying')) ORDER BY created_at, id"
        );
        let rows = sqlx::query(&sql).bind(tenant.as_str()).fetch_all(&self.pool).await?;
        rows.iter().map(snapshot_from_row).collect()
    }

    /// A ready snapshot of the tenant's, whichever session it belongs to.
    pub async fn snapshot(&self, tenant: &TenantId, id: &SnapshotId) -> Result<Option<Snapshot>> {
        let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = $1 AND tenant_id = $2 AND state = 'ready'");
        let row = sqlx::query(&sql).bind(id.as_str()).bind(tenant.as_str()).fetch_optional(&self.pool).await?;
        row.as_ref().map(snapshot_from_row).transpose()
    }

    /// The session a snapshot belongs to (any tenant: for the node, which names paths by it).
    pub async fn snapshot_session(&self, id: &SnapshotId) -> Result<Option<SessionId>> {
        let session: Option<String> = sqlx::query_scalar("SELECT session_id FROM snapshots WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        session.map(|s| parse("session id", &s)).transpose()
    }

    /// Every recorded export, of any snapshot in any state: what the blob store must keep.
    pub async fn all_snapshot_exports(&self) -> Result<Vec<SnapshotExport>> {
        let rows: Vec<String> =
            sqlx::query_scalar("SELECT export FROM snapshots WHERE export IS NOT NULL").fetch_all(&self.pool).await?;
        rows.iter()
            .map(|json| serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("snapshot export: {e}"))))
            .collect()
    }

    /// Snapshots of any state but retired (a retired one is its export only: no node keeps
    /// it), for the start-up sweep: (session, snapshot, ready).
    pub async fn all_snapshots(&self) -> Result<Vec<(SessionId, SnapshotId, bool)>> {
        let rows = sqlx::query("SELECT session_id, id, state FROM snapshots WHERE state <> 'retired'")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let ready = r.get::<&str, _>(2) == "ready";
                Ok((parse("session id", r.get::<&str, _>(0))?, parse("snapshot id", r.get::<&str, _>(1))?, ready))
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_store;

    /// A session of `tenant`, recorded.
    pub(crate) async fn session_of(store: &Store, tenant: &TenantId) -> SessionId {
        let session = SessionId::generate();
        let new = crate::NewSession {
            id: session.clone(),
            tenant_id: tenant.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: Default::default(),
            env: Default::default(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: space_api::SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        };
        store.insert_session(&new).await.unwrap();
        session
    }

    /// A disk snapshot of `session` to record.
    pub(crate) fn disk(
        session: &SessionId,
        tenant: &TenantId,
        name: Option<&str>,
        outlives_session: bool,
    ) -> NewSnapshot {
        NewSnapshot {
            id: SnapshotId::generate(),
            session_id: session.clone(),
            tenant_id: tenant.clone(),
            kind: SnapshotKind::Disk,
            name: name.map(str::to_owned),
            outlives_session,
            node_id: "node-a".into(),
            key_sealed: None,
        }
    }

    #[tokio::test]
    async fn snapshots_that_outlive_their_session_are_listed_once_it_is_destroyed() {
        let (store, _dir) = test_store().await;
        let tenant = store.ensure_tenant("a").await.unwrap();
        let session = session_of(&store, &tenant).await;
        let (kept, plain) = (disk(&session, &tenant, None, true), disk(&session, &tenant, None, false));
        for new in [&kept, &plain] {
            store.insert_snapshot(new, u64::MAX).await.unwrap();
            store.set_snapshot_ready(&new.id, Some(1)).await.unwrap();
        }
        let flags: Vec<bool> =
            store.list_snapshots(&session).await.unwrap().iter().map(|s| s.outlives_session).collect();
        assert_eq!(flags.iter().filter(|f| **f).count(), 1, "{flags:?}");
        assert!(store.outliving_snapshots(&tenant).await.unwrap().is_empty(), "a live session's are listed with it");
        assert!(store.transition(&session, &[SessionState::Creating], SessionState::Destroyed, None).await.unwrap());
        let outliving = store.outliving_snapshots(&tenant).await.unwrap();
        assert_eq!(outliving.iter().map(|s| &s.id).collect::<Vec<_>>(), [&kept.id]);
        let other = store.ensure_tenant("b").await.unwrap();
        assert!(store.outliving_snapshots(&other).await.unwrap().is_empty(), "another tenant sees them");
    }

    /// However many arrive together, a tenant's kept snapshots stop at the bound; others
    /// (and another tenant's) are not counted against it.
    #[tokio::test]
    async fn kept_snapshots_stop_at_the_bound_also_when_taken_together() {
        let (store, _dir) = test_store().await;
        let tenant = store.ensure_tenant("a").await.unwrap();
        let session = session_of(&store, &tenant).await;
        let attempts = (0..8).map(|_| {
            let (store, new) = (&store, disk(&session, &tenant, None, true));
            async move { store.insert_snapshot(&new, 3).await }
        });
        let results = futures::future::join_all(attempts).await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3, "{results:?}");
        for refused in results.iter().filter_map(|r| r.as_ref().err()) {
            let StoreError::QuotaExceeded(over) = refused else { panic!("{refused:?}") };
            assert_eq!((over.limit, over.max, over.in_use), (QuotaLimit::KeptSnapshots, 3, 3));
        }
        store.insert_snapshot(&disk(&session, &tenant, None, false), 3).await.unwrap();
        let other = store.ensure_tenant("b").await.unwrap();
        let theirs = session_of(&store, &other).await;
        store.insert_snapshot(&disk(&theirs, &other, None, true), 3).await.unwrap();
    }

    /// A destroyed session's CA key is opened again by a fork from a snapshot that outlived
    /// it, so a move to another tenant key must re-seal it, until that snapshot is deleted.
    #[tokio::test]
    async fn a_destroyed_sessions_ca_key_stays_sealed_while_a_snapshot_outlives_it() {
        let (store, _dir) = test_store().await;
        let tenant = store.ensure_tenant("a").await.unwrap();
        let session = session_of(&store, &tenant).await;
        store.set_session_ca_if_missing(&session, "cert", &[7]).await.unwrap();
        let kept = disk(&session, &tenant, None, true);
        store.insert_snapshot(&kept, u64::MAX).await.unwrap();
        store.set_snapshot_ready(&kept.id, Some(1)).await.unwrap();
        assert!(store.transition(&session, &[SessionState::Creating], SessionState::Destroyed, None).await.unwrap());
        let sealed_ca = |values: Vec<crate::SealedValue>| {
            values.iter().any(|v| matches!(&v.owner, crate::SealedOwner::SessionCa { session: s } if *s == session))
        };
        assert!(sealed_ca(store.tenant_sealed_values(&tenant).await.unwrap()), "the tenant's list");
        assert!(sealed_ca(store.sealed_values().await.unwrap()), "the start-up check's list");
        store.delete_snapshot_row(&kept.id).await.unwrap();
        assert!(!sealed_ca(store.tenant_sealed_values(&tenant).await.unwrap()), "nothing opens it any more");
        assert!(!sealed_ca(store.sealed_values().await.unwrap()));
    }

    #[tokio::test]
    async fn snapshots_chain_and_only_ready_ones_show() {
        let (store, _dir) = test_store().await;
        let tenant = store.ensure_tenant("a").await.unwrap();
        let session = session_of(&store, &tenant).await;
        let snap = |name: Option<&str>| disk(&session, &tenant, name, false);
        let first = snap(Some("before"));
        store.insert_snapshot(&first, u64::MAX).await.unwrap();
        assert!(store.list_snapshots(&session).await.unwrap().is_empty(), "a creating snapshot is listed");
        store.set_snapshot_ready(&first.id, None).await.unwrap();
        assert_eq!(store.list_snapshots(&session).await.unwrap()[0].size_bytes, None);
        store.set_snapshot_size(&first.id, 42).await.unwrap();
        // A full snapshot's key is recorded with its row, before it is taken.
        let second = NewSnapshot { kind: SnapshotKind::Full, key_sealed: Some(vec![4]), ..snap(None) };
        store.insert_snapshot(&second, u64::MAX).await.unwrap();
        store.set_snapshot_ready(&second.id, Some(7)).await.unwrap();
        assert_eq!(store.snapshot_place(&second.id).await.unwrap().unwrap().key_sealed, Some(vec![4]));
        // Re-wrapped while it was exported: the export's end keeps the re-wrapped key.
        let owner = crate::SealedOwner::SnapshotKey { session: session.clone(), snapshot: second.id.clone() };
        assert!(store.replace_sealed(&owner, &[4], &[5]).await.unwrap());
        let list = store.list_snapshots(&session).await.unwrap();
        assert_eq!(list.len(), 2);
        // Read for every session in some states at once, as the schedule does.
        let by_session = store.snapshots_of_sessions_in_states(&[SessionState::Creating]).await.unwrap();
        let ids = |l: &[Snapshot]| l.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!((by_session.len(), by_session.get(&session).map(|l| ids(l))), (1, Some(ids(&list))));
        assert!(store.snapshots_of_sessions_in_states(&[SessionState::Running]).await.unwrap().is_empty());
        // Looked up by id: two snapshots taken in the same millisecond list in id order.
        let listed = |id: &SnapshotId| list.iter().find(|s| s.id == *id).expect("listed");
        assert_eq!(listed(&second.id).parent.as_ref(), Some(&first.id));
        assert_eq!((listed(&first.id).name.as_deref(), listed(&first.id).size_bytes), (Some("before"), Some(42)));
        let other = store.ensure_tenant("b").await.unwrap();
        assert!(store.snapshot(&other, &first.id).await.unwrap().is_none(), "another tenant sees it");
        let blob = |b: u8| space_api::durable::BlobRef { sha256: format!("{b:02x}").repeat(32), size: 1 };
        let export = SnapshotExport {
            disk: space_api::durable::DiskExport { stream: blob(1), parent: None },
            images: Vec::new(),
            spaced: Some(blob(2)),
            encrypted: true,
        };
        store.set_snapshot_export(&second.id, &export, Some(&[4])).await.unwrap();
        assert_eq!(store.snapshot_place(&second.id).await.unwrap().unwrap().key_sealed, Some(vec![5]));
        // A snapshot without a key gets the first one recorded; later ones get that one back.
        assert_eq!(store.record_snapshot_key(&first.id, &[6]).await.unwrap(), Some(vec![6]));
        assert_eq!(store.record_snapshot_key(&first.id, &[7]).await.unwrap(), Some(vec![6]));
        assert_eq!(store.record_snapshot_key(&SnapshotId::generate(), &[8]).await.unwrap(), None);
        assert_eq!(store.all_snapshot_exports().await.unwrap(), [export]);
        store.delete_snapshot_row(&first.id).await.unwrap();
        assert_eq!(store.all_snapshots().await.unwrap().len(), 1);
        store.delete_snapshot_row(&second.id).await.unwrap();
        assert!(store.all_snapshot_exports().await.unwrap().is_empty(), "a deleted snapshot keeps nothing");
    }
}
