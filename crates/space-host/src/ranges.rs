//! Host id ranges of sandboxes: every sandbox runs in a range of its own, so no two sandboxes
//! (of any tenant) share a host uid, and none runs with the storage's range, which owns the
//! files on disk (templates, roots, snapshots) and which sandboxes only see through an
//! idmapped mount (`idmapped.rs`).
//!
//! Slot `n` (from 1; slot 0 is the storage range itself) is host ids
//! `storage.host_base + n * storage.count ..` of the same size. A slot in use is recorded as a
//! symlink `<dir>/<n>` whose target is the sandbox id: `symlink` either creates it or fails
//! with `EEXIST`, so a slot is never handed out twice, and the record survives a node restart
//! (the runtime's dir is in the data dir). [`Ranges::release`] removes it when the sandbox is
//! destroyed; records of sandboxes that left nothing else behind are swept at start-up.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use space_runtime::{IdMap, RuntimeError, SandboxId};

use crate::idmapped;

/// How many sandbox ranges a node hands out by default.
pub const DEFAULT_RANGES: u32 = 4096;

/// The node's sandbox ranges and their records.
#[derive(Debug)]
pub struct Ranges {
    dir: PathBuf,
    storage: IdMap,
    slots: u32,
    /// Serialises "find the sandbox's slot, else take a free one" within this process.
    allocating: Mutex<()>,
    /// The idmapping of each slot's mounts (storage range → slot range), made once per slot.
    mappings: Mutex<HashMap<u32, Arc<OwnedFd>>>,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io { path: path.to_path_buf(), source }
}

impl Ranges {
    /// Checks that every slot fits in 32 bits and creates the record directory (0700).
    pub fn new(dir: PathBuf, storage: IdMap, slots: u32) -> Result<Ranges, RuntimeError> {
        let end = u64::from(storage.host_base) + (u64::from(slots) + 1) * u64::from(storage.count);
        if slots == 0 || end > u64::from(u32::MAX) {
            return Err(RuntimeError::Unsupported(format!(
                "{slots} sandbox id ranges of {} ids after {} do not fit in 32-bit ids",
                storage.count, storage.host_base
            )));
        }
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)
            .map_err(io_err(&dir))?;
        Ok(Ranges { dir, storage, slots, allocating: Mutex::new(()), mappings: Mutex::new(HashMap::new()) })
    }

    /// The host ids of slot `slot`.
    pub fn map(&self, slot: u32) -> IdMap {
        IdMap { host_base: self.storage.host_base + slot * self.storage.count, count: self.storage.count }
    }

    /// The sandbox's slot: the one recorded for it, else the lowest free one, recorded now.
    pub fn allocate(&self, id: &SandboxId) -> Result<u32, RuntimeError> {
        let _held = self.allocating.lock().expect("ranges lock");
        if let Some(slot) = self.slot_of(id) {
            return Ok(slot);
        }
        for slot in 1..=self.slots {
            let path = self.dir.join(slot.to_string());
            match std::os::unix::fs::symlink(id.as_str(), &path) {
                Ok(()) => {
                    sync_dir(&self.dir)?;
                    return Ok(slot);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        Err(RuntimeError::Start(format!("all {} sandbox id ranges are in use", self.slots)))
    }

    /// The slot recorded for the sandbox, if any.
    pub fn slot_of(&self, id: &SandboxId) -> Option<u32> {
        let records = self.records().ok()?;
        records.into_iter().find(|(_, owner)| owner == id.as_str()).map(|(slot, _)| slot)
    }

    /// Frees the sandbox's slot (if it has one).
    pub fn release(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let _held = self.allocating.lock().expect("ranges lock");
        let mut removed = false;
        for (slot, _) in self.records()?.into_iter().filter(|(_, owner)| owner == id.as_str()) {
            let path = self.dir.join(slot.to_string());
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&path)(e)),
                _ => removed = true,
            }
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Frees the slots of sandboxes `keep` does not name; returns how many.
    pub fn sweep(&self, keep: &[SandboxId]) -> Result<usize, RuntimeError> {
        let stale: Vec<String> = self
            .records()?
            .into_iter()
            .map(|(_, owner)| owner)
            .filter(|owner| !keep.iter().any(|k| k.as_str() == owner))
            .collect();
        for owner in &stale {
            match owner.parse::<SandboxId>() {
                Ok(id) => self.release(&id)?,
                Err(_) => self.release_named(owner)?,
            }
        }
        Ok(stale.len())
    }

    /// Removes records whose target is not a sandbox id (never written by this module).
    fn release_named(&self, owner: &str) -> Result<(), RuntimeError> {
        for (slot, _) in self.records()?.into_iter().filter(|(_, o)| o == owner) {
            let path = self.dir.join(slot.to_string());
            std::fs::remove_file(&path).map_err(io_err(&path))?;
        }
        Ok(())
    }

    /// The idmapping of slot `slot`'s mounts: storage ids → the slot's ids.
    pub fn mapping(&self, slot: u32) -> Result<Arc<OwnedFd>, RuntimeError> {
        let mut mappings = self.mappings.lock().expect("mappings lock");
        if let Some(fd) = mappings.get(&slot) {
            return Ok(fd.clone());
        }
        let map = self.map(slot);
        let fd = idmapped::mapping_userns(self.storage.host_base, map.host_base, map.count)
            .map(Arc::new)
            .map_err(|e| RuntimeError::Start(format!("user namespace mapping {map:?}: {e}")))?;
        mappings.insert(slot, fd.clone());
        Ok(fd)
    }

    /// Every record: (slot, the sandbox id it names).
    fn records(&self) -> Result<Vec<(u32, String)>, RuntimeError> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let Some(slot) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            match std::fs::read_link(entry.path()) {
                Ok(target) => found.push((slot, target.to_string_lossy().into_owned())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {} // released meanwhile
                Err(e) => return Err(io_err(&entry.path())(e)),
            }
        }
        found.sort();
        Ok(found)
    }
}

