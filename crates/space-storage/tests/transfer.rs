//! Snapshot roots from one pool to another as `btrfs send` streams, whole and incremental
//! (run as root).

mod common;

use common::{TestPool, owner};
use space_api::{SandboxId, SessionId, SnapshotId};
use space_storage::{SandboxIdentity, StorageError, btrfs, no_progress};

fn identity() -> SandboxIdentity {
    SandboxIdentity { hostname: "moved".into(), nameserver: None }
}

#[test]
fn a_snapshot_and_an_incremental_child_arrive_whole_in_another_pool() {
    let (Some(from), Some(to), Some(orphan)) =
        (TestPool::new("send-from"), TestPool::new("send-to"), TestPool::new("send-orphan"))
    else {
        return;
    };
    let (src, dst) = (from.pool(), to.pool());
    let template = src.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let (sandbox, session) = (SandboxId::generate(), SessionId::generate());
    let root = src.create_sandbox_root(&sandbox, &template, identity()).unwrap();
    std::fs::write(root.join("tmp/first"), "one").unwrap();
    let first = SnapshotId::generate();
    src.snapshot_sandbox_root(&sandbox, &session, &first).unwrap();
    std::fs::write(root.join("tmp/second"), vec![7u8; 1 << 20]).unwrap();
    std::fs::remove_file(root.join("tmp/first")).unwrap();
    let second = SnapshotId::generate();
    src.snapshot_sandbox_root(&sandbox, &session, &second).unwrap();

    let streams = tempfile::tempdir().unwrap();
    let (whole, delta) = (streams.path().join("first.send"), streams.path().join("second.send"));
    src.send_snapshot(&session, &first, None, &whole).unwrap();
    src.send_snapshot(&session, &second, Some((&session, &first)), &delta).unwrap();
    let size = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    // The delta holds the new megabyte, not the template again.
    assert!(size(&delta) < size(&whole), "delta {} B, whole {} B", size(&delta), size(&whole));

    dst.receive_snapshot(&session, &first, &whole).unwrap();
    dst.receive_snapshot(&session, &second, &delta).unwrap();
    let received = dst.snapshot_dir(&session, &second).join("rootfs");
    assert!(btrfs::is_readonly(&received).unwrap());
    assert_eq!(std::fs::read(received.join("tmp/second")).unwrap(), vec![7u8; 1 << 20]);
    assert!(!received.join("tmp/first").exists());
    assert_eq!(std::fs::read_to_string(dst.snapshot_dir(&session, &first).join("rootfs/tmp/first")).unwrap(), "one");
    // Ownership in the storage range travels as it is.
    assert_eq!(owner(&received.join("bin/busybox")), (100_000, 100_000));
    // A sandbox of the receiving pool starts from it.
    let restored = SandboxId::generate();
    let new_root = dst.create_sandbox_root_from_snapshot(&restored, &session, &second, Some(identity())).unwrap();
    assert_eq!(std::fs::read(new_root.join("tmp/second")).unwrap().len(), 1 << 20);

    // Without its parent, the delta is refused and leaves no snapshot behind.
    let err = orphan.pool().receive_snapshot(&session, &second, &delta).unwrap_err();
    assert!(matches!(err, StorageError::Command { .. }), "{err}");
    assert!(!orphan.pool().snapshot_dir(&session, &second).join("rootfs").exists());
}

#[test]
fn bytes_that_are_not_a_send_stream_are_refused() {
    let Some(t) = TestPool::new("not-a-stream") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"btrfs-stream? no, just bytes").unwrap();
    let (session, snapshot) = (SessionId::generate(), SnapshotId::generate());
    let err = t.pool().receive_snapshot(&session, &snapshot, &junk).unwrap_err();
    assert!(matches!(err, StorageError::Command { .. }), "{err}");
    assert!(!t.pool().snapshot_dir(&session, &snapshot).join("rootfs").exists());
}

/// A template sent from one pool is received in another as the same version with the same
/// metadata and files, read-only; receiving it again changes nothing, and a stream that is
/// not a template's leaves nothing behind.
#[test]
fn a_template_sent_from_one_pool_is_received_whole_in_another() {
    let (Some(from), Some(to)) = (TestPool::new("tsend"), TestPool::new("trecv")) else {
        return;
    };
    let sent = from.pool().templates().build_builtin("busybox", None, &no_progress).unwrap();
    let stream = from.data_dir().join("template.stream");
    from.pool().templates().send(&sent, &stream).unwrap();

    let store = to.pool().templates();
    let mut wanted = sent.clone();
    wanted.version = 3;
    let received = store.receive(&wanted, &stream).unwrap();
    assert_eq!(received, wanted, "the very version and metadata");
    assert_eq!(store.list().unwrap(), vec![wanted.clone()]);
    let root = store.path(&received).unwrap();
    assert!(btrfs::is_readonly(&root).unwrap());
    let original = from.pool().templates().path(&sent).unwrap();
    for file in ["bin/busybox", "etc/passwd", "etc/profile"] {
        assert_eq!(std::fs::read(root.join(file)).unwrap(), std::fs::read(original.join(file)).unwrap(), "{file}");
        assert_eq!(owner(&root.join(file)), owner(&original.join(file)), "{file}");
    }
    assert_eq!(store.receive(&wanted, &stream).unwrap(), received, "a second receive changes nothing");
    // Another template under that version (made again after a delete this pool missed)
    // replaces it.
    let mut again = wanted.clone();
    again.created_at_ms += 1;
    assert_eq!(store.receive(&again, &stream).unwrap(), again);
    assert_eq!(store.list().unwrap(), vec![again.clone()]);

    let garbage = to.data_dir().join("garbage.stream");
    std::fs::write(&garbage, b"not a btrfs stream").unwrap();
    let mut other = sent.clone();
    other.name = "other".into();
    assert!(store.receive(&other, &garbage).is_err());
    let left: Vec<_> = std::fs::read_dir(store.dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 2, "only busybox@3 and its metadata: {left:?}");
}
