//! What a snapshot becomes in the blob store: the parts a node exports, which the control
//! plane records and hands to another node to import (docs/storage.md, "Durable snapshots").
//! Every part is named by its content, so what comes back is checked against what left.

use serde::{Deserialize, Serialize};

use crate::SnapshotId;

/// A snapshot's data key (docs/byok.md): a full snapshot's process images are sealed with it
/// on its node, and its objects in the blob store are encrypted with it. Made and kept sealed
/// by the control plane, handed in clear only to the node that takes, starts from, exports or
/// imports the snapshot, over the node API. Never printed; zeroed when dropped.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotKey(zeroize::Zeroizing<[u8; 32]>);

impl SnapshotKey {
    pub fn new(bytes: [u8; 32]) -> SnapshotKey {
        SnapshotKey(zeroize::Zeroizing::new(bytes))
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

impl TryFrom<String> for SnapshotKey {
    type Error = String;

    fn try_from(text: String) -> Result<SnapshotKey, String> {
        let text = zeroize::Zeroizing::new(text);
        let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(text.as_bytes(), &mut bytes[..])
            .map_err(|_| "a snapshot key is 64 hex digits".to_owned())?;
        Ok(SnapshotKey(bytes))
    }
}

impl From<SnapshotKey> for String {
    fn from(key: SnapshotKey) -> String {
        hex::encode(&key.0[..])
    }
}

/// An object by its content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlobRef {
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    pub size: u64,
}

/// A snapshot's root as a `btrfs send` stream, and the snapshot (of the same session) it was
/// sent against, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskExport {
    pub stream: BlobRef,
    pub parent: Option<SnapshotId>,
}

/// An ancestor's root that a node must hold before it can receive an incremental stream: the
/// snapshot it is, its root's export (itself whole, or against its own parent), and its data
/// key when that export is encrypted. A snapshot's ancestors travel newest first, as far as
/// its chain goes; a node receives, oldest first, only those it lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentDisk {
    pub snapshot: SnapshotId,
    pub disk: DiskExport,
    #[serde(default)]
    pub key: Option<SnapshotKey>,
}

/// The ancestors of a root sent against `parent` that a pool lacks (`held` says which roots
/// it holds whole), from `parents` (newest first, as far as the chain goes), oldest first: the
/// order they are received in. The walk stops at the first ancestor held. `Err` names the
/// first ancestor needed that `parents` does not give.
pub fn parents_to_receive<'a>(
    parent: Option<&SnapshotId>,
    parents: &'a [ParentDisk],
    held: impl Fn(&SnapshotId) -> bool,
) -> Result<Vec<&'a ParentDisk>, SnapshotId> {
    let mut needed = Vec::new();
    let mut want = parent.cloned();
    while let Some(id) = want.filter(|id| !held(id)) {
        let link = parents.iter().find(|p| p.snapshot == id).ok_or(id)?;
        needed.push(link);
        want = link.disk.parent.clone();
    }
    needed.reverse();
    Ok(needed)
}

/// A global template in the blob store, so a node that never built it can run it: its root as
/// a `btrfs send` stream, what it is (its exact version kept), and the id range its files are
/// shifted into (a node with another range cannot use it as it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateExport {
    pub info: crate::TemplateInfo,
    pub id_map: crate::IdMap,
    pub stream: BlobRef,
}

/// One file of a full snapshot's process images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedFile {
    /// A plain file name (no directory part).
    pub name: String,
    pub blob: BlobRef,
}

/// Every part of an exported snapshot: its root, and for a full snapshot its process images
/// and the `spaced` its processes ran (a restore needs that very binary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotExport {
    pub disk: DiskExport,
    #[serde(default)]
    pub images: Vec<ExportedFile>,
    #[serde(default)]
    pub spaced: Option<BlobRef>,
    /// Whether the root's stream and the process images are encrypted (with an
    /// [`SnapshotKey`]; the `spaced` binary is not tenant data and is not). Exports made before
    /// encryption existed are not.
    #[serde(default)]
    pub encrypted: bool,
}

