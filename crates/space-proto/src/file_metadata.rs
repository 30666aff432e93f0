//! User-defined file metadata: short printable key/value pairs an upload attaches to a file,
//! kept by the agent as extended attributes named [`XATTR_PREFIX`]`<key>`. The names and
//! limits are E2B envd's, so programs inside a sandbox find the same attributes there as on
//! E2B, and metadata set on E2B's terms fits here.

use std::collections::BTreeMap;

/// Keys and values of one file's metadata.
pub type FileMetadata = BTreeMap<String, String>;

/// The extended attribute namespace metadata lives in; other `user.*` attributes are not
/// metadata.
pub const XATTR_PREFIX: &str = "user.e2b.";

/// Longest key: the kernel's 255-byte attribute name limit less [`XATTR_PREFIX`].
pub const MAX_KEY: usize = 255 - XATTR_PREFIX.len();

/// Most bytes of one file's metadata: keys and values, plus [`XATTR_PREFIX`] once per key
/// (what a filesystem's per-inode attribute space must hold).
pub const MAX_TOTAL: usize = 4096;

/// The health feature of agents that store [`FileMetadata`] on uploads and report it in
/// every file's stat.
pub const FEATURE: &str = "file_metadata";

/// Why `metadata` cannot be stored, if it cannot: an empty or over-long key, a key or value
/// that is not printable US-ASCII (bytes 0x20–0x7E), or too many bytes in all.
pub fn check(metadata: &FileMetadata) -> Result<(), String> {
    let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(format!("a metadata key must be 1 to {MAX_KEY} bytes ({} given)", key.len()));
        }
        if !printable(key) || !printable(value) {
            return Err(format!("metadata {key:?}: keys and values must be printable US-ASCII"));
        }
        total += XATTR_PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_TOTAL {
        return Err(format!(
            "file metadata of {total} bytes exceeds {MAX_TOTAL} (keys, values and {XATTR_PREFIX:?} per key)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str, value: &str) -> FileMetadata {
        FileMetadata::from([(key.to_owned(), value.to_owned())])
    }

    #[test]
    fn keys_and_values_are_bounded_and_printable() {
        assert_eq!(MAX_KEY, 246);
        check(&one("owner", "agent 7 ~")).unwrap();
        check(&one(&"k".repeat(MAX_KEY), "")).unwrap();
        assert!(check(&one("", "v")).unwrap_err().contains("1 to 246"));
        assert!(check(&one(&"k".repeat(MAX_KEY + 1), "v")).is_err());
        for (key, value) in [("a\tb", "v"), ("k", "caf\u{e9}"), ("k", "line\n"), ("k\u{7f}", "v")] {
            assert!(check(&one(key, value)).unwrap_err().contains("printable"), "{key:?} {value:?}");
        }
        // The prefix counts once per key: 4096 exactly fits, one byte more does not.
        let fits = one("k", &"v".repeat(MAX_TOTAL - XATTR_PREFIX.len() - 1));
        check(&fits).unwrap();
        let over = one("k", &"v".repeat(MAX_TOTAL - XATTR_PREFIX.len()));
        assert!(check(&over).unwrap_err().contains("exceeds 4096"));
    }
}