/// Makes the directory's entries durable (a record must outlive a crash of the host).
fn sync_dir(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(dir: &Path, slots: u32) -> Ranges {
        Ranges::new(dir.join("uid-ranges"), IdMap::default(), slots).unwrap()
    }

    #[test]
    fn each_sandbox_gets_its_own_slot_until_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let r = ranges(dir.path(), 2);
        let (a, b, c) = (SandboxId::generate(), SandboxId::generate(), SandboxId::generate());
        assert_eq!(r.allocate(&a).unwrap(), 1);
        assert_eq!(r.allocate(&b).unwrap(), 2);
        assert_eq!(r.allocate(&a).unwrap(), 1, "a replayed allocation keeps its slot");
        assert!(matches!(r.allocate(&c), Err(RuntimeError::Start(_))), "only two slots");
        r.release(&a).unwrap();
        assert_eq!(r.allocate(&c).unwrap(), 1);
        assert_eq!(r.map(1), IdMap { host_base: 165_536, count: 65_536 });
        assert_eq!(r.map(2).host_base, 231_072);
    }

    #[test]
    fn records_survive_a_new_instance_and_stale_ones_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (SandboxId::generate(), SandboxId::generate());
        ranges(dir.path(), 8).allocate(&a).unwrap();
        ranges(dir.path(), 8).allocate(&b).unwrap();
        let r = ranges(dir.path(), 8);
        assert_eq!(r.allocate(&b).unwrap(), 2, "the record outlived the instance");
        assert_eq!(r.sweep(std::slice::from_ref(&b)).unwrap(), 1);
        assert_eq!(r.allocate(&SandboxId::generate()).unwrap(), 1, "a's slot was freed");
    }

    #[test]
    fn ranges_that_overflow_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let storage = IdMap { host_base: u32::MAX - 200_000, count: 65_536 };
        assert!(Ranges::new(dir.path().join("r"), storage, 4).is_err());
        assert!(Ranges::new(dir.path().join("r"), IdMap::default(), 0).is_err());
    }
}
