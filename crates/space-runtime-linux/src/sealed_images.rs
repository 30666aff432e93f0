//! A checkpoint's images sealed with their snapshot's key as CRIU streams them out
//! ([`space_runtime::SealedImages`]): they are never a file in clear. The format is
//! `space-keys`' stream, the same as images that travel to the blob store, so an export
//! uploads them as they are, and the node opens them for a restore as it opens those.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use space_criu::ImageStore;
use space_runtime::SealedImages;

/// The mode CRIU gives its own images.
const IMAGE_MODE: u32 = 0o644;

pub(crate) struct SealedStore(pub(crate) SealedImages);

impl ImageStore for SealedStore {
    fn put(&self, name: &str, from: &mut dyn Read) -> std::io::Result<u64> {
        let path = self.0.dir.join(name);
        let file = File::options().write(true).create_new(true).mode(IMAGE_MODE).open(&path)?;
        space_keys::stream::seal_into(self.0.key.bytes(), from, Path::new(name), file, &path)
            .map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_runtime::SnapshotKey;

    fn store(dir: &Path) -> SealedStore {
        SealedStore(SealedImages { dir: dir.to_owned(), key: SnapshotKey::new([1; 32]) })
    }

    #[test]
    fn images_are_kept_sealed_with_the_snapshots_key() {
        let dir = tempfile::tempdir().unwrap();
        let sealed = store(dir.path());
        let image = [b"memory MARKER-51c2 ".as_slice(), &[9u8; 3 << 20]].concat();
        assert_eq!(sealed.put("pages-1.img", &mut image.as_slice()).unwrap(), image.len() as u64);
        let path = dir.path().join("pages-1.img");
        let on_disk = std::fs::read(&path).unwrap();
        assert!(!on_disk.windows(11).any(|w| w == b"MARKER-51c2"), "the image is on disk in clear");
        let back = dir.path().join("back");
        space_keys::stream::decrypt_file(&[1; 32], &path, &back, false).unwrap();
        assert_eq!(std::fs::read(&back).unwrap(), image);
        let again = sealed.put("pages-1.img", &mut b"x".as_slice()).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists, "an image is never written over");
    }
}
