//! The template store: read-only subvolumes `templates/<name>@<version>` with their metadata
//! next to them in `templates/<name>@<version>.json`.
//!
//! Every build fills a staging subvolume (`templates/.staging-…`), shifts its ownership into
//! the id map, makes it read-only, renames it into place (never over an existing version) and
//! only then writes the metadata. A template without metadata is invisible and is removed the
//! next time the pool opens, so a crash never leaves a half template that looks usable.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use rand::Rng;

use crate::btrfs;
use crate::error::{IoContext, Result, StorageError};
use crate::progress::{Progress, ProgressFn};
use crate::shift::shift_tree;
use crate::util::{now_ms, remove_any, write_atomic};
use space_api::{IdMap, TemplateDefaults};

const STAGING_PREFIX: &str = ".staging-";
const MAX_NAME_LEN: usize = 63;

pub use space_api::TemplateInfo;

/// Checks a template name: `[a-z0-9][a-z0-9-_.]{0,62}`.
pub fn validate_template_name(name: &str) -> Result<()> {
    let bytes = name.as_bytes();
    let first_ok = bytes.first().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'));
    if first_ok && rest_ok && bytes.len() <= MAX_NAME_LEN {
        Ok(())
    } else {
        Err(StorageError::InvalidTemplateName { name: name.chars().take(80).collect() })
    }
}

/// Parses a directory entry of the store: `<name>@<version>` or `<name>@<version>.json`.
/// Returns the name, version and whether it is the metadata file.
pub fn parse_entry(file_name: &str) -> Option<(&str, u64, bool)> {
    let (stem, is_meta) = match file_name.strip_suffix(".json") {
        Some(stem) => (stem, true),
        None => (file_name, false),
    };
    let (name, version) = stem.rsplit_once('@')?;
    validate_template_name(name).ok()?;
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let version: u64 = version.parse().ok().filter(|v| *v >= 1)?;
    Some((name, version, is_meta))
}

/// Parses metadata read from `path`, checking it matches the file's name.
pub fn parse_metadata(path: &Path, text: &str) -> Result<TemplateInfo> {
    let bad = |reason: String| StorageError::BadMetadata { path: path.to_path_buf(), reason };
    let info: TemplateInfo = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match parse_entry(file_name) {
        Some((name, version, true)) if name == info.name && version == info.version => Ok(info),
        _ => Err(bad(format!("it describes {}@{}, which does not match its file name", info.name, info.version))),
    }
}

/// Where a template's content came from, recorded in its metadata.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    /// For humans: a path, a built-in's recipe, an image reference.
    pub source: String,
    /// The image's digest, for templates made from an OCI image.
    pub digest: Option<String>,
    pub defaults: Option<space_api::TemplateDefaults>,
}

impl Origin {
    pub fn described(source: String) -> Self {
        Origin { source, ..Origin::default() }
    }
}

/// The templates of one pool.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    dir: PathBuf,
    id_map: IdMap,
}

impl TemplateStore {
    pub(crate) fn new(dir: PathBuf, id_map: IdMap) -> Self {
        TemplateStore { dir, id_map }
    }

    /// The id range template files are shifted into.
    pub fn id_map(&self) -> IdMap {
        self.id_map
    }

    /// The directory holding the templates.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The subvolume of a template (the name is validated, so this never escapes the store).
    pub fn path(&self, info: &TemplateInfo) -> Result<PathBuf> {
        self.path_of(&info.name, info.version)
    }

    fn path_of(&self, name: &str, version: u64) -> Result<PathBuf> {
        validate_template_name(name)?;
        Ok(self.dir.join(format!("{name}@{version}")))
    }

    fn meta_path(&self, name: &str, version: u64) -> PathBuf {
        self.dir.join(format!("{name}@{version}.json"))
    }

