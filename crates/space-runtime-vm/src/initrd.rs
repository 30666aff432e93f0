//! The guest's initramfs: the cached `initrd.cpio` (kernel modules, busybox, /init) followed
//! by a second newc archive holding `/spaced`. Linux unpacks concatenated archives in order,
//! so the agent is the node's own binary without rebuilding the cached archive.

use std::io::{self, Write};
use std::path::Path;

/// newc member modes.
const S_IFREG: u32 = 0o100_000;

/// Writes `base` followed by an archive with the file `/spaced` (mode 0755, root's) holding
/// `spaced`'s contents to `out`, through a temporary file renamed into place: VMs already
/// running keep the file they were started with.
pub(crate) fn build(base: &Path, spaced: &Path, out: &Path) -> io::Result<()> {
    let mut bytes = std::fs::read(base)?;
    // The kernel looks for the next archive's magic only at 4-byte aligned offsets.
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    let agent = std::fs::read(spaced)?;
    append_file(&mut bytes, "spaced", S_IFREG | 0o755, &agent)?;
    append_trailer(&mut bytes)?;
    let tmp = out.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, out)
}

fn append_file(out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
    let size = u32::try_from(data.len()).map_err(|_| io::Error::other("file too large for newc"))?;
    header(out, 1, mode, 1, size, name)?;
    out.extend_from_slice(data);
    pad4(out);
    Ok(())
}

fn append_trailer(out: &mut Vec<u8>) -> io::Result<()> {
    header(out, 0, 0, 1, 0, "TRAILER!!!")
}

/// One newc header plus the name, padded: "070701" and thirteen 8-digit hex fields.
fn header(out: &mut Vec<u8>, ino: u32, mode: u32, nlink: u32, size: u32, name: &str) -> io::Result<()> {
    let namesize = u32::try_from(name.len() + 1).map_err(|_| io::Error::other("name too long"))?;
    let fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, namesize, 0];
    write!(out, "070701")?;
    for field in fields {
        write!(out, "{field:08x}")?;
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    Ok(())
}

fn pad4(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(4), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cpio -t` (GNU cpio reads the first archive only): the appended archive alone lists.
    #[test]
    fn appended_archive_is_valid_newc() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("base"), b"abc").unwrap();
        std::fs::write(dir.path().join("agent"), b"#!/bin/true\n").unwrap();
        let out = dir.path().join("initrd");
        build(&dir.path().join("base"), &dir.path().join("agent"), &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..4], b"abc\0", "the base is padded to 4 bytes");
        assert_eq!(&bytes[4..10], b"070701");
        std::fs::write(dir.path().join("second.cpio"), &bytes[4..]).unwrap();
        let listed = std::process::Command::new("cpio")
            .args(["-itv", "-F"])
            .arg(dir.path().join("second.cpio"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
        assert!(text.contains("-rwxr-xr-x") && text.trim_end().ends_with("spaced"), "{text}");
    }
}
