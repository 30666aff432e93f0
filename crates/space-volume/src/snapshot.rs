//! Whole snapshots: the root's stream (lib.rs) and, for a full snapshot, its process images
//! and the `spaced` its processes ran. A full snapshot is complete in a pool once its binary
//! is there (space-storage writes it last), so an import writes it last too.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use space_api::durable::plain_file_name;
use space_api::{SessionId, SnapshotId};
use space_blob::BlobRef;

use crate::{ExportedFile, ParentDisk, Result, SnapshotExport, SnapshotKey, VolumeError, Volumes};

/// The mode CRIU gives the image files it writes (its `CR_FD_PERM`, less the umask's write
/// bit for the group).
pub(crate) const IMAGE_MODE: u32 = 0o644;
/// How many process images an export sends, or an import fetches, at once.
const IMAGE_TRANSFERS: usize = 8;

impl Volumes {
    /// Stores the snapshot in the blob store: its root (against `parent`, a snapshot of the
    /// same session exported before, when given) and, for a full snapshot, every file of its
    /// process images and its binary. With `key` (the snapshot's own data key), the root's
    /// stream is encrypted with it, and images in clear too; images sealed on the node already
    /// go as they are (they need `key`: their export says it is encrypted).
    pub async fn export_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        parent: Option<&SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> Result<SnapshotExport> {
        let encrypted = key.is_some();
        if !self.pool.snapshot_has_images(session, snapshot) {
            let disk = self.export_disk(session, snapshot, parent, key).await?;
            return Ok(SnapshotExport { disk, images: Vec::new(), spaced: None, encrypted });
        }
        let start = Instant::now();
        let root = self.export_disk(session, snapshot, parent, key);
        let ((disk, images), took) = side_by_side(snapshot, root, self.export_images(session, snapshot, key)).await?;
        let spaced = self.export_binary(session, snapshot).await?;
        tracing::debug!(%snapshot, root = ?took.0, images = ?took.1, total = ?start.elapsed(), "exported");
        Ok(SnapshotExport { disk, images, spaced: Some(spaced), encrypted })
    }

