//! Applies one layer (a tar stream) to a root filesystem, as the OCI image spec says:
//! entries in order, `.wh.NAME` removes NAME from the layers below, `.wh..wh..opq` empties
//! its directory of what the layers below put there, hard links, symlinks, FIFOs, owners,
//! modes, times and `user.*`/`security.capability` xattrs kept. Device nodes are refused
//! (a template has no use for them and shifting would drop them anyway), as is any path
//! with `..`; every path is resolved inside the root. Entries, bytes, implicitly created
//! directories and the paths remembered per layer are all charged to a [`Budget`].

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

use crate::at;
use crate::error::{ImageError, Result};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
const XATTR_PREFIX: &str = "SCHILY.xattr.";
/// Longest path an entry may have, and most components (deeper trees are not images).
const MAX_PATH_BYTES: usize = 4096;
const MAX_DEPTH: usize = 256;
/// Bytes of paths a layer's bookkeeping (what it wrote, for opaque directories) may hold.
const MAX_REMEMBERED: u64 = 256 << 20;

/// Bounds on what an image may unpack to (a tar bomb stops at the first entry beyond them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of regular-file content across all layers.
    pub max_bytes: u64,
    /// Total entries across all layers.
    pub max_entries: u64,
    /// Largest uid or gid an entry may have (the sandbox's id range).
    pub max_id: u32,
    /// The host id an entry's id 0 is written as (and directories made on the way are owned
    /// by): 0 for a tree shifted afterwards (an import), the pool's base id for a root that is
    /// already shifted (a build's COPY into a layer).
    pub id_base: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: 32 << 30, max_entries: 2_000_000, max_id: 65_535, id_base: 0 }
    }
}

/// What is left of the limits while an image unpacks.
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    pub bytes: u64,
    pub entries: u64,
    remembered: u64,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Budget { limits, bytes: 0, entries: 0, remembered: 0 }
    }

    /// Most bytes the layers' uncompressed streams may hold in all: the files' content plus
    /// a generous allowance for headers and padding.
    pub fn stream_limit(&self) -> u64 {
        self.limits.max_bytes.saturating_add(self.limits.max_entries.saturating_mul(2048))
    }

    fn charge(&mut self, bytes: u64) -> Result<()> {
        self.charge_entries(1, bytes)
    }

    fn charge_entries(&mut self, entries: u64, bytes: u64) -> Result<()> {
        self.entries += entries;
        self.bytes = self.bytes.saturating_add(bytes);
        if self.entries > self.limits.max_entries {
            return Err(ImageError::TooLarge { what: "entries", limit: self.limits.max_entries });
        }
        if self.bytes > self.limits.max_bytes {
            return Err(ImageError::TooLarge { what: "bytes", limit: self.limits.max_bytes });
        }
        Ok(())
    }

    fn charge_remembered(&mut self, bytes: u64) -> Result<()> {
        self.remembered += bytes;
        if self.remembered > MAX_REMEMBERED {
            return Err(ImageError::TooLarge { what: "bytes of paths in one layer", limit: MAX_REMEMBERED });
        }
        Ok(())
    }
}

/// A layer path split into its parent directory and name, both relative to the root.
/// `None` for the root itself.
fn split(path: &Path) -> std::result::Result<Option<(PathBuf, OsString)>, &'static str> {
    if path.as_os_str().len() > MAX_PATH_BYTES || path.components().count() > MAX_DEPTH {
        return Err("is longer or deeper than any image needs");
    }
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err("contains '..' and would escape the root"),
            Component::Prefix(_) => return Err("is not a Unix path"),
        }
    }
    let Some(name) = clean.file_name().map(OsStr::to_os_string) else { return Ok(None) };
    clean.pop();
    Ok(Some((clean, name)))
}

/// Applies layers to one root, keeping the root's descriptor and the last directory used.
pub struct Unpacker<'a> {
    root: OwnedFd,
    budget: &'a mut Budget,
    cached: Option<(PathBuf, OwnedFd)>,
}

