//! Chains of incremental exports (docs/control-plane.md, "Durable snapshots"): a snapshot's
//! root may go to the blob store as a stream against an older durable snapshot of its
//! session, so importing it needs that parent's root first, and the parent's parent's, back
//! to a whole stream. A parent's export is therefore kept while a recorded export names it:
//! deleting a snapshot that an export still needs only retires it (state `retired`: hidden
//! from every list and lookup, its export and data key kept, no longer counted as kept), and
//! the deletion that frees a retired snapshot deletes it too.

use space_api::durable::SnapshotExport;
use space_api::{SessionId, SnapshotId};
use sqlx::Row;

use crate::{Result, Store, StoreError, parse};

/// A snapshot's export and sealed data key, as an import of it or of a descendant needs.
#[derive(Debug, Clone)]
pub struct ChainLink {
    pub snapshot: SnapshotId,
    pub export: SnapshotExport,
    pub key_sealed: Option<Vec<u8>>,
}

/// The most links [`Store::export_chain`] walks: a guard against a loop in a damaged
/// database (the control plane keeps chains far shorter).
const MAX_WALK: usize = 64;

type Tx = sqlx::Transaction<'static, sqlx::Any>;

impl Store {
    /// Records that the snapshot is durable: every part of it is in the blob store, encrypted
    /// with the data key `key_sealed` holds when there is one. A key recorded already (the
    /// snapshot's own, which the export used) is kept as it is: a tenant key change may have
    /// re-wrapped it while the export ran. An export against a parent is recorded only while
    /// the parent's export is (the parent may have been deleted during the export):
    /// `Ok(false)`, and nothing recorded, otherwise.
    pub async fn set_snapshot_export(
        &self,
        id: &SnapshotId,
        export: &SnapshotExport,
        key_sealed: Option<&[u8]>,
    ) -> Result<bool> {
        let json = serde_json::to_string(export).map_err(|e| StoreError::Corrupt(format!("snapshot export: {e}")))?;
        let parent = export.disk.parent.as_ref().map(SnapshotId::as_str);
        let mut tx = self.write_tx().await?;
        if let Some(parent) = parent {
            let kept: Option<String> =
                sqlx::query_scalar("SELECT id FROM snapshots WHERE id = $1 AND export IS NOT NULL")
                    .bind(parent)
                    .fetch_optional(&mut *tx)
                    .await?;
            if kept.is_none() {
                return Ok(false);
            }
        }
        let before = export_parent(&mut tx, id.as_str()).await?;
        sqlx::query(
            "UPDATE snapshots SET export = $1, export_parent = $2, export_key_sealed = COALESCE(export_key_sealed, $3) \
             WHERE id = $4",
        )
        .bind(json)
        .bind(parent)
        .bind(key_sealed)
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        // A snapshot exported anew against another parent (or whole) may free its old one.
        if before.as_deref() != parent {
            delete_unneeded(&mut tx, before).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The session's newest ready durable snapshot taken before `before`: what an export of
    /// `before` goes against.
    pub async fn newest_durable_before(&self, session: &SessionId, before: &SnapshotId) -> Result<Option<SnapshotId>> {
        let id: Option<String> = sqlx::query_scalar(
            "SELECT s.id FROM snapshots s, snapshots b WHERE b.id = $2 AND s.session_id = $1 \
             AND s.state = 'ready' AND s.export IS NOT NULL \
             AND (s.created_at < b.created_at OR (s.created_at = b.created_at AND s.id < b.id)) \
             ORDER BY s.created_at DESC, s.id DESC LIMIT 1",
        )
        .bind(session.as_str())
        .bind(before.as_str())
        .fetch_optional(&self.pool)
        .await?;
        id.map(|id| parse("snapshot id", &id)).transpose()
    }

    /// The snapshot's export and key, then its parent's, and so on up to a whole stream: of
    /// any state, retired ones included. Empty when the snapshot is not durable; it ends
    /// early at a parent that is gone (the import that needs it then fails, naming it).
    pub async fn export_chain(&self, snapshot: &SnapshotId) -> Result<Vec<ChainLink>> {
        let mut chain = Vec::new();
        let mut next = Some(snapshot.clone());
        while let Some(id) = next.take().filter(|_| chain.len() < MAX_WALK) {
            let row =
                sqlx::query("SELECT export, export_key_sealed FROM snapshots WHERE id = $1 AND export IS NOT NULL")
                    .bind(id.as_str())
                    .fetch_optional(&self.pool)
                    .await?;
            let Some(row) = row else { break };
            let export: SnapshotExport = serde_json::from_str(row.get::<&str, _>(0))
                .map_err(|e| StoreError::Corrupt(format!("export of snapshot {id}: {e}")))?;
            next = export.disk.parent.clone();
            chain.push(ChainLink { snapshot: id, export, key_sealed: row.get(1) });
        }
        Ok(chain)
    }

    /// Deletes a snapshot's row, or retires it while a recorded export was sent against it;
    /// then deletes the retired snapshots up its chain that nothing needs any more.
    pub async fn delete_snapshot_row(&self, id: &SnapshotId) -> Result<()> {
        let mut tx = self.write_tx().await?;
        if needed(&mut tx, id.as_str()).await? {
            sqlx::query("UPDATE snapshots SET state = 'retired', outlives_session = 0 WHERE id = $1")
                .bind(id.as_str())
                .execute(&mut *tx)
                .await?;
        } else {
            let parent = export_parent(&mut tx, id.as_str()).await?;
            sqlx::query("DELETE FROM snapshots WHERE id = $1").bind(id.as_str()).execute(&mut *tx).await?;
            delete_unneeded(&mut tx, parent).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Whether a recorded export was sent against snapshot `id`.
async fn needed(tx: &mut Tx, id: &str) -> Result<bool> {
    let child: Option<String> = sqlx::query_scalar("SELECT id FROM snapshots WHERE export_parent = $1 LIMIT 1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(child.is_some())
}

async fn export_parent(tx: &mut Tx, id: &str) -> Result<Option<String>> {
    let parent: Option<Option<String>> = sqlx::query_scalar("SELECT export_parent FROM snapshots WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(parent.flatten())
}

/// Deletes retired snapshot `from` if nothing needs it any more, and so on up its chain.
async fn delete_unneeded(tx: &mut Tx, mut from: Option<String>) -> Result<()> {
    for _ in 0..MAX_WALK {
        let Some(id) = from.take() else { break };
        let retired: Option<String> =
            sqlx::query_scalar("SELECT id FROM snapshots WHERE id = $1 AND state = 'retired'")
                .bind(&id)
                .fetch_optional(&mut **tx)
                .await?;
        if retired.is_none() || needed(tx, &id).await? {
            break;
        }
        from = export_parent(tx, &id).await?;
        sqlx::query("DELETE FROM snapshots WHERE id = $1").bind(&id).execute(&mut **tx).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use space_api::durable::{BlobRef, DiskExport};

    use super::*;
    use crate::snapshots::tests::{disk, session_of};
    use crate::test_store;

    fn export(stream: u8, parent: Option<&SnapshotId>) -> SnapshotExport {
        let stream = BlobRef { sha256: format!("{stream:02x}").repeat(32), size: 1 };
        SnapshotExport {
            disk: DiskExport { stream, parent: parent.cloned() },
            images: Vec::new(),
            spaced: None,
            encrypted: true,
        }
    }

    /// A ready snapshot of `session`, taken after every one before it (snapshots of one
    /// millisecond are ordered by their random ids).
    async fn durable(store: &Store, session: &SessionId, tenant: &space_api::TenantId, outlives: bool) -> SnapshotId {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let new = disk(session, tenant, None, outlives);
        store.insert_snapshot(&new, u64::MAX).await.unwrap();
        store.set_snapshot_ready(&new.id, Some(1)).await.unwrap();
        new.id
    }

    fn ids(chain: &[ChainLink]) -> Vec<&SnapshotId> {
        chain.iter().map(|l| &l.snapshot).collect()
    }

    /// A chain a ← b ← c: each export names its parent; deleting a parent an export needs
    /// retires it (hidden, its export kept for the blob store's sweep), and deleting the last
    /// snapshot that needs it deletes it, up the chain.
    #[tokio::test]
    async fn a_parent_an_export_needs_is_kept_hidden_until_nothing_needs_it() {
        let (store, _dir) = test_store().await;
        let tenant = store.ensure_tenant("a").await.unwrap();
        let session = session_of(&store, &tenant).await;
        let a = durable(&store, &session, &tenant, true).await;
        assert_eq!(store.newest_durable_before(&session, &a).await.unwrap(), None, "a itself is not durable yet");
        assert!(store.set_snapshot_export(&a, &export(1, None), Some(&[1])).await.unwrap());
        let b = durable(&store, &session, &tenant, false).await;
        assert_eq!(store.newest_durable_before(&session, &b).await.unwrap().as_ref(), Some(&a));
        assert!(store.set_snapshot_export(&b, &export(2, Some(&a)), Some(&[2])).await.unwrap());
        let c = durable(&store, &session, &tenant, false).await;
        assert_eq!(store.newest_durable_before(&session, &c).await.unwrap().as_ref(), Some(&b));
        assert_eq!(store.newest_durable_before(&session, &a).await.unwrap(), None, "only older ones");
        assert!(store.set_snapshot_export(&c, &export(3, Some(&b)), Some(&[3])).await.unwrap());
        let chain = store.export_chain(&c).await.unwrap();
        assert_eq!(ids(&chain), [&c, &b, &a]);
        assert_eq!(chain.iter().map(|l| l.key_sealed.clone().unwrap()[0]).collect::<Vec<_>>(), [3, 2, 1]);

        store.delete_snapshot_row(&a).await.unwrap();
        store.delete_snapshot_row(&b).await.unwrap();
        let listed = store.list_snapshots(&session).await.unwrap();
        assert_eq!(listed.iter().map(|s| &s.id).collect::<Vec<_>>(), [&c], "retired ones are hidden");
        assert!(store.snapshot_place(&a).await.unwrap().is_none());
        assert_eq!(store.all_snapshots().await.unwrap().len(), 1, "no node keeps a retired one");
        assert_eq!(ids(&store.export_chain(&c).await.unwrap()), [&c, &b, &a], "the chain holds");
        assert_eq!(store.all_snapshot_exports().await.unwrap().len(), 3, "the sweep keeps their objects");
        // A retired snapshot no longer counts against the tenant's kept snapshots.
        store.insert_snapshot(&disk(&session, &tenant, None, true), 1).await.unwrap();

        store.delete_snapshot_row(&c).await.unwrap();
        let kept: Vec<SnapshotId> = store.all_snapshots().await.unwrap().into_iter().map(|(_, id, _)| id).collect();
        assert!(!kept.contains(&c));
        assert!(store.all_snapshot_exports().await.unwrap().is_empty(), "nothing needs the chain any more");
        assert!(store.export_chain(&a).await.unwrap().is_empty());
    }

    /// An export against a parent deleted while it ran is not recorded; a snapshot exported
    /// again whole frees the parent it was sent against before.
    #[tokio::test]
    async fn an_export_is_recorded_only_while_its_parent_is_and_a_new_export_frees_the_old_parent() {
        let (store, _dir) = test_store().await;
        let tenant = store.ensure_tenant("a").await.unwrap();
        let session = session_of(&store, &tenant).await;
        let a = durable(&store, &session, &tenant, false).await;
        let b = durable(&store, &session, &tenant, false).await;
        assert!(!store.set_snapshot_export(&b, &export(2, Some(&a)), None).await.unwrap(), "a has no export");
        assert!(store.set_snapshot_export(&a, &export(1, None), None).await.unwrap());
        assert!(store.set_snapshot_export(&b, &export(2, Some(&a)), None).await.unwrap());
        store.delete_snapshot_row(&a).await.unwrap();
        assert_eq!(store.all_snapshot_exports().await.unwrap().len(), 2, "a is retired");
        assert!(store.set_snapshot_export(&b, &export(4, None), None).await.unwrap());
        assert_eq!(store.all_snapshot_exports().await.unwrap(), [export(4, None)], "a went with its last need");
        let gone = durable(&store, &session, &tenant, false).await;
        store.delete_snapshot_row(&gone).await.unwrap();
        let c = durable(&store, &session, &tenant, false).await;
        assert!(!store.set_snapshot_export(&c, &export(5, Some(&gone)), None).await.unwrap(), "deleted meanwhile");
        assert!(store.snapshot_place(&c).await.unwrap().unwrap().export.is_none());
    }
}
