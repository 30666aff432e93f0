//! File operations. Paths are interpreted inside the sandbox root (spaced runs after
//! pivot_root); relative paths are relative to "/". Nothing here blocks the runtime:
//! metadata operations run on the blocking pool, contents stream in 64 KiB chunks.

use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use space_proto::{DataChannel, ErrorKind, ExecInput, FileKind, FileMetadata, FileStat, Frame, FramedStream, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{invalid, io_reply};
use crate::fdio::CHUNK;
use crate::wire;

/// Mode of written files when the request gives none.
const DEFAULT_MODE: u32 = 0o644;

/// A request path as an absolute path. Only emptiness and NUL bytes are rejected: inside
/// the sandbox every path, `..` included, stays within its root.
pub fn resolve(path: &str) -> Result<PathBuf, Reply> {
    if path.is_empty() {
        return Err(invalid("empty path"));
    }
    if path.contains('\0') {
        return Err(invalid("path contains a NUL byte"));
    }
    Ok(Path::new("/").join(path))
}

/// Whether `path` names the root directory, lexically or after resolving symlinks.
fn is_root(path: &Path) -> bool {
    let mut depth = 0usize;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth = depth.saturating_sub(1),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    depth == 0 || fs::canonicalize(path).is_ok_and(|p| p == Path::new("/"))
}

/// Runs a blocking file operation on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Reply> + Send + 'static) -> Result<T, Reply> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(Reply::error(ErrorKind::Other, e.to_string())))
}

fn on(path: &Path) -> impl Fn(io::Error) -> Reply + '_ {
    move |e| io_reply(&path.display().to_string(), &e)
}

pub fn file_stat(path: &Path, meta: &Metadata) -> FileStat {
    let file_type = meta.file_type();
    let kind = if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let symlink_target = match kind {
        FileKind::Symlink => fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned()),
        _ => None,
    };
    FileStat {
        name: path.file_name().map_or_else(|| "/".into(), |n| n.to_string_lossy().into_owned()),
        path: path.to_string_lossy().into_owned(),
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        modified_ms: meta.mtime().saturating_mul(1000).saturating_add(meta.mtime_nsec() / 1_000_000),
        symlink_target,
        metadata: crate::metadata::read(path),
    }
}

/// `Request::Stat` (does not follow a final symlink).
pub async fn stat(path: String) -> Reply {
    let result = blocking(move || {
        let path = resolve(&path)?;
        let meta = fs::symlink_metadata(&path).map_err(on(&path))?;
        Ok(Reply::Stat { stat: Box::new(file_stat(&path, &meta)) })
    });
    result.await.unwrap_or_else(|e| e)
}

/// `Request::ListDir`: entries sorted by name; entries that vanish meanwhile are skipped.
pub async fn list_dir(path: String) -> Reply {
    let result = blocking(move || {
        let path = resolve(&path)?;
        let mut entries = Vec::new();
        for entry in fs::read_dir(&path).map_err(on(&path))? {
            let entry_path = entry.map_err(on(&path))?.path();
            match fs::symlink_metadata(&entry_path) {
                Ok(meta) => entries.push(file_stat(&entry_path, &meta)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(on(&entry_path)(e)),
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Reply::Entries { entries })
    });
    result.await.unwrap_or_else(|e| e)
}

/// `Request::MakeDir`: like `mkdir -p`.
pub async fn make_dir(path: String) -> Reply {
    let result = blocking(move || {
        let path = resolve(&path)?;
        fs::create_dir_all(&path).map_err(on(&path))?;
        Ok(Reply::Ok)
    });
    result.await.unwrap_or_else(|e| e)
}

/// `Request::Remove`. Refuses the root; a non-empty directory needs `recursive`.
pub async fn remove(path: String, recursive: bool) -> Reply {
    let result = blocking(move || {
        let path = resolve(&path)?;
        if is_root(&path) {
            return Err(invalid("refusing to remove /"));
        }
        let meta = fs::symlink_metadata(&path).map_err(on(&path))?;
        let removed = match (meta.is_dir(), recursive) {
            (true, true) => fs::remove_dir_all(&path),
            (true, false) => fs::remove_dir(&path),
            (false, _) => fs::remove_file(&path),
        };
        removed.map_err(on(&path))?;
        Ok(Reply::Ok)
    });
    result.await.unwrap_or_else(|e| e)
}

/// `Request::Move`: rename, falling back to copy + remove across filesystems.
pub async fn move_path(from: String, to: String) -> Reply {
    let result = blocking(move || {
        let (from, to) = (resolve(&from)?, resolve(&to)?);
        if is_root(&from) {
            return Err(invalid("refusing to move /"));
        }
        match fs::rename(&from, &to) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                copy_tree(&from, &to).map_err(on(&to))?;
                remove_tree(&from).map_err(on(&from))?;
            }
            other => other.map_err(on(&from))?,
        }
        Ok(Reply::Ok)
    });
    result.await.unwrap_or_else(|e| e)
}

fn remove_tree(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) }
}

/// Copies files, directories and symlinks (with permissions); other file types are an error.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)
    } else if file_type.is_file() {
        fs::copy(from, to).map(|_| ())
    } else if file_type.is_dir() {
        fs::create_dir(to)?;
        for entry in fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        fs::set_permissions(to, meta.permissions())
    } else {
        Err(io::Error::from_raw_os_error(libc::ENOTSUP))
    }
}

