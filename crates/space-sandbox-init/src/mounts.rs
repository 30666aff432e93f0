//! The sandbox's mount namespace: rootfs, /proc, /sys, a minimal /dev, pivot_root, and the
//! masked / read-only paths. Runs in pid 1 of the new pid namespace, with full capabilities in
//! the sandbox's user namespace.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::InitError;
use crate::listener::AGENT_DIR;
use crate::reexec::SELF_EXE;
use crate::sync::{HostFile, InitConfig};
use crate::sys::{ctx, io_ctx};

/// Host device nodes bind-mounted into the sandbox's /dev.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// An empty, read-only directory bound over masked directories. (A tmpfs per masked
/// directory would cost a `tar` run each in every full snapshot and restore.)
const MASK_SOURCE: &str = "/dev/.masked";

const DEV_SYMLINKS: &[(&str, &str)] = &[
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

fn mnt(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), Errno> {
    mount(source, target, fstype, flags, data)
}

/// Builds the sandbox's filesystem view under the rootfs, up to the mount point for the
/// agent's directory ([`AGENT_DIR`], see [`crate::listener`]); with `bind_self`, also mounts
/// this process's executable read-only at [`SELF_EXE`] (see [`crate::reexec`]). Appends
/// optional steps that were skipped to `warnings`.
pub(crate) fn prepare(config: &InitConfig, bind_self: bool, warnings: &mut Vec<String>) -> Result<(), InitError> {
    let root = &config.rootfs;
    mnt(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None).map_err(ctx("make / rprivate"))?;
    mount_root(config).map_err(|e| match e {
        Errno::EACCES => InitError(format!(
            "mount rootfs {}: EACCES (every parent directory must be searchable by the mapped root uid)",
            root.display()
        )),
        e => ctx(format!("mount rootfs {}", root.display()))(e),
    })?;
    mount_proc(root)?;
    let sys = mount_sys(root, warnings)?;
    bind_host_files(root, &config.host_files, sys, warnings);
    mount_dev(root, warnings)?;
    if bind_self {
        bind_self_exe(root, config.exe.as_deref())?;
    }
    let agent = root.join(AGENT_DIR.trim_start_matches('/'));
    fs::DirBuilder::new().mode(0o700).create(agent).map_err(io_ctx(format!("mkdir {AGENT_DIR}")))
}

/// Puts the sandbox's root at `config.rootfs`, a mount point as pivot_root needs: the node's
/// detached (idmapped) mount if it passed one, else a bind of the path onto itself.
fn mount_root(config: &InitConfig) -> Result<(), Errno> {
    let root = config.rootfs.as_path();
    if config.root_mount {
        crate::sys::attach_mount(crate::sync::ROOT_MOUNT_FD, root)?;
        // The mount is attached now; the descriptor has no further use.
        nix::unistd::close(crate::sync::ROOT_MOUNT_FD)
    } else {
        mount(Some(root), root, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
    }
}

/// Pivots into the rootfs [`prepare`] built and hides or protects the configured paths.
pub(crate) fn finish(config: &InitConfig) -> Result<(), InitError> {
    pivot(&config.rootfs)?;
    mask_paths(&config.masked_paths)?;
    readonly_paths(&config.readonly_paths)
}

/// Returns `root/name`, creating it as a directory if missing; refuses symlinks and other
/// non-directories (a rootfs written by an earlier sandbox is untrusted).
fn mount_point(root: &Path, name: &str) -> Result<PathBuf, InitError> {
    let path = root.join(name);
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(InitError(format!("/{name} in the rootfs is not a directory"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new().mode(0o755).create(&path).map_err(io_ctx(format!("mkdir /{name}")))?;
            Ok(path)
        }
        Err(e) => Err(io_ctx(format!("stat /{name}"))(e)),
    }
}

fn mount_proc(root: &Path) -> Result<(), InitError> {
    let target = mount_point(root, "proc")?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mnt(Some("proc"), &target, Some("proc"), flags, None).map_err(ctx("mount /proc"))
}

/// Binds each of `files` over its place in the fresh `/proc` (and `/sys`, when `sys` was
/// mounted: otherwise that path is the rootfs's, which the sandbox controls). One that fails
/// is left as the kernel's (the sandbox then sees the host's figure there) and reported.
fn bind_host_files(root: &Path, files: &[HostFile], sys: bool, warnings: &mut Vec<String>) {
    for file in files {
        if !bindable(&file.at, sys) {
            warnings.push(format!("{} is not a place under /proc or a mounted /sys; not bound", file.at.display()));
            continue;
        }
        let target = root.join(&file.at);
        if let Err(e) = mount(Some(file.host.as_path()), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
            warnings.push(format!("bind {} over /{}: {e:?}", file.host.display(), file.at.display()));
        }
    }
}

/// Whether `at` names a place below `proc/` (or `sys/`, when it was mounted) by plain names.
fn bindable(at: &Path, sys: bool) -> bool {
    let mut parts = at.components();
    let top = match parts.next() {
        Some(Component::Normal(top)) => top,
        _ => return false,
    };
    (top == "proc" || (sys && top == "sys"))
        && parts.clone().next().is_some()
        && parts.all(|c| matches!(c, Component::Normal(_)))
}

/// Mounts a read-only sysfs at `/sys`; whether it could (a sysfs some hosts refuse leaves
/// `/sys` empty, with a warning).
fn mount_sys(root: &Path, warnings: &mut Vec<String>) -> Result<bool, InitError> {
    let target = mount_point(root, "sys")?;
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    match mnt(Some("sysfs"), &target, Some("sysfs"), flags, None) {
        Ok(()) => Ok(true),
        Err(e) => {
            warnings.push(format!("mount /sys: {e:?}; /sys left empty"));
            Ok(false)
        }
    }
}

fn mount_dev(root: &Path, warnings: &mut Vec<String>) -> Result<(), InitError> {
    let dev = mount_point(root, "dev")?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_STRICTATIME;
    mnt(Some("tmpfs"), &dev, Some("tmpfs"), flags, Some("mode=755,size=65536k")).map_err(ctx("mount /dev"))?;
    for name in DEVICES {
        bind_device(&dev, name)?;
    }
    let pts = make_dir(&dev, "pts", 0o755)?;
    let data = "newinstance,ptmxmode=0666,mode=0620,gid=5";
    mnt(Some("devpts"), &pts, Some("devpts"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some(data))
        .map_err(ctx("mount /dev/pts"))?;
    // A directory of /dev's tmpfs, not a tmpfs of its own: CRIU saves and restores every
    // tmpfs's contents through a `tar` run (~7 ms each way), so a sandbox has only one.
    make_dir(&dev, "shm", 0o1777)?;
    let masked = make_dir(&dev, MASK_SOURCE.trim_start_matches("/dev/"), 0o555)?;
    bind_read_only(&masked, &masked).map_err(ctx(format!("bind {MASK_SOURCE} read-only")))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mqueue = make_dir(&dev, "mqueue", 0o755)?;
    if let Err(e) = mnt(Some("mqueue"), &mqueue, Some("mqueue"), flags, None) {
        warnings.push(format!("mount /dev/mqueue: {e:?}"));
    }
    for (name, target) in DEV_SYMLINKS {
        symlink(target, dev.join(name)).map_err(io_ctx(format!("symlink /dev/{name}")))?;
    }
    Ok(())
}

fn make_dir(parent: &Path, name: &str, mode: u32) -> Result<PathBuf, InitError> {
    let path = parent.join(name);
    fs::DirBuilder::new().mode(mode).create(&path).map_err(io_ctx(format!("mkdir /dev/{name}")))?;
    // The umask may have removed bits (notably sticky/world-writable for shm).
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io_ctx(format!("chmod /dev/{name}")))?;
    Ok(path)
}

fn bind_device(dev: &Path, name: &str) -> Result<(), InitError> {
    let target = dev.join(name);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(&target)
        .map_err(io_ctx(format!("create /dev/{name}")))?;
    let source = format!("/dev/{name}");
    mnt(Some(&source), &target, None, MsFlags::MS_BIND, None).map_err(ctx(format!("bind /dev/{name}")))
}

/// Binds `exe` (default: this process's executable) read-only onto [`SELF_EXE`] in the
/// rootfs's /dev. Before pivot_root: the binary's host path is still reachable.
fn bind_self_exe(root: &Path, exe: Option<&Path>) -> Result<(), InitError> {
    // The kernel only binds from mounts of the caller's namespace, and the executable's mount is
    // the host's (ours is a copy): bind its path.
    let source = match exe {
        Some(path) => checked_exe(path)?,
        None => running_exe()?,
    };
    let target = root.join(SELF_EXE.trim_start_matches('/'));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o555)
        .open(&target)
        .map_err(io_ctx(format!("create {SELF_EXE}")))?;
    mount(Some(source.as_path()), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(ctx(format!("bind {SELF_EXE}")))?;
    // A remount must repeat the flags the kernel locked on the source mount (the binary was
    // just executed from it, so noexec is not among them).
    let current = statvfs(&target).map_err(ctx(format!("statvfs {SELF_EXE}")))?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | locked_flags(current.flags());
    mnt(None, &target, None, flags, None).map_err(ctx(format!("remount {SELF_EXE} read-only")))
}

/// The node's copy of the binary, which must be a regular file (a bind of anything else
/// would not be executable).
fn checked_exe(path: &Path) -> Result<PathBuf, InitError> {
    let meta = fs::metadata(path).map_err(io_ctx(format!("stat {}", path.display())))?;
    if !meta.is_file() {
        return Err(InitError(format!("{} is not a regular file", path.display())));
    }
    Ok(path.to_owned())
}

/// This process's executable, checked to be still the file at its path.
fn running_exe() -> Result<PathBuf, InitError> {
    let source = fs::read_link("/proc/self/exe").map_err(io_ctx("readlink /proc/self/exe"))?;
    let running = fs::metadata("/proc/self/exe").map_err(io_ctx("stat /proc/self/exe"))?;
    let at_path = fs::metadata(&source).map_err(io_ctx(format!("stat {}", source.display())))?;
    if (running.dev(), running.ino()) != (at_path.dev(), at_path.ino()) {
        return Err(InitError(format!("{} was replaced since spaced started", source.display())));
    }
    Ok(source)
}

/// Makes `root` the root of the mount namespace and detaches the old root entirely.
fn pivot(root: &Path) -> Result<(), InitError> {
    nix::unistd::chdir(root).map_err(ctx("chdir rootfs"))?;
    // pivot_root(".", ".") stacks the old root on top of the new one; unmounting "." then
    // removes it without needing a directory for it inside the rootfs.
    nix::unistd::pivot_root(".", ".").map_err(ctx("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(ctx("detach old root"))?;
    nix::unistd::chdir("/").map_err(ctx("chdir /"))
}

fn mask_paths(paths: &[String]) -> Result<(), InitError> {
    for path in paths {
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_ctx(format!("stat {path}"))(e)),
        };
        let target = Path::new(path);
        let result = if meta.is_dir() {
            bind_read_only(Path::new(MASK_SOURCE), target)
        } else {
            mnt(Some("/dev/null"), target, None, MsFlags::MS_BIND, None)
        };
        result.map_err(ctx(format!("mask {path}")))?;
    }
    Ok(())
}

/// Binds `source` at `target` and makes that mount read-only.
fn bind_read_only(source: &Path, target: &Path) -> Result<(), Errno> {
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    remount_read_only(target)
}

fn remount_read_only(target: &Path) -> Result<(), Errno> {
    // A remount must repeat the flags the kernel locked on the mount (nosuid, ...).
    let locked = locked_flags(statvfs(target)?.flags());
    mnt(None, target, None, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked, None)
}

fn readonly_paths(paths: &[String]) -> Result<(), InitError> {
    for path in paths {
        let target = Path::new(path);
        match mnt(Some(path), target, None, MsFlags::MS_BIND | MsFlags::MS_REC, None) {
            Ok(()) => {}
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(ctx(format!("bind {path}"))(e)),
        }
        remount_read_only(target).map_err(ctx(format!("remount {path} read-only")))?;
    }
    Ok(())
}

/// The mount flags matching a statvfs result's `f_flag`.
pub(crate) fn locked_flags(st: FsFlags) -> MsFlags {
    let pairs = [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ];
    pairs.iter().filter(|(s, _)| st.contains(*s)).fold(MsFlags::empty(), |acc, (_, m)| acc | *m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_files_go_below_proc_or_a_mounted_sys_only() {
        assert!(bindable(Path::new("proc/meminfo"), false));
        assert!(bindable(Path::new("sys/devices/system/cpu/online"), true));
        // Without a sysfs, /sys is the rootfs's own directory: its symlinks are the sandbox's.
        assert!(!bindable(Path::new("sys/devices/system/cpu/online"), false));
        for bad in ["proc", "/proc/meminfo", "proc/../etc/passwd", "etc/passwd", ""] {
            assert!(!bindable(Path::new(bad), true), "{bad}");
        }
    }

    #[test]
    fn locked_flags_map_statvfs_bits() {
        let st = FsFlags::ST_NOSUID | FsFlags::ST_NOEXEC | FsFlags::ST_RDONLY;
        assert_eq!(locked_flags(st), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC);
    }

    #[test]
    fn mount_point_refuses_symlinks() {
        let dir = std::env::temp_dir().join(format!("space-init-mp-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let _ = fs::remove_file(dir.join("proc"));
        symlink("/", dir.join("proc")).unwrap();
        let err = mount_point(&dir, "proc").unwrap_err();
        assert!(err.0.contains("not a directory"), "{}", err.0);
        assert_eq!(mount_point(&dir, "sys").unwrap(), dir.join("sys"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
