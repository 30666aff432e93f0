//! Snapshots exported from one real pool into the blob store and imported into another, with
//! a corrupted stream refused (run as root; scripts/test.sh runs them against a directory and
//! against S3-compatible storage).

use std::path::PathBuf;
use std::sync::Arc;

use space_api::{SandboxId, SessionId, SnapshotId};
use space_blob::{BlobError, BlobStore};
use space_storage::{Pool, PoolOptions, SandboxIdentity, no_progress};
use space_volume::{SnapshotKey, VolumeError, Volumes};

/// A pool of its own in a temporary directory; dropping it deletes what it holds and
/// unmounts it, also when the test failed.
struct TestPool {
    pool: Option<Arc<Pool>>,
    dir: tempfile::TempDir,
}

impl TestPool {
    fn new(name: &str) -> TestPool {
        assert!(nix::unistd::geteuid().is_root(), "{name} mounts btrfs: run it as root (scripts/test.sh)");
        let dir = tempfile::Builder::new().prefix(&format!("space-volume-{name}-")).tempdir().unwrap();
        let pool = Pool::open(dir.path().join("data"), PoolOptions::default()).unwrap();
        TestPool { pool: Some(Arc::new(pool)), dir }
    }

    fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().unwrap()
    }

    fn volumes(&self, blobs: &BlobStore) -> Volumes {
        Volumes::new(self.pool().clone(), blobs.clone(), self.dir.path().join("scratch"))
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            for (session, snapshot) in pool.list_snapshots().unwrap_or_default() {
                let _ = pool.delete_snapshot(&session, &snapshot);
            }
            for id in pool.list_sandbox_roots().unwrap_or_default() {
                let _ = pool.delete_sandbox_root(&id);
            }
            for t in pool.templates().list().unwrap_or_default() {
                let _ = pool.templates().delete(&t.name, t.version);
            }
            let _ = pool.reclaim_trash(u64::MAX);
        }
        if let Err(e) = Pool::unmount(self.dir.path().join("data")) {
            eprintln!("cleanup: unmount failed: {e}");
        }
    }
}

/// A session with two snapshots in `pool`: `first` with /tmp/first, `second` without it and
/// with a megabyte in /tmp/second.
fn two_snapshots(pool: &Pool) -> (SessionId, SnapshotId, SnapshotId) {
    let template = pool.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let (sandbox, session) = (SandboxId::generate(), SessionId::generate());
    let identity = SandboxIdentity { hostname: "exported".into(), nameserver: None };
    let root = pool.create_sandbox_root(&sandbox, &template, identity).unwrap();
    std::fs::write(root.join("tmp/first"), "one").unwrap();
    let first = SnapshotId::generate();
    pool.snapshot_sandbox_root(&sandbox, &session, &first).unwrap();
    std::fs::remove_file(root.join("tmp/first")).unwrap();
    std::fs::write(root.join("tmp/second"), vec![7u8; 1 << 20]).unwrap();
    let second = SnapshotId::generate();
    pool.snapshot_sandbox_root(&sandbox, &session, &second).unwrap();
    (session, first, second)
}

fn snapshot_file(pool: &Pool, session: &SessionId, snapshot: &SnapshotId, file: &str) -> PathBuf {
    pool.snapshot_dir(session, snapshot).join("rootfs").join(file)
}

