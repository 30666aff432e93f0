//! A full snapshot's process images at rest on its node. The checkpoint writes them in clear
//! into a directory in memory (a tmpfs, outside the node's disk), they are encrypted file by
//! file with the snapshot's data key into the pool's images directory, and a restore
//! decrypts them into memory again (docs/byok.md, "Snapshots on a node's disk"). So a
//! process's memory never reaches the node's disk in clear, and a snapshot whose tenant key
//! is revoked cannot be restored there either.
//!
//! The encrypted files are space-keys' chunked stream format, the same as in the blob store:
//! an export uploads them as they are, and an import keeps them as they come.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::snapshot::{IMAGE_MODE, io, plain_files};
use crate::{Result, SnapshotKey, VolumeError};

/// Encrypts every file of `plain` (a checkpoint's directory) into `images`, which is created
/// and must not exist yet; each file keeps its name.
pub fn seal_images(key: &SnapshotKey, plain: &Path, images: &Path) -> Result<()> {
    each_image(plain, images, |src, dst| space_keys::stream::encrypt_file(key.bytes(), src, dst))
}

/// Decrypts every file of `images` (sealed by [`seal_images`], or imported encrypted) into
/// `plain`, which is created and must not exist yet. A file that does not open whole with
/// `key` is [`space_keys::KeyError::Corrupt`].
pub fn unseal_images(key: &SnapshotKey, images: &Path, plain: &Path) -> Result<()> {
    each_image(images, plain, |src, dst| space_keys::stream::decrypt_file(key.bytes(), src, dst, false))
}

/// Makes `to` (which must not exist yet) and writes into it, with `write`, a file of each
/// name in `from`, with the mode CRIU gives its own images: restored tasks read them from
/// inside the sandbox's user namespace.
fn each_image(
    from: &Path,
    to: &Path,
    write: impl Fn(&Path, &Path) -> std::result::Result<(), space_keys::KeyError>,
) -> Result<()> {
    std::fs::create_dir(to).map_err(|e| io(to, e))?;
    for name in plain_files(from)? {
        let dst = to.join(&name);
        write(&from.join(&name), &dst)?;
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(IMAGE_MODE)).map_err(|e| io(&dst, e))?;
    }
    Ok(())
}

/// Whether the images in `images` are encrypted (a snapshot taken before images were sealed
/// has them in clear). Every file must agree.
pub fn images_sealed(images: &Path) -> Result<bool> {
    let mut sealed = None;
    for name in plain_files(images)? {
        let path = images.join(&name);
        let this = space_keys::stream::is_sealed(&path).map_err(|e| io(&path, e))?;
        if sealed.is_some_and(|before| before != this) {
            return Err(VolumeError::NotPlain { path, reason: "encrypted and clear images side by side" });
        }
        sealed = Some(this);
    }
    Ok(sealed.unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SnapshotKey {
        SnapshotKey::new([byte; 32])
    }

    /// A checkpoint's directory: two images, one holding `marker`.
    fn checkpoint(dir: &Path, marker: &[u8]) -> std::path::PathBuf {
        let plain = dir.join("plain");
        std::fs::create_dir(&plain).unwrap();
        std::fs::write(plain.join("pages-1.img"), [b"memory ".as_slice(), marker].concat()).unwrap();
        std::fs::write(plain.join("core-1.img"), b"registers").unwrap();
        plain
    }

    #[test]
    fn images_are_sealed_without_their_content_and_open_whole_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let plain = checkpoint(dir.path(), b"MARKER-3f9a");
        let images = dir.path().join("images");
        seal_images(&key(1), &plain, &images).unwrap();
        assert!(images_sealed(&images).unwrap());
        assert!(!images_sealed(&plain).unwrap());
        for name in ["pages-1.img", "core-1.img"] {
            let sealed = std::fs::read(images.join(name)).unwrap();
            assert!(!sealed.windows(6).any(|w| w == b"MARKER" || w == b"regist"), "{name} holds its content in clear");
        }
        let back = dir.path().join("back");
        unseal_images(&key(1), &images, &back).unwrap();
        assert_eq!(std::fs::read(back.join("pages-1.img")).unwrap(), b"memory MARKER-3f9a");
        assert_eq!(std::fs::read(back.join("core-1.img")).unwrap(), b"registers");
    }

    #[test]
    fn images_do_not_open_under_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let plain = checkpoint(dir.path(), b"x");
        let images = dir.path().join("images");
        seal_images(&key(1), &plain, &images).unwrap();
        let failed = unseal_images(&key(2), &images, &dir.path().join("back")).unwrap_err();
        assert!(matches!(failed, VolumeError::Key(space_keys::KeyError::Corrupt { .. })), "{failed:?}");
    }

    #[test]
    fn images_half_sealed_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plain = checkpoint(dir.path(), b"x");
        let images = dir.path().join("images");
        seal_images(&key(1), &plain, &images).unwrap();
        std::fs::write(images.join("zz-1.img"), b"in clear").unwrap();
        let failed = images_sealed(&images).unwrap_err();
        assert!(matches!(failed, VolumeError::NotPlain { .. }), "{failed:?}");
    }
}
