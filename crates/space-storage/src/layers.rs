//! The layer cache of Dockerfile builds: every step that changes files leaves a read-only
//! subvolume `<pool>/build-cache/<key>`, named by the step's key (a hash of the parent layer's
//! key, the instruction and what it read). A build whose prefix of steps is unchanged finds
//! their layers here and starts from the last one, as Docker's layer cache does. Layers are
//! already id-shifted like templates: a sandbox runs on a writable snapshot of one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use rand::Rng;

use crate::btrfs;
use crate::error::{IoContext, Result, StorageError};
use crate::pool::Pool;
use crate::util::remove_any;
use space_api::IdMap;

/// The directory of the cache under the pool root.
pub(crate) const LAYERS_DIR: &str = "build-cache";
const STAGING_PREFIX: &str = ".staging-";
/// Under the cache: an empty file per layer, named by its key, whose mtime is when a build
/// last used it (a read-only subvolume's own times cannot be changed).
const USED_DIR: &str = ".used";

/// The cached layers of one pool.
#[derive(Debug, Clone)]
pub struct Layers {
    dir: PathBuf,
}

/// A writable copy of a layer or template being changed into a new layer; deleted on drop
/// unless committed.
#[derive(Debug)]
pub struct StagedLayer {
    path: PathBuf,
    key: String,
    armed: bool,
}

impl StagedLayer {
    /// The root filesystem to change.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StagedLayer {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = remove_any(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove a staged build layer");
        }
    }
}

impl Layers {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Layers { dir }
    }

    /// The layer of `key`, if cached. Keys are hex digests (anything else is refused, so a key
    /// never names a path outside the cache).
    pub fn get(&self, key: &str) -> Result<Option<PathBuf>> {
        let path = self.path(key)?;
        Ok(path.exists().then_some(path))
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        if key.is_empty() || key.len() > 128 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StorageError::BadTemplateContent {
                path: self.dir.join(key),
                reason: "a layer key is a hex digest".into(),
            });
        }
        Ok(self.dir.join(key))
    }

    /// A writable snapshot of `parent` (a layer or a template's subvolume, O(1)) to become
    /// layer `key`.
    pub fn stage(&self, parent: &Path, key: &str) -> Result<StagedLayer> {
        self.path(key)?;
        let suffix: u32 = rand::rng().random();
        let path = self.dir.join(format!("{STAGING_PREFIX}{key}-{suffix:08x}"));
        btrfs::snapshot(parent, &path, false)?;
        Ok(StagedLayer { path, key: key.to_owned(), armed: true })
    }

    /// A subvolume `fill` writes as host root (ids unshifted, as an image unpacks), then
    /// shifted into the pool's ids as an import's tree is (file capabilities included), to
    /// become layer `key`.
    pub fn stage_filled(&self, key: &str, map: IdMap, fill: impl FnOnce(&Path) -> Result<()>) -> Result<StagedLayer> {
        self.path(key)?;
        let suffix: u32 = rand::rng().random();
        let path = self.dir.join(format!("{STAGING_PREFIX}{key}-{suffix:08x}"));
        btrfs::create_subvolume(&path)?;
        let staged = StagedLayer { path, key: key.to_owned(), armed: true };
        fill(&staged.path)?;
        crate::shift::shift_tree(&staged.path, map, &crate::progress::no_progress)?;
        Ok(staged)
    }

    /// Makes `staged` the read-only layer of its key. When that layer exists already (two
    /// builds made it at once, or a build ran without its cache), `replace` puts the new one
    /// in its place and deletes the old; otherwise the new one is dropped.
    pub fn commit(&self, mut staged: StagedLayer, replace: bool) -> Result<PathBuf> {
        btrfs::set_readonly(&staged.path, true)?;
        let target = self.path(&staged.key)?;
        match renameat2(AT_FDCWD, &staged.path, AT_FDCWD, &target, RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => staged.armed = false,
            // The old layer is then where the staged one was, and goes with it on drop.
            Err(Errno::EEXIST) if replace => {
                renameat2(AT_FDCWD, &staged.path, AT_FDCWD, &target, RenameFlags::RENAME_EXCHANGE)
                    .ctx("replace layer", &target)?
            }
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(e).ctx("rename layer into place", &target),
        }
        self.touch(&staged.key)?;
        Ok(target)
    }

    /// Records that a build used layer `key` now: pruning counts its age from here.
    pub fn touch(&self, key: &str) -> Result<()> {
        self.touch_at(key, SystemTime::now())
    }

    fn touch_at(&self, key: &str, when: SystemTime) -> Result<()> {
        self.path(key)?;
        let dir = self.dir.join(USED_DIR);
        std::fs::create_dir_all(&dir).ctx("create directory", &dir)?;
        let marker = dir.join(key);
        let file =
            std::fs::File::options().create(true).truncate(false).write(true).open(&marker).ctx("open", &marker)?;
        file.set_modified(when).ctx("set the time of", &marker)
    }

    /// Deletes every layer no build used for longer than `max_age` (a layer never used since
    /// it was made counts from its making); how many. Templates made from a layer are
    /// snapshots of their own and stay. Only call while no build runs: a build may be about
    /// to start from a layer it found.
    pub fn prune(&self, max_age: Duration) -> Result<usize> {
        self.prune_at(SystemTime::now(), max_age)
    }

    fn prune_at(&self, now: SystemTime, max_age: Duration) -> Result<usize> {
        let entries = match std::fs::read_dir(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            entries => entries.ctx("read directory", &self.dir)?,
        };
        let mut pruned = 0;
        for entry in entries {
            let entry = entry.ctx("read directory", &self.dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(layer) = self.path(&name) else { continue };
            let marker = self.dir.join(USED_DIR).join(&name);
            let Some(used) = last_used(&marker, &layer) else { continue };
            if now.duration_since(used).is_ok_and(|age| age > max_age) {
                remove_any(&layer)?;
                remove_any(&marker)?;
                pruned += 1;
            }
        }
        Ok(pruned)
    }

    /// Removes the staging copies an interrupted build left. Only call while no build runs
    /// (the pool does it on open, under its lock).
    pub(crate) fn clear_staging(&self) -> Result<()> {
        for entry in std::fs::read_dir(&self.dir).ctx("read directory", &self.dir)? {
            let entry = entry.ctx("read directory", &self.dir)?;
            if entry.file_name().to_string_lossy().starts_with(STAGING_PREFIX) {
                tracing::warn!(path = %entry.path().display(), "removing a layer an interrupted build left");
                remove_any(&entry.path())?;
            }
        }
        Ok(())
    }
}

