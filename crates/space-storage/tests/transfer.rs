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
