//! Sandbox roots: O(1) snapshots of a template with per-sandbox identity (run as root).

mod common;

use std::process::Command;
use std::time::Instant;

use common::{TestPool, owner, percentiles};
use space_api::SandboxId;
use space_storage::{SandboxIdentity, StorageError, btrfs, no_progress};

fn identity(hostname: &str) -> SandboxIdentity {
    SandboxIdentity { hostname: hostname.into(), nameserver: None }
}

#[test]
fn roots_are_independent_writable_snapshots_with_own_identity() {
    let Some(t) = TestPool::new("roots") else {
        return;
    };
    let pool = t.pool();
    let template = pool.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let (a, b) = (SandboxId::generate(), SandboxId::generate());
    let root_a = pool.create_sandbox_root(&a, &template, identity("alpha")).unwrap();
    let root_b = pool.create_sandbox_root(&b, &template, identity("beta")).unwrap();
    assert_eq!(root_a, pool.sandbox_root_path(&a));
    assert!(btrfs::is_subvolume(&root_a).unwrap());
    assert!(!btrfs::is_readonly(&root_a).unwrap());

    let read = |root: &std::path::Path, f: &str| std::fs::read_to_string(root.join("etc").join(f)).unwrap();
    assert_eq!(read(&root_a, "hostname"), "alpha\n");
    assert_eq!(read(&root_b, "hostname"), "beta\n");
    assert!(read(&root_a, "hosts").contains("127.0.0.1\tlocalhost alpha"));
    let (id_a, id_b) = (read(&root_a, "machine-id"), read(&root_b, "machine-id"));
    assert_eq!(id_a.len(), 33);
    assert_ne!(id_a, id_b);
    for f in ["hostname", "machine-id", "hosts"] {
        assert_eq!(owner(&root_a.join("etc").join(f)), (100_000, 100_000), "{f}");
    }
    assert_eq!(owner(&root_a.join("bin/busybox")), (100_000, 100_000));

    // Writable, and writes stay in the sandbox.
    std::fs::write(root_a.join("tmp/scratch"), "x").unwrap();
    let template_root = pool.templates().path(&template).unwrap();
    assert!(!template_root.join("tmp/scratch").exists());
    assert!(!root_b.join("tmp/scratch").exists());
    assert!(!template_root.join("etc/hostname").exists());
    let out = Command::new("chroot")
        .arg(&root_a)
        .args(["/bin/sh", "-c", "hostname -F /etc/hostname >/dev/null; cat /etc/hostname"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "alpha\n");

    // Junk in sandboxes/ is ignored by the listing.
    std::fs::create_dir(pool.root().join("sandboxes/not-an-id")).unwrap();
    let mut expect = vec![a.clone(), b.clone()];
    expect.sort();
    assert_eq!(pool.list_sandbox_roots().unwrap(), expect);
    std::fs::remove_dir(pool.root().join("sandboxes/not-an-id")).unwrap();

    // Re-creating (an interrupted attempt) replaces the root.
    let again = pool.create_sandbox_root(&a, &template, identity("alpha2")).unwrap();
    assert!(!again.join("tmp/scratch").exists());
    assert_eq!(read(&again, "hostname"), "alpha2\n");

    // Delete is idempotent and removes the directory.
    pool.delete_sandbox_root(&a).unwrap();
    pool.delete_sandbox_root(&a).unwrap();
    assert!(!pool.sandbox_dir(&a).exists());
    pool.delete_sandbox_root(&SandboxId::generate()).unwrap();
    assert_eq!(pool.list_sandbox_roots().unwrap(), vec![b.clone()]);

    // Deleting the template does not affect existing roots.
    pool.templates().delete(&template.name, template.version).unwrap();
    assert_eq!(read(&root_b, "hostname"), "beta\n");
    let err = pool.create_sandbox_root(&a, &template, identity("gone")).unwrap_err();
    assert!(matches!(err, StorageError::TemplateNotFound { .. }), "{err}");
}

#[test]
fn bad_identity_and_templates_are_rejected() {
    let Some(t) = TestPool::new("badroots") else {
        return;
    };
    let pool = t.pool();
    let template = pool.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let id = SandboxId::generate();
    let err = pool.create_sandbox_root(&id, &template, identity("evil\n1.2.3.4 bank")).unwrap_err();
    assert!(matches!(err, StorageError::InvalidHostname { .. }), "{err}");
    let mut forged = template.clone();
    forged.name = "../../etc".into();
    let err = pool.create_sandbox_root(&id, &forged, identity("x")).unwrap_err();
    assert!(matches!(err, StorageError::InvalidTemplateName { .. }), "{err}");
    assert!(pool.list_sandbox_roots().unwrap().is_empty());
}

#[test]
fn retired_roots_leave_the_pool_until_reclaimed() {
    let Some(t) = TestPool::new("retire") else {
        return;
    };
    let pool = t.pool();
    let trash = pool.root().join("trash");
    let template = pool.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let (a, b) = (SandboxId::generate(), SandboxId::generate());
    pool.create_sandbox_root(&a, &template, identity("alpha")).unwrap();
    assert_eq!(pool.trash_len().unwrap(), 0);

    pool.retire_sandbox_root(&a).unwrap();
    assert!(!pool.sandbox_dir(&a).exists());
    assert!(pool.list_sandbox_roots().unwrap().is_empty());
    assert!(btrfs::is_subvolume(&trash.join(a.as_str()).join("rootfs")).unwrap());
    assert_eq!(pool.trash_len().unwrap(), 1);

    // Retiring again, or a sandbox that never had a root, is fine and moves nothing.
    pool.retire_sandbox_root(&a).unwrap();
    pool.retire_sandbox_root(&SandboxId::generate()).unwrap();
    assert_eq!(pool.trash_len().unwrap(), 1);

    // Other roots are unaffected, and the same id can get a root again.
    let root_b = pool.create_sandbox_root(&b, &template, identity("beta")).unwrap();
    let root_a = pool.create_sandbox_root(&a, &template, identity("alpha2")).unwrap();
    let mut expect = vec![a.clone(), b.clone()];
    expect.sort();
    assert_eq!(pool.list_sandbox_roots().unwrap(), expect);
    assert_eq!(std::fs::read_to_string(root_a.join("etc/hostname")).unwrap(), "alpha2\n");

    // Retired while the first one is still in the trash: a unique name, nothing overwritten.
    std::fs::write(root_a.join("tmp/second"), "x").unwrap();
    pool.retire_sandbox_root(&a).unwrap();
    let second = trash.join(format!("{a}.1"));
    assert!(second.join("rootfs/tmp/second").exists());
    assert!(!trash.join(a.as_str()).join("rootfs/tmp/second").exists());
    assert_eq!(pool.list_sandbox_roots().unwrap(), vec![b.clone()]);

    // Reclaim tolerates entries without a root, plain files and a read-only root.
    std::fs::create_dir_all(trash.join("no-rootfs/junk")).unwrap();
    std::fs::write(trash.join("stray-file"), "x").unwrap();
    btrfs::set_readonly(&second.join("rootfs"), true).unwrap();
    assert_eq!(pool.trash_len().unwrap(), 4);
    assert_eq!(pool.reclaim_trash(u64::MAX).unwrap(), 4);
    assert_eq!(pool.trash_len().unwrap(), 0);
    assert_eq!(pool.reclaim_trash(u64::MAX).unwrap(), 0);
    assert_eq!(std::fs::read_to_string(root_b.join("etc/hostname")).unwrap(), "beta\n");

    // The trash survives reopening the pool (it is part of the layout).
    pool.retire_sandbox_root(&b).unwrap();
    drop(root_b);
    let mut t = t;
    t.reopen();
    assert_eq!(t.pool().trash_len().unwrap(), 1);
    assert_eq!(t.pool().reclaim_trash(u64::MAX).unwrap(), 1);
    assert!(t.pool().list_sandbox_roots().unwrap().is_empty());
}

/// Linux 6.13 added BTRFS_IOC_SUBVOL_SYNC_WAIT.
fn kernel_counts_pending_deletions() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (6, 13)
}

