//! Session quota groups go once nothing uses them, and not before (run as root).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::TestPool;
use space_api::{SandboxId, SessionId, SnapshotId};
use space_storage::quota::{QgroupId, Quotas, subvolume_id};
use space_storage::{Pool, SandboxIdentity, btrfs, no_progress};

const MIB: u64 = 1 << 20;

fn identity() -> SandboxIdentity {
    SandboxIdentity { hostname: "q".into(), nameserver: None }
}

/// What the node does in the background: deletes what is in the trash, commits (qgroup
/// usage in sysfs is as of the last commit), then sweeps.
fn commit_and_sweep(pool: &Pool) -> usize {
    pool.reclaim_trash(u64::MAX).unwrap();
    let status = Command::new("sync").arg("-f").arg(pool.root()).status().unwrap();
    assert!(status.success());
    pool.sweep_quota_groups().unwrap()
}

/// Sweeps until `done` holds; the kernel's cleaner drops deleted subvolumes in the background.
fn sweep_until(pool: &Pool, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        if Instant::now() > deadline {
            let show = Command::new("btrfs").args(["qgroup", "show", "-pcre"]).arg(pool.root()).output().unwrap();
            panic!("still not true after 120 s of sweeps: {what}\n{}", String::from_utf8_lossy(&show.stdout));
        }
        commit_and_sweep(pool);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_session_group_goes_with_its_last_root_and_snapshot_and_a_live_one_stays() {
    let Some(t) = TestPool::new("quota-sweep") else {
        return;
    };
    let pool = t.pool();
    assert!(pool.disk_limits_enforced(), "the test pool is an image with simple quotas");
    let template = pool.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let (gone, live) = (SessionId::generate(), SessionId::generate());
    let (a, b) = (SandboxId::generate(), SandboxId::generate());
    let root_a = pool.create_sandbox_root(&a, &template, identity()).unwrap();
    pool.create_sandbox_root(&b, &template, identity()).unwrap();
    pool.limit_session_disk(&a, &gone, Some(64 * MIB)).unwrap();
    pool.limit_session_disk(&b, &live, Some(64 * MIB)).unwrap();
    std::fs::write(root_a.join("data"), vec![7u8; 4 * MIB as usize]).unwrap();
    let snapshot = SnapshotId::generate();
    pool.snapshot_sandbox_root(&a, &gone, &snapshot).unwrap();

    // The root goes, but the snapshot still holds the data it wrote: once the kernel's cleaner
    // has dropped the root, its group and the session's are still charged, and both stay.
    let quotas = Quotas::of(pool.root()).unwrap();
    let (id_a, id_b) = (subvolume_id(&root_a).unwrap(), subvolume_id(&pool.sandbox_root_path(&b)).unwrap());
    pool.delete_sandbox_root(&a).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while quotas.subvolume_exists(id_a).unwrap() {
        assert!(Instant::now() < deadline, "the cleaner did not drop the deleted root in 120 s");
        btrfs::wait_for_one_deletion(pool.root()).unwrap();
    }
    let exists = (quotas.subvolume_exists(id_a).unwrap(), quotas.subvolume_exists(id_b).unwrap());
    assert_eq!(exists, (false, true), "the deleted root and the live one");
    for _ in 0..3 {
        commit_and_sweep(pool);
        let root_group = quotas.usage(QgroupId::of_subvolume(id_a)).unwrap();
        assert!(root_group.is_some_and(|u| u >= 4 * MIB), "the deleted root's charged group went: {root_group:?}");
        let used = pool.session_disk_usage(&gone).unwrap();
        assert!(used.is_some_and(|u| u >= 4 * MIB), "a group still charged was removed: {used:?}");
    }

    // Then the snapshot goes: nothing is charged to the session any more, and its group goes.
    pool.delete_snapshot(&gone, &snapshot).unwrap();
    sweep_until(pool, "the unused session group is removed", || pool.session_disk_usage(&gone).unwrap().is_none());
    assert_eq!(quotas.usage(QgroupId::of_subvolume(id_a)).unwrap(), None, "the deleted root's group went first");
    assert!(quotas.usage(QgroupId::of_subvolume(id_b)).unwrap().is_some(), "the live root's group stays");
    assert!(pool.session_disk_usage(&live).unwrap().is_some(), "the live session's group was removed");

    // A session whose group went gets it back, limit and all, with its next root.
    let c = SandboxId::generate();
    let root_c = pool.create_sandbox_root(&c, &template, identity()).unwrap();
    pool.limit_session_disk(&c, &gone, Some(2 * MIB)).unwrap();
    let err = std::fs::write(root_c.join("big"), vec![1u8; 8 * MIB as usize])
        .and_then(|()| Command::new("sync").arg("-f").arg(&root_c).status().map(|_| ()))
        .and_then(|()| std::fs::write(root_c.join("more"), vec![1u8; 8 * MIB as usize]));
    assert_eq!(err.map_err(|e| e.raw_os_error()), Err(Some(nix::libc::EDQUOT)), "the limit holds again");
    for id in [&b, &c] {
        pool.delete_sandbox_root(id).unwrap();
    }
}
