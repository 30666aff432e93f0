//! The layer cache of Dockerfile builds: every step that changes files leaves a read-only
//! subvolume `<pool>/build-cache/<key>`, named by the step's key (a hash of the parent layer's
//! key, the instruction and what it read). A build whose prefix of steps is unchanged finds
//! their layers here and starts from the last one, as Docker's layer cache does. Layers are
//! already id-shifted like templates: a sandbox runs on a writable snapshot of one.

use std::path::{Path, PathBuf};

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
        Ok(target)
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

impl Pool {
    /// The layer cache of Dockerfile builds.
    pub fn layers(&self) -> Layers {
        Layers::new(self.root().join(LAYERS_DIR))
    }
}
