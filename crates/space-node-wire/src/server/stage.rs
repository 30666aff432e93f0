//! Files a control plane sends for a node's template work (an upload, a build's context): a
//! node on another host cannot read them where the control plane keeps them. Each arrives on
//! an upgraded connection, is kept in the node's staging directory under a name of the
//! node's choosing, and is removed when the control plane says so ([`Call::Unstage`]), once
//! it stayed there longer than [`MAX_AGE`] (looked for hourly), or at the node's next start.
//!
//! [`Call::Unstage`]: crate::ops::Call::Unstage

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::Response;
use hyper::upgrade::OnUpgrade;
use sha2::{Digest, Sha256};
use space_node_api::NodeError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Body;
use super::relay::{switching, upgraded};
use crate::ops::{StageAnswer, StageCall};

/// How long the bytes may stop coming before the node gives up on a file.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// A staged file older than this is a leftover (its control plane died before removing it).
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How often leftovers are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// Free space a staged file must leave on the node's disk.
const MARGIN: u64 = 1 << 30;
const PARTIAL: &str = "partial";

/// The node's staging directory.
pub(crate) struct Staging {
    dir: PathBuf,
}

impl Staging {
    /// Makes `dir` (root's, 0700) and empties it: what a stopped node staged, nobody removes.
    /// A `dir` that is anything but a directory (a symbolic link above all) is refused.
    pub(crate) fn open(dir: PathBuf) -> std::io::Result<Staging> {
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if !meta.is_dir() => {
                let message = format!("{} is not a directory: remove it", dir.display());
                return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, message));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
            }
            Err(e) => return Err(e),
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        for entry in std::fs::read_dir(&dir)? {
            remove(&entry?.path());
        }
        Ok(Staging { dir })
    }

    /// Removes the files staged longer than [`MAX_AGE`] ago every [`SWEEP_EVERY`], for as long
    /// as the node serves: those whose control plane died before it removed them.
    pub(crate) fn sweep_old(self: std::sync::Arc<Self>) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                self.remove_old();
            }
        });
    }

    /// Answers `101`, then receives the file on the upgraded connection; a file larger than
    /// the staging directory's free space is refused (507) before any byte is sent.
    pub(super) fn receive(self: std::sync::Arc<Self>, call: StageCall, upgrade: OnUpgrade) -> Response<Body> {
        if let Err(message) = self.room_for(call.len) {
            return super::refuse(hyper::StatusCode::INSUFFICIENT_STORAGE, "out_of_space", message);
        }
        tokio::spawn(async move {
            let Some(mut io) = upgraded(upgrade).await else { return };
            let answer = match self.keep(&mut io, call.len).await {
                Ok((path, sha256)) => StageAnswer::Staged { path, sha256 },
                Err(message) => StageAnswer::Failed { message },
            };
            let mut line = serde_json::to_vec(&answer).unwrap_or_default();
            line.push(b'\n');
            let _ = io.write_all(&line).await;
            let _ = io.shutdown().await;
        });
        switching()
    }

    /// Writes the next `len` bytes of `io` into a new file; its path and the bytes' sha256.
    async fn keep(&self, io: &mut (impl AsyncReadExt + Unpin), len: u64) -> Result<(PathBuf, String), String> {
        let name = hex::encode(rand::random::<[u8; 12]>());
        let partial = self.dir.join(format!("{name}.{PARTIAL}"));
        let written = write(io, len, &partial).await;
        let sha256 = match written {
            Ok(sha256) => sha256,
            Err(e) => {
                remove(&partial);
                return Err(e);
            }
        };
        let path = self.dir.join(name);
        if let Err(e) = tokio::fs::rename(&partial, &path).await {
            remove(&partial);
            return Err(format!("keeping {}: {e}", path.display()));
        }
        Ok((path, sha256))
    }

    /// Removes `path` if it is a file this directory holds; a path anywhere else is refused.
    pub(super) fn unstage(&self, path: &Path) -> Result<(), NodeError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let ours = path.parent() == Some(self.dir.as_path()) && !name.is_empty() && !name.starts_with('.');
        if !ours {
            let message = format!("{} is not a file this node staged", path.display());
            return Err(NodeError::Failed(message.into()));
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(NodeError::Failed(Box::new(e))),
            _ => Ok(()),
        }
    }

    /// Whether `len` more bytes fit the staging directory's file system (keeping a margin).
    fn room_for(&self, len: u64) -> Result<(), String> {
        let stat = nix::sys::statvfs::statvfs(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let free = stat.blocks_available().saturating_mul(stat.fragment_size());
        match free.saturating_sub(MARGIN) >= len {
            true => Ok(()),
            false => Err(format!(
                "the node's disk has {free} bytes free at {}, not enough for a file of {len}: free space there",
                self.dir.display()
            )),
        }
    }

    fn remove_old(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let age = entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
            if age.is_some_and(|age| age > MAX_AGE) {
                remove(&entry.path());
            }
        }
    }
}

