//! Per-sandbox identity files written into a fresh root: `/etc/hostname`, `/etc/machine-id`,
//! `/etc/hosts` and, given a name server, `/etc/resolv.conf`. They are written through `openat` with `O_NOFOLLOW` below an `/etc` opened
//! without following symlinks, so a template's symlinks can never redirect the writes onto
//! the host.

use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use rand::Rng;

use crate::error::{IoContext, Result, StorageError};

/// Who a sandbox is: what its identity files say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxIdentity {
    pub hostname: String,
    /// The only name server the sandbox's resolver is told about.
    pub nameserver: Option<IpAddr>,
}

/// Checks `hostname` is a valid host name (letters, digits, `-`, `.`; at most 64 bytes).
pub fn validate_hostname(hostname: &str) -> Result<()> {
    let bytes = hostname.as_bytes();
    let ok_char = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.';
    let valid = (1..=64).contains(&bytes.len())
        && bytes.iter().all(ok_char)
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    if valid { Ok(()) } else { Err(StorageError::InvalidHostname { hostname: hostname.chars().take(80).collect() }) }
}

/// 32 random lowercase hex characters and a newline (the machine-id(5) format).
pub fn random_machine_id() -> String {
    let mut rng = rand::rng();
    let mut id: String = (0..32).map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0')).collect();
    id.push('\n');
    id
}

/// The `/etc/hosts` of a sandbox.
pub fn hosts_file(hostname: &str) -> String {
    format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback {hostname}\n")
}

/// The `/etc/resolv.conf` of a sandbox: one name server, failing fast.
fn resolv_conf(nameserver: IpAddr) -> String {
    format!("nameserver {nameserver}\noptions timeout:2 attempts:2\n")
}

/// Writes the identity files into `rootfs/etc`, owned by `owner` (uid = gid). Does nothing
/// when the root has no real `/etc` directory.
pub fn write_identity(rootfs: &Path, identity: &SandboxIdentity, owner: u32) -> Result<()> {
    validate_hostname(&identity.hostname)?;
    let Some(etc) = open_etc(rootfs)? else {
        tracing::debug!(rootfs = %rootfs.display(), "no /etc directory, no identity files");
        return Ok(());
    };
    let etc_path = rootfs.join("etc");
    let hostname = format!("{}\n", identity.hostname);
    let mut files =
        vec![("hostname", hostname), ("machine-id", random_machine_id()), ("hosts", hosts_file(&identity.hostname))];
    if let Some(nameserver) = identity.nameserver {
        files.push(("resolv.conf", resolv_conf(nameserver)));
    }
    for (name, content) in files {
        replace_file(&etc, &etc_path.join(name), name, content.as_bytes(), owner)?;
    }
    Ok(())
}

