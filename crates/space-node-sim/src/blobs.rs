//! The simulated blob store: one per test, shared by its simulated nodes as one object
//! store is by real ones, so a snapshot one node exports another can import.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use space_api::durable::{BlobRef, BlobSweep, DiskExport, SnapshotExport, SnapshotKey, TemplateExport};
use space_api::{SnapshotId, TemplateInfo};

use crate::SimError;
use crate::agent::Contents;

/// What the simulated nodes export to ([`crate::SimConfig::blobs`]).
#[derive(Debug, Clone, Default)]
pub struct SimBlobs(Arc<Mutex<Objects>>);

#[derive(Debug, Default)]
struct Objects {
    stored: HashMap<String, Stored>,
    /// Templates exported, by their object's name.
    templates: HashMap<String, TemplateInfo>,
    /// Snapshot exports' objects, in the order they were stored.
    exports: Vec<String>,
    next: u64,
}

#[derive(Debug, Clone)]
struct Stored {
    full: bool,
    contents: Contents,
    corrupt: bool,
    /// The key it was encrypted with, which importing it needs.
    key: Option<SnapshotKey>,
}

impl SimBlobs {
    fn objects(&self) -> MutexGuard<'_, Objects> {
        // Plain data, never left half-changed by a panic: keep going.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many snapshots were exported to it.
    pub fn len(&self) -> usize {
        self.objects().stored.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The object of the `n`th snapshot export (from 0) changes its bytes.
    pub fn corrupt_export(&self, n: usize) {
        let mut objects = self.objects();
        let key = objects.exports[n].clone();
        objects.stored.get_mut(&key).expect("the export's object is stored").corrupt = true;
    }

    /// Every object stored so far changes its bytes: importing it fails as corrupt.
    pub fn corrupt_all(&self) {
        self.objects().stored.values_mut().for_each(|s| s.corrupt = true);
    }

    /// Stores a snapshot (whole, whatever `parent` says: the simulation keeps no deltas, only
    /// the rule that importing one needs its parent first).
    pub(crate) fn put(
        &self,
        full: bool,
        contents: Contents,
        parent: Option<SnapshotId>,
        key: Option<&SnapshotKey>,
    ) -> SnapshotExport {
        let mut objects = self.objects();
        objects.next += 1;
        let stream = BlobRef { sha256: format!("{:064x}", objects.next), size: contents.size() };
        let stored = Stored { full, contents, corrupt: false, key: key.cloned() };
        objects.stored.insert(stream.sha256.clone(), stored);
        objects.exports.push(stream.sha256.clone());
        let spaced = full.then(|| BlobRef { sha256: "5".repeat(64), size: 1 });
        let encrypted = key.is_some();
        SnapshotExport { disk: DiskExport { stream, parent }, images: Vec::new(), spaced, encrypted }
    }

    /// How many templates were exported to it.
    pub fn templates(&self) -> usize {
        self.objects().templates.len()
    }

    pub(crate) fn put_template(&self, info: &TemplateInfo) -> TemplateExport {
        let mut objects = self.objects();
        objects.next += 1;
        let stream = BlobRef { sha256: format!("{:064x}", objects.next), size: info.size_bytes };
        objects.templates.insert(stream.sha256.clone(), info.clone());
        TemplateExport { info: info.clone(), id_map: space_api::IdMap::default(), stream }
    }

    pub(crate) fn get_template(&self, export: &TemplateExport) -> Result<TemplateInfo, SimError> {
        let key = &export.stream.sha256;
        self.objects().templates.get(key).cloned().ok_or_else(|| SimError::CorruptBlob(format!("{key} is missing")))
    }

    /// Deletes every object `keep` does not name, whatever its age (the simulated store keeps
    /// no times) and in no time: the control plane alone must keep a sweep from racing an
    /// export.
    pub(crate) fn sweep(&self, keep: &HashSet<String>) -> BlobSweep {
        let mut objects = self.objects();
        let mut swept = BlobSweep::default();
        objects.stored.retain(|key, stored| {
            let kept = keep.contains(key);
            if kept {
                swept.kept_objects += 1;
            } else {
                swept.deleted_objects += 1;
                swept.deleted_bytes += stored.contents.size();
            }
            kept
        });
        swept.complete = true;
        swept
    }

    /// What `export` holds: whether it is full, and its contents. An encrypted one opens
    /// with its key only, as a real one decrypts.
    pub(crate) fn get(
        &self,
        export: &SnapshotExport,
        with: Option<&SnapshotKey>,
    ) -> Result<(bool, Contents), SimError> {
        self.get_disk(&export.disk, with)
    }

    /// What a snapshot's root export holds: whether its snapshot is full, and its contents.
    pub(crate) fn get_disk(&self, disk: &DiskExport, with: Option<&SnapshotKey>) -> Result<(bool, Contents), SimError> {
        let key = &disk.stream.sha256;
        match self.objects().stored.get(key) {
            Some(s) if s.corrupt => Err(SimError::CorruptBlob(key.clone())),
            Some(s) if s.key.is_some() && s.key.as_ref() != with => {
                Err(SimError::CorruptBlob(format!("{key} does not open with the key given")))
            }
            Some(s) => Ok((s.full, s.contents.clone())),
            None => Err(SimError::CorruptBlob(format!("{key} is missing"))),
        }
    }
}