#[test]
fn reclaim_waits_for_the_kernel_cleaner() {
    let Some(t) = TestPool::new("reclaim") else {
        return;
    };
    let pool = t.pool();
    let pending = btrfs::pending_deletions(pool.root()).unwrap();
    if kernel_counts_pending_deletions() {
        assert!(pending.is_some(), "this kernel has BTRFS_IOC_SUBVOL_SYNC_WAIT");
    }
    // Nothing deleted yet: nothing to wait for.
    btrfs::wait_for_one_deletion(pool.root()).unwrap();
    // Not btrfs: the kernel cannot tell, and waiting is a no-op.
    let elsewhere = tempfile::tempdir().unwrap();
    if !btrfs::is_btrfs(elsewhere.path()).unwrap() {
        assert_eq!(btrfs::pending_deletions(elsewhere.path()).unwrap(), None);
        btrfs::wait_for_one_deletion(elsewhere.path()).unwrap();
    }

    let template = pool.templates().build_builtin("busybox", None, &no_progress).unwrap();
    let ids: Vec<SandboxId> = (0..3).map(|_| SandboxId::generate()).collect();
    for id in &ids {
        pool.create_sandbox_root(id, &template, identity("box")).unwrap();
        pool.retire_sandbox_root(id).unwrap();
    }
    assert_eq!(pool.trash_len().unwrap(), 3);
    assert_eq!(pool.reclaim_trash(1).unwrap(), 3);
    assert_eq!(pool.trash_len().unwrap(), 0);
    if let Some(n) = btrfs::pending_deletions(pool.root()).unwrap() {
        // With a cap of 1, reclaiming waited before each deletion until the queue was empty.
        assert!(n <= 1, "{n} deletions pending");
        while btrfs::pending_deletions(pool.root()).unwrap().unwrap_or(0) > 0 {
            btrfs::wait_for_one_deletion(pool.root()).unwrap();
        }
    }
}

