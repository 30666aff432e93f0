//! Root disks: raw ext4 images made from a template's root directory (the node copies them
//! per sandbox with `space_storage::reflink`).
//!
//! Templates are stored shifted into the storage id range (uid 100000 is the sandbox's root,
//! see `space_api::IdMap`); a guest must see its files owned by 0... The image is filled by
//! `mkfs.ext4 -d` reading the template through an idmapped mount that maps the storage range
//! to 0.., so ownership is translated by the kernel as mkfs reads it, and modes, symlinks,
//! hard links, device nodes and xattrs are copied as they are.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;

use space_host::idmapped;
use space_runtime::IdMap;

use crate::error::VmError;

/// Makes `image` (which must not exist), a raw ext4 filesystem of `size_bytes` holding the
/// tree at `template_root`, whose ids `storage.host_base..+count` become `0..count`. Root
/// only (idmapped mounts need CAP_SYS_ADMIN). Blocking.
pub fn make_root_image(template_root: &Path, image: &Path, size_bytes: u64, storage: IdMap) -> Result<(), VmError> {
    storage.validate().map_err(|why| VmError::Image(format!("storage id map {storage:?}: {why}")))?;
    let tree = mapped_tree(template_root, storage)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)
        .map_err(VmError::io("create image", image))?;
    let result = file.set_len(size_bytes).map_err(VmError::io("size image", image)).and_then(|()| {
        // mkfs reads the tree through our descriptor of the detached, idmapped mount.
        let source = format!("/proc/{}/fd/{}/", std::process::id(), tree.as_raw_fd());
        let output = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", "space-root", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-d"])
            .arg(&source)
            .arg(image)
            .output()
            .map_err(|e| VmError::Image(format!("run mkfs.ext4: {e}")))?;
        if !output.status.success() {
            return Err(VmError::Image(format!(
                "mkfs.ext4 -d {} ({}): {}",
                template_root.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        file.sync_all().map_err(VmError::io("sync image", image))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(image);
    }
    result
}

/// A detached mount of `root` showing storage ids as 0.. .
fn mapped_tree(root: &Path, storage: IdMap) -> Result<OwnedFd, VmError> {
    let userns = idmapped::mapping_userns(storage.host_base, 0, storage.count)
        .map_err(|e| VmError::Image(format!("id mapping {storage:?} -> 0: {e}")))?;
    idmapped::idmapped_clone(root, &userns)
        .map_err(|e| VmError::Image(format!("idmapped mount of {}: {e}", root.display())))
}
