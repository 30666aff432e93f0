//! Pool lifecycle and the btrfs ioctl module, on a real loop-mounted btrfs (run as root).

mod common;

use common::{TestPool, is_erofs, is_mounted};
use space_storage::{Backing, Pool, PoolOptions, StorageError, btrfs};

#[test]
fn open_creates_layout_and_mounts_image() {
    let Some(t) = TestPool::new("layout") else {
        return;
    };
    let pool = t.pool();
    assert_eq!(pool.root(), t.data_dir().canonicalize().unwrap().join("pool"));
    let image = pool.root().parent().unwrap().join("pool.img");
    assert_eq!(pool.backing(), &Backing::Image { image: image.clone() });
    assert!(is_mounted(pool.root()));
    assert!(btrfs::is_btrfs(pool.root()).unwrap());
    for sub in ["templates", "sandboxes", "snapshots", "pods", "trash"] {
        assert!(pool.root().join(sub).is_dir(), "{sub}");
    }
    let meta = std::fs::metadata(&image).unwrap();
    // Half the free disk by default, in whole GiB (the image being sparse, free space is about
    // what it was before the image was made).
    let st = nix::sys::statvfs::statvfs(&image).unwrap();
    let half_free = st.blocks_available() * st.fragment_size() / 2;
    assert_eq!(meta.len() % (1 << 30), 0, "{}", meta.len());
    assert!(meta.len() >= 2 << 30 && meta.len() <= half_free + (1 << 30), "{} for {half_free}", meta.len());
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 < 1 << 30, "image must be sparse");
}