/// Creates and deletes 50 roots; returns (create p50, p90, delete p50, p90) in microseconds.
fn time_roots(pool: &space_storage::Pool, template: &space_storage::TemplateInfo) -> [u128; 4] {
    let ids: Vec<SandboxId> = (0..50).map(|_| SandboxId::generate()).collect();
    let mut create = Vec::new();
    for id in &ids {
        let start = Instant::now();
        pool.create_sandbox_root(id, template, identity("box")).unwrap();
        create.push(start.elapsed().as_micros());
    }
    let mut delete = Vec::new();
    for id in &ids {
        let start = Instant::now();
        pool.delete_sandbox_root(id).unwrap();
        delete.push(start.elapsed().as_micros());
    }
    let ((c50, c90), (d50, d90)) = (percentiles(create), percentiles(delete));
    [c50, c90, d50, d90]
}

/// Times the bare snapshot ioctl 50 times.
fn time_snapshots(pool: &space_storage::Pool, template: &space_storage::TemplateInfo) -> (u128, u128) {
    let source = pool.templates().path(template).unwrap();
    let mut snap = Vec::new();
    for i in 0..50 {
        let dest = pool.snapshots_dir().join(format!("s{i}"));
        let start = Instant::now();
        btrfs::snapshot(&source, &dest, false).unwrap();
        snap.push(start.elapsed().as_micros());
        btrfs::delete_subvolume(&dest).unwrap();
    }
    percentiles(snap)
}

#[test]
fn sandbox_root_timing() {
    let Some(mut t) = TestPool::new("timing") else {
        return;
    };
    let template = t.pool().templates().build_builtin("busybox", None, &no_progress).unwrap();
    for nobarrier in [false, true] {
        t.options.nobarrier = nobarrier;
        t.reopen();
        let mounted = space_storage::mount::mount_at(t.pool().root()).unwrap().unwrap();
        assert_eq!(mounted.has_option("nobarrier"), nobarrier);
        let (s50, s90) = time_snapshots(t.pool(), &template);
        let [c50, c90, d50, d90] = time_roots(t.pool(), &template);
        let mode = if nobarrier { "nobarrier" } else { "default" };
        eprintln!("[{mode}] btrfs::snapshot alone (50 runs): p50 {s50} us, p90 {s90} us");
        eprintln!("[{mode}] create_sandbox_root (busybox, 50 runs): p50 {c50} us, p90 {c90} us");
        eprintln!("[{mode}] delete_sandbox_root (busybox, 50 runs): p50 {d50} us, p90 {d90} us");
    }
}

#[test]
fn a_kept_binary_that_was_changed_is_written_anew() {
    let Some(t) = TestPool::new("kept") else {
        return;
    };
    let pool = t.pool();
    let source = t.data_dir().join("spaced-original");
    std::fs::write(&source, b"\x7fELF the real binary").unwrap();
    let kept = pool.keep_binary(&source).unwrap();
    let name = kept.file_name().unwrap().to_str().unwrap().to_owned();
    // An old mtime, so the write below gets another one on a kernel with coarse timestamps.
    let old = std::fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1));
    std::fs::File::options().write(true).open(&kept).unwrap().set_times(old).unwrap();
    assert_eq!(pool.kept_binary(&name), Some(kept.clone()), "checked once, and remembered");
    // What a slip of a sandbox's read-only bind could do to the pool's copy: in place, even
    // at the same size, it is found out.
    std::fs::set_permissions(&kept, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(&kept, b"#!/bin/sh\necho plant").unwrap();
    assert_eq!(std::fs::metadata(&kept).unwrap().len(), 20, "as long as the real one");
    assert_eq!(pool.kept_binary(&name), None);
    assert_eq!(pool.keep_binary(&source).unwrap(), kept);
    assert_eq!(std::fs::read(&kept).unwrap(), b"\x7fELF the real binary", "the planted content was kept");
}
