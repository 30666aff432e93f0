//! Root images and disk clones (root only: idmapped mounts, loop devices).

mod common;

use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::Path;
use std::process::Command;

use space_runtime_vm::{IdMap, make_root_image};
use space_storage::reflink as clone_disk;

fn debugfs(image: &Path, request: &str) -> String {
    let out = Command::new("debugfs").args(["-R", request]).arg(image).output().expect("debugfs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_image_keeps_modes_links_and_xattrs_and_shifts_owners_to_zero() {
    assert!(nix::unistd::geteuid().is_root(), "make_root_image needs root (idmapped mounts)");
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/setuid"), "x").unwrap();
    std::fs::write(tree.join("etc/attr"), "x").unwrap();
    symlink("setuid", tree.join("etc/link")).unwrap();
    std::fs::hard_link(tree.join("etc/setuid"), tree.join("etc/hard")).unwrap();
    let value = b"hello";
    let path = std::ffi::CString::new(tree.join("etc/attr").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: path and value are valid for the call's duration.
    let rc = unsafe { libc::setxattr(path.as_ptr(), c"user.space".as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    let base = IdMap::default().host_base;
    for p in [tree.clone(), tree.join("etc"), tree.join("etc/link"), tree.join("etc/attr")] {
        lchown(&p, Some(base), Some(base)).unwrap();
    }
    lchown(tree.join("etc/setuid"), Some(base + 1000), Some(base + 1001)).unwrap();
    // After the chown, which clears set-user-id.
    std::fs::set_permissions(tree.join("etc/setuid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let image = dir.path().join("root.img");
    make_root_image(&tree, &image, 32 << 20, IdMap::default()).expect("make_root_image");

    let stat = debugfs(&image, "stat /etc/setuid");
    assert!(stat.contains("User:  1000") && stat.contains("Group:  1001"), "{stat}");
    assert!(stat.contains("Mode:  04755"), "{stat}");
    assert!(stat.contains("Links: 2"), "hard link kept: {stat}");
    let attr = debugfs(&image, "stat /etc/attr");
    assert!(attr.contains("user.space") && attr.contains("hello"), "xattr kept: {attr}");
    let root = debugfs(&image, "stat /");
    assert!(root.contains("User:     0") || root.contains("User:  0"), "{root}");
    let link = debugfs(&image, "stat /etc/link");
    assert!(link.contains("Type: symlink") && link.contains("Fast link dest: \"setuid\""), "{link}");
    // An existing image is never overwritten.
    assert!(make_root_image(&tree, &image, 32 << 20, IdMap::default()).is_err());
}

/// A loop-mounted btrfs, unmounted and detached on drop.
struct Btrfs {
    dir: tempfile::TempDir,
}

impl Btrfs {
    fn new() -> Btrfs {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("pool.img");
        std::fs::File::create(&backing).unwrap().set_len(256 << 20).unwrap();
        let ok = Command::new("mkfs.btrfs").arg("-q").arg(&backing).status().unwrap().success();
        assert!(ok, "mkfs.btrfs failed");
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let ok = Command::new("mount").args(["-o", "loop"]).arg(&backing).arg(dir.path().join("mnt")).status().unwrap();
        assert!(ok.success(), "cannot loop-mount a btrfs");
        Btrfs { dir }
    }

    fn mnt(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for Btrfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mnt()).status();
    }
}

#[test]
fn clone_disk_shares_extents_on_btrfs_and_refuses_elsewhere() {
    assert!(nix::unistd::geteuid().is_root(), "the clone test loop-mounts a btrfs: run as root");
    let pool = Btrfs::new();
    let src = pool.mnt().join("template.img");
    let data: Vec<u8> = (0..(8 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let dst = pool.mnt().join("sandbox.img");
    clone_disk(&src, &dst).expect("FICLONE on btrfs");
    assert_eq!(std::fs::read(&dst).unwrap(), data);
    assert!(clone_disk(&src, &dst).is_err(), "an existing copy is never overwritten");
    // Writing to the copy leaves the template alone.
    std::fs::write(&dst, b"changed").unwrap();
    assert_eq!(std::fs::read(&src).unwrap(), data);

    let plain = tempfile::tempdir_in("/var/tmp").unwrap();
    let other = plain.path().join("copy.img");
    if clone_disk(&src, &other).is_ok() {
        panic!("FICLONE across filesystems succeeded");
    }
    assert!(!other.exists(), "a failed clone leaves no file");
}
