//! The volume manager: a snapshot leaves its node as objects in the blob store — its root as
//! a `btrfs send` stream, a full snapshot's process images file by file and the `spaced` its
//! processes ran — and arrives on any node from them, each checked, then `btrfs receive`d
//! (docs/storage.md, "Durable snapshots").
//!
//! Given a [`SnapshotKey`], the root's stream is encrypted on its way out (space-keys' chunked
//! stream format) and checked and decrypted on its way in; process images are encrypted on
//! the node already ([`sealed`]) and travel as they are (images of a snapshot taken before
//! that are encrypted on their way out). So the blob store holds no tenant data in clear
//! (docs/byok.md). The `spaced` binary is not tenant data: it stays in clear, shared by every
//! snapshot that ran it.
//!
//! A snapshot whose parent was exported already can go as a stream against that parent, so
//! only what changed travels; importing it needs the parent imported first. What an export
//! returns, the control plane records: the hashes are what the import checks against, so the
//! blob store cannot substitute other bytes.

pub mod sealed;
mod snapshot;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_api::TemplateInfo;
pub use space_api::durable::{DiskExport, ExportedFile, ParentDisk, SnapshotExport, SnapshotKey, TemplateExport};
use space_api::{SessionId, SnapshotId};
use space_blob::{BlobError, BlobRef, BlobStore, BlobSweep};
pub use space_keys::KeyError;
use space_storage::{Pool, StorageError};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("{}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the pool's work stopped before it finished")]
    Interrupted(#[from] tokio::task::JoinError),
    /// A full snapshot's images hold something other than plain files, or an export names a
    /// file that is not a plain name.
    #[error("{}: {reason}", path.display())]
    NotPlain { path: PathBuf, reason: &'static str },
    /// An object that does not decrypt (altered, cut, reordered, or under another key), or
    /// encryption that failed.
    #[error(transparent)]
    Key(#[from] space_keys::KeyError),
    #[error("the snapshot's export is encrypted, and no key was given to import it")]
    NoKey,
    #[error("the snapshot's process images are encrypted on the node, and no key was given to open them")]
    SealedWithoutKey,
    /// An incremental root's ancestor that the pool lacks and the import was not given.
    #[error("snapshot {snapshot}'s root is needed first (an incremental export's ancestor), and it was not given")]
    MissingParent { snapshot: SnapshotId },
    /// The root of an ancestor an incremental root was sent against could not be received.
    #[error("snapshot {snapshot}, whose root this one was sent against: {source}")]
    Ancestor { snapshot: SnapshotId, source: Box<VolumeError> },
    /// A template from a node whose templates are shifted into another id range.
    #[error(
        "the template's files belong to host ids {}..{} (a node started with another --uid-base); this node's are {}..{}: \
         each such node builds the template itself",
        theirs.host_base, u64::from(theirs.host_base) + u64::from(theirs.count),
        ours.host_base, u64::from(ours.host_base) + u64::from(ours.count)
    )]
    OtherIdRange { theirs: space_api::IdMap, ours: space_api::IdMap },
}

pub type Result<T, E = VolumeError> = std::result::Result<T, E>;

