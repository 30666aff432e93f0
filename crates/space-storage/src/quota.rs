//! btrfs simple quotas ("squota", Linux 6.7+): each data extent is charged to the subvolume
//! that wrote it for as long as the extent exists, wherever it is shared later. A session's
//! roots belong to one level-1 qgroup with the session's limit, so data it deleted but a
//! snapshot still holds keeps counting against it, and replacing its root (restore) does not
//! reset what it used. Full qgroups would account exclusive bytes per snapshot, but they mark
//! themselves inconsistent (needing a whole-filesystem rescan) whenever a snapshot joins a
//! higher-level group, which every sandbox root does here.
//!
//! Structures and request numbers are from `include/uapi/linux/btrfs.h`; usage is read from
//! `/sys/fs/btrfs/<fsid>/qgroups/<level>_<id>/`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::btrfs::open_dir;
use crate::error::{Result, StorageError};

/// `BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA`.
const QUOTA_CTL_ENABLE_SIMPLE: u64 = 4;
/// `BTRFS_QGROUP_LIMIT_MAX_EXCL`.
const LIMIT_MAX_EXCL: u64 = 1 << 1;
/// Level 1 qgroups are `1 << 48 | n`.
const LEVEL_SHIFT: u32 = 48;
const SUBVOLUME_ROOT_INODE: u64 = crate::btrfs::SUBVOLUME_ROOT_INODE;

#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
struct QgroupAssignArgs {
    assign: u64,
    src: u64,
    dst: u64,
}

#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_search_key`.
#[repr(C)]
#[derive(Default)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: [u32; 9],
}

/// `struct btrfs_ioctl_search_args`: the key, then the items found (not read here).
#[repr(C)]
struct SearchArgs {
    key: SearchKey,
    buf: [u8; 3992],
}

/// `BTRFS_ROOT_TREE_OBJECTID` and `BTRFS_ROOT_ITEM_KEY`.
const ROOT_TREE: u64 = 1;
const ROOT_ITEM_KEY: u32 = 132;

/// `struct btrfs_ioctl_fs_info_args` (only the fsid is read).
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 992],
}

const _: () = assert!(std::mem::size_of::<InoLookupArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<FsInfoArgs>() == 1024);
const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);
const _: () = assert!(std::mem::size_of::<SearchKey>() == 104);
const _: () = assert!(std::mem::size_of::<SearchArgs>() == 4096);

mod ioctl {
    use super::{
        FsInfoArgs, InoLookupArgs, QgroupAssignArgs, QgroupCreateArgs, QgroupLimitArgs, QuotaCtlArgs, SearchArgs,
    };
    const MAGIC: u8 = 0x94;
    nix::ioctl_readwrite!(tree_search, MAGIC, 17, SearchArgs);
    nix::ioctl_readwrite!(ino_lookup, MAGIC, 18, InoLookupArgs);
    nix::ioctl_read!(fs_info, MAGIC, 31, FsInfoArgs);
    nix::ioctl_readwrite!(quota_ctl, MAGIC, 40, QuotaCtlArgs);
    nix::ioctl_write_ptr!(qgroup_assign, MAGIC, 41, QgroupAssignArgs);
    nix::ioctl_write_ptr!(qgroup_create, MAGIC, 42, QgroupCreateArgs);
    nix::ioctl_read!(qgroup_limit, MAGIC, 43, QgroupLimitArgs);
}

/// A qgroup id (`level/id` as btrfs prints it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QgroupId(u64);

impl QgroupId {
    /// The level-0 qgroup btrfs keeps for every subvolume.
    pub fn of_subvolume(subvolume_id: u64) -> QgroupId {
        QgroupId(subvolume_id)
    }

    /// A level-1 group; `n` is truncated to 48 bits.
    pub fn level1(n: u64) -> QgroupId {
        QgroupId(1 << LEVEL_SHIFT | (n & ((1 << LEVEL_SHIFT) - 1)))
    }

    fn level_and_id(self) -> (u64, u64) {
        (self.0 >> LEVEL_SHIFT, self.0 & ((1 << LEVEL_SHIFT) - 1))
    }

    pub fn level(self) -> u64 {
        self.level_and_id().0
    }

    /// The subvolume of a level-0 group.
    pub fn subvolume(self) -> Option<u64> {
        let (level, id) = self.level_and_id();
        (level == 0).then_some(id)
    }

    /// The group sysfs names `<level>_<id>`; `None` for sysfs's other entries.
    fn from_sysfs_name(name: &str) -> Option<QgroupId> {
        let (level, id) = name.split_once('_')?;
        let (level, id) = (level.parse::<u64>().ok()?, id.parse::<u64>().ok()?);
        (level < 1 << (64 - LEVEL_SHIFT) && id < 1 << LEVEL_SHIFT).then_some(QgroupId(level << LEVEL_SHIFT | id))
    }

    fn sysfs_name(self) -> String {
        let (level, id) = self.level_and_id();
        format!("{level}_{id}")
    }
}

impl std::fmt::Display for QgroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (level, id) = self.level_and_id();
        write!(f, "{level}/{id}")
    }
}