/// One entry's place: the directory it goes in and its name there.
struct Place {
    parent: PathBuf,
    name: OsString,
    full: PathBuf,
}

impl<'a> Unpacker<'a> {
    pub fn new(root: &Path, budget: &'a mut Budget) -> Result<Self> {
        let root = std::fs::File::open(root).map_err(|e| ImageError::io("open", root, e))?;
        Ok(Unpacker { root: root.into(), budget, cached: None })
    }

    /// Applies the tar stream `layer` (uncompressed). `index` numbers the layer in errors.
    pub fn apply(&mut self, index: usize, layer: impl Read) -> Result<()> {
        let mut archive = tar::Archive::new(layer);
        let mut written = HashSet::new();
        for entry in archive.entries().map_err(|e| self.bad_tar(index, e))? {
            let mut entry = entry.map_err(|e| self.bad_tar(index, e))?;
            self.apply_entry(index, &mut entry, &mut written)?;
        }
        // Read past the end-of-archive blocks so a caller hashing the stream sees it all.
        io::copy(&mut archive.into_inner(), &mut io::sink()).map_err(|e| self.bad_tar(index, e))?;
        Ok(())
    }

    fn bad_tar(&self, index: usize, e: io::Error) -> ImageError {
        ImageError::malformed(format!("layer {index}"), format!("unreadable tar stream: {e}"))
    }

