//! Template builds, imports, versions and ownership shifting (run as root).

mod common;

use std::cell::RefCell;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{TestPool, is_erofs, mode, owner};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use space_storage::{Progress, StorageError, btrfs, no_progress};

const ROOT: (u32, u32) = (100_000, 100_000);

#[test]
fn busybox_template_is_shifted_readonly_and_versioned() {
    let Some(t) = TestPool::new("busybox") else {
        return;
    };
    let store = t.pool().templates();
    let phases = RefCell::new(Vec::new());
    let record = |p: Progress| phases.borrow_mut().push(p.phase);
    let v1 = store.build_builtin("busybox", None, &record).unwrap();
    assert_eq!((v1.name.as_str(), v1.version), ("busybox", 1));
    assert!(v1.source.contains("BusyBox"), "{}", v1.source);
    assert!(v1.size_bytes > 1_000_000);
    assert!(phases.borrow().iter().any(|p| p == "linking applets"));
    let root = store.path(&v1).unwrap();

    assert_eq!(owner(&root.join("bin/busybox")), ROOT);
    assert_eq!(mode(&root.join("bin/busybox")), 0o755);
    assert_eq!(owner(&root.join("bin/sh")), ROOT, "symlinks are lchown'd");
    assert_eq!(std::fs::read_link(root.join("usr/bin/awk")).unwrap(), Path::new("/bin/busybox"));
    assert_eq!(mode(&root.join("tmp")), 0o1777);
    assert_eq!(mode(&root.join("root")), 0o700);
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.starts_with("root:x:0:0:"));
    assert!(std::fs::read_to_string(root.join("etc/profile")).unwrap().contains("PATH="));

    assert!(btrfs::is_readonly(&root).unwrap());
    assert!(is_erofs(&std::fs::write(root.join("etc/new"), "x").unwrap_err()));
    assert!(is_erofs(&std::fs::remove_file(root.join("bin/sh")).unwrap_err()));

    // The template runs.
    let out = Command::new("chroot").arg(&root).args(["/bin/sh", "-c", "echo hi"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");

    let v2 = store.build_builtin("busybox", None, &no_progress).unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(store.resolve("busybox").unwrap(), Some(v2.clone()));
    assert_eq!(store.list().unwrap(), vec![v1.clone(), v2.clone()]);
    assert_eq!(store.get("busybox", 1).unwrap(), v1);

    // Deleting a read-only template works, and is idempotent.
    assert!(store.delete("busybox", 2).unwrap());
    assert!(!store.delete("busybox", 2).unwrap());
    assert!(!store.path(&v2).unwrap().exists());
    assert_eq!(store.resolve("busybox").unwrap(), Some(v1.clone()));
    let err = store.get("busybox", 2).unwrap_err();
    assert!(matches!(err, StorageError::TemplateNotFound { .. }), "{err}");
    // Versions never go back, even after a delete of the newest.
    assert_eq!(store.build_builtin("busybox", None, &no_progress).unwrap().version, 2);
    assert_eq!(store.resolve("nothing").unwrap(), None);
}

#[test]
fn bad_names_and_builtins_are_rejected() {
    let Some(t) = TestPool::new("badnames") else {
        return;
    };
    let store = t.pool().templates();
    let err = store.import_dir("../etc", Path::new("/tmp"), &no_progress).unwrap_err();
    assert!(matches!(err, StorageError::InvalidTemplateName { .. }), "{err}");
    let err = store.build_builtin("alpine", None, &no_progress).unwrap_err();
    assert!(err.to_string().contains("busybox, debian"), "{err}");
    assert!(store.resolve("Bad Name").is_err());
    let err = store.import_tar("broken", Path::new("/etc/hostname"), &no_progress).unwrap_err();
    assert!(err.to_string().contains("tar"), "{err}");
    // A failed build leaves nothing behind.
    let left: Vec<_> = std::fs::read_dir(store.dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A small tree with the ownership cases that matter.
fn make_source(dir: &Path) {
    let file = |p: &str, body: &str, m: u32, uid: u32| {
        let path = dir.join(p);
        std::fs::write(&path, body).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
    };
    for d in ["etc", "bin", "home/user", "dev"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::os::unix::fs::chown(dir.join("home/user"), Some(1000), Some(1000)).unwrap();
    file("bin/su", "suid", 0o4755, 0);
    file("bin/wall", "sgid", 0o2755, 0);
    file("home/user/notes", "mine", 0o600, 1000);
    file("home/user/alien", "x", 0o644, 70_000);
    std::fs::hard_link(dir.join("home/user/notes"), dir.join("home/user/notes-link")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", dir.join("home/user/link")).unwrap();
    std::os::unix::fs::lchown(dir.join("home/user/link"), Some(1000), Some(1000)).unwrap();
    file("bin/ping", "caps", 0o755, 0);
    set_caps_v2(&dir.join("bin/ping"));
    let dev = |name: &str, major, minor| {
        let m = Mode::from_bits_truncate(0o666);
        mknod(&dir.join("dev").join(name), SFlag::S_IFCHR, m, makedev(major, minor)).unwrap();
    };
    dev("null", 1, 3);
    dev("mem", 1, 1);
}

fn set_caps_v2(path: &Path) {
    // cap_net_raw (13), effective.
    let mut value = Vec::new();
    for w in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        value.extend_from_slice(&w.to_le_bytes());
    }
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: both strings are NUL-terminated and `value` is readable for its length.
    let rc =
        unsafe { libc::lsetxattr(c.as_ptr(), c"security.capability".as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

fn caps_rootid(path: &Path) -> Option<u32> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), c"security.capability".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n == 24).then(|| u32::from_le_bytes([buf[20], buf[21], buf[22], buf[23]]))
}

fn check_shifted(root: &Path) {
    assert_eq!(owner(root), ROOT);
    assert_eq!(owner(&root.join("bin/su")), ROOT);
    assert_eq!(mode(&root.join("bin/su")), 0o4755, "setuid kept");
    assert_eq!(mode(&root.join("bin/wall")), 0o2755, "setgid kept");
    assert_eq!(owner(&root.join("home/user")), (101_000, 101_000));
    assert_eq!(owner(&root.join("home/user/notes")), (101_000, 101_000));
    assert_eq!(owner(&root.join("home/user/notes-link")), (101_000, 101_000), "hard link shifted once");
    assert_eq!(mode(&root.join("home/user/notes")), 0o600);
    assert_eq!(owner(&root.join("home/user/alien")), (165_534, 165_534), "out of range -> nobody");
    assert_eq!(owner(&root.join("home/user/link")), (101_000, 101_000));
    assert_eq!(std::fs::read_link(root.join("home/user/link")).unwrap(), Path::new("/etc/shadow"));
    assert_eq!(caps_rootid(&root.join("bin/ping")), Some(100_000), "file caps namespaced");
    assert!(root.join("dev/null").exists());
    assert!(std::fs::symlink_metadata(root.join("dev/mem")).is_err(), "dangerous device removed");
}

#[test]
fn import_dir_shifts_ownership() {
    let Some(t) = TestPool::new("importdir") else {
        return;
    };
    let src = tempfile::tempdir().unwrap();
    make_source(src.path());
    let info = t.pool().templates().import_dir("custom", src.path(), &no_progress).unwrap();
    assert!(info.source.contains("directory"));
    assert_eq!(info.size_bytes, 4 + 4 + 4 + 1 + 4, "hard link counted once");
    check_shifted(&t.pool().templates().path(&info).unwrap());
    // The source is untouched.
    assert_eq!(owner(&src.path().join("home/user/notes")), (1000, 1000));
}

#[test]
fn import_tar_gz_and_zst() {
    let Some(t) = TestPool::new("importtar") else {
        return;
    };
    let src = tempfile::tempdir().unwrap();
    make_source(src.path());
    let out = tempfile::tempdir().unwrap();
    for (file, flag) in
        [("rootfs.tar.gz", "--gzip"), ("rootfs.tar.zst", "--zstd"), ("rootfs.tar", "--no-auto-compress")]
    {
        let tarball = out.path().join(file);
        let ok = Command::new("tar")
            .args(["--create", "--numeric-owner", "--xattrs", flag, "--file"])
            .arg(&tarball)
            .arg("-C")
            .arg(src.path())
            .arg(".")
            .status()
            .unwrap();
        assert!(ok.success());
        let last = RefCell::new(None);
        let info = t.pool().templates().import_tar("fromtar", &tarball, &|p| *last.borrow_mut() = Some(p)).unwrap();
        check_shifted(&t.pool().templates().path(&info).unwrap());
        let len = std::fs::metadata(&tarball).unwrap().len();
        assert_eq!(last.borrow().as_ref().map(|p| p.phase.as_str()), Some("done"));
        assert!(info.source.contains(file), "{} / {len}", info.source);
    }
    assert_eq!(t.pool().templates().resolve("fromtar").unwrap().unwrap().version, 3);
}

#[test]
fn hostile_tarball_cannot_write_outside_the_template() {
    let Some(t) = TestPool::new("eviltar") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (a, b, victim) = (work.path().join("a"), work.path().join("b"), work.path().join("victim"));
    for d in [&a, &b.join("etc"), &victim] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(&victim, a.join("etc")).unwrap();
    std::fs::write(b.join("etc/pwned"), "x").unwrap();
    let tarball = work.path().join("evil.tar");
    let tar = |args: &[&str], dir: &Path, member: &str| {
        let ok = Command::new("tar").args(args).arg(&tarball).arg("-C").arg(dir).arg(member).status().unwrap();
        assert!(ok.success());
    };
    tar(&["-cf"], &a, "etc");
    tar(&["-rf"], &b, "etc/pwned");
    let err = t.pool().templates().import_tar("evil", &tarball, &no_progress).unwrap_err();
    assert!(matches!(err, StorageError::Command { .. }), "{err}");
    assert!(std::fs::read_dir(&victim).unwrap().next().is_none(), "wrote through a symlink");
    assert!(t.pool().templates().list().unwrap().is_empty());
}