/// How quotas are set on a btrfs filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaMode {
    Disabled,
    Simple,
    /// Full qgroups: set by someone else; this crate does not use them (see the module doc).
    Full,
}

/// The quota side of one btrfs filesystem.
#[derive(Debug)]
pub struct Quotas {
    root: PathBuf,
    /// The filesystem's root directory, open for the ioctls.
    dir: File,
    sysfs: PathBuf,
}

/// The fsid of the btrfs filesystem `dir` is on, as sysfs names it.
fn fsid(dir: &File, path: &Path) -> Result<String> {
    let mut args = FsInfoArgs { max_id: 0, num_devices: 0, fsid: [0; 16], rest: [0; 992] };
    // SAFETY: `dir` is an open fd for the call and `args` is a zeroed `btrfs_ioctl_fs_info_args`
    // of the kernel's size (checked above), which the kernel fills in.
    unsafe { ioctl::fs_info(dir.as_raw_fd(), &mut args) }.map_err(|e| StorageError::btrfs("fs info", path, e))?;
    Ok(hyphenated(&args.fsid))
}

/// `8-4-4-4-12` lower-case hex, as sysfs names filesystems.
fn hyphenated(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The id of the subvolume whose root directory is `path`.
pub fn subvolume_id(path: &Path) -> Result<u64> {
    let dir = open_dir(path)?;
    let mut args = InoLookupArgs { treeid: 0, objectid: SUBVOLUME_ROOT_INODE, name: [0; 4080] };
    // SAFETY: `dir` is an open fd for the call; `args` is a `btrfs_ioctl_ino_lookup_args` of the
    // kernel's size (checked above). With treeid 0 the kernel looks up `dir`'s own subvolume and
    // writes its id back into `treeid`.
    unsafe { ioctl::ino_lookup(dir.as_raw_fd(), &mut args) }
        .map_err(|e| StorageError::btrfs("subvolume id", path, e))?;
    Ok(args.treeid)
}

impl Quotas {
    /// The quota state of the btrfs filesystem mounted at `root`.
    pub fn of(root: &Path) -> Result<Quotas> {
        let dir = open_dir(root)?;
        let sysfs = Path::new("/sys/fs/btrfs").join(fsid(&dir, root)?);
        Ok(Quotas { root: root.to_path_buf(), dir, sysfs })
    }

    pub fn mode(&self) -> Result<QuotaMode> {
        let path = self.sysfs.join("qgroups/mode");
        match std::fs::read_to_string(&path) {
            Ok(mode) if mode.trim() == "squota" => Ok(QuotaMode::Simple),
            Ok(_) => Ok(QuotaMode::Full),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(QuotaMode::Disabled),
            Err(e) => Err(StorageError::io("read", path, e)),
        }
    }

    /// Turns on simple quotas. Extents written before are charged to no one.
    pub fn enable_simple(&self) -> Result<()> {
        let dir = &self.dir;
        let mut args = QuotaCtlArgs { cmd: QUOTA_CTL_ENABLE_SIMPLE, status: 0 };
        // SAFETY: `dir` is an open fd for the call and `args` is a `btrfs_ioctl_quota_ctl_args`.
        unsafe { ioctl::quota_ctl(dir.as_raw_fd(), &mut args) }
            .map_err(|e| StorageError::btrfs("enable simple quotas", &self.root, e))?;
        Ok(())
    }

    /// Creates `group` unless it exists.
    pub fn create_group(&self, group: QgroupId) -> Result<()> {
        let dir = &self.dir;
        let args = QgroupCreateArgs { create: 1, qgroupid: group.0 };
        // SAFETY: `dir` is an open fd for the call; the kernel only reads `args`.
        match unsafe { ioctl::qgroup_create(dir.as_raw_fd(), &args) } {
            Ok(_) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(StorageError::btrfs("qgroup create", &self.root, e)),
        }
    }

    /// Whether subvolume `id` has a root item: it exists, or was deleted and the kernel's
    /// cleaner has not dropped it yet.
    pub fn subvolume_exists(&self, id: u64) -> Result<bool> {
        let key = SearchKey {
            tree_id: ROOT_TREE,
            min_objectid: id,
            max_objectid: id,
            max_offset: u64::MAX,
            max_transid: u64::MAX,
            min_type: ROOT_ITEM_KEY,
            max_type: ROOT_ITEM_KEY,
            nr_items: 1,
            ..SearchKey::default()
        };
        let mut args = SearchArgs { key, buf: [0; 3992] };
        // SAFETY: `self.dir` is an open fd for the call; `args` is a `btrfs_ioctl_search_args`
        // of the kernel's size (checked above): the kernel writes at most `buf`'s length of
        // items and the number it found into `key.nr_items`.
        unsafe { ioctl::tree_search(self.dir.as_raw_fd(), &mut args) }
            .map_err(|e| StorageError::btrfs("search the root tree", &self.root, e))?;
        Ok(args.key.nr_items > 0)
    }

    /// Removes `group` if the kernel lets it, and says whether it did. The kernel refuses
    /// (`EBUSY`) a group with members and a level-0 group still charged for data; whether it
    /// refuses the group of a live subvolume charged for nothing (one whose data predates
    /// simple quotas) depends on the kernel's version, so callers check that first
    /// ([`Quotas::subvolume_exists`]).
    pub fn destroy_group(&self, group: QgroupId) -> Result<bool> {
        let dir = &self.dir;
        let args = QgroupCreateArgs { create: 0, qgroupid: group.0 };
        // SAFETY: `dir` is an open fd for the call; the kernel only reads `args`.
        match unsafe { ioctl::qgroup_create(dir.as_raw_fd(), &args) } {
            Ok(_) => Ok(true),
            Err(Errno::EBUSY | Errno::ENOENT) => Ok(false),
            Err(e) => Err(StorageError::btrfs("qgroup destroy", &self.root, e)),
        }
    }

    /// Every qgroup of the filesystem.
    pub fn groups(&self) -> Result<Vec<QgroupId>> {
        let dir = self.sysfs.join("qgroups");
        let mut groups = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| StorageError::io("read directory", &dir, e))? {
            let entry = entry.map_err(|e| StorageError::io("read directory", &dir, e))?;
            groups.extend(entry.file_name().to_str().and_then(QgroupId::from_sysfs_name));
        }
        Ok(groups)
    }

    /// Makes `child` a member of `parent` (already a member is fine).
    pub fn assign(&self, child: QgroupId, parent: QgroupId) -> Result<()> {
        let dir = &self.dir;
        let args = QgroupAssignArgs { assign: 1, src: child.0, dst: parent.0 };
        // SAFETY: `dir` is an open fd for the call; the kernel only reads `args`. A positive
        // return only asks for a rescan, which simple quotas never need.
        match unsafe { ioctl::qgroup_assign(dir.as_raw_fd(), &args) } {
            Ok(_) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(StorageError::btrfs("qgroup assign", &self.root, e)),
        }
    }

    /// Limits what `group` may be charged for; `None` removes the limit.
    pub fn limit(&self, group: QgroupId, max_bytes: Option<u64>) -> Result<()> {
        let dir = &self.dir;
        let lim = QgroupLimit {
            flags: LIMIT_MAX_EXCL,
            max_rfer: 0,
            max_excl: max_bytes.unwrap_or(u64::MAX),
            rsv_rfer: 0,
            rsv_excl: 0,
        };
        let mut args = QgroupLimitArgs { qgroupid: group.0, lim };
        // SAFETY: `dir` is an open fd for the call; `args` is a `btrfs_ioctl_qgroup_limit_args`
        // (size checked above) that the kernel only reads despite the ioctl's direction bits.
        unsafe { ioctl::qgroup_limit(dir.as_raw_fd(), &mut args) }
            .map_err(|e| StorageError::btrfs("qgroup limit", &self.root, e))?;
        Ok(())
    }

    /// Bytes `group` is charged for, as of the last transaction commit; `None` if it does not
    /// exist.
    pub fn usage(&self, group: QgroupId) -> Result<Option<u64>> {
        read_number(&self.sysfs.join("qgroups").join(group.sysfs_name()).join("exclusive"))
    }
}

