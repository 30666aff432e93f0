//! The VMM's mount namespace: a tmpfs root holding only what QEMU needs (step 6 of the
//! jail, see `mod.rs`).

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use super::JailConfig;

/// Size of the jail's root tmpfs: directories, mount points and device nodes only.
const ROOT_TMPFS: &str = "size=1m,nr_inodes=1024,mode=0755";

/// Device nodes every QEMU gets: (name, major, minor).
const DEVICES: &[(&str, u64, u64)] = &[("null", 1, 3), ("zero", 1, 5), ("random", 1, 8), ("urandom", 1, 9)];
const KVM: (u64, u64) = (10, 232);

fn err(what: &str, path: &Path) -> impl FnOnce(nix::Error) -> io::Error {
    let message = format!("{what} {}", path.display());
    move |e| io::Error::other(format!("{message}: {e}"))
}

/// Builds the jail under `config.root_mount_point` and pivots into it.
pub(crate) fn enter_jail(config: &JailConfig) -> io::Result<()> {
    // Nothing done from here on may propagate back to the host's mount namespace.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(err("make private", Path::new("/")))?;
    let root = &config.root_mount_point;
    mount(Some("tmpfs"), root, Some("tmpfs"), MsFlags::MS_NOSUID, Some(ROOT_TMPFS))
        .map_err(err("mount tmpfs on", root))?;
    for path in &config.ro_paths {
        mirror(path, &inside(root, path))?;
    }
    for (host, jail) in &config.ro_files {
        bind(host, &inside(root, jail), MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    }
    bind(&config.run_dir, &root.join("run"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC)?;
    make_devices(&root.join("dev"), config)?;
    let proc = root.join("proc");
    mkdir(&proc)?;
    // A fresh procfs of the VMM's own pid namespace: it shows QEMU alone.
    mount(Some("proc"), &proc, Some("proc"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(err("mount proc on", &proc))?;
    pivot_into(root)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID,
        None::<&str>,
    )
    .map_err(err("remount read-only", Path::new("/")))
}

/// `root` + absolute `path`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Makes `path` of the host appear at `target`: the same symlink if it is one (merged-/usr
/// hosts have `/lib -> usr/lib`), else a read-only bind.
fn mirror(path: &Path, target: &Path) -> io::Result<()> {
    let meta =
        std::fs::symlink_metadata(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if meta.file_type().is_symlink() {
        if let Some(parent) = target.parent() {
            mkdir(parent)?;
        }
        return std::os::unix::fs::symlink(std::fs::read_link(path)?, target);
    }
    bind(path, target, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)
}

/// Bind-mounts `source` (a file or a directory) on a new `target`, then applies `flags`
/// (bind mounts take them only on a remount).
fn bind(source: &Path, target: &Path, flags: MsFlags) -> io::Result<()> {
    if let Some(parent) = target.parent() {
        mkdir(parent)?;
    }
    if source.is_dir() {
        mkdir(target)?;
    } else {
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(target)?;
    }
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(err("bind on", target))?;
    mount(None::<&str>, target, None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags, None::<&str>)
        .map_err(err("remount", target))
}

fn mkdir(path: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(path)
}

/// The jail's /dev: nodes made for this QEMU, not binds of the host's (whose /dev/kvm is
/// root's 0600: this one belongs to the VMM's uid alone).
fn make_devices(dev: &Path, config: &JailConfig) -> io::Result<()> {
    mkdir(dev)?;
    for (name, major, minor) in DEVICES {
        let path = dev.join(name);
        mknod(&path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(*major, *minor))
            .map_err(err("mknod", &path))?;
        // mknod applies the umask.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    }
    if config.kvm {
        let path = dev.join("kvm");
        mknod(&path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), makedev(KVM.0, KVM.1))
            .map_err(err("mknod", &path))?;
        std::os::unix::fs::chown(&path, Some(config.uid), Some(config.gid))?;
    }
    Ok(())
}

/// `pivot_root(".", ".")` in the new root, then the old root (stacked below) detached.
fn pivot_into(root: &Path) -> io::Result<()> {
    std::env::set_current_dir(root)?;
    nix::unistd::pivot_root(".", ".").map_err(err("pivot_root", root))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(err("detach the old root", root))?;
    std::env::set_current_dir("/")
}