/// Runs `work` on the blocking pool: its outcome, or [`VolumeError::Interrupted`].
async fn blocking<T, E>(work: impl FnOnce() -> std::result::Result<T, E> + Send + 'static) -> Result<T>
where
    T: Send + 'static,
    E: Into<VolumeError> + Send + 'static,
{
    tokio::task::spawn_blocking(work).await?.map_err(Into::into)
}

/// A pool and the blob store its snapshots are exported to, with a scratch directory for
/// streams on their way (outside the pool: they are not part of any root).
pub struct Volumes {
    pool: Arc<Pool>,
    blobs: BlobStore,
    scratch: PathBuf,
    /// Held by each import: forks started together import one snapshot at once, and each
    /// would otherwise write the same scratch files and directories, or delete what another
    /// received when its own attempt failed. Imports are moves between nodes, rare enough to
    /// take one at a time; the ones that waited find the snapshot there.
    imports: tokio::sync::Mutex<()>,
}

impl Volumes {
    pub fn new(pool: Arc<Pool>, blobs: BlobStore, scratch: PathBuf) -> Volumes {
        Volumes { pool, blobs, scratch, imports: tokio::sync::Mutex::new(()) }
    }

    /// Stores the snapshot's root in the blob store, against `parent` (a snapshot of the same
    /// session exported before) when given and the pool holds its root whole; else, or when
    /// the stream against it cannot be made (the parent deleted meanwhile), whole. The
    /// export's `parent` says which.
    pub async fn export_disk(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<DiskExport> {
        let parent = parent.filter(|p| self.pool.snapshot_root_whole(session, p));
        if let Some(parent) = parent {
            match self.export_disk_against(session, snapshot, Some(parent), key).await {
                Ok(export) => return Ok(export),
                Err(e) => tracing::warn!(%snapshot, %parent, error = %e, "exporting the root whole instead"),
            }
        }
        self.export_disk_against(session, snapshot, None, key).await
    }

    async fn export_disk_against(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<DiskExport> {
        let stream = self.scratch_file(snapshot, "send")?;
        let result = self.send_and_store(session, snapshot, parent, &stream, key).await;
        let _ = std::fs::remove_file(&stream);
        Ok(DiskExport { stream: result?, parent: parent.cloned() })
    }

    async fn send_and_store(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        stream: &Path,
        key: Option<&SnapshotKey>,
    ) -> Result<BlobRef> {
        let (pool, out) = (self.pool.clone(), stream.to_owned());
        let (session, snapshot_id, parent) = (session.clone(), snapshot.clone(), parent.cloned());
        tokio::task::spawn_blocking(move || {
            pool.send_snapshot(&session, &snapshot_id, parent.as_ref().map(|p| (&session, p)), &out)
        })
        .await??;
        self.put_file(snapshot, stream, key).await
    }

    /// Stores `path` in the blob store, encrypted with `key` when given (through a scratch
    /// file of its own name, removed after: the files of one snapshot go side by side).
    async fn put_file(&self, snapshot: &SnapshotId, path: &Path, key: Option<&SnapshotKey>) -> Result<BlobRef> {
        let Some(key) = key else { return Ok(self.blobs.put_file(path).await?) };
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let sealed = self.scratch_file(snapshot, &format!("{name}.sealed"))?;
        let (key, src, dst) = (key.clone(), path.to_owned(), sealed.clone());
        let stored = match blocking(move || space_keys::stream::encrypt_file(key.bytes(), &src, &dst)).await {
            // Encrypted under a salt of its own: no stored object can equal it.
            Ok(()) => self.blobs.put_file_once(&sealed).await.map_err(VolumeError::from),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&sealed);
        stored
    }

    /// Fetches `blob` (checked against its hash) into the scratch file `dest` (read once and
    /// removed, so not synced), decrypted with `key` when given (a blob that does not decrypt
    /// whole is [`space_keys::KeyError::Corrupt`]; `dest` is then removed).
    async fn get_scratch(
        &self,
        snapshot: &SnapshotId,
        blob: &BlobRef,
        dest: &Path,
        key: Option<&SnapshotKey>,
    ) -> Result<()> {
        let Some(key) = key else { return Ok(self.blobs.get_to_file(blob, dest).await?) };
        let sealed = self.scratch_file(snapshot, "sealed")?;
        let fetched = self.blobs.get_to_scratch(blob, &sealed).await;
        let decrypted = match fetched {
            Ok(()) => {
                let (key, src, dst) = (key.clone(), sealed.clone(), dest.to_owned());
                blocking(move || space_keys::stream::decrypt_file(key.bytes(), &src, &dst, false)).await
            }
            Err(e) => Err(e.into()),
        };
        let _ = std::fs::remove_file(&sealed);
        decrypted
    }

    /// Makes the roots of the ancestors of a root exported against `parent` that this pool
    /// lacks, oldest first, from `parents` (newest first, as far as the chain goes): each
    /// checked, decrypted with its own key, received, and pushed to `received` (the caller
    /// deletes them once they have served). An ancestor the chain needs and `parents` does
    /// not name is [`VolumeError::MissingParent`]; one that fails is [`VolumeError::Ancestor`],
    /// and leaves nothing of itself.
    async fn import_parents(
        &self,
        session: &SessionId,
        parent: Option<&SnapshotId>,
        parents: &[ParentDisk],
        received: &mut Vec<SnapshotId>,
    ) -> Result<()> {
        let held = |id: &SnapshotId| self.pool.snapshot_root_whole(session, id);
        let needed = space_api::durable::parents_to_receive(parent, parents, held)
            .map_err(|snapshot| VolumeError::MissingParent { snapshot })?;
        for link in needed {
            if let Err(e) = self.import_disk(session, &link.snapshot, &link.disk, link.key.as_ref()).await {
                self.delete_roots(session, std::slice::from_ref(&link.snapshot)).await;
                return Err(VolumeError::Ancestor { snapshot: link.snapshot.clone(), source: Box::new(e) });
            }
            received.push(link.snapshot.clone());
        }
        Ok(())
    }

    /// Deletes the snapshots `snapshots` of `session` from the pool, as far as it can (what
    /// stays is an orphan, which the node's sweep removes).
    async fn delete_roots(&self, session: &SessionId, snapshots: &[SnapshotId]) {
        for snapshot in snapshots {
            let (pool, session, snapshot) = (self.pool.clone(), session.clone(), snapshot.clone());
            let _ = blocking(move || pool.delete_snapshot(&session, &snapshot)).await;
        }
    }

    /// Makes the snapshot in this pool from its export, after checking the stream against
    /// the export's hash: a stream that does not match is [`BlobError::Corrupt`] and nothing
    /// is received. The export's parent must be in the pool already.
    pub async fn import_disk(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &DiskExport,
        key: Option<&SnapshotKey>,
    ) -> Result<()> {
        let stream = self.scratch_file(snapshot, "receive")?;
        let result = self.fetch_and_receive(session, snapshot, export, &stream, key).await;
        let _ = std::fs::remove_file(&stream);
        result
    }

    async fn fetch_and_receive(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &DiskExport,
        stream: &Path,
        key: Option<&SnapshotKey>,
    ) -> Result<()> {
        self.get_scratch(snapshot, &export.stream, stream, key).await?;
        let (pool, input) = (self.pool.clone(), stream.to_owned());
        let (session, snapshot) = (session.clone(), snapshot.clone());
        tokio::task::spawn_blocking(move || pool.receive_snapshot(&session, &snapshot, &input)).await??;
        Ok(())
    }

    /// Deletes the blob store's objects that `keep` (SHA-256s) does not name, once `min_age`
    /// old, for at most `budget` ([`BlobStore::sweep`]).
    pub async fn sweep_blobs(&self, keep: &HashSet<String>, min_age: Duration, budget: Duration) -> Result<BlobSweep> {
        Ok(self.blobs.sweep(keep, min_age, budget).await?)
    }

    /// Stores global template `info` in the blob store (its root's send stream; a template
    /// is no tenant's data, so it goes in clear).
    pub async fn export_template(&self, info: &TemplateInfo) -> Result<TemplateExport> {
        let stream =
            self.scratch_named(&format!("template-{}-{}-{:08x}.send", info.name, info.version, rand::random::<u32>()))?;
        let (store, sent, out) = (self.pool.templates().clone(), info.clone(), stream.clone());
        let stored = match blocking(move || store.send(&sent, &out)).await {
            Ok(()) => self.blobs.put_file(&stream).await.map_err(VolumeError::from),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&stream);
        Ok(TemplateExport { info: info.clone(), id_map: self.pool.templates().id_map(), stream: stored? })
    }

    /// Makes the template `export` describes (its very version) in this pool, its stream
    /// checked against its hash first. A version the pool has already is left as it is.
    /// Templates shifted into another id range than this pool's are refused.
    pub async fn import_template(&self, export: &TemplateExport) -> Result<TemplateInfo> {
        let templates = self.pool.templates().clone();
        if export.id_map != templates.id_map() {
            return Err(VolumeError::OtherIdRange { theirs: export.id_map, ours: templates.id_map() });
        }
        // One import at a time (see `imports`): the store receives one template at a time.
        let _one_at_a_time = self.imports.lock().await;
        if templates.get(&export.info.name, export.info.version).is_ok_and(|existing| existing == export.info) {
            return Ok(export.info.clone());
        }
        let stream = self.scratch_named(&format!("template-{}-{}.receive", export.info.name, export.info.version))?;
        let received = match self.blobs.get_to_file(&export.stream, &stream).await {
            Ok(()) => {
                let (info, input) = (export.info.clone(), stream.clone());
                blocking(move || templates.receive(&info, &input)).await
            }
            Err(e) => Err(e.into()),
        };
        let _ = std::fs::remove_file(&stream);
        received
    }

    fn scratch_file(&self, snapshot: &SnapshotId, what: &str) -> Result<PathBuf> {
        self.scratch_named(&format!("{snapshot}.{what}"))
    }

    fn scratch_named(&self, name: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.scratch)
            .map_err(|source| VolumeError::Io { path: self.scratch.clone(), source })?;
        Ok(self.scratch.join(name))
    }
}