/// Writes `files` (`name` → content) into `rootfs/etc/<dir>`, creating that directory, all
/// owned by `owner`, never following a symlink: safe while the sandbox runs, since whatever
/// it renames or links, the writes stay inside its root. Does nothing without a real `/etc`.
pub fn write_etc_dir_files(rootfs: &Path, dir: &str, files: &[(&str, &[u8])], owner: u32) -> Result<()> {
    let Some(etc) = open_etc(rootfs)? else {
        return Ok(());
    };
    let dir_path = rootfs.join("etc").join(dir);
    match nix::sys::stat::mkdirat(&etc, dir, Mode::from_bits_truncate(0o755)) {
        Ok(()) => {
            let made = openat(&etc, dir, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
                .ctx("open", &dir_path)?;
            nix::unistd::fchown(&made, Some(owner.into()), Some(owner.into())).ctx("chown", &dir_path)?;
        }
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(e).ctx("create", &dir_path),
    }
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let dir_fd = openat(&etc, dir, dir_flags, Mode::empty()).ctx("open", &dir_path)?;
    for (name, content) in files {
        replace_file(&dir_fd, &dir_path.join(name), name, content, owner)?;
    }
    Ok(())
}

fn open_etc(rootfs: &Path) -> Result<Option<OwnedFd>> {
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let root = openat(AT_FDCWD, rootfs, dir_flags, Mode::empty()).ctx("open", rootfs)?;
    match openat(&root, "etc", dir_flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        // Missing, a symlink (ELOOP) or not a directory: nothing we may write into.
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => Ok(None),
        Err(e) => Err(e).ctx("open", rootfs.join("etc")),
    }
}

fn replace_file(dir: &OwnedFd, path: &Path, name: &str, content: &[u8], owner: u32) -> Result<()> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(Errno::EISDIR) => {
            return Err(StorageError::BadTemplateContent {
                path: path.to_path_buf(),
                reason: "is a directory in the template; remove it and rebuild the template".into(),
            });
        }
        Err(e) => return Err(e).ctx("remove", path),
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(0o644)).ctx("create", path)?;
    let mut file = File::from(fd);
    file.write_all(content).ctx("write", path)?;
    std::os::unix::fs::fchown(&file, Some(owner), Some(owner)).ctx("chown", path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644)).ctx("chmod", path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames() {
        for good in ["a", "sbx-1", "box.example.com", "A1"] {
            assert!(validate_hostname(good).is_ok(), "{good}");
        }
        let long = "a".repeat(65);
        for bad in ["", "-a", "a-", "a b", "a\nb", "a_b", long.as_str(), "a/b"] {
            assert!(validate_hostname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn machine_ids_are_32_hex_and_differ() {
        let a = random_machine_id();
        assert_eq!(a.len(), 33);
        assert!(a.ends_with('\n'));
        assert!(a[..32].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, random_machine_id());
    }

    #[test]
    fn hosts_names_the_host() {
        assert!(hosts_file("box").starts_with("127.0.0.1\tlocalhost box\n"));
    }

    #[test]
    fn directory_files_are_written_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("etc")).unwrap();
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        write_etc_dir_files(root, "space", &[("ca.crt", b"one")], me).unwrap();
        write_etc_dir_files(root, "space", &[("ca.crt", b"two")], me).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("etc/space/ca.crt")).unwrap(), "two");
        // A directory replaced by a symlink out of the root is refused, and nothing is written.
        std::fs::remove_dir_all(root.join("etc/space")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/space")).unwrap();
        assert!(write_etc_dir_files(root, "space", &[("ca.crt", b"x")], me).is_err());
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        // So is a file replaced by a symlink: it is replaced, its target untouched.
        std::fs::remove_file(root.join("etc/space")).unwrap();
        std::fs::create_dir(root.join("etc/space")).unwrap();
        std::fs::write(outside.join("target"), "keep").unwrap();
        std::os::unix::fs::symlink(outside.join("target"), root.join("etc/space/ca.crt")).unwrap();
        write_etc_dir_files(root, "space", &[("ca.crt", b"three")], me).unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("target")).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(root.join("etc/space/ca.crt")).unwrap(), "three");
    }

    #[test]
    fn writes_files_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("etc")).unwrap();
        let outside = root.join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/hostname")).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let id = SandboxIdentity { hostname: "box".into(), nameserver: Some("10.0.0.53".parse().unwrap()) };
        write_identity(root, &id, me).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(root.join("etc/hostname")).unwrap(), "box\n");
        let resolv = std::fs::read_to_string(root.join("etc/resolv.conf")).unwrap();
        assert!(resolv.starts_with("nameserver 10.0.0.53\n"), "{resolv}");
        assert_eq!(std::fs::read_to_string(root.join("etc/machine-id")).unwrap().len(), 33);
    }

    #[test]
    fn etc_symlink_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real");
        std::fs::create_dir(&target).unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&target, root.join("etc")).unwrap();
        let id = SandboxIdentity { hostname: "box".into(), nameserver: None };
        write_identity(&root, &id, 0).unwrap();
        assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    }
}
