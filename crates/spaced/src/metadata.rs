//! User-defined file metadata ([`space_proto::file_metadata`]) kept as extended attributes.

use std::fs::File;
use std::io;
use std::path::Path;

use space_proto::FileMetadata;
use space_proto::file_metadata::{MAX_TOTAL, XATTR_PREFIX};
use xattr::FileExt;

/// The metadata of `path` (not following a final symlink). Best effort: an entry that cannot
/// have or show attributes (a file of `/proc`, one removed meanwhile) simply has none, as it
/// must still be listed. Files are the sandbox's to fill with attributes: what is read stops
/// at [`MAX_TOTAL`] bytes, as an upload's metadata does, so no listing grows past that per
/// entry.
pub fn read(path: &Path) -> FileMetadata {
    let Ok(names) = xattr::list(path) else { return FileMetadata::new() };
    let mut metadata = FileMetadata::new();
    let mut left = MAX_TOTAL;
    for name in names {
        let Some(key) = name.to_str().and_then(|n| n.strip_prefix(XATTR_PREFIX)) else { continue };
        let Ok(Some(value)) = xattr::get(path, &name) else { continue };
        let Some(rest) = left.checked_sub(XATTR_PREFIX.len() + key.len() + value.len()) else { break };
        left = rest;
        metadata.insert(key.to_owned(), String::from_utf8_lossy(&value).into_owned());
    }
    metadata
}

/// Sets each key of `metadata` on the open `file`.
pub fn write(file: &File, metadata: &FileMetadata) -> io::Result<()> {
    for (key, value) in metadata {
        file.set_xattr(format!("{XATTR_PREFIX}{key}"), value.as_bytes())?;
    }
    Ok(())
}