    /// Stores every file of a full snapshot's process images, several at once (as an import
    /// fetches them, see `import_images`); what each became, by name.
    async fn export_images(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        key: Option<&SnapshotKey>,
    ) -> Result<Vec<ExportedFile>> {
        let dir = self.pool.snapshot_images_dir(session, snapshot);
        let sealed = crate::sealed::images_sealed(&dir)?;
        if sealed && key.is_none() {
            return Err(VolumeError::SealedWithoutKey);
        }
        let mut files = sized_files(&dir)?;
        files.sort_by_key(|(_, size)| std::cmp::Reverse(*size));
        let puts = files.into_iter().map(|(name, _)| {
            let path = dir.join(&name);
            async move {
                let blob = match sealed {
                    // Sealed under nonces of their own: no stored object can equal them.
                    true => self.blobs.put_file_once(&path).await?,
                    false => self.put_file(snapshot, &path, key).await?,
                };
                Ok::<_, VolumeError>(ExportedFile { blob, name })
            }
        });
        let mut images = all_of(puts).await?;
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    /// Stores the `spaced` of a full snapshot, unless the store has it: by the name the pool
    /// keeps it under when there is one (the same binary is in every snapshot a node takes,
    /// and is not read again to learn its hash; an import checks it all the same).
    async fn export_binary(&self, session: &SessionId, snapshot: &SnapshotId) -> Result<BlobRef> {
        let binary = self.pool.snapshot_binary(session, snapshot);
        let size = std::fs::metadata(&binary).map_err(|e| io(&binary, e))?.len();
        if let Some(sha256) = self.pool.snapshot_binary_sha256(session, snapshot) {
            let kept = BlobRef { sha256, size };
            if self.blobs.exists(&kept).await? {
                return Ok(kept);
            }
        }
        Ok(self.blobs.put_file(&binary).await?)
    }

    /// Whether the pool holds the snapshot whole, as `export` describes it.
    pub fn holds(&self, session: &SessionId, snapshot: &SnapshotId, export: &SnapshotExport) -> bool {
        let root = self.pool.snapshot_dir(session, snapshot).join("rootfs");
        root.is_dir() && (!export.is_full() || self.pool.snapshot_has_images(session, snapshot))
    }

    /// Makes the snapshot in this pool from its export, every part checked against its hash
    /// ([`space_blob::BlobError::Corrupt`] if one does not match). A snapshot the pool holds
    /// whole already is left as it is; on failure nothing of it stays. An encrypted export
    /// needs its `key` ([`VolumeError::NoKey`] without), and its root's stream must decrypt
    /// whole; its process images are kept encrypted, as the node keeps its own, and are
    /// opened (and checked) by a restore. A root exported against a parent needs the
    /// ancestors the pool lacks, from `parents` (newest first): they are received first,
    /// oldest first, and deleted again once the snapshot is here (or failed), so the pool
    /// never holds an ancestor's root as if it were that snapshot.
    pub async fn import_snapshot(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
        parents: &[ParentDisk],
    ) -> Result<()> {
        let _one_at_a_time = self.imports.lock().await;
        if self.holds(session, snapshot, export) {
            return Ok(());
        }
        let key = match (export.encrypted, key) {
            (true, None) => return Err(VolumeError::NoKey),
            (true, key) => key,
            (false, _) => None,
        };
        let mut received = Vec::new();
        let imported = match self.import_parents(session, export.disk.parent.as_ref(), parents, &mut received).await {
            Ok(()) => self.import_parts(session, snapshot, export, key).await,
            Err(e) => Err(e),
        };
        if imported.is_err() {
            received.push(snapshot.clone());
        }
        self.delete_roots(session, &received).await;
        imported
    }

    async fn import_parts(
        &self,
        session: &SessionId,
        snapshot: &SnapshotId,
        export: &SnapshotExport,
        key: Option<&SnapshotKey>,
    ) -> Result<()> {
        let dir = self.pool.snapshot_images_dir(session, snapshot);
        if let Some(bad) = export.images.iter().find(|f| !plain_file_name(&f.name)) {
            return Err(VolumeError::NotPlain { path: dir.join(&bad.name), reason: "not a plain file name" });
        }
        let Some(spaced) = &export.spaced else { return self.import_disk(session, snapshot, &export.disk, key).await };
        // The images have a directory of their own, and the snapshot is complete only once its
        // binary is linked, after both.
        let start = Instant::now();
        let root = self.import_disk(session, snapshot, &export.disk, key);
        let (_, took) = side_by_side(snapshot, root, self.import_images(&dir, &export.images)).await?;
        let kept = self.keep_binary(snapshot, spaced).await;
        let (pool, session, snapshot_id, kept) = (self.pool.clone(), session.clone(), snapshot.clone(), kept?);
        tokio::task::spawn_blocking(move || pool.link_snapshot_binary(&session, &snapshot_id, &kept)).await??;
        tracing::debug!(%snapshot, root = ?took.0, images = ?took.1, total = ?start.elapsed(), "imported");
        Ok(())
    }

    /// Fetches `images` into `dir`, made anew, several at once, the largest (the memory pages)
    /// first: most of a full snapshot's files are small, and each waits for its own sync,
    /// which overlap when they run side by side with the large one's copy.
    async fn import_images(&self, dir: &Path, images: &[ExportedFile]) -> Result<()> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(dir, e)),
            _ => {}
        }
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut files = images.to_vec();
        files.sort_by_key(|file| std::cmp::Reverse(file.blob.size));
        // Owned futures: a closure borrowing here is not general enough for a `Send` caller.
        let fetches = files.into_iter().map(|file| {
            let dir = dir.to_owned();
            async move { self.fetch_image(&dir, &file).await }
        });
        all_of(fetches).await?;
        Ok(())
    }

    /// One process image of an export into `dir`, checked and synced.
    async fn fetch_image(&self, dir: &Path, file: &ExportedFile) -> Result<()> {
        let path = dir.join(&file.name);
        self.blobs.get_to_file(&file.blob, &path).await?;
        // As CRIU writes its own: the restored tasks read them from inside the sandbox's
        // user namespace. The images root (0700, root's) keeps everyone else out.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(IMAGE_MODE)).map_err(|e| io(&path, e))
    }

    /// The pool's copy of the `spaced` of `blob`: the one it keeps already when it has one of
    /// that hash, else fetched (checked, so a hash that names no object is `BadRef`) and kept.
    async fn keep_binary(&self, snapshot: &SnapshotId, blob: &BlobRef) -> Result<PathBuf> {
        let (pool, sha256) = (self.pool.clone(), blob.sha256.clone());
        if let Some(kept) = tokio::task::spawn_blocking(move || pool.kept_binary(&sha256)).await? {
            return Ok(kept);
        }
        let binary = self.scratch_file(snapshot, "spaced")?;
        let fetched = self.blobs.get_to_file(blob, &binary).await;
        let kept = match fetched {
            Ok(()) => {
                let (pool, path) = (self.pool.clone(), binary.clone());
                tokio::task::spawn_blocking(move || pool.keep_binary(&path)).await?.map_err(VolumeError::from)
            }
            Err(e) => Err(e.into()),
        };
        let _ = std::fs::remove_file(&binary);
        kept
    }
}