/// When a layer was last used: its marker's mtime, else (a layer made before markers were)
/// when it was renamed into place (its root's ctime: a snapshot keeps its source's mtime).
fn last_used(marker: &Path, layer: &Path) -> Option<SystemTime> {
    if let Ok(time) = std::fs::metadata(marker).and_then(|m| m.modified()) {
        return Some(time);
    }
    let meta = std::fs::symlink_metadata(layer).ok()?;
    let secs = u64::try_from(meta.ctime()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

impl Pool {
    /// The layer cache of Dockerfile builds.
    pub fn layers(&self) -> Layers {
        Layers::new(self.root().join(LAYERS_DIR))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_go_once_unused_for_longer_than_the_age_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let layers = Layers::new(dir.path().join(LAYERS_DIR));
        // Plain directories stand for the subvolumes: pruning only reads names and times.
        for name in ["aa01", "bb02", "cc03", ".staging-dd04-0000", "not-a-key"] {
            std::fs::create_dir_all(layers.dir.join(name)).unwrap();
        }
        let now = SystemTime::now();
        let day = Duration::from_secs(24 * 3600);
        layers.touch_at("aa01", now - 10 * day).unwrap();
        layers.touch_at("bb02", now - day).unwrap();
        assert!(layers.touch_at("../escape", now).is_err());

        assert_eq!(layers.prune_at(now, 7 * day).unwrap(), 1);
        assert!(!layers.dir.join("aa01").exists() && !layers.dir.join(USED_DIR).join("aa01").exists());
        // cc03 has no marker: it counts from when it was put in place (now).
        for kept in ["bb02", "cc03", ".staging-dd04-0000", "not-a-key"] {
            assert!(layers.dir.join(kept).exists(), "{kept}");
        }
        assert_eq!(layers.prune_at(now + 8 * day, 7 * day).unwrap(), 2);
        for kept in [".staging-dd04-0000", "not-a-key", USED_DIR] {
            assert!(layers.dir.join(kept).exists(), "{kept}");
        }
        assert_eq!(std::fs::read_dir(layers.dir.join(USED_DIR)).unwrap().count(), 0);
        // A cache that was never made prunes nothing.
        assert_eq!(Layers::new(dir.path().join("none")).prune(day).unwrap(), 0);
    }
}
