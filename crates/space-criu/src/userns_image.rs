//! A restore in another host id range than the dump's: CRIU creates the restored user
//! namespace with the map in the image (`userns-<id>.img`), so a restore that gives the new
//! sandbox its own range restores from a view of the images directory in which that one image
//! is rewritten (the images themselves are shared by every fork of a snapshot and must not
//! change).
//!
//! An image file is CRIU's two magic numbers, then each entry as a little-endian `u32` length
//! and a protobuf message; `UsernsEntry` and `UidGidExtent` are from CRIU's
//! `images/userns.proto`, with the same field numbers.

use std::path::Path;

use prost::Message;

use crate::error::{CriuError, Result, io_err};

/// `uid_gid_extent`.
#[derive(Clone, PartialEq, prost::Message)]
struct UidGidExtent {
    #[prost(uint32, required, tag = "1")]
    first: u32,
    #[prost(uint32, required, tag = "2")]
    lower_first: u32,
    #[prost(uint32, required, tag = "3")]
    count: u32,
}

/// `userns_entry`.
#[derive(Clone, PartialEq, prost::Message)]
struct UsernsEntry {
    #[prost(message, repeated, tag = "1")]
    uid_map: Vec<UidGidExtent>,
    #[prost(message, repeated, tag = "2")]
    gid_map: Vec<UidGidExtent>,
}

const MAGICS_LEN: usize = 8;

fn bad(what: impl std::fmt::Display) -> CriuError {
    CriuError::Restored(format!("user namespace image: {what}"))
}

/// The image `bytes` with every map moved to start at `(uid, gid)`. A sandbox's map is one
/// extent from id 0; anything else is refused (sandboxes cannot make nested namespaces).
pub(crate) fn remap(bytes: &[u8], (uid, gid): (u32, u32)) -> Result<Vec<u8>> {
    let (magics, rest) = bytes.split_at_checked(MAGICS_LEN).ok_or_else(|| bad("shorter than its header"))?;
    let (len, body) = rest.split_at_checked(4).ok_or_else(|| bad("no entry"))?;
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if body.len() != len {
        return Err(bad(format!("one entry of {len} bytes expected, {} bytes follow", body.len())));
    }
    let mut entry = UsernsEntry::decode(body).map_err(bad)?;
    for (map, base) in [(&mut entry.uid_map, uid), (&mut entry.gid_map, gid)] {
        match map.as_mut_slice() {
            [only] if only.first == 0 => only.lower_first = base,
            other => return Err(bad(format!("a sandbox's map is one extent from 0, not {other:?}"))),
        }
    }
    let encoded = entry.encode_to_vec();
    let mut out = Vec::with_capacity(MAGICS_LEN + 4 + encoded.len());
    out.extend_from_slice(magics);
    out.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    out.extend_from_slice(&encoded);
    Ok(out)
}

fn is_userns_image(name: &str) -> bool {
    name.starts_with("userns-") && name.ends_with(".img")
}

/// The one user namespace image in `images` (a sandbox makes no nested namespaces).
fn userns_image(images: &Path) -> Result<std::ffi::OsString> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(images).map_err(io_err("read", images))? {
        let name = entry.map_err(io_err("read", images))?.file_name();
        if name.to_str().is_some_and(is_userns_image) {
            found.push(name);
        }
    }
    match <[_; 1]>::try_from(found) {
        Ok([name]) => Ok(name),
        Err(found) => Err(bad(format!("{} holds {} user namespace images, not 1", images.display(), found.len()))),
    }
}

/// `images` as a restore reads it: bound at `view` (an empty directory), with the user
/// namespace's image rewritten for a sandbox root of host ids `root` (written to `rewritten`)
/// bound over its place. Binds, not copies or symlinks: the restored tasks open images through
/// the directory CRIU has open, as sandbox ids, and may not search the host's directories
/// above it. [`Remapped`] detaches both when dropped.
pub(crate) fn remapped(images: &Path, view: &Path, rewritten: &Path, root: (u32, u32)) -> Result<Remapped> {
    let name = userns_image(images)?;
    let original = images.join(&name);
    let bytes = std::fs::read(&original).map_err(io_err("read", &original))?;
    std::fs::write(rewritten, remap(&bytes, root)?).map_err(io_err("write", rewritten))?;
    bind(images, view)?;
    let bound = Remapped(view.to_path_buf());
    bind(rewritten, &view.join(&name))?;
    Ok(bound)
}

fn bind(from: &Path, to: &Path) -> Result<()> {
    nix::mount::mount(Some(from), to, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| io_err("bind images at", to)(e.into()))
}

/// The bound view of [`remapped`], detached (with the rewritten image on it) when dropped.
pub(crate) struct Remapped(std::path::PathBuf);

impl Drop for Remapped {
    fn drop(&mut self) {
        if let Err(e) = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.0.display(), error = %e, "cannot detach a restore's view of its images");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `userns-13.img` of a dump whose root was host 300000 (65536 ids), as CRIU 4.2.1 wrote it.
    const DUMPED: &[u8] = &[
        0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55, 0x18, 0, 0, 0, 0x0a, 0x0a, 0x08, 0x00, 0x10, 0xe0, 0xa7, 0x12,
        0x18, 0x80, 0x80, 0x04, 0x12, 0x0a, 0x08, 0x00, 0x10, 0xe0, 0xa7, 0x12, 0x18, 0x80, 0x80, 0x04,
    ];

    #[test]
    fn the_map_moves_to_the_new_range() {
        let out = remap(DUMPED, (400_000, 400_001)).unwrap();
        assert_eq!(&out[..8], &DUMPED[..8], "magics kept");
        let entry = UsernsEntry::decode(&out[12..]).unwrap();
        assert_eq!(entry.uid_map, vec![UidGidExtent { first: 0, lower_first: 400_000, count: 65_536 }]);
        assert_eq!(entry.gid_map, vec![UidGidExtent { first: 0, lower_first: 400_001, count: 65_536 }]);
        let back = remap(&out, (300_000, 300_000)).unwrap();
        assert_eq!(back, DUMPED, "the same encoding as CRIU's");
    }

    #[test]
    fn anything_but_one_extent_from_zero_is_refused() {
        let two = UsernsEntry {
            uid_map: vec![UidGidExtent { first: 0, lower_first: 1, count: 1 }; 2],
            gid_map: vec![UidGidExtent { first: 0, lower_first: 1, count: 1 }],
        };
        let body = two.encode_to_vec();
        let mut image = DUMPED[..8].to_vec();
        image.extend_from_slice(&(body.len() as u32).to_le_bytes());
        image.extend_from_slice(&body);
        assert!(remap(&image, (1, 1)).is_err());
        assert!(remap(&DUMPED[..10], (1, 1)).is_err());
    }

    #[test]
    fn the_one_userns_image_is_found() {
        let images = tempfile::tempdir().unwrap();
        std::fs::write(images.path().join("pages-1.img"), "pages").unwrap();
        assert!(userns_image(images.path()).is_err(), "none");
        std::fs::write(images.path().join("userns-13.img"), DUMPED).unwrap();
        assert_eq!(userns_image(images.path()).unwrap(), "userns-13.img");
        std::fs::write(images.path().join("userns-14.img"), DUMPED).unwrap();
        assert!(userns_image(images.path()).is_err(), "two");
    }
}