impl SnapshotExport {
    /// Whether it holds processes (a full snapshot's export).
    pub fn is_full(&self) -> bool {
        self.spaced.is_some()
    }

    /// Every object it names: what the blob store keeps while the export is recorded. (An
    /// incremental export also needs its parent's stream: the parent snapshot's own export
    /// names it, so the parent must be kept while a child needs it.)
    pub fn blobs(&self) -> impl Iterator<Item = &BlobRef> {
        std::iter::once(&self.disk.stream).chain(self.images.iter().map(|f| &f.blob)).chain(self.spaced.as_ref())
    }

    /// Bytes in the blob store, counting shared objects once per reference.
    pub fn size(&self) -> u64 {
        let images: u64 = self.images.iter().map(|f| f.blob.size).sum();
        self.disk.stream.size + images + self.spaced.as_ref().map_or(0, |b| b.size)
    }
}

/// What a sweep of the blob store did: objects no recorded export names, and older than the
/// sweep's minimum age, are deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BlobSweep {
    pub deleted_objects: u64,
    pub deleted_bytes: u64,
    /// Objects kept: named by an export, or too young to judge (an export may be storing them).
    pub kept_objects: u64,
    /// Whether it went through the whole store; one that ran out of time stopped early, and
    /// the next sweep goes on.
    pub complete: bool,
}

/// `POST /v1/blobs/sweep`: whether the sweep ran, and what it did. It is put off (`swept`
/// false, with why) while an export is under way or another replica sweeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BlobSweepReport {
    pub swept: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub put_off: Option<String>,
    pub objects: BlobSweep,
}

/// Whether `s` is written as a SHA-256 is: 64 lower-case hex digits. Only such a string names
/// an object (or a kept binary), and only it may become part of a key or a path.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is a file name an export may carry: one path component, not `.` or `..`.
pub fn plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parents_to_receive_are_those_up_to_the_first_held_oldest_first() {
        let ids: Vec<SnapshotId> = (0..4).map(|_| SnapshotId::generate()).collect();
        let stream = BlobRef { sha256: "0".repeat(64), size: 1 };
        // ids[3] against ids[2] against ids[1] against ids[0] (whole); newest first.
        let link = |i: usize| ParentDisk {
            snapshot: ids[i].clone(),
            disk: DiskExport { stream: stream.clone(), parent: i.checked_sub(1).map(|p| ids[p].clone()) },
            key: None,
        };
        let parents = [link(2), link(1), link(0)];
        let names = |found: Vec<&ParentDisk>| found.into_iter().map(|p| p.snapshot.clone()).collect::<Vec<_>>();
        let none = parents_to_receive(Some(&ids[2]), &parents, |_| false).unwrap();
        assert_eq!(names(none), [ids[0].clone(), ids[1].clone(), ids[2].clone()]);
        let from_held = parents_to_receive(Some(&ids[2]), &parents, |id| *id == ids[0]).unwrap();
        assert_eq!(names(from_held), [ids[1].clone(), ids[2].clone()]);
        assert!(parents_to_receive(Some(&ids[2]), &parents, |id| *id == ids[2]).unwrap().is_empty());
        assert!(parents_to_receive(None, &parents, |_| false).unwrap().is_empty(), "a whole root needs none");
        assert_eq!(parents_to_receive(Some(&ids[2]), &parents[..2], |_| false).unwrap_err(), ids[0]);
    }

    #[test]
    fn only_plain_names_are_file_names() {
        for good in ["pages-1.img", "core-42.img", ".hidden"] {
            assert!(plain_file_name(good), "{good}");
        }
        for bad in ["", ".", "..", "../x", "a/b", "/etc/passwd", "a\0b"] {
            assert!(!plain_file_name(bad), "{bad:?}");
        }
    }
}
