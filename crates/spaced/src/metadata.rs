//! User-defined file metadata ([`space_proto::file_metadata`]) kept as extended attributes.

use std::fs::File;
use std::io;
use std::path::Path;

use space_proto::FileMetadata;
use space_proto::file_metadata::XATTR_PREFIX;
use xattr::FileExt;

/// The metadata of `path` (not following a final symlink). Best effort: an entry that cannot
/// have or show attributes (a file of `/proc`, one removed meanwhile) simply has none, as it
/// must still be listed.
pub fn read(path: &Path) -> FileMetadata {
    let Ok(names) = xattr::list(path) else { return FileMetadata::new() };
    let mut metadata = FileMetadata::new();
    for name in names {
        let Some(key) = name.to_str().and_then(|n| n.strip_prefix(XATTR_PREFIX)) else { continue };
        if let Ok(Some(value)) = xattr::get(path, &name) {
            metadata.insert(key.to_owned(), String::from_utf8_lossy(&value).into_owned());
        }
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