/// Moves a snapshot's root and its images side by side: the memory image's hash keeps one
/// CPU busy, and the root's stream is mostly the kernel's and the cipher's work. Both run to
/// their end (each cleans up after itself); the root's error comes first (it says whether the
/// snapshot is corrupt), the images' is logged when both failed. With how long each took.
async fn side_by_side<A, B>(
    snapshot: &SnapshotId,
    root: impl Future<Output = Result<A>>,
    images: impl Future<Output = Result<B>>,
) -> Result<((A, B), (Duration, Duration))> {
    let start = Instant::now();
    let root = async { (root.await, start.elapsed()) };
    let images = async { (images.await, start.elapsed()) };
    let ((root, root_took), (images, images_took)) = futures::join!(root, images);
    match (root, images) {
        (Ok(root), Ok(images)) => Ok(((root, images), (root_took, images_took))),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(e), Err(images)) => {
            tracing::warn!(%snapshot, error = %images, "the snapshot's images failed as well as its root");
            Err(e)
        }
    }
}

pub(crate) fn io(path: &Path, source: std::io::Error) -> VolumeError {
    VolumeError::Io { path: path.to_owned(), source }
}

/// The outcomes of `transfers`, [`IMAGE_TRANSFERS`] at a time; the first error, once every
/// one has ended (each cleans up after itself, which one cancelled halfway would not).
async fn all_of<T>(transfers: impl Iterator<Item = impl Future<Output = Result<T>>>) -> Result<Vec<T>> {
    let outcomes: Vec<Result<T>> = futures::stream::iter(transfers).buffer_unordered(IMAGE_TRANSFERS).collect().await;
    outcomes.into_iter().collect()
}

/// [`plain_files`] with their sizes.
fn sized_files(dir: &Path) -> Result<Vec<(String, u64)>> {
    let sized = plain_files(dir)?.into_iter().map(|name| {
        let path = dir.join(&name);
        let size = std::fs::metadata(&path).map_err(|e| io(&path, e))?.len();
        Ok((name, size))
    });
    sized.collect()
}

/// The names of the files in `dir`, which must hold plain files only (what CRIU writes).
pub(crate) fn plain_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let path = entry.path();
        if !entry.file_type().map_err(|e| io(&path, e))?.is_file() {
            return Err(VolumeError::NotPlain { path, reason: "not a regular file" });
        }
        match entry.file_name().into_string() {
            Ok(name) if plain_file_name(&name) => names.push(name),
            _ => return Err(VolumeError::NotPlain { path, reason: "not a plain file name" }),
        }
    }
    names.sort();
    Ok(names)
}