/// `Request::ReadFile`: `FileStart{size}`, `Data(File)` chunks, `Done{bytes}`.
pub async fn read_file(mut stream: FramedStream, path: String) {
    let opened = blocking(move || {
        let path = resolve(&path)?;
        // O_NONBLOCK: opening a FIFO must not hang; it has no effect on regular files.
        let file = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).map_err(on(&path))?;
        let meta = file.metadata().map_err(on(&path))?;
        if meta.is_dir() {
            return Err(io_reply(&path.display().to_string(), &io::Error::from_raw_os_error(libc::EISDIR)));
        }
        if !meta.is_file() {
            return Err(invalid(format!("{}: not a regular file", path.display())));
        }
        Ok((file, meta.len(), path))
    });
    let (file, size, path) = match opened.await {
        Ok(opened) => opened,
        Err(reply) => return wire::finish(stream, reply).await,
    };
    if wire::send(&mut stream, &Reply::FileStart { size }).await.is_err() {
        return;
    }
    // Never more than announced: the client relies on the size (e.g. Content-Length).
    let mut file = tokio::fs::File::from_std(file).take(size);
    let mut buf = vec![0u8; CHUNK];
    let mut bytes = 0u64;
    loop {
        let n = match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return wire::finish(stream, io_reply(&path.display().to_string(), &e)).await,
        };
        let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
        if wire::send_data(&mut stream, DataChannel::File, chunk).await.is_err() {
            return; // the client went away
        }
        bytes += n as u64;
    }
    wire::finish(stream, Reply::Done { bytes }).await;
}

/// Removes the temporary file of an upload unless it was renamed into place.
struct TempFile {
    path: Option<PathBuf>,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// A fresh temporary file next to `target`, so the final rename stays on one filesystem,
/// with its mode and metadata set.
fn create_temp(target: &Path, mode: u32, metadata: &FileMetadata) -> Result<(File, TempFile), Reply> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let parent = target.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(parent).map_err(on(parent))?;
    if fs::metadata(target).is_ok_and(|m| m.is_dir()) {
        return Err(io_reply(&target.display().to_string(), &io::Error::from_raw_os_error(libc::EISDIR)));
    }
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = parent.join(format!("{}{}-{n}.tmp", space_proto::UPLOAD_TEMP_PREFIX, std::process::id()));
        match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp) {
            Ok(file) => {
                let guard = TempFile { path: Some(tmp) };
                // Explicitly, because the umask would strip bits from the create mode.
                file.set_permissions(fs::Permissions::from_mode(mode)).map_err(on(target))?;
                crate::metadata::write(&file, metadata).map_err(|e| metadata_error(target, &e))?;
                return Ok((file, guard));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(on(parent)(e)),
        }
    }
}

/// Why metadata could not be set on `target`'s new file: mostly a filesystem without user
/// extended attributes (`ENOTSUP`: `/proc`, tmpfs before Linux 6.6).
fn metadata_error(target: &Path, e: &io::Error) -> Reply {
    io_reply(&format!("file metadata on {}", target.display()), e)
}

/// `Request::WriteFile`: `Data(File)` chunks then `ExecInput::Eof`; `Done{bytes}`.
/// The data goes to a temporary file renamed over the target on success, so a failed or
/// abandoned upload never leaves a half-written file.
pub async fn write_file(mut stream: FramedStream, path: String, mode: Option<u32>, metadata: FileMetadata) {
    let mode = mode.unwrap_or(DEFAULT_MODE) & 0o7777;
    let created = blocking(move || {
        let target = resolve(&path)?;
        space_proto::file_metadata::check(&metadata).map_err(invalid)?;
        let (file, temp) = create_temp(&target, mode, &metadata)?;
        Ok((file, temp, target))
    });
    let (file, mut temp, target) = match created.await {
        Ok(created) => created,
        Err(reply) => return wire::finish(stream, reply).await,
    };
    let mut file = tokio::fs::File::from_std(file);
    let bytes = match receive(&mut stream, &mut file, &target).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return, // the client went away: the guard removes the temp file
        Err(reply) => return wire::finish(stream, reply).await,
    };
    drop(file);
    let Some(tmp) = temp.path.clone() else { return };
    let renamed = blocking(move || fs::rename(&tmp, &target).map_err(on(&target)));
    match renamed.await {
        Ok(()) => {
            temp.path = None;
            wire::finish(stream, Reply::Done { bytes }).await;
        }
        Err(reply) => wire::finish(stream, reply).await,
    }
}

/// Copies the upload into `file`; `Ok(None)` if the stream ended before `Eof`.
async fn receive(stream: &mut FramedStream, file: &mut tokio::fs::File, target: &Path) -> Result<Option<u64>, Reply> {
    let write_error = |e: io::Error| io_reply(&target.display().to_string(), &e);
    let mut bytes = 0u64;
    loop {
        let frame = match stream.next().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(invalid(e.to_string())),
            Some(Ok(frame)) => frame,
        };
        match frame {
            Frame::Data(DataChannel::File, data) => {
                file.write_all(&data).await.map_err(write_error)?;
                bytes += data.len() as u64;
            }
            Frame::Data(channel, _) => {
                return Err(invalid(format!("unexpected {channel:?} data in an upload")));
            }
            Frame::Message(_) => match frame.parse::<ExecInput>() {
                Ok(ExecInput::Eof) => break,
                Ok(other) => return Err(invalid(format!("unexpected {other:?} in an upload"))),
                Err(e) => return Err(invalid(e.to_string())),
            },
        }
    }
    file.flush().await.map_err(write_error)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_recognised_in_any_spelling() {
        for p in ["/", "/.", "//", "/tmp/..", "/a/b/../../.."] {
            assert!(is_root(&resolve(p).unwrap()), "{p}");
        }
        assert!(!is_root(Path::new("/tmp")));
        assert!(is_root(&resolve(".").unwrap()));
    }

    #[test]
    fn hostile_paths_are_rejected() {
        assert!(resolve("").is_err());
        assert!(resolve("a\0b").is_err());
        assert_eq!(resolve("tmp/x").unwrap(), Path::new("/tmp/x"));
    }
}