/// Copies exactly `len` bytes of `io` into a new file at `path`; their sha256.
async fn write(io: &mut (impl AsyncReadExt + Unpin), len: u64, path: &Path) -> Result<String, String> {
    let failed = |e: std::io::Error| format!("writing {}: {e}", path.display());
    // Never an existing file, never through a link: the name is fresh and random.
    let mut file =
        tokio::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).await.map_err(failed)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 << 10];
    let mut left = len;
    while left > 0 {
        let want = buffer.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let read = match tokio::time::timeout(READ_TIMEOUT, io.read(&mut buffer[..want])).await {
            Ok(Ok(0)) => return Err(format!("the connection ended {left} bytes short of the file's {len}")),
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return Err(format!("receiving the file: {e}")),
            Err(_) => return Err(format!("no bytes came for {} s", READ_TIMEOUT.as_secs())),
        };
        hasher.update(&buffer[..read]);
        file.write_all(&buffer[..read]).await.map_err(failed)?;
        left -= read as u64;
    }
    file.flush().await.map_err(failed)?;
    Ok(hex::encode(hasher.finalize()))
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a staged file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_cut_short_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::open(dir.path().join("staged")).unwrap();
        let mut short: &[u8] = b"12345";
        let err = staging.keep(&mut short, 10).await.unwrap_err();
        assert!(err.contains("5 bytes short of the file's 10"), "{err}");
        assert_eq!(std::fs::read_dir(&staging.dir).unwrap().count(), 0);

        let mut whole: &[u8] = b"0123456789 and more";
        let (path, sha256) = staging.keep(&mut whole, 10).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
        assert_eq!(sha256, hex::encode(Sha256::digest(b"0123456789")));
        assert_eq!(whole, b" and more", "no byte past the file's length is read");
    }

    #[test]
    fn only_a_file_of_the_staging_dir_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::open(dir.path().join("staged")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        for path in
            [outside.clone(), staging.dir.join("../outside"), staging.dir.clone(), PathBuf::from("/etc/hostname")]
        {
            assert!(staging.unstage(&path).is_err(), "{}", path.display());
        }
        assert!(outside.exists());
        let inside = staging.dir.join("abc");
        std::fs::write(&inside, "x").unwrap();
        staging.unstage(&inside).unwrap();
        assert!(!inside.exists());
        staging.unstage(&inside).unwrap();
    }

    #[test]
    fn a_file_larger_than_the_free_space_is_refused_and_a_link_is_no_staging_dir() {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::open(dir.path().join("staged")).unwrap();
        assert!(staging.room_for(1).is_ok());
        let err = staging.room_for(u64::MAX / 2).unwrap_err();
        assert!(err.contains("not enough for a file of"), "{err}");

        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("kept"), "x").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("link")).unwrap();
        let Err(err) = Staging::open(dir.path().join("link")) else { panic!("a link was taken") };
        assert!(err.to_string().contains("is not a directory"), "{err}");
        assert!(elsewhere.join("kept").exists(), "nothing behind the link was removed");
    }

    #[test]
    fn a_start_empties_the_staging_dir_and_keeps_it_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("staged");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("left"), "x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Staging::open(path.clone()).unwrap();
        assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
    }
}