#[test]
fn reopen_mounted_then_unmount_then_remount() {
    let Some(mut t) = TestPool::new("reopen") else {
        return;
    };
    let marker = t.pool().snapshots_dir().join("marker");
    std::fs::write(&marker, "x").unwrap();
    // Already mounted: reused.
    t.reopen();
    assert!(matches!(t.pool().backing(), Backing::Image { .. }));
    assert!(marker.exists());
    // A second open while the first is alive is refused with a clear error.
    let err = Pool::open(t.data_dir(), PoolOptions::default()).unwrap_err();
    assert!(matches!(err, StorageError::PoolBusy { .. }), "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    // Unmount is idempotent; reopening mounts the existing image (no reformat).
    t.close();
    let root = t.data_dir().canonicalize().unwrap().join("pool");
    Pool::unmount(t.data_dir()).unwrap();
    assert!(!is_mounted(&root));
    Pool::unmount(t.data_dir()).unwrap();
    assert!(!marker.exists());
    t.reopen();
    assert!(is_mounted(&root));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x");
    std::fs::remove_file(&marker).unwrap();
}

#[test]
fn unmount_of_missing_data_dir_is_ok() {
    if common::require_root("unmount_missing").is_none() {
        return;
    }
    Pool::unmount("/nonexistent/space-storage-test").unwrap();
}

#[test]
fn open_removes_leftovers_of_interrupted_builds() {
    let Some(mut t) = TestPool::new("leftovers") else {
        return;
    };
    let templates = t.pool().root().join("templates");
    let staging = templates.join(".staging-busybox-0000abcd");
    btrfs::create_subvolume(&staging).unwrap();
    std::fs::write(staging.join("half"), "written").unwrap();
    btrfs::set_readonly(&staging, true).unwrap();
    // Renamed into place but metadata never written.
    let orphan = templates.join("orphan@1");
    btrfs::create_subvolume(&orphan).unwrap();
    // Metadata without a subvolume, and a temp file.
    std::fs::write(templates.join("ghost@1.json"), "{}").unwrap();
    std::fs::write(templates.join(".ghost@2.json.tmp"), "{").unwrap();
    t.reopen();
    let left: Vec<_> = std::fs::read_dir(&templates).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn btrfs_subvolume_ops() {
    let Some(t) = TestPool::new("btrfs") else {
        return;
    };
    let base = t.pool().snapshots_dir();
    let vol = base.join("vol");
    btrfs::create_subvolume(&vol).unwrap();
    assert!(btrfs::is_subvolume(&vol).unwrap());
    assert!(!btrfs::is_subvolume(&base).unwrap());
    assert!(!btrfs::is_subvolume(&base.join("missing")).unwrap());
    std::fs::create_dir_all(vol.join("a/b")).unwrap();
    std::fs::write(vol.join("a/b/file"), vec![7u8; 1 << 20]).unwrap();
    assert!(!btrfs::is_readonly(&vol).unwrap());

    // Read-only snapshot: content shared, writes refused, still deletable.
    let ro = base.join("ro");
    btrfs::snapshot(&vol, &ro, true).unwrap();
    assert!(btrfs::is_readonly(&ro).unwrap());
    assert_eq!(std::fs::read(ro.join("a/b/file")).unwrap().len(), 1 << 20);
    assert!(is_erofs(&std::fs::write(ro.join("new"), "x").unwrap_err()));
    btrfs::delete_subvolume(&ro).unwrap();
    assert!(!ro.exists());

    // Read-only flag toggles; a plain directory cannot be snapshotted.
    btrfs::set_readonly(&vol, true).unwrap();
    assert!(is_erofs(&std::fs::write(vol.join("new"), "x").unwrap_err()));
    btrfs::set_readonly(&vol, false).unwrap();
    std::fs::write(vol.join("new"), "x").unwrap();
    assert!(btrfs::snapshot(&vol.join("a"), &base.join("bad"), false).is_err());

    // Nested subvolumes inside a read-only subvolume with content: delete still works.
    btrfs::create_subvolume(&vol.join("a/nested")).unwrap();
    btrfs::create_subvolume(&vol.join("a/nested/deeper")).unwrap();
    std::fs::write(vol.join("a/nested/deeper/f"), "x").unwrap();
    btrfs::set_readonly(&vol, true).unwrap();
    btrfs::delete_subvolume(&vol).unwrap();
    assert!(!vol.exists());
    let err = btrfs::delete_subvolume(&vol).unwrap_err();
    assert_eq!(err.errno(), Some(nix::errno::Errno::ENOENT), "{err}");
}

/// A btrfs filesystem of our own, mounted under a tempdir; unmounted on drop.
struct OwnBtrfs {
    mnt: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl OwnBtrfs {
    fn new() -> OwnBtrfs {
        let dir = tempfile::Builder::new().prefix("space-storage-native-").tempdir().unwrap();
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image).unwrap().set_len(1 << 30).unwrap();
        let run = |cmd: &mut std::process::Command| assert!(cmd.status().unwrap().success());
        run(std::process::Command::new("mkfs.btrfs").args(["-q", "-K"]).arg(&image));
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run(std::process::Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mnt));
        OwnBtrfs { mnt, _dir: dir }
    }
}

impl Drop for OwnBtrfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn data_dir_on_btrfs_is_used_directly() {
    if common::require_root("native").is_none() {
        return;
    }
    let fs = OwnBtrfs::new();
    let data = fs.mnt.join("data");
    let pool = Pool::open(&data, PoolOptions::default()).unwrap();
    assert_eq!(pool.backing(), &Backing::DataDir);
    assert!(!is_mounted(pool.root()));
    assert!(!data.join("pool.img").exists());
    let template = pool.templates().build_builtin("busybox", None, &space_storage::no_progress).unwrap();
    let id = space_api::SandboxId::generate();
    let identity = space_storage::SandboxIdentity { hostname: "native".into(), nameserver: None };
    let root = pool.create_sandbox_root(&id, &template, identity).unwrap();
    assert!(btrfs::is_subvolume(&root).unwrap());
    pool.delete_sandbox_root(&id).unwrap();
    assert!(pool.templates().delete("busybox", 1).unwrap());
    drop(pool);
    Pool::unmount(&data).unwrap();
    assert!(data.join("pool/templates").is_dir(), "unmount of a native pool deletes nothing");
}
