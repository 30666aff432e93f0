//! The file system calls layer extraction makes, all relative to directory descriptors and
//! resolved inside the root (`openat2(RESOLVE_IN_ROOT)`), so no path in a layer and no
//! symlink an earlier layer planted can reach outside the root being filled.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode, SFlag, fchmodat, fstatat, mkdirat, mknodat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchownat, linkat, symlinkat, unlinkat};

/// Opens directory `rel` of `root`, resolving every component (symlinks included) inside
/// the root. `rel` empty means the root itself.
pub fn open_dir_in_root(root: BorrowedFd<'_>, rel: &Path) -> nix::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, rel, how)
}

/// Like [`open_dir_in_root`], creating missing directories (mode 0755, owned by host id
/// `owner`) on the way, as a tar without explicit directory entries needs. Also returns how
/// many it made.
pub fn make_dir_in_root(root: BorrowedFd<'_>, rel: &Path, owner: u32) -> nix::Result<(OwnedFd, u64)> {
    match open_dir_in_root(root, rel) {
        Err(Errno::ENOENT) => {}
        other => return other.map(|fd| (fd, 0)),
    }
    let mut prefix = std::path::PathBuf::new();
    let mut dir = open_dir_in_root(root, &prefix)?;
    let mut made = 0;
    for component in rel.components() {
        prefix.push(component);
        dir = match open_dir_in_root(root, &prefix) {
            Err(Errno::ENOENT) => {
                let name = component.as_os_str();
                plain_name(name)?;
                mkdirat(&dir, name, Mode::from_bits_truncate(0o755))?;
                if owner != 0 {
                    set_owner_mode(dir.as_fd(), name, owner, owner, None)?;
                }
                made += 1;
                open_dir_in_root(root, &prefix)?
            }
            other => other?,
        };
    }
    Ok((dir, made))
}

