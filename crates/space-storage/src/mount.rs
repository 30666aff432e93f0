//! The pool's backing store: a sparse btrfs image loop-mounted at `<data_dir>/pool` when the
//! data dir itself is not btrfs, and mount-table helpers.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MntFlags, umount2};

use crate::cmd;
use crate::error::{IoContext, Result};

/// One line of `/proc/self/mountinfo` (the fields we need).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// Filesystem-specific options (e.g. `rw,ssd,nobarrier,space_cache=v2,…`).
    pub super_options: String,
}

impl MountEntry {
    /// Is `option` among the filesystem's options?
    pub fn has_option(&self, option: &str) -> bool {
        self.super_options.split(',').any(|o| o == option)
    }
}

/// Undoes the octal escapes (`\040` for space, …) of mountinfo paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(u8::is_ascii_digit));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(value as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one mountinfo line: `id parent maj:min root mountpoint opts [optional…] - fstype source superopts`.
pub fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let mut right = right.split(' ');
    let fstype = right.next()?.to_string();
    let source = unescape(right.next().unwrap_or(""));
    let super_options = right.next().unwrap_or("").to_string();
    Some(MountEntry { mount_point: PathBuf::from(unescape(mount_point)), fstype, source, super_options })
}

/// The current mount table of this process's mount namespace.
pub fn mounts() -> Result<Vec<MountEntry>> {
    const PATH: &str = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(PATH).ctx("read", PATH)?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

/// The topmost mount at exactly `path` (absolute, canonical), if any.
pub fn mount_at(path: &Path) -> Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// Lazily unmounts everything mounted at or below `path`, deepest first.
pub fn unmount_tree(path: &Path) -> Result<()> {
    let mut below: Vec<PathBuf> =
        mounts()?.into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(path)).collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    below.dedup();
    for p in below {
        tracing::warn!(path = %p.display(), "unmounting leftover mount");
        detach(&p)?;
    }
    Ok(())
}

/// `umount -l`: detach now, release when no longer busy. Not mounted is not an error.
pub fn detach(path: &Path) -> Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(e).ctx("unmount", path),
    }
}

/// Creates and formats the sparse image at `image` unless it exists. The image only appears
/// under its final name once formatted, so an interrupted run starts over.
pub fn ensure_image(image: &Path, size_bytes: impl FnOnce() -> Result<u64>) -> Result<()> {
    if image.exists() {
        return Ok(());
    }
    let size_bytes = size_bytes()?;
    let tmp = image.with_extension("img.partial");
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).ctx("create pool image", &tmp)?;
    file.set_len(size_bytes).ctx("size pool image", &tmp)?;
    drop(file);
    tracing::info!(image = %image.display(), size_bytes, "formatting btrfs pool image");
    let mut mkfs = Command::new("mkfs.btrfs");
    mkfs.args(["-q", "-K", "-L", "space-pool"]).arg(&tmp);
    cmd::run(&mut mkfs, "check that the data dir's disk has free space")?;
    std::fs::rename(&tmp, image).ctx("rename pool image", image)
}

fn barrier_option(nobarrier: bool) -> &'static str {
    if nobarrier { "nobarrier" } else { "barrier" }
}

/// Loop-mounts `image` at `target`. `-o loop` sets the loop device to auto-clear, so it is
/// released when the filesystem is unmounted.
pub fn mount_image(image: &Path, target: &Path, nobarrier: bool) -> Result<()> {
    tracing::info!(image = %image.display(), target = %target.display(), nobarrier, "mounting pool");
    let options = format!("loop,noatime,{}", barrier_option(nobarrier));
    let mut mount = Command::new("mount");
    mount.args(["-t", "btrfs", "-o", &options]).arg(image).arg(target);
    cmd::run(
        &mut mount,
        "check that the loop module is loaded (`modprobe loop`) and that pool.img is a btrfs image \
         (move it away to start a fresh pool)",
    )?;
    Ok(())
}

/// Switches the btrfs mounted at `target` to `barrier` or `nobarrier`.
pub fn remount_barrier(target: &Path, nobarrier: bool) -> Result<()> {
    tracing::info!(target = %target.display(), nobarrier, "remounting pool");
    let mut mount = Command::new("mount");
    mount.args(["-o", &format!("remount,{}", barrier_option(nobarrier))]).arg(target);
    cmd::run(&mut mount, "")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let line = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/"));
        assert_eq!(m.fstype, "ext4");
        assert_eq!(m.source, "/dev/vda");
        assert!(m.has_option("discard") && !m.has_option("rw,discard"));
        let line = "99 27 0:50 / /tmp/a\\040b/pool rw,noatime shared:5 master:1 - btrfs /dev/loop3 rw";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/tmp/a b/pool"));
        assert_eq!(m.fstype, "btrfs");
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("a\\011b\\134c"), "a\tb\\c");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }
}