fn read_number(path: &Path) -> Result<Option<u64>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            text.trim().parse().map(Some).map_err(|_| {
                StorageError::io("parse", path, std::io::Error::new(std::io::ErrorKind::InvalidData, text))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io("read", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_names_parse_back_and_other_entries_do_not() {
        for group in [QgroupId::of_subvolume(256), QgroupId::level1(0xabcdef), QgroupId::level1(u64::MAX)] {
            assert_eq!(QgroupId::from_sysfs_name(&group.sysfs_name()), Some(group));
        }
        assert_eq!(QgroupId::level1(7).level(), 1);
        for other in ["mode", "enabled", "drop_subtree_threshold", "0_", "_5", "1_x", "70000_1", "0_281474976710656"] {
            assert_eq!(QgroupId::from_sysfs_name(other), None, "{other}");
        }
    }

    #[test]
    fn qgroup_ids_print_as_btrfs_does() {
        assert_eq!(QgroupId::of_subvolume(257).to_string(), "0/257");
        assert_eq!(QgroupId::level1(9).to_string(), "1/9");
        assert_eq!(QgroupId::level1(u64::MAX).sysfs_name(), format!("1_{}", (1u64 << 48) - 1));
    }

    #[test]
    fn fsids_are_hyphenated() {
        let id = [0x63, 0x9d, 0x82, 0x95, 0xc4, 0x68, 0x45, 0x00, 0xa9, 0x21, 0x40, 0xb2, 0x1e, 0x68, 0xf4, 0x64];
        assert_eq!(hyphenated(&id), "639d8295-c468-4500-a921-40b21e68f464");
    }

    #[test]
    fn request_numbers_match_the_kernel() {
        // From btrfs.h: _IOWR(0x94, 40, 16 bytes) and _IOR(0x94, 43, 48 bytes).
        assert_eq!(nix::request_code_readwrite!(0x94, 40, 16), 0xc010_9428);
        assert_eq!(nix::request_code_read!(0x94, 43, std::mem::size_of::<QgroupLimitArgs>()), 0x8030_942b);
    }
}