    fn entries(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).ctx("read directory", &self.dir)? {
            let entry = entry.ctx("read directory", &self.dir)?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// All usable templates, sorted by name and version. Unreadable metadata is skipped with a
    /// warning.
    pub fn list(&self) -> Result<Vec<TemplateInfo>> {
        let mut out = Vec::new();
        for file in self.entries()? {
            let Some((name, version, true)) = parse_entry(&file) else {
                continue;
            };
            if !self.dir.join(format!("{name}@{version}")).is_dir() {
                continue;
            }
            match self.read_metadata(&self.dir.join(&file)) {
                Ok(info) => out.push(info),
                Err(e) => tracing::warn!(error = %e, "skipping template"),
            }
        }
        out.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
        Ok(out)
    }

    fn read_metadata(&self, path: &Path) -> Result<TemplateInfo> {
        let text = std::fs::read_to_string(path).ctx("read", path)?;
        parse_metadata(path, &text)
    }

    /// The newest version of `name`, if any.
    pub fn resolve(&self, name: &str) -> Result<Option<TemplateInfo>> {
        validate_template_name(name)?;
        Ok(self.list()?.into_iter().rfind(|t| t.name == name))
    }

    /// One exact version.
    pub fn get(&self, name: &str, version: u64) -> Result<TemplateInfo> {
        let not_found = || StorageError::TemplateNotFound { name: name.to_owned(), version: Some(version) };
        let subvolume = self.path_of(name, version)?;
        if !subvolume.is_dir() {
            return Err(not_found());
        }
        match self.read_metadata(&self.meta_path(name, version)) {
            Err(e) if e.errno() == Some(Errno::ENOENT) => Err(not_found()),
            other => other,
        }
    }

    /// Deletes one version (metadata first, so it stops being usable at once). Sandboxes
    /// created from it are independent snapshots and keep working. Returns whether anything
    /// existed.
    pub fn delete(&self, name: &str, version: u64) -> Result<bool> {
        let subvolume = self.path_of(name, version)?;
        let meta = self.meta_path(name, version);
        let existed = meta.exists() || subvolume.exists();
        remove_any(&meta)?;
        remove_any(&subvolume)?;
        if existed {
            tracing::info!(template = %format!("{name}@{version}"), "deleted template");
        }
        Ok(existed)
    }

    /// Removes what interrupted builds left behind: staging subvolumes, temp files, template
    /// subvolumes whose metadata was never written and metadata without a subvolume. Only
    /// call while no build runs (the pool does it on open, under its lock).
    pub(crate) fn cleanup(&self) -> Result<()> {
        for file in self.entries()? {
            let path = self.dir.join(&file);
            let leftover = match parse_entry(&file) {
                None => file.starts_with('.'),
                Some((name, version, true)) => !self.dir.join(format!("{name}@{version}")).exists(),
                Some((name, version, false)) => !self.meta_path(name, version).exists(),
            };
            if leftover {
                tracing::warn!(path = %path.display(), "removing leftover of an interrupted template build");
                match file.starts_with(".receive-") {
                    true => crate::transfer::remove_received(&path),
                    false => remove_any(&path)?,
                }
            }
        }
        Ok(())
    }

    fn next_version(&self, name: &str) -> Result<u64> {
        let newest = self
            .entries()?
            .iter()
            .filter_map(|f| parse_entry(f))
            .filter(|(n, _, _)| *n == name)
            .map(|(_, v, _)| v)
            .max();
        Ok(newest.unwrap_or(0) + 1)
    }

    /// Builds a template: `fill` writes the root filesystem into an empty staging subvolume
    /// (as host root, unshifted); the rest of the pipeline makes it a template.
    pub(crate) fn build(
        &self,
        name: &str,
        origin: Origin,
        progress: ProgressFn,
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<TemplateInfo> {
        validate_template_name(name)?;
        let staging = Staging::create(&self.dir, name)?;
        fill(&staging.path)?;
        crate::mount::unmount_tree(&staging.path)?;
        let stats = shift_tree(&staging.path, self.id_map, progress)?;
        self.finish(staging, name, origin, stats.size_bytes, progress)
    }

    /// Publishes a copy of `layer` (an id-shifted build layer, O(1)) as a new version of
    /// `name`, with `defaults` as what every command runs with.
    pub fn publish_layer(
        &self,
        name: &str,
        layer: &Path,
        source: String,
        defaults: TemplateDefaults,
        progress: ProgressFn,
    ) -> Result<TemplateInfo> {
        validate_template_name(name)?;
        let staging = Staging::snapshot_of(&self.dir, name, layer)?;
        let max_id = self.id_map.count - 1;
        crate::oci::write_exec_defaults(&staging.path, &defaults, max_id, self.id_map.root())?;
        let size = crate::usage::apparent_size(&staging.path)?;
        let origin = Origin { source, digest: None, defaults: Some(defaults) };
        self.finish(staging, name, origin, size, progress)
    }

    /// Makes a filled staging subvolume the next version of `name`.
    fn finish(
        &self,
        staging: Staging,
        name: &str,
        origin: Origin,
        size_bytes: u64,
        progress: ProgressFn,
    ) -> Result<TemplateInfo> {
        progress(Progress::new("finishing", 0, None));
        btrfs::set_readonly(&staging.path, true)?;
        let version = self.rename_into_place(&staging.path, name)?;
        staging.disarm();
        let info = TemplateInfo {
            name: name.to_owned(),
            version,
            created_at_ms: now_ms(),
            source: origin.source,
            size_bytes,
            digest: origin.digest,
            defaults: origin.defaults,
        };
        if let Err(e) = self.publish(&info) {
            let _ = remove_any(&self.dir.join(format!("{name}@{version}")));
            return Err(e);
        }
        tracing::info!(template = %format!("{name}@{version}"), size_bytes = info.size_bytes, "template ready");
        progress(Progress::new("done", 1, Some(1)));
        Ok(info)
    }

    /// Makes the renamed subvolume durable, then writes the metadata that makes it visible.
    pub(crate) fn publish(&self, info: &TemplateInfo) -> Result<()> {
        let dir = std::fs::File::open(&self.dir).ctx("open", &self.dir)?;
        nix::unistd::syncfs(&dir).ctx("sync pool", &self.dir)?;
        let json = serde_json::to_vec_pretty(info).map_err(|e| StorageError::BadMetadata {
            path: self.meta_path(&info.name, info.version),
            reason: e.to_string(),
        })?;
        write_atomic(&self.meta_path(&info.name, info.version), &json)
    }

    /// Renames `staging` to the next free `<name>@<version>` without ever replacing one.
    fn rename_into_place(&self, staging: &Path, name: &str) -> Result<u64> {
        for _ in 0..64 {
            let version = self.next_version(name)?;
            let target = self.path_of(name, version)?;
            match renameat2(AT_FDCWD, staging, AT_FDCWD, &target, RenameFlags::RENAME_NOREPLACE) {
                Ok(()) => return Ok(version),
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(e).ctx("rename template into place", &target),
            }
        }
        Err(StorageError::btrfs("rename template", staging, Errno::EEXIST))
    }
}

/// A staging subvolume that is deleted on drop unless the build published it.
struct Staging {
    path: PathBuf,
    armed: bool,
}

impl Staging {
    fn create(dir: &Path, name: &str) -> Result<Self> {
        let path = Self::name(dir, name);
        btrfs::create_subvolume(&path)?;
        Ok(Staging { path, armed: true })
    }

    /// A writable snapshot of `source`.
    fn snapshot_of(dir: &Path, name: &str, source: &Path) -> Result<Self> {
        let path = Self::name(dir, name);
        btrfs::snapshot(source, &path, false)?;
        Ok(Staging { path, armed: true })
    }

    fn name(dir: &Path, name: &str) -> PathBuf {
        let suffix: u32 = rand::rng().random();
        dir.join(format!("{STAGING_PREFIX}{name}-{suffix:08x}"))
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = remove_any(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove staging subvolume");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_names() {
        for good in ["busybox", "debian", "a", "0", "py3.12_slim-v2", &"a".repeat(63)] {
            assert!(validate_template_name(good).is_ok(), "{good}");
        }
        let long = "a".repeat(64);
        for bad in ["", "-a", ".a", "_a", "A", "a/b", "..", "a@1", "a b", "é", long.as_str()] {
            assert!(validate_template_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn store_entries() {
        assert_eq!(parse_entry("debian@3"), Some(("debian", 3, false)));
        assert_eq!(parse_entry("debian@12.json"), Some(("debian", 12, true)));
        assert_eq!(parse_entry("py3.12@1.json"), Some(("py3.12", 1, true)));
        for bad in ["debian", "debian@", "debian@0", "debian@+1", "@1", ".staging-x-1", "Deb@1"] {
            assert_eq!(parse_entry(bad), None, "{bad}");
        }
    }

    #[test]
    fn metadata_round_trip_and_mismatch() {
        let info = TemplateInfo {
            name: "busybox".into(),
            version: 2,
            created_at_ms: 1_700_000_000_000,
            source: "test".into(),
            size_bytes: 42,
            digest: None,
            defaults: None,
        };
        let text = serde_json::to_string(&info).unwrap();
        let ok = parse_metadata(Path::new("/p/templates/busybox@2.json"), &text).unwrap();
        assert_eq!(ok, info);
        let err = parse_metadata(Path::new("/p/templates/busybox@3.json"), &text).unwrap_err();
        assert!(err.to_string().contains("does not match"), "{err}");
        let err = parse_metadata(Path::new("/p/busybox@2.json"), "{").unwrap_err();
        assert!(matches!(err, StorageError::BadMetadata { .. }));
    }
}