    fn apply_entry<R: Read>(
        &mut self,
        index: usize,
        entry: &mut tar::Entry<R>,
        written: &mut HashSet<PathBuf>,
    ) -> Result<()> {
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader) {
            return Ok(());
        }
        let raw = entry.path().map_err(|e| self.bad_tar(index, e))?.into_owned();
        let refuse =
            |reason: &str| ImageError::Refused { layer: index, path: raw.display().to_string(), reason: reason.into() };
        let (parent, name) = match split(&raw).map_err(refuse)? {
            Some(place) => place,
            None => return Ok(()), // the root itself: it stays root's, mode 0755
        };
        let size = if kind.is_file() { entry.header().size().map_err(|e| self.bad_tar(index, e))? } else { 0 };
        self.budget.charge(size)?;
        let full = parent.join(&name);
        // Whatever this entry replaces may be the cached directory or hold it.
        self.forget_under(&full);
        let place = Place { parent, name, full };
        let name_bytes = place.name.as_bytes();
        if name_bytes == OPAQUE.as_bytes() {
            return self.opaque(&place, written).map_err(|e| self.failed(index, &raw, e));
        }
        if let Some(hidden) = name_bytes.strip_prefix(WHITEOUT.as_bytes()) {
            if matches!(hidden, b"" | b"." | b"..") {
                return Err(refuse("is a whiteout of no file"));
            }
            let target = place.parent.join(OsStr::from_bytes(hidden));
            // A whiteout hides what the layers below have, never what this layer wrote.
            if written.contains(&target) {
                return Ok(());
            }
            self.forget_under(&target);
            let dir = match self.dir(&place.parent) {
                Err(nix::errno::Errno::ENOENT) => return Ok(()),
                other => other.map_err(|e| self.failed(index, &raw, e))?,
            };
            return at::remove_all(dir.as_fd(), OsStr::from_bytes(hidden)).map_err(|e| self.failed(index, &raw, e));
        }
        let (uid, gid) = self.ids(entry, index, &raw)?;
        let mode = entry.header().mode().map_err(|e| self.bad_tar(index, e))?;
        let mtime = entry.header().mtime().unwrap_or(0);
        let dir = self.dir_creating(&place.parent, index, &raw)?;
        let fd = dir.as_fd();
        let name = place.name.as_os_str();
        let owner = Owner { uid, gid, mode };
        let result: io::Result<()> = match kind {
            EntryType::Regular | EntryType::Continuous => self.file(fd, name, entry, owner, &raw),
            EntryType::Directory => at::ensure_dir(fd, name).map_err(io::Error::from),
            EntryType::Symlink => {
                let target = entry.link_name().map_err(|e| self.bad_tar(index, e))?.unwrap_or_default();
                at::symlink(fd, name, &target).map_err(io::Error::from)
            }
            EntryType::Link => return self.link(index, &raw, entry, fd, name, written, &place.full),
            EntryType::Fifo => at::fifo(fd, name).map_err(io::Error::from),
            EntryType::Char | EntryType::Block => return Err(refuse("is a device node")),
            other => return Err(refuse(&format!("has an unsupported tar entry type {:?}", other.as_byte() as char))),
        };
        result.map_err(|e| self.failed(index, &raw, e))?;
        if !kind.is_file() {
            // A regular file got its owner and mode before its xattrs (chown drops capabilities).
            let mode = (kind != EntryType::Symlink).then_some(mode);
            at::set_owner_mode(fd, name, uid, gid, mode).map_err(|e| self.failed(index, &raw, e))?;
        }
        if kind != EntryType::Directory {
            at::set_mtime(fd, name, mtime).map_err(|e| self.failed(index, &raw, e))?;
        }
        let added = remember(written, place.full);
        self.budget.charge_remembered(added)
    }

    /// The directory `rel`, made (with what is missing above it) if needed; each directory
    /// made counts as an entry.
    fn dir_creating(&mut self, rel: &Path, index: usize, raw: &Path) -> Result<OwnedFd> {
        if let Some(fd) = self.cached_dir(rel).map_err(|e| self.failed(index, raw, e))? {
            return Ok(fd);
        }
        let (fd, made) = at::make_dir_in_root(self.root.as_fd(), rel, self.budget.limits.id_base)
            .map_err(|e| self.failed(index, raw, e))?;
        self.budget.charge_entries(made, 0)?;
        self.cache(rel, &fd).map_err(|e| self.failed(index, raw, e))?;
        Ok(fd)
    }

    /// Drops the cached directory if `path` is it or holds it.
    fn forget_under(&mut self, path: &Path) {
        if self.cached.as_ref().is_some_and(|(cached, _)| cached.starts_with(path)) {
            self.cached = None;
        }
    }

    fn failed(&self, index: usize, path: &Path, e: impl Into<io::Error>) -> ImageError {
        ImageError::io("unpack", format!("layer {index}: {}", path.display()), e.into())
    }

    fn ids<R: Read>(&self, entry: &tar::Entry<R>, index: usize, raw: &Path) -> Result<(u32, u32)> {
        let header = entry.header();
        let uid = header.uid().map_err(|e| self.bad_tar(index, e))?;
        let gid = header.gid().map_err(|e| self.bad_tar(index, e))?;
        let max = u64::from(self.budget.limits.max_id);
        if uid > max || gid > max {
            return Err(ImageError::Refused {
                layer: index,
                path: raw.display().to_string(),
                reason: format!("is owned by {uid}:{gid}, outside the sandbox's ids 0-{max}"),
            });
        }
        let base = self.budget.limits.id_base;
        Ok((base + uid as u32, base + gid as u32))
    }

    /// The existing directory `rel`.
    fn dir(&mut self, rel: &Path) -> nix::Result<OwnedFd> {
        if let Some(fd) = self.cached_dir(rel)? {
            return Ok(fd);
        }
        let fd = at::open_dir_in_root(self.root.as_fd(), rel)?;
        self.cache(rel, &fd)?;
        Ok(fd)
    }

    fn cached_dir(&self, rel: &Path) -> nix::Result<Option<OwnedFd>> {
        match &self.cached {
            Some((path, fd)) if path == rel => Ok(Some(fd.try_clone().map_err(errno)?)),
            _ => Ok(None),
        }
    }

    fn cache(&mut self, rel: &Path, fd: &OwnedFd) -> nix::Result<()> {
        self.cached = Some((rel.to_path_buf(), fd.try_clone().map_err(errno)?));
        Ok(())
    }

    /// A regular file: content, then owner and mode, then xattrs (so that a later chown cannot
    /// drop a file capability).
    fn file<R: Read>(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        entry: &mut tar::Entry<R>,
        owner: Owner,
        raw: &Path,
    ) -> io::Result<()> {
        let mut file = at::create_file(dir, name)?;
        io::copy(entry, &mut file)?;
        at::set_file_owner_mode(&file, owner.uid, owner.gid, owner.mode)?;
        for extension in entry.pax_extensions()?.into_iter().flatten() {
            let extension = extension?;
            let Some(key) = extension.key_bytes().strip_prefix(XATTR_PREFIX.as_bytes()) else { continue };
            if key.starts_with(b"user.") || key == b"security.capability" {
                at::set_xattr(&file, OsStr::from_bytes(key), extension.value_bytes())?;
            } else {
                tracing::debug!(path = %raw.display(), key = %String::from_utf8_lossy(key), "xattr not kept");
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn link<R: Read>(
        &mut self,
        index: usize,
        raw: &Path,
        entry: &tar::Entry<R>,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        written: &mut HashSet<PathBuf>,
        full: &Path,
    ) -> Result<()> {
        let target = entry.link_name().map_err(|e| self.bad_tar(index, e))?.unwrap_or_default();
        let refuse =
            |reason: &str| ImageError::Refused { layer: index, path: raw.display().to_string(), reason: reason.into() };
        let Some((source_parent, source_name)) =
            split(&target).map_err(|r| refuse(&format!("links to a path that {r}")))?
        else {
            return Err(refuse("is a hard link to the root"));
        };
        if source_parent.join(&source_name) == full {
            return Ok(()); // a link to itself: nothing to do
        }
        let source = at::open_dir_in_root(self.root.as_fd(), &source_parent).map_err(|e| self.failed(index, raw, e))?;
        at::hard_link(source.as_fd(), &source_name, dir, name).map_err(|e| self.failed(index, raw, e))?;
        let added = remember(written, full.to_path_buf());
        self.budget.charge_remembered(added)
    }

    /// `.wh..wh..opq`: removes what lower layers put in the directory, keeping this layer's,
    /// at every depth.
    fn opaque(&mut self, place: &Place, written: &HashSet<PathBuf>) -> nix::Result<()> {
        self.forget_under(&place.parent);
        let (dir, _) = at::make_dir_in_root(self.root.as_fd(), &place.parent, self.budget.limits.id_base)?;
        prune(dir.as_fd(), &place.parent, written)
    }
}

/// Removes from `dir` (at `rel`) everything this layer did not write, descending into the
/// directories it did write (they may hold lower layers' files too).
fn prune(dir: BorrowedFd<'_>, rel: &Path, written: &HashSet<PathBuf>) -> nix::Result<()> {
    for child in at::children(dir)? {
        let path = rel.join(&child);
        if !written.contains(&path) {
            at::remove_all(dir, &child)?;
        } else if let Some(sub) = at::open_child_dir(dir, &child)? {
            prune(sub.as_fd(), &path, written)?;
        }
    }
    Ok(())
}

fn errno(e: io::Error) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Owner and permission bits an entry asks for.
#[derive(Debug, Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
    mode: u32,
}

/// Records that this layer wrote `path`, and so its directories; returns the bytes of the
/// paths added (charged to the budget).
fn remember(written: &mut HashSet<PathBuf>, path: PathBuf) -> u64 {
    let mut added = 0;
    let mut next = Some(path);
    while let Some(path) = next {
        next = path.parent().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf);
        let len = path.as_os_str().len() as u64;
        if !written.insert(path) {
            break;
        }
        added += len;
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_paths_inside_the_root() {
        let ok = |p: &str| split(Path::new(p)).unwrap();
        assert_eq!(ok("./a/b"), Some((PathBuf::from("a"), OsString::from("b"))));
        assert_eq!(ok("/etc/passwd"), Some((PathBuf::from("etc"), OsString::from("passwd"))));
        assert_eq!(ok("top"), Some((PathBuf::new(), OsString::from("top"))));
        assert_eq!(ok("./"), None);
        for bad in ["../x", "a/../../x", "a/.."] {
            assert!(split(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