/// Refuses `.`, `..` and empty names (and any with a `/`): every call below acts on one
/// entry of one directory, never on the directory itself or its parent.
fn plain_name(name: &OsStr) -> nix::Result<()> {
    let bytes = name.as_bytes();
    if matches!(bytes, b"" | b"." | b"..") || bytes.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Opens child directory `name` of `dir` without following a symlink; `None` when it is not
/// a directory.
pub fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<Option<OwnedFd>> {
    plain_name(name)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOTDIR | Errno::ELOOP | Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `lstat` of `name` in `dir`; `None` when it does not exist.
pub fn lstat(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<Option<FileStat>> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_dir(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// Removes `name` from `dir` whatever it is (a directory with everything in it), never
/// following a symlink. Missing is fine.
pub fn remove_all(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    plain_name(name)?;
    let Some(stat) = lstat(dir, name)? else { return Ok(()) };
    if is_dir(&stat) {
        let child = openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        for entry in children(child.as_fd())? {
            remove_all(child.as_fd(), &entry)?;
        }
        unlinkat(dir, name, UnlinkatFlags::RemoveDir)
    } else {
        unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)
    }
}

/// Names in directory `dir` (without `.` and `..`).
pub fn children(dir: BorrowedFd<'_>) -> nix::Result<Vec<OsString>> {
    let fd = openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut listing = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let name = OsStr::from_bytes(entry?.file_name().to_bytes()).to_os_string();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// Makes `name` in `dir` a directory: an existing directory is kept (a later layer only
/// updates its metadata), anything else there is replaced.
pub fn ensure_dir(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    plain_name(name)?;
    match lstat(dir, name)? {
        Some(stat) if is_dir(&stat) => Ok(()),
        Some(_) => {
            remove_all(dir, name)?;
            mkdirat(dir, name, Mode::from_bits_truncate(0o700))
        }
        None => mkdirat(dir, name, Mode::from_bits_truncate(0o700)),
    }
}

/// Creates regular file `name` in `dir` for writing, replacing whatever was there.
pub fn create_file(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<File> {
    remove_all(dir, name)?;
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(0o600))?;
    Ok(File::from(fd))
}

pub fn symlink(dir: BorrowedFd<'_>, name: &OsStr, target: &Path) -> nix::Result<()> {
    remove_all(dir, name)?; // refuses `.` and `..`
    symlinkat(target, dir, name)
}

pub fn fifo(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    remove_all(dir, name)?;
    mknodat(dir, name, SFlag::S_IFIFO, Mode::from_bits_truncate(0o600), 0)
}

/// Hard-links `name` in `dir` to `source_name` in `source_dir` (a symlink source is linked
/// itself, never followed).
pub fn hard_link(
    source_dir: BorrowedFd<'_>,
    source_name: &OsStr,
    dir: BorrowedFd<'_>,
    name: &OsStr,
) -> nix::Result<()> {
    plain_name(source_name)?;
    remove_all(dir, name)?;
    linkat(source_dir, source_name, dir, name, AtFlags::empty())
}

/// Owner and permission bits of `name` in `dir` (the mode after the owner: `chown` clears
/// setuid bits). Symlinks get only their owner.
pub fn set_owner_mode(dir: BorrowedFd<'_>, name: &OsStr, uid: u32, gid: u32, mode: Option<u32>) -> nix::Result<()> {
    fchownat(dir, name, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if let Some(mode) = mode {
        fchmodat(dir, name, Mode::from_bits_truncate(mode & 0o7777), FchmodatFlags::FollowSymlink)?;
    }
    Ok(())
}

/// Owner, then permission bits, of an open file (in that order: `chown` clears setuid bits).
pub fn set_file_owner_mode(file: &File, uid: u32, gid: u32, mode: u32) -> nix::Result<()> {
    nix::unistd::fchown(file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
    nix::sys::stat::fchmod(file, Mode::from_bits_truncate(mode & 0o7777))
}

/// Sets the modification (and access) time of `name` in `dir`, not following a symlink.
pub fn set_mtime(dir: BorrowedFd<'_>, name: &OsStr, seconds: u64) -> nix::Result<()> {
    let time = nix::sys::time::TimeSpec::new(seconds.min(i64::MAX as u64) as i64, 0);
    nix::sys::stat::utimensat(dir, name, &time, &time, nix::sys::stat::UtimensatFlags::NoFollowSymlink)
}

/// Sets extended attribute `key` on an open file.
pub fn set_xattr(file: &File, key: &OsStr, value: &[u8]) -> nix::Result<()> {
    let key = std::ffi::CString::new(key.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: `key` is a NUL-terminated string and `value` a valid buffer of the given length,
    // both alive for the call; the descriptor is open.
    let rc = unsafe { libc::fsetxattr(file.as_raw_fd(), key.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    Errno::result(rc).map(drop)
}

/// Reads file `rel` of `root` (resolved inside the root), at most `max` bytes; `None` when it
/// does not exist.
pub fn read_in_root(root: &Path, rel: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let root = File::open(root)?;
    // Non-blocking, so that a FIFO in its place cannot hang the import; then only a regular
    // file is read.
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let file = match openat2(root.as_fd(), rel, how) {
        Err(Errno::ENOENT) => return Ok(None),
        other => File::from(other?),
    };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", rel.display())));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!("{} is larger than {max} bytes", rel.display())));
    }
    Ok(Some(bytes))
}

/// Removes `rel` of `root` (and what it holds), resolved inside the root; missing is fine.
pub fn remove_in_root(root: &Path, rel: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let root = File::open(root)?;
    match open_dir_in_root(root.as_fd(), parent) {
        Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(dir) => match remove_all(dir.as_fd(), name) {
            Err(Errno::ENOENT) => Ok(()),
            other => other.map_err(Into::into),
        },
    }
}

/// Whether `rel` of `root` is a directory, resolved inside the root.
pub fn is_dir_in_root(root: &Path, rel: &Path) -> bool {
    File::open(root).is_ok_and(|root| open_dir_in_root(root.as_fd(), rel).is_ok())
}

/// Makes directory `rel` of `root` and what is missing above it (mode 0755, owned by host id
/// `owner`), all resolved inside the root.
pub fn make_dirs_in_root(root: &Path, rel: &Path, owner: u32) -> std::io::Result<()> {
    let root = File::open(root)?;
    make_dir_in_root(root.as_fd(), rel, owner)?;
    Ok(())
}

/// Writes file `rel` of `root` (mode 0644, owned by host id `owner`, its directories made as
/// needed), all resolved inside the root, replacing what was there.
pub fn write_in_root(root: &Path, rel: &Path, bytes: &[u8], owner: u32) -> std::io::Result<()> {
    use std::io::Write;
    let root = File::open(root)?;
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let (dir, _) = make_dir_in_root(root.as_fd(), parent, owner)?;
    let mut file = create_file(dir.as_fd(), name)?;
    file.write_all(bytes)?;
    set_file_owner_mode(&file, owner, owner, 0o644)?;
    Ok(())
}