#[tokio::test]
async fn a_snapshot_and_its_incremental_child_move_through_the_blob_store() {
    let (from, to) = (TestPool::new("export-from"), TestPool::new("export-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, first, second) = two_snapshots(from.pool());

    let exporter = from.volumes(&blobs);
    let whole = exporter.export_disk(&session, &first, None, None).await.unwrap();
    let delta = exporter.export_disk(&session, &second, Some(&first), None).await.unwrap();
    assert_eq!(delta.parent.as_ref(), Some(&first));
    assert!(delta.stream.size < whole.stream.size, "delta {:?}, whole {:?}", delta.stream, whole.stream);
    assert!(blobs.exists(&whole.stream).await.unwrap() && blobs.exists(&delta.stream).await.unwrap());

    let importer = to.volumes(&blobs);
    importer.import_disk(&session, &first, &whole, None).await.unwrap();
    importer.import_disk(&session, &second, &delta, None).await.unwrap();
    let dst = to.pool();
    assert_eq!(std::fs::read_to_string(snapshot_file(dst, &session, &first, "tmp/first")).unwrap(), "one");
    assert_eq!(std::fs::read(snapshot_file(dst, &session, &second, "tmp/second")).unwrap(), vec![7u8; 1 << 20]);
    assert!(!snapshot_file(dst, &session, &second, "tmp/first").exists());
    // No stream stays behind in the scratch directories.
    for t in [&from, &to] {
        assert_eq!(std::fs::read_dir(t.dir.path().join("scratch")).unwrap().count(), 0);
    }
    for export in [&whole, &delta] {
        blobs.delete(&export.stream).await.unwrap();
    }
}

#[tokio::test]
async fn a_corrupted_stream_is_refused_and_nothing_is_received() {
    let (from, to) = (TestPool::new("corrupt-from"), TestPool::new("corrupt-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, first, _) = two_snapshots(from.pool());
    let export = from.volumes(&blobs).export_disk(&session, &first, None, None).await.unwrap();

    // One flipped bit in the middle of the stream, same size.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    blobs.get_to_file(&export.stream, &good).await.unwrap();
    let mut bytes = std::fs::read(&good).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    blobs.replace_object(&export.stream, bytes).await.unwrap();

    let err = to.volumes(&blobs).import_disk(&session, &first, &export, None).await.unwrap_err();
    assert!(matches!(err, VolumeError::Blob(BlobError::Corrupt { .. })), "{err:?}");
    assert!(!to.pool().snapshot_dir(&session, &first).join("rootfs").exists());
    assert!(to.pool().list_snapshots().unwrap().is_empty());
    blobs.delete(&export.stream).await.unwrap();
}

/// Makes `snapshot` a full one as the node does: process images beside the root, then the
/// binary its processes ran (written last: a full snapshot with it is complete).
fn make_full(pool: &Pool, session: &SessionId, snapshot: &SnapshotId, dir: &std::path::Path) {
    let images = pool.snapshot_images_dir(session, snapshot);
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("pages-1.img"), vec![3u8; 300_000]).unwrap();
    std::fs::write(images.join("core-1.img"), "registers").unwrap();
    let binary = dir.join("spaced");
    std::fs::write(&binary, "a static spaced").unwrap();
    let kept = pool.keep_binary(&binary).unwrap();
    pool.link_snapshot_binary(session, snapshot, &kept).unwrap();
}

#[tokio::test]
async fn a_full_snapshot_moves_whole_and_a_corrupt_image_leaves_nothing() {
    let (from, to) = (TestPool::new("full-from"), TestPool::new("full-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, first, _) = two_snapshots(from.pool());
    make_full(from.pool(), &session, &first, from.dir.path());

    let export = from.volumes(&blobs).export_snapshot(&session, &first, None, None).await.unwrap();
    let names: Vec<&str> = export.images.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["core-1.img", "pages-1.img"]);
    assert!(export.is_full());
    let importer = to.volumes(&blobs);
    importer.import_snapshot(&session, &first, &export, None, &[]).await.unwrap();
    let dst = to.pool();
    assert!(dst.snapshot_has_images(&session, &first), "the binary arrived last");
    assert_eq!(std::fs::read(dst.snapshot_binary(&session, &first)).unwrap(), b"a static spaced");
    let images = dst.snapshot_images_dir(&session, &first);
    assert_eq!(std::fs::read(images.join("pages-1.img")).unwrap(), vec![3u8; 300_000]);
    assert_eq!(std::fs::read_to_string(snapshot_file(dst, &session, &first, "tmp/first")).unwrap(), "one");
    assert!(importer.holds(&session, &first, &export));
    importer.import_snapshot(&session, &first, &export, None, &[]).await.expect("a second import finds it there");

    // Into a third pool, with one image's bytes changed: refused, and nothing of it stays.
    let third = TestPool::new("full-corrupt");
    let pages = export.images.iter().find(|f| f.name == "pages-1.img").unwrap();
    blobs.replace_object(&pages.blob, vec![4u8; 300_000]).await.unwrap();
    let err = third.volumes(&blobs).import_snapshot(&session, &first, &export, None, &[]).await.unwrap_err();
    assert!(matches!(err, VolumeError::Blob(BlobError::Corrupt { .. })), "{err:?}");
    assert!(!third.pool().snapshot_images_dir(&session, &first).exists());
    assert!(!third.pool().snapshot_has_images(&session, &first));
    assert!(third.pool().list_snapshots().unwrap().is_empty(), "the received root is removed too");

    // An export naming a file outside the images directory is refused before anything is read.
    let mut escaping = export.clone();
    escaping.images[0].name = "../escaped".into();
    let err = third.volumes(&blobs).import_snapshot(&session, &first, &escaping, None, &[]).await.unwrap_err();
    assert!(matches!(err, VolumeError::NotPlain { .. }), "{err:?}");
}

#[tokio::test]
async fn imports_of_one_snapshot_started_together_all_find_it_whole() {
    let (from, to) = (TestPool::new("together-from"), TestPool::new("together-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, first, _) = two_snapshots(from.pool());
    make_full(from.pool(), &session, &first, from.dir.path());
    let export = from.volumes(&blobs).export_snapshot(&session, &first, None, None).await.unwrap();

    // As forks ×4 of one snapshot placed on a node that does not hold it.
    let importer = to.volumes(&blobs);
    let imports = (0..4).map(|_| importer.import_snapshot(&session, &first, &export, None, &[]));
    for (i, imported) in futures::future::join_all(imports).await.into_iter().enumerate() {
        imported.unwrap_or_else(|e| panic!("import {i}: {e:?}"));
    }
    let dst = to.pool();
    assert!(importer.holds(&session, &first, &export));
    assert_eq!(std::fs::read_to_string(snapshot_file(dst, &session, &first, "tmp/first")).unwrap(), "one");
    let images = dst.snapshot_images_dir(&session, &first);
    assert_eq!(std::fs::read(images.join("pages-1.img")).unwrap(), vec![3u8; 300_000]);
    let mode = |path: &std::path::Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
    };
    // What CRIU gives its own images (restored tasks read them inside the sandbox's user
    // namespace), under a root only root may enter.
    assert_eq!(mode(&images.join("pages-1.img")), 0o644);
    assert_eq!(mode(images.ancestors().nth(2).unwrap()), 0o700, "the images root");
    assert_eq!(dst.list_snapshots().unwrap().len(), 1);
}

#[tokio::test]
async fn an_import_uses_the_spaced_its_pool_keeps_and_fetches_one_it_does_not() {
    let (from, to) = (TestPool::new("kept-from"), TestPool::new("kept-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, first, second) = two_snapshots(from.pool());
    make_full(from.pool(), &session, &first, from.dir.path());
    make_full(from.pool(), &session, &second, from.dir.path());
    let export = from.volumes(&blobs).export_snapshot(&session, &first, None, None).await.unwrap();
    let second_export = from.volumes(&blobs).export_snapshot(&session, &second, None, None).await.unwrap();
    let spaced = export.spaced.clone().unwrap();
    // Named by the binary the pool keeps (not read again), and the same for both snapshots.
    assert!(from.pool().kept_binary(&spaced.sha256).is_some(), "{spaced:?}");
    assert_eq!((spaced.size, second_export.spaced.as_ref()), (15, Some(&spaced)));

    // The object is gone, but `to` keeps a binary of that hash: nothing to fetch.
    let binary = to.dir.path().join("spaced");
    std::fs::write(&binary, "a static spaced").unwrap();
    to.pool().keep_binary(&binary).unwrap();
    blobs.delete(&spaced).await.unwrap();
    to.volumes(&blobs).import_snapshot(&session, &first, &export, None, &[]).await.expect("the kept binary serves");
    assert_eq!(std::fs::read(to.pool().snapshot_binary(&session, &first)).unwrap(), b"a static spaced");

    // A kept copy whose bytes no longer match its name is not used: the object is fetched,
    // and here it is gone, so the import fails whole.
    let kept = to.pool().kept_binary(&spaced.sha256).unwrap();
    std::fs::remove_file(to.pool().snapshot_binary(&session, &first)).unwrap();
    std::fs::remove_file(&kept).unwrap();
    std::fs::write(&kept, "something else").unwrap();
    assert_eq!(to.pool().kept_binary(&spaced.sha256), None);
    let err = to.volumes(&blobs).import_snapshot(&session, &second, &second_export, None, &[]).await.unwrap_err();
    assert!(matches!(err, VolumeError::Blob(BlobError::Missing { .. })), "{err:?}");
    assert!(!to.pool().snapshot_has_images(&session, &second));
    assert_eq!(to.pool().kept_binary("../binaries/x"), None, "not a hash: names no file");
}

/// With a key, the blob store holds the root's stream and the images encrypted: no run of
/// their bytes is in any object but the (public) `spaced`; they import with the key only, and
/// a wrong key leaves nothing.
#[tokio::test]
async fn an_encrypted_export_holds_no_plaintext_and_opens_with_its_key_only() {
    let (from, to) = (TestPool::new("sealed-from"), TestPool::new("sealed-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, _, second) = two_snapshots(from.pool());
    make_full(from.pool(), &session, &second, from.dir.path());
    let key = SnapshotKey::new([9u8; 32]);

    let export = from.volumes(&blobs).export_snapshot(&session, &second, None, Some(&key)).await.unwrap();
    assert!(export.encrypted && export.is_full());
    let (root_run, image_run) = (vec![7u8; 64], vec![3u8; 64]);
    for blob in std::iter::once(&export.disk.stream).chain(export.images.iter().map(|f| &f.blob)) {
        let bytes = blobs.get_bytes(blob).await.unwrap();
        let found = bytes.windows(64).any(|w| w == &root_run[..] || w == &image_run[..]);
        assert!(!found, "plaintext in object {}", blob.sha256);
    }
    let spaced = blobs.get_bytes(export.spaced.as_ref().unwrap()).await.unwrap();
    assert_eq!(&spaced[..], b"a static spaced", "the binary is not tenant data");

    let importer = to.volumes(&blobs);
    let err = importer.import_snapshot(&session, &second, &export, None, &[]).await.unwrap_err();
    assert!(matches!(err, VolumeError::NoKey), "{err:?}");
    let wrong = SnapshotKey::new([8u8; 32]);
    let err = importer.import_snapshot(&session, &second, &export, Some(&wrong), &[]).await.unwrap_err();
    assert!(matches!(err, VolumeError::Key(space_keys::KeyError::Corrupt { .. })), "{err:?}");
    assert!(to.pool().list_snapshots().unwrap().is_empty(), "nothing of a failed import stays");

    importer.import_snapshot(&session, &second, &export, Some(&key), &[]).await.unwrap();
    let dst = to.pool();
    assert_eq!(std::fs::read(snapshot_file(dst, &session, &second, "tmp/second")).unwrap(), vec![7u8; 1 << 20]);
    // The images stay encrypted, as the node keeps its own; a restore opens them.
    let images = dst.snapshot_images_dir(&session, &second);
    assert!(space_volume::sealed::images_sealed(&images).unwrap());
    let opened = to.dir.path().join("opened");
    space_volume::sealed::unseal_images(&key, &images, &opened).unwrap();
    assert_eq!(std::fs::read(opened.join("pages-1.img")).unwrap(), vec![3u8; 300_000]);
    assert_eq!(std::fs::read(dst.snapshot_binary(&session, &second)).unwrap(), b"a static spaced");
}

/// Images the node sealed already go to the blob store as they are (no second encryption),
/// only with a key (their export must say it is encrypted), and come back sealed.
#[tokio::test]
async fn images_sealed_on_the_node_travel_as_they_are() {
    let (from, to) = (TestPool::new("at-rest-from"), TestPool::new("at-rest-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, _, second) = two_snapshots(from.pool());
    make_full(from.pool(), &session, &second, from.dir.path());
    let key = SnapshotKey::new([4u8; 32]);
    let images = from.pool().snapshot_images_dir(&session, &second);
    let plain = from.dir.path().join("plain");
    std::fs::rename(&images, &plain).unwrap();
    space_volume::sealed::seal_images(&key, &plain, &images).unwrap();

    let exporter = from.volumes(&blobs);
    let err = exporter.export_snapshot(&session, &second, None, None).await.unwrap_err();
    assert!(matches!(err, VolumeError::SealedWithoutKey), "{err:?}");
    let export = exporter.export_snapshot(&session, &second, None, Some(&key)).await.unwrap();
    assert!(export.encrypted);
    for file in &export.images {
        let stored = blobs.get_bytes(&file.blob).await.unwrap();
        assert_eq!(&stored[..], std::fs::read(images.join(&file.name)).unwrap(), "{} re-encrypted", file.name);
    }

    to.volumes(&blobs).import_snapshot(&session, &second, &export, Some(&key), &[]).await.unwrap();
    let arrived = to.pool().snapshot_images_dir(&session, &second);
    let opened = to.dir.path().join("opened");
    space_volume::sealed::unseal_images(&key, &arrived, &opened).unwrap();
    assert_eq!(std::fs::read(opened.join("core-1.img")).unwrap(), b"registers");
}

/// A full snapshot exported against its parent goes to a pool that lacks the parent with
/// the parent's root (each decrypted with its own key), and only so; the parent's root goes
/// once it served. An export against a parent the exporting pool lacks goes whole.
#[tokio::test]
async fn an_incremental_full_snapshot_arrives_with_the_ancestors_the_pool_lacks() {
    let (from, to) = (TestPool::new("chain-from"), TestPool::new("chain-to"));
    let blob_dir = tempfile::tempdir().unwrap();
    let blobs = space_blob::store_under_test(blob_dir.path());
    let (session, first, second) = two_snapshots(from.pool());
    make_full(from.pool(), &session, &second, from.dir.path());
    let (key1, key2) = (SnapshotKey::new([1u8; 32]), SnapshotKey::new([2u8; 32]));

    let exporter = from.volumes(&blobs);
    let parent = exporter.export_snapshot(&session, &first, None, Some(&key1)).await.unwrap();
    let child = exporter.export_snapshot(&session, &second, Some(&first), Some(&key2)).await.unwrap();
    assert_eq!(child.disk.parent.as_ref(), Some(&first));
    let unknown = SnapshotId::generate();
    let whole = exporter.export_snapshot(&session, &second, Some(&unknown), Some(&key2)).await.unwrap();
    assert_eq!(whole.disk.parent, None, "a parent the pool lacks: whole");
    assert!(child.disk.stream.size < whole.disk.stream.size, "{:?} {:?}", child.disk, whole.disk);

    let importer = to.volumes(&blobs);
    let err = importer.import_snapshot(&session, &second, &child, Some(&key2), &[]).await.unwrap_err();
    assert!(matches!(&err, VolumeError::MissingParent { snapshot } if *snapshot == first), "{err:?}");
    assert!(to.pool().list_snapshots().unwrap().is_empty(), "nothing of a failed import stays");
    let wrong =
        [space_volume::ParentDisk { snapshot: first.clone(), disk: parent.disk.clone(), key: Some(key2.clone()) }];
    let err = importer.import_snapshot(&session, &second, &child, Some(&key2), &wrong).await.unwrap_err();
    let VolumeError::Ancestor { snapshot, source } = &err else { panic!("{err:?}") };
    assert_eq!(snapshot, &first);
    assert!(matches!(**source, VolumeError::Key(space_keys::KeyError::Corrupt { .. })), "{err:?}");
    assert!(to.pool().list_snapshots().unwrap().is_empty(), "nothing of a failed import stays");

    let parents = [space_volume::ParentDisk { snapshot: first.clone(), disk: parent.disk.clone(), key: Some(key1) }];
    importer.import_snapshot(&session, &second, &child, Some(&key2), &parents).await.unwrap();
    let dst = to.pool();
    assert_eq!(std::fs::read(snapshot_file(dst, &session, &second, "tmp/second")).unwrap(), vec![7u8; 1 << 20]);
    assert!(!snapshot_file(dst, &session, &second, "tmp/first").exists());
    assert!(dst.snapshot_has_images(&session, &second));
    let held: Vec<SnapshotId> = dst.list_snapshots().unwrap().into_iter().map(|(_, s)| s).collect();
    assert_eq!(held, std::slice::from_ref(&second), "the parent's root served, and went");
    importer.import_snapshot(&session, &second, &child, Some(&key2), &[]).await.expect("held: nothing to do");
}
